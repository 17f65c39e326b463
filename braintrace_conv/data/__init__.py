"""Event-stream datasets for recurrent spiking conv nets.

Layout
------
One sample is a float32 array of event counts of shape ``(T, *frame_shape)``:
``T`` time steps, then one frame with the polarity channels first --
``(P, X)`` for audio-like sensors (SHD: ``(1, 700)``), ``(2, H, W)`` for DVS
cameras (channel 0 = ON, brightness increase; 1 = OFF). Datasets yield
time-major batches ``xs`` of shape ``(T, B, *frame_shape)`` with int32
labels ``(B,)``: :class:`EventDataset` from frames held in memory,
:class:`StreamingEventDataset` from recordings binned on demand.

Sources
-------
:func:`moving_bars`
    Synthetic DVS recordings of bars and dot clusters moving in one of eight
    directions; the label is the direction and no single frame reveals it.
:func:`delayed_bars`
    The same clips followed by blank frames: the direction must be held
    across the delay (a memory task for recurrent networks).
:func:`digits_saccades`
    scikit-learn's 8x8 digits seen by a simulated DVS camera making three
    saccades (N-MNIST style).
:func:`synthetic_shd`
    Spoken-word spike trains over 700 cochlear channels (SHD-like), with
    the raw events in tonic's format.
:func:`events_to_frames`
    Binning of recorded events in tonic's structured-array format, any
    spatial rank, by time window, number of bins or event count.
:mod:`~braintrace_conv.data.transforms`
    Event transforms applied before binning, in datasets and streams alike: downsample,
    crop, refractory period, denoise, polarity merge (tonic's rules), so a large camera
    is binned only at the size the network takes.
:func:`from_tonic`, :func:`from_directory`, :func:`stream_tonic`, :func:`stream_directory`
    Labelled collections of recordings, in memory or streamed.
:mod:`~braintrace_conv.data.encoders`
    Rate, latency and delta spike encoders for static inputs ``(B, ...)`` ->
    ``(T, B, ...)``.
:func:`cue_accumulation`, :func:`delayed_match_to_sample`
    Long-memory tasks as Poisson spike trains: e-prop's cue accumulation (2,250 steps) and
    delayed match-to-sample (a delay of 1,000 steps).

Long recordings
---------------
:func:`read_events`, :class:`EventReader`, :func:`write_events`
    Event files of any supported format (``.npy``/``.npz``, AEDAT4, Prophesee EVT 2/3),
    read whole or block by block in time order, every event checked.
:class:`EventStream`, :class:`Recording`, :func:`find_recordings`, :func:`read_segments`
    Endless streams: ``B`` long recordings binned on the fly into chunks ``(K, B, P, H,
    W)`` with per-step targets from labelled time segments, resumable bit for bit.
:func:`gesture_recordings`
    Long synthetic gesture recordings in DVS Gesture's raw layout (events + segments CSV).

Where things live
-----------------
``files/`` (event files: read, write, one module per format), ``transforms.py`` (events
to events, before binning), ``binning.py`` (events to frames), ``datasets/`` (labelled samples, in memory or binned on demand), ``streams/``
(recordings played endlessly, with their segments), ``tasks/`` (generated data sets and
recordings) and ``encoders.py`` (spike encoders for static inputs). Every public name is
re-exported here.
"""
from . import encoders, transforms
from .binning import events_to_frames
from .datasets import (EventDataset, FrameDataset, StreamingEventDataset, from_directory,
                       from_tonic, load_event_file, stream_directory, stream_tonic)
from .files import CAMERA_EVENT_DTYPE, EventFileError, EventReader, read_events, write_events
from .streams import (EventStream, Recording, Segments, find_recordings, read_segments,
                      write_segments)
from .tasks import (DIRECTION_NAMES, GESTURE_NAMES, MotionScenes, cue_accumulation,
                    delayed_bars, delayed_match_to_sample, digits_saccades, dvs_events,
                    gesture_recordings, moving_bars, render_scenes, saccade_path,
                    sample_scenes, synthetic_shd)

__all__ = [
    "CAMERA_EVENT_DTYPE",
    "DIRECTION_NAMES",
    "EventDataset",
    "EventFileError",
    "EventReader",
    "EventStream",
    "FrameDataset",
    "GESTURE_NAMES",
    "MotionScenes",
    "Recording",
    "Segments",
    "StreamingEventDataset",
    "cue_accumulation",
    "delayed_bars",
    "delayed_match_to_sample",
    "digits_saccades",
    "encoders",
    "dvs_events",
    "events_to_frames",
    "find_recordings",
    "from_directory",
    "from_tonic",
    "gesture_recordings",
    "load_event_file",
    "moving_bars",
    "read_events",
    "read_segments",
    "render_scenes",
    "sample_scenes",
    "saccade_path",
    "stream_directory",
    "stream_tonic",
    "synthetic_shd",
    "transforms",
    "write_events",
    "write_segments",
]
