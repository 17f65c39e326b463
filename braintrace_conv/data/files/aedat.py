"""AEDAT 4 (iniVation DV) event files, read through ``faery``: the header checked, the
first event track's size and event count, and its packets."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from .common import (CAMERA_EVENT_DTYPE, EventFileError, Layout, fail, import_faery, one_line,
                     relay)

def _aedat4_blocks(path: Path) -> Iterator[np.ndarray]:
    faery = import_faery(path, "AEDAT4")
    decoder = faery.file_decoder.Decoder(path, file_type="aedat")
    for packet in decoder:
        events = np.empty(len(packet), CAMERA_EVENT_DTYPE)
        events["t"], events["x"], events["y"] = packet["t"], packet["x"], packet["y"]
        events["p"] = packet["p"]
        yield events



def open_aedat4(path: Path) -> Layout:
    """The layout of an AEDAT4 file: its first event track's size and event count, and
    its packets decoded by faery."""
    faery = import_faery(path, "AEDAT4")
    _check_aedat4_header(path)
    try:
        with faery.file_decoder.aedat.Decoder(path) as decoder:
            tracks = [t for t in decoder.tracks() if t.data_type == "events"]
            if not tracks:
                fail(path, "holds no event track (AEDAT4 tracks: "
                            f"{[t.data_type for t in decoder.tracks()]})")
            counts = [d.elements_count for d in decoder.file_data_definitions()
                      if d.track_id == tracks[0].id]
    except EventFileError:
        raise
    except BaseException as err:   # faery raises plain exceptions for damaged files
        relay(path, err, "is not a readable AEDAT4 file")
    # a recording stopped before its index was written is read without a count
    return Layout("aedat4", CAMERA_EVENT_DTYPE, tuple(tracks[0].dimensions),
                  sum(counts) if counts else None, decode=lambda block: _aedat4_blocks(path))


_AEDAT4_MAGIC = b"#!AER-DAT4.0\r\n"


def _check_aedat4_header(path: Path) -> None:
    """Check what faery 0.7 does not check safely: the header's description must be
    UTF-8 XML (faery aborts the process on bytes that are not UTF-8), and the index it
    points to must lie inside the file."""
    with open(path, "rb") as f:
        head = f.read(len(_AEDAT4_MAGIC) + 4)
        if not head.startswith(_AEDAT4_MAGIC):
            fail(path, "is not an AEDAT4 file: it does not start with "
                        f"{_AEDAT4_MAGIC.decode().strip()!r}")
        size = struct.unpack("<I", head[-4:])[0] if len(head) == len(_AEDAT4_MAGIC) + 4 \
            else 1
        header = f.read(size)
    if len(header) < size:
        fail(path, "is truncated inside its AEDAT4 header")
    try:   # the IOHeader flatbuffer: compression, dataTablePosition, infoNode
        (table,) = struct.unpack_from("<I", header, 0)
        (back,) = struct.unpack_from("<i", header, table)
        vtable_size = struct.unpack_from("<H", header, table - back)[0]
        fields = struct.unpack_from(f"<{(vtable_size - 4) // 2}H", header, table - back + 4)
        index = struct.unpack_from("<q", header, table + fields[1])[0] if \
            len(fields) > 1 and fields[1] else -1
        at = table + fields[2]
        at += struct.unpack_from("<I", header, at)[0]
        (length,) = struct.unpack_from("<I", header, at)
        description = header[at + 4:at + 4 + length]
        if len(description) < length:
            raise struct.error
    except (struct.error, IndexError):
        fail(path, "has a damaged AEDAT4 header: its fields point outside it")
    try:
        ElementTree.fromstring(description.decode("utf-8"))
    except (UnicodeDecodeError, ElementTree.ParseError) as err:
        fail(path, f"has a damaged AEDAT4 header: its description is not UTF-8 XML "
                    f"({one_line(err)})")
    if index > path.stat().st_size:
        fail(path, f"is truncated: its AEDAT4 index starts at byte {index}, beyond its "
                    f"{path.stat().st_size} bytes")


