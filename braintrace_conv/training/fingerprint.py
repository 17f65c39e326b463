"""Fingerprints of data sets: what a resumed or re-evaluated run checks its data against.

A fingerprint is a small JSON-able dict: ``samples``, ``shape`` ``(N, T,
*frame_shape)``, ``sha256`` and ``version`` (:data:`VERSION`). The digest
covers the labels and

* for a data set in memory (:class:`~braintrace_conv.data.EventDataset`),
  its events;
* for a streamed one (:class:`~braintrace_conv.data.StreamingEventDataset`),
  its sources. Sources that are file paths are named relative to the
  directory they share, so a data set moved or copied elsewhere keeps its
  fingerprint, and ``files`` holds each file's ``[size in bytes,
  modification time in ns]``: a file whose size or modification time changed
  is named, and no file is read. A file rewritten with both restored is not
  seen that way; ``contents=True`` (``Trainer.fit(verify_data=True)``,
  ``braintrace-conv train --verify-data``) adds ``contents``, the SHA-256 of
  each file, so such a file is named too, at the cost of reading every file
  once per run (``docs/benchmarks.md``: about a third of the time one streamed
  epoch takes to read and bin the same files);
* for another :class:`~braintrace_conv.data.FrameDataset`, its frames (read once).

A fingerprint without ``version`` (version 1, written before file metadata
were recorded) names a streamed data set's files by their absolute paths
only. :func:`data_change` checks a fingerprint at its own version, so runs
written then still resume and evaluate, and says that it cannot see changed
file contents.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

import numpy as np

from ..data import EventDataset

__all__ = ['VERSION', 'data_fingerprint', 'data_change']

#: Version of the fingerprints :func:`data_fingerprint` makes.
VERSION = 2
# Files named in a message before "and N more".
_SHOWN_FILES = 3


def _file_sources(dataset) -> Optional[tuple]:
    """The sources of a streamed data set if they are file paths, else ``None``."""
    sources = tuple(getattr(dataset, 'sources', ()))
    if sources and all(isinstance(s, (str, os.PathLike)) for s in sources):
        return sources
    return None


def _relative_names(sources: tuple) -> list:
    """File paths relative to the directory they share (``/``-separated)."""
    paths = [os.path.abspath(os.fsdecode(os.fspath(s))) for s in sources]
    try:
        root = os.path.commonpath([os.path.dirname(p) for p in paths])
    except ValueError:      # on different drives: no directory in common
        return paths
    return [Path(os.path.relpath(p, root)).as_posix() for p in paths]


def _file_stat(source) -> Optional[list]:
    """``[size in bytes, modification time in ns]`` of a file; ``None`` if it is missing."""
    try:
        st = os.stat(source)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _file_digest(source) -> Optional[str]:
    """The SHA-256 (hex) of a file's content; ``None`` if it cannot be read."""
    try:
        with open(source, 'rb') as f:
            return hashlib.file_digest(f, 'sha256').hexdigest()
    except OSError:
        return None


def data_fingerprint(dataset, version: int = VERSION, *, contents: bool = False
                     ) -> Optional[dict]:
    """The fingerprint of a data set (module docstring); a streamed one's files are read
    only with ``contents``.

    Args:
      dataset: a ``FrameDataset`` of ``N`` samples ``(T, *frame_shape)``, or ``None``.
      version: 1 (a streamed data set's files by their absolute paths only) or
        :data:`VERSION`.
      contents: from version 2, a streamed data set's files also by the SHA-256 of their
        contents (each file read once).

    Returns:
      ``None`` for ``None``, else a dict: ``samples`` ``N``, ``shape`` ``[N, T,
      *frame_shape]``, ``sha256``, and from version 2 ``version`` and (files) ``files``
      and, with ``contents``, ``contents`` (a digest per file, ``None`` if unreadable).
    """
    if dataset is None:
        return None
    files = _file_sources(dataset) if version >= 2 else None
    if isinstance(dataset, EventDataset):
        digest = hashlib.sha256(np.ascontiguousarray(dataset.events).tobytes())
    elif files is not None:
        digest = hashlib.sha256('\n'.join(_relative_names(files)).encode())
    elif hasattr(dataset, 'sources'):
        digest = hashlib.sha256('\n'.join(map(str, dataset.sources)).encode())
    else:   # another FrameDataset: its frames, read once
        digest = hashlib.sha256()
        for xs, _ in dataset.batches(64, shuffle=False):
            digest.update(np.ascontiguousarray(xs).tobytes())
    digest.update(np.ascontiguousarray(dataset.labels).tobytes())
    fingerprint = dict(samples=len(dataset.labels),
                       shape=[len(dataset.labels), dataset.num_steps, *dataset.frame_shape],
                       sha256=digest.hexdigest())
    if version >= 2:
        fingerprint['version'] = version
        if files is not None:
            fingerprint['files'] = [_file_stat(s) for s in files]
            if contents:
                fingerprint['contents'] = [_file_digest(s) for s in files]
    return fingerprint


def _samples(fingerprint: Optional[dict]) -> str:
    return 'none' if fingerprint is None else f'{fingerprint.get("samples")} samples'


def data_change(stored, dataset, now: Optional[dict] = None) -> tuple:
    """How ``dataset`` differs from the data whose fingerprint a run stored.

    Args:
      stored: the stored fingerprint (a dict, or ``None`` for no data set), of any version;
        one with ``contents`` is compared by them too (each file read).
      dataset: the data set now (a ``FrameDataset``), or ``None``.
      now: ``dataset``'s fingerprint if already made (so no file is read twice); used
        where it is of ``stored``'s version and has ``contents`` as ``stored`` does.

    Returns:
      ``(change, note)``: ``change`` is ``None`` if ``dataset`` has the fingerprint
      ``stored`` (compared at ``stored``'s version), else what differs, e.g. ``'1 of
      its 18 files changed since (size or modification time): /data/up/003.npy'``;
      ``note`` is ``None``, or says that ``stored`` cannot see changed file contents.
    """
    if stored is None or dataset is None:
        if stored is None and dataset is None:
            return None, None
        now = None if dataset is None else dict(samples=len(dataset.labels))
        return f'{_samples(stored)} then, {_samples(now)} now', None
    if not isinstance(stored, dict):
        return 'its stored fingerprint is not valid', None
    version = stored.get('version', 1)
    if not (type(version) is int and 1 <= version <= VERSION):
        return (f'its fingerprint, of version {version!r}, is not one this version of '
                f'braintrace_conv can check'), None
    contents = 'contents' in stored
    if not (isinstance(now, dict) and now.get('version', 1) == version
            and ('contents' in now) == contents):
        now = data_fingerprint(dataset, version, contents=contents)
    files = _file_sources(dataset)
    note = None
    if version < 2 and files is not None:
        note = ('its fingerprint was written by an older version and covers the file paths '
                'only: changes to the files\' contents cannot be detected')
    if stored == now:
        return None, note
    same_sources = all(stored.get(k) == now[k] for k in ('samples', 'shape', 'sha256'))
    if same_sources and 'files' in now:
        for key, what, absent in (
                ('files', 'size or modification time', 'missing'),
                ('contents', 'content, with size and modification time kept', 'unreadable')):
            changed = _changed_files(files, stored.get(key), now.get(key), absent)
            if changed:
                more = len(changed) - _SHOWN_FILES
                return (f'{len(changed)} of its {len(files)} files changed since ({what}): '
                        f'{", ".join(changed[:_SHOWN_FILES])}'
                        + (f' and {more} more' if more > 0 else '')), note
    return f'other samples or labels ({_samples(stored)} then, {_samples(now)} now)', note


def _changed_files(files: tuple, old, new, absent: str) -> list:
    """The files whose entries differ between the lists ``old`` (stored, unchecked) and
    ``new`` (now), one entry per file each; one without an entry now is marked ``absent``."""
    if not (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
            == len(files)):
        return []
    return [f'{s}' + (f' ({absent})' if now is None else '')
            for s, before, now in zip(files, old, new) if before != now]
