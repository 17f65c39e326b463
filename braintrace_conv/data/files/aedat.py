r"""AEDAT files (iniVation, jAER): AEDAT 4.0 through ``faery``, AEDAT 3.1 and 2.0 decoded
block by block with NumPy. A ``.aedat`` file's first line says its version
(``#!AER-DAT2.0``, ``#!AER-DAT3.1`` or ``#!AER-DAT4.0``); ``.aedat4`` files are AEDAT 4.0.

AEDAT 4.0
---------
The DV software's files: flatbuffer packets, LZ4- or Zstd-compressed, read by ``faery``
(extra ``events``); the first event track is read, and the header is checked first for
what ``faery`` 0.7 does not check safely.

AEDAT 3.1
---------
cAER's files, DVS Gesture's among them. ``#`` header lines up to ``#!END-HEADER``, then
packets: a 28-byte little-endian header (event type, source, event size, timestamp offset,
timestamp overflow, capacity, number, valid count) and ``number`` events of ``size``
bytes. Polarity packets (type 1) hold 8-byte events, a 32-bit word and a 32-bit timestamp
in microseconds; the word's bit 0 marks a valid event, bit 1 is the polarity (1 ON), bits
2-16 ``y`` and bits 17-31 ``x``, ``y`` 0 at the top. An event's timestamp is its 31 bits
plus the packet's overflow count times :math:`2^{31}`: the file says how many times the
counter wrapped, so no rule is needed and no silence is too long. Other packets (special
events, frames, IMU samples) and invalid events are skipped. A ``#Source`` line naming a
DVS128, DAVIS240 or DAVIS346 gives the sensor's size.

AEDAT 2.0
---------
jAER's files. ``#`` header lines, then big-endian 8-byte records: a 32-bit address and a
32-bit timestamp in microseconds. What the address holds depends on the camera, which the
``# AEChip:`` line names (jAER's chip class):

* DVS128 (``DVS128``, ``Tmpdiff128``; 128 x 128): bit 0 the polarity (0 ON), bits 1-7
  the column, bits 8-14 the row; bit 15 or 31 set marks a special event (external input,
  sync), skipped;
* DAVIS240 (240 x 180) and DAVIS346 (346 x 260): bit 11 the polarity (1 ON), bits 12-21
  the column, bits 22-30 the row; bit 31 set marks an APS or IMU sample, bit 10 an
  external input event, both skipped.

jAER counts both addresses from the sensor's other corner: ``x`` is the width less 1 less
the column, and ``y`` (0 at the top) the height less 1 less the row, as jAER shows them
(it draws ``y`` upwards) and as ``tonic``'s DAVIS346 reader reads them. A file naming
another chip, or none, is refused: its addresses could mean anything.

The 32-bit timestamps wrap every :math:`2^{32}` µs (71.6 min). The file does not count
the wraps; the rule is that of the EVT and DAT readers: a timestamp lower than the one
before by at least :math:`2^{31}` µs is one wrap, a smaller drop is time going backwards
(a timestamp reset in jAER), refused by the reader's checks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from .common import (CAMERA_EVENT_DTYPE, EventFileError, Layout, fail, header_lines,
                     import_faery, one_line, record_blocks, relay, unwrap)

__all__ = ["SENSOR_SIZES"]

#: ``(W, H)`` of the cameras AEDAT 2.0 and 3.1 files name (by the start of the name, any
#: case): the size of AEDAT 2.0's addresses, and of AEDAT 3.1's sensor.
SENSOR_SIZES = {"dvs128": (128, 128), "tmpdiff128": (128, 128), "davis240": (240, 180),
                "davis346": (346, 260)}


# --------------------------------------------------------------------------- AEDAT 4.0
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


# --------------------------------------------------------------------------- .aedat
def open_aedat(path: Path) -> Layout:
    """The layout of a ``.aedat`` file, by the version its first line names."""
    with open(path, "rb") as f:
        first = f.readline(64).rstrip(b"\r\n")
    openers = {b"#!AER-DAT2.0": _open_aedat2, b"#!AER-DAT3.1": _open_aedat3,
               b"#!AER-DAT4.0": open_aedat4}
    if first not in openers:
        shown = first[:32].decode("ascii", "backslashreplace")
        fail(path, f"is not an AEDAT 2.0, 3.1 or 4.0 file: its first line is {shown!r}, "
                   "expected '#!AER-DAT2.0', '#!AER-DAT3.1' or '#!AER-DAT4.0'")
    return openers[first](path)


def _sensor(name: str) -> tuple | None:
    name = name.lower()
    return next((size for chip, size in SENSOR_SIZES.items() if name.startswith(chip)), None)


def _flipped(path, byte: int, raw: np.ndarray, at: np.ndarray, size: int, axis: str,
             chip: str) -> np.ndarray:
    """``size - 1 - raw[at]`` (jAER's addresses count from the sensor's other corner), for
    the records ``at`` of a block that starts at ``byte``."""
    raw = raw[at]
    if raw.max(initial=0) >= size:
        i = int(np.argmax(raw >= size))
        fail(path, f"byte {byte + 8 * int(at[i])} holds an event at {axis} address "
                   f"{int(raw[i])}, beyond the {chip}'s {size} (a damaged file, or another "
                   "camera's)")
    return size - 1 - raw


# --------------------------------------------------------------------------- AEDAT 2.0
def _dvs128_addresses(address: np.ndarray):
    """``(pixel, column, row, polarity)`` of DVS128 addresses."""
    pixel = address & 0x80008000 == 0
    return pixel, (address >> 1) & 0x7F, (address >> 8) & 0x7F, 1 - (address & 1)


def _davis_addresses(address: np.ndarray):
    """``(pixel, column, row, polarity)`` of DAVIS240 / DAVIS346 addresses."""
    pixel = address & 0x80000400 == 0
    return pixel, (address >> 12) & 0x3FF, (address >> 22) & 0x1FF, (address >> 11) & 1


def _open_aedat2(path: Path) -> Layout:
    lines, data_offset = header_lines(path, b"#", end="End Of ASCII Header")
    chips = [value.strip() for key, _, value in (line.partition(":") for line in lines)
             if key.strip().lower() == "aechip"]
    if not chips:
        fail(path, "is an AEDAT 2.0 file that names no camera (no '# AEChip:' header "
                   "line), so what its addresses hold is not known")
    chip = chips[0].rsplit(".", 1)[-1]
    size = _sensor(chip)
    if size is None:
        fail(path, f"is an AEDAT 2.0 file of the camera {chip!r}, whose addresses are not "
                   f"read here (known: DVS128, Tmpdiff128, DAVIS240, DAVIS346)")
    addresses = _dvs128_addresses if size == (128, 128) else _davis_addresses
    data_bytes = path.stat().st_size - data_offset
    if data_bytes % 8:
        fail(path, f"its AEDAT 2.0 events fill {data_bytes} bytes, not a whole number of "
                   "8-byte events (a truncated file?)")

    def decode(block: int) -> Iterator[np.ndarray]:
        previous, loops = None, 0
        for byte, data in record_blocks(path, data_offset, 8, block, "event"):
            words = np.frombuffer(data, ">u4")
            t, _, previous, loops = unwrap(words[1::2].astype(np.int64), previous, loops, 32)
            pixel, column, row, polarity = addresses(words[0::2])
            at = np.flatnonzero(pixel)
            events = np.empty(len(at), CAMERA_EVENT_DTYPE)
            events["t"] = t[at]
            events["x"] = _flipped(path, byte, column, at, size[0], "column", chip)
            events["y"] = _flipped(path, byte, row, at, size[1], "row", chip)
            events["p"] = polarity[at]
            yield events

    return Layout("aedat2", CAMERA_EVENT_DTYPE, size, None, decode=decode)


# --------------------------------------------------------------------------- AEDAT 3.1
_PACKET_HEADER = struct.Struct("<hhiiiiii")
_POLARITY_PACKET = 1


def _polarity_packets(path: Path, data_offset: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(overflow, words)`` of each polarity packet, in file order: its timestamp overflow
    count and its events as little-endian 32-bit words (data, timestamp, data, ...); the
    other packets are skipped, every header is checked."""
    file_bytes, byte = path.stat().st_size, data_offset
    with open(path, "rb") as f:
        f.seek(data_offset)
        while head := f.read(_PACKET_HEADER.size):
            if len(head) < _PACKET_HEADER.size:
                fail(path, f"its last packet header, at byte {byte}, is cut short: "
                           f"{len(head)} of its {_PACKET_HEADER.size} bytes are there (a "
                           "truncated file?)")
            kind, _, event_bytes, ts_at, overflow, _, number, _ = _PACKET_HEADER.unpack(head)
            if event_bytes <= 0 or number < 0 or overflow < 0:
                fail(path, f"byte {byte} holds a packet header of {number} events of "
                           f"{event_bytes} bytes (a damaged file, or not AEDAT 3.1 data)")
            length = number * event_bytes
            start, byte = byte + _PACKET_HEADER.size, byte + _PACKET_HEADER.size + length
            if byte > file_bytes:
                fail(path, f"its packet at byte {start - _PACKET_HEADER.size} is cut short: "
                           f"it declares {length} bytes of events, {file_bytes - start} are "
                           "there (a truncated file?)")
            if kind != _POLARITY_PACKET:
                f.seek(length, 1)
                continue
            if event_bytes != 8 or ts_at != 4:
                fail(path, f"byte {start - _PACKET_HEADER.size} holds a polarity packet of "
                           f"{event_bytes}-byte events with their timestamps at byte "
                           f"{ts_at}; expected 8 and 4 (a damaged file?)")
            yield overflow, np.frombuffer(f.read(length), "<u4")


def _polarity_events(overflow: int, words: np.ndarray) -> np.ndarray:
    """The valid events of one polarity packet (module docstring for the layout)."""
    data, stamps = words[0::2], words[1::2]
    at = np.flatnonzero(data & 1)
    data = data[at]
    events = np.empty(len(at), CAMERA_EVENT_DTYPE)
    events["t"] = (np.int64(overflow) << 31) + stamps[at].view(np.int32)
    events["x"] = (data >> 17) & 0x7FFF
    events["y"] = (data >> 2) & 0x7FFF
    events["p"] = (data >> 1) & 1
    return events


def _open_aedat3(path: Path) -> Layout:
    lines, data_offset = header_lines(path, b"#", end="!END-HEADER")
    if not lines or lines[-1].upper() != "!END-HEADER":
        fail(path, "is an AEDAT 3.1 file whose header has no '#!END-HEADER' line (a "
                   "truncated or damaged file?)")
    sources = [value.strip() for key, _, value in (line.partition(":") for line in lines)
               if key.strip().lower().startswith("source")]
    sensor = _sensor(sources[0]) if len(sources) == 1 else None

    def decode(block: int) -> Iterator[np.ndarray]:
        """Packets gathered into blocks of at least ``block`` events (memory: one block
        and one packet)."""
        parts, count = [], 0
        for overflow, words in _polarity_packets(path, data_offset):
            parts.append(_polarity_events(overflow, words))
            count += len(parts[-1])
            if count >= block:
                yield np.concatenate(parts)
                parts, count = [], 0
        if parts:
            yield np.concatenate(parts)

    return Layout("aedat3", CAMERA_EVENT_DTYPE, sensor, None, decode=decode)
