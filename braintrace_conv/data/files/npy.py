"""``.npy`` and ``.npz`` event files: the array's entry in an archive, a memory map of a
stored entry, and the blocks of a deflated one."""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from ..._npy_files import npy_entries
from .common import _fail

def _npz_entry(path: Path) -> tuple[str, tuple, np.dtype]:
    """``(name, shape, dtype)`` of the event array of an ``.npz`` file."""
    entries = {name: (shape, dtype) for name, shape, dtype in npy_entries(path)}
    if "events" in entries:
        name = "events"
    elif len(entries) == 1:
        name = next(iter(entries))
    else:
        _fail(path, f"must hold an array named 'events' or exactly one array, got "
                    f"{sorted(entries)}")
    return (name, *entries[name])


def _skip_npy_header(f) -> None:
    """Move ``f`` past the ``.npy`` header at its position."""
    version = npy_format.read_magic(f)
    (npy_format.read_array_header_1_0 if version == (1, 0)
     else npy_format.read_array_header_2_0)(f)


def _stored_npz_memmap(path: Path, name: str, shape, dtype):
    """A read-only memory map of the stored (uncompressed) entry ``name``, else ``None``."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name + ".npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        name_bytes, extra_bytes = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_bytes + extra_bytes)
        _skip_npy_header(f)   # the header itself was checked by npy_entries
        offset = f.tell()
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _deflated_npz_blocks(path: Path, name: str, dtype, block: int) -> Iterator[np.ndarray]:
    with zipfile.ZipFile(path) as archive, archive.open(name + ".npy") as entry:
        _skip_npy_header(entry)
        while data := entry.read(block * dtype.itemsize):
            yield np.frombuffer(data, dtype=dtype)


