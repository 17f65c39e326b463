"""The braintrace-conv command: tiny end-to-end runs and one-line errors for bad arguments."""
import json

import pytest

from braintrace_conv.cli import main

TINY = ['--epochs', '1', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--quiet']
REQUIRED = {'test_accuracy', 'train_loss', 'algorithm', 'task', 'wall_time_s', 'peak_rss_mb'}


@pytest.mark.parametrize('extra, algorithm', [
    ([], 'ES-D-RTRL'),
    (['--task', 'digits', '--algorithm', 'bptt', '--update-every', '3'], 'BPTT'),
])
def test_train_smoke(tmp_path, capsys, extra, algorithm):
    assert main(['train', *TINY, *extra, '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert REQUIRED <= set(metrics)
    assert metrics['algorithm'] == algorithm and len(metrics['train_loss']) == 1
    assert 0 <= metrics['test_accuracy'] <= 1 and metrics['peak_rss_mb'] > 0
    assert (tmp_path / 'learning_curve.png').exists()
    out = capsys.readouterr().out
    assert 'test accuracy' in out and 'wall time' in out and 'peak RSS' in out


@pytest.mark.parametrize('argv', [
    [],
    ['train', '--epochs', '0'],
    ['train', '--epochs', 'two'],
    ['train', '--batch-size', '-4'],
    ['train', '--algorithm', 'sgd'],
    ['train', '--task', 'cifar10'],
    ['train', '--lr', '0'],
    ['train', '--test-fraction', '1.5'],
    ['train', '--channels', '8,x'],
    ['train', '--no-such-option'],
    ['train', '--algorithm', 'bptt', '--decay', '0.9'],
    ['train', '--loss', 'final', '--final-steps', '30', '--steps', '20'],
    ['train', '--samples', '48', '--size', '8', '--steps', '6', '--batch-size', '40'],
    ['train', '--task', 'digits', '--samples', '5000'],
])
def test_bad_arguments_give_one_line_error(tmp_path, capsys, argv):
    code = main([*argv, '--out', str(tmp_path / 'run')] if argv else argv)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith('braintrace-conv: error: ')
    assert captured.err.strip().count('\n') == 0 and 'Traceback' not in captured.err
    assert not (tmp_path / 'run' / 'metrics.json').exists()


def test_help_returns_zero(capsys):
    assert main(['train', '--help']) == 0
    assert '--update-every' in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize('task, target', [('moving-bars', 0.90), ('digits', 0.85)])
def test_default_run_reaches_target_accuracy(tmp_path, task, target):
    assert main(['train', '--task', task, '--quiet', '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert metrics['test_accuracy'] >= target
    assert metrics['wall_time_s'] < 600
