"""Argument checks shared by the ops, layers, models and trainer.

One convention: each check takes the argument's name and value and raises a
``ValueError``/``TypeError`` naming the argument, the value and what was expected.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ['positive', 'positive_ints', 'one_of', 'non_negative', 'finite', 'class_labels']


def positive(name: str, value, kind: type = int):
    """``value`` as a positive ``kind`` (``int``, or ``float`` accepting ints too); bools
    and other types are rejected."""
    ok = (isinstance(value, (int, np.integer)) if kind is int
          else isinstance(value, (int, float, np.integer, np.floating)))
    if isinstance(value, bool) or not ok or not value > 0:
        raise ValueError(f'{name} must be a positive {kind.__name__}, got {value!r}.')
    return kind(value)


def positive_ints(name: str, value, n_spatial: int, default: int | None = None) -> tuple[int, ...]:
    """A positive-int tuple of length ``n_spatial`` (an int is broadcast; ``None`` gives
    ``default``, or an error naming ``name`` when there is no default)."""
    if value is None:
        if default is None:
            raise ValueError(f'{name} is required: a sequence of {n_spatial} positive ints.')
        return (default,) * n_spatial
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * n_spatial
    try:
        value = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f'{name} must be an int or a sequence of {n_spatial} ints, '
                        f'got {value!r}.') from None
    if len(value) != n_spatial:
        raise ValueError(f'{name} must have {n_spatial} entries (one per spatial '
                         f'dimension), got {len(value)}: {value!r}.')
    if any(v <= 0 for v in value):
        raise ValueError(f'{name} must be positive, got {value!r}.')
    return value


def one_of(name: str, value, choices: tuple):
    """``value`` if it is one of ``choices``."""
    if isinstance(value, (list, dict, set)) or value not in choices:
        raise ValueError(f'{name} must be one of {choices}, got {value!r}.')
    return value


def non_negative(name: str, value) -> int:
    """``value`` as a non-negative int (bools and other types are rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f'{name} must be a non-negative int, got {value!r}.')
    return int(value)


def finite(name: str, array, axes: tuple | None = None) -> None:
    """Raise a ``ValueError`` naming the first NaN or infinity of ``array`` and its position.

    ``axes`` names the axes of ``array`` for the message (e.g. ``('t', 'b', 'channel',
    'row', 'column')``); default: the plain index.
    """
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.inexact):
        return
    bad = ~np.isfinite(array)
    if not bad.any():
        return
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    position = (', '.join(f'{a}={i}' for a, i in zip(axes, where)) if axes is not None
                else str(where))
    raise ValueError(f'{name} must be finite, got {array[where]} at {position} '
                     f'({int(bad.sum())} non-finite value(s) in all).')


def class_labels(name: str, labels, num_classes: int, batch: int | None = None) -> np.ndarray:
    """``labels`` as an int array ``(B,)`` with values in ``[0, num_classes)``."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f'{name} must be integer class labels, got dtype {labels.dtype}.')
    expected = '(B,)' if batch is None else f'({batch},)'
    if labels.ndim != 1 or (batch is not None and len(labels) != batch):
        raise ValueError(f'{name} must have shape {expected}, got {labels.shape}.')
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f'{name} must lie in [0, {num_classes}) (the model has {num_classes} '
                         f'outputs), got values in [{labels.min()}, {labels.max()}].')
    return labels
