"""Runs and recordings shared by the tests of the command line (built once per session)."""
import shutil

import numpy as np
import pytest

from braintrace_conv.cli import main
from braintrace_conv.training import LAST_CHECKPOINT

from cli_runs import AUDIO, DVS, TINY


@pytest.fixture(scope='session')
def run(tmp_path_factory):
    """A finished tiny run of the command line (read, never changed, by the tests)."""
    out = tmp_path_factory.mktemp('cli') / 'run'
    assert main(['train', *TINY, '--out', str(out)]) == 0
    return out


@pytest.fixture(scope='session')
def root(run, tmp_path_factory):
    """``run``: a finished run; ``corrupt``: its copy with one flipped byte; ``empty``: an
    empty directory; ``file``: a file; ``pickle``: a pickled checkpoint; ``dangling``: a
    link to nothing; ``linked``: a run whose tensorboard directory is a link."""
    root = tmp_path_factory.mktemp('cli-bad')
    shutil.copytree(run, root / 'run')
    good = (root / 'run' / LAST_CHECKPOINT).read_bytes()
    (root / 'corrupt').mkdir()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    (root / 'corrupt' / LAST_CHECKPOINT).write_bytes(bytes(bad))
    (root / 'empty').mkdir()
    (root / 'file').write_text('not a directory')
    (root / 'pickle').mkdir()
    (root / 'pickle' / LAST_CHECKPOINT).write_bytes(b'\x80\x04N.')
    (root / 'dangling').symlink_to(root / 'nowhere')
    shutil.copytree(root / 'run', root / 'linked', ignore=shutil.ignore_patterns('tensorboard'))
    (root / 'outside').mkdir()
    (root / 'linked' / 'tensorboard').symlink_to(root / 'outside')
    return root


@pytest.fixture(scope='session')
def recordings(tmp_path_factory):
    """``audio/`` (32 channels) and ``dvs/`` (8 x 8 pixels, 2 polarities), each with classes
    ``down`` (events in the lower half of x) and ``up`` (upper half), 12 files per class."""
    root = tmp_path_factory.mktemp('recordings')
    rng = np.random.default_rng(0)
    for label, low in (('down', 0), ('up', 16)):
        for sensor in ('audio', 'dvs'):
            (root / sensor / label).mkdir(parents=True)
        for i in range(12):
            n = 300
            audio = np.zeros(n, AUDIO)
            audio['t'] = np.sort(rng.integers(0, 100_000, n))
            audio['x'], audio['p'] = rng.integers(low, low + 16, n), 1
            np.save(root / 'audio' / label / f'{i:03d}.npy', audio)
            dvs = np.zeros(n, DVS)
            dvs['t'] = np.sort(rng.integers(0, 100_000, n))
            dvs['x'], dvs['y'] = rng.integers(low // 4, low // 4 + 4, n), rng.integers(0, 8, n)
            dvs['p'] = rng.random(n) < 0.5
            np.save(root / 'dvs' / label / f'{i:03d}.npy', dvs)
    return root
