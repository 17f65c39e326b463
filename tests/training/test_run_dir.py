"""Run directories: replaced all or nothing, and the lock without fcntl."""
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


def test_overwrite_is_all_or_nothing(evaluated_run, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    shutil.copytree(evaluated_run[0], out)
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
    # the files of a evaluated_run replaced earlier that could not be deleted: removed now
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
