"""Endless streams: long recordings played chunk by chunk (:class:`EventStream`), with
per-step targets from labelled time segments (:class:`Segments`)."""
from .event_stream import EventStream, Recording, find_recordings
from .segments import Segments, read_segments, write_segments

__all__ = ["EventStream", "Recording", "Segments", "find_recordings", "read_segments",
           "write_segments"]
