"""Binning of recorded events into dense frames of any spatial rank.

Events are numpy structured arrays in the ``tonic`` format, one record per
event: a timestamp ``t`` (microseconds), integer coordinates ``x`` (and
``y``, and ``z``) and a polarity ``p``. The coordinate fields present set the
spatial rank of the frames:

=================  ===========================  ===============================
event fields       ``sensor_size``              one frame
=================  ===========================  ===============================
t, x, p            ``(X, P)`` or ``(X, 1, P)``  ``(P, X)``
t, x, y, p         ``(X, Y, P)``                ``(P, Y, X)`` = ``(P, H, W)``
t, x, y, z, p      ``(X, Y, Z, P)``             ``(P, Z, Y, X)``
=================  ===========================  ===============================

``sensor_size`` lists the extents in tonic's order (``x`` first, the number
of polarity channels ``P`` last; tonic writes audio sensors such as SHD's
as ``(700, 1, 1)``). Frames list them in reverse, ``x`` fastest, which is
the layout of ``tonic.transforms.ToFrame``: ``frames[t, p, y, x]`` counts
the events of time bin ``t`` at row ``y`` and column ``x``.

Polarity channels: with ``P = 2``, channel 0 counts ON events (``p`` equal
to 1 or True) and channel 1 OFF events (0, -1 or False), the library-wide
convention; tonic orders channels by the value of ``p`` instead (OFF
first). With ``P = 1`` every event goes to the single channel, and all
events must share one polarity value, as tonic requires.

:class:`Binning` holds the validated binning keywords (with the event transforms of
:mod:`~braintrace_conv.data.transforms` to apply first, if any); :func:`events_to_frames`,
the loaders of :mod:`~braintrace_conv.data.datasets.sources` and
:class:`~braintrace_conv.data.EventStream` share it, the loaders checking the keywords once
before reading any file.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._validation import integer, number

__all__ = ["events_to_frames"]

_SPATIAL_FIELDS = ("x", "y", "z")
_SENSOR_FORMS = {1: "(X, P) or (X, 1, P)", 2: "(X, Y, P)", 3: "(X, Y, Z, P)"}


def _spatial_rank(events) -> int:
    """Number of coordinate fields (1 to 3) of a structured event array."""
    if not isinstance(events, np.ndarray) or events.dtype.names is None:
        raise TypeError(
            "events must be a numpy structured array with fields t, x[, y[, z]], p, got "
            f"{type(events).__name__}"
            + (f" with dtype {events.dtype}" if isinstance(events, np.ndarray) else "")
        )
    names = events.dtype.names
    present = [f in names for f in _SPATIAL_FIELDS]
    rank = present.index(False) if False in present else 3
    missing = [f for f in ("t", "x", "p") if f not in names]
    if missing or any(present[rank:]):
        raise ValueError(
            f"events has fields {list(names)}; expected t, p and the coordinates x, "
            "(x, y) or (x, y, z)"
            + (f" (missing {missing})" if missing else " (a coordinate is skipped)")
        )
    if events.ndim != 1:
        raise ValueError(f"events must be one-dimensional, got shape {events.shape}")
    return rank


def _sensor_extents(sensor_size: tuple, rank: int) -> tuple[tuple[int, ...], int]:
    """Spatial extents in frame order (reversed) and the polarity count."""
    size = tuple(sensor_size)
    if rank == 1 and len(size) == 3 and size[1] == 1:
        size = (size[0], size[2])  # tonic writes 1-D sensors as (X, 1, P)
    if len(size) != rank + 1:
        raise ValueError(
            f"events with {rank} coordinate field(s) need sensor_size "
            f"{_SENSOR_FORMS[rank]}, got {sensor_size!r}"
        )
    return size[-2::-1], size[-1]


def _integer_coordinates(values: np.ndarray, name: str, bound: int) -> np.ndarray:
    """Return event coordinates as intp, requiring integers in ``[0, bound)``."""
    if not np.issubdtype(values.dtype, np.number) or np.issubdtype(
        values.dtype, np.complexfloating
    ):
        raise TypeError(f"events field {name!r} must be numeric, got dtype {values.dtype}")
    if values.size and not np.array_equal(values, np.round(values)):
        raise ValueError(f"events field {name!r} must hold integer pixel coordinates")
    if values.size and (values.min() < 0 or values.max() >= bound):
        raise ValueError(
            f"events field {name!r} must lie in [0, {bound}) for this sensor_size, "
            f"got values in [{values.min()}, {values.max()}]"
        )
    return values.astype(np.intp)


def _polarity_channel(polarity: np.ndarray, n_polarities: int) -> np.ndarray:
    """Channel index of every event: ON -> 0, OFF -> 1 (or all 0 when P = 1)."""
    if polarity.dtype != bool and not np.issubdtype(polarity.dtype, np.number):
        raise TypeError(
            f"events field 'p' must be numeric or bool, got dtype {polarity.dtype}"
        )
    values = sorted(np.unique(polarity).tolist())
    if n_polarities == 1:
        if len(values) > 1:
            raise ValueError(
                f"sensor_size has P=1 polarity channel but events field 'p' holds "
                f"{values}; give P=2 to keep them apart, or set events['p'] to one "
                "value to merge them"
            )
        return np.zeros(polarity.shape, dtype=np.intp)
    if polarity.dtype != bool and not (set(values) <= {0, 1} or set(values) <= {-1, 1}):
        raise ValueError(
            f"events field 'p' must be coded as 0/1, -1/1 or bool, got values {values}"
        )
    return np.where(polarity > 0, 0, 1)


def checked_sensor_size(sensor_size) -> tuple:
    """``sensor_size`` as a tuple of ints in tonic's order: 1 to 3 positive extents, then
    the number of polarity channels, 1 or 2."""
    try:
        size = tuple(sensor_size)
    except TypeError:
        size = ()
    if not 2 <= len(size) <= 4:
        raise TypeError(
            "sensor_size must be (X, P), (X, Y, P) or (X, Y, Z, P) as in tonic "
            f"(extents, then the number of polarities), got {sensor_size!r}"
        )
    size = tuple(
        integer(f"sensor_size[{i}]", s, sign="positive") for i, s in enumerate(size)
    )
    if size[-1] > 2:
        raise ValueError(
            f"sensor_size[-1] (polarities) must be 1 or 2, got {size[-1]}"
        )
    return size


def _add_counts(frames: np.ndarray, cells: np.ndarray) -> None:
    """Add one to ``frames.flat[c]`` for every flat index ``c`` of ``cells`` (repeats
    count), in place, also where ``frames`` is a strided view; the events are sorted, so
    memory is that of the events, never of the frames."""
    cells, counts = np.unique(cells, return_counts=True)
    frames[np.unravel_index(cells, frames.shape)] += counts


@dataclasses.dataclass(frozen=True)
class Binning:
    """Validated arguments of ``events_to_frames``; calling it bins events.

    ``frame_sensor_size`` is the sensor size of the frames: ``sensor_size``, or that of
    the ``transforms``' output."""

    sensor_size: tuple
    n_time_bins: int | None = None
    time_window_us: float | None = None
    event_count: int | None = None
    t_start_us: float | None = None
    transforms: object = None
    frame_sensor_size: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "sensor_size", checked_sensor_size(self.sensor_size))
        from .transforms import compose      # transforms use this module's checks

        object.__setattr__(self, "transforms", compose(self.transforms))
        object.__setattr__(self, "frame_sensor_size", self.sensor_size if self.transforms is
                           None else self.transforms.output_size(self.sensor_size))
        if self.time_window_us is not None and self.event_count is not None:
            raise ValueError("give at most one of time_window_us and event_count")
        if (self.n_time_bins, self.time_window_us, self.event_count) == (None,) * 3:
            raise ValueError(
                "give n_time_bins, time_window_us or event_count (exactly one of the "
                "last two may be combined with n_time_bins)"
            )
        for name, check, sign in (
            ("n_time_bins", integer, "positive"),
            ("time_window_us", number, "positive"),
            ("event_count", integer, "positive"),
            ("t_start_us", number, None),
        ):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check(name, getattr(self, name), sign=sign))

    @classmethod
    def from_keywords(cls, sensor_size, keywords: dict) -> Binning:
        """``events -> frames`` for the binning keywords of ``events_to_frames``
        (``n_time_bins``, ``time_window_us``, ``event_count``, ``t_start_us``,
        ``transforms``)."""
        names = [f.name for f in dataclasses.fields(cls) if f.init][1:]
        unknown = sorted(set(keywords) - set(names))
        if unknown:
            raise TypeError(f"unknown binning keyword(s) {unknown}; expected some of {names}")
        return cls(sensor_size=sensor_size, **keywords)

    def _bins(self, t: np.ndarray) -> tuple[np.ndarray, int]:
        """Time-bin index of every event (``-1``: dropped) and the number of bins."""
        start = self.t_start_us if self.t_start_us is not None else (
            t.min() if t.size else 0.0
        )
        kept = t >= start
        n_kept = int(kept.sum())
        bins = np.full(t.shape, -1, dtype=np.intp)
        if self.event_count is not None:
            order = np.flatnonzero(kept)[np.argsort(t[kept], kind="stable")]
            bins[order] = np.arange(n_kept) // self.event_count
            n_bins = -(-n_kept // self.event_count)
        elif self.time_window_us is not None:
            width, n_bins = self.time_window_us, self.n_time_bins
            if n_bins is None and not n_kept:
                n_bins = 0
            elif n_bins is None:
                # The bin of the latest event, with the edges' own arithmetic.
                stop, last = t[kept].max(), int((t[kept].max() - start) // width)
                if start + last * width > stop:
                    last -= 1
                elif start + (last + 1) * width <= stop:
                    last += 1
                n_bins = last + 1
            edges = start + np.arange(n_bins + 1) * width
            bins[kept] = np.searchsorted(edges, t[kept], side="right") - 1
        else:
            n_bins = self.n_time_bins
            stop = t[kept].max() if n_kept else start
            if stop > start:
                edges = start + np.arange(n_bins + 1) * ((stop - start) / n_bins)
                # The last bin is closed: it also holds the latest event.
                bins[kept] = np.minimum(
                    np.searchsorted(edges, t[kept], side="right") - 1, n_bins - 1
                )
            else:
                bins[kept] = 0
        if self.n_time_bins is not None:
            n_bins = self.n_time_bins
            bins[bins >= n_bins] = -1
        return bins, n_bins

    def _cells(self, events: np.ndarray) -> tuple[np.ndarray, int, tuple]:
        """The flat index into ``(T, P, *spatial)`` frames of every binned event, ``T`` and
        ``(P, *spatial)``, for events of a sensor of ``frame_sensor_size``."""
        rank = _spatial_rank(events)
        extents, n_polarities = _sensor_extents(self.frame_sensor_size, rank)
        t = events["t"]
        if not np.issubdtype(t.dtype, np.number) or np.issubdtype(
            t.dtype, np.complexfloating
        ):
            raise TypeError(f"events field 't' must be numeric, got dtype {t.dtype}")
        t = t.astype(np.float64)
        if t.size and not np.isfinite(t).all():
            raise ValueError("events field 't' must be finite")
        # Flat index of (polarity, *coordinates in frame order), x fastest.
        index = _polarity_channel(events["p"], n_polarities)
        for name, extent in zip(_SPATIAL_FIELDS[rank - 1 :: -1], extents):
            index = index * extent + _integer_coordinates(events[name], name, extent)
        bins, n_bins = self._bins(t)
        frame = (n_polarities, *extents)
        valid = bins >= 0
        return bins[valid] * int(np.prod(frame)) + index[valid], n_bins, frame

    def _transformed(self, events: np.ndarray) -> np.ndarray:
        return events if self.transforms is None else self.transforms(
            events, sensor_size=self.sensor_size)

    def __call__(self, events: np.ndarray) -> np.ndarray:
        cells, n_bins, frame = self._cells(self._transformed(events))
        shape = (n_bins, *frame)
        size = int(np.prod(shape))
        if len(cells) * 8 >= size:          # many events per cell: one pass over the frames
            return np.bincount(cells, minlength=size).astype(np.float32).reshape(shape)
        frames = np.zeros(shape, np.float32)
        _add_counts(frames, cells)
        return frames

    def add_to(self, frames: np.ndarray, events: np.ndarray) -> None:
        """Add the counts of ``events`` (of a sensor of ``frame_sensor_size``: already
        transformed) to ``frames`` ``(n_time_bins, P, *spatial)``, float32, in place (a
        strided view is fine): a stream bins block after block into one chunk this way,
        without a frame-sized temporary."""
        cells, n_bins, frame = self._cells(events)
        if frames.shape != (n_bins, *frame):
            raise ValueError(f"frames of shape {frames.shape} cannot hold {n_bins} bins of "
                             f"{frame}")
        _add_counts(frames, cells)


def events_to_frames(
    events: np.ndarray,
    *,
    sensor_size: tuple[int, ...],
    n_time_bins: int | None = None,
    time_window_us: float | None = None,
    event_count: int | None = None,
    t_start_us: float | None = None,
    transforms=None,
) -> np.ndarray:
    """Bin a structured event array into dense frames of event counts.

    Time is measured from ``t0 = t_start_us``, by default the earliest
    event; events before ``t0`` are dropped. With ``t1`` the latest event,
    the bins are:

    * ``n_time_bins=n`` alone: ``n`` bins of equal width ``(t1 - t0) / n``
      spanning the recording; bin ``k`` covers ``[t0 + k (t1 - t0) / n,
      t0 + (k + 1) (t1 - t0) / n)`` and the last bin also holds ``t1``. If
      all events share one timestamp they fall in bin 0.
    * ``time_window_us=w``: bins ``[t0 + k w, t0 + (k + 1) w)``, as many as
      needed to reach ``t1``, ``T = floor((t1 - t0) / w) + 1``. With
      ``n_time_bins=n`` as well, exactly ``n`` bins: a recording is cut
      after ``t0 + n w`` or padded with empty frames. This is the fixed
      time axis data sets need (e.g. SHD: ``t_start_us=0``).
    * ``event_count=c``: bin ``k`` holds events ``k c`` to ``(k + 1) c - 1``
      in time order (ties keep their order in the array), ``T = ceil(E /
      c)``; with ``n_time_bins=n`` as well, exactly ``n`` bins.

    Matches ``tonic.transforms.ToFrame`` (up to the order of the polarity
    channels, see the module docstring) as follows, for events sorted by
    time: ``time_window=w, include_incomplete=True`` equals
    ``time_window_us=w`` unless ``t1 - t0`` is a multiple of ``w`` (tonic
    then drops the events at ``t1``); ``time_window=w`` with ``start_time=s,
    end_time=s + n w`` equals ``time_window_us=w, n_time_bins=n,
    t_start_us=s``; ``n_time_bins=n`` equals ``time_window_us=(t1 - t0) //
    n, n_time_bins=n`` (tonic's bins are floored to whole time units and
    drop the events after the last one); ``event_count=c,
    include_incomplete=True`` equals ``event_count=c``; ``n_event_bins=n``
    equals ``event_count=E // n, n_time_bins=n``.

    Args:
      events: Structured array of shape ``(E,)`` with numeric fields ``t``
        (microseconds, any order), integer-valued coordinates ``x``
        (``0 <= x < X``), optionally ``y`` and ``z``, and the polarity
        ``p`` (0/1, -1/1 or bool, 1 / True is ON). Other fields are ignored.
      sensor_size: ``(X, P)`` or ``(X, 1, P)`` for events without ``y``, ``(X, Y, P)``
        with ``y``, ``(X, Y, Z, P)`` with ``z``; ``P`` is 1 or 2.
      n_time_bins: Number of time bins ``T``.
      time_window_us: Width of each time bin, microseconds.
      event_count: Number of events per bin.
      t_start_us: Start of the first bin, microseconds; default the earliest event.
      transforms: Event transforms applied before binning
        (:mod:`~braintrace_conv.data.transforms`: a transform or a sequence of them,
        e.g. ``[Denoise(window_us=10_000), Downsample(factor=1 / 8)]``); ``sensor_size``
        is then the recording's, and the frames have the transformed sensor's size.

    Returns:
      float32 event counts of shape ``(T, P, *spatial)`` with ``spatial``
      the sensor extents (after ``transforms``) in reverse order: ``(T, P, X)``,
      ``(T, P, Y, X)`` or ``(T, P, Z, Y, X)``. With no events, ``T = n_time_bins``
      zero frames, or ``T = 0`` without ``n_time_bins``.

    Raises:
      ValueError: No binning or ``time_window_us`` with ``event_count``; a
        ``sensor_size`` that does not fit the coordinate fields; events
        outside the sensor, non-integer coordinates, or polarities not
        coded as above (or more than one with ``P = 1``).
      TypeError: ``events`` not a structured array, non-numeric fields.
    """
    return Binning(
        sensor_size=sensor_size,
        n_time_bins=n_time_bins,
        time_window_us=time_window_us,
        event_count=event_count,
        t_start_us=t_start_us,
        transforms=transforms,
    )(events)
