"""Writing recorded events to files that :func:`~braintrace_conv.data.read_events` reads back
event for event: the library's ``.npy`` layout, and AEDAT4 and Prophesee EVT 2.0 / 3.0
through ``faery`` (extra ``events``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import import_faery
from .read import check_events

__all__ = ["write_events"]

_CAMERA_FORMATS = {"aedat4": ".aedat4", "evt2": ".raw", "evt3": ".raw"}
_BLOCK_EVENTS = 1 << 16


def _format(path: Path, format: str | None) -> str:
    suffix = path.suffix.lower()
    if format is None:
        format = {".npy": "npy", ".aedat4": "aedat4"}.get(suffix)
        if format is None:
            raise ValueError(f"cannot tell the format of {path} from its suffix; give "
                             "format='npy', 'aedat4', 'evt2' or 'evt3' (.raw is EVT)")
    expected = {"npy": ".npy", **_CAMERA_FORMATS}.get(format)
    if expected is None:
        raise ValueError(f"format must be 'npy', 'aedat4', 'evt2' or 'evt3', got {format!r}")
    if suffix != expected:
        raise ValueError(f"{format} files are named *{expected}, got {path}")
    return format


def write_events(path, events: np.ndarray, *, sensor_size: tuple | None = None,
                 format: str | None = None) -> Path:
    """Write a structured event array to ``path``.

    Args:
      path: ``*.npy`` (the library's layout: the array as it is), ``*.aedat4``, or
        ``*.raw`` with ``format='evt2'`` or ``'evt3'``.
      events: ``(E,)`` with fields ``t`` (microseconds, non-decreasing, non-negative),
        ``x``, ``y`` and ``p`` (1 ON; 0, -1 or False OFF), as :func:`read_events` returns.
      sensor_size: ``(W, H)`` or ``(W, H, P)``; required for camera files (their header
        stores ``W`` and ``H``).
      format: ``'npy'``, ``'aedat4'``, ``'evt2'`` or ``'evt3'``; default from the suffix.

    Returns:
      ``path``. Camera files are written whole or not at all (through a temporary name).

    Raises:
      EventFileError: an event that is wrong (named by its index, as when reading).
      ImportError: a camera format without the ``faery`` package.
    """
    path = Path(path)
    format = _format(path, format)
    events = np.asarray(events)
    if format == "npy":
        if events.dtype.names is None or not {"t", "x", "p"} <= set(events.dtype.names):
            raise ValueError(f"events for {path} must be a structured array with fields t, "
                             f"x[, y], p, got dtype {events.dtype}")
        check_events(path, 0, events, None, {})
        np.save(path, events)
        return path
    if sensor_size is None or len(sensor_size) not in (2, 3):
        raise ValueError(f"writing {path} needs sensor_size=(W, H) or (W, H, P), got "
                         f"{sensor_size!r}")
    width, height = int(sensor_size[0]), int(sensor_size[1])
    check_events(path, 0, events, None, {"x": width, "y": height})
    faery = import_faery(path, format.upper())
    blocks = (_faery_events(faery, events[i:i + _BLOCK_EVENTS])
              for i in range(0, len(events), _BLOCK_EVENTS))
    version = None if format == "aedat4" else format
    faery.file_encoder.events_to_file(blocks, path, dimensions=(width, height),
                                      version=version, zero_t0=False)
    return path


def _faery_events(faery, events: np.ndarray) -> np.ndarray:
    out = np.zeros(len(events), faery.EVENTS_DTYPE)
    out["t"], out["x"], out["y"] = events["t"], events["x"], events["y"]
    out["on"] = events["p"] > 0
    return out

