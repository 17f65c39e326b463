"""Long synthetic DVS recordings with labelled gesture segments, laid out as DVS Gesture's
raw data: one event file per recording and a segments CSV beside it.

DVS Gesture (Amir et al., CVPR 2017) ships each recording as ``user01_fluorescent.aedat``
with ``user01_fluorescent_labels.csv`` (``class,startTime_usec,endTime_usec``, classes 1 to
11, times on the recording's microsecond clock). :func:`gesture_recordings` writes the same
structure for recordings it simulates -- a bright "hand" (one or two Gaussian blobs) moving
in one of :data:`GESTURE_NAMES`' patterns for 1 to 3 s, absent for a gap between gestures,
seen by the DVS model of :func:`~braintrace_conv.data.dvs_events` at 1 ms resolution, with
background noise events everywhere -- so that everything that reads recorded gestures
(:func:`~braintrace_conv.data.find_recordings`, :class:`~braintrace_conv.data.EventStream`)
runs without a download.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np

from ..._validation import height_width, integer, number, positive_range
from .moving_bars import dvs_events
from ..files.read import CAMERA_EVENT_DTYPE
from ..streams.segments import Segments, write_segments
from ..streams.event_stream import Recording
from ..files.write import write_events

__all__ = ["GESTURE_NAMES", "gesture_recordings"]

#: The gestures, in label order: how the hand moves.
GESTURE_NAMES = ("clockwise", "counter-clockwise", "left-right", "up-down", "clap",
                 "diagonal")

_SUFFIXES = {"npy": ".npy", "aedat4": ".aedat4", "evt3": ".raw"}
_BLOCK_MS = 250
_BACKGROUND = 0.1     # intensity of the empty scene; the hand adds up to 1


@dataclasses.dataclass(frozen=True)
class _Motion:
    """One gesture's hand: centre and radius (pixels), angular frequency (rad/s), phase,
    blob width (pixels)."""

    label: int
    centre: np.ndarray
    radius: float
    omega: float
    phase: float
    sigma: float

    def blobs(self, t_s: np.ndarray) -> list[np.ndarray]:
        """Blob centres ``(len(t_s), 2)`` (row, column) at times ``t_s`` into the gesture."""
        angle = self.omega * t_s + self.phase
        c, s = self.radius * np.cos(angle), self.radius * np.sin(angle)
        zero = np.zeros_like(angle)
        offsets = {
            0: [(s, c)],                         # clockwise on screen (rows grow downward)
            1: [(-s, c)],
            2: [(zero, s)],
            3: [(s, zero)],
            4: [(zero, np.abs(c) + 1.5 * self.sigma), (zero, -np.abs(c) - 1.5 * self.sigma)],
            5: [(s, s)],
        }[self.label]
        return [self.centre + np.stack(o, axis=-1) for o in offsets]


def _schedule(rng, duration_us: int, segment_s, gap_s, num_classes: int):
    """Segments ``[start, end)`` (µs from the recording's start) separated by gaps."""
    labels, starts, ends = [], [], []
    t = int(rng.uniform(*gap_s) * 1e6)
    while True:
        length = int(rng.uniform(*segment_s) * 1e6)
        if t + length > duration_us:
            break
        labels.append(int(rng.integers(num_classes)))
        starts.append(t)
        ends.append(t + length)
        t += length + int(rng.uniform(*gap_s) * 1e6)
    return labels, starts, ends


def _motion(rng, label: int, size: tuple) -> _Motion:
    extent = np.array(size, np.float64)
    return _Motion(label, extent / 2 + rng.uniform(-0.08, 0.08, 2) * extent,
                   float(rng.uniform(0.2, 0.3) * extent.min()),
                   float(2 * np.pi * rng.uniform(0.8, 1.6)), float(rng.uniform(0, 2 * np.pi)),
                   float(rng.uniform(0.06, 0.09) * extent.min()))


def _intensity(motions, segments, t_ms: np.ndarray, size: tuple) -> np.ndarray:
    """Log intensity ``(len(t_ms), H, W)`` of the scene at times ``t_ms`` (ms)."""
    rows, cols = np.arange(size[0])[:, None], np.arange(size[1])[None, :]
    image = np.full((len(t_ms), *size), _BACKGROUND)
    index = segments.at(t_ms * 1000.0)
    for i in np.unique(index[index >= 0]):
        when = index == i
        t_s = (t_ms[when] * 1000.0 - segments.start_us[i]) / 1e6
        motion = motions[i]
        for centre in motion.blobs(t_s):
            d2 = ((rows - centre[:, 0, None, None]) ** 2 + (cols - centre[:, 1, None, None]) ** 2)
            image[when] += np.exp(-d2 / (2 * motion.sigma ** 2))
    return np.log(image)


def _events(rng, motions, segments, duration_ms: int, size: tuple, threshold: float,
            noise_hz: float) -> np.ndarray:
    """Events of the scene (DVS model at 1 ms) plus background noise, in time order."""
    parts = []
    for start in range(0, duration_ms, _BLOCK_MS):
        t_ms = np.arange(start, min(start + _BLOCK_MS, duration_ms) + 1, dtype=np.float64)
        counts = dvs_events(_intensity(motions, segments, t_ms, size)[None],
                            threshold=threshold, substeps=1)[0].astype(np.int64)
        step, polarity, row, col = np.nonzero(counts)
        repeat = counts[step, polarity, row, col]
        block = np.zeros(int(repeat.sum()), CAMERA_EVENT_DTYPE)
        block["t"] = np.repeat((start + step) * 1000, repeat) + rng.integers(0, 1000, len(block))
        block["y"], block["x"] = np.repeat(row, repeat), np.repeat(col, repeat)
        block["p"] = np.repeat(polarity == 0, repeat)
        parts.append(block)
    n_noise = rng.poisson(noise_hz * size[0] * size[1] * duration_ms / 1000)
    noise = np.zeros(n_noise, CAMERA_EVENT_DTYPE)
    noise["t"] = rng.integers(0, duration_ms * 1000, n_noise)
    noise["y"], noise["x"] = rng.integers(0, size[0], n_noise), rng.integers(0, size[1], n_noise)
    noise["p"] = rng.integers(0, 2, n_noise)
    events = np.concatenate(parts + [noise])
    return events[np.argsort(events["t"], kind="stable")]


def gesture_recordings(
    directory,
    n_recordings: int = 2,
    *,
    duration_s: float = 20.0,
    size: tuple[int, int] = (32, 32),
    num_classes: int = len(GESTURE_NAMES),
    segment_s: tuple[float, float] = (1.0, 3.0),
    gap_s: tuple[float, float] = (0.5, 1.5),
    threshold: float = 0.25,
    noise_hz: float = 0.2,
    formats: tuple[str, ...] | None = None,
    seed: int = 0,
) -> list[Recording]:
    """Write ``n_recordings`` long recordings of gestures in DVS Gesture's raw layout.

    Recording ``i`` is ``user{i+1:02d}_synthetic`` + suffix, beside
    ``user{i+1:02d}_synthetic_labels.csv`` (``class,startTime_usec,endTime_usec``, classes
    numbered from 1). Gestures last ``segment_s`` seconds (uniform) and are separated by
    ``gap_s`` seconds without a hand; each moves the hand in one of the first
    ``num_classes`` patterns of :data:`GESTURE_NAMES` at 0.8 to 1.6 cycles per second,
    with random centre, radius, phase and hand width. A pixel emits ``floor(|d log I| /
    threshold)`` events per millisecond (:func:`dvs_events`), timestamped uniformly within
    that millisecond; every pixel also emits background noise at ``noise_hz`` (random
    polarity). Timestamps start at a random offset below 5 s, as a camera's clock does.

    Args:
      directory: Folder to write into (created if needed).
      n_recordings: Number of recordings.
      duration_s: Length of each recording, seconds.
      size: Sensor ``(H, W)``, pixels, at least 8 x 8.
      num_classes: Number of gestures used, 1 to 6.
      segment_s: ``(shortest, longest)`` gesture, seconds.
      gap_s: ``(shortest, longest)`` gap before each gesture, seconds.
      threshold: DVS contrast threshold, natural-log units.
      noise_hz: Background events per pixel and second.
      formats: Files to write per recording, from ``'npy'``, ``'aedat4'``, ``'evt3'``
        (``.raw``); by default ``.npy`` and, when ``faery`` is installed, the other two.
      seed: Seed; equal arguments write identical files.

    Returns:
      One :class:`Recording` per ``.npy`` file (or per first format written), with its
      segments (labels from 0).
    """
    n_recordings = integer("n_recordings", n_recordings, sign="positive")
    duration_us = int(number("duration_s", duration_s, sign="positive") * 1e6)
    size = height_width("size", size)
    if min(size) < 8:
        raise ValueError(f"size must be at least 8 x 8 pixels, got {size}")
    num_classes = integer("num_classes", num_classes, sign="positive")
    if num_classes > len(GESTURE_NAMES):
        raise ValueError(f"num_classes must be at most {len(GESTURE_NAMES)}, got {num_classes}")
    segment_s, gap_s = positive_range("segment_s", segment_s), positive_range("gap_s", gap_s)
    threshold = number("threshold", threshold, sign="positive")
    noise_hz = number("noise_hz", noise_hz, sign="non-negative")
    if duration_us < (gap_s[1] + segment_s[1]) * 1e6:
        raise ValueError(f"duration_s={duration_s} is too short: a recording must hold the "
                         f"longest gap and gesture, {gap_s[1]} + {segment_s[1]} s")
    formats = _formats(formats)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    recordings = []
    for i, rng in enumerate(np.random.default_rng(seed).spawn(n_recordings)):
        labels, starts, ends = _schedule(rng, duration_us, segment_s, gap_s, num_classes)
        segments = Segments(np.array(labels), np.array(starts), np.array(ends))
        motions = [_motion(rng, label, size) for label in labels]
        events = _events(rng, motions, segments, duration_us // 1000, size, threshold,
                         noise_hz)
        clock = int(rng.integers(0, 5_000_000))
        events["t"] += clock
        stem = directory / f"user{i + 1:02d}_synthetic"
        csv_path = stem.with_name(stem.name + "_labels.csv")
        write_segments(csv_path, Segments(segments.labels, segments.start_us + clock,
                                          segments.end_us + clock))
        for format in formats:
            write_events(stem.with_suffix(_SUFFIXES[format]), events,
                         sensor_size=(size[1], size[0]), format=format)
        recordings.append(Recording(stem.with_suffix(_SUFFIXES[formats[0]]), csv_path))
    return recordings


def _formats(formats) -> tuple[str, ...]:
    if formats is None:
        return tuple(_SUFFIXES) if importlib.util.find_spec("faery") else ("npy",)
    formats = tuple(formats)
    unknown = [f for f in formats if f not in _SUFFIXES]
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {tuple(_SUFFIXES)}, got "
                         f"{formats!r}")
    return formats
