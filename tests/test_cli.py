"""The braintrace-conv command: tiny end-to-end runs, evaluate, resume and overwrite.

User errors (one line, exit code 2, nothing written) are in test_cli_bad_inputs.py.
"""
import json
import re

import pytest

from braintrace_conv.cli import main
from braintrace_conv.training import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT, SCALARS_NAME,
                                      checkpoint)

TINY = ['--epochs', '1', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--quiet']
REQUIRED = {'test_accuracy', 'train_loss', 'algorithm', 'task', 'wall_time_s', 'peak_rss_mb',
            'run_config', 'skipped_updates'}


@pytest.mark.parametrize('extra, algorithm', [
    ([], 'ES-D-RTRL'),
    (['--task', 'digits', '--algorithm', 'bptt', '--update-every', '3'], 'BPTT'),
    (['--algorithm', 'd-rtrl', '--window', '3', '--update-every', '3'], 'D-RTRL'),
])
def test_train_smoke(tmp_path, capsys, extra, algorithm):
    assert main(['train', *TINY, *extra, '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert REQUIRED <= set(metrics)
    assert metrics['algorithm'] == algorithm and len(metrics['train_loss']) == 1
    assert 0 <= metrics['test_accuracy'] <= 1 and metrics['peak_rss_mb'] > 0
    assert metrics['run_config']['batch_size'] == 12 and metrics['run_config']['channels'] == [2, 4]
    for name in (CURVE_NAME, SCALARS_NAME, LAST_CHECKPOINT, BEST_CHECKPOINT):
        assert (tmp_path / name).exists(), name
    out = capsys.readouterr().out
    assert 'test accuracy' in out and 'wall time' in out and 'peak RSS' in out
    if '--window' in extra:     # stored with the run, so --resume checks it
        assert metrics['run_config']['window'] == 3
        assert checkpoint.read(tmp_path / LAST_CHECKPOINT)[1]['trainer']['window'] == 3


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('cli') / 'run'
    assert main(['train', *TINY, '--out', str(out)]) == 0
    return out


def test_evaluate_reports_the_saved_run(run, capsys):
    capsys.readouterr()
    assert main(['evaluate', '--run', str(run)]) == 0
    best = json.loads((run / 'metrics.json').read_text())['best']
    line = capsys.readouterr().out
    assert f"{BEST_CHECKPOINT} (epoch {best['epoch']})" in line
    assert f"test accuracy {best['test_accuracy']:.1%}" in line and 'spike rates' in line


def test_warnings_are_one_line_on_stderr(run, capsys, monkeypatch):
    import warnings

    from braintrace_conv.training import Trainer
    original = Trainer.load_params

    def load_params(self, *args, **kwargs):
        warnings.warn('a warning\n  over two lines', RuntimeWarning)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, 'load_params', load_params)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(run)]) == 0
    assert capsys.readouterr().err == 'braintrace-conv: warning: a warning over two lines\n'


def test_resuming_a_finished_run_says_so_and_changes_nothing(run, capsys):
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(['train', *TINY, '--out', str(run), '--resume']) == 0
    assert 'already finished (1/1 epochs); nothing to do' in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_overwrite_replaces_the_run(run, tmp_path):
    out = tmp_path / 'run'
    out.mkdir()
    for p in run.iterdir():
        if p.is_file():
            (out / p.name).write_bytes(p.read_bytes())
    (out / 'notes.txt').write_text('mine')
    assert main(['train', *TINY, '--seed', '1', '--out', str(out), '--overwrite']) == 0
    assert checkpoint.read(out / LAST_CHECKPOINT)[1]['run']['seed'] == 1
    assert (out / 'notes.txt').read_text() == 'mine'


@pytest.mark.parametrize('epochs_done, hint', [
    (0, 'no epoch was completed; rerun with --overwrite to start again'),
    (2, 'epochs 1-2 are saved in .*; rerun with --resume and the same options to continue'),
])
def test_interrupt_says_how_to_continue(tmp_path, capsys, monkeypatch, epochs_done, hint):
    from braintrace_conv.training import Trainer

    def interrupted(self, *args, **kwargs):
        self.epoch = epochs_done
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, 'fit', interrupted)
    assert main(['train', *TINY, '--out', str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert re.fullmatch(f'braintrace-conv: interrupted; {hint}\n', err), err


def test_help_and_version(capsys):
    assert main(['train', '--help']) == 0
    text = capsys.readouterr().out
    assert all(option in text for option in ('--update-every', '--resume', '--overwrite',
                                             '--nonfinite', '--log-every', '--window'))
    assert main(['--version']) == 0
    assert capsys.readouterr().out.startswith('braintrace-conv ')


@pytest.mark.slow
@pytest.mark.parametrize('task, target', [('moving-bars', 0.90), ('digits', 0.85)])
def test_default_run_reaches_target_accuracy(tmp_path, task, target):
    assert main(['train', '--task', task, '--quiet', '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert metrics['test_accuracy'] >= target
    assert metrics['wall_time_s'] < 600
