"""Adapters for recorded event data in the ``tonic`` event format.

Recorded event streams are numpy structured arrays with one record per
event and at least the fields ``x`` (column), ``y`` (row), ``t`` (timestamp,
microseconds) and ``p`` (polarity: 0/1, -1/1 or bool, where 1 / True means
ON). Sensor sizes follow tonic's order ``(W, H, P)``. This module bins such
streams into the dense ``(T, 2, H, W)`` frames used by the library --
channel 0 = ON, channel 1 = OFF -- and collects labelled collections into an
:class:`~braintrace_conv.data.dataset.EventDataset`. The ``tonic`` package
itself is not required.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .dataset import EventDataset, _check_positive_float, _check_positive_int

__all__ = ["events_to_frames", "from_directory", "from_tonic"]

_REQUIRED_FIELDS = ("x", "y", "t", "p")
_FILE_SUFFIXES = (".npy", ".npz")


def _check_sensor_size(sensor_size) -> tuple[int, int]:
    """Validate a tonic ``(W, H, P)`` sensor size and return ``(H, W)``."""
    try:
        width, height, n_polarities = sensor_size
    except (TypeError, ValueError):
        raise TypeError(
            f"sensor_size must be a (W, H, P) triple as in tonic, got {sensor_size!r}"
        ) from None
    width = _check_positive_int(width, "sensor_size[0] (width)")
    height = _check_positive_int(height, "sensor_size[1] (height)")
    if _check_positive_int(n_polarities, "sensor_size[2] (polarities)") > 2:
        raise ValueError(
            f"sensor_size[2] (polarities) must be 1 or 2, got {n_polarities}"
        )
    return height, width


def _integer_coordinates(values: np.ndarray, name: str, bound: int) -> np.ndarray:
    """Return event coordinates as intp, requiring integers in ``[0, bound)``."""
    if not np.issubdtype(values.dtype, np.number) or np.issubdtype(
        values.dtype, np.complexfloating
    ):
        raise TypeError(f"events field {name!r} must be numeric, got dtype {values.dtype}")
    if values.size and not np.array_equal(values, np.round(values)):
        raise ValueError(f"events field {name!r} must hold integer pixel coordinates")
    if values.size and (values.min() < 0 or values.max() >= bound):
        raise ValueError(
            f"events field {name!r} must lie in [0, {bound}) for this sensor_size, "
            f"got values in [{values.min()}, {values.max()}]"
        )
    return values.astype(np.intp)


def _on_mask(polarity: np.ndarray) -> np.ndarray:
    """True for ON events; accepts polarities coded 0/1, -1/1 or bool."""
    if polarity.dtype == bool:
        return polarity
    if not np.issubdtype(polarity.dtype, np.number):
        raise TypeError(f"events field 'p' must be numeric or bool, got dtype {polarity.dtype}")
    values = set(np.unique(polarity).tolist())
    if not (values <= {0, 1} or values <= {-1, 1}):
        raise ValueError(
            "events field 'p' must be coded as 0/1, -1/1 or bool, got values "
            f"{sorted(values)}"
        )
    return polarity > 0


def _time_bins(
    t: np.ndarray, n_time_bins: int | None, time_window_us: float | None
) -> tuple[np.ndarray, int]:
    """Time-bin index of every event and the number of bins."""
    if not np.issubdtype(t.dtype, np.number) or np.issubdtype(t.dtype, np.complexfloating):
        raise TypeError(f"events field 't' must be numeric, got dtype {t.dtype}")
    t = t.astype(np.float64)
    if t.size and not np.isfinite(t).all():
        raise ValueError("events field 't' must be finite")
    if n_time_bins is not None:
        if not t.size:
            return np.zeros(0, dtype=np.intp), n_time_bins
        start, span = t.min(), t.max() - t.min()
        if span == 0:
            return np.zeros(t.shape, dtype=np.intp), n_time_bins
        bins = np.floor((t - start) * (n_time_bins / span)).astype(np.intp)
        return np.minimum(bins, n_time_bins - 1), n_time_bins
    if not t.size:
        return np.zeros(0, dtype=np.intp), 0
    bins = np.floor((t - t.min()) / time_window_us).astype(np.intp)
    return bins, int(bins.max()) + 1


def events_to_frames(
    events: np.ndarray,
    *,
    sensor_size: tuple[int, int, int],
    n_time_bins: int | None = None,
    time_window_us: float | None = None,
) -> np.ndarray:
    """Bin a structured event array into dense ON/OFF frames.

    Exactly one of ``n_time_bins`` and ``time_window_us`` must be given.
    Time is measured from the earliest event, ``t0``; with ``t1`` the
    latest event:

    * ``n_time_bins=n`` divides ``[t0, t1]`` into ``n`` bins of equal
      width ``(t1 - t0) / n``; bin ``k`` covers
      ``[t0 + k (t1 - t0) / n, t0 + (k + 1) (t1 - t0) / n)`` and the last
      bin also holds ``t1``. If all events share one timestamp they fall in
      bin 0.
    * ``time_window_us=w`` uses bins ``[t0 + k w, t0 + (k + 1) w)``, as
      many as needed to reach ``t1``, so ``T = floor((t1 - t0) / w) + 1``.

    Parameters
    ----------
    events : np.ndarray
        Structured array of shape ``(E,)`` with integer-valued fields ``x``
        (column, ``0 <= x < W``) and ``y`` (row, ``0 <= y < H``), numeric
        ``t`` (microseconds, any order) and ``p`` (polarity, 0/1 or -1/1 or
        bool; 1 / True is ON). Other fields are ignored.
    sensor_size : (int, int, int)
        Sensor size ``(W, H, P)`` in tonic's order; ``P`` (1 or 2) is not
        used, the output always has an ON and an OFF channel.
    n_time_bins : int, optional
        Number of equal-width time bins spanning the recording.
    time_window_us : float, optional
        Width of each time bin, microseconds.

    Returns
    -------
    np.ndarray
        float32 event counts of shape ``(T, 2, H, W)``; channel 0 counts ON
        events and channel 1 OFF events. With no events, all zeros with
        ``T = n_time_bins``, or ``T = 0`` when binning by ``time_window_us``.

    Notes
    -----
    Polarity channels are ordered ON, OFF, the library-wide convention;
    tonic's own frame transforms put polarity 0 (OFF) first.
    """
    if (n_time_bins is None) == (time_window_us is None):
        raise ValueError("give exactly one of n_time_bins and time_window_us")
    if n_time_bins is not None:
        n_time_bins = _check_positive_int(n_time_bins, "n_time_bins")
    else:
        time_window_us = _check_positive_float(time_window_us, "time_window_us")
    height, width = _check_sensor_size(sensor_size)
    if not isinstance(events, np.ndarray) or events.dtype.names is None:
        raise TypeError(
            "events must be a numpy structured array with fields x, y, t, p, got "
            f"{type(events).__name__}"
            + (f" with dtype {events.dtype}" if isinstance(events, np.ndarray) else "")
        )
    missing = [f for f in _REQUIRED_FIELDS if f not in events.dtype.names]
    if missing:
        raise ValueError(
            f"events is missing field(s) {missing}; it has {list(events.dtype.names)} "
            "and needs x, y, t, p"
        )
    if events.ndim != 1:
        raise ValueError(f"events must be one-dimensional, got shape {events.shape}")

    x = _integer_coordinates(events["x"], "x", width)
    y = _integer_coordinates(events["y"], "y", height)
    channel = np.where(_on_mask(events["p"]), 0, 1)
    bins, n_bins = _time_bins(events["t"], n_time_bins, time_window_us)
    flat = ((bins * 2 + channel) * height + y) * width + x
    counts = np.bincount(flat, minlength=n_bins * 2 * height * width)
    return counts.astype(np.float32).reshape(n_bins, 2, height, width)


def _label_of(label, index) -> int:
    """Return an integer class label, rejecting non-integers."""
    label = np.asarray(label)
    if label.ndim != 0 or not np.issubdtype(label.dtype, np.integer):
        raise TypeError(
            f"sample {index} has label {label!r}; expected a scalar integer class index"
        )
    return int(label)


def from_tonic(
    dataset,
    *,
    n_time_bins: int,
    sensor_size: tuple[int, int, int] | None = None,
    num_classes: int | None = None,
    indices: Sequence[int] | None = None,
    name: str | None = None,
) -> EventDataset:
    """Bin a tonic-style dataset into an in-memory :class:`EventDataset`.

    Works with any object that supports ``len(dataset)`` and
    ``dataset[i] -> (events, label)`` with ``events`` a structured event
    array as accepted by :func:`events_to_frames`, for instance a
    ``tonic.datasets`` instance constructed without a transform. tonic is
    not imported.

    Parameters
    ----------
    dataset : indexable
        Source of ``(events, label)`` pairs; labels are scalar integers.
    n_time_bins : int
        Time steps ``T`` per sample; every recording is divided into this
        many equal-width bins (see :func:`events_to_frames`).
    sensor_size : (int, int, int), optional
        Sensor size ``(W, H, P)``; defaults to ``dataset.sensor_size``.
    num_classes : int, optional
        Number of classes; defaults to ``len(dataset.classes)`` if
        present, else to the largest label plus one.
    indices : sequence of int, optional
        Samples to convert, in this order; all samples if None.
    name : str, optional
        Dataset name; defaults to the class name of ``dataset``.

    Returns
    -------
    EventDataset
        ``events`` float32 ``(N, n_time_bins, 2, H, W)``, ``labels`` int32
        ``(N,)``.
    """
    n_time_bins = _check_positive_int(n_time_bins, "n_time_bins")
    if sensor_size is None:
        sensor_size = getattr(dataset, "sensor_size", None)
        if sensor_size is None:
            raise ValueError(
                "sensor_size is required when dataset has no sensor_size attribute"
            )
    _check_sensor_size(sensor_size)
    if indices is None:
        indices = range(len(dataset))
    if num_classes is None and hasattr(dataset, "classes"):
        num_classes = len(dataset.classes)

    frames, labels = [], []
    for index in indices:
        sample = dataset[index]
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise TypeError(
                f"dataset[{index}] must be an (events, label) pair, got "
                f"{type(sample).__name__}"
            )
        events, label = sample
        frames.append(
            events_to_frames(events, sensor_size=sensor_size, n_time_bins=n_time_bins)
        )
        labels.append(_label_of(label, index))
    if not frames:
        raise ValueError("no samples to convert: dataset or indices is empty")
    labels = np.asarray(labels)
    return EventDataset(
        events=np.stack(frames),
        labels=labels,
        num_classes=int(labels.max()) + 1 if num_classes is None else num_classes,
        name=type(dataset).__name__ if name is None else name,
    )


def _load_event_file(path: Path) -> np.ndarray:
    """Structured event array stored in a ``.npy`` or ``.npz`` file."""
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    with np.load(path, allow_pickle=False) as archive:
        keys = archive.files
        if "events" in keys:
            return archive["events"]
        if len(keys) == 1:
            return archive[keys[0]]
    raise ValueError(
        f"{path} must hold an array named 'events' or exactly one array, got {keys}"
    )


def from_directory(
    root: str | Path,
    *,
    sensor_size: tuple[int, int, int],
    n_time_bins: int,
    name: str | None = None,
) -> EventDataset:
    """Load a directory of event files, one sub-directory per class.

    Expects the layout ``root/<class name>/<sample>.npy`` (or ``.npz``),
    each file holding one structured event array as accepted by
    :func:`events_to_frames` (an ``.npz`` file holds it under the key
    ``events`` or as its only array). Class names are sorted alphabetically
    and numbered from 0; files within a class are read in sorted order.

    Parameters
    ----------
    root : str or pathlib.Path
        Dataset directory.
    sensor_size : (int, int, int)
        Sensor size ``(W, H, P)`` in tonic's order.
    n_time_bins : int
        Time steps ``T`` per sample (equal-width bins per recording).
    name : str, optional
        Dataset name; defaults to the directory name.

    Returns
    -------
    EventDataset
        ``events`` float32 ``(N, n_time_bins, 2, H, W)``, ``labels`` int32
        ``(N,)``, ``class_names`` the sub-directory names.
    """
    n_time_bins = _check_positive_int(n_time_bins, "n_time_bins")
    _check_sensor_size(sensor_size)
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be an existing directory, got {str(root)!r}")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        class_files = sorted(
            p for p in class_dir.iterdir() if p.is_file() and p.suffix in _FILE_SUFFIXES
        )
        files += class_files
        labels += [label] * len(class_files)
    if not files:
        raise ValueError(
            f"no .npy or .npz files found in the class sub-directories of {str(root)!r}"
        )
    frames = [
        events_to_frames(_load_event_file(f), sensor_size=sensor_size, n_time_bins=n_time_bins)
        for f in files
    ]
    return EventDataset(
        events=np.stack(frames),
        labels=np.asarray(labels),
        num_classes=len(class_dirs),
        name=root.name if name is None else name,
        class_names=tuple(d.name for d in class_dirs),
    )
