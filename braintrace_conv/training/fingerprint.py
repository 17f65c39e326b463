"""Fingerprints of data sets: what a resumed or re-evaluated run checks its data against."""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from ..data import EventDataset

__all__ = ['data_fingerprint']


def data_fingerprint(dataset) -> Optional[dict]:
    """Size and SHA-256 of what a resumed run must reuse: the events and labels of a
    dataset in memory; the sources (e.g. file paths) and labels of a streamed one, whose
    files are not read for it."""
    if dataset is None:
        return None
    if isinstance(dataset, EventDataset):
        digest = hashlib.sha256(np.ascontiguousarray(dataset.events).tobytes())
    elif hasattr(dataset, 'sources'):
        digest = hashlib.sha256('\n'.join(map(str, dataset.sources)).encode())
    else:   # another FrameDataset: its frames, read once
        digest = hashlib.sha256()
        for xs, _ in dataset.batches(64, shuffle=False):
            digest.update(np.ascontiguousarray(xs).tobytes())
    digest.update(np.ascontiguousarray(dataset.labels).tobytes())
    return dict(samples=len(dataset.labels),
                shape=[len(dataset.labels), dataset.num_steps, *dataset.frame_shape],
                sha256=digest.hexdigest())
