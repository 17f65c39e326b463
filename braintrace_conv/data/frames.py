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
"""

from __future__ import annotations

import numpy as np

from ._binning import Binning

__all__ = ["events_to_frames"]


def events_to_frames(
    events: np.ndarray,
    *,
    sensor_size: tuple[int, ...],
    n_time_bins: int | None = None,
    time_window_us: float | None = None,
    event_count: int | None = None,
    t_start_us: float | None = None,
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

    Returns:
      float32 event counts of shape ``(T, P, *spatial)`` with ``spatial``
      the sensor extents in reverse order: ``(T, P, X)``, ``(T, P, Y, X)``
      or ``(T, P, Z, Y, X)``. With no events, ``T = n_time_bins`` zero
      frames, or ``T = 0`` without ``n_time_bins``.

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
    )(events)
