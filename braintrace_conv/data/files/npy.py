"""``.npy`` and ``.npz`` event files: one structured event array (the library's layout),
memory-mapped when stored as it is, inflated block by block from a deflated ``.npz``."""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from ..._npy_files import npy_entries, npy_header
from .common import Layout, event_fields, fail


def _npz_entry(path: Path) -> tuple[str, tuple, np.dtype]:
    """``(name, shape, dtype)`` of the event array of an ``.npz`` file."""
    entries = {name: (shape, dtype) for name, shape, dtype in npy_entries(path)}
    if "events" in entries:
        name = "events"
    elif len(entries) == 1:
        name = next(iter(entries))
    else:
        fail(path, f"must hold an array named 'events' or exactly one array, got "
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


def open_npy(path: Path) -> Layout:
    """The layout of a ``.npy`` event file: its array, memory-mapped."""
    shape, dtype = npy_header(path)
    _check(path, shape, dtype)
    array = np.load(path, mmap_mode="r", allow_pickle=False) if shape[0] else np.zeros(0, dtype)
    return Layout("npy", dtype, None, shape[0], array)


def open_npz(path: Path) -> Layout:
    """The layout of an ``.npz`` event file: the entry ``events`` (or its only entry),
    memory-mapped when stored, decoded block by block when deflated."""
    name, shape, dtype = _npz_entry(path)
    _check(path, shape, dtype)
    array = _stored_npz_memmap(path, name, shape, dtype) if shape[0] else np.zeros(0, dtype)
    return Layout("npz", dtype, None, shape[0], array,
                  lambda block: _deflated_npz_blocks(path, name, dtype, block))


def _check(path: Path, shape: tuple, dtype: np.dtype) -> None:
    event_fields(path, dtype)
    if len(shape) != 1:
        fail(path, f"holds an event array of shape {shape}; expected one dimension")
