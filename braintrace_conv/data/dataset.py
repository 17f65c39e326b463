"""In-memory container for labelled event-stream datasets.

One sample is a dense event tensor of shape ``(T, 2, H, W)``: ``T`` time
steps, two polarity channels (0 = ON, 1 = OFF), ``H`` rows and ``W`` columns.
Entries are event counts per pixel, polarity and time step (usually 0 or 1).
A dataset stacks ``N`` such samples into ``(N, T, 2, H, W)``; batches are
handed out time-major, ``(T, B, 2, H, W)``, which is the layout recurrent
models scan over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["EventDataset"]


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


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


@dataclasses.dataclass(frozen=True, eq=False)
class EventDataset:
    """Labelled event streams held in memory.

    Parameters
    ----------
    events : np.ndarray
        Event tensor of shape ``(N, T, 2, H, W)``: samples, time steps,
        polarity (0 = ON, 1 = OFF), rows, columns. Stored as float32; values
        are non-negative event counts per time step.
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
        labels = np.asarray(self.labels)
        if not (np.issubdtype(events.dtype, np.number) or events.dtype == bool):
            raise TypeError(f"events must be numeric, got dtype {events.dtype}")
        if events.ndim != 5 or events.shape[2] != 2:
            raise ValueError(
                "events must have shape (N, T, 2, H, W), got shape "
                f"{events.shape}"
            )
        if labels.ndim != 1:
            raise ValueError(f"labels must have shape (N,), got shape {labels.shape}")
        if not np.issubdtype(labels.dtype, np.integer):
            raise TypeError(f"labels must be integers, got dtype {labels.dtype}")
        if len(labels) != len(events):
            raise ValueError(
                f"events and labels must have the same length, got {len(events)} "
                f"samples and {len(labels)} labels"
            )
        num_classes = _check_positive_int(self.num_classes, "num_classes")
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"labels must lie in [0, {num_classes}), got values in "
                f"[{labels.min()}, {labels.max()}]"
            )
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        class_names = self.class_names
        if class_names is not None:
            class_names = tuple(class_names)
            if len(class_names) != num_classes or not all(
                isinstance(c, str) for c in class_names
            ):
                raise ValueError(
                    f"class_names must be {num_classes} strings, got {class_names!r}"
                )
        object.__setattr__(self, "events", _read_only(events.astype(np.float32, copy=False)))
        object.__setattr__(self, "labels", _read_only(labels.astype(np.int32, copy=False)))
        object.__setattr__(self, "num_classes", num_classes)
        object.__setattr__(self, "class_names", class_names)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return (
            f"EventDataset(name={self.name!r}, samples={len(self)}, "
            f"num_steps={self.num_steps}, frame_shape={self.frame_shape}, "
            f"num_classes={self.num_classes})"
        )

    @property
    def num_steps(self) -> int:
        """Number of time steps ``T`` per sample."""
        return self.events.shape[1]

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """Shape ``(2, H, W)`` of one time step of one sample."""
        return tuple(self.events.shape[2:])

    def class_counts(self) -> np.ndarray:
        """Number of samples per class.

        Returns
        -------
        np.ndarray
            int64 array of shape ``(num_classes,)``.
        """
        return np.bincount(self.labels, minlength=self.num_classes)

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
        indices = np.asarray(indices)
        if indices.ndim != 1 or not (
            np.issubdtype(indices.dtype, np.integer) or indices.size == 0
        ):
            raise ValueError(
                f"indices must be a 1-D integer array, got shape {indices.shape} "
                f"and dtype {indices.dtype}"
            )
        indices = indices.astype(np.intp)
        return dataclasses.replace(
            self, events=self.events[indices], labels=self.labels[indices]
        )

    def split(self, test_fraction: float, seed: int = 0) -> tuple[EventDataset, EventDataset]:
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
        train, test : EventDataset
            Disjoint datasets that together contain every sample once.

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
            samples.

        Yields
        ------
        xs : np.ndarray
            float32 array of shape ``(T, B, 2, H, W)``, C-contiguous.
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
            xs = np.ascontiguousarray(np.swapaxes(self.events[idx], 0, 1))
            yield xs, self.labels[idx].copy()
