"""Datasets whose frames are built from event recordings on demand.

A :class:`StreamingEventDataset` keeps only labels and a list of sources
(file paths, indices into a tonic dataset, ...) in memory. A batch reads
the events of its samples, bins them into frames and stacks them; the
frames of the most recently used samples stay in a bounded LRU cache, so a
data set far larger than RAM trains with the memory of ``cache_size``
samples plus one batch. Batches, splits and subsets behave exactly as for
the in-memory :class:`~braintrace_conv.data.EventDataset`
(:class:`~braintrace_conv.data.FrameDataset`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from ..._validation import index_array, integer, label_array, per_class_names, string
from ._arrays import read_only
from .dataset import EventDataset, FrameDataset

__all__ = ["StreamingEventDataset"]


class _LRUCache:
    """At most ``maxsize`` values, evicting the least recently used; counts hits."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.hits = self.misses = 0
        self._items: collections.OrderedDict = collections.OrderedDict()

    def get(self, key, build: Callable):
        if key in self._items:
            self.hits += 1
            self._items.move_to_end(key)
            return self._items[key]
        self.misses += 1
        value = build()
        if self.maxsize:
            self._items[key] = value
            if len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)


@dataclasses.dataclass(frozen=True)
class _Source:
    """What the datasets derived from one constructor call share."""

    sources: tuple
    read: Callable
    to_frames: Callable
    cache: _LRUCache
    sample_shape: tuple = ()

    def frames(self, position: int) -> np.ndarray:
        return self.cache.get(position, lambda: self._build(position))

    def _build(self, position: int) -> np.ndarray:
        source = self.sources[position]
        try:
            frames = np.asarray(self.to_frames(self.read(source)), dtype=np.float32)
        except (ValueError, TypeError) as err:
            if str(source) in str(err):
                raise
            # name the sample whose events are wrong: a file path, an index, ...
            kind = TypeError if isinstance(err, TypeError) else ValueError
            raise kind(f"sample {source}: {err}") from None
        if self.sample_shape and frames.shape != self.sample_shape:
            raise ValueError(
                f"sample {source!r} gives frames of shape {frames.shape}, the first "
                f"sample gave {self.sample_shape}; fix the number of time steps (e.g. "
                "n_time_bins) so that every sample has the same shape"
            )
        return read_only(frames)


class StreamingEventDataset(FrameDataset):
    """Labelled event recordings binned into frames when a batch needs them.

    Args:
      sources: ``N`` sample sources, each passed to ``read`` (file paths, indices
        into another dataset, ...).
      labels (array_like of int): Class labels, shape ``(N,)``, in ``[0, num_classes)``.
      read: ``read(source) -> events``: the structured event array of one sample.
      to_frames: ``to_frames(events) -> frames``: float32 ``(T, *frame_shape)``, the
        same shape for every sample, e.g. ``functools.partial(
        events_to_frames, sensor_size=(700, 1, 1), time_window_us=1e4,
        n_time_bins=100, t_start_us=0)``.
      num_classes: Number of classes.
      name: Human-readable dataset name.
      class_names: One name per class, in label order.
      cache_size: Number of samples whose frames are kept (least recently used are
        evicted first); 0 keeps none. Subsets and splits share this cache.

    Notes:
      The first sample is read at construction to learn ``num_steps`` and
      ``frame_shape`` (and to fail early on a wrong ``read`` or
      ``to_frames``); every later sample must give frames of that shape.
    """

    def __init__(
        self,
        sources: Sequence,
        labels,
        *,
        read: Callable,
        to_frames: Callable,
        num_classes: int,
        name: str = "events",
        class_names: Sequence[str] | None = None,
        cache_size: int = 256,
    ):
        sources = tuple(sources)
        labels, num_classes = label_array("labels", labels, num_classes)
        if len(labels) != len(sources) or not sources:
            raise ValueError(
                f"sources and labels must be non-empty and of the same length, got "
                f"{len(sources)} sources and {len(labels)} labels"
            )
        if not (callable(read) and callable(to_frames)):
            raise TypeError("read and to_frames must be callables")
        cache_size = integer("cache_size", cache_size, sign="non-negative")
        root = _Source(sources, read, to_frames, _LRUCache(cache_size))
        first = root.frames(0)
        if first.ndim < 2:
            raise ValueError(
                f"to_frames must return (T, *frame_shape) with a frame of at least one "
                f"axis, got shape {first.shape} for sample {sources[0]!r}"
            )
        self._init(
            dataclasses.replace(root, sample_shape=first.shape),
            np.arange(len(sources)),
            read_only(labels),
            num_classes,
            string("name", name),
            per_class_names("class_names", class_names, num_classes),
        )

    def _init(self, root, positions, labels, num_classes, name, class_names):
        self._root = root
        self._positions = positions
        self.labels = labels
        self.num_classes = num_classes
        self.name = name
        self.class_names = class_names

    @property
    def num_steps(self) -> int:
        """Number of time steps ``T`` per sample."""
        return self._root.sample_shape[0]

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """Shape of one time step of one sample."""
        return self._root.sample_shape[1:]

    @property
    def sources(self) -> tuple:
        """The sources of this dataset's samples, in order."""
        return tuple(self._root.sources[p] for p in self._positions)

    def cache_info(self) -> dict:
        """Cache statistics: ``hits``, ``misses``, ``size`` (samples held), ``maxsize``."""
        cache = self._root.cache
        return {"hits": cache.hits, "misses": cache.misses, "size": len(cache),
                "maxsize": cache.maxsize}

    def subset(self, indices: Sequence[int] | np.ndarray) -> StreamingEventDataset:
        """Dataset made of the samples at ``indices`` (shape ``(M,)``), in that order.

        Nothing is read; the result shares sources and cache with this dataset.
        """
        indices = index_array("indices", indices)
        derived = object.__new__(StreamingEventDataset)
        derived._init(self._root, self._positions[indices], read_only(self.labels[indices]),
                      self.num_classes, self.name, self.class_names)
        return derived

    def to_memory(self) -> EventDataset:
        """All samples as an in-memory :class:`EventDataset` (reads every sample)."""
        return EventDataset(
            events=self._stack(np.arange(len(self))),
            labels=self.labels,
            num_classes=self.num_classes,
            name=self.name,
            class_names=self.class_names,
        )

    def _stack(self, indices: np.ndarray) -> np.ndarray:
        frames = np.empty((len(indices),) + self._root.sample_shape, dtype=np.float32)
        for row, p in enumerate(self._positions[indices]):
            frames[row] = self._root.frames(int(p))
        return frames
