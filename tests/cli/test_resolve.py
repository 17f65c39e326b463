"""User errors on the command line: the usage line, then one line naming the problem, exit
code 2, no traceback, and nothing on disk created or changed."""
import hashlib
import os
import re
import shutil

import numpy as np
import pytest

from braintrace_conv.cli import main
from braintrace_conv.training import LAST_CHECKPOINT

TINY = ['--epochs', '1', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--quiet']


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    """``run``: a finished run; ``corrupt``: its copy with one flipped byte; ``library``: a
    checkpoint without command-line options; ``empty``: an empty directory; ``file``: a file."""
    root = tmp_path_factory.mktemp('cli-bad')
    assert main(['train', *TINY, '--out', str(root / 'run')]) == 0
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


def files_of(directory) -> dict:
    """Every file's content digest (a link's target) under ``directory``, links unfollowed."""
    def content(path):
        if os.path.islink(path):
            return 'link to ' + os.readlink(path)
        return hashlib.sha256(open(path, 'rb').read()).hexdigest()
    return {os.path.relpath(os.path.join(r, f), directory): content(os.path.join(r, f))
            for r, dirs, names in os.walk(directory) for f in names + dirs
            if os.path.islink(os.path.join(r, f)) or f in names}


TRAIN = ['train', *TINY]


CASES = [
    # arguments
    ([], 'the following arguments are required: command'),
    (['fly'], "invalid choice: 'fly'"),
    (['train', '--epochs', '0'], '--epochs must be positive, got 0'),
    (['train', '--epochs', 'two'], "argument --epochs: invalid int value: 'two'"),
    (['train', '--batch-size', '-4'], '--batch-size must be positive, got -4'),
    (['train', '--algorithm', 'sgd'], "argument --algorithm: invalid choice: 'sgd'"),
    (['train', '--task', 'cifar10'], "argument --task: invalid choice: 'cifar10'"),
    (['train', '--lr', '0'], '--lr must be a positive number, got 0.0'),
    (['train', '--lr', 'nan'], '--lr must be a positive number, got nan'),
    (['train', '--tau', 'inf'], '--tau must be a positive number, got inf'),
    (['train', '--test-fraction', '1.5'], r'--test-fraction must lie in \(0, 1\), got 1.5'),
    (['train', '--channels', '8,x'], "expected comma-separated ints such as 8,16, got '8,x'"),
    (['train', '--channels', '8,0'], "channels must be positive, got '8,0'"),
    (['train', '--no-such-option'], 'unrecognized arguments: --no-such-option'),
    (['train', '--algorithm', 'bptt', '--decay', '0.9'],
     '--decay applies only to --algorithm es-d-rtrl'),
    (['train', '--decay', '1.5'], r'--decay must lie in \(0, 1\], got 1.5'),
    (['train', '--loss', 'final', '--final-steps', '30', '--steps', '20'],
     r'--final-steps \(30\) exceeds --steps \(20\)'),
    (['train', '--update-every', '0'], '--update-every must be positive, got 0'),
    (['train', '--window', '0'], '--window must be positive, got 0'),
    (['train', '--algorithm', 'bptt', '--window', '4'],
     '--window applies only to --algorithm d-rtrl or es-d-rtrl'),
    (['train', '--window', '8', '--update-every', '4'],
     r'--window \(8\) exceeds --update-every \(4\): a window never spans two online chunks'),
    (['train', '--log-every', '0'], '--log-every must be positive, got 0'),
    (['train', '--seed', '-1'], r'--seed must lie in \[0, 9223372036854775807\], got -1'),
    (['train', '--seed', '18446744073709551616'],
     r'--seed must lie in \[0, 9223372036854775807\], got 18446744073709551616'),
    (['train', '--size', '1'], '--size must be at least 4 for --task moving-bars, got 1'),
    (['train', '--task', 'digits', '--size', '4'],
     '--size must be at least 8 for --task digits, got 4'),
    (['train', '--steps', '1'], '--steps must be at least 2 for --task moving-bars'),
    (['train', '--final-steps', '3'], '--final-steps applies only with --loss final'),
    (['train', '--out', ''], 'argument --out: expected a path, got an empty string'),
    (['train', '--out', ' '], 'argument --out: expected a path, got an empty string'),
    (['train', '--task', 'events', '--data', '', '--sensor-size', '34,34,2'],
     'argument --data: expected a path, got an empty string'),
    ([*TRAIN, '--channels', '2000000,2000000'],
     r'the model needs about .* PiB for its .* weights .*; lower --channels or --kernel-size'),
    (['train', '--task', 'events', '--data', '{empty}', '--sensor-size', '1000000,1000000,2'],
     r'the dataset needs about .* \(1 samples x 20 steps x 1000000 x 1000000 x 2 float32.*'
     r'lower --sensor-size or --steps'),
    (['train', '--nonfinite', 'ignore'], "argument --nonfinite: invalid choice: 'ignore'"),
    (['train', '--devices', '0'], '--devices must be positive, got 0'),
    (['train', '--devices', '2'], r'--devices 2 exceeds the 1 available cpu device\(s\); on a '
                                  r'CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=2'),
    (['train', '--pool', '0'], '--pool must be positive, got 0'),
    (['train', '--kernel-size', '-3'], '--kernel-size must be positive, got -3'),
    (['train', '--task', 'shd', '--size', '8'], '--size applies only to --task moving-bars or '
                                                'delayed-bars or digits'),
    (['train', '--delay', '4'], '--delay applies only to --task delayed-bars'),
    (['train', '--task', 'delayed-bars', '--delay', '0'], '--delay must be positive, got 0'),
    (['train', '--cues', '2'], '--cues applies only to --task delayed-bars'),
    (['train', '--task', 'delayed-bars', '--cues', '0'], '--cues must be positive, got 0'),
    (['train', '--task', 'delayed-bars', '--steps', '30', '--cues', '4'],
     r'--steps \(30\) must be a multiple of --cues \(4\), one trial each'),
    (['train', '--task', 'delayed-bars', '--steps', '40', '--delay', '9'],
     r"--delay \(9\) must leave at least 2 of each trial's 10 steps \(--steps / --cues\) to "
     r'the moving bar'),
    (['train', '--task', 'delayed-bars', '--tau', '0'], '--tau must be a positive number'),
    (['train', '--task', 'delayed-bars', '--size', '3'],
     '--size must be at least 4 for --task delayed-bars, got 3'),
    (['train', '--clip-norm', '-1'], '--clip-norm must be a non-negative number, got -1.0'),
    (['train', '--clip-norm', 'inf'], '--clip-norm must be a non-negative number, got inf'),
    (['train', '--data', '.'], '--data applies only to --task events'),
    (['train', '--stream'], '--stream applies only to --task events'),
    (['train', '--cache-size', '0'], '--cache-size applies only to --task events'),
    (['train', '--task', 'shd', '--samples', '100000000'],
     r'the dataset needs about .* \(100000000 samples x 50 steps x 1 x 700 float32.*lower '
     r'--samples or --steps'),
    ([*TRAIN, '--batch-size', '40'], r'--batch-size \(40\) exceeds the 32 training samples'),
    (['train', '--task', 'digits', '--samples', '5000'], 'n_samples'),
    (['train', '--size', '100000'], r'the dataset needs about 5.82 PiB \(2048 samples x 20 '
                                    r'steps x 2 x 100000 x 100000 float32.*lower --samples'),
    # run directories
    ([*TRAIN, '--out', '{run}'], r'--out .*run already holds a run \(checkpoint-last.npz, '
                                 r'checkpoint-best.npz, .*pass --resume to continue it or '
                                 r'--overwrite to replace it'),
    ([*TRAIN, '--out', '{run}', '--resume', '--overwrite'],
     'argument --overwrite: not allowed with argument --resume'),
    ([*TRAIN, '--out', '{empty}', '--resume'],
     r'--resume: .*empty has no checkpoint \(checkpoint-last.npz\) to resume'),
    ([*TRAIN, '--out', '{run}', '--resume', '--update-every', '2'],
     r'--resume: the run in .* was trained with other options: --update-every unset \(now 2\); '
     r'give the same options, or another --out'),
    ([*TRAIN, '--out', '{run}', '--resume', '--channels', '4,8', '--task', 'digits'],
     r'other options: --channels 2,4 \(now 4,8\), --task moving-bars \(now digits\)'),
    ([*TRAIN, '--out', '{corrupt}', '--resume'], '--resume: .* is corrupt'),
    ([*TRAIN, '--out', '{pickle}', '--resume'], '--resume: .* never unpickled'),
    ([*TRAIN, '--out', '{file}'], '--out: .*file exists and is not a directory'),
    ([*TRAIN, '--out', '{dangling}'],
     '--out: .*dangling is a symbolic link to .*nowhere, which does not exist'),
    ([*TRAIN, '--out', '{linked}', '--resume'],
     r'--out: .*linked holds symbolic links among its run files \(tensorboard\); run files '
     r'are never written through links'),
    ([*TRAIN, '--out', '/proc/no-such-dir/run'],
     '--out /proc/no-such-dir/run cannot be written: No such file or directory'),
    # evaluate
    (['evaluate'], 'the following arguments are required: --run'),
    (['evaluate', '--run', '{empty}'], r'--run: .*empty holds no checkpoint'),
    (['evaluate', '--run', ''], 'argument --run: expected a path, got an empty string'),
    (['evaluate', '--run', '{root}/absent'], r'--run: no checkpoint at .*absent'),
    (['evaluate', '--run', '{corrupt}'], '--run: .* is corrupt'),
    (['evaluate', '--run', '{run}', '--checkpoint', 'worst'],
     "argument --checkpoint: invalid choice: 'worst'"),
    (['evaluate', '--run', '{run}', '--batch-size', '0'], '--batch-size must be positive, got 0'),
    (['evaluate', '--run', '{run}', '--devices', '3'], '--devices 3 exceeds the 1 available'),
    (['evaluate', '--run', '{run}', '--data', '{empty}'],
     r'--data applies only to runs of --task events; the run in .*checkpoint-best.npz is of '
     r'--task moving-bars'),
]


@pytest.mark.parametrize('argv, match', CASES)
def test_user_error_is_one_line_and_changes_nothing(root, capsys, argv, match):
    paths = {name: str(root / name) for name in ('run', 'corrupt', 'empty', 'file', 'pickle',
                                                 'dangling', 'linked')}
    argv = [a.format(root=root, **paths) for a in argv]
    if argv[:1] == ['train'] and '--out' not in argv:
        argv += ['--out', str(root / 'new')]
    before = files_of(root)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    usage, error = captured.err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv'), captured.err
    assert error.startswith('braintrace-conv: error: '), captured.err
    assert 'Traceback' not in captured.err and captured.out == ''
    assert re.search(match, error), error
    assert files_of(root) == before and not (root / 'new').exists()


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
    argv = ['train', '--task', 'events', *[a.format(root=recordings) for a in extra], *EVENT_TINY,
            '--out', str(tmp_path / 'new')]
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    usage, error = captured.err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv') and captured.out == ''
    assert re.search(match, error), error
    assert not (tmp_path / 'new').exists()
