"""What every event-file format shares: the dtype of camera events, the error that names a
file, and what opening a file found."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import prophesee

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


def _fail(path, problem: str, position: int | None = None):
    raise EventFileError(path, problem, position)


def _faery(path: Path, kind: str):
    try:
        import faery
    except ImportError:
        raise ImportError(
            f"reading {path} ({kind}) needs the faery package: pip install "
            "'braintrace_conv[events]' (or pip install faery)") from None
    return faery



@dataclasses.dataclass(frozen=True)
class _Layout:
    """What opening a file found: format, sensor extents, event count, the memory map
    of an array file that can be mapped (``None`` for sequential formats), and the
    header of an EVT file."""

    kind: str
    dtype: np.dtype
    coordinates: tuple
    sensor: tuple | None
    num_events: int | None
    array: np.ndarray | None
    evt_header: prophesee.Header | None = None


def _one_line(err: BaseException) -> str:
    """An error raised inside another package as one line of plain ASCII: line breaks and
    runs of spaces collapsed, other characters escaped, at most 200 characters."""
    text = " ".join(str(err).split()).encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= 200 else text[:197] + "..."


def _relay(path: Path, err: BaseException, problem: str, position: int | None = None):
    """Raise an error from another package as one :class:`EventFileError` sentence; let
    interrupts and exits through (faery's Rust panics are BaseExceptions)."""
    if not isinstance(err, Exception) and type(err).__name__ != "PanicException":
        raise err
    _fail(path, f"{problem} ({type(err).__name__}: {_one_line(err)})", position)


