"""Argument checks shared by the ops, layers, models and trainer.

Each raises a ``ValueError``/``TypeError`` naming the argument and what was expected.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ['positive', 'positive_ints']


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
