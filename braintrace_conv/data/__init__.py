"""Event-stream datasets for recurrent spiking conv nets.

Layout
------
One sample is a float32 array of shape ``(T, 2, H, W)``: ``T`` time steps,
two polarity channels (0 = ON, brightness increase; 1 = OFF, brightness
decrease), ``H`` rows and ``W`` columns. Entries are event counts per pixel,
channel and time step, usually 0 or 1. :class:`EventDataset` stores ``N``
samples as ``(N, T, 2, H, W)`` with int32 labels ``(N,)`` and yields
time-major batches ``xs`` of shape ``(T, B, 2, H, W)`` with labels ``(B,)``.

Sources
-------
:func:`moving_bars`
    Synthetic DVS recordings of bars and dot clusters moving in one of eight
    directions; the label is the direction and no single frame reveals it.
:func:`digits_saccades`
    scikit-learn's 8x8 digits seen by a simulated DVS camera making three
    saccades (N-MNIST style).
:func:`events_to_frames`, :func:`from_tonic`, :func:`from_directory`
    Binning of recorded events in tonic's structured-array format.
"""

from .dataset import EventDataset
from .digits import digits_saccades, saccade_path
from .event_files import events_to_frames, from_directory, from_tonic
from .moving_bars import (
    DIRECTION_NAMES,
    MotionScenes,
    dvs_events,
    moving_bars,
    render_scenes,
    sample_scenes,
)

__all__ = [
    "DIRECTION_NAMES",
    "EventDataset",
    "MotionScenes",
    "digits_saccades",
    "dvs_events",
    "events_to_frames",
    "from_directory",
    "from_tonic",
    "moving_bars",
    "render_scenes",
    "sample_scenes",
    "saccade_path",
]
