"""What a run records: its title, TensorBoard events."""
import os

import brainstate
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import moving_bars
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import Trainer, logs


def test_run_title_names_task_algorithm_and_settings():
    config = dict(task='digits', algorithm='D-RTRL', loss='final', final_steps=3,
                  update_every=5, lr=0.01, batch_size=16, channels=[4, 8], seed=2)
    assert logs.run_title(config) == ('digits, D-RTRL\nloss on the last 3 step(s) | update '
                                      'every 5 steps | lr 0.01 | batch 16 | channels 4,8 | seed 2')


T, SIZE = 6, (8, 8)


def adam_trainer(seed=0, optimizer=True):
    brainstate.random.seed(seed)
    model = recurrent_conv_snn((2,) + SIZE, 8, channels=(2, 4))
    return Trainer(bc.ES_D_RTRL(model, model.membrane_decay()),
                   optax.adam(2e-2) if optimizer else None)


@pytest.fixture(scope='module')
def bars():
    return moving_bars(48, T=T, size=SIZE, seed=0).split(0.25, seed=0)


@pytest.fixture(scope='module')
def evaluated_run(bars, tmp_path_factory):
    out = tmp_path_factory.mktemp('run')
    tr = adam_trainer()
    tr.fit(bars[0], epochs=3, batch_size=12, eval_dataset=bars[1], out_dir=out, progress=False)
    return out, tr


def test_tensorboard_events(evaluated_run):
    pytest.importorskip('tensorboardX')
    events = os.listdir(evaluated_run[0] / 'tensorboard')
    assert any(name.startswith('events.out.tfevents') for name in events)
