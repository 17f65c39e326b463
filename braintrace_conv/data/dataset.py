"""Labelled datasets of event frames and the batch interface they share.

One sample is a dense tensor of event counts of shape ``(T, *frame_shape)``:
``T`` time steps of one frame each, usually ``(P, X)`` for audio-like
sensors, ``(P, H, W)`` for DVS cameras or ``(P, D, H, W)`` for volumes, with
``P`` polarity channels (see :mod:`braintrace_conv.data.frames`). Batches are
handed out time-major, ``(T, B, *frame_shape)``, the layout recurrent models
scan over, with int32 labels ``(B,)``.

:class:`FrameDataset` holds what every dataset shares -- labels, stratified
splits, shuffled batches -- and :class:`EventDataset` keeps all frames in
memory; :class:`~braintrace_conv.data.streaming.StreamingEventDataset` builds
them from files on demand.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from ._arrays import read_only

__all__ = ["EventDataset", "FrameDataset"]


# Argument validators shared by the modules of this package.


def _check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int, requiring a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def _check_float(value, name: str) -> float:
    """Return ``value`` as a float, requiring a finite real number."""
    if isinstance(value, bool) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _check_positive_float(value, name: str) -> float:
    """Return ``value`` as a float, requiring a positive finite number."""
    value = _check_float(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_nonnegative_float(value, name: str) -> float:
    """Return ``value`` as a float, requiring a non-negative finite number."""
    value = _check_float(value, name)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return value


def _check_range(value, name: str) -> tuple[float, float]:
    """Return a ``(low, high)`` pair of floats with ``0 < low <= high``."""
    try:
        low, high = value
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (low, high) pair, got {value!r}") from None
    low = _check_positive_float(low, f"{name}[0]")
    high = _check_positive_float(high, f"{name}[1]")
    if low > high:
        raise ValueError(f"{name} must satisfy low <= high, got {value!r}")
    return low, high


def _check_size(size, name: str = "size") -> tuple[int, int]:
    """Return a ``(height, width)`` pair of positive ints."""
    try:
        height, width = size
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (height, width) pair, got {size!r}") from None
    return (
        _check_positive_int(height, f"{name}[0]"),
        _check_positive_int(width, f"{name}[1]"),
    )


def _check_labels(labels, num_classes) -> tuple[np.ndarray, int]:
    """Validate ``(N,)`` integer labels in ``[0, num_classes)``; return int32 labels."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must have shape (N,), got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels must be integers, got dtype {labels.dtype}")
    num_classes = _check_positive_int(num_classes, "num_classes")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got values in "
            f"[{labels.min()}, {labels.max()}]"
        )
    return read_only(labels.astype(np.int32, copy=False)), num_classes


def _check_names(name, class_names, num_classes: int) -> tuple[str, tuple[str, ...] | None]:
    """Validate a dataset name and optional per-class names."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if class_names is not None:
        class_names = tuple(class_names)
        if len(class_names) != num_classes or not all(
            isinstance(c, str) for c in class_names
        ):
            raise ValueError(
                f"class_names must be {num_classes} strings, got {class_names!r}"
            )
    return name, class_names


def _check_indices(indices) -> np.ndarray:
    """Validate a 1-D integer index array."""
    indices = np.asarray(indices)
    if indices.ndim != 1 or not (
        np.issubdtype(indices.dtype, np.integer) or indices.size == 0
    ):
        raise ValueError(
            f"indices must be a 1-D integer array, got shape {indices.shape} "
            f"and dtype {indices.dtype}"
        )
    return indices.astype(np.intp)


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

        Returns
        -------
        np.ndarray
            int64 array of shape ``(num_classes,)``.
        """
        return np.bincount(self.labels, minlength=self.num_classes)

    def split(self, test_fraction: float, seed: int = 0) -> tuple:
        """Stratified random split into a training and a test set.

        Within every class, ``round(test_fraction * n_class)`` samples, drawn
        at random, go to the test set and the rest to the training set, so
        class proportions are preserved up to rounding. Both parts keep the
        original sample order.

        Parameters
        ----------
        test_fraction : float
            Fraction of each class assigned to the test set, in ``(0, 1)``.
        seed : int, optional
            Seed of the random draw; equal seeds give equal splits.

        Returns
        -------
        train, test
            Disjoint datasets of this type that together contain every
            sample once.

        Raises
        ------
        ValueError
            If ``test_fraction`` is outside ``(0, 1)`` or either part would
            be empty.
        """
        test_fraction = _check_float(test_fraction, "test_fraction")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
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
        batch_size = _check_positive_int(batch_size, "batch_size")
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

        Parameters
        ----------
        batch_size : int
            Number of samples ``B`` per batch, positive.
        shuffle : bool, optional
            Visit samples in a random order drawn from ``seed``; otherwise in
            storage order.
        seed : int, optional
            Seed of the shuffling order (ignored if ``shuffle`` is False).
        drop_last : bool, optional
            Skip the final batch when it has fewer than ``batch_size``
            samples (e.g. to keep ``B`` divisible by a device count).

        Yields
        ------
        xs : np.ndarray
            float32 array of shape ``(T, B, *frame_shape)``, C-contiguous.
        labels : np.ndarray
            int32 array of shape ``(B,)``.
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

    Parameters
    ----------
    events : np.ndarray
        Event counts of shape ``(N, T, *frame_shape)``: samples, time steps,
        then one frame of at least one axis, e.g. ``(P, X)`` (audio-like
        sensors), ``(P, H, W)`` (DVS; polarity 0 = ON, 1 = OFF) or ``(P, D,
        H, W)``. Stored as float32; values are non-negative event counts
        per time step.
    labels : np.ndarray
        Integer class labels of shape ``(N,)``, each in ``[0, num_classes)``.
        Stored as int32.
    num_classes : int
        Number of classes.
    name : str, optional
        Human-readable dataset name.
    class_names : sequence of str, optional
        One name per class, in label order.

    Notes
    -----
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
        labels, num_classes = _check_labels(self.labels, self.num_classes)
        if len(labels) != len(events):
            raise ValueError(
                f"events and labels must have the same length, got {len(events)} "
                f"samples and {len(labels)} labels"
            )
        name, class_names = _check_names(self.name, self.class_names, num_classes)
        object.__setattr__(self, "events", read_only(events.astype(np.float32, copy=False)))
        object.__setattr__(self, "labels", labels)
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

        Parameters
        ----------
        indices : sequence of int or np.ndarray
            Sample indices into this dataset, shape ``(M,)``.

        Returns
        -------
        EventDataset
            New dataset with ``M`` samples and the same metadata.
        """
        indices = _check_indices(indices)
        return dataclasses.replace(
            self, events=self.events[indices], labels=self.labels[indices]
        )

    def _stack(self, indices: np.ndarray) -> np.ndarray:
        return self.events[indices]
