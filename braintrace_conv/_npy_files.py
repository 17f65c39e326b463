"""Reading ``.npy`` and ``.npz`` files without trusting them.

``np.load`` allocates the array a header declares before it reads a byte of
data, inflates archive entries of any compression method it meets, and says
"pickled data" of any file it cannot parse. Here every header and archive
entry is checked first -- the format, the dtype (never Python objects), the
declared size against the bytes present and against available memory, and
the compression method -- so a truncated, crafted or foreign file is a
:class:`NpyFileError` naming the file and what is wrong with it, never a
huge allocation, a pickle or a traceback.
"""
from __future__ import annotations

import math
import os
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

__all__ = ['NpyFileError', 'read_npy', 'read_npz', 'npy_header', 'npy_entries',
           'available_memory']

# What a damaged or foreign file can raise from the zip and npy readers.
_READ_ERRORS = (ValueError, OSError, EOFError, KeyError, IndexError, TypeError, SyntaxError,
                tokenize.TokenError, zipfile.BadZipFile, zlib.error, NotImplementedError,
                UnicodeDecodeError, MemoryError, RecursionError, OverflowError)
_METHODS = {zipfile.ZIP_STORED: 'stored', zipfile.ZIP_DEFLATED: 'deflated'}


class NpyFileError(ValueError):
    """A ``.npy``/``.npz`` file that is unreadable, truncated, too large or not plain data.

    ``path`` is the file and ``problem`` what is wrong with it; the message is both.
    """

    def __init__(self, path, problem: str):
        super().__init__(f'{path}: {problem}')
        self.path, self.problem = path, problem


def available_memory():
    """Bytes of memory available to a new allocation (``None`` if unknown)."""
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (ValueError, OSError, AttributeError):
        return None


def _header(f, data_bytes: int, path, what: str = 'the array'):
    """``(shape, dtype, fortran_order)`` of the ``.npy`` stream ``f`` holding ``data_bytes``
    bytes in all, checked to declare exactly the data that follows it."""
    def fail(problem):
        raise NpyFileError(path, f'{what} {problem}')

    start = f.tell()
    try:
        version = npy_format.read_magic(f)
    except ValueError:
        fail('is not a NumPy .npy array (no .npy header: an empty, truncated or foreign file)')
    if version == (1, 0):
        shape, fortran, dtype = npy_format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = npy_format.read_array_header_2_0(f)
    else:
        fail(f'has .npy format version {version}, which is not read')
    if dtype.hasobject:
        fail(f'holds Python objects (dtype {dtype}), which are never loaded: only plain '
             f'numeric or structured arrays are read')
    if any(not isinstance(n, int) or n < 0 for n in shape):
        fail(f'declares an invalid shape {shape}')
    declared = math.prod(shape) * dtype.itemsize
    present = data_bytes - (f.tell() - start)
    if declared != present:
        fail(f'declares {math.prod(shape)} elements of {dtype} ({declared} bytes) but holds '
             f'{present} bytes of data (truncated or corrupt)')
    available = available_memory()
    if available is not None and declared > available:
        fail(f'holds {declared} bytes, more than the {available} bytes of memory available')
    return shape, dtype, fortran


def _read(f, data_bytes: int, path, what: str = 'the array') -> np.ndarray:
    shape, dtype, fortran = _header(f, data_bytes, path, what)
    array = np.empty(math.prod(shape), dtype)
    if array.nbytes and f.readinto(array.view(np.uint8)) != array.nbytes:
        raise NpyFileError(path, f'{what} is truncated')
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _npy(path, read_data: bool):
    path = Path(path)
    try:
        with open(path, 'rb') as f:
            size = os.fstat(f.fileno()).st_size
            return (_read(f, size, path, 'the file') if read_data
                    else _header(f, size, path, 'the file')[:2])
    except (NpyFileError, OSError):
        raise
    except _READ_ERRORS as err:
        raise NpyFileError(path, f'not a readable .npy array ({type(err).__name__}: '
                                 f'{err})') from None


def read_npy(path) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, its header checked before anything is
    allocated; raises :class:`NpyFileError` (naming ``path``) or ``OSError``."""
    return _npy(path, read_data=True)


def npy_header(path) -> tuple:
    """``(shape, dtype)`` of the ``.npy`` file ``path``, from its checked header only."""
    return _npy(path, read_data=False)


def npy_entries(path) -> list:
    """``(name, shape, dtype)`` of every array of the ``.npz`` archive ``path``, read from
    the entries' headers only (nothing is inflated beyond them)."""
    return [(name, *header) for name, header in _archive(path, read_data=False).items()]


def read_npz(path) -> dict:
    """``{name: array}`` of the ``.npz`` archive ``path`` (names without ``.npy``); every
    entry is checked (compression method, declared size, header) before it is inflated.
    Raises :class:`NpyFileError` naming ``path``, or ``OSError``."""
    return _archive(path, read_data=True)


def _archive(path, *, read_data: bool) -> dict:
    """Name -> array (``read_data``) or ``(shape, dtype)`` of every entry of an archive."""
    path = Path(path)
    out = {}
    try:
        if not zipfile.is_zipfile(path):
            raise NpyFileError(path, 'not a zip archive, as an .npz file is')
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                what = f'entry {info.filename!r}'
                if info.compress_type not in _METHODS:
                    raise NpyFileError(path, f'{what} uses zip compression method '
                                       f'{info.compress_type}; only stored and deflated '
                                       f'entries are read')
                if not info.filename.endswith('.npy'):
                    raise NpyFileError(path, f'{what} is not a .npy array')
                with archive.open(info) as entry:
                    out[info.filename[:-4]] = (
                        _read(entry, info.file_size, path, what) if read_data
                        else _header(entry, info.file_size, path, what)[:2])
    except (NpyFileError, FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except _READ_ERRORS as err:
        raise NpyFileError(path, f'not a readable .npz archive ({type(err).__name__}: '
                                 f'{err})') from None
    return out
