"""The braintrace-conv command on event data of any rank: the SHD-like task (1-D convolutions
over 700 channels) and directories of tonic-format event files, 1-D and 2-D, in memory or
streamed; and their user errors (one line, exit code 2, nothing written)."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from braintrace_conv import cli
from braintrace_conv.cli import main
from braintrace_conv.data import stream_directory
from braintrace_conv.training import BEST_CHECKPOINT, LAST_CHECKPOINT, checkpoint
from braintrace_conv.training.fingerprint import data_fingerprint

TINY = ['--epochs', '1', '--steps', '8', '--batch-size', '6', '--channels', '2,4', '--lr', '2e-2',
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
              size, '--pool', '1', *TINY]
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


def test_resume_needs_the_same_event_options(recordings, tmp_path, capsys):
    out = tmp_path / 'run'
    common = ['train', '--task', 'events', '--data', str(recordings / 'audio'), '--sensor-size',
              '32,1,1', *TINY, '--out', str(out)]
    assert main(common) == 0
    capsys.readouterr()
    assert main([*common, '--resume', '--window-us', '12500', '--pool', '2']) == 2
    assert re.search(r'other options: --pool 4 \(now 2\), --window-us unset \(now 12500.0\)',
                     capsys.readouterr().err)
    assert main([*common, '--resume']) == 0
    assert 'already finished' in capsys.readouterr().out


EVENT_CASES = [
    ([], '--task events needs --data DIR and --sensor-size X,Y,P'),
    (['--data', '{root}/absent', '--sensor-size', '32,1,1'], r'--data .*absent is not a directory'),
    (['--data', '{root}/audio', '--sensor-size', '32,x'],
     r"argument --sensor-size: expected the sensor size in tonic's order, 2 to 4 "
     r"comma-separated positive ints"),
    (['--data', '{root}/audio', '--sensor-size', '32,1,3'],
     r'sensor_size\[-1\] \(polarities\) must be 1 or 2, got 3'),
    (['--data', '{root}/audio', '--sensor-size', '8,1,1'],
     r"events field 'x' must lie in \[0, 8\) for this sensor_size"),
    (['--data', '{root}/dvs', '--sensor-size', '8,2'],
     r'events with 2 coordinate field\(s\) need sensor_size \(X, Y, P\)'),
    (['--data', '{root}', '--sensor-size', '32,1,1'], 'no .npy or .npz files found'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--cache-size', '4'],
     '--cache-size applies only with --stream'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--stream', '--cache-size', '-1'],
     '--cache-size must be non-negative, got -1'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--window-us', '0'],
     '--window-us must be a positive number, got 0.0'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--samples', '10'],
     '--samples applies only to --task moving-bars or delayed-bars or digits or shd'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--pool', '64'],
     r'pool=64 is larger than the output of block 0, of shape \(C, \*spatial\) = \(2, 32\)'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--test-fraction', '0.01'],
     'leaves an empty training or test set'),
]


@pytest.mark.parametrize('extra, match', EVENT_CASES)
def test_event_user_error_is_one_line(recordings, tmp_path, capsys, extra, match):
    argv = ['train', '--task', 'events', *[a.format(root=recordings) for a in extra], *TINY,
            '--out', str(tmp_path / 'new')]
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    usage, error = captured.err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv') and captured.out == ''
    assert re.search(match, error), error
    assert not (tmp_path / 'new').exists()


def copied(recordings, tmp_path, sensor='audio'):
    data = tmp_path / 'data'
    shutil.copytree(recordings / sensor, data)
    return data


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert 'Traceback' not in captured.err
    usage, error = captured.err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv')
    return error


@pytest.mark.parametrize('write, match', [
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(200)), 'is not a NumPy .npy array'),
    (lambda p: np.save(p, np.array([1, None], dtype=object), allow_pickle=True),
     r'holds Python objects \(dtype object\), which are never loaded'),
    (lambda p: np.save(p, np.array([(5, 40, 1)], AUDIO)),
     r"events field 'x' must lie in \[0, 32\) for this sensor_size"),
])
def test_a_bad_streamed_file_is_one_line_and_leaves_no_run(recordings, tmp_path, capsys, write,
                                                           match):
    data = copied(recordings, tmp_path)
    bad = data / 'up' / '011.npy'       # the last file: streaming reads it only in a batch
    write(bad)
    out = tmp_path / 'run'
    assert main(['train', '--task', 'events', '--data', str(data), '--sensor-size', '32,1,1',
                 '--stream', *TINY, '--batch-size', '18', '--out', str(out)]) == 2
    error = one_error_line(capsys)
    assert str(bad) in error and re.search(match, error), error
    assert not out.exists()      # nothing to --overwrite before the rerun


STREAMED = ['train', '--task', 'events', '--sensor-size', '32,1,1', '--pool', '1', '--stream',
            *TINY]


@pytest.fixture(scope='module')
def streamed_run(recordings, tmp_path_factory):
    """``(data, run)``: a copy of the audio recordings and a streamed run trained on it."""
    root = tmp_path_factory.mktemp('streamed')
    data, run = root / 'data', root / 'run'
    shutil.copytree(recordings / 'audio', data)
    assert main([*STREAMED, '--data', str(data), '--out', str(run)]) == 0
    return data, run


@pytest.fixture
def streamed(streamed_run, recordings):
    """``streamed_run``, its recordings put back afterwards (content and modification times)."""
    yield streamed_run
    data = streamed_run[0]
    shutil.rmtree(data)
    shutil.copytree(recordings / 'audio', data)


def tree(directory) -> dict:
    return {p.relative_to(directory): p.read_bytes() if p.is_file() else 'dir'
            for p in directory.rglob('*')}


def split_files(data) -> tuple:
    """The files of the training and test sets the command line splits ``data`` into."""
    full = stream_directory(data, sensor_size=(32, 1, 1), n_time_bins=8)
    return tuple(part.sources for part in full.split(0.25, seed=0))


def test_evaluate_refuses_data_that_changed_since_the_run(streamed, capsys):
    data, out = streamed
    before = tree(out)
    (data / 'down').rename(data / 'tmp')         # the classes swapped: every label changes
    (data / 'up').rename(data / 'down')
    (data / 'tmp').rename(data / 'up')
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 2       # same names: other files there
    assert re.search(r'--run: the test set rebuilt for the run in .* differs from the one it '
                     r'was evaluated on: 6 of its 6 files changed since \(size or modification '
                     r'time\): .* and 3 more; pass --allow-data-change to evaluate anyway',
                     one_error_line(capsys))
    assert main(['evaluate', '--run', str(out), '--allow-data-change']) == 0
    captured = capsys.readouterr()
    assert 'evaluating anyway (--allow-data-change)' in captured.err
    assert 'test accuracy' in captured.out
    (data / 'up' / '000.npy').unlink()                      # a file removed: other samples
    assert main(['evaluate', '--run', str(out)]) == 2
    assert re.search(r'differs from the one it was evaluated on: other samples or labels \(6 '
                     r'samples then, \d+ samples now\); pass --allow-data-change',
                     one_error_line(capsys))
    assert tree(out) == before


def test_changed_file_contents_are_named_on_resume_and_evaluate(streamed, capsys):
    data, out = streamed
    train_files, test_files = split_files(data)
    before = tree(out)
    np.save(test_files[0], np.load(test_files[0])[:100])        # another content and size
    st = os.stat(train_files[0])                                 # only the time
    os.utime(train_files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 2
    assert one_error_line(capsys).endswith(
        f'differs from the one it was evaluated on: 1 of its 6 files changed since (size or '
        f'modification time): {test_files[0]}; pass --allow-data-change to evaluate anyway')
    assert main([*STREAMED, '--epochs', '2', '--data', str(data), '--out', str(out),
                 '--resume']) == 2
    assert re.search(rf'--resume: .*{LAST_CHECKPOINT} was written with a different configuration '
                     rf'\(eval_data: 1 of its 6 files changed since \(size or modification '
                     rf'time\): {test_files[0]}; train_data: 1 of its 18 files changed since '
                     rf'\(size or modification time\): {train_files[0]}\)',
                     one_error_line(capsys))
    assert tree(out) == before
    assert main(['evaluate', '--run', str(out), '--allow-data-change']) == 0
    assert f'changed since (size or modification time): {test_files[0]}; evaluating anyway' in \
        capsys.readouterr().err


def older_fingerprints(data, run, out):
    """A copy ``out`` of ``run`` whose checkpoints hold the fingerprints of an older version:
    the streamed files' absolute paths only."""
    shutil.copytree(run, out)
    train, test = (stream_directory(data, sensor_size=(32, 1, 1), n_time_bins=8)
                   .split(0.25, seed=0))
    for name in (LAST_CHECKPOINT, BEST_CHECKPOINT):
        arrays, meta = checkpoint.read(out / name)
        assert meta['fit']['eval_data'] == data_fingerprint(test)
        fit = dict(meta['fit'], train_data=data_fingerprint(train, 1),
                   eval_data=data_fingerprint(test, 1))
        assert 'version' not in fit['eval_data'] and 'files' not in fit['eval_data']
        checkpoint.write(out / name, arrays, dict(meta, fit=fit))
    return out


def test_runs_with_path_only_fingerprints_still_resume_and_evaluate(streamed, tmp_path,
                                                                    capsys, monkeypatch):
    data, run = streamed
    out = older_fingerprints(data, run, tmp_path / 'old')
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 0
    captured = capsys.readouterr()
    assert 'test accuracy 100.0%' in captured.out
    assert captured.err == (f'braintrace-conv: warning: {out / BEST_CHECKPOINT}, test set: its '
                            f'fingerprint was written by an older version and covers the file '
                            f'paths only: changes to the files\' contents cannot be detected\n')

    def stop(self, *args, **kwargs):    # resumed: stop before training
        raise KeyboardInterrupt

    from braintrace_conv.training import _fit
    monkeypatch.setattr(_fit, '_train_epoch', stop)
    assert main([*STREAMED, '--epochs', '2', '--data', str(data), '--out', str(out),
                 '--resume']) == 130
    err = capsys.readouterr().err
    for key in ('train_data', 'eval_data'):
        assert (f'warning: {out / LAST_CHECKPOINT}, {key}: its fingerprint was written by an '
                f'older version and covers the file paths only') in err
    assert 'interrupted; epochs 1-1 are saved' in err


def test_evaluate_reads_only_the_data_directory_its_run_recorded(streamed, recordings, tmp_path,
                                                                 capsys, monkeypatch):
    data, run = streamed
    forged = tmp_path / 'forged'
    shutil.copytree(run, forged)
    elsewhere = str(recordings / 'dvs')       # a directory the run never named
    for name in (LAST_CHECKPOINT, BEST_CHECKPOINT):
        arrays, meta = checkpoint.read(forged / name)
        checkpoint.write(forged / name, arrays, dict(meta, run=dict(meta['run'], data=elsewhere)))
    listed = []

    def listing(root, **kwargs):
        listed.append(str(root))
        return stream_directory(root, **kwargs)

    monkeypatch.setattr(cli.build, 'stream_directory', listing)
    before = tree(forged)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(forged)]) == 2
    assert one_error_line(capsys) == (
        f'braintrace-conv: error: --run: the data directory named in {forged / BEST_CHECKPOINT} '
        f'({elsewhere}) is not the one recorded in {forged / "metrics.json"} ({data}); evaluate '
        f'reads only the data directory its run recorded in both, or the one --data DIR names')
    lone = tmp_path / 'lone'            # a checkpoint without its run directory
    lone.mkdir()
    shutil.copy(run / BEST_CHECKPOINT, lone)
    assert main(['evaluate', '--run', str(lone / BEST_CHECKPOINT)]) == 2
    assert f'is not the one recorded in {lone / "metrics.json"} (none)' in one_error_line(capsys)
    assert listed == [] and tree(forged) == before
    # --data names the directory: the run's, or a copy elsewhere with the same files and times
    copy = tmp_path / 'copy'
    shutil.copytree(data, copy)
    for path, directory in ((forged, data), (lone / BEST_CHECKPOINT, copy)):
        assert main(['evaluate', '--run', str(path), '--data', str(directory)]) == 0
        assert 'test accuracy 100.0%' in capsys.readouterr().out
    assert listed == [str(data), str(copy)]
    assert main(['evaluate', '--run', str(forged), '--data', str(tmp_path / 'absent')]) == 2
    assert one_error_line(capsys).endswith(f'--data {tmp_path / "absent"} is not a directory')
