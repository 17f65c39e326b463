"""Data and finished runs shared by the training tests (built once per session)."""
import pytest

from braintrace_conv.data import moving_bars

from trainers import SIZE, T, trainer


@pytest.fixture(scope='session')
def data():
    """32 moving-bars recordings split into 24 training and 8 test samples."""
    return moving_bars(32, T=T, size=SIZE, seed=0).split(0.25, seed=0)


@pytest.fixture(scope='session')
def bars():
    """48 moving-bars recordings split into 32 training and 16 test samples."""
    return moving_bars(48, T=T, size=SIZE, seed=0).split(0.25, seed=0)


@pytest.fixture(scope='session')
def run(data, tmp_path_factory):
    """A finished one-epoch run directory and the trainer that wrote it."""
    out = tmp_path_factory.mktemp('run')
    tr = trainer()
    tr.fit(data[0], epochs=1, batch_size=8, eval_dataset=data[1], out_dir=out, progress=False)
    return out, tr


@pytest.fixture(scope='session')
def evaluated_run(bars, tmp_path_factory):
    """A finished three-epoch run directory, evaluated every epoch, and its trainer."""
    out = tmp_path_factory.mktemp('evaluated-run')
    tr = trainer(lr=2e-2)
    tr.fit(bars[0], epochs=3, batch_size=12, eval_dataset=bars[1], out_dir=out, progress=False)
    return out, tr
