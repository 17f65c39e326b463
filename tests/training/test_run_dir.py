"""Run directories: what a run may be written to, replaced all or nothing, what a killed run
left behind, which checkpoint is read, and the lock (with and without fcntl)."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

from braintrace_conv.training import CURVE_NAME, run_dir


def tree(directory) -> dict:
    """Every entry under ``directory``, hidden ones too: a file's bytes, a link's target,
    ``'dir'`` for a directory."""
    def entry(p):
        return ('link to ' + os.readlink(p) if p.is_symlink() else 'dir' if p.is_dir()
                else p.read_bytes())
    return {p.relative_to(directory): entry(p) for p in directory.rglob('*')}


def staged_run(out) -> tuple:
    """A staging directory in ``out`` holding a new run's last checkpoint and metrics;
    ``(staging, its files)``."""
    staging = run_dir.stage(out)
    assert staging.parent == out and staging.name.startswith(run_dir.STAGING_PREFIX)
    (staging / run_dir.LAST_CHECKPOINT).write_bytes(b'new checkpoint')
    (staging / run_dir.METRICS_NAME).write_bytes(b'{"new": true}')
    return staging, tree(staging)


def test_a_new_run_replaces_the_old_one_all_or_nothing(evaluated_run, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    shutil.copytree(evaluated_run[0], out)
    (out / 'notes.txt').write_text('mine')
    before = tree(out)
    staging, new = staged_run(out)
    rename = os.rename

    def refused(src, dst):     # e.g. a file or directory the user may not move
        if os.path.basename(src) == CURVE_NAME:
            raise PermissionError(13, 'Permission denied')
        return rename(src, dst)

    monkeypatch.setattr(os, 'rename', refused)
    with pytest.raises(PermissionError, match=rf'cannot replace the run in {out}: '
                                              rf'{out / CURVE_NAME} cannot be moved \(Permission '
                                              rf'denied\); nothing was moved'):
        run_dir.commit(out, staging)
    # the files moved before the failure are back, and the new run is still staged
    assert tree(out) == {**before, **{staging.relative_to(out) / k: v for k, v in new.items()},
                         staging.relative_to(out): 'dir'}
    monkeypatch.setattr(os, 'rename', rename)
    rmtree = shutil.rmtree

    def undeletable(path, *args, **kwargs):
        if os.path.basename(path).startswith(run_dir.TRASH_PREFIX):
            raise PermissionError(13, 'Permission denied', str(path))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, 'rmtree', undeletable)
    with pytest.warns(RuntimeWarning, match=r'the files of the run replaced in .* could not all '
                                            r'be deleted .*; they are in .*\.replaced-run\.'):
        run_dir.commit(out, staging)
    assert not staging.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith('.replaced-run.')) == \
        sorted([*map(str, new), 'notes.txt'])
    monkeypatch.setattr(shutil, 'rmtree', rmtree)
    # the next run written there deletes the old files: the new run's checkpoint is in
    run_dir.create(out)
    assert {p.name for p in out.iterdir()} == {*map(str, new), 'notes.txt'}
    assert (out / run_dir.LAST_CHECKPOINT).read_bytes() == b'new checkpoint'


def test_a_run_killed_before_its_checkpoint_moved_in_leaves_the_old_run(evaluated_run,
                                                                         tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(evaluated_run[0], out)
    before = tree(out)
    # killed while staged: the old run is untouched, the staging directory is cleared
    staged_run(out)
    run_dir.create(out)
    assert tree(out) == before
    # killed in commit, the old run moved aside but the new checkpoint not yet moved in
    staging, _ = staged_run(out)
    trash = out / f'{run_dir.TRASH_PREFIX}killed'
    trash.mkdir()
    for name in run_dir.run_files(out):
        os.rename(out / name, trash / name)
    assert run_dir.run_files(out) == []
    run_dir.create(out)
    assert tree(out) == before


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


def test_check_says_why_a_run_may_not_be_written_and_changes_nothing(evaluated_run, tmp_path):
    out = evaluated_run[0]
    before = tree(out)
    with pytest.raises(run_dir.RunExistsError, match='already holds a run') as error:
        run_dir.check(out, resume=False, overwrite=False)
    assert isinstance(error.value, FileExistsError)
    with pytest.raises(run_dir.NothingToResumeError, match='nothing to resume') as error:
        run_dir.check(tmp_path, resume=True, overwrite=False)
    assert isinstance(error.value, FileNotFoundError)
    with pytest.raises(ValueError, match='resume and overwrite exclude each other'):
        run_dir.check(out, resume=True, overwrite=True)
    with pytest.raises(ValueError, match='the run directory is an empty path'):
        run_dir.check(' ', resume=False, overwrite=False)
    assert run_dir.check(out, resume=True, overwrite=False) == out
    assert run_dir.check(tmp_path / 'new', resume=False, overwrite=False) == tmp_path / 'new'
    assert tree(out) == before and not (tmp_path / 'new').exists()


def test_checkpoint_file_and_lagging_files(evaluated_run, tmp_path):
    out, tr = evaluated_run
    best = run_dir.BEST_CHECKPOINT
    assert run_dir.checkpoint_file(out) == out / best
    assert run_dir.checkpoint_file(out, 'last') == out / run_dir.LAST_CHECKPOINT
    assert run_dir.checkpoint_file(out / best) == out / best
    with pytest.raises(ValueError, match=r"which must be one of \('best', 'last'\)"):
        run_dir.checkpoint_file(out, 'worst')
    with pytest.raises(FileNotFoundError, match='holds no checkpoint'):
        run_dir.checkpoint_file(tmp_path)
    assert run_dir.lagging(out, tr.epoch, tr.best) == []
    assert run_dir.lagging(tmp_path, 2, None) == [run_dir.METRICS_NAME, run_dir.CURVE_NAME]
    assert run_dir.run_files(out)[:2] == [run_dir.LAST_CHECKPOINT, best]


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    out = tmp_path / 'run'
    with run_dir.locked(out) as held:
        assert held == out and run_dir.lock_holder(out) is None     # held by this process
        with run_dir.locked(out):
            pass
        assert (out / run_dir.LOCK_NAME).exists()
    assert os.listdir(out) == []                                    # released



@pytest.mark.parametrize('with_fcntl', [True, False])
def test_a_held_directory_removed_meanwhile_is_an_error_and_never_recreated(
        tmp_path, monkeypatch, with_fcntl):
    if not with_fcntl:
        monkeypatch.setattr(run_dir, 'fcntl', None)
    out = tmp_path / 'run'
    lost = rf'the run directory {out} was removed or replaced while this process was writing'
    with run_dir.locked(out):
        with pytest.raises(run_dir.RunDirectoryLostError, match=lost):
            with run_dir.locked(out):
                shutil.rmtree(out)
                (out / 'metrics.json').write_bytes(b'{}')   # a write finding it gone
        with pytest.raises(run_dir.RunDirectoryLostError, match=lost):
            with run_dir.locked(out):                       # re-entered: checked first
                pass
        assert not out.exists()
        out.mkdir()                     # replaced: another writer's lock is left alone
        (out / '.lock').write_text('1 elsewhere 0123\n')
        with pytest.raises(run_dir.RunDirectoryLostError, match=lost):
            with run_dir.locked(out):
                pass
    assert os.listdir(out) == ['.lock'] and (out / '.lock').read_text() == '1 elsewhere 0123\n'
