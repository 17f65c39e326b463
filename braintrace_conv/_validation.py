"""Argument checks shared by the ops, layers, models, trainer and data sets.

One convention: each check takes the argument's name, then its value (then
options), and returns the checked value, converted where the check says so
(:func:`finite` returns nothing), or raises an error naming the argument, the value
and what was expected. A value of the wrong type raises
:class:`WrongTypeError`, which is both a ``TypeError`` and a ``ValueError``, so
callers catching either see it; a value of the right type that is out of range, of
the wrong shape or not among the choices raises a ``ValueError``.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ['WrongTypeError', 'positive', 'positive_ints', 'one_of', 'non_negative', 'finite',
           'class_labels', 'integer', 'number', 'positive_range', 'height_width', 'string',
           'label_array', 'per_class_names', 'index_array']


class WrongTypeError(TypeError, ValueError):
    """An argument of the wrong type (or dtype)."""


def positive(name: str, value, kind: type = int):
    """``value`` as a positive ``kind`` (``int``, or ``float`` accepting ints too); bools
    and other types are rejected."""
    ok = (isinstance(value, (int, np.integer)) if kind is int
          else isinstance(value, (int, float, np.integer, np.floating)))
    if isinstance(value, bool) or not ok or not value > 0:
        error = ValueError if ok and not isinstance(value, bool) else WrongTypeError
        raise error(f'{name} must be a positive {kind.__name__}, got {value!r}.')
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
        raise WrongTypeError(f'{name} must be an int or a sequence of {n_spatial} ints, '
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
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WrongTypeError(f'{name} must be a non-negative int, got {value!r}.')
    if value < 0:
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
        raise WrongTypeError(f'{name} must be integer class labels, got dtype {labels.dtype}.')
    expected = '(B,)' if batch is None else f'({batch},)'
    if labels.ndim != 1 or (batch is not None and len(labels) != batch):
        raise ValueError(f'{name} must have shape {expected}, got {labels.shape}.')
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f'{name} must lie in [0, {num_classes}) (the model has {num_classes} '
                         f'outputs), got values in [{labels.min()}, {labels.max()}].')
    return labels


# The checks below name the expected type and the expected value in separate
# messages ('T must be an int, got str', then 'T must be positive, got 0').

_SIGNS = {'positive': lambda v: v > 0, 'non-negative': lambda v: v >= 0}


def _signed(name: str, value, sign: str | None):
    """``value`` if it has ``sign`` (``'positive'``, ``'non-negative'`` or ``None``: any)."""
    if sign is not None and not _SIGNS[sign](value):
        raise ValueError(f'{name} must be {sign}, got {value}')
    return value


def integer(name: str, value, *, sign: str | None = None) -> int:
    """``value`` as an int (bools rejected), ``'positive'`` or ``'non-negative'`` if
    ``sign`` says so."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WrongTypeError(f'{name} must be an int, got {type(value).__name__}')
    return int(_signed(name, value, sign))


def number(name: str, value, *, sign: str | None = None) -> float:
    """``value`` as a finite float (ints accepted, bools rejected), ``'positive'`` or
    ``'non-negative'`` if ``sign`` says so."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise WrongTypeError(f'{name} must be a number, got {type(value).__name__}')
    if not np.isfinite(value):
        raise ValueError(f'{name} must be finite, got {value}')
    return _signed(name, float(value), sign)


def _pair(name: str, value, form: str) -> tuple:
    try:
        first, second = value
    except (TypeError, ValueError):
        raise WrongTypeError(f'{name} must be a {form} pair, got {value!r}') from None
    return first, second


def positive_range(name: str, value) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` pair of floats with ``0 < low <= high``."""
    low, high = _pair(name, value, '(low, high)')
    low = number(f'{name}[0]', low, sign='positive')
    high = number(f'{name}[1]', high, sign='positive')
    if low > high:
        raise ValueError(f'{name} must satisfy low <= high, got {value!r}')
    return low, high


def height_width(name: str, value) -> tuple[int, int]:
    """``value`` as a ``(height, width)`` pair of positive ints."""
    height, width = _pair(name, value, '(height, width)')
    return (integer(f'{name}[0]', height, sign='positive'),
            integer(f'{name}[1]', width, sign='positive'))


def string(name: str, value) -> str:
    """``value`` if it is a ``str``."""
    if not isinstance(value, str):
        raise WrongTypeError(f'{name} must be a str, got {type(value).__name__}')
    return value


def label_array(name: str, value, num_classes) -> tuple[np.ndarray, int]:
    """A data set's ``(N,)`` integer labels in ``[0, num_classes)`` as int32, and
    ``num_classes`` as a positive int."""
    labels = np.asarray(value)
    if labels.ndim != 1:
        raise ValueError(f'{name} must have shape (N,), got shape {labels.shape}')
    if not np.issubdtype(labels.dtype, np.integer):
        raise WrongTypeError(f'{name} must be integers, got dtype {labels.dtype}')
    num_classes = integer('num_classes', num_classes, sign='positive')
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f'{name} must lie in [0, {num_classes}), got values in '
                         f'[{labels.min()}, {labels.max()}]')
    return labels.astype(np.int32, copy=False), num_classes


def per_class_names(name: str, value, num_classes: int) -> tuple[str, ...] | None:
    """``value`` as a tuple of ``num_classes`` strings, or ``None``."""
    if value is None:
        return None
    expected = f'{name} must be {num_classes} strings, got '
    if isinstance(value, str):      # a str is a sequence of strings, one per character
        raise WrongTypeError(f'{expected}{value!r}')
    try:
        names = tuple(value)
    except TypeError:
        raise WrongTypeError(f'{expected}{value!r}') from None
    if len(names) != num_classes or not all(isinstance(c, str) for c in names):
        error = ValueError if len(names) != num_classes else WrongTypeError
        raise error(f'{expected}{names!r}')
    return names


def index_array(name: str, value) -> np.ndarray:
    """``value`` as a 1-D intp index array (an empty one of any dtype included)."""
    indices = np.asarray(value)
    if indices.ndim != 1 or not (np.issubdtype(indices.dtype, np.integer) or indices.size == 0):
        error = ValueError if indices.ndim != 1 else WrongTypeError
        raise error(f'{name} must be a 1-D integer array, got shape {indices.shape} '
                    f'and dtype {indices.dtype}')
    return indices.astype(np.intp)
