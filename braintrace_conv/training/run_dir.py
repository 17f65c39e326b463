"""The files of a run directory, and the rule that a run is never overwritten silently.

A directory that already holds a run (any of :data:`RUN_FILES`) is continued
with ``resume``, replaced with ``overwrite`` (only the files listed here are
removed, symbolic links among them as links, never what they point to), and
otherwise refused. The run files of a directory are never written through a
symbolic link: one among them is an error on ``resume``.

A process writing a run holds the directory's lock (:func:`locked`, the file
:data:`LOCK_NAME` holding its pid and host): another process is refused
(:class:`RunLockedError`, naming the holder's pid) until it ends; the lock
of a process that died is taken over. Where ``fcntl`` exists the lock is an
advisory lock on that file, which the operating system releases when its
holder dies; elsewhere (Windows) it is the file itself, created exclusively
and removed on release, and one whose pid is no longer running on this host
is stale (one of another host is never taken over: its pid cannot be checked,
so the refusal names the file to remove once that process is known to be gone).
The lock file is opened without blocking and never through a symbolic link:
anything but a regular file there (a link, a FIFO, a directory) is refused,
naming it. While a process holds the lock, each re-entry checks that the lock
file is still the one it holds, so a run directory removed or replaced during
a run is an error (:class:`RunDirectoryLostError`), never silently recreated.

A new run (also one that replaces another) writes into a fresh hidden directory
in the run directory (:data:`STAGING_PREFIX`, :func:`stage`) until its first
checkpoint; :func:`commit` then moves its files in. Until then the run directory
is left exactly as it was, so a run that fails or is killed before its first
checkpoint loses nothing, and the run it was to replace is still there. The run
being replaced is removed only by :func:`commit`, all or nothing: its files are
first renamed into a fresh hidden directory beside them (:data:`TRASH_PREFIX`; a
rename fails up front, e.g. on permissions, and those already moved are moved
back), the new run's files are moved in (its last checkpoint first), and only
then are the old files deleted. What a killed run left is cleared when a run is
next written there (:func:`create`): temporary files and staging directories are
removed, and the files of a replaced run are deleted if the new run's last
checkpoint was moved in, else moved back.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Optional, Union

from .._validation import one_of
from ._files import fsync_dir

try:
    import fcntl
except ImportError:     # no advisory locks on this platform: an exclusively created file
    fcntl = None

__all__ = ['LAST_CHECKPOINT', 'BEST_CHECKPOINT', 'METRICS_NAME', 'SCALARS_NAME', 'CURVE_NAME',
           'TENSORBOARD_DIR', 'RUN_FILES', 'CHECKPOINTS', 'LOCK_NAME', 'TRASH_PREFIX',
           'STAGING_PREFIX', 'RunLockedError', 'RunExistsError', 'NothingToResumeError',
           'RunDirectoryLostError', 'run_files', 'check', 'create', 'stage', 'commit',
           'locked', 'lock_holder', 'lagging', 'lagging_files', 'checkpoint_file']

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
#: Prefix of the hidden directory the files of a run being replaced are moved into.
TRASH_PREFIX = '.replaced-run.'
#: Prefix of the hidden directory a new run writes in until its first checkpoint.
STAGING_PREFIX = '.new-run.'
# Locks this process holds: directory -> [what releases it, what tells whether its lock file
# is still the one held, depth].
_held: dict = {}
_NOFOLLOW = getattr(os, 'O_NOFOLLOW', 0)
_NONBLOCK = getattr(os, 'O_NONBLOCK', 0)
_HOST = socket.gethostname()
# A lock file without a readable pid is being written, or was left by a process killed
# between creating and writing it: stale after this many seconds.
_UNREADABLE_LOCK_S = 60.0


class RunLockedError(RuntimeError):
    """The run directory is locked by another process writing a run in it (``pid``, on
    ``host`` if another). ``lock``: the lock file, given where that process cannot be
    checked from here (another host, without ``fcntl``), so the message names the file to
    remove once it is known to be gone."""

    def __init__(self, directory, pid: Optional[int], host: Optional[str] = None,
                 lock: Optional[Path] = None):
        self.directory, self.pid = directory, pid
        who = ' '.join(([] if pid is None else [f'pid {pid}'])
                       + ([] if host in (None, _HOST) else [f'on {host}']))
        holder = f'another process ({who})' if who else 'another process'
        fix = 'wait for it to end or stop it'
        if lock is not None:
            fix += (f'; if it no longer runs on {host}, remove its lock file {lock} '
                    f'(written {_age(lock)} ago)')
        super().__init__(f'{directory} is in use: {holder} is writing a run in it; {fix}.')


class RunDirectoryLostError(OSError):
    """The run directory was removed or replaced while this process held its lock."""

    def __init__(self, directory):
        super().__init__(f'the run directory {directory} was removed or replaced while this '
                         f'process was writing a run in it (its lock file {LOCK_NAME} is no '
                         f'longer the one it holds); nothing more is written there.')


class RunExistsError(FileExistsError):
    """The directory holds a run, and it is neither to be resumed nor replaced."""


class NothingToResumeError(FileNotFoundError):
    """The directory holds no checkpoint to resume from."""


def run_files(directory: Union[str, os.PathLike]) -> list:
    """Names of the :data:`RUN_FILES` present in ``directory`` (links too, even dangling)."""
    directory = Path(directory)
    return [name for name in RUN_FILES if os.path.lexists(directory / name)]


def _age(path: Path) -> str:
    """How long ago ``path`` was last modified, e.g. ``'26.0 h'``."""
    try:
        seconds = max(0.0, time.time() - os.stat(path, follow_symlinks=False).st_mtime)
    except OSError:
        return 'an unknown time'
    return f'{seconds / 60:.0f} min' if seconds < 3600 else f'{seconds / 3600:.1f} h'


def _kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, for a message."""
    for test, kind in ((stat.S_ISLNK, 'a symbolic link'), (stat.S_ISFIFO, 'a FIFO'),
                       (stat.S_ISDIR, 'a directory'), (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return kind
    return 'a device file'


def _not_a_lock(path: Path, mode: int) -> ValueError:
    return ValueError(f'the lock file {path} is {_kind(mode)}, not a regular file; remove it '
                      f'to write a run in {path.parent}.')


def _open_lock(path: Path, flags: int) -> Optional[int]:
    """The descriptor of the lock file ``path`` opened with ``flags``, without blocking (on
    a FIFO) and without following a link; ``None`` if there is none and ``flags`` do not
    create it. Anything but a regular file there raises ``ValueError`` naming it."""
    if not _NOFOLLOW and os.path.islink(path):      # no O_NOFOLLOW on this platform
        raise _not_a_lock(path, stat.S_IFLNK)
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK, 0o644)
    except OSError as err:  # a link (ELOOP), a directory opened for writing, a FIFO, ...
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise _not_a_lock(path, mode) from None
        if isinstance(err, FileNotFoundError) and not flags & os.O_CREAT:
            return None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_lock(path, mode)
    return fd


def _holder(text: Optional[str]) -> tuple:
    """``(pid, host)`` of a lock file's content ``pid host token``; ``None`` where unreadable
    (or not a pid)."""
    fields = (text or '').split()
    try:
        pid = int(fields[0])
    except (IndexError, ValueError):
        return None, None
    return (pid, fields[1] if len(fields) > 1 else None) if pid > 0 else (None, None)


def _read(fd: int) -> Optional[str]:
    try:
        return os.pread(fd, 256, 0).decode('ascii')
    except (OSError, UnicodeDecodeError):
        return None


def _read_lock(path: Path) -> Optional[str]:
    """The content of the lock file ``path`` (``''`` if it cannot be read), ``None`` if absent;
    ``ValueError`` if it is not a regular file (:func:`_open_lock`)."""
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except OSError:
        return ''
    if fd is None:
        return None
    try:
        return os.read(fd, 256).decode('ascii', 'replace')
    except OSError:
        return ''
    finally:
        os.close(fd)


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (``True`` when it cannot be told)."""
    if pid == os.getpid():      # not this process: it holds no lock it does not know of
        return False
    if os.name == 'nt':         # os.kill(pid, 0) would end the process there
        import ctypes
        kernel32 = ctypes.WinDLL('kernel32', use_last_error=True)
        kernel32.OpenProcess.restype = ctypes.c_void_p
        handle = kernel32.OpenProcess(0x1000, False, pid)   # QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.get_last_error() == 5     # access denied: it exists
        try:
            code = ctypes.c_ulong()
            ok = kernel32.GetExitCodeProcess(ctypes.c_void_p(handle), ctypes.byref(code))
            return not ok or code.value == 259      # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(ctypes.c_void_p(handle))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:     # e.g. another user's process
        return True
    return True


def _stale(path: Path, text: str) -> bool:
    """Whether the lock file ``path`` holding ``text`` is left by a process that ended."""
    pid, host = _holder(text)
    if pid is None:
        try:
            return time.time() - os.stat(path, follow_symlinks=False).st_mtime > \
                _UNREADABLE_LOCK_S
        except FileNotFoundError:
            return False
    return host in (None, _HOST) and not _running(pid)


def _other_holder(directory: Path) -> Optional[str]:
    """The content of ``directory``'s lock file (``pid host token``, ``''`` if unreadable)
    if another process holds that lock, else ``None``; changes nothing."""
    if str(directory.resolve()) in _held:
        return None
    path = directory / LOCK_NAME
    if fcntl is None:
        text = _read_lock(path)
        return None if text is None or _stale(path, text) else text
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read(fd) or ''
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lock_holder(directory: Union[str, os.PathLike]) -> Optional[int]:
    """The pid (``-1`` if unknown) of another process holding ``directory``'s lock, else
    ``None``; changes nothing. ``ValueError`` if the lock file is not a regular file."""
    holder = _other_holder(Path(directory))
    if holder is None:
        return None
    pid = _holder(holder)[0]
    return -1 if pid is None else pid


def _lock_text() -> str:
    return f'{os.getpid()} {_HOST} {secrets.token_hex(8)}\n'


def _flock(directory: Path, path: Path) -> int:
    """Take the advisory lock on the lock file ``path``; returns its descriptor."""
    while True:
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            text = _read(fd)
            os.close(fd)
            raise _locked_error(directory, path, text or '') from None
        try:    # the previous holder may have removed the file before we locked it
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, _lock_text().encode())
    return fd


def _same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` (not followed) is the file open as ``fd``."""
    try:
        found, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _unflock(path: Path, fd: int) -> None:
    try:
        if _same_file(path, fd):    # never another holder's lock in a replaced directory
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _create_lock(directory: Path, path: Path) -> str:
    """Create the lock file ``path`` exclusively, taking over a stale one; returns its
    content (what identifies this holder)."""
    text = _lock_text()
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        except FileExistsError:
            found = _read_lock(path)
            if found is not None and not _stale(path, found):
                raise _locked_error(directory, path, found) from None
            if found is not None:
                _remove_stale(path, found)
            continue
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return text


def _remove_stale(path: Path, found: str) -> None:
    """Remove the stale lock file ``path`` if it still holds ``found``: it is renamed aside
    first, so that of two processes taking it over only one removes it, and a lock another
    process created meanwhile is put back."""
    aside = path.with_name(f'{path.name}.{secrets.token_hex(8)}')
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read_lock(aside) == found:
        os.unlink(aside)
    else:
        os.rename(aside, path)


def _holds_lock_file(path: Path, text: str) -> bool:
    """Whether the lock file ``path`` still holds ``text`` (this holder's)."""
    try:
        return _read_lock(path) == text
    except ValueError:
        return False


def _remove_lock(path: Path, text: str) -> None:
    if _holds_lock_file(path, text):
        path.unlink(missing_ok=True)


def _locked_error(directory: Path, path: Path, text: str) -> RunLockedError:
    """The refusal of ``directory``, whose lock file ``path`` holds ``text``: without
    ``fcntl``, the lock of a process on another host names the file to remove once that
    process is gone (it cannot be checked from here)."""
    pid, host = _holder(text)
    uncheckable = fcntl is None and host not in (None, _HOST)
    return RunLockedError(directory, pid, host, lock=path if uncheckable else None)


@contextlib.contextmanager
def locked(directory: Union[str, os.PathLike]):
    """Hold ``directory``'s lock (creating the directory) for the ``with`` block; re-entrant
    within a process.

    Raises:
      RunLockedError: Another process holds it.
      ValueError: The lock file is not a regular file (a link, a FIFO, ...).
      RunDirectoryLostError: On re-entry, or for a file not found in the ``with`` block,
        when the lock file this process holds is gone: the directory was removed or
        replaced meanwhile (it is not created again).
    """
    directory = Path(directory)
    key = str(directory.resolve())
    if key not in _held:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        if fcntl is not None:
            fd = _flock(directory, path)
            release = functools.partial(_unflock, path, fd)
            intact = functools.partial(_same_file, path, fd)
        else:
            text = _create_lock(directory, path)
            release = functools.partial(_remove_lock, path, text)
            intact = functools.partial(_holds_lock_file, path, text)
        _held[key] = [release, intact, 0]
    elif not _held[key][1]():
        raise RunDirectoryLostError(directory)
    _held[key][2] += 1
    try:
        yield directory
    except FileNotFoundError:   # a write into the directory, removed meanwhile
        if not _held[key][1]():
            raise RunDirectoryLostError(directory) from None
        raise
    finally:
        _held[key][2] -= 1
        if not _held[key][2]:
            _held.pop(key)[0]()


def check(directory: Union[str, os.PathLike], *, resume: bool, overwrite: bool) -> Path:
    """Check, without changing anything, that a run may be written to ``directory``.

    Raises:
      ValueError: ``resume`` and ``overwrite`` together, ``directory`` is an empty path, a
        dangling link or not a directory, its lock file is not a regular file, or
        (``resume``) run files in it are links.
      NothingToResumeError: ``resume`` without a :data:`LAST_CHECKPOINT` in ``directory``
        (a ``FileNotFoundError``).
      RunExistsError: ``directory`` holds a run and neither ``resume`` nor ``overwrite`` is
        set (a ``FileExistsError``).
      RunLockedError: Another process is writing a run in ``directory``.
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
    holder = _other_holder(directory)
    if holder is not None:
        raise _locked_error(directory, directory / LOCK_NAME, holder)
    if resume:
        if not (directory / LAST_CHECKPOINT).is_file():
            raise NothingToResumeError(f'nothing to resume: {directory} has no '
                                       f'{LAST_CHECKPOINT}.')
        links = [name for name in RUN_FILES if (directory / name).is_symlink()]
        if links:
            raise ValueError(f'{directory} holds symbolic links among its run files '
                             f'({", ".join(links)}); run files are never written through '
                             f'links: replace them by the files or directories themselves.')
    elif not overwrite:
        found = run_files(directory)
        if found:
            raise RunExistsError(f'{directory} already holds a run ({", ".join(found)}); '
                                 f'pass resume=True to continue it or overwrite=True to '
                                 f'replace it.')
    return directory


def create(directory: Union[str, os.PathLike]) -> Path:
    """Create ``directory`` and check that it is writable (``OSError`` otherwise); clear
    what killed runs left there: temporary files of run files and staging directories
    are removed; the files of a replaced run (:data:`TRASH_PREFIX`) are deleted where the
    run that replaced them has its last checkpoint in ``directory``, else (a run killed
    while :func:`commit` moved the files) moved back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
        pass
    for stale in _stale_temporaries(directory):
        if stale.name.startswith(TRASH_PREFIX) and \
                not os.path.lexists(directory / LAST_CHECKPOINT):
            _move(run_files(stale), stale, directory, f'cannot restore the run in {directory}')
        _remove(stale)
    return directory


def stage(directory: Union[str, os.PathLike]) -> Path:
    """A fresh hidden directory in the run directory ``directory`` (:data:`STAGING_PREFIX`)
    for a new run to write in until its first checkpoint (:func:`commit`)."""
    return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))


def commit(directory: Union[str, os.PathLike], staging: Union[str, os.PathLike]) -> None:
    """Make the run written in ``staging`` (:func:`stage`, holding at least its last
    checkpoint) the run of ``directory``, replacing the run there all or nothing: its
    files are renamed into a fresh hidden directory (:data:`TRASH_PREFIX`), the staged
    files renamed into ``directory`` (the last checkpoint first), then the old files and
    ``staging`` deleted. A rename that fails moves back what was moved and raises
    ``OSError`` naming the file; the run in ``directory`` is then unchanged. A run killed
    meanwhile is completed or undone by the next :func:`create`."""
    directory, staging = Path(directory), Path(staging)
    old = run_files(directory)
    trash = Path(tempfile.mkdtemp(prefix=TRASH_PREFIX, dir=directory)) if old else None
    try:
        if old:
            _move(old, directory, trash, f'cannot replace the run in {directory}')
        try:
            _move(run_files(staging), staging, directory,
                  f'cannot move the new run into {directory}')
        except OSError:
            if old:
                _move(old, trash, directory, f'cannot restore the run in {directory}')
            raise
    except OSError:
        if trash is not None and not os.listdir(trash):
            trash.rmdir()
        raise
    fsync_dir(directory)
    _remove(staging)
    if trash is None:
        return
    try:
        shutil.rmtree(trash)
    except OSError as err:      # the run is replaced; only its old files remain, hidden
        warnings.warn(f'the files of the run replaced in {directory} could not all be '
                      f'deleted ({err}); they are in {trash}, removed when a run is next '
                      f'written there', RuntimeWarning, stacklevel=2)


def _remove(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a directory tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _move(names: list, source: Path, target: Path, failure: str) -> None:
    """Rename the entries ``names`` of ``source`` into ``target`` (links as links), all or
    nothing: if a rename fails, those already renamed are moved back and ``OSError`` says
    ``failure`` and names the file."""
    moved = []
    for name in names:
        try:
            os.rename(source / name, target / name)
        except OSError as err:
            stuck = []
            for done in reversed(moved):
                try:
                    os.rename(target / done, source / done)
                except OSError:
                    stuck.append(done)
            outcome = (f'{", ".join(stuck)} could not be moved back from {target}' if stuck
                       else 'nothing was moved')
            raise type(err)(err.errno, f'{failure}: {source / name} cannot be moved '
                                       f'({err.strerror}); {outcome}') from None
        moved.append(name)


def _stale_temporaries(directory: Path) -> list:
    """What killed writes and runs left: temporary files of run files
    (``.<name>.<random>.tmp``), staging directories (:data:`STAGING_PREFIX`) and the
    files of replaced runs (:data:`TRASH_PREFIX`)."""
    return ([p for name in RUN_FILES for p in directory.glob(f'.{name}.*.tmp')]
            + sorted(directory.glob(f'{STAGING_PREFIX}*'))
            + sorted(directory.glob(f'{TRASH_PREFIX}*')))


def lagging(directory: Union[str, os.PathLike], epoch: int, best: Optional[dict],
            summary: tuple = ()) -> list:
    """:func:`lagging_files` of the run of :meth:`Trainer.fit
    <braintrace_conv.training.Trainer.fit>` in ``directory`` whose last checkpoint completed
    ``epoch`` epochs (``best``: its best-epoch entry); ``metrics.json`` tells its epoch by
    ``epochs_completed``."""
    last_is_best = best is not None and best.get('epoch') == epoch
    return lagging_files(directory, dict(epochs_completed=epoch) if epoch else {},
                         curve=bool(epoch), summary=summary,
                         best_of=(lambda meta: meta.get('epoch') == epoch) if last_is_best
                         else None)


def lagging_files(directory: Union[str, os.PathLike], logged: dict, *, curve: bool,
                  best_of: Optional[Callable[[dict], bool]] = None,
                  summary: tuple = ()) -> list:
    """Names of the files of the run in ``directory`` that lag behind its last checkpoint,
    as a run killed during the writes that follow that checkpoint leaves them: the best
    checkpoint (``best_of``, when the last checkpoint is the best one: whether a
    checkpoint's metadata are of the last checkpoint's state), ``metrics.json`` (without
    the entries ``logged`` of the last checkpoint, e.g. ``{'epochs_completed': 3}``, or
    without the keys ``summary`` that the caller writes when the run is finished), the
    learning curve (``curve``: the run draws one) and temporary files.
    ``metrics.json`` is the last file written after each checkpoint, so one of the last
    checkpoint tells that the curve is of it too."""
    from .checkpoint import CheckpointError, read

    directory = Path(directory)
    found = []
    if best_of is not None:
        try:
            best_meta = read(directory / BEST_CHECKPOINT)[1]
        except (OSError, CheckpointError):
            best_meta = None
        if best_meta is None or not best_of(best_meta):
            found.append(BEST_CHECKPOINT)
    try:
        metrics = json.loads((directory / METRICS_NAME).read_bytes())
    except (OSError, ValueError):
        metrics = None
    metrics = metrics if isinstance(metrics, dict) else {}
    if logged and (any(metrics.get(key) != value for key, value in logged.items())
                   or not set(summary) <= set(metrics)):
        found.append(METRICS_NAME)
    if curve and not (directory / CURVE_NAME).is_file():
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
