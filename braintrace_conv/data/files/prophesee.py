r"""Prophesee recordings: EVT 2.0 and EVT 3.0 (``.raw``) and DAT (``.dat``), their header,
and their events decoded block by block with NumPy.

A ``.raw`` file is a text header, lines starting with ``%`` (the format, e.g. ``% evt
3.0``, and the sensor's ``% geometry WxH``), followed by little-endian words whose 4 most
significant bits give their type (Prophesee's *EVT 2.0* and *EVT 3.0 Format* pages):

* **EVT 2.0**, 32-bit words. ``CD_OFF`` (0x0) and ``CD_ON`` (0x1) are one event each: the 6
  low bits of its timestamp, ``x`` and ``y`` (11 bits each). ``EVT_TIME_HIGH`` (0x8) gives
  the 28 high bits of the timestamps that follow: timestamps have 34 bits and wrap every
  :math:`2^{34}` µs (4 h 46 min).
* **EVT 3.0**, 16-bit words, each updating a state: ``EVT_ADDR_Y`` (0x0) the row,
  ``EVT_TIME_HIGH`` (0x8) and ``EVT_TIME_LOW`` (0x6) the high and low 12 bits of a 24-bit
  time base that wraps every :math:`2^{24}` µs (16.8 s), ``VECT_BASE_X`` (0x3) a column
  and polarity. ``EVT_ADDR_X`` (0x2) is one event at its column and polarity;
  ``VECT_12`` (0x4) and ``VECT_8`` (0x5) are up to 12 or 8 events at the base column
  plus each set bit of their mask, and move the base column on by 12 or 8. A
  ``TIME_HIGH`` that changes the high bits sets the low bits to 0 until the next
  ``TIME_LOW``, as Prophesee's decoder does.

Both formats' other words (external triggers, counters, IMU, continued data) carry no
pixel event and are skipped; a type neither format page nor Prophesee's decoder defines
(EVT 2.0: 0x2 to 0x7 and 0x9; EVT 3.0: 0x1 and 0x9) is an
:class:`~braintrace_conv.data.EventFileError` naming its byte.

Counter wraps
-------------
A file holds only the counter's value, so how many wraps lie between two ``TIME_HIGH``
words is a rule, not a fact. The rule here, for both formats, is Prophesee's own EVT 3.0
decoder's: a ``TIME_HIGH`` lower than the one before by at least half the counter's range
(EVT 3.0: :math:`2^{23}` µs, 8.4 s; EVT 2.0: :math:`2^{33}` µs, 2.4 h) is one wrap; a
smaller drop is time going backwards, which the decoded timestamps show and the reader's
checks refuse. Timestamps are counted on from there in 64 bits, past :math:`2^{32}` µs and
any number of wraps. A file is therefore read right when its ``TIME_HIGH`` words come less
than half a cycle apart in time, as that decoder also needs. ``faery``'s encoder (0.7)
writes them through any silence, at least every 1024 values of the high bits in EVT 3.0
(4.2 s, a quarter cycle) and every :math:`2^{20}` in EVT 2.0 (67 s). A silence of more
than half a cycle across a wrap without a ``TIME_HIGH`` word in it is refused as time
going backwards; one of more than a whole cycle cannot be seen in the file at all.

Pixel words before the first ``TIME_HIGH`` have no timestamp and are dropped, as
Prophesee's decoder drops them; so are EVT 3.0 events before the first row or base
column, which have no address (Prophesee's decoder puts them at row or column 0). A
recording cut from a camera's stream may start mid-state.

The header is the lines of text starting with ``%`` at the start of the file, up to a
``% end`` line (Metavision writes one) or the first line that is not such text: ``faery``
writes no ``% end``, and its first word may begin with the byte of ``%``. A ``% T0`` line
(``faery`` writes one when it shifts a recording to start at 0) gives microseconds added to
every timestamp, as ``faery`` adds them.

DAT
---
The older format of Prophesee's datasets (Gen1 and Gen4 automotive, N-CARS). After the
``%`` lines (``% Version 2``, ``% Width 1280``, ``% Height 720``) come two bytes, the
event type (0x00 ``Event2d``, 0x0C ``CD``: both pixel events) and the event size (8),
then one little-endian 64-bit record per event: the timestamp in its low 32 bits, then
``x``, ``y`` and the polarity. Version 2 packs ``x`` and ``y`` in 14 bits each and the
polarity in the top 4 bits; version 1, the older ATIS files, packs ``x`` in 9 bits, ``y``
in 8 and the polarity in the 4 bits after them. A file without a ``Version`` line is read
as version 2, as Prophesee's dataset loaders and ``faery`` read it. Polarities other than
0 and 1 are refused by the reader's checks, and so are files of external triggers (type
0x0E), which hold no pixel event.

Timestamps have 32 bits and wrap every :math:`2^{32}` µs (71.6 min): a timestamp lower
than the one before by at least :math:`2^{31}` µs is one wrap (``faery``'s rule), a
smaller drop is time going backwards, refused by the checks (``faery`` 0.7 gives such an
event the timestamp before it). A silence of more than :math:`2^{31}` µs cannot be told
from a wrap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .common import (CAMERA_EVENT_DTYPE, Layout, fail, header_lines, raw_records, record_blocks,
                     unwrap)

__all__ = ["Header", "WORD_BYTES", "decode", "decode_dat", "read_header"]

#: Bytes per word of each format.
WORD_BYTES = {"evt2": 4, "evt3": 2}


class _WordError(ValueError):
    """Words that are not EVT data; the message names the offending word's byte."""


# --------------------------------------------------------------------------- header
@dataclasses.dataclass(frozen=True)
class Header:
    """The ``%`` lines of a ``.raw`` or ``.dat`` file and what they say.

    Attributes:
      lines: The header lines, ``%`` and line ends stripped.
      data_offset: Byte where the lines end (EVT: where the words start; DAT: where the
        event type and size bytes are).
      version: ``'evt2'`` or ``'evt3'``, ``None`` when the header names neither.
      geometry: ``(width, height)`` of the sensor, ``None`` when the header gives none.
      t0: Microseconds added to every timestamp (a ``% T0`` line; 0 without one).
    """

    lines: tuple
    data_offset: int
    version: str | None
    geometry: tuple | None
    t0: int = 0


def read_header(path) -> Header:
    """The header of a Prophesee ``.raw`` or ``.dat`` file (module docstring for where
    it ends)."""
    lines, offset = header_lines(path, b"%", end="end")
    return Header(tuple(lines), offset, _version(lines), _geometry(lines),
                  _field(lines, "t0") or 0)


def _field(lines, name: str) -> int | None:
    """The whole number ``N`` (or ``N.0``) of the line ``name N`` (any case), ``None``
    without one."""
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[0].lower() == name:
            number = fields[1].removesuffix(".0")
            if number.isdigit():
                return int(number)
    return None


def _version(lines) -> str | None:
    text = " ".join(lines).lower()
    for version in ("evt3", "evt2"):
        if f"evt {version[-1]}.0" in text or f"format {version}" in text:
            return version
    return None


def _geometry(lines) -> tuple | None:
    """``(width, height)`` from ``geometry WxH``, ``format ...;width=W;height=H`` or the
    ``Width W`` and ``Height H`` lines of DAT files."""
    width, height = _field(lines, "width"), _field(lines, "height")
    if width is not None and height is not None:
        return width, height
    for line in lines:
        fields = line.split()
        if fields[:1] == ["geometry"] and len(fields) == 2 and "x" in fields[1]:
            width, _, height = fields[1].partition("x")
            if width.isdigit() and height.isdigit():
                return int(width), int(height)
        if fields[:1] == ["format"] and len(fields) == 2:
            keys = dict(item.partition("=")[::2] for item in fields[1].split(";"))
            if keys.get("width", "").isdigit() and keys.get("height", "").isdigit():
                return int(keys["width"]), int(keys["height"])
    return None


# --------------------------------------------------------------------------- decoding
def decode(path, version: str, *, data_offset: int, dtype: np.dtype,
           block_words: int = 1 << 16, t0: int = 0) -> Iterator[np.ndarray]:
    """The pixel events of an EVT file, in file order, one array per ``block_words``
    words read (memory: one block; the decoder's state is carried across blocks).

    Args:
      path: The ``.raw`` file.
      version: ``'evt2'`` or ``'evt3'``.
      data_offset: Byte where its words start (:attr:`Header.data_offset`).
      dtype: Structured dtype of the events yielded, with fields ``t`` (int64 or wider:
        microseconds), ``x``, ``y`` (at least 11 bits) and ``p`` (1 ON, 0 OFF).
      block_words: Words read at a time.
      t0: Microseconds added to every timestamp (:attr:`Header.t0`).

    Raises:
      EventFileError: a word type the format does not define, an event column beyond
        the format's 2048, or a last word cut short (named by its byte).
    """
    decoder = {"evt2": _Evt2Decoder, "evt3": _Evt3Decoder}[version](np.dtype(dtype))
    word = np.dtype("<u4" if version == "evt2" else "<u2")
    for byte, data in record_blocks(path, data_offset, word.itemsize, block_words, "word"):
        try:
            events = decoder(np.frombuffer(data, word), byte)
        except _WordError as err:
            fail(path, str(err))
        if t0:
            events["t"] += t0
        yield events


def open_evt(path) -> Layout:
    """The layout of an EVT 2.0 / 3.0 file: version and sensor from its header, its
    words decoded by :func:`decode`."""
    header = read_header(path)
    version = header.version
    if version is None:
        fail(path, "is not an EVT 2.0 or EVT 3.0 recording: its header (lines starting "
                   "with '%') names no 'evt 2.0' / 'evt 3.0' format")
    data_bytes = Path(path).stat().st_size - header.data_offset
    word = WORD_BYTES[version]
    if data_bytes % word:
        fail(path, f"its {version.upper()} data holds {data_bytes} bytes, not a whole number "
                   f"of {word}-byte words (a truncated file?)")
    return Layout(version, CAMERA_EVENT_DTYPE, header.geometry, None,
                  decode=lambda block: decode(path, version, data_offset=header.data_offset,
                                              dtype=CAMERA_EVENT_DTYPE, block_words=block,
                                              t0=header.t0))


def _undefined(bad: np.ndarray, at: np.ndarray | None, kind: np.ndarray, byte: int,
               word_bytes: int, name: str) -> None:
    """Raise for the first word ``bad`` marks, a type the format does not define (``bad``
    marks the words ``at``, or every word when ``None``)."""
    if bad.any():
        i = int(np.argmax(bad))
        i = i if at is None else int(at[i])
        raise _WordError(f"byte {byte + i * word_bytes} holds a word of type "
                         f"{int(kind[i]):#x}, which {name} does not define (a damaged file, "
                         f"or not {name} data)")


_UNKNOWN = -(1 << 62)   # a state not known yet: far below any timestamp or column


def _latest(at_state: np.ndarray, values: np.ndarray, at: np.ndarray, carried,
            is_state: np.ndarray | None = None) -> np.ndarray:
    """For each word position of ``at``: the value of the latest state word at or before
    it (``at_state`` lists their positions, ``values`` their values, ``is_state`` marks
    them when at hand), else ``carried`` (``None``: :data:`_UNKNOWN`)."""
    with_carried = np.empty(len(values) + 1, np.int64)
    with_carried[0] = _UNKNOWN if carried is None else carried
    with_carried[1:] = values
    if not len(at):
        return with_carried[:0]
    if 8 * len(at_state) < len(at):
        # few state words: each value repeated over the words up to the next one
        before = np.searchsorted(at, at_state, side="right")
        return np.repeat(with_carried, np.diff(before, prepend=0, append=len(at)))
    if is_state is None or 32 * len(at) < len(is_state):
        # few words asked about: bisect the state words' positions
        return np.take(with_carried, np.searchsorted(at_state, at, side="right"))
    # many of both: the number of state words up to each word, counted in one pass
    seen = np.take(np.cumsum(is_state, dtype=np.int32), at, mode="clip")
    return np.take(with_carried, seen, mode="clip")


class _Evt2Decoder:
    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.high = None          # last TIME_HIGH value (28 bits)
        self.loops = 0            # wraps counted so far
        self.base = None          # timestamp of the last TIME_HIGH, microseconds

    def __call__(self, words: np.ndarray, byte: int) -> np.ndarray:
        kind = words >> 28
        _undefined((kind - 2 <= 5) | (kind == 9), None, kind, byte, 4, "EVT 2.0")  # 0x2-0x7, 0x9
        is_high = kind == 8
        at = np.flatnonzero(kind <= 1)
        at_high = np.flatnonzero(is_high)
        base = np.zeros(0, np.int64)
        if len(at_high):
            highs = (words[at_high] & 0x0FFFFFFF).astype(np.int64)
            base, _, self.high, self.loops = unwrap(highs, self.high, self.loops, 28)
            base <<= 6
        carried, self.base = self.base, int(base[-1]) if len(base) else self.base
        base = _latest(at_high, base, at, carried, is_high)
        if carried is None:                      # events before the first TIME_HIGH
            known = base >= 0
            at, base = at[known], base[known]
        event_words = np.take(words, at)
        base |= (event_words >> 22) & 0x3F
        events = np.empty(len(at), self.dtype)
        events["t"] = base
        events["x"] = (event_words >> 11) & 0x7FF
        events["y"] = event_words & 0x7FF
        events["p"] = event_words >> 28
        return events


class _Evt3Decoder:
    _TOP_BIT = np.array([mask.bit_length() - 1 for mask in range(4096)])   # -1 for none
    _BIT_COUNT = np.array([mask.bit_count() for mask in range(4096)])

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.high = None            # last TIME_HIGH value (12 bits)
        self.loops = 0
        self.time_high = None       # high part of the time base, wraps counted in (us)
        self.time = None            # the time base after the last word (us)
        self.y = None
        self.base_x = None          # the next vector's base column
        self.base_p = None

    def __call__(self, words: np.ndarray, byte: int) -> np.ndarray:
        kind = words >> 12
        # the words that are rare in a recording, found in one pass: TIME_HIGH, the
        # vectors and their base (VECT_BASE_X, VECT_12, VECT_8: 3 to 5, unsigned), and
        # the types EVT 3.0 does not define (0x1, 0x9)
        rare = np.flatnonzero((kind - 3 <= 2) | (kind == 8) | (kind & 7 == 1))
        rare_kind = np.take(kind, rare)
        _undefined(rare_kind & 7 == 1, rare, kind, byte, 2, "EVT 3.0")
        vectors = bool((rare_kind != 8).any())
        is_single = kind == 2
        at = np.flatnonzero(is_single | (kind >> 1 == 2)) if vectors else \
            np.flatnonzero(is_single)
        settled = self.time is not None and self.y is not None
        t = self._times(kind, words, at, rare[rare_kind == 8])
        is_y = kind == 0
        rows = np.compress(is_y, words) & 0x7FF  # compress: 5x faster than words[is_y]
        y = _filled(is_y, rows, at, self.y)
        self.y = int(rows[-1]) if len(rows) else self.y
        address = np.take(words, at)
        x, p = address & 0x7FF, (address >> 11) & 1   # one per event word; vectors below
        # events before the time and row are known are dropped (at the file's start)
        keep = None if settled else (t >= 0) & (y >= 0)
        if vectors:
            return self._with_vectors(words, at, rare, rare_kind, t, x, y, p, keep, byte)
        if keep is not None:
            t, y, x, p = t[keep], y[keep], x[keep], p[keep]
        return self._events(t, x, y, p)

    def _events(self, t, x, y, p) -> np.ndarray:
        events = np.empty(len(t), self.dtype)
        events["t"], events["x"], events["y"], events["p"] = t, x, y, p
        return events

    def _times(self, kind: np.ndarray, words: np.ndarray, at: np.ndarray,
               at_high: np.ndarray) -> np.ndarray:
        """Timestamps (us) of the words ``at``; negative before the first TIME_HIGH."""
        is_time = kind == 6                      # TIME_LOW, and below TIME_HIGH changes
        changes, highs = at_high, np.zeros(0, np.int64)
        if len(at_high):
            unwrapped, changed, self.high, self.loops = unwrap(
                (np.take(words, at_high) & 0xFFF).astype(np.int64), self.high, self.loops, 12)
            changes, highs = at_high[changed], unwrapped[changed] << 12
            is_time[changes] = True
        seen = np.cumsum(is_time, dtype=np.int32)
        # the time base after each time word: the latest high part at or before it, plus
        # the low part (0 at a change of the high part)
        values = (np.compress(is_time, words) & 0xFFF).astype(np.int64)
        if len(changes):
            ordinals = np.take(seen, changes) - 1
            values += _runs(ordinals, highs, len(values), self.time_high)
            values[ordinals] = highs
            self.time_high = int(highs[-1])
        else:
            values += _UNKNOWN if self.time_high is None else self.time_high
        t = np.take(_table(values, self.time), np.take(seen, at))
        if len(values) and values[-1] >= 0:
            self.time = int(values[-1])
        return t

    def _with_vectors(self, words, at, rare, rare_kind, t, x, y, p, keep, byte):
        """The events of the event words ``at`` (their ``t``, ``x``, ``y``, ``p``; those
        ``keep`` marks), each vector word's replaced by its events: the base column plus
        each set bit of its mask, at the base's polarity (none before the first base
        column)."""
        at_vector = rare[(rare_kind == 4) | (rare_kind == 5)]
        vector = np.searchsorted(at, at_vector)  # the vector words, as indices into at
        at_base = rare[rare_kind == 3]
        bases = np.take(words, at_base).astype(np.int64) & 0xFFF
        payload = np.take(words, at_vector)
        is_12 = payload >> 12 == 4
        # columns the vectors before each vector word (and after it) moved the base on
        moved = np.zeros(len(vector) + 1, np.int64)
        np.cumsum(np.where(is_12, 12, 8), out=moved[1:])
        moved_at_base = _latest(at_vector, moved[1:], at_base, 0)
        base_x = _latest(at_base, (bases & 0x7FF) - moved_at_base, at_vector,
                         self.base_x) + moved[:-1]
        base_p = _latest(at_base, bases >> 11, at_vector, self.base_p)
        if len(at_base):
            self.base_x = int(bases[-1] & 0x7FF) + int(moved[-1] - moved_at_base[-1])
            self.base_p = int(bases[-1] >> 11)
        elif self.base_x is not None:
            self.base_x += int(moved[-1])
        valid = (payload & np.where(is_12, 0xFFF, 0xFF)).astype("<u2")
        valid[base_x < 0] = 0                    # vectors before the first base column
        if keep is not None:
            valid[~keep[vector]] = 0
        last = base_x + self._TOP_BIT[valid]
        if last.max(initial=0) > 0x7FF:
            i = int(np.argmax(last > 0x7FF))
            at_byte = byte + 2 * int(at_vector[i])
            raise _WordError(f"byte {at_byte} puts an event at column {int(last[i])}, "
                             "beyond EVT 3.0's 2048 (a damaged file)")
        # the vectors' events, in order: which vector, which bit of its mask (nonzero is
        # fast on bool)
        per_vector = self._BIT_COUNT[valid]
        bits = np.flatnonzero(np.unpackbits(valid.view(np.uint8), bitorder="little")
                              .view(bool))
        which = bits >> 4
        expanded = self._events(np.take(np.take(t, vector), which),
                                np.take(base_x, which) + (bits & 15),
                                np.take(np.take(y, vector), which),
                                np.take(base_p, which))
        events, expanded = raw_records(self._events(t, x, y, p)), raw_records(expanded)
        if keep is None and len(vector) <= 256:
            # few vectors: the runs of single events between them, and their events
            parts, start, first = [], 0, 0
            for word, count in zip(vector.tolist(), per_vector.tolist()):
                parts += [events[start:word], expanded[first:first + count]]
                start, first = word + 1, first + count
            parts.append(events[start:])
            return np.concatenate(parts).view(self.dtype)
        # many: every event put in its place at once
        counts = np.ones(len(at), np.intp) if keep is None else keep.astype(np.intp)
        counts[vector] = per_vector
        first = np.cumsum(counts) - counts       # where each word's events start
        single = counts == 1
        single[vector] = False
        out = np.empty(int(counts.sum()), events.dtype)
        at_single = np.flatnonzero(single)
        np.put(out, np.take(first, at_single), np.take(events, at_single))
        before = np.cumsum(per_vector) - per_vector
        rank = np.arange(len(expanded)) - np.repeat(before, per_vector)
        np.put(out, np.repeat(np.take(first, vector), per_vector) + rank, expanded)
        return out.view(self.dtype)


def _table(values: np.ndarray, carried) -> np.ndarray:
    """``values`` after ``carried`` (``None``: :data:`_UNKNOWN`): the state before the
    block's first state word, then after each."""
    table = np.empty(len(values) + 1, np.int64)
    table[0] = _UNKNOWN if carried is None else carried
    table[1:] = values
    return table


def _filled(is_state: np.ndarray, values: np.ndarray, at: np.ndarray, carried) -> np.ndarray:
    """For each word position of ``at``: the value of the latest state word at or before
    it (``is_state`` marks them, ``values`` are theirs in order), else ``carried``."""
    return np.take(_table(values, carried), np.take(np.cumsum(is_state, dtype=np.int32), at))


def _runs(starts: np.ndarray, values: np.ndarray, length: int, carried) -> np.ndarray:
    """An array of ``length`` holding ``values[k]`` from ``starts[k]`` to the next start
    (``carried``, or :data:`_UNKNOWN`, before the first): few runs are filled slice by
    slice, many repeated."""
    if len(starts) > 64:
        counts = np.diff(starts, prepend=0, append=length)
        return np.repeat(_table(values, carried), counts)
    out = np.empty(length, np.int64)
    out[:starts[0]] = _UNKNOWN if carried is None else carried
    for start, stop, value in zip(starts, [*starts[1:], length], values):
        out[start:stop] = value
    return out


# --------------------------------------------------------------------------- DAT
_DAT_PIXEL_TYPES = {0x00: "Event2d", 0x0C: "CD"}
#: per version: bits of x, bits of y, first bit of the polarity (of the 32 data bits)
_DAT_LAYOUTS = {1: (9, 8, 17), 2: (14, 14, 28)}


def decode_dat(path, version: int, *, data_offset: int, dtype: np.dtype,
               block_events: int = 1 << 16, t0: int = 0) -> Iterator[np.ndarray]:
    """The events of a DAT file, in file order, ``block_events`` at a time (memory: one
    block; the count of timestamp wraps is carried across blocks).

    Args:
      path: The ``.dat`` file.
      version: 1 or 2 (module docstring).
      data_offset: Byte where the events start, after the type and size bytes.
      dtype: Structured dtype of the events yielded, with fields ``t`` (int64:
        microseconds), ``x``, ``y`` (at least 14 bits) and ``p``.
      block_events: Events read at a time.
      t0: Microseconds added to every timestamp (:attr:`Header.t0`).

    Raises:
      EventFileError: a last event cut short (named by its byte).
    """
    x_bits, y_bits, p_shift = _DAT_LAYOUTS[version]
    previous, loops = None, 0
    for _, data in record_blocks(path, data_offset, 8, block_events, "event"):
        words = np.frombuffer(data, "<u4")
        t, _, previous, loops = unwrap(words[0::2].astype(np.int64), previous, loops, 32)
        address = words[1::2]
        events = np.empty(len(t), dtype)
        events["t"] = t + t0
        events["x"] = address & ((1 << x_bits) - 1)
        events["y"] = (address >> x_bits) & ((1 << y_bits) - 1)
        events["p"] = (address >> p_shift) & 0xF
        yield events


def open_dat(path) -> Layout:
    """The layout of a DAT file: version, sensor and event count from its header, its
    events decoded by :func:`decode_dat`."""
    header = read_header(path)
    with open(path, "rb") as f:
        f.seek(header.data_offset)
        type_and_size = f.read(2)
    if len(type_and_size) < 2:
        fail(path, "ends inside its DAT header: the event type and size bytes after the "
                   "'%' lines are missing (a truncated file?)")
    event_type, event_bytes = type_and_size
    if event_type == 0x0E:
        fail(path, "holds external trigger events (DAT event type 0x0e), not pixel events")
    if event_type not in _DAT_PIXEL_TYPES:
        fail(path, f"has the DAT event type {event_type:#04x}; expected 0x00 (Event2d) or "
                   "0x0c (CD)")
    if event_bytes != 8:
        fail(path, f"declares DAT events of {event_bytes} bytes; expected 8")
    version = _field(header.lines, "version")
    version = 2 if version is None else version
    if version not in _DAT_LAYOUTS:
        fail(path, f"is a DAT file of version {version}; expected version 1 or 2")
    data_offset = header.data_offset + 2
    data_bytes = Path(path).stat().st_size - data_offset
    if data_bytes % 8:
        fail(path, f"its DAT events fill {data_bytes} bytes, not a whole number of 8-byte "
                   "events (a truncated file?)")
    return Layout("dat", CAMERA_EVENT_DTYPE, header.geometry, data_bytes // 8,
                  decode=lambda block: decode_dat(path, version, data_offset=data_offset,
                                                  dtype=CAMERA_EVENT_DTYPE,
                                                  block_events=block, t0=header.t0))
