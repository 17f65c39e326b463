r"""Endless event streams: long recordings read in chunks and binned on the fly, with
targets from labelled time segments, and a position that resumes them exactly.

A stream is never cut into samples. :class:`EventStream` reads ``B`` parallel streams of
events from long recordings, bins each into frames of ``dt_us`` microseconds as it goes and
hands out chunks of ``K = chunk_steps`` steps,

* ``frames``: float32 event counts ``(K, B, P, H, W)``, time-major, polarity channels
  first (channel 0 ON, 1 OFF), the layout of the rest of :mod:`braintrace_conv.data`;
* ``targets = (labels, weights)``: int32 ``(K, B)`` and float32 ``(K, B)``. A step is
  labelled when its start time lies in a segment ``[start, end)`` of its recording
  (:class:`~braintrace_conv.data.Segments`); there ``labels`` is the segment's label and
  ``weights`` is 1. Outside every segment the step has no target: ``weights`` is 0 and
  ``labels`` 0 (a valid class index, so a loss stays finite). The loss of step ``t`` is
  then :math:`\frac1B \sum_b w_{t,b}\, \mathrm{CE}(s_{t,b}, y_{t,b})`, which is
  :func:`~braintrace_conv.training.loss.weighted_cross_entropy`'s when ``w`` is the
  same for every stream.

Step ``k`` of a recording covers ``[t0 + k dt, t0 + (k + 1) dt)``, where ``t0`` is the
recording's start (its first event, or its first segment's start if earlier, or the
``t_start_us`` given); a recording lasts until its last event or the end of its last
segment, whichever is later. Chunks always end on a step boundary, so no event of a
partly binned step is ever held over: the position of a stream is the recording it is in,
the index of the first event not yet binned and the step it has reached.

Parallel streams
----------------
* ``batch_size=None``: one stream per recording; a stream that ends before the others
  gives empty frames with zero weights until the last one ends (the final chunk is cut
  there).
* ``batch_size=B``: the recordings, played one after the other, form one playlist of
  ``S`` steps; stream ``b`` starts at step ``floor(b S / B)`` and wraps around to the
  start, so every stream plays all ``S`` steps once, from a different offset.

With ``loop=True`` streams never end (a stream of its own recording restarts it; a
playlist stream keeps wrapping). The hidden state of a network is meant to carry across
recording boundaries, as across chunks.

Transforms
----------
With ``transforms`` (:mod:`~braintrace_conv.data.transforms`: downsample, crop,
refractory period, denoise, polarity merge), every block of events read is transformed
before it is counted into the chunk, so frames are built only at the transformed size
(a 1280 x 720 camera streamed at 160 x 90 builds 160 x 90 frames). The state of the
stateful ones runs on across blocks and chunks as if each recording were transformed
whole.

Resuming
--------
:meth:`EventStream.position` is plain JSON-able data; :meth:`EventStream.seek` on a stream
built with the same arguments continues with exactly the chunks an uninterrupted iteration
would have given, bit for bit. The position holds no state of the transforms: where a
stream starts or resumes in the middle of a recording, the events of the transforms'
look-back window before that step are run through them first, which rebuilds their state
exactly. Memory does not grow with the steps seen: a stream holds one block of events per
recording it is in, the transforms' state (a timestamp per pixel of the camera for each
stateful transform) and the chunk it builds, nothing of the past.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..._validation import integer
from ..binning import Binning
from ..files.read import EventReader
from ..transforms import BoundTransform, compose
from .segments import Segments, read_segments

__all__ = ["EventStream", "Recording", "find_recordings"]

_POSITION_FORMAT = "braintrace_conv.EventStream/1"


class Recording:
    """An event file and how its steps are labelled.

    Args:
      events: The event file (any format of :func:`~braintrace_conv.data.read_events`).
      labels: ``None`` (no targets), a segments CSV file
        (:func:`~braintrace_conv.data.read_segments`), :class:`Segments`, or per-step
        labels: int ``(S,)``, one per step of ``dt_us`` from the recording's start,
        ``-1`` where the step has no target (``S`` must cover every step with events).
      t_start_us: Start of the recording's first step, microseconds; by default its first
        event (or the start of its first segment, if earlier). It may not lie after the
        first event.
      overlaps: How a segments CSV treats overlapping rows
        (:func:`~braintrace_conv.data.read_segments`).
    """

    def __init__(self, events, labels=None, *, t_start_us: int | None = None,
                 overlaps: str = "error"):
        self.events = Path(events)
        self.segments: Segments | None = None
        self.step_labels: np.ndarray | None = None
        if isinstance(labels, (str, os.PathLike)):
            self.segments = read_segments(labels, overlaps=overlaps)
        elif isinstance(labels, Segments):
            self.segments = labels
        elif labels is not None:
            step_labels = np.asarray(labels)
            if step_labels.ndim != 1 or not np.issubdtype(step_labels.dtype, np.integer):
                raise ValueError(f"labels of {self.events} must be a segments file, Segments "
                                 "or per-step int labels of shape (S,), got "
                                 f"{step_labels.dtype} of shape {step_labels.shape}")
            if step_labels.size and step_labels.min() < -1:
                i = int(np.argmax(step_labels < -1))
                raise ValueError(f"per-step labels of {self.events}: step {i} has label "
                                 f"{step_labels[i]}; expected a class index or -1 (no target)")
            self.step_labels = step_labels.astype(np.int32)
        self.t_start_us = None if t_start_us is None else integer(
            "t_start_us", t_start_us, sign="non-negative")

    def __repr__(self) -> str:
        labels = ("segments" if self.segments is not None else
                  "step labels" if self.step_labels is not None else "no labels")
        return f"Recording({str(self.events)!r}, {labels})"


def find_recordings(directory, *, suffix: str = ".npy", overlaps: str = "error"
                    ) -> list[Recording]:
    """The recordings of a directory laid out as DVS Gesture's raw data: every event file
    ``<name><suffix>`` beside its segments ``<name>_labels.csv``, in sorted order.

    Raises:
      ValueError: no event file with ``suffix`` in ``directory``, or one without its
        ``_labels.csv``.
    """
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir()
                   if p.suffix.lower() == suffix.lower() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"{directory} holds no {suffix} event files")
    missing = [p.name for p in files if not p.with_name(p.stem + "_labels.csv").is_file()]
    if missing:
        raise ValueError(f"{directory}: {len(missing)} event file(s) have no segments file "
                         f"beside them, e.g. {missing[0]} without "
                         f"{Path(missing[0]).stem}_labels.csv")
    return [Recording(p, p.with_name(p.stem + "_labels.csv"), overlaps=overlaps)
            for p in files]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A recording as the stream plays it: file, clock origin, number of steps, labels."""

    path: Path
    origin_us: int
    num_steps: int
    segments: Segments | None
    step_labels: np.ndarray | None
    first_segment: int            # stream-wide index of its first segment

    def targets(self, step: int, span: int, dt_us: int):
        """Labels, weights and stream-wide segment indices of steps ``step..step+span-1``."""
        segment = np.full(span, -1, np.int64)
        if self.segments is not None:
            index = self.segments.at(self.origin_us + (step + np.arange(span)) * dt_us)
            inside = index >= 0
            labels = np.where(inside, self.segments.labels[index], 0)
            segment[inside] = self.first_segment + index[inside]
        elif self.step_labels is not None:
            labels = self.step_labels[step:step + span]
            inside = labels >= 0
            labels = np.where(inside, labels, 0)
        else:
            inside, labels = np.zeros(span, bool), np.zeros(span, np.int32)
        return labels, inside.astype(np.float32), segment


@dataclasses.dataclass
class _Live:
    """The open file of a stream: its remaining blocks, the events read but not yet
    binned, and the transforms with their state (``None`` without transforms)."""

    blocks: Iterator
    carry: np.ndarray
    transforms: BoundTransform | None


@dataclasses.dataclass
class _Cursor:
    """Where one stream is: recording index, next event, step in it, steps played."""

    recording: int
    event: int
    step: int
    steps_done: int


def _plan(recording: Recording, reader: EventReader, dt_us: int, num_classes: int,
          first_segment: int) -> _Plan:
    extent = reader.time_range()
    if extent is None:
        raise ValueError(f"{recording.events} holds no events")
    first, last = int(extent[0]), int(np.floor(extent[1]))
    segments = recording.segments
    if segments is not None:
        segments.check_labels(num_classes)
        segments.check_recording(first, last, recording.events)
    if recording.t_start_us is not None:
        if recording.t_start_us > first:
            raise ValueError(f"t_start_us={recording.t_start_us} of {recording.events} lies "
                             f"after its first event ({first} us)")
        origin = recording.t_start_us
    elif segments is not None and len(segments):
        origin = min(first, int(np.floor(segments.start_us[0])))
    else:
        origin = first
    num_steps = (last - origin) // dt_us + 1
    if segments is not None and len(segments):
        num_steps = max(num_steps, int(np.ceil((segments.end_us[-1] - origin) / dt_us)))
    if recording.step_labels is not None:
        labels = recording.step_labels
        if len(labels) < num_steps:
            raise ValueError(f"per-step labels of {recording.events}: {len(labels)} labels "
                             f"for {num_steps} steps of {dt_us} us (its events span "
                             f"{origin} to {last} us)")
        if labels.max(initial=-1) >= num_classes:
            i = int(np.argmax(labels >= num_classes))
            raise ValueError(f"per-step labels of {recording.events}: step {i} has label "
                             f"{labels[i]}, out of range for {num_classes} classes")
        num_steps = len(labels)
    return _Plan(recording.events, origin, int(num_steps), segments, recording.step_labels,
                 first_segment)


class EventStream:
    """``B`` parallel streams of long recordings as chunks of ``K`` binned steps with their
    targets (module docstring).

    Args:
      recordings: :class:`Recording` objects (or event-file paths, unlabelled).
      sensor_size: ``(W, H, P)`` in tonic's order (``P`` = 1 or 2 polarity channels);
        frames are ``(P, H, W)``.
      dt_us: Step length, whole microseconds.
      chunk_steps: Steps ``K`` per chunk (the learner's ``advance`` length).
      num_classes: Number of classes; every label must be below it.
      batch_size: ``None``: one stream per recording; ``B``: the recordings as one playlist
        played by ``B`` streams from evenly spaced offsets.
      loop: Never end (module docstring).
      block_events: Events read from a file at a time: what a stream holds besides its
        chunk is one block per stream and the temporaries of transforming and binning it
        (about 50 bytes per event): with the default, a chunk of 0.5 s of a 1280 x 720
        camera streamed at 160 x 90 (5.5 MiB) is built with 7% more memory than it holds
        (``benchmarks/camera.py``).
      transforms: Event transforms applied to every block of events before it is binned
        (:mod:`~braintrace_conv.data.transforms`: a transform or a sequence of them);
        ``sensor_size`` is the recordings', the frames have the transformed size. Their
        state (refractory, denoise) runs on across blocks and chunks of a recording, as if
        it were transformed whole, and is rebuilt where a stream starts or resumes
        (module docstring of :mod:`~braintrace_conv.data.transforms`).

    Yields:
      ``(frames, (labels, weights))``: float32 ``(K, B, P, H, W)``, int32 ``(K, B)``,
      float32 ``(K, B)``; the last chunk may be shorter when the streams end.

    Attributes:
      batch_size: ``B``.
      sensor_size: The recordings' ``(W, H, P)``.
      frame_shape: ``(P, H, W)`` of the frames (after ``transforms``).
      num_steps: Steps each stream plays before it ends (the longest, for one stream per
        recording); ``None`` with ``loop=True``.
      last_segments: int64 ``(K, B)``: the segment (numbered across all recordings in
        order) that each step of the chunk last yielded lies in, ``-1`` outside every
        segment, for metrics read per segment.

    Raises:
      ValueError: an empty recording, a label out of range, a segment that does not
        overlap the span of its recording's events
        (:meth:`~braintrace_conv.data.Segments.check_recording`), per-step labels that do
        not cover the recording, a bad argument; events that are wrong raise
        :class:`~braintrace_conv.data.EventFileError` naming the file and the event.

    Examples:
      Two generated recordings of 5 s with labelled gestures, one stream each:

      >>> import tempfile
      >>> from braintrace_conv.data import EventStream, gesture_recordings
      >>> recordings = gesture_recordings(tempfile.mkdtemp(), 2, duration_s=5.0, size=(8, 8),
      ...                                 formats=('npy',))      # events + segments CSV each
      >>> stream = EventStream(recordings, sensor_size=(8, 8, 2), dt_us=1000, chunk_steps=100,
      ...                      num_classes=6)
      >>> frames, (labels, weights) = next(iter(stream))         # the first chunk
      >>> frames.shape, labels.shape, weights.shape              # (K, B, P, H, W), (K, B), (K, B)
      ((100, 2, 2, 8, 8), (100, 2), (100, 2))
    """

    def __init__(self, recordings: Sequence, *, sensor_size: tuple, dt_us: int,
                 chunk_steps: int, num_classes: int, batch_size: int | None = None,
                 loop: bool = False, block_events: int = 1 << 13, transforms=None):
        recordings = [r if isinstance(r, Recording) else Recording(r) for r in recordings]
        if not recordings:
            raise ValueError("recordings is empty; give at least one Recording")
        self.dt_us = integer("dt_us", dt_us, sign="positive")
        self.chunk_steps = integer("chunk_steps", chunk_steps, sign="positive")
        self.num_classes = integer("num_classes", num_classes, sign="positive")
        # the binning's own check of sensor_size (each chunk builds its binning anew)
        self.sensor_size = Binning(sensor_size=sensor_size, n_time_bins=1).sensor_size
        if len(self.sensor_size) != 3:
            raise ValueError(f"sensor_size must be (W, H, P) for a camera, got {sensor_size!r}")
        self.transforms = compose(transforms)
        self._frame_sensor = (self.sensor_size if self.transforms is None else
                              self.transforms.output_size(self.sensor_size))
        self.frame_shape = tuple(self._frame_sensor[::-1])
        self.loop = bool(loop)
        self._block = integer("block_events", block_events, sign="positive")
        self._plans = self._make_plans(recordings)
        self._playlists, self._starts, self._totals = self._make_streams(batch_size)
        self.batch_size = len(self._playlists)
        self.num_steps = None if self.loop else max(self._totals)
        self.last_segments = np.zeros((0, self.batch_size), np.int64)
        self.seek(None)

    def _reader(self, path: Path) -> EventReader:
        return EventReader(path, sensor_size=self.sensor_size, block_events=self._block)

    def _make_plans(self, recordings) -> list[_Plan]:
        plans, first_segment = [], 0
        for recording in recordings:
            plans.append(_plan(recording, self._reader(recording.events), self.dt_us,
                               self.num_classes, first_segment))
            first_segment += len(recording.segments or ())
        return plans

    def _make_streams(self, batch_size):
        steps = [p.num_steps for p in self._plans]
        if batch_size is None:
            return [[r] for r in range(len(steps))], [0] * len(steps), steps
        batch_size = integer("batch_size", batch_size, sign="positive")
        total = sum(steps)
        if batch_size > total:
            raise ValueError(f"batch_size={batch_size} streams need at least as many steps, "
                             f"but the recordings hold {total} steps of {self.dt_us} us")
        everything = list(range(len(steps)))
        return ([everything] * batch_size, [b * total // batch_size for b in range(batch_size)],
                [total] * batch_size)

    def labelled_chunks(self, max_steps: int | None = None) -> int:
        """The chunks, played from the start until ``max_steps`` steps per stream (``None``:
        until the streams end), in which some stream has a labelled step: the updates
        :meth:`Trainer.fit_stream <braintrace_conv.training.Trainer.fit_stream>` makes, for
        planning a learning-rate schedule over them. Reads the labels only, no events, and
        leaves the position as it is.

        Raises:
          ValueError: an endless stream (``loop=True``) without ``max_steps``.
        """
        if max_steps is None and self.loop:
            raise ValueError("max_steps must be given for an endless stream (loop=True): "
                             "its chunks never end")
        K = self.chunk_steps
        # every stream plays until the longest ends, or to the chunk that reaches max_steps
        played = max(self._totals) if max_steps is None else \
            -(-integer("max_steps", max_steps, sign="positive") // K) * K
        if not self.loop:
            played = min(played, max(self._totals))
        chunks = -(-played // K)
        labelled = np.zeros(chunks * K, bool)
        for b, playlist in enumerate(self._playlists):
            steps = played if self.loop else min(played, self._totals[b])
            index, step = self._in_playlist(b, self._starts[b])
            done = 0
            while done < steps:
                plan = self._plans[playlist[index]]
                span = min(steps - done, plan.num_steps - step)
                labelled[done:done + span] |= plan.targets(step, span, self.dt_us)[1] > 0
                done, step, index = done + span, 0, (index + 1) % len(playlist)
        return int(labelled.reshape(chunks, K).any(axis=1).sum())

    # ------------------------------------------------------------------ position
    def _config(self) -> dict:
        config = {"dt_us": self.dt_us, "chunk_steps": self.chunk_steps,
                  "sensor_size": list(self.sensor_size), "batch_size": self.batch_size,
                  "loop": self.loop, "starts": list(self._starts),
                  "recordings": [[p.path.name, p.path.stat().st_size, p.num_steps]
                                 for p in self._plans]}
        if self.transforms is not None:     # absent without: positions saved before resume
            config["transforms"] = [repr(t) for t in self.transforms.transforms]
        return config

    def position(self) -> dict:
        """Where the streams are, after the last chunk yielded: JSON-able data for
        :meth:`seek`. Per stream: ``recording`` (index into ``recordings``), ``event``
        (first event not yet binned), ``step`` (steps of that recording already played)
        and ``steps_done``; plus the number of chunks yielded and the stream's arguments,
        which :meth:`seek` checks."""
        return {"format": _POSITION_FORMAT, "config": self._config(), "chunks": self._chunks,
                "streams": [dataclasses.asdict(c) for c in self._cursors]}

    def seek(self, position: dict | None) -> None:
        """Continue from ``position`` (from :meth:`position` of a stream built with the same
        arguments), or from the start with ``None``."""
        self._live = [None] * self.batch_size
        if position is None:
            self._chunks = 0
            self._cursors = [self._cursor_at(b, self._starts[b]) for b in range(self.batch_size)]
            return
        if not isinstance(position, dict) or position.get("format") != _POSITION_FORMAT:
            raise ValueError(f"position must be a dict from EventStream.position(), got "
                             f"{type(position).__name__}")
        config = self._config()
        for key, value in position["config"].items():
            if config.get(key) != value:
                raise ValueError(f"position was saved for a stream with {key}={value!r}, "
                                 f"but this stream has {key}={config.get(key)!r}")
        self._chunks = int(position["chunks"])
        self._cursors = [_Cursor(**{k: int(v) for k, v in c.items()})
                         for c in position["streams"]]

    def _in_playlist(self, b: int, step: int) -> tuple[int, int]:
        """``(index into stream b's playlist, step in that recording)`` of step ``step`` of
        the playlist."""
        for index, r in enumerate(self._playlists[b]):
            if step < self._plans[r].num_steps:
                return index, step
            step -= self._plans[r].num_steps
        raise AssertionError("a start step lies beyond the playlist")

    def _cursor_at(self, b: int, step: int) -> _Cursor:
        """Stream ``b`` at step ``step`` of its playlist."""
        index, step = self._in_playlist(b, step)
        r = self._playlists[b][index]
        plan = self._plans[r]
        start = plan.origin_us + step * self.dt_us
        return _Cursor(r, self._reader(plan.path).seek_time(start), step, 0)

    # ------------------------------------------------------------------ chunks
    def _remaining(self, b: int) -> int | None:
        return None if self.loop else self._totals[b] - self._cursors[b].steps_done

    def __iter__(self) -> Iterator[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
        """Chunks from the current position on (one iteration at a time per stream)."""
        while True:
            steps = self.chunk_steps if self.loop else min(
                self.chunk_steps, max(self._remaining(b) for b in range(self.batch_size)))
            if steps == 0:
                return
            yield self._chunk(steps)

    def _chunk(self, steps: int):
        frames = np.zeros((steps, self.batch_size, *self.frame_shape), np.float32)
        labels = np.zeros((steps, self.batch_size), np.int32)
        weights = np.zeros((steps, self.batch_size), np.float32)
        segments = np.full((steps, self.batch_size), -1, np.int64)
        for b in range(self.batch_size):
            self._fill(b, frames[:, b], labels[:, b], weights[:, b], segments[:, b])
        self._chunks += 1
        self.last_segments = segments
        return frames, (labels, weights)

    def _fill(self, b: int, frames, labels, weights, segments) -> None:
        """Fill ``len(frames)`` steps of stream ``b`` (fewer when it ends: the rest stays
        empty with zero weights)."""
        cursor, filled = self._cursors[b], 0
        while filled < len(frames) and (self.loop or self._remaining(b)):
            plan = self._plans[cursor.recording]
            span = min(len(frames) - filled, plan.num_steps - cursor.step)
            if not self.loop:
                span = min(span, self._remaining(b))
            t0 = plan.origin_us + cursor.step * self.dt_us
            part = slice(filled, filled + span)
            binning = Binning(sensor_size=self._frame_sensor, time_window_us=self.dt_us,
                              n_time_bins=span, t_start_us=t0)
            for events in self._take(b, t0 + span * self.dt_us):
                transforms = self._live[b].transforms
                self._bin(plan, binning, frames[part],
                          events if transforms is None else transforms(events),
                          cursor.event, len(events))
                cursor.event += len(events)
            labels[part], weights[part], segments[part] = plan.targets(cursor.step, span,
                                                                       self.dt_us)
            cursor.step += span
            cursor.steps_done += span
            filled += span
            if cursor.step == plan.num_steps:
                self._next_recording(b)

    def _next_recording(self, b: int) -> None:
        playlist, cursor = self._playlists[b], self._cursors[b]
        following = playlist[(playlist.index(cursor.recording) + 1) % len(playlist)]
        cursor.recording, cursor.event, cursor.step = following, 0, 0
        self._live[b] = None

    def _open(self, b: int) -> _Live:
        """Stream ``b``'s file, read from its cursor on, with the transforms' state of a
        stream that played the recording from its start: the events of the transforms'
        look-back window before the cursor's step are run through them first."""
        cursor = self._cursors[b]
        plan = self._plans[cursor.recording]
        reader = self._reader(plan.path)
        transforms = (None if self.transforms is None else
                      self.transforms.bind(self.sensor_size))
        start = cursor.event
        if transforms is not None and transforms.lookback_us and cursor.event:
            start = min(cursor.event, reader.seek_time(
                plan.origin_us + cursor.step * self.dt_us - transforms.lookback_us))
        blocks = (events for _, events in reader.blocks(start))
        carry = np.zeros(0, reader.dtype)
        while start < cursor.event:       # the window before the cursor: state only
            events = next(blocks)
            before = min(len(events), cursor.event - start)
            transforms(events[:before])
            carry, start = events[before:], start + before
        return _Live(blocks, carry, transforms)

    def _take(self, b: int, t_end_us: int) -> Iterator[np.ndarray]:
        """Stream ``b``'s next events before ``t_end_us``, in parts of at most a block;
        later ones stay for the next call (at most one block of them)."""
        if self._live[b] is None:
            self._live[b] = self._open(b)
        live = self._live[b]
        while True:
            if not len(live.carry):
                following = next(live.blocks, None)
                if following is None:
                    return
                live.carry = following
            cut = int(np.searchsorted(live.carry["t"], t_end_us, side="left"))
            part, live.carry = live.carry[:cut], live.carry[cut:]
            if len(part):
                yield part
            if len(live.carry):
                return

    def _bin(self, plan: _Plan, binning: Binning, frames: np.ndarray, events: np.ndarray,
             first: int, count: int) -> None:
        """Add ``events`` to ``frames``: those the transforms kept of the ``count`` events
        from event ``first`` of the file on."""
        try:
            binning.add_to(frames, events)
        except (ValueError, TypeError) as err:
            kind = TypeError if isinstance(err, TypeError) else ValueError
            raise kind(f"{plan.path}, events {first} to {first + count - 1}: "
                       f"{err}") from None
