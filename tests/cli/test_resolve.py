"""User errors on the command line: the usage line, then one line naming the problem, exit
code 2, no traceback, and nothing on disk created or changed."""
import re

import pytest

from braintrace_conv.cli import main

from cli_runs import EVENT_TINY, TRAIN, refused

ARGUMENTS = [  # the rules of the command line itself
    ([], 'the following arguments are required: command'),
    (['fly'], "invalid choice: 'fly'"),
    (['train', '--epochs', '0'], '--epochs must be a positive integer, got 0'),
    (['train', '--epochs', 'two'], "argument --epochs: invalid int value: 'two'"),
    (['train', '--batch-size', '-4'], '--batch-size must be a positive integer, got -4'),
    (['train', '--algorithm', 'sgd'], "argument --algorithm: invalid choice: 'sgd'"),
    (['train', '--task', 'cifar10'], "argument --task: invalid choice: 'cifar10'"),
    (['train', '--lr', '0'], '--lr must be a positive number, got 0.0'),
    (['train', '--lr', 'nan'], '--lr must be a positive number, got nan'),
    (['train', '--tau', 'inf'], '--tau must be a positive number, got inf'),
    (['train', '--channels', '8,x'], "expected comma-separated ints such as 8,16, got '8,x'"),
    (['train', '--channels', '8,0'], "channels must be positive, got '8,0'"),
    (['train', '--no-such-option'], 'unrecognized arguments: --no-such-option'),
    (['train', '--algorithm', 'bptt', '--decay', '0.9'],
     '--decay applies only to --algorithm es-d-rtrl'),
    (['train', '--update-every', '0'], '--update-every must be a positive integer, got 0'),
    (['train', '--algorithm', 'bptt', '--window', '4'],
     '--window applies only to --algorithm d-rtrl or es-d-rtrl'),
    (['train', '--seed', '-1'], r'--seed must lie in \[0, 9223372036854775807\], got -1'),
    (['train', '--seed', '18446744073709551616'],
     r'--seed must lie in \[0, 9223372036854775807\], got 18446744073709551616'),
    (['train', '--size', '1'], '--size must be at least 4 for --task moving-bars, got 1'),
    (['train', '--task', 'digits', '--size', '4'],
     '--size must be at least 8 for --task digits, got 4'),
    (['train', '--steps', '1'], '--steps must be at least 2 for --task moving-bars'),
    (['train', '--final-steps', '3'], '--final-steps applies only with --loss final'),
    (['train', '--target-rates', '0.9', '0.1'],
     '--target-rates applies only with --loss count-mse'),
    (['train', '--loss', 'count-ce', '--target-rates', '0.9', '0.1'],
     '--target-rates applies only with --loss count-mse'),
    (['train', '--rate-strength', '3'], '--rate-strength applies only with --rate-target'),
    (['train', '--out', ''], 'argument --out: expected a path, got an empty string'),
    (['train', '--out', ' '], 'argument --out: expected a path, got an empty string'),
    (['train', '--task', 'events', '--data', '', '--sensor-size', '34,34,2'],
     'argument --data: expected a path, got an empty string'),
    (['train', '--nonfinite', 'ignore'], "argument --nonfinite: invalid choice: 'ignore'"),
    (['train', '--task', 'shd', '--size', '8'], '--size applies only to --task moving-bars or '
                                                'delayed-bars or digits'),
    (['train', '--delay', '4'], '--delay applies only to --task delayed-bars'),
    (['train', '--cues', '2'], '--cues applies only to --task delayed-bars'),
    (['train', '--task', 'delayed-bars', '--cues', '0'],
     '--cues must be a positive integer, got 0'),
    (['train', '--task', 'delayed-bars', '--steps', '30', '--cues', '4'],
     r'--steps \(30\) must be a multiple of --cues \(4\), one trial each'),
    (['train', '--task', 'delayed-bars', '--steps', '40', '--delay', '9'],
     r"--delay \(9\) must leave at least 2 of each trial's 10 steps \(--steps / --cues\) to "
     r'the moving bar'),
    (['train', '--task', 'delayed-bars', '--size', '3'],
     '--size must be at least 4 for --task delayed-bars, got 3'),
    (['train', '--clip-norm', '-1'], '--clip-norm must be a non-negative number, got -1.0'),
    (['train', '--clip-norm', 'inf'], '--clip-norm must be a non-negative number, got inf'),
    (['train', '--data', '.'], '--data applies only to --task events'),
    (['train', '--stream'], '--stream applies only to --task events'),
    (['train', '--cache-size', '0'], '--cache-size applies only to --task events'),
    (['train', '--verify-data'], '--verify-data applies only to --task events'),
    (['train', '--exact-budget', '-1'], '--exact-budget must be a non-negative number, got -1.0'),
    (['train', '--algorithm', 'd-rtrl', '--exact', 'blocks.1'],
     '--exact applies only to --algorithm es-d-rtrl'),
    (['train', '--algorithm', 'bptt', '--cross-layer', '1'],
     '--cross-layer applies only to --algorithm es-d-rtrl'),
]

LIBRARY_RULES = [  # rules the library checks: its refusal names the option
    ([*TRAIN, '--test-fraction', '1.5'], r'--test-fraction must be a number in \(0, 1\), got 1.5'),
    ([*TRAIN, '--decay', '1.5'], r'--decay must be a number in \(0, 1\], got 1.5; a membrane'),
    ([*TRAIN, '--loss', 'final', '--final-steps', '30'],
     r'--final-steps must be at most --steps \(6\), got 30'),
    ([*TRAIN, '--window', '0'], '--window must be a positive integer, got 0'),
    ([*TRAIN, '--window', '8', '--update-every', '4'],
     r'--window must be at most --update-every \(4\), got 8; a window never spans two online '
     r'chunks'),
    ([*TRAIN, '--log-every', '0'], '--log-every must be a positive integer, got 0'),
    (['train', '--devices', '0'], r'--devices must be between 1 and the 1 available device\(s\) '
                                  r'\(cpu\), got 0'),
    (['train', '--devices', '2'], r'--devices must be between 1 and the 1 available device\(s\) '
                                  r'\(cpu\), got 2; on a CPU, XLA_FLAGS=--xla_force_host_platform_'
                                  r'device_count=2 set before JAX starts'),
    ([*TRAIN, '--pool', '0'], '--pool must be a positive integer, got 0'),
    ([*TRAIN, '--kernel-size', '-3'], '--kernel-size must be a positive integer, got -3'),
    ([*TRAIN, '--task', 'delayed-bars', '--cues', '2', '--delay', '0'],
     '--delay must be a positive integer, got 0'),
    ([*TRAIN, '--task', 'delayed-bars', '--cues', '2', '--delay', '1', '--tau', '0'],
     '--tau must be a positive number, got 0.0'),
    ([*TRAIN, '--exact', 'blocks.7'],
     r"--exact must name a parameter of an op whose output drives neurons, or a module above "
     r"one: one of \['blocks.0.ff.bias', .*'fc.weight'\], got 'blocks.7'; no checkpoint was "
     r"written, and nothing was kept$"),
    ([*TRAIN, '--batch-size', '40'],
     r'--batch-size must be at most the number of training samples \(32\), got 40'),
    (['train', '--task', 'digits', '--samples', '5000'],
     r'--samples must be at most the number of digits \(1797\), got 5000'),
    ([*TRAIN, '--rate-target', '0.1', '--rate-strength', '-1'],
     '--rate-strength must be a positive number, got -1.0'),
    ([*TRAIN, '--rate-target', '0.1', '--rate-strength', 'inf'],
     '--rate-strength must be a positive number, got inf'),
    ([*TRAIN, '--loss', 'count-mse', '--target-rates', '2', '0'],
     r'--target-rates must be two rates per step in \[0, 1\] \(true class, other classes\), '
     r'got \[2.0, 0.0\]'),
    (['train', '--task', 'shd', '--samples', '0'], '--samples must be a positive integer, got 0'),
    (['train', '--task', 'shd', '--samples', '40', '--steps', '0'],
     '--steps must be a positive integer, got 0'),
    ([*TRAIN, '--channels', '2,4', '--kernel-size', '0'],
     '--kernel-size must be a positive integer, got 0'),
]


@pytest.mark.parametrize('argv, match', ARGUMENTS + LIBRARY_RULES)
def test_user_error_is_one_line_and_changes_nothing(root, capsys, argv, match):
    refused(root, capsys, argv, match)


EVENT_CASES = [
    ([], '--task events needs --data DIR and --sensor-size X,Y,P'),
    (['--data', '{root}/absent', '--sensor-size', '32,1,1'],
     r'--data .*absent is not a directory'),
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
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--verify-data'],
     '--verify-data applies only with --stream'),
    (['--data', '{root}/audio', '--sensor-size', '32,1,1', '--stream', '--cache-size', '-1'],
     '--cache-size must be a non-negative integer, got -1'),
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
