"""Event files: bytes to events and back, every format behind one reader
(:func:`read_events`, :class:`EventReader`) and one writer (:func:`write_events`)."""
from .read import CAMERA_EVENT_DTYPE, EventFileError, EventReader, read_events
from .write import write_events

__all__ = ["CAMERA_EVENT_DTYPE", "EventFileError", "EventReader", "read_events", "write_events"]
