"""Labelled time segments of a recording: which class is shown from when to when.

A long recording is labelled by segments, ``(label, start, end)`` rows: the class shown
during ``[start, end)``; outside every segment nothing is labelled. Segment files are CSV
with a header naming the columns:

* DVS Gesture's raw recordings (``user01_fluorescent.aedat`` beside
  ``user01_fluorescent_labels.csv``) use ``class,startTime_usec,endTime_usec``: classes
  numbered from 1 (1 to 11), times in microseconds on the recording's clock. A ``class``
  column is read as numbered from 1, so class ``c`` becomes label ``c - 1``.
* ``label,start_us,end_us`` (or ``_ms``, ``_s``): labels numbered from 0.

The label column is the one named ``class`` or ``label``; the time columns are the ones
whose names start with ``start`` and ``end`` (any case), and their unit is the suffix of
their names: ``us`` or ``usec`` (microseconds), ``ms``, ``s`` or ``sec``. Rows must be in
time order and must not overlap; every wrong row is an error naming the file and the line.
(Some of DVS Gesture's files have a segment ending a little after the next one starts;
``overlaps='trim'`` ends such a segment where the next begins.)
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from ..._validation import integer, one_of

__all__ = ["Segments", "read_segments", "write_segments"]

_UNITS_US = {"us": 1, "usec": 1, "ms": 1_000, "s": 1_000_000, "sec": 1_000_000}


@dataclasses.dataclass(frozen=True)
class Segments:
    """Labelled, time-ordered, non-overlapping segments ``[start_us, end_us)`` of one
    recording.

    Args:
      labels: int ``(S,)``, labels numbered from 0.
      start_us: ``(S,)`` start of each segment, microseconds on the recording's clock,
        non-decreasing.
      end_us: ``(S,)`` end of each segment (excluded), after its start and at or before
        the next segment's start.
      source: What the segments were read from (a file), for error messages.
      rows: The file line of each segment, for error messages (default ``1..S``).

    Raises:
      ValueError: one sentence naming ``source`` and the segment (file line) that is
        wrong: a negative label or time, a non-finite time, an end not after its start,
        segments out of time order or overlapping.
    """

    labels: np.ndarray
    start_us: np.ndarray
    end_us: np.ndarray
    source: str = "segments"
    rows: tuple | None = None

    def __post_init__(self):
        labels = np.asarray(self.labels)
        start, end = (np.asarray(a, dtype=np.float64) for a in (self.start_us, self.end_us))
        if labels.size and not np.issubdtype(labels.dtype, np.integer):
            raise TypeError(f"{self.source}: labels must be integers, got dtype {labels.dtype}")
        if not labels.ndim == start.ndim == end.ndim == 1 or not (
                len(labels) == len(start) == len(end)):
            raise ValueError(f"{self.source}: labels, start_us and end_us must be 1-D of one "
                             f"length, got shapes {labels.shape}, {start.shape}, {end.shape}")
        rows = tuple(range(1, len(labels) + 1)) if self.rows is None else tuple(self.rows)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "labels", labels.astype(np.int32))
        object.__setattr__(self, "start_us", start)
        object.__setattr__(self, "end_us", end)
        for i in range(len(labels)):
            self._check_row(i)

    def _where(self, i: int) -> str:
        return f"{self.source}, line {self.rows[i]}"

    def _check_row(self, i: int) -> None:
        label, start, end = self.labels[i], self.start_us[i], self.end_us[i]
        if label < 0:
            raise ValueError(f"{self._where(i)}: label {label} is negative; labels count "
                             "classes from 0 (from 1 in a 'class' column)")
        if not (np.isfinite(start) and np.isfinite(end)):
            raise ValueError(f"{self._where(i)}: start {start} and end {end} must be finite")
        if start < 0:
            raise ValueError(f"{self._where(i)}: the segment starts at the negative time "
                             f"{start:g} us")
        if end <= start:
            raise ValueError(f"{self._where(i)}: the segment ends at {end:g} us, not after "
                             f"its start at {start:g} us")
        if i and start < self.start_us[i - 1]:
            raise ValueError(f"{self._where(i)}: the segment starts at {start:g} us, before "
                             f"the one above it ({self.start_us[i - 1]:g} us); rows must be "
                             "in time order")
        if i and start < self.end_us[i - 1]:
            raise ValueError(f"{self._where(i)}: the segment starts at {start:g} us, before "
                             f"the one above it ends ({self.end_us[i - 1]:g} us); segments "
                             "must not overlap (overlaps='trim' ends the earlier one there)")

    def __len__(self) -> int:
        return len(self.labels)

    def check_labels(self, num_classes: int) -> None:
        """Raise a ``ValueError`` naming the first segment whose label is not below
        ``num_classes``."""
        bad = np.flatnonzero(self.labels >= num_classes)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{self._where(i)}: label {self.labels[i]} is out of range for "
                             f"{num_classes} classes (labels 0 to {num_classes - 1})")

    def check_recording(self, first_us: float, last_us: float, events) -> None:
        """Raise a ``ValueError`` naming the first segment that does not overlap its
        recording, whose events span ``first_us`` to ``last_us`` (the file ``events``):
        one that starts after the last event or ends at or before the first. Times in
        another unit than their column's name says (milliseconds under ``start_us``) move
        segments out of the recording and are caught so, unless the recording's clock
        starts near 0: there they label only its first thousandth, which no check can tell
        from a real label."""
        for i in range(len(self)):
            start, end = self.start_us[i], self.end_us[i]
            if start > last_us:
                where = f"after the last event of {events} ({last_us:g} us)"
            elif end <= first_us:
                where = f"before the first event of {events} ({first_us:g} us)"
            else:
                continue
            raise ValueError(f"{self._where(i)}: the segment [{start:g}, {end:g}) us lies "
                             f"{where}; segments must overlap their recording (times in "
                             "another unit than the column names say?)")

    def at(self, t_us: np.ndarray) -> np.ndarray:
        """Index of the segment holding each time ``t_us`` (any shape), ``-1`` outside
        every segment."""
        t_us = np.asarray(t_us, dtype=np.float64)
        if not len(self):
            return np.full(t_us.shape, -1)
        index = np.searchsorted(self.start_us, t_us, side="right") - 1
        inside = (index >= 0) & (t_us < self.end_us[np.maximum(index, 0)])
        return np.where(inside, index, -1)


def _columns(path: Path, header: list[str]) -> tuple[int, int, int, int, float, float]:
    """Column indices (label, start, end), the first label number, and the time units."""
    names = [h.strip() for h in header]
    lower = [n.lower() for n in names]
    label = next((i for i, n in enumerate(lower) if n in ("label", "class")), None)
    start = next((i for i, n in enumerate(lower) if n.startswith("start")), None)
    end = next((i for i, n in enumerate(lower) if n.startswith("end")), None)
    if None in (label, start, end):
        raise ValueError(
            f"{path}: the header {names} lacks a column named 'label' or 'class', or one "
            "whose name starts with 'start' or 'end'; expected e.g. "
            "class,startTime_usec,endTime_usec (DVS Gesture) or label,start_us,end_us")
    units = []
    for column in (start, end):
        suffix = lower[column].rsplit("_", 1)[-1] if "_" in lower[column] else ""
        if suffix not in _UNITS_US:
            raise ValueError(f"{path}: the column {names[column]!r} does not say its unit; "
                             "end its name with _us (or _usec), _ms or _s, e.g. start_us")
        units.append(_UNITS_US[suffix])
    return label, start, end, int(lower[label] == "class"), *units


def read_segments(path, *, num_classes: int | None = None,
                  overlaps: str = "error") -> Segments:
    """The labelled segments of a CSV file (module docstring for the format).

    Args:
      path: The CSV file, e.g. DVS Gesture's ``user01_fluorescent_labels.csv``.
      num_classes: Labels must be below it (checked here when given).
      overlaps: ``'error'`` (default) or ``'trim'``: a segment that ends after the next
        one starts is ended there.

    Returns:
      :class:`Segments` with labels numbered from 0 and times in microseconds.

    Raises:
      ValueError: one sentence naming the file and its line: a header without rows, a
        missing column, a row with too few fields or a value that is not a number, a
        label out of range, a negative time, an end not after its start, rows out of time
        order, overlapping segments (with ``overlaps='error'``).
    """
    one_of("overlaps", overlaps, ("error", "trim"))
    path = Path(path)
    with open(path, newline="") as f:
        rows = [(n, row) for n, row in enumerate(csv.reader(f), start=1)
                if any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"{path}: the file is empty; expected a header line such as "
                         "class,startTime_usec,endTime_usec")
    if len(rows) == 1:
        raise ValueError(f"{path}: the file holds a header and no segments; expected a row "
                         f"per segment below the header {','.join(rows[0][1])}")
    label, start, end, first, start_unit, end_unit = _columns(path, rows[0][1])
    labels, starts, ends, lines = [], [], [], []
    for line, row in rows[1:]:
        if len(row) <= max(label, start, end):
            raise ValueError(f"{path}, line {line}: {len(row)} field(s), expected a value in "
                             f"each of the {len(rows[0][1])} columns of the header")
        try:
            labels.append(int(row[label]) - first)
            starts.append(float(row[start]) * start_unit)
            ends.append(float(row[end]) * end_unit)
        except ValueError:
            raise ValueError(f"{path}, line {line}: {row} is not an integer label and two "
                             "numbers") from None
        lines.append(line)
    if overlaps == "trim":
        for i in range(1, len(starts)):
            if starts[i] >= starts[i - 1]:      # rows out of order stay an error
                ends[i - 1] = min(ends[i - 1], starts[i])
    segments = Segments(np.asarray(labels, dtype=np.int64), np.asarray(starts),
                        np.asarray(ends), source=str(path), rows=tuple(lines))
    if num_classes is not None:
        segments.check_labels(integer("num_classes", num_classes, sign="positive"))
    return segments


def write_segments(path, segments: Segments) -> None:
    """Write ``segments`` as DVS Gesture does: ``class,startTime_usec,endTime_usec``,
    classes numbered from 1, times in whole microseconds (rounded)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["class", "startTime_usec", "endTime_usec"])
        for label, start, end in zip(segments.labels, segments.start_us, segments.end_us):
            writer.writerow([int(label) + 1, int(round(start)), int(round(end))])
