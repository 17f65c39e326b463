r"""N-MNIST and N-Caltech101 recordings (``.bin``): 40-bit ATIS events decoded block by
block with NumPy.

The files have no header: every event is 5 bytes, ``x`` (8 bits), ``y`` (8 bits), then
the polarity (1 bit, 1 for ON) and a timestamp of 23 bits in microseconds, most
significant byte first (the layout of the datasets' authors' readers, and of
``tonic.io.read_mnist_file``). An event with ``y = 240``, outside the ATIS sensor's 240
rows, is no pixel: it marks an overflow of the timestamp counter, and 8192 µs
(:math:`2^{13}`) are added to the timestamps after it, as those readers add them. A
recording only needs one after :math:`2^{23}` µs (8.4 s); N-MNIST's and N-Caltech101's
last about 0.3 s. Should a file's timestamps still go back in time after a marker, the
reader's checks refuse it rather than guess another rule.

The files do not say the sensor's size: N-MNIST's digits are 34 x 34 pixels, and
N-Caltech101's images differ in size, within the ATIS sensor's 304 x 240 (give
``sensor_size`` to check the coordinates against it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .common import CAMERA_EVENT_DTYPE, Layout, fail, record_blocks

__all__ = ["EVENT_BYTES", "decode"]

#: Bytes per event.
EVENT_BYTES = 5
_OVERFLOW_ROW = 240
_OVERFLOW_US = 1 << 13


def decode(path, *, dtype: np.dtype = CAMERA_EVENT_DTYPE,
           block_events: int = 1 << 16) -> Iterator[np.ndarray]:
    """The pixel events of a ``.bin`` file, in file order, ``block_events`` records at a
    time (memory: one block; the overflows seen are carried across blocks).

    Args:
      path: The ``.bin`` file.
      dtype: Structured dtype of the events yielded, with fields ``t`` (int64:
        microseconds), ``x``, ``y`` and ``p`` (1 ON, 0 OFF).
      block_events: Records read at a time (overflow markers included).

    Raises:
      EventFileError: a last event cut short (named by its byte).
    """
    overflows = 0
    for _, data in record_blocks(path, 0, EVENT_BYTES, block_events, "event"):
        raw = np.frombuffer(data, np.uint8).reshape(-1, EVENT_BYTES)
        marker = raw[:, 1] == _OVERFLOW_ROW
        before = np.cumsum(marker) + overflows
        overflows = int(before[-1])
        keep = ~marker
        pixels = raw[keep]
        events = np.empty(len(pixels), dtype)
        events["x"], events["y"], events["p"] = pixels[:, 0], pixels[:, 1], pixels[:, 2] >> 7
        t = (pixels[:, 2].astype(np.int64) & 0x7F) << 16
        t |= pixels[:, 3].astype(np.int64) << 8
        t |= pixels[:, 4]
        events["t"] = t + before[keep] * _OVERFLOW_US
        yield events


def open_bin(path) -> Layout:
    """The layout of an N-MNIST / N-Caltech101 ``.bin`` file: its records decoded by
    :func:`decode`."""
    size = Path(path).stat().st_size
    if size % EVENT_BYTES:
        fail(path, f"holds {size} bytes, not a whole number of {EVENT_BYTES}-byte N-MNIST "
                   "events (a truncated file, or not N-MNIST / N-Caltech101 data?)")
    return Layout("nmnist", CAMERA_EVENT_DTYPE, None, None,
                  decode=lambda block: decode(path, block_events=block))
