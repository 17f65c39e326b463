"""The data and model the command line builds: the SHD-like task (1-D convolutions over 700
channels) and directories of tonic-format event files, 1-D and 2-D, in memory or streamed."""
import json

import numpy as np
import pytest

from braintrace_conv.cli import main
from braintrace_conv.training import LAST_CHECKPOINT, checkpoint

EVENT_TINY = ['--epochs', '1', '--steps', '8', '--batch-size', '6', '--channels', '2,4', '--lr', '2e-2',
        '--quiet']


# tonic's formats: audio sensors (SHD) store t, x, p; DVS cameras x, y, t, p with a bool polarity
AUDIO = np.dtype([('t', np.int64), ('x', np.int64), ('p', np.int64)])


DVS = np.dtype([('x', np.int16), ('y', np.int16), ('t', np.int64), ('p', bool)])


@pytest.fixture(scope='module')
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


def first_kernel(out) -> tuple:
    arrays, _ = checkpoint.read(out / LAST_CHECKPOINT)
    return arrays['param/blocks.0.ff.weight'].shape


def metrics_of(out) -> dict:
    return json.loads((out / 'metrics.json').read_text())


def test_shd_like_task_trains_a_1d_conv_net(tmp_path, capsys):
    out = tmp_path / 'shd'
    assert main(['train', '--task', 'shd', '--samples', '40', '--steps', '10', '--epochs', '1',
                 '--batch-size', '10', '--channels', '2,4', '--out', str(out)]) == 0
    assert 'shd: 30 train / 10 test samples, T=10, frames (1, 700)' in capsys.readouterr().out
    # (out channels, in channels, kernel): 1-D convolutions over the 700 channels
    assert first_kernel(out) == (2, 1, 7)
    metrics = metrics_of(out)
    assert metrics['run_config']['pool'] == 4 and metrics['devices'] == 1
    assert 0 <= metrics['test_accuracy'] <= 1


@pytest.mark.parametrize('sensor, size, kernel', [('audio', '32,1,1', (2, 1, 7)),
                                                  ('dvs', '8,8,2', (2, 2, 3, 3))])
def test_event_directory_trains_the_model_of_its_rank(recordings, tmp_path, sensor, size,
                                                      kernel, capsys):
    common = ['train', '--task', 'events', '--data', str(recordings / sensor), '--sensor-size',
              size, '--pool', '1', *EVENT_TINY]
    memory, streamed = tmp_path / 'memory', tmp_path / 'streamed'
    assert main([*common, '--out', str(memory)]) == 0
    assert main([*common, '--stream', '--cache-size', '4', '--out', str(streamed)]) == 0
    assert first_kernel(memory) == kernel
    a, b = metrics_of(memory), metrics_of(streamed)
    assert a['test_accuracy'] == 1.0           # the classes differ by the half of x they use
    assert a['run_config']['data'] == str(recordings / sensor)
    # streaming reads and bins the same frames: the same run
    assert a['train_loss'] == b['train_loss'] and a['test_accuracy'] == b['test_accuracy']
    capsys.readouterr()
    assert main(['evaluate', '--run', str(streamed)]) == 0
    assert 'test accuracy 100.0%' in capsys.readouterr().out
