"""What every event-file format shares: the dtype of camera events, the error that names a
file, what opening a file found (:class:`Layout`), and the pieces several formats are made of:
a text header, fixed-size records, a counter that wraps.

A format module opens a file with one function, ``path -> Layout``, that checks its header
and says how its events are read: a memory map of the events themselves, or a decoder that
yields them in file order, one block at a time. :mod:`~braintrace_conv.data.files.read`
picks the module by suffix and checks every event the decoder yields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

#: dtype of the events read from camera files: ``t`` microseconds, ``x`` column, ``y`` row
#: (0 at the top), ``p`` 1 for ON and 0 for OFF.
CAMERA_EVENT_DTYPE = np.dtype([("t", "<i8"), ("x", "<u2"), ("y", "<u2"), ("p", "u1")])


class EventFileError(ValueError):
    """An event file that cannot be read, or an event in it that is wrong.

    ``path`` is the file, ``position`` the index of the offending event (``None`` when
    the problem is the file itself) and the message says both and what was expected.
    """

    def __init__(self, path, problem: str, position: int | None = None):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.position = Path(path), problem, position


def fail(path, problem: str, position: int | None = None):
    raise EventFileError(path, problem, position)


def import_faery(path: Path, kind: str):
    """The ``faery`` package, or an ImportError saying which file needs it."""
    try:
        import faery
    except ImportError:
        raise ImportError(
            f"reading {path} ({kind}) needs the faery package: pip install "
            "'braintrace_conv[events]' (or pip install faery)") from None
    return faery


def event_fields(path: Path, dtype: np.dtype) -> tuple[str, ...]:
    """The coordinate fields of a structured event dtype (``('x',)`` or ``('x', 'y')``),
    after checking it has ``t``, the coordinates and ``p``, all numbers."""
    names = dtype.names or ()
    coordinates = ("x", "y") if "y" in names else ("x",)
    missing = [f for f in ("t", *coordinates, "p") if f not in names]
    if dtype.names is None or missing:
        fail(path, f"holds an array of dtype {dtype}; expected a structured event array "
                   "with fields t, x[, y], p" + (f" (missing {missing})" if names else ""))
    for name in ("t", *coordinates, "p"):
        kind = dtype[name].kind
        if kind not in "biuf":
            fail(path, f"events field {name!r} has dtype {dtype[name]}; expected numbers")
    return coordinates


@dataclasses.dataclass(frozen=True)
class Layout:
    """What opening an event file found.

    Attributes:
      format: The format's name (``'npy'``, ``'evt3'``, ...; :attr:`EventReader.format`).
      dtype: dtype of the events read.
      sensor: ``(W, H)`` from the file's header, ``None`` when it gives none.
      num_events: Number of events when the file says so without being decoded, else
        ``None``.
      array: The events as a memory map, when the file stores them as they are read;
        else ``None``.
      decode: For a file without ``array``: ``decode(block_events)`` yields its events in
        file order, in arrays of about ``block_events`` (memory: one block), and raises
        :class:`EventFileError` for data that is not the format's.
    """

    format: str
    dtype: np.dtype
    sensor: tuple | None
    num_events: int | None
    array: np.ndarray | None = None
    decode: Callable[[int], Iterator[np.ndarray]] | None = None


_TEXT = frozenset(range(0x20, 0x7F)) | {0x09, 0x0D}
_HEADER_LINE_BYTES = 1 << 16


def header_lines(path, marker: bytes, end: str | None = None) -> tuple[list, int]:
    """The text header at the start of a file: the lines that start with ``marker`` and
    hold printable ASCII, up to a line reading ``end`` (after the marker, any case) or the
    first line that is not such text (a file's first data bytes may spell the marker).

    Returns ``(lines, data_offset)``: the lines with the marker and line ends stripped,
    and the byte where the data starts.
    """
    lines, offset = [], 0
    with open(path, "rb") as f:
        while True:
            line = f.readline(_HEADER_LINE_BYTES)
            if not (line.startswith(marker) and line.endswith(b"\n")
                    and _TEXT.issuperset(line[:-1])):
                break
            offset += len(line)
            text = line[len(marker):].decode("ascii").strip()
            lines.append(text)
            if end is not None and text.lower() == end.lower():
                break
    return lines, offset


def record_blocks(path, data_offset: int, record_bytes: int, count: int,
                  what: str) -> Iterator[tuple[int, bytes]]:
    """``(byte, data)``: the file from ``data_offset`` on, ``count`` records of
    ``record_bytes`` at a time (memory: one block), ``byte`` where ``data`` starts. A last
    record cut short is an :class:`EventFileError` naming its byte and ``what`` a record
    is."""
    with open(path, "rb") as f:
        f.seek(data_offset)
        byte = data_offset
        while data := f.read(count * record_bytes):
            cut = len(data) % record_bytes
            if cut:
                at = byte + len(data) - cut
                fail(path, f"its last {what}, at byte {at}, is cut short: {cut} of its "
                           f"{record_bytes} bytes are there (a truncated file?)")
            yield byte, data
            byte += len(data)


def raw_records(events: np.ndarray) -> np.ndarray:
    """A contiguous event array viewed as raw records: numpy copies structured records
    field by field, some 50 times slower than it copies their bytes."""
    return events.view(np.dtype((np.void, events.dtype.itemsize)))


def unwrap(values: np.ndarray, previous, loops: int, bits: int):
    """Counter ``values`` (int64) with the wraps before each counted in: a drop of at
    least half the range from the value before (``previous`` for the first; ``None``: no
    value before) is one wrap. Returns ``(unwrapped, changed, last value, loops)``, with
    ``changed`` marking values unlike the one before them."""
    before = np.empty_like(values)
    before[:1] = values[:1] if previous is None else previous
    before[1:] = values[:-1]
    wrapped = before - values >= 1 << (bits - 1)
    changed = values != before
    if previous is None:
        changed[:1] = True
    if not wrapped.any():                        # the common case: no wrap in the block
        return values + (loops << bits), changed, int(values[-1]), loops
    wraps = np.cumsum(wrapped, dtype=np.int32) + loops    # bool to int32: numpy's fast sum
    return (wraps.astype(np.int64) << bits) + values, changed, int(values[-1]), int(wraps[-1])


def one_line(err: BaseException) -> str:
    """An error raised inside another package as one line of plain ASCII: line breaks and
    runs of spaces collapsed, other characters escaped, at most 200 characters."""
    text = " ".join(str(err).split()).encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= 200 else text[:197] + "..."


def relay(path: Path, err: BaseException, problem: str, position: int | None = None):
    """Raise an error from another package as one :class:`EventFileError` sentence; let
    interrupts and exits through (faery's Rust panics are BaseExceptions)."""
    if not isinstance(err, Exception) and type(err).__name__ != "PanicException":
        raise err
    fail(path, f"{problem} ({type(err).__name__}: {one_line(err)})", position)
