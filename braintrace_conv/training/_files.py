"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ['atomic_write', 'fsync_dir']


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path``: a temporary file in the same directory, fsync, rename."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    except OSError as err:      # e.g. the directory is gone: name the file, not the temporary
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:      # e.g. a full disk: name the file being written
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
