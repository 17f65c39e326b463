r"""Event transforms: changes to a recording's events made before they are binned, so that
a frame is only ever built at the size the network takes.

A transform maps the events of a sensor of ``sensor_size`` to the events of another
sensor. Events are structured arrays in tonic's format (:mod:`~braintrace_conv.data.binning`):
a timestamp ``t`` in microseconds, integer pixel coordinates ``x`` (and ``y``) and a
polarity ``p``; ``sensor_size`` is in tonic's order, ``(W, H, P)`` for a camera.

* :class:`Downsample` ``(factor=f)``: ``x' = floor(f x)``, ``y' = floor(f y)``; the pixels
  of a block add up in one. No state.
* :class:`Crop` ``(origin, size)`` and :class:`CenterCrop` ``(size)``: the events inside a
  region, moved to its corner. No state.
* :class:`RefractoryPeriod` ``(period_us)``: an event is kept when its pixel's previous
  event lies more than ``period_us`` before it. State: each pixel's last event.
* :class:`Denoise` ``(window_us)``: an event is kept when a neighbouring pixel fired less
  than ``window_us`` before it. State: each pixel's last event.
* :class:`MergePolarities` ``()``: ``p' = 0``, one polarity channel. No state.

A sequence of transforms (or :class:`Compose`) applies them in order, the sensor size
passed along: ``[Denoise(window_us=10_000), Downsample(factor=1 / 8)]`` denoises at the
camera's own pixels, then maps a 1280 x 720 camera to 160 x 90.

Applying
--------
* ``transform(events, sensor_size=...)``: the events of one whole recording (or sample);
  ``transform.output_size(sensor_size)`` is the sensor size of the result.
* ``transform.bind(sensor_size)``: a :class:`BoundTransform` that keeps its state (the
  last event of each pixel) from one call to the next. Called on the blocks of a
  recording in time order, it gives exactly the events it gives for the whole recording
  at once: this is how :class:`~braintrace_conv.data.EventStream` applies transforms
  while it reads a file block by block.
* ``events_to_frames(..., transforms=...)``, the loaders of datasets and
  ``EventStream(..., transforms=...)`` take a transform or a sequence of them;
  ``sensor_size`` there is the recording's, and frames have the transformed size.

Streams and resuming
--------------------
Whether a stateful transform keeps an event at time ``t`` depends only on the events in
``[t - lookback_us, t]`` before it (``lookback_us`` is ``period_us`` or ``window_us``;
that of a sequence is the sum of its members'). A stream that starts, or resumes, at a
step starting at ``t0`` in the middle of a recording first runs the events of ``[t0 -
lookback_us, t0)`` through the transforms and drops the result: its state is then
exactly that of a run from the recording's start, so positions need no record of it.

Against tonic
-------------
:class:`Downsample`, :class:`CenterCrop`, :class:`RefractoryPeriod`, :class:`Denoise` and
:class:`MergePolarities` give the events that ``tonic.transforms.Downsample``,
``CenterCrop``, ``RefractoryPeriod``, ``Denoise`` and ``MergePolarities`` give, event for
event, with three differences, each at the start of a recording or outside tonic's own
domain:

* tonic's ``RefractoryPeriod`` starts as if every pixel had fired at ``t = -period``, so
  it drops a pixel's first event when that lies at ``t <= 0``; here a pixel's first
  event is always kept (a stream's timestamps do not start at 0).
* tonic's ``Denoise`` starts as if every pixel had fired at ``t = 0``, so it keeps every
  event before ``t = window``; here a neighbour counts only once it has fired.
* tonic's ``Downsample`` multiplies float coordinates without rounding them and allows
  factors above 1; here coordinates stay integer pixels (``floor``) and factors lie in
  ``(0, 1]``. tonic's ``CenterCrop`` pads a sensor smaller than the crop; here the crop
  must fit.

Both stateful rules read the events in array order (timestamps from files are
non-decreasing), and both treat the two polarities of a pixel as one pixel, as tonic does.
Every rule here is deterministic; tonic's random ones (``RandomCrop``, a
``RefractoryPeriod`` drawn from a range of periods) have no counterpart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from .._validation import ArgumentError, WrongTypeError, integer, interval, number
from .binning import _integer_coordinates, checked_sensor_size

__all__ = ["BoundTransform", "CenterCrop", "Compose", "Crop", "Denoise", "Downsample",
           "MergePolarities", "RefractoryPeriod", "Transform", "compose"]

_COORDINATES = ("x", "y", "z")


@dataclasses.dataclass(frozen=True)
class _Sensor:
    """A sensor in tonic's order: one extent per coordinate field (``x`` first), then the
    number of polarity channels."""

    sizes: tuple
    polarities: int

    @classmethod
    def of(cls, sensor_size) -> _Sensor:
        size = checked_sensor_size(sensor_size)
        return cls(size[:-1], size[-1])

    @property
    def tonic(self) -> tuple:
        return (*self.sizes, self.polarities)

    @property
    def pixels(self) -> int:
        return int(np.prod(self.sizes))

    def fields(self, events: np.ndarray) -> tuple:
        """The coordinate fields of ``events`` (``x`` or ``x, y``, ...), checked against
        this sensor: integers inside it. A sensor may have more axes than the events
        when the extra extents are 1 (tonic's ``(X, 1, P)`` for audio)."""
        names = getattr(events, "dtype", np.dtype(float)).names
        if not isinstance(events, np.ndarray) or names is None or "t" not in names \
                or "p" not in names or "x" not in names:
            raise TypeError("events must be a structured array with fields t, x[, y], p, got "
                            + (f"dtype {events.dtype}" if isinstance(events, np.ndarray)
                               else type(events).__name__))
        fields = tuple(f for f in _COORDINATES if f in names)
        if fields != _COORDINATES[:len(fields)] or len(fields) > len(self.sizes) or any(
                s != 1 for s in self.sizes[len(fields):]):
            raise ValueError(f"events with the coordinate fields {list(fields)} do not fit "
                             f"sensor_size {self.tonic}")
        for name, size in zip(fields, self.sizes):
            _integer_coordinates(events[name], name, size)
        return fields

    def pixel(self, events: np.ndarray, fields: tuple) -> np.ndarray:
        """The flat pixel index of every event, ``x + W (y + H z)``, int64."""
        index = np.zeros(len(events), np.int64)
        for name, size in zip(fields[::-1], self.sizes[len(fields) - 1::-1]):
            index = index * size + events[name].astype(np.int64)
        return index


class BoundTransform:
    """A transform bound to the sensor of its input (:meth:`Transform.bind`).

    Call it on the blocks of one recording in time order; a stateful transform carries
    its state from call to call, so the blocks give the events the whole recording gives.

    Attributes:
      sensor_size: The sensor size of the output, tonic's order (``(W', H', P')``).
      lookback_us: How far back, in microseconds, an event's fate depends on the events
        before it (0 for stateless transforms; module docstring).
    """

    def __init__(self, sensor_size: tuple, lookback_us: float,
                 apply: Callable[[np.ndarray], np.ndarray]):
        self.sensor_size = tuple(sensor_size)
        self.lookback_us = lookback_us
        self._apply = apply

    def __call__(self, events: np.ndarray) -> np.ndarray:
        """The transformed events (a new array; ``events`` is not changed)."""
        return self._apply(events)

    def __repr__(self) -> str:
        return f"BoundTransform(sensor_size={self.sensor_size})"


class Transform:
    """A change of events before binning (module docstring); subclasses define
    :meth:`_bind`."""

    #: Microseconds back in time that an event's fate depends on (module docstring).
    lookback_us: float = 0.0

    def bind(self, sensor_size) -> BoundTransform:
        """This transform for events of a sensor of ``sensor_size`` (tonic's order), with
        fresh state.

        Raises:
          ValueError: a ``sensor_size`` this transform does not fit (a crop larger than
            the sensor, ...).
        """
        sensor = _Sensor.of(sensor_size)
        out, apply = self._bind(sensor)

        def checked(events: np.ndarray) -> np.ndarray:
            fields = sensor.fields(events)
            return apply(events, fields) if len(events) else events.copy()

        return BoundTransform(out.tonic, self.lookback_us, checked)

    def _bind(self, sensor: _Sensor) -> tuple[_Sensor, Callable]:
        """``(output sensor, apply(events, fields) -> events)`` with fresh state."""
        raise NotImplementedError

    def output_size(self, sensor_size) -> tuple:
        """The sensor size of the output for an input of ``sensor_size`` (tonic's order)."""
        return self.bind(sensor_size).sensor_size

    def __call__(self, events: np.ndarray, *, sensor_size) -> np.ndarray:
        """The transformed events of one whole recording of a sensor of ``sensor_size``."""
        return self.bind(sensor_size)(events)


def _per_axis(name: str, value, check: Callable, n: int | None = None) -> tuple:
    """``check(name, v)`` of a scalar, or of every entry of a tuple (x first); the scalar
    is repeated, or the tuple must have, ``n`` entries when ``n`` is given."""
    if not isinstance(value, tuple):
        return (check(name, value),) * (n or 1)
    if n is not None and len(value) != n:
        raise ArgumentError(name, value, f"have {n} entries (one per coordinate of the "
                                         f"sensor, x first)")
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(value))


def _fraction(name: str, value) -> float:
    return interval(name, value, 0, 1, "(]")


def _extent(name: str, value) -> int:
    return integer(name, value, sign="positive")


def _tuples(transform, *names: str) -> None:
    """Store the list-valued fields ``names`` of a frozen dataclass as tuples (hashable)."""
    for name in names:
        if isinstance(getattr(transform, name), list):
            object.__setattr__(transform, name, tuple(getattr(transform, name)))


@dataclasses.dataclass(frozen=True)
class Downsample(Transform):
    r"""Map events onto a coarser pixel grid: :math:`x' = \lfloor f_x x \rfloor`,
    :math:`y' = \lfloor f_y y \rfloor` (float64 product, as tonic's ``Downsample``). No
    event is dropped; the pixels of a ``1/f x 1/f`` block add up in one. Time and
    polarity are unchanged.

    Args:
      factor: ``f`` in ``(0, 1]``, one number for every axis or one per axis ``(f_x,
        f_y)``: ``1 / 8`` maps 1280 x 720 to 160 x 90.
      size: Instead of ``factor``: the output size ``(W', H')``, with ``f_x = W' / W`` and
        ``f_y = H' / H`` (tonic's ``target_size``).

    The output sensor has ``floor(f (W - 1)) + 1`` columns (and rows likewise): one past
    the largest ``x'``.
    """

    factor: float | tuple | None = None
    size: tuple | None = None

    def __post_init__(self):
        _tuples(self, "factor", "size")
        if (self.factor is None) == (self.size is None):
            raise ValueError("Downsample takes exactly one of factor and size, got "
                             f"factor={self.factor!r} and size={self.size!r}")
        if self.factor is not None:
            _per_axis("factor", self.factor, _fraction)
        else:
            _per_axis("size", self.size, _extent)

    def _bind(self, sensor):
        n = len(sensor.sizes)
        if self.size is not None:
            size = _per_axis("size", self.size, _extent, n)
            if any(s > S for s, S in zip(size, sensor.sizes)):
                raise ArgumentError("size", self.size, f"fit the sensor {sensor.sizes} (a "
                                                       "grid no finer than the sensor's)")
            factors = tuple(np.float64(s) / np.float64(S) for s, S in zip(size, sensor.sizes))
        else:
            factors = tuple(np.float64(f) for f in _per_axis("factor", self.factor, _fraction, n))
        sizes = tuple(int(np.floor((S - 1) * f)) + 1 for S, f in zip(sensor.sizes, factors))

        def apply(events, fields):
            out = events.copy()
            for name, f in zip(fields, factors):
                out[name] = np.floor(events[name] * f)
            return out

        return _Sensor(sizes, sensor.polarities), apply


def _crop(sensor: _Sensor, origin: tuple, size: tuple) -> tuple:
    """``(output sensor, apply)`` of the crop to ``origin <= coordinates < origin + size``."""
    if any(o + s > S for o, s, S in zip(origin, size, sensor.sizes)):
        raise ArgumentError("size", size, f"fit the sensor {sensor.sizes} from the origin "
                                          f"{origin}")

    def apply(events, fields):
        inside = np.ones(len(events), bool)
        for name, o, s in zip(fields, origin, size):
            values = events[name]
            inside &= (values >= o) & (values < o + s)
        out = events[inside]
        for name, o in zip(fields, origin):
            if o:
                out[name] -= o
        return out

    return _Sensor(size, sensor.polarities), apply


@dataclasses.dataclass(frozen=True)
class Crop(Transform):
    """Keep the events inside the region ``origin <= (x, y) < origin + size`` and move
    them to the region's corner: ``x' = x - x0``, ``y' = y - y0`` (pixels).

    Args:
      origin: ``(x0, y0)``, the region's first column and row.
      size: ``(w, h)``, its width and height; the output sensor is ``(w, h, P)``.
    """

    origin: tuple
    size: tuple

    def __post_init__(self):
        _tuples(self, "origin", "size")
        for name in ("origin", "size"):
            if not isinstance(getattr(self, name), tuple):
                raise WrongTypeError(name, getattr(self, name),
                                     "be a tuple with one entry per coordinate, x first")
        _per_axis("origin", self.origin, lambda n, v: integer(n, v, sign="non-negative"))
        _per_axis("size", self.size, _extent, len(self.origin))

    def _bind(self, sensor):
        n = len(sensor.sizes)
        return _crop(sensor, _per_axis("origin", self.origin, integer, n),
                     _per_axis("size", self.size, _extent, n))


@dataclasses.dataclass(frozen=True)
class CenterCrop(Transform):
    """:class:`Crop` of the region of ``size`` at the centre of the sensor: its origin is
    ``((W - w) // 2, (H - h) // 2)``, as tonic's ``CenterCrop``.

    Args:
      size: ``(w, h)`` (x first, as in tonic's code), or one int for a square.
    """

    size: int | tuple

    def __post_init__(self):
        _tuples(self, "size")
        _per_axis("size", self.size, _extent)

    def _bind(self, sensor):
        size = _per_axis("size", self.size, _extent, len(sensor.sizes))
        if any(s > S for s, S in zip(size, sensor.sizes)):
            raise ArgumentError("size", self.size, f"fit the sensor {sensor.sizes}")
        return _crop(sensor, tuple((S - s) // 2 for S, s in zip(sensor.sizes, size)), size)


@dataclasses.dataclass(frozen=True)
class MergePolarities(Transform):
    """All events in one polarity channel: ``p' = 0`` (as tonic's ``MergePolarities``);
    the output sensor has ``P = 1``."""

    def _bind(self, sensor):
        def apply(events, fields):
            out = events.copy()
            out["p"] = 0
            return out

        return _Sensor(sensor.sizes, 1), apply


def _grouped(pixel: np.ndarray) -> tuple:
    """``(order, sorted pixels, first, last)``: the events sorted by pixel, each pixel's
    events in array order, and masks of each pixel's first and last event in that order."""
    order = np.argsort(pixel, kind="stable")
    ordered = pixel[order]
    change = ordered[1:] != ordered[:-1]
    return order, ordered, np.r_[True, change], np.r_[change, True]


def _times(events: np.ndarray) -> np.ndarray:
    t = events["t"]
    if not np.issubdtype(t.dtype, np.number) or np.issubdtype(t.dtype, np.complexfloating):
        raise TypeError(f"events field 't' must be numeric, got dtype {t.dtype}")
    return t.astype(np.float64)


@dataclasses.dataclass(frozen=True)
class RefractoryPeriod(Transform):
    r"""Drop every event that follows the previous event of its pixel within the period:
    event ``n`` of a pixel is kept when :math:`t_n - t_{n-1} > \tau_\mathrm{ref}`, where
    :math:`t_{n-1}` is that pixel's previous event, kept or not (tonic's rule). A pixel's
    first event is kept. Both polarities of a pixel count as one pixel.

    Args:
      period_us: :math:`\tau_\mathrm{ref}`, microseconds, non-negative.

    State: the time of each pixel's last event (float64, one per pixel of the input
    sensor); ``lookback_us = period_us``.
    """

    period_us: float

    def __post_init__(self):
        number("period_us", self.period_us, sign="non-negative")

    @property
    def lookback_us(self) -> float:
        return float(self.period_us)

    def _bind(self, sensor):
        last = np.full(sensor.pixels, -np.inf)
        period = float(self.period_us)

        def apply(events, fields):
            t = _times(events)
            order, pixel, first, final = _grouped(sensor.pixel(events, fields))
            times = t[order]
            previous = np.empty_like(times)
            previous[1:] = times[:-1]
            previous[first] = last[pixel[first]]
            keep = np.empty(len(events), bool)
            keep[order] = times - previous > period
            last[pixel[final]] = times[final]
            return events[keep]

        return sensor, apply


@dataclasses.dataclass(frozen=True)
class Denoise(Transform):
    r"""Drop isolated events: an event at pixel ``(x, y)`` and time ``t`` is kept when one
    of the four neighbouring pixels ``(x ± 1, y)``, ``(x, y ± 1)`` (two, ``x ± 1``, for
    events without ``y``) fired before it less than the window earlier: its last event
    :math:`t_n` satisfies :math:`t_n + \Delta > t` (tonic's ``Denoise`` rule). Events at
    the same time count in array order. Both polarities of a pixel count as one pixel.

    Args:
      window_us: :math:`\Delta`, microseconds, positive.

    State: the time of each pixel's last event (float64, one per pixel of the input
    sensor); ``lookback_us = window_us``.
    """

    window_us: float

    def __post_init__(self):
        number("window_us", self.window_us, sign="positive")

    @property
    def lookback_us(self) -> float:
        return float(self.window_us)

    def _bind(self, sensor):
        last = np.full(sensor.pixels, -np.inf)
        window = float(self.window_us)
        strides = np.cumprod((1,) + sensor.sizes[:-1])

        def apply(events, fields):
            n = len(events)
            t = _times(events)
            pixel = sensor.pixel(events, fields)
            order, ordered, _, final = _grouped(pixel)
            # each event's key (pixel, index in the array), increasing along ``order``
            keys = ordered * n + order
            keep = np.zeros(n, bool)
            index = np.arange(n)
            for axis, name in enumerate(fields):
                coordinate = events[name].astype(np.int64)
                for step in (-1, 1):
                    inside = (coordinate + step >= 0) & (coordinate + step < sensor.sizes[axis])
                    neighbour = pixel + step * strides[axis]
                    # the neighbour's last event before this one in the block, if any
                    at = np.searchsorted(keys, neighbour * n + index) - 1
                    found = (at >= 0) & (ordered[np.maximum(at, 0)] == neighbour)
                    before = np.where(found, t[order[np.maximum(at, 0)]],
                                      last[np.where(inside, neighbour, 0)])
                    keep |= inside & (before + window > t)
            last[ordered[final]] = t[order[final]]
            return events[keep]

        return sensor, apply


class Compose(Transform):
    """Transforms applied one after the other, each to the output of the one before (and
    to the sensor size it gives).

    Args:
      transforms: A sequence of :class:`Transform`.
    """

    def __init__(self, transforms: Sequence[Transform]):
        if isinstance(transforms, Transform) or not isinstance(transforms, (list, tuple)):
            raise WrongTypeError("transforms", transforms, "be a sequence of transforms")
        for i, t in enumerate(transforms):
            if not isinstance(t, Transform):
                raise WrongTypeError(f"transforms[{i}]", t, "be a transform of "
                                     "braintrace_conv.data.transforms (Downsample, Crop, ...)")
        self.transforms = tuple(transforms)

    @property
    def lookback_us(self) -> float:
        return float(sum(t.lookback_us for t in self.transforms))

    def bind(self, sensor_size) -> BoundTransform:
        stages, size = [], tuple(checked_sensor_size(sensor_size))
        for t in self.transforms:
            stages.append(t.bind(size))
            size = stages[-1].sensor_size

        def apply(events):
            for stage in stages:
                events = stage(events)
            return events if stages else events.copy()

        return BoundTransform(size, self.lookback_us, apply)

    def __repr__(self) -> str:
        return f"Compose({list(self.transforms)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Compose) and self.transforms == other.transforms

    def __hash__(self) -> int:
        return hash(self.transforms)


def compose(transforms) -> Compose | None:
    """The ``transforms`` argument of the data functions as one :class:`Compose`: ``None``
    (or an empty sequence) for none, one :class:`Transform`, or a sequence of them.

    Raises:
      TypeError: anything else, naming ``transforms`` (or its entry).
    """
    if transforms is None:
        return None
    if isinstance(transforms, Compose):
        return transforms if transforms.transforms else None
    if isinstance(transforms, Transform):
        return Compose([transforms])
    if not isinstance(transforms, (list, tuple)):
        raise WrongTypeError("transforms", transforms, "be a transform or a sequence of them "
                             "(braintrace_conv.data.transforms)")
    return Compose(list(transforms)) if transforms else None
