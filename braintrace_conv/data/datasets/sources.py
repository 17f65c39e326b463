"""Labelled collections of recorded events: tonic datasets and directories of files.

Recorded event streams are numpy structured arrays in tonic's format (see
:mod:`braintrace_conv.data.binning`). This module turns labelled collections
of them into datasets, either in memory (:func:`from_tonic`,
:func:`from_directory` -> :class:`~braintrace_conv.data.EventDataset`)
or streamed, binned per batch with a bounded cache (:func:`stream_tonic`,
:func:`stream_directory` ->
:class:`~braintrace_conv.data.StreamingEventDataset`). The
``tonic`` package itself is not required.

Every function takes the binning keywords of
:func:`~braintrace_conv.data.events_to_frames` (``n_time_bins``,
``time_window_us``, ``event_count``, ``t_start_us``, and the event
``transforms`` applied first); all samples of a dataset need the same number
of time steps, so give ``n_time_bins``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..._npy_files import npy_entries, npy_header, read_npy, read_npz
from ..binning import Binning
from .dataset import EventDataset
from .on_demand import StreamingEventDataset

__all__ = [
    "from_directory",
    "from_tonic",
    "load_event_file",
    "stream_directory",
    "stream_tonic",
]

_FILE_SUFFIXES = (".npy", ".npz")


def _label_of(label, index) -> int:
    """Return an integer class label, rejecting non-integers."""
    label = np.asarray(label)
    if label.ndim != 0 or not np.issubdtype(label.dtype, np.integer):
        raise TypeError(
            f"sample {index} has label {label!r}; expected a scalar integer class index"
        )
    return int(label)


def _tonic_sample(dataset, index):
    """``(events, label)`` of ``dataset[index]``, checking the pair."""
    sample = dataset[index]
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise TypeError(
            f"dataset[{index}] must be an (events, label) pair, got {type(sample).__name__}"
        )
    return sample


def _tonic_binning(dataset, sensor_size, binning: dict):
    if sensor_size is None:
        sensor_size = getattr(dataset, "sensor_size", None)
        if sensor_size is None:
            raise ValueError(
                "sensor_size is required when dataset has no sensor_size attribute"
            )
    return Binning.from_keywords(sensor_size, binning)


def from_tonic(
    dataset,
    *,
    sensor_size: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    indices: Sequence[int] | None = None,
    name: str | None = None,
    **binning,
) -> EventDataset:
    """Bin a tonic-style dataset into an in-memory :class:`EventDataset`.

    Works with any object that supports ``len(dataset)`` and
    ``dataset[i] -> (events, label)`` with ``events`` a structured event
    array as accepted by :func:`events_to_frames`, for instance a
    ``tonic.datasets`` instance constructed without a transform. tonic is
    not imported. Every sample is read once.

    Args:
      dataset (indexable): Source of ``(events, label)`` pairs; labels are scalar
        integers.
      sensor_size: Sensor size in tonic's order, e.g. ``(W, H, P)`` or ``(700, 1, 1)``;
        defaults to ``dataset.sensor_size``.
      num_classes: Number of classes; defaults to ``len(dataset.classes)`` if
        present, else to the largest label plus one.
      indices: Samples to convert, in this order; all samples if None.
      name: Dataset name; defaults to the class name of ``dataset``.
      **binning: ``n_time_bins``, ``time_window_us``, ``event_count``, ``t_start_us``
        and ``transforms`` of :func:`events_to_frames`; e.g. ``n_time_bins=T`` divides
        every recording into ``T`` equal bins, ``transforms=[Downsample(factor=0.5)]``
        halves the frames (:mod:`~braintrace_conv.data.transforms`).

    Returns:
      ``events`` float32 ``(N, T, *frame_shape)`` with the frame layout of
      :func:`events_to_frames`, ``labels`` int32 ``(N,)``.
    """
    to_frames = _tonic_binning(dataset, sensor_size, binning)
    if indices is None:
        indices = range(len(dataset))
    if num_classes is None and hasattr(dataset, "classes"):
        num_classes = len(dataset.classes)
    frames, labels = [], []
    for index in indices:
        events, label = _tonic_sample(dataset, index)
        frames.append(to_frames(events))
        labels.append(_label_of(label, index))
    if not frames:
        raise ValueError("no samples to convert: dataset or indices is empty")
    shapes = {f.shape for f in frames}
    if len(shapes) > 1:
        raise ValueError(
            f"samples give frames of different shapes {sorted(shapes)}; fix the number "
            "of time steps with n_time_bins"
        )
    labels = np.asarray(labels)
    return EventDataset(
        events=np.stack(frames),
        labels=labels,
        num_classes=int(labels.max()) + 1 if num_classes is None else num_classes,
        name=type(dataset).__name__ if name is None else name,
    )


def stream_tonic(
    dataset,
    *,
    labels: Sequence[int] | None = None,
    sensor_size: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    name: str | None = None,
    cache_size: int = 256,
    **binning,
) -> StreamingEventDataset:
    """A tonic-style dataset as a :class:`StreamingEventDataset`.

    Samples are read with ``dataset[i]`` and binned when a batch needs
    them. Labels are needed up front (for splits and batches): from
    ``labels``, else ``dataset.targets`` (tonic's NMNIST, DVSGesture, ...),
    else one pass over the dataset reading every sample.

    Args:
      dataset (indexable): ``len(dataset)`` and ``dataset[i] -> (events, label)`` as for
        :func:`from_tonic`.
      labels: Class label of every sample, shape ``(N,)``.
      sensor_size, num_classes, name: As for :func:`from_tonic`.
      **binning: As for :func:`from_tonic`.
      cache_size: Samples whose frames stay in memory (LRU).

    Returns:
      Batches ``(T, B, *frame_shape)`` float32 and labels ``(B,)`` int32.
    """
    to_frames = _tonic_binning(dataset, sensor_size, binning)
    if labels is None:
        labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = [_label_of(_tonic_sample(dataset, i)[1], i) for i in range(len(dataset))]
    labels = np.asarray(labels)
    if num_classes is None:
        num_classes = (len(dataset.classes) if hasattr(dataset, "classes")
                       else int(labels.max()) + 1 if labels.size else 1)
    return StreamingEventDataset(
        range(len(dataset)),
        labels,
        read=lambda index: _tonic_sample(dataset, index)[0],
        to_frames=to_frames,
        num_classes=num_classes,
        name=type(dataset).__name__ if name is None else name,
        cache_size=cache_size,
    )


def _is_event_file(path: Path) -> bool:
    return path.suffix.lower() in _FILE_SUFFIXES


def _events_entry(path: Path, names) -> str:
    """The name of the event array among the arrays ``names`` of an ``.npz`` file."""
    names = list(names)
    if "events" in names:
        return "events"
    if len(names) == 1:
        return names[0]
    raise ValueError(
        f"{path} must hold an array named 'events' or exactly one array, got {names}"
    )


def load_event_file(path: str | Path) -> np.ndarray:
    """Structured event array stored in a ``.npy`` or ``.npz`` file.

    An ``.npz`` file holds it under the key ``events`` or as its only array.
    The extension is matched case-insensitively. The file's header is checked
    before any array is allocated (declared size against the bytes present,
    no Python objects, which are never unpickled), and every error names
    the file.

    Raises:
      ValueError: the file is not a readable ``.npy``/``.npz`` array file.
      OSError: the file cannot be opened.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return read_npy(path)
    if suffix != ".npz":
        raise ValueError(f"{path}: expected a .npy or .npz event file")
    arrays = read_npz(path)
    return arrays[_events_entry(path, arrays)]


def _event_count(path: Path) -> int:
    """Number of events in an event file, from its headers (nothing else is read)."""
    if path.suffix.lower() == ".npy":
        shape, dtype = npy_header(path)
    else:
        entries = {name: (shape, dtype) for name, shape, dtype in npy_entries(path)}
        shape, dtype = entries[_events_entry(path, entries)]
    if dtype.names is None or len(shape) != 1:
        raise ValueError(
            f"{path} holds a {dtype} array of shape {shape}; expected a one-dimensional "
            "structured event array with fields t, x[, y[, z]], p"
        )
    return shape[0]


def _list_directory(root: Path) -> tuple[list, list]:
    """``(class directories, files per class)`` of a dataset directory, listed deliberately.

    Hidden entries (names starting with ``.``, e.g. ``.ipynb_checkpoints``) are
    skipped. Errors: no class directory, a single one, or a class without event
    files. One-line warnings with the count: event files not directly in a
    class directory (ignored), and entries that link outside ``root`` (read).
    """
    def visible(directory):
        return sorted(p for p in directory.iterdir() if not p.name.startswith("."))

    inside = root.resolve()
    class_dirs = [p for p in visible(root) if p.is_dir()]
    misplaced = [p for p in visible(root) if p.is_file() and _is_event_file(p)]
    outside, files = [], []
    for class_dir in class_dirs:
        entries = visible(class_dir)
        files.append([p for p in entries if p.is_file() and _is_event_file(p)])
        if not class_dir.resolve().is_relative_to(inside):
            outside.append(class_dir)
        else:
            outside += [f for f in files[-1] if not f.resolve().is_relative_to(inside)]
        for sub in (p for p in entries if p.is_dir()):
            for folder, dirs, names in os.walk(sub):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                misplaced += [Path(folder, n) for n in names
                              if not n.startswith(".") and _is_event_file(Path(n))]
    if not any(files):
        elsewhere = (f" ({len(misplaced)} lie at another depth, e.g. {misplaced[0]}; the "
                     "layout is root/<class>/<sample>.npy)") if misplaced else ""
        raise ValueError(
            f"no .npy or .npz files found in the class sub-directories of {str(root)!r}"
            + elsewhere
        )
    empty = [d.name for d, f in zip(class_dirs, files) if not f]
    if empty:
        raise ValueError(
            f"{len(empty)} of the {len(class_dirs)} class directories of {root} hold no "
            f".npy or .npz event files: {', '.join(empty)}; remove them or add recordings"
        )
    if len(class_dirs) < 2:
        raise ValueError(
            f"{root} holds a single class directory ({class_dirs[0].name}); a classifier "
            "needs one sub-directory of event files per class, at least two"
        )
    if misplaced:
        warnings.warn(
            f"{len(misplaced)} event file(s) in {root} are not directly in a class "
            f"directory and are ignored (e.g. {misplaced[0]})", UserWarning, stacklevel=3
        )
    if outside:
        warnings.warn(
            f"{len(outside)} entries of {root} link to outside it and are read (e.g. "
            f"{outside[0]} -> {outside[0].resolve()})", UserWarning, stacklevel=3
        )
    return class_dirs, files


def stream_directory(
    root: str | Path,
    *,
    sensor_size: tuple[int, ...],
    name: str | None = None,
    cache_size: int = 256,
    **binning,
) -> StreamingEventDataset:
    """A directory of event files, one sub-directory per class, streamed.

    Expects the layout ``root/<class name>/<sample>.npy`` (or ``.npz``),
    each file holding one structured event array as accepted by
    :func:`events_to_frames` (an ``.npz`` file holds it under the key
    ``events`` or as its only array). Class names are sorted alphabetically
    and numbered from 0; files within a class are read in sorted order.
    Only the file list and the files' headers are read up front (and the
    first file, for the frame shape).

    The directory is listed deliberately: hidden entries (``.name``, e.g.
    ``.ipynb_checkpoints``) are skipped and extensions match in any case. A
    class directory without event files, a single class, files that are not
    structured event arrays, or only empty recordings are errors; empty
    recordings among others, event files at another depth (ignored) and
    entries linking outside ``root`` (read) are each one warning with their
    count.

    Args:
      root: Dataset directory.
      sensor_size: Sensor size in tonic's order, e.g. ``(W, H, P)`` or ``(700, 1, 1)``.
      name: Dataset name; defaults to the directory name.
      cache_size: Samples whose frames stay in memory (LRU).
      **binning: ``n_time_bins``, ``time_window_us``, ``event_count``, ``t_start_us``
        and ``transforms`` of :func:`events_to_frames`.

    Returns:
      ``sources`` the file paths, ``class_names`` the sub-directory names.
    """
    to_frames = Binning.from_keywords(sensor_size, binning)
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be an existing directory, got {str(root)!r}")
    class_dirs, class_files = _list_directory(root)
    files = [f for found in class_files for f in found]
    labels = [label for label, found in enumerate(class_files) for _ in found]
    empty = [f for f in files if _event_count(f) == 0]
    if len(empty) == len(files):
        raise ValueError(f"every event file in {root} is empty (holds no events)")
    if empty:
        warnings.warn(
            f"{len(empty)} of the {len(files)} event files in {root} hold no events "
            f"(e.g. {empty[0]}); they give all-zero frames", UserWarning, stacklevel=2
        )
    return StreamingEventDataset(
        files,
        np.asarray(labels),
        read=load_event_file,
        to_frames=to_frames,
        num_classes=len(class_dirs),
        name=root.name if name is None else name,
        class_names=tuple(d.name for d in class_dirs),
        cache_size=cache_size,
    )


def from_directory(
    root: str | Path,
    *,
    sensor_size: tuple[int, ...],
    name: str | None = None,
    **binning,
) -> EventDataset:
    """A directory of event files, one sub-directory per class, in memory.

    The layout and arguments are those of :func:`stream_directory`; every
    file is read once.

    Returns:
      ``events`` float32 ``(N, T, *frame_shape)``, ``labels`` int32
      ``(N,)``, ``class_names`` the sub-directory names.
    """
    return stream_directory(
        root, sensor_size=sensor_size, name=name, cache_size=1, **binning
    ).to_memory()
