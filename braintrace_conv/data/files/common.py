"""What every event-file format shares: the dtype of camera events, the error that names a
file, and what opening a file found (:class:`Layout`).

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
