"""Checkpoints and run directories: last and best, inference loading, atomic writes, and a
run killed mid-way that resumes to the bitwise result of an uninterrupted one.

Refused checkpoints (crafted, corrupt, mismatched) are in test_training_bad_inputs.py.
"""
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import brainstate
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import moving_bars
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT,
                                      SCALAR_COLUMNS, SCALARS_NAME, Trainer, checkpoint, run_dir)

T, SIZE = 6, (8, 8)


def trainer(seed=0, optimizer=True):
    brainstate.random.seed(seed)
    model = recurrent_conv_snn((2,) + SIZE, 8, channels=(2, 4))
    return Trainer(bc.ES_D_RTRL(model, model.membrane_decay()),
                   optax.adam(2e-2) if optimizer else None)


@pytest.fixture(scope='module')
def data():
    return moving_bars(48, T=T, size=SIZE, seed=0).split(0.25, seed=0)


@pytest.fixture(scope='module')
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp('run')
    tr = trainer()
    tr.fit(data[0], epochs=3, batch_size=12, eval_dataset=data[1], out_dir=out, progress=False)
    return out, tr


def test_last_and_best_checkpoints(run, data):
    out, tr = run
    _, last = checkpoint.read(out / LAST_CHECKPOINT)
    _, best = checkpoint.read(out / BEST_CHECKPOINT)
    accuracies = [r['test_accuracy'] for r in tr.history]
    best_epoch = 1 + int(np.argmax(accuracies))            # the first of equal maxima
    assert last['epoch'] == 3 and last['history'] == json.loads(json.dumps(tr.history))
    assert best['epoch'] == best_epoch == tr.best['epoch']
    assert best['best'] == dict(epoch=best_epoch, test_accuracy=max(accuracies))
    assert best['run'] == {} and best['trainer'] == tr.config()
    assert best['fit']['batch_size'] == 12 and len(best['fit']['train_data']['sha256']) == 64


def test_load_params_for_inference_needs_no_optimizer(run, data):
    out, tr = run
    inference = trainer(seed=5, optimizer=False)
    meta = inference.load_params(out)                       # default: the best checkpoint
    assert meta['epoch'] == tr.best['epoch']
    assert inference.evaluate(data[1], 12)['accuracy'] == tr.best['test_accuracy']
    inference.load_params(out, which='last')
    final = tr.evaluate(data[1], 12)
    assert inference.evaluate(data[1], 12) == final
    assert final['accuracy'] == tr.history[-1]['test_accuracy']


def test_a_failed_write_leaves_the_previous_checkpoint(run, tmp_path, monkeypatch):
    out, tr = run
    path = tmp_path / 'ckpt.npz'
    tr.save_checkpoint(path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'fsync', disk_full)
    with pytest.raises(OSError, match="No space left on device: '.*ckpt.npz'"):
        tr.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ['ckpt.npz']


def test_overwrite_replaces_only_the_run_files(run, data, tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    for name in os.listdir(run[0]):
        if name != 'tensorboard':
            (out / name).write_bytes((run[0] / name).read_bytes())
    tr = trainer(seed=2)
    tr.fit(data[0], epochs=1, batch_size=12, out_dir=out, overwrite=True, progress=False,
           tensorboard=False)
    assert (out / 'notes.txt').read_text() == 'mine'
    assert checkpoint.read(out / LAST_CHECKPOINT)[1]['epoch'] == 1
    assert not (out / BEST_CHECKPOINT).exists()             # this run has no evaluation


def test_tensorboard_events(run):
    pytest.importorskip('tensorboardX')
    events = os.listdir(run[0] / 'tensorboard')
    assert any(name.startswith('events.out.tfevents') for name in events)


# ----------------------------------------------------------------------------- repair, extend, lock
def fit(tr, data, out, epochs, **kwargs):
    kwargs.setdefault('run_config', dict(epochs=epochs))
    return tr.fit(data[0], epochs=epochs, batch_size=12, eval_dataset=data[1], out_dir=out,
                  progress=False, tensorboard=False, **kwargs)


def test_resume_repairs_what_a_run_killed_after_its_last_checkpoint_left(data, tmp_path):
    out = tmp_path / 'run'
    fit(trainer(), data, out, 1)
    intact = {name: (out / name).read_bytes() for name in os.listdir(out)}
    # killed between the last and the best checkpoint writes, before metrics and the curve
    (out / BEST_CHECKPOINT).unlink()
    (out / 'metrics.json').write_text('{"epochs_completed": 0}')
    (out / 'learning_curve.png').unlink()
    (out / '.checkpoint-best.npz.x1y2.tmp').write_bytes(b'partial')
    assert bc.training.run_dir.lagging(out, 1, checkpoint.read(out / LAST_CHECKPOINT)[1]['best']) \
        == [BEST_CHECKPOINT, 'metrics.json', 'learning_curve.png', '.checkpoint-best.npz.x1y2.tmp']
    tr = trainer(seed=7)
    fit(tr, data, out, 1, resume=True)
    assert sorted(os.listdir(out)) == sorted(intact)
    assert (out / BEST_CHECKPOINT).read_bytes() == intact[LAST_CHECKPOINT]
    assert json.loads((out / 'metrics.json').read_text())['epochs_completed'] == 1
    assert bc.training.run_dir.lagging(out, 1, tr.best) == []


def test_a_larger_epochs_continues_a_finished_run(data, tmp_path):
    fit(trainer(), data, tmp_path / 'straight', 2)
    fit(trainer(), data, tmp_path / 'extended', 1)
    # a damaged scalars.csv (bytes that are not UTF-8) loses only its damaged rows
    with open(tmp_path / 'extended' / SCALARS_NAME, 'ab') as f:
        f.write(b'\xff\xfe,\x80\n')
    fit(trainer(seed=7), data, tmp_path / 'extended', 2, resume=True)
    a, meta_a = checkpoint.read(tmp_path / 'straight' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'extended' / LAST_CHECKPOINT)
    for name in a:                   # a constant learning rate: bitwise the uninterrupted run
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_b['epoch'] == 2 and meta_b['run'] == dict(epochs=2)
    assert scalars(tmp_path / 'straight') == scalars(tmp_path / 'extended')
    with pytest.raises(bc.training.ConfigMismatchError, match='epochs: 2 in the checkpoint, 1 now'):
        fit(trainer(seed=7), data, tmp_path / 'extended', 3, resume=True,
            run_config=dict(epochs=1))


HOLD_LOCK = ('import sys, time\n'
             'from braintrace_conv.training import run_dir\n'
             'with run_dir.locked(sys.argv[1]):\n'
             '    print("locked", flush=True)\n'
             '    time.sleep(120)\n')


def test_a_run_directory_is_locked_while_a_process_writes_in_it(run, data, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(run[0], out)
    holder = subprocess.Popen([sys.executable, '-c', HOLD_LOCK, str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'locked\n'
        before = {p: p.read_bytes() for p in out.rglob('*') if p.is_file()}
        for flags in (dict(resume=True), dict(overwrite=True), {}):
            with pytest.raises(bc.training.run_dir.RunLockedError,
                               match=f'run is in use: another process \\(pid {holder.pid}\\) is '
                                     f'writing a run in it'):
                fit(trainer(seed=3), data, out, 4, **flags)
            assert {p: p.read_bytes() for p in out.rglob('*') if p.is_file()} == before
    finally:
        holder.kill()
        holder.wait()
    # the lock file of the killed holder remains, with its pid: it is stale and taken over
    assert (out / '.lock').read_text().split()[0] == str(holder.pid)
    fit(trainer(seed=3), data, out, 1, overwrite=True)
    assert not (out / '.lock').exists()


def test_overwrite_removes_links_never_their_targets(run, data, tmp_path):
    out, elsewhere = tmp_path / 'run', tmp_path / 'elsewhere'
    shutil.copytree(run[0], out, ignore=shutil.ignore_patterns('tensorboard'))
    elsewhere.mkdir()
    (elsewhere / 'keep.txt').write_text('not the run\'s')
    (out / 'tensorboard').symlink_to(elsewhere)
    (out / 'metrics.json').unlink()
    (out / 'metrics.json').symlink_to(elsewhere / 'keep.txt')
    fit(trainer(seed=3), data, out, 1, overwrite=True)
    assert (elsewhere / 'keep.txt').read_text() == 'not the run\'s'
    assert os.listdir(elsewhere) == ['keep.txt']
    assert not (out / 'tensorboard').exists() and not (out / 'metrics.json').is_symlink()


def tree(directory) -> dict:
    """Every entry under ``directory``, hidden ones too: a file's bytes, a link's target,
    ``'dir'`` for a directory."""
    def entry(p):
        return ('link to ' + os.readlink(p) if p.is_symlink() else 'dir' if p.is_dir()
                else p.read_bytes())
    return {p.relative_to(directory): entry(p) for p in directory.rglob('*')}


def test_overwrite_is_all_or_nothing(run, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    shutil.copytree(run[0], out)
    (out / 'notes.txt').write_text('mine')
    before = tree(out)
    rename = os.rename

    def refused(src, dst):     # e.g. a file or directory the user may not move
        if os.path.basename(src) == CURVE_NAME:
            raise PermissionError(13, 'Permission denied')
        return rename(src, dst)

    monkeypatch.setattr(os, 'rename', refused)
    with pytest.raises(PermissionError, match=rf'cannot replace the run in {out}: '
                                              rf'{out / CURVE_NAME} cannot be moved \(Permission '
                                              rf'denied\); nothing was removed'):
        run_dir.create(out, overwrite=True)
    assert tree(out) == before              # the files moved before the failure are back
    monkeypatch.setattr(os, 'rename', rename)
    # the files of a run replaced earlier that could not be deleted: removed now
    rmtree = shutil.rmtree

    def undeletable(path):
        raise PermissionError(13, 'Permission denied', str(path))

    monkeypatch.setattr(shutil, 'rmtree', undeletable)
    with pytest.warns(RuntimeWarning, match=r'the files of the run replaced in .* could not all '
                                            r'be deleted .*; they are in .*\.replaced-run\.'):
        run_dir.create(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith('.replaced-run.')) == \
        ['notes.txt']
    monkeypatch.setattr(shutil, 'rmtree', rmtree)
    run_dir.create(out, overwrite=False)
    assert os.listdir(out) == ['notes.txt']


def test_without_fcntl_the_lock_is_a_file_holding_pid_and_host(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir, 'fcntl', None)
    out, host = tmp_path / 'run', socket.gethostname()
    with run_dir.locked(out):
        assert (out / '.lock').read_text().split()[:2] == [str(os.getpid()), host]
        with run_dir.locked(out):                       # re-entrant within the process
            pass
        assert run_dir.lock_holder(out) is None and (out / '.lock').exists()
    assert os.listdir(out) == []                        # released
    holder = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        for where, pid in ((host, f'pid {holder.pid}'), ('elsewhere', 'pid 1 on elsewhere')):
            lock = f'{holder.pid if where == host else 1} {where} 0123\n'
            (out / '.lock').write_text(lock)
            for attempt in (lambda: run_dir.check(out, resume=False, overwrite=True),
                            lambda: run_dir.locked(out).__enter__()):
                with pytest.raises(run_dir.RunLockedError,
                                   match=rf'run is in use: another process \({pid}\) is writing '
                                         rf'a run in it; wait for it to end or stop it'):
                    attempt()
                assert os.listdir(out) == ['.lock'] and (out / '.lock').read_text() == lock
    finally:
        holder.kill()
        holder.wait()
    # the holder ended without releasing its lock: it is stale and taken over
    (out / '.lock').write_text(f'{holder.pid} {host} 0123\n')
    assert run_dir.lock_holder(out) is None
    with run_dir.locked(out):
        assert (out / '.lock').read_text().split()[0] == str(os.getpid())
    assert os.listdir(out) == []


# ----------------------------------------------------------------------------- kill and resume
TINY = ['train', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--epochs', '6', '--quiet']


def cli(out, *extra):
    return subprocess.Popen([sys.executable, '-m', 'braintrace_conv.cli', *TINY, '--out', str(out),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def scalars(out):
    with open(out / SCALARS_NAME, newline='') as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(SCALAR_COLUMNS)
    return [row[:-1] for row in rows[1:]]                   # all but the time column


def test_killed_run_resumes_to_the_bitwise_result_of_an_uninterrupted_one(tmp_path):
    straight = cli(tmp_path / 'straight')
    victim = cli(tmp_path / 'killed')
    first = tmp_path / 'killed' / LAST_CHECKPOINT
    deadline = time.monotonic() + 300
    while not first.exists():
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.kill()
    victim.communicate()
    interrupted_at = checkpoint.read(first)[1]['epoch']
    assert victim.returncode == -9 and 1 <= interrupted_at < 6

    resumed = cli(tmp_path / 'killed', '--resume')
    assert resumed.wait(300) == 0, resumed.communicate()
    assert straight.wait(300) == 0, straight.communicate()
    a, meta_a = checkpoint.read(tmp_path / 'straight' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'killed' / LAST_CHECKPOINT)
    assert a.keys() == b.keys() and any(k.startswith('opt/') for k in a)
    for name in a:                                           # params, optimiser state, RNG key
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    for meta in (meta_a, meta_b):
        for record in meta['history']:
            record.pop('epoch_time_s')
    assert meta_a == meta_b and meta_a['epoch'] == 6
    assert scalars(tmp_path / 'straight') == scalars(tmp_path / 'killed')
