"""Labelled datasets of event frames and the batch interface they share.

One sample is a dense tensor of event counts of shape ``(T, *frame_shape)``:
``T`` time steps of one frame each, usually ``(P, X)`` for audio-like
sensors, ``(P, H, W)`` for DVS cameras or ``(P, D, H, W)`` for volumes, with
``P`` polarity channels (see :mod:`braintrace_conv.data.binning`). Batches are
handed out time-major, ``(T, B, *frame_shape)``, the layout recurrent models
scan over, with int32 labels ``(B,)``.

:class:`FrameDataset` holds what every dataset shares -- labels, stratified
splits, shuffled batches -- and :class:`EventDataset` keeps all frames in
memory; :class:`~braintrace_conv.data.StreamingEventDataset` builds
them from files on demand.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from ..._validation import index_array, integer, interval, label_array, per_class_names, string
from ._arrays import read_only

__all__ = ["EventDataset", "FrameDataset"]


class FrameDataset(abc.ABC):
    """Labelled samples of shape ``(T, *frame_shape)`` served in time-major batches.

    Subclasses provide the attributes ``labels`` (int32 ``(N,)``),
    ``num_classes``, ``name``, ``class_names``, the properties
    :attr:`num_steps` and :attr:`frame_shape`, and the methods
    :meth:`subset` and ``_stack(indices) -> (M, T, *frame_shape)``; this
    class derives splits, class counts and batches from them.
    """

    labels: np.ndarray
    num_classes: int
    name: str
    class_names: tuple[str, ...] | None

    @property
    @abc.abstractmethod
    def num_steps(self) -> int:
        """Number of time steps ``T`` per sample."""

    @property
    @abc.abstractmethod
    def frame_shape(self) -> tuple[int, ...]:
        """Shape of one time step of one sample, e.g. ``(P, X)`` or ``(P, H, W)``."""

    @abc.abstractmethod
    def subset(self, indices: Sequence[int] | np.ndarray) -> FrameDataset:
        """Dataset made of the samples at ``indices`` (1-D ints), in that order."""

    @abc.abstractmethod
    def _stack(self, indices: np.ndarray) -> np.ndarray:
        """float32 samples at ``indices``, shape ``(M, T, *frame_shape)``."""

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, samples={len(self)}, "
            f"num_steps={self.num_steps}, frame_shape={self.frame_shape}, "
            f"num_classes={self.num_classes})"
        )

    def class_counts(self) -> np.ndarray:
        """Number of samples per class.

        Returns:
          int64 array of shape ``(num_classes,)``.
        """
        return np.bincount(self.labels, minlength=self.num_classes)

    def split(self, test_fraction: float, seed: int = 0) -> tuple:
        """Stratified random split into a training and a test set.

        Within every class, ``round(test_fraction * n_class)`` samples, drawn
        at random, go to the test set and the rest to the training set, so
        class proportions are preserved up to rounding. Both parts keep the
        original sample order.

        Args:
          test_fraction: Fraction of each class assigned to the test set, in ``(0, 1)``.
          seed: Seed of the random draw; equal seeds give equal splits.

        Returns:
          ``(train, test)``: Disjoint datasets of this type that together contain every
          sample once.

        Raises:
          ValueError: If ``test_fraction`` is outside ``(0, 1)`` or either part would
            be empty.
        """
        test_fraction = interval("test_fraction", test_fraction, 0.0, 1.0, "()")
        rng = np.random.default_rng(seed)
        is_test = np.zeros(len(self), dtype=bool)
        for label in range(self.num_classes):
            members = np.flatnonzero(self.labels == label)
            n_test = int(round(test_fraction * len(members)))
            is_test[rng.permutation(members)[:n_test]] = True
        if is_test.all() or not is_test.any():
            raise ValueError(
                f"test_fraction={test_fraction} leaves an empty training or test "
                f"set for a dataset of {len(self)} samples"
            )
        return self.subset(np.flatnonzero(~is_test)), self.subset(np.flatnonzero(is_test))

    def num_batches(self, batch_size: int, *, drop_last: bool = False) -> int:
        """Number of batches :meth:`batches` yields with these arguments."""
        batch_size = integer("batch_size", batch_size, sign="positive")
        if drop_last:
            return len(self) // batch_size
        return -(-len(self) // batch_size)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Iterate once over the dataset in time-major batches.

        Args:
          batch_size: Number of samples ``B`` per batch, positive.
          shuffle: Visit samples in a random order drawn from ``seed``; otherwise in
            storage order.
          seed: Seed of the shuffling order (ignored if ``shuffle`` is False).
          drop_last: Skip the final batch when it has fewer than ``batch_size``
            samples (e.g. to keep ``B`` divisible by a device count).

        Yields:
          ``(xs, labels)``: ``xs`` float32 array of shape ``(T, B, *frame_shape)``,
          C-contiguous; ``labels`` int32 array of shape ``(B,)``.
        """
        n_batches = self.num_batches(batch_size, drop_last=drop_last)
        order = (
            np.random.default_rng(seed).permutation(len(self))
            if shuffle
            else np.arange(len(self))
        )
        for b in range(n_batches):
            idx = order[b * batch_size : (b + 1) * batch_size]
            xs = np.ascontiguousarray(np.swapaxes(self._stack(idx), 0, 1))
            yield xs, self.labels[idx].copy()


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class EventDataset(FrameDataset):
    """Labelled event frames held in memory.

    Args:
      events: Event counts of shape ``(N, T, *frame_shape)``: samples, time steps,
        then one frame of at least one axis, e.g. ``(P, X)`` (audio-like
        sensors), ``(P, H, W)`` (DVS; polarity 0 = ON, 1 = OFF) or ``(P, D,
        H, W)``. Stored as float32; values are non-negative event counts
        per time step.
      labels: Integer class labels of shape ``(N,)``, each in ``[0, num_classes)``.
        Stored as int32.
      num_classes: Number of classes.
      name: Human-readable dataset name.
      class_names: One name per class, in label order.

    Notes:
      The stored arrays are read-only views; derive new datasets with
      :meth:`subset` or :meth:`split` instead of modifying them in place.
    """

    events: np.ndarray
    labels: np.ndarray
    num_classes: int
    name: str = "events"
    class_names: tuple[str, ...] | None = None

    def __post_init__(self):
        events = np.asarray(self.events)
        if not (np.issubdtype(events.dtype, np.number) or events.dtype == bool):
            raise TypeError(f"events must be numeric, got dtype {events.dtype}")
        if events.ndim < 3:
            raise ValueError(
                "events must have shape (N, T, *frame_shape) with a frame of at least "
                "one axis, e.g. (N, T, P, X) or (N, T, P, H, W), got shape "
                f"{events.shape}"
            )
        labels, num_classes = label_array("labels", self.labels, self.num_classes)
        if len(labels) != len(events):
            raise ValueError(
                f"events and labels must have the same length, got {len(events)} "
                f"samples and {len(labels)} labels"
            )
        string("name", self.name)
        class_names = per_class_names("class_names", self.class_names, num_classes)
        object.__setattr__(self, "events", read_only(events.astype(np.float32, copy=False)))
        object.__setattr__(self, "labels", read_only(labels))
        object.__setattr__(self, "num_classes", num_classes)
        object.__setattr__(self, "class_names", class_names)

    @property
    def num_steps(self) -> int:
        """Number of time steps ``T`` per sample."""
        return self.events.shape[1]

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """Shape of one time step of one sample, ``events.shape[2:]``."""
        return tuple(self.events.shape[2:])

    def subset(self, indices: Sequence[int] | np.ndarray) -> EventDataset:
        """Dataset made of the samples at ``indices``, in that order.

        Args:
          indices: Sample indices into this dataset, shape ``(M,)``.

        Returns:
          New dataset with ``M`` samples and the same metadata.
        """
        indices = index_array("indices", indices)
        return dataclasses.replace(
            self, events=self.events[indices], labels=self.labels[indices]
        )

    def _stack(self, indices: np.ndarray) -> np.ndarray:
        return self.events[indices]
