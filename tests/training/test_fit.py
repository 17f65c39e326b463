"""Trainer.fit: epochs, run directories (never overwritten silently, locked while written),
resume (bitwise, repairing what a killed run left, extending a finished run) and its arguments."""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

import brainstate
import jax
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nn as bnn
from braintrace_conv.data import EventDataset, moving_bars
from braintrace_conv.training import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT, METRICS_NAME,
                                      SCALAR_COLUMNS, SCALARS_NAME, ConfigMismatchError, Trainer,
                                      checkpoint, run_dir)
from braintrace_conv.training._fit import hold

from trainers import SIZE, K, T, events_with, files_of, model, params_of, refused, trainer


# ----------------------------------------------------------------------------- fit arguments
@pytest.mark.parametrize('kwargs, error, match', [
    (dict(epochs=0), ValueError, 'epochs must be a positive integer, got 0'),
    (dict(epochs=2.5), ValueError, 'epochs must be a positive integer, got 2.5'),
    (dict(batch_size=0), ValueError, 'batch_size must be a positive integer, got 0'),
    (dict(batch_size=25), ValueError,
     r'batch_size must be at most the number of training samples \(24\), got 25'),
    (dict(seed=-1), ValueError, 'seed must be a non-negative integer, got -1'),
    (dict(log_every=0), ValueError, 'log_every must be a positive integer, got 0'),
    (dict(eval_batch_size=0), ValueError, 'eval_batch_size must be a positive integer, got 0'),
    (dict(resume=True), ValueError, 'resume needs out_dir'),
    (dict(overwrite=True), ValueError, 'overwrite needs out_dir'),
    (dict(run_config={'schedule': print}), TypeError, 'run_config must be a JSON-able dict'),
    (dict(run_config=[1, 2]), TypeError, 'run_config must be a dict, got list'),
    (dict(verify_data=True), ValueError, 'verify_data needs out_dir'),
    (dict(verify_data=1), TypeError, 'verify_data must be True or False, got 1'),
])
def test_fit_arguments(data, kwargs, error, match):
    tr = trainer()
    refused(tr, lambda: tr.fit(data[0], **{'epochs': 1, 'batch_size': 8, 'progress': False,
                                           **kwargs}), error, match)


def test_fit_without_optimizer(data):
    m = model()
    tr = Trainer(bc.BPTT(m))
    refused(tr, lambda: tr.fit(data[0], epochs=1, batch_size=8), ValueError,
            'fit needs an optimizer; this Trainer was built without one')


# ----------------------------------------------------------------------------- datasets
@pytest.mark.parametrize('train, evaluate, error, match', [
    (lambda d: d.events, None, TypeError, 'train_dataset must be a FrameDataset'),
    (lambda d: events_with(np.nan, (5, 2, 1, 3, 4)), None, ValueError,
     r'train_dataset events must be finite, got nan at sample=5, t=2, channel=1, row=3, '
     r'column=4 \(1 non-finite'),
    (None, lambda d: events_with(np.inf, (0, 5, 0, 7, 7)), ValueError,
     'eval_dataset events must be finite, got inf at sample=0, t=5, channel=0, row=7, column=7'),
    (lambda d: EventDataset(d.events, d.labels, 10), None, ValueError,
     'train_dataset has 10 classes but the model has 8 outputs'),
    (None, lambda d: moving_bars(8, T=T, size=(9, 9), seed=0), ValueError,
     r'eval_dataset does not fit the model: one step of shape \(B, 2, 9, 9\) gives: '
     r'RecurrentConvSNN expects inputs'),
    (lambda d: d.subset([]), None, ValueError, 'train_dataset must hold at least one sample'),
])
def test_datasets_are_checked_before_the_first_step(data, train, evaluate, error, match):
    tr = trainer()
    train_set = data[0] if train is None else train(data[0])
    eval_set = None if evaluate is None else evaluate(data[1])
    refused(tr, lambda: tr.fit(train_set, epochs=1, batch_size=8, eval_dataset=eval_set,
                               progress=False), error, match)


def test_final_steps_longer_than_the_data(data):
    tr = trainer(loss='final', final_steps=T + 1)
    refused(tr, lambda: tr.fit(data[0], epochs=1, batch_size=8, progress=False), ValueError,
            rf'final_steps must be at most the number of time steps of train_dataset \({T}\), got {T + 1}')


# ----------------------------------------------------------------------------- run directories
def test_a_run_is_never_overwritten_silently(run, data, tmp_path):
    out, _ = run
    fit = dict(epochs=2, batch_size=8, eval_dataset=data[1], progress=False)
    tr = trainer(seed=9)
    refused(tr, lambda: tr.fit(data[0], out_dir=out, **fit), FileExistsError,
            'already holds a run .*checkpoint-last.npz.*; pass resume=True to continue it or '
            'overwrite=True to replace it', out)
    refused(tr, lambda: tr.fit(data[0], out_dir=out, resume=True, overwrite=True, **fit),
            ValueError, 'resume and overwrite exclude each other', out)
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path, resume=True, **fit),
            FileNotFoundError, 'nothing to resume: .* has no checkpoint-last.npz', tmp_path)
    (tmp_path / 'file').write_text('x')
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path / 'file', **fit), ValueError,
            'exists and is not a directory', tmp_path)
    (tmp_path / 'old').mkdir()
    (tmp_path / 'old' / 'checkpoint.pkl').write_bytes(b'\x80\x04N.')
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path / 'old', **fit), FileExistsError,
            r'already holds a run \(checkpoint.pkl\)', tmp_path)


@pytest.mark.parametrize('change, match', [
    (dict(batch_size=4), r"batch_size: 8 in the checkpoint, 4 now"),
    (dict(seed=1), r"seed: 0 in the checkpoint, 1 now"),
    (dict(train=lambda d: d.subset(np.arange(20))), r"train_data: "),
    (dict(eval=lambda d: None), r"eval_data: "),
    (dict(run_config={'lr': 0.1}), r"lr: None in the checkpoint, 0.1 now"),
])
def test_resume_refuses_another_configuration(run, data, change, match):
    out, _ = run
    tr = trainer(seed=9)
    train = change.get('train', lambda d: d)(data[0])
    eval_set = change.get('eval', lambda d: d)(data[1])
    refused(tr, lambda: tr.fit(train, epochs=2, batch_size=change.get('batch_size', 8),
                               seed=change.get('seed', 0), eval_dataset=eval_set, out_dir=out,
                               resume=True, run_config=change.get('run_config'),
                               progress=False),
            ConfigMismatchError, match, out)


# ----------------------------------------------------------------------------- checkpoints
def test_resume_gives_identical_result(bars, tmp_path):
    train, test = bars
    kwargs = dict(batch_size=8, seed=3, eval_dataset=test, progress=False)
    straight = trainer(update_every=3)
    straight.fit(train, epochs=2, out_dir=tmp_path / 'straight', **kwargs)

    interrupted = trainer(update_every=3)
    interrupted.fit(train, epochs=1, out_dir=tmp_path / 'resumed', **kwargs)
    resumed = trainer(seed=7, update_every=3)       # other initial weights: restore must win
    resumed.fit(train, epochs=2, out_dir=tmp_path / 'resumed', resume=True, **kwargs)

    assert resumed.epoch == straight.epoch == 2
    a, b = params_of(straight), params_of(resumed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    for x, y in zip(jax.tree.leaves(straight.opt_state), jax.tree.leaves(resumed.opt_state)):
        np.testing.assert_array_equal(x, y)
    assert [r['train_loss'] for r in resumed.history] == \
        [r['train_loss'] for r in straight.history]
    assert resumed.history[1]['test_accuracy'] == straight.history[1]['test_accuracy']


def test_fit_writes_metrics_and_learning_curve(bars, tmp_path):
    train, test = bars
    tr = Trainer(bc.BPTT(model()), optax.adam(1e-2), loss='final', final_steps=2)
    tr.fit(train, epochs=2, batch_size=8, eval_dataset=test, out_dir=tmp_path, progress=False)
    metrics = json.loads((tmp_path / METRICS_NAME).read_text())
    assert metrics['algorithm'] == 'BPTT' and metrics['loss'] == 'final'
    assert metrics['epochs_completed'] == 2 and len(metrics['train_loss']) == 2
    assert metrics['test_accuracy'] == metrics['history'][-1]['test_accuracy']
    assert set(metrics['history'][0]['spike_rates']) == {'blocks.0.neuron', 'blocks.1.neuron'}
    assert metrics['best']['test_accuracy'] == max(r['test_accuracy'] for r in metrics['history'])
    assert (tmp_path / CURVE_NAME).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert (tmp_path / LAST_CHECKPOINT).exists() and (tmp_path / BEST_CHECKPOINT).exists()
    rows = (tmp_path / SCALARS_NAME).read_text().splitlines()
    assert rows[0] == ','.join(SCALAR_COLUMNS)
    steps = [int(r.split(',')[0]) for r in rows[1:]]
    assert steps == list(range(1, 2 * (len(train) // 8) + 1))     # one row per update


def test_last_and_best_checkpoints(evaluated_run, bars):
    out, tr = evaluated_run
    _, last = checkpoint.read(out / LAST_CHECKPOINT)
    _, best = checkpoint.read(out / BEST_CHECKPOINT)
    accuracies = [r['test_accuracy'] for r in tr.history]
    best_epoch = 1 + int(np.argmax(accuracies))            # the first of equal maxima
    assert last['epoch'] == 3 and last['history'] == json.loads(json.dumps(tr.history))
    assert best['epoch'] == best_epoch == tr.best['epoch']
    assert best['best'] == dict(epoch=best_epoch, test_accuracy=max(accuracies))
    assert best['run'] == {} and best['trainer'] == tr.config()
    assert best['fit']['batch_size'] == 12 and len(best['fit']['train_data']['sha256']) == 64


def test_overwrite_replaces_only_the_run_files(evaluated_run, bars, tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    for name in os.listdir(evaluated_run[0]):
        if name != 'tensorboard':
            (out / name).write_bytes((evaluated_run[0] / name).read_bytes())
    tr = trainer(seed=2, lr=2e-2)
    tr.fit(bars[0], epochs=1, batch_size=12, out_dir=out, overwrite=True, progress=False,
           tensorboard=False)
    assert (out / 'notes.txt').read_text() == 'mine'
    assert checkpoint.read(out / LAST_CHECKPOINT)[1]['epoch'] == 1
    assert not (out / BEST_CHECKPOINT).exists()             # this evaluated_run has no evaluation


# ----------------------------------------------------------------------------- repair, extend, lock
def fit(tr, bars, out, epochs, **kwargs):
    kwargs.setdefault('run_config', dict(epochs=epochs))
    return tr.fit(bars[0], epochs=epochs, batch_size=12, eval_dataset=bars[1], out_dir=out,
                  progress=False, tensorboard=False, **kwargs)


def test_resume_repairs_what_a_run_killed_after_its_last_checkpoint_left(bars, tmp_path):
    out = tmp_path / 'run'
    fit(trainer(lr=2e-2), bars, out, 1)
    intact = {name: (out / name).read_bytes() for name in os.listdir(out)}
    # killed between the last and the best checkpoint writes, before metrics and the curve
    (out / BEST_CHECKPOINT).unlink()
    (out / 'metrics.json').write_text('{"epochs_completed": 0}')
    (out / 'learning_curve.png').unlink()
    (out / '.checkpoint-best.npz.x1y2.tmp').write_bytes(b'partial')
    assert bc.training.run_dir.lagging(out, 1, checkpoint.read(out / LAST_CHECKPOINT)[1]['best']) \
        == [BEST_CHECKPOINT, 'metrics.json', 'learning_curve.png', '.checkpoint-best.npz.x1y2.tmp']
    tr = trainer(seed=7, lr=2e-2)
    fit(tr, bars, out, 1, resume=True)
    assert sorted(os.listdir(out)) == sorted(intact)
    assert (out / BEST_CHECKPOINT).read_bytes() == intact[LAST_CHECKPOINT]
    assert json.loads((out / 'metrics.json').read_text())['epochs_completed'] == 1
    assert bc.training.run_dir.lagging(out, 1, tr.best) == []


def scalars(out):
    with open(out / SCALARS_NAME, newline='') as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(SCALAR_COLUMNS)
    return [row[:-1] for row in rows[1:]]                   # all but the time column


def test_a_larger_epochs_continues_a_finished_run(bars, tmp_path):
    fit(trainer(lr=2e-2), bars, tmp_path / 'straight', 2)
    fit(trainer(lr=2e-2), bars, tmp_path / 'extended', 1)
    # a damaged scalars.csv (bytes that are not UTF-8) loses only its damaged rows
    with open(tmp_path / 'extended' / SCALARS_NAME, 'ab') as f:
        f.write(b'\xff\xfe,\x80\n')
    fit(trainer(seed=7, lr=2e-2), bars, tmp_path / 'extended', 2, resume=True)
    a, meta_a = checkpoint.read(tmp_path / 'straight' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'extended' / LAST_CHECKPOINT)
    for name in a:                   # a constant learning rate: bitwise the uninterrupted evaluated_run
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_b['epoch'] == 2 and meta_b['run'] == dict(epochs=2)
    assert scalars(tmp_path / 'straight') == scalars(tmp_path / 'extended')
    with pytest.raises(bc.training.ConfigMismatchError, match='epochs: 2 in the checkpoint, 1 now'):
        fit(trainer(seed=7, lr=2e-2), bars, tmp_path / 'extended', 3, resume=True,
            run_config=dict(epochs=1))


HOLD_LOCK = ('import sys, time\n'
             'from braintrace_conv.training import run_dir\n'
             'with run_dir.locked(sys.argv[1]):\n'
             '    print("locked", flush=True)\n'
             '    time.sleep(120)\n')


def test_a_run_directory_is_locked_while_a_process_writes_in_it(evaluated_run, bars, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(evaluated_run[0], out)
    holder = subprocess.Popen([sys.executable, '-c', HOLD_LOCK, str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'locked\n'
        before = {p: p.read_bytes() for p in out.rglob('*') if p.is_file()}
        for flags in (dict(resume=True), dict(overwrite=True), {}):
            with pytest.raises(bc.training.run_dir.RunLockedError,
                               match=f'run is in use: another process \\(pid {holder.pid}\\) is '
                                     f'writing a run in it'):
                fit(trainer(seed=3, lr=2e-2), bars, out, 4, **flags)
            assert {p: p.read_bytes() for p in out.rglob('*') if p.is_file()} == before
    finally:
        holder.kill()
        holder.wait()
    # the lock file of the killed holder remains, with its pid: it is stale and taken over
    assert (out / '.lock').read_text().split()[0] == str(holder.pid)
    fit(trainer(seed=3, lr=2e-2), bars, out, 1, overwrite=True)
    assert not (out / '.lock').exists()


def test_overwrite_removes_links_never_their_targets(evaluated_run, bars, tmp_path):
    out, elsewhere = tmp_path / 'run', tmp_path / 'elsewhere'
    shutil.copytree(evaluated_run[0], out, ignore=shutil.ignore_patterns('tensorboard'))
    elsewhere.mkdir()
    (elsewhere / 'keep.txt').write_text('not the run\'s')
    (out / 'tensorboard').symlink_to(elsewhere)
    (out / 'metrics.json').unlink()
    (out / 'metrics.json').symlink_to(elsewhere / 'keep.txt')
    fit(trainer(seed=3, lr=2e-2), bars, out, 1, overwrite=True)
    assert (elsewhere / 'keep.txt').read_text() == 'not the run\'s'
    assert os.listdir(elsewhere) == ['keep.txt']
    assert not (out / 'tensorboard').exists() and not (out / 'metrics.json').is_symlink()


class Readout(brainstate.nn.Module):
    """Class scores straight from the frames: no neuron, so no spike rates."""

    def __init__(self):
        super().__init__()
        self.flat, self.fc = bnn.Flatten(), bnn.Linear(2 * SIZE[0] * SIZE[1], K)

    def update(self, x):
        return self.fc(self.flat(x))


@pytest.mark.parametrize('net, rates', [
    (model, r', spike rates \[blocks\.0\.neuron \d\.\d{3}, blocks\.1\.neuron \d\.\d{3}\]'),
    (Readout, ''),
])
def test_each_epoch_prints_a_line_naming_spike_rates_only_when_there_are_some(data, capsys, net,
                                                                              rates):
    Trainer(bc.BPTT(net()), optax.adam(1e-2)).fit(data[0], epochs=1, batch_size=8,
                                                  eval_dataset=data[1])
    line = capsys.readouterr().out
    assert re.fullmatch(r'epoch 1/1: train loss \d\.\d{4}, train acc \d+\.\d%, test acc \d+\.\d%'
                        + rates + r' \(\d+\.\d s\)\n', line), line


def test_hold_checks_locks_and_creates_a_run_directory_but_replaces_nothing(run, tmp_path):
    new = tmp_path / 'new'
    with hold(new, resume=False, overwrite=False) as held:
        assert held == new and new.is_dir() and (new / run_dir.LOCK_NAME).exists()
        with hold(new, resume=False, overwrite=False):      # re-entrant: fit inside a caller
            pass
    assert os.listdir(new) == []
    copy = tmp_path / 'copy'
    shutil.copytree(run[0], copy)
    before = files_of(copy)
    with hold(copy, resume=False, overwrite=True):
        # the lock is taken, the run left for fit to replace once it checked its arguments
        assert set(files_of(copy)) - set(before) == {run_dir.LOCK_NAME}
    with pytest.raises(run_dir.RunExistsError):
        with hold(copy, resume=False, overwrite=False):
            pass
    assert files_of(copy) == before

