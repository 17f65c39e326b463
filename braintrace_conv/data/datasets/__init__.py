"""Labelled samples of binned events: frames held in memory (:class:`EventDataset`), or
binned from recordings on demand (:class:`StreamingEventDataset`), and the loaders that
build either from tonic datasets or directories of files."""
from .dataset import EventDataset, FrameDataset
from .on_demand import StreamingEventDataset
from .sources import from_directory, from_tonic, load_event_file, stream_directory, stream_tonic

__all__ = ["EventDataset", "FrameDataset", "StreamingEventDataset", "from_directory",
           "from_tonic", "load_event_file", "stream_directory", "stream_tonic"]
