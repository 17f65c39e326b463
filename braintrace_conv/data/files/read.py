"""Reading recorded events from files: one entry point for every supported format, and a
reader that walks a recording in time order, block by block, without loading it.

Formats
-------
=============  ==============================================  ==================================
suffix         format                                          read by
=============  ==============================================  ==================================
``.npy``       one structured event array (the library's        numpy, memory-mapped
               layout, :mod:`~braintrace_conv.data.binning`)
``.npz``       the same under the key ``events`` (or as the     numpy: memory-mapped when
               only array)                                      stored, inflated block by block
                                                                when deflated
``.aedat4``    AEDAT 4.0 (iniVation DV), first event track      ``faery`` (extra ``events``)
``.aedat``     AEDAT 2.0 (jAER: DVS128, DAVIS240, DAVIS346),    the library, in NumPy (AEDAT
               3.1 (cAER, DVS Gesture) or 4.0, by the first     4.0: ``faery``)
               line
``.raw``       Prophesee EVT 2.0 / EVT 3.0 (from the header)    the library, in NumPy
``.dat``       Prophesee DAT, versions 1 and 2 (Gen1 and Gen4   the library, in NumPy
               automotive, N-CARS)
``.bin``       N-MNIST / N-Caltech101 (40-bit ATIS events)      the library, in NumPy
=============  ==============================================  ==================================

Events come back as numpy structured arrays with a timestamp ``t`` in microseconds, pixel
coordinates ``x`` (and ``y``) and a polarity ``p`` (1: ON, brightness increase; 0 or -1:
OFF). ``.npy``/``.npz`` files keep their stored dtype; the other formats give
:data:`CAMERA_EVENT_DTYPE`. AEDAT 4.0 needs an extra (``pip install
"braintrace_conv[events]"``); the guide page *Streams and camera files* gives the
measurements behind the choice of ``faery``, and why the other formats are decoded here:
faery 0.7's EVT 3.0 decoder misses counter wraps after silences, and its EVT 2.0 and DAT
decoders hide a timestamp that goes backwards. Each format's module says how its
timestamps are counted on across their counters' wraps:
:mod:`~braintrace_conv.data.files.prophesee` (EVT, DAT),
:mod:`~braintrace_conv.data.files.aedat` (AEDAT) and
:mod:`~braintrace_conv.data.files.nmnist` (``.bin``). Every decoder reads one block at a
time, vectorised, and every block is checked as it is read.

Every event that is read is checked: timestamps finite, non-negative and never going
backwards, coordinates non-negative integers inside the sensor (when the file or the caller
gives its size), polarities coded 0/1, -1/1 or bool. A bad event, a truncated or foreign file
is an :class:`EventFileError` naming the file and the event's position; nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..._npy_files import NpyFileError
from ..._validation import integer
from .aedat import open_aedat, open_aedat4
from .common import (CAMERA_EVENT_DTYPE, EventFileError, Layout, event_fields, fail,
                     raw_records, relay)
from .nmnist import open_bin
from .npy import open_npy, open_npz
from .prophesee import open_dat, open_evt

__all__ = ["CAMERA_EVENT_DTYPE", "EventFileError", "EventReader", "read_events"]

# the reader of each suffix: path -> Layout (common.py)
_OPENERS = {".npy": open_npy, ".npz": open_npz, ".aedat4": open_aedat4, ".aedat": open_aedat,
            ".raw": open_evt, ".dat": open_dat, ".bin": open_bin}
_BLOCK_EVENTS = 1 << 16


def _open(path: Path) -> Layout:
    """The layout of ``path``, from the reader of its suffix."""
    opener = _OPENERS.get(path.suffix.lower())
    if opener is None:
        fail(path, f"unknown event-file suffix {path.suffix!r}; expected one of "
                   f"{', '.join(sorted(_OPENERS))}")
    return opener(path)


# --------------------------------------------------------------------------- checks
def _copy(events: np.ndarray) -> np.ndarray:
    """A fresh copy of a contiguous event array, made as raw records."""
    return np.array(raw_records(events)).view(events.dtype)


def _joined(parts: list, dtype: np.dtype) -> np.ndarray:
    """The event arrays ``parts`` (of ``dtype``) one after the other."""
    if not parts:
        return np.zeros(0, dtype)
    return np.concatenate([raw_records(p) for p in parts]).view(dtype)


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def check_events(path, offset: int, events: np.ndarray, previous_t, extents: dict) -> None:
    """Raise :class:`EventFileError` for the first wrong event of ``events`` (event
    ``offset + i`` of ``path``). ``previous_t`` is the timestamp of the event before
    (``None`` at the start); ``extents`` maps coordinate fields to their sizes (a size
    ``None``: no upper bound known)."""
    if not len(events):
        return
    t = events["t"]
    if t.dtype.kind == "f" and not np.isfinite(t).all():
        i = _first(~np.isfinite(t))
        fail(path, f"event {offset + i} has the timestamp {t[i]}; expected a finite "
                    "number of microseconds", offset + i)
    if t.dtype.kind != "u" and (t < 0).any():
        i = _first(t < 0)
        fail(path, f"event {offset + i} has the negative timestamp {t[i]} us; timestamps "
                    "count microseconds from the start of the recording", offset + i)
    # compare, never subtract: unsigned timestamps would wrap around
    earlier = np.concatenate(([previous_t is not None and t[0] < previous_t], t[1:] < t[:-1]))
    if earlier.any():
        i = _first(earlier)
        before = t[i - 1] if i else previous_t
        fail(path, f"event {offset + i} has the timestamp {t[i]} us, earlier than event "
                    f"{offset + i - 1}'s {before} us; events must be in time order",
              offset + i)
    for name, size in extents.items():
        values = events[name]
        bad = values < 0 if values.dtype.kind != "u" else np.zeros(len(values), bool)
        if size is not None:
            bad |= values >= size
        if values.dtype.kind == "f":
            bad |= values != np.round(values)
        if bad.any():
            i = _first(bad)
            bound = f"[0, {size})" if size is not None else "non-negative"
            fail(path, f"event {offset + i} has {name} = {values[i]}; expected an integer "
                        f"pixel coordinate in {bound}", offset + i)
    p = events["p"]
    bad = ~((p == 0) | (p == 1) | (p == -1))
    if bad.any():
        i = _first(bad)
        fail(path, f"event {offset + i} has the polarity p = {p[i]}; expected 1 (ON) or "
                    "0 / -1 (OFF)", offset + i)


class EventReader:
    """One recording, read in time order block by block, never whole.

    ``.npy`` files and stored ``.npz`` entries are memory-mapped, so :meth:`blocks`
    starts at any event and :meth:`seek_time` bisects the timestamps, both without reading
    what lies before. Deflated ``.npz`` entries and camera files are decoded from their
    start: reaching event ``n`` costs decoding ``n`` events (memory stays at one block).
    Every event read is checked (module docstring).

    Args:
      path: An event file (module docstring for the formats).
      sensor_size: ``(W, H, P)`` (or ``(X, P)`` for events without ``y``) in tonic's
        order, to check coordinates against; a camera file's header gives ``W`` and
        ``H`` itself and must agree.
      block_events: Events per block of :meth:`blocks` (camera files: at most this many;
        their packets may be smaller).

    Attributes:
      path: The file.
      format: ``'npy'``, ``'npz'``, ``'aedat2'``, ``'aedat3'`` (3.1), ``'aedat4'``,
        ``'evt2'``, ``'evt3'``, ``'dat'`` or ``'nmnist'`` (``.bin``).
      dtype: The dtype of the events read (stored, or :data:`CAMERA_EVENT_DTYPE`).
      sensor_size: ``(W, H)`` (or ``(X,)``) from the header or ``sensor_size``; ``None``
        when neither gives it.
      num_events: Number of events when the file says so without being decoded
        (``.npy``, ``.npz``, DAT, AEDAT 4.0 with its index), else ``None``.

    Raises:
      EventFileError: an unknown suffix, a foreign, truncated or damaged file, or a file
        whose size disagrees with ``sensor_size``.
      ImportError: an AEDAT4 file without the ``faery`` package.
    """

    def __init__(self, path, *, sensor_size: tuple | None = None,
                 block_events: int = _BLOCK_EVENTS):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"event file {str(self.path)!r} does not exist")
        self._block = integer("block_events", block_events, sign="positive")
        try:
            layout = _open(self.path)
        except NpyFileError as err:
            raise EventFileError(self.path, err.problem) from None
        self.format, self.num_events, self._array = layout.format, layout.num_events, layout.array
        self._decode = layout.decode
        self.dtype = layout.dtype
        self._coordinates = event_fields(self.path, layout.dtype)
        self.sensor_size = self._sensor(layout.sensor, sensor_size)

    def _sensor(self, from_file, given) -> tuple | None:
        if given is None:
            return from_file
        given = tuple(int(s) for s in given)[: len(self._coordinates)]
        if len(given) != len(self._coordinates):
            raise ValueError(f"sensor_size {given!r} does not fit the coordinates "
                             f"{self._coordinates} of {self.path}")
        if from_file is not None and tuple(from_file) != given:
            fail(self.path, f"is a {from_file[0]} x {from_file[1]} recording, but "
                             f"sensor_size gives {given[0]} x {given[1]}")
        return given

    def __repr__(self) -> str:
        return (f"EventReader({str(self.path)!r}, format={self.format!r}, "
                f"sensor_size={self.sensor_size}, num_events={self.num_events})")

    @property
    def seekable(self) -> bool:
        """Whether the file is memory-mapped: any event is reached without decoding those
        before it."""
        return self._array is not None

    def _extents(self) -> dict:
        sizes = self.sensor_size or (None,) * len(self._coordinates)
        return dict(zip(self._coordinates, sizes))

    def blocks(self, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """``(offset, events)`` from event ``start`` to the end of the file, in order;
        ``offset`` is the index of the block's first event. Blocks are fresh arrays
        (never views of the file), checked before they are yielded."""
        return self._checked(integer("start", start, sign="non-negative"), fresh=True)

    def check(self) -> tuple | None:
        """Check every event of the file, as :meth:`blocks` does, and return its ``(first,
        last)`` timestamps in microseconds (``None`` when it holds no events).

        The check to make on every input before a long run writes anything: a wrong
        event, a damaged or truncated file is then one :class:`EventFileError` before the
        run starts rather than in its middle. Memory-mapped files are checked in place,
        at the speed of reading them; others are decoded whole (memory: one block).
        """
        first = last = None
        for _, events in self._checked(0, fresh=False):
            if len(events):
                first = events["t"][0] if first is None else first
                last = events["t"][-1]
        return None if first is None else (first, last)

    def _checked(self, start: int, fresh: bool) -> Iterator[tuple[int, np.ndarray]]:
        """The blocks of :meth:`blocks`, checked; ``fresh=False`` yields views of a
        memory-mapped file instead of copies."""
        extents, previous = self._extents(), None
        if self._array is not None:
            if start:
                previous = self._array["t"][start - 1] if start <= len(self._array) else None
            for offset in range(start, len(self._array), self._block):
                events = self._array[offset:offset + self._block]
                events = _copy(events) if fresh else events
                check_events(self.path, offset, events, previous, extents)
                previous = events["t"][-1]
                yield offset, events
            return
        offset = 0
        try:
            for events in self._decode(self._block):
                for cut in range(0, len(events), self._block):
                    part = events[cut:cut + self._block]
                    check_events(self.path, offset, part, previous, extents)
                    previous = part["t"][-1] if len(part) else previous
                    if offset + len(part) > start:
                        yield max(offset, start), _copy(part[max(start - offset, 0):])
                    offset += len(part)
        except (EventFileError, ImportError):
            raise
        except BaseException as err:   # faery and zlib raise plain exceptions for damaged data
            relay(self.path, err, f"cannot be decoded after event {offset}, the file is "
                                   "damaged or truncated", offset)

    def time_range(self) -> tuple | None:
        """``(first, last)`` timestamps of the file, microseconds; ``None`` when it holds no
        events. Memory-mapped files read two events; others are decoded and checked to
        the end (:meth:`check`)."""
        if self._array is not None:
            return (self._array[0]["t"], self._array[-1]["t"]) if len(self._array) else None
        return self.check()

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Events ``start`` to ``stop - 1`` (to the end when ``stop`` is ``None``), checked."""
        parts = []
        for offset, events in self.blocks(start):
            if stop is not None and offset >= stop:
                break
            parts.append(events if stop is None else events[: max(stop - offset, 0)])
        return _joined(parts, self.dtype)

    def seek_time(self, t_us: float) -> int:
        """Index of the first event at or after ``t_us`` microseconds (the number of
        events when there is none). Memory-mapped files bisect; others decode up to it."""
        if self._array is not None:
            low, high = 0, len(self._array)
            while low < high:          # bisect on single elements: no copy of the column
                middle = (low + high) // 2
                if self._array[middle]["t"] < t_us:
                    low = middle + 1
                else:
                    high = middle
            return low
        end = 0
        for offset, events in self.blocks():
            inside = int(np.searchsorted(events["t"], t_us, side="left"))
            if inside < len(events):
                return offset + inside
            end = offset + len(events)
        return end

    def read_time(self, t_start_us: float, t_stop_us: float) -> np.ndarray:
        """Events with ``t_start_us <= t < t_stop_us``, checked."""
        start = self.seek_time(t_start_us)
        parts = []
        for _, events in self.blocks(start):
            inside = int(np.searchsorted(events["t"], t_stop_us, side="left"))
            parts.append(events[:inside])
            if inside < len(events):
                break
        return _joined(parts, self.dtype)


def read_events(path, *, sensor_size: tuple | None = None) -> np.ndarray:
    """Every event of an event file, checked, as one structured array.

    ``.npy`` files and stored ``.npz`` entries come back as read-only memory maps (the
    file is checked block by block, never held in memory at once); deflated ``.npz``
    entries and camera files are decoded into one array. For recordings longer than
    memory, walk them with :class:`EventReader` instead, or stream them with
    :class:`~braintrace_conv.data.EventStream`.

    Args:
      path: An event file of a format of the module docstring (``.npy``, ``.npz``,
        ``.aedat``, ``.aedat4``, ``.raw``, ``.dat``, ``.bin``).
      sensor_size: ``(W, H, P)`` in tonic's order, to check coordinates against (camera
        files carry their own and must agree).

    Returns:
      Structured array ``(E,)`` with ``t`` (microseconds, non-decreasing), ``x``, ``y``
      (for 2-D sensors) and ``p``: the stored dtype for ``.npy``/``.npz`` (as
      :func:`~braintrace_conv.data.load_event_file` returns it), else
      :data:`CAMERA_EVENT_DTYPE`.

    Raises:
      EventFileError: the file is foreign, truncated or damaged, or an event is wrong
        (negative or decreasing timestamp, coordinate outside the sensor, polarity not
        0/1/-1): one sentence naming the file and the event's index.
      ImportError: an AEDAT4 file without the ``faery`` package.

    Examples:
      >>> import tempfile, numpy as np
      >>> from braintrace_conv.data import CAMERA_EVENT_DTYPE, read_events, write_events
      >>> events = np.zeros(3, CAMERA_EVENT_DTYPE)              # fields t (us), x, y, p
      >>> events['t'], events['x'], events['y'], events['p'] = [0, 40, 90], [1, 2, 3], 0, 1
      >>> path = write_events(tempfile.mkdtemp() + '/recording.npy', events)
      >>> read = read_events(path, sensor_size=(4, 4, 2))        # checked against the sensor
      >>> read['t'].tolist(), read['x'].tolist()
      ([0, 40, 90], [1, 2, 3])
    """
    reader = EventReader(path, sensor_size=sensor_size)
    if reader.seekable:
        reader.check()
        return reader._array
    if reader.num_events is None:
        return reader.read()
    events = np.empty(reader.num_events, reader.dtype)
    filled = 0
    for offset, block in reader.blocks():
        if offset + len(block) > len(events):
            fail(reader.path, f"holds more events than the {len(events)} its index "
                               "declares (a damaged file?)", offset)
        raw_records(events)[offset:offset + len(block)] = raw_records(block)
        filled = offset + len(block)
    if filled != len(events):
        fail(reader.path, f"holds {filled} events, fewer than the {len(events)} its index "
                           "declares (a truncated file?)", filled)
    return events
