"""The files of a run directory, and the rule that a run is never overwritten silently.

A directory that already holds a run (any of :data:`RUN_FILES`) is continued
with ``resume``, replaced with ``overwrite`` (only the files listed here are
removed, symbolic links among them as links, never what they point to), and
otherwise refused. The run files of a directory are never written through a
symbolic link: one among them is an error on ``resume``.

A process writing a run holds the directory's lock (:func:`locked`, the file
:data:`LOCK_NAME` holding its pid): another process is refused
(:class:`RunLockedError`, naming the holder's pid) until it ends; the lock
of a process that died is released by the operating system and taken over.
Temporary files left by a killed write are removed when a run is resumed or
replaced.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

from .._validation import one_of

try:
    import fcntl
except ImportError:     # no advisory locks on this platform: runs are not locked
    fcntl = None

__all__ = ['LAST_CHECKPOINT', 'BEST_CHECKPOINT', 'METRICS_NAME', 'SCALARS_NAME', 'CURVE_NAME',
           'TENSORBOARD_DIR', 'RUN_FILES', 'CHECKPOINTS', 'LOCK_NAME', 'RunLockedError',
           'run_files', 'check', 'create', 'locked', 'lock_holder', 'lagging',
           'checkpoint_file']

#: Checkpoint after the last completed epoch.
LAST_CHECKPOINT = 'checkpoint-last.npz'
#: Checkpoint of the epoch with the best evaluation accuracy so far.
BEST_CHECKPOINT = 'checkpoint-best.npz'
#: Per-epoch summary of the run.
METRICS_NAME = 'metrics.json'
#: Per-step scalars (CSV).
SCALARS_NAME = 'scalars.csv'
#: Loss and accuracy per epoch (PNG).
CURVE_NAME = 'learning_curve.png'
#: TensorBoard event files (when tensorboardX is installed).
TENSORBOARD_DIR = 'tensorboard'
#: Checkpoint names by kind.
CHECKPOINTS = {'best': BEST_CHECKPOINT, 'last': LAST_CHECKPOINT}
#: Everything a run writes (and older versions wrote: ``checkpoint.pkl``).
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, METRICS_NAME, SCALARS_NAME, CURVE_NAME,
             TENSORBOARD_DIR, 'checkpoint.pkl')
#: The lock file of a run directory while a process writes the run.
LOCK_NAME = '.lock'
# Locks this process holds: directory -> [file descriptor, depth].
_held: dict = {}


class RunLockedError(RuntimeError):
    """The run directory is locked by another process writing a run in it (``pid``)."""

    def __init__(self, directory, pid: Optional[int]):
        self.directory, self.pid = directory, pid
        holder = 'another process' if pid is None else f'another process (pid {pid})'
        super().__init__(f'{directory} is in use: {holder} is writing a run in it; wait for '
                         f'it to end or stop it.')


def run_files(directory: Union[str, os.PathLike]) -> list:
    """Names of the :data:`RUN_FILES` present in ``directory`` (links too, even dangling)."""
    directory = Path(directory)
    return [name for name in RUN_FILES if os.path.lexists(directory / name)]


def _pid(fd: int) -> Optional[int]:
    try:
        return int(os.pread(fd, 32, 0).decode('ascii').strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def lock_holder(directory: Union[str, os.PathLike]) -> Optional[int]:
    """The pid (``-1`` if unknown) of another process holding ``directory``'s lock, else
    ``None``; changes nothing."""
    directory = Path(directory)
    if fcntl is None or str(directory.resolve()) in _held:
        return None
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        pid = _pid(fd)
        return -1 if pid is None else pid
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(directory: Union[str, os.PathLike]):
    """Hold ``directory``'s lock (creating the directory) for the ``with`` block; re-entrant
    within a process. Raises :class:`RunLockedError` if another process holds it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = str(directory.resolve())
    if fcntl is None or key in _held:
        if key in _held:
            _held[key][1] += 1
        try:
            yield directory
        finally:
            if key in _held:
                _held[key][1] -= 1
        return
    path = directory / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = _pid(fd)
            os.close(fd)
            raise RunLockedError(directory, pid) from None
        try:    # the previous holder may have removed the file before we locked it
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f'{os.getpid()}\n'.encode())
    _held[key] = [fd, 1]
    try:
        yield directory
    finally:
        _held[key][1] -= 1
        if not _held[key][1]:
            del _held[key]
            path.unlink(missing_ok=True)
            os.close(fd)


def check(directory: Union[str, os.PathLike], *, resume: bool, overwrite: bool) -> Path:
    """Check, without changing anything, that a run may be written to ``directory``.

    Raises
    ------
    ValueError
        ``resume`` and ``overwrite`` together, ``directory`` is an empty path, a
        dangling link or not a directory, or (``resume``) run files in it are links.
    FileNotFoundError
        ``resume`` without a :data:`LAST_CHECKPOINT` in ``directory``.
    FileExistsError
        ``directory`` holds a run and neither ``resume`` nor ``overwrite`` is set.
    RunLockedError
        Another process is writing a run in ``directory``.
    """
    if resume and overwrite:
        raise ValueError('resume and overwrite exclude each other: continue the run in the '
                         'directory, or replace it.')
    if isinstance(directory, str) and not directory.strip():
        raise ValueError('the run directory is an empty path.')
    directory = Path(directory)
    if directory.is_symlink() and not directory.exists():
        raise ValueError(f'{directory} is a symbolic link to {os.readlink(directory)}, which '
                         f'does not exist.')
    if directory.exists() and not directory.is_dir():
        raise ValueError(f'{directory} exists and is not a directory.')
    pid = lock_holder(directory)
    if pid is not None:
        raise RunLockedError(directory, None if pid < 0 else pid)
    if resume:
        if not (directory / LAST_CHECKPOINT).is_file():
            raise FileNotFoundError(f'nothing to resume: {directory} has no {LAST_CHECKPOINT}.')
        links = [name for name in RUN_FILES if (directory / name).is_symlink()]
        if links:
            raise ValueError(f'{directory} holds symbolic links among its run files '
                             f'({", ".join(links)}); run files are never written through '
                             f'links: replace them by the files or directories themselves.')
    elif not overwrite:
        found = run_files(directory)
        if found:
            raise FileExistsError(f'{directory} already holds a run ({", ".join(found)}); '
                                  f'pass resume=True to continue it or overwrite=True to '
                                  f'replace it.')
    return directory


def create(directory: Union[str, os.PathLike], *, overwrite: bool) -> Path:
    """Create ``directory`` and check that it is writable (``OSError`` otherwise); with
    ``overwrite``, first remove the run files in it (a link as a link, never what it points
    to). Temporary files left by interrupted writes are removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
        pass
    for stale in _stale_temporaries(directory):
        stale.unlink(missing_ok=True)
    if overwrite:
        for name in run_files(directory):
            target = directory / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
    return directory


def _stale_temporaries(directory: Path) -> list:
    """Temporary files left by killed writes of run files: ``.<name>.<random>.tmp``."""
    return [p for name in RUN_FILES for p in directory.glob(f'.{name}.*.tmp')]


def lagging(directory: Union[str, os.PathLike], epoch: int, best: Optional[dict]) -> list:
    """Names of the files of the run in ``directory`` that lag behind its last checkpoint
    (``epoch`` completed, ``best`` its best-epoch entry), as a run killed during the writes
    that follow that checkpoint leaves them: the best checkpoint (when the last epoch was
    the best), ``metrics.json``, the learning curve, and temporary files."""
    from .checkpoint import CheckpointError, read

    directory = Path(directory)
    found = []
    if best is not None and best.get('epoch') == epoch:
        try:
            best_epoch = read(directory / BEST_CHECKPOINT)[1]['epoch']
        except (OSError, CheckpointError):
            best_epoch = None
        if best_epoch != epoch:
            found.append(BEST_CHECKPOINT)
    try:
        logged = json.loads((directory / METRICS_NAME).read_bytes())
        logged = logged.get('epochs_completed') if isinstance(logged, dict) else None
    except (OSError, ValueError):
        logged = None
    if epoch and logged != epoch:
        found.append(METRICS_NAME)
    if epoch and not (directory / CURVE_NAME).is_file():
        found.append(CURVE_NAME)
    return found + [p.name for p in _stale_temporaries(directory)]


def checkpoint_file(path: Union[str, os.PathLike], which: Optional[str] = None) -> Path:
    """The checkpoint file ``path``, or in the run directory ``path`` the ``which``
    (``'best'``/``'last'``; ``None``: best if it exists, else last) checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return path
    if which is not None:
        return path / CHECKPOINTS[one_of('which', which, tuple(CHECKPOINTS))]
    for name in CHECKPOINTS.values():
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f'{path} holds no checkpoint ({", ".join(CHECKPOINTS.values())}).')
