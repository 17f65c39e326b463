"""Argument checks shared by the command line, the trainer, the executors, the layers, the
models and the data sets.

One family: every check takes the argument's name, then its value (then options), and
returns the checked value, converted where the check says so (:func:`finite` returns
nothing), or raises an :class:`ArgumentError` whose message is one sentence: the
argument's name, what was expected, the value it got and, where there is one, the fix::

    update_every must be a positive integer, got 0.
    the learner's window must be at most update_every (2), got 4; a window never spans
    two online chunks.

A value of the wrong type raises :class:`WrongTypeError`, which is both a ``TypeError``
and a ``ValueError``, so callers catching either see it; a value of the right type that
is out of range, of the wrong shape or not among the choices raises an
:class:`ArgumentError`, a ``ValueError``.

A message names arguments as the library calls them. A caller that names them
otherwise renders the same sentence with its own names (:meth:`ArgumentError.render`):
the command line says ``--update-every`` where the trainer says ``update_every``.
"""
from __future__ import annotations

import operator
from typing import Callable, Optional

import numpy as np

__all__ = ['ArgumentError', 'WrongTypeError', 'integer', 'number', 'positive', 'non_negative',
           'interval', 'at_most', 'boolean', 'one_of', 'optional', 'floating_dtype', 'positive_ints',
           'finite', 'class_labels', 'positive_range', 'height_width', 'string', 'label_array',
           'per_class_names', 'index_array']


def _shown(value) -> str:
    """A short text of ``value`` for a message: the repr of a scalar, string or short
    sequence, else its type (and shape)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return repr(value)
    if isinstance(value, (tuple, list, dict)) and len(repr(value)) <= 80:
        return repr(value)
    shape = getattr(value, 'shape', None)
    return type(value).__name__ + ('' if shape is None else f' of shape {tuple(shape)}')


class ArgumentError(ValueError):
    """An argument that is not what was expected.

    Args:
      name: The argument, as the library names it (``'update_every'``, ``'sizes[1]'``).
      value: What it got.
      expected: What was expected, as a verb phrase: ``'be a positive integer'``,
        ``'lie in (0, 1)'``. Other arguments it names are written ``{name}`` and listed
        in ``refs``.
      fix: What to do instead (optional; may name arguments of ``refs`` as well).
      refs: The other arguments the sentence names.
      shown: The text of the value (default: its repr if short, else its type).
      names: How the library words some names, e.g. ``{'num_steps': 'the number of time
        steps of the data'}`` (default: the names themselves).
      none_means: What ``None`` means for this argument, if the library accepts it
        (:func:`optional`); the message then offers it.

    Attributes:
      name, value, expected, fix, refs: As given.
    """

    def __init__(self, name: str, value, expected: str, fix: str = '', *, refs: tuple = (),
                 shown: Optional[str] = None, names: Optional[dict] = None,
                 none_means: Optional[str] = None):
        self.name, self.value, self.expected, self.fix = name, value, expected, fix
        self.refs, self.names, self.none_means = tuple(refs), dict(names or {}), none_means
        self.shown = _shown(value) if shown is None else shown
        super().__init__(self.render())

    def render(self, spell: Optional[Callable[[str], Optional[str]]] = None) -> str:
        """The message, with every argument named by ``spell(name)`` where it returns a
        name (the command line's ``--update-every``), else as the library names it. With
        ``spell`` the caller has its own way to leave an argument unset, so ``None`` is not
        offered."""
        def word(name: str) -> str:
            return (spell(name) if spell is not None else None) or self.names.get(name, name)

        def fill(text: str) -> str:
            for ref in self.refs:
                text = text.replace('{' + ref + '}', word(ref))
            return text

        expected = fill(self.expected)
        if self.none_means is not None and spell is None:
            expected = f'be None ({self.none_means}) or {expected.removeprefix("be ")}'
        message = f'{word(self.name)} must {expected}, got {self.shown}'
        return message + (f'; {fill(self.fix)}' if self.fix else '') + '.'

    def __reduce__(self):
        return _rebuilt, (type(self), dict(self.__dict__))


class WrongTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (or dtype)."""


def _rebuilt(kind: type, state: dict) -> ArgumentError:
    error = kind.__new__(kind)
    error.__dict__.update(state)
    Exception.__init__(error, error.render())
    return error


_SIGNS = {None: (lambda v: True, ''), 'positive': (lambda v: v > 0, 'positive '),
          'non-negative': (lambda v: v >= 0, 'non-negative ')}


def integer(name: str, value, *, sign: Optional[str] = None) -> int:
    """``value`` as an int (bools rejected), ``'positive'`` or ``'non-negative'`` if
    ``sign`` says so."""
    holds, word = _SIGNS[sign]
    expected = f'be a {word}integer' if word else 'be an integer'
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise WrongTypeError(name, value, expected)
    if not holds(value):
        raise ArgumentError(name, value, expected)
    return int(value)


def _real(value) -> bool:
    """Whether ``value`` is a real number: an int or float (bools excluded), a NumPy scalar
    or a 0-d array of such a dtype."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    dtype = getattr(value, 'dtype', None)
    return (dtype is not None and np.ndim(value) == 0 and np.issubdtype(dtype, np.number)
            and not np.issubdtype(dtype, np.complexfloating))


def number(name: str, value, *, sign: Optional[str] = None) -> float:
    """``value`` as a finite float (ints accepted, bools rejected), ``'positive'`` or
    ``'non-negative'`` if ``sign`` says so."""
    holds, word = _SIGNS[sign]
    expected = f'be a {word or "finite "}number'
    if not _real(value):
        raise WrongTypeError(name, value, expected)
    if not (np.isfinite(value) and holds(value)):
        raise ArgumentError(name, value, expected)
    return float(value)


def positive(name: str, value, kind: type = int):
    """``value`` as a positive ``kind``: :func:`integer` or (``float``) :func:`number`."""
    return (integer if kind is int else number)(name, value, sign='positive')


def non_negative(name: str, value) -> int:
    """``value`` as a non-negative int (:func:`integer`)."""
    return integer(name, value, sign='non-negative')


def interval(name: str, value, low: float, high: float, bounds: str = '[]', *,
             fix: str = '') -> float:
    """``value`` as a float in the interval from ``low`` to ``high``, each end included
    (``[``, ``]``) or not (``(``, ``)``) as ``bounds`` says."""
    expected = f'be a number in {bounds[0]}{low:g}, {high:g}{bounds[1]}'
    if not _real(value):
        raise WrongTypeError(name, value, expected, fix)
    above = value >= low if bounds[0] == '[' else value > low
    below = value <= high if bounds[1] == ']' else value < high
    if not (above and below):
        raise ArgumentError(name, value, expected, fix)
    return float(value)


def at_most(name: str, value, limit, limit_name: str, *, fix: str = '',
            names: Optional[dict] = None):
    """``value`` if it is at most ``limit``, the value of the argument ``limit_name``."""
    if value > limit:
        raise ArgumentError(name, value, f'be at most {{{limit_name}}} ({limit})', fix,
                            refs=(limit_name,), names=names)
    return value


def boolean(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False`` (numpy's too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise WrongTypeError(name, value, 'be True or False')
    return bool(value)


def one_of(name: str, value, choices: tuple):
    """``value`` if it is one of ``choices``."""
    if isinstance(value, (list, dict, set)) or value not in choices:
        raise ArgumentError(name, value, f'be one of {choices}')
    return value


def optional(check: Callable, name: str, value, *args, means: str, **kwargs):
    """``None``, which means ``means``, or ``check(name, value, *args, **kwargs)``; its
    message offers ``None`` too."""
    if value is None:
        return None
    try:
        return check(name, value, *args, **kwargs)
    except ArgumentError as err:
        raise type(err)(name, value, err.expected, err.fix, refs=err.refs, shown=err.shown,
                        names=err.names, none_means=means) from None


def floating_dtype(name: str, value) -> np.dtype:
    """``value`` as a floating-point dtype (``jnp.float32``, ``'bfloat16'``, ...)."""
    import jax.numpy as jnp

    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ArgumentError(name, value, 'be a floating-point dtype such as jnp.float32')
    return dtype


def positive_ints(name: str, value, n_spatial: int, default: int | None = None) -> tuple[int, ...]:
    """A positive-int tuple of length ``n_spatial`` (an int is broadcast; ``None`` gives
    ``default``, or an error naming ``name`` when there is no default)."""
    expected = f'be an int or a sequence of {n_spatial} positive ints'
    if value is None:
        if default is None:
            raise ArgumentError(name, value, f'be a sequence of {n_spatial} positive ints',
                                f'{{{name}}} is required', refs=(name,))
        return (default,) * n_spatial
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * n_spatial
    try:
        value = tuple(operator.index(v) for v in value)
    except TypeError:
        raise WrongTypeError(name, value, expected) from None
    if len(value) != n_spatial:
        raise ArgumentError(name, value, f'have {n_spatial} entries (one per spatial '
                                         f'dimension)', shown=f'{len(value)}: {value!r}')
    if any(v <= 0 for v in value):
        raise ArgumentError(name, value, 'be positive')
    return value


def finite(name: str, array, axes: tuple | None = None) -> None:
    """Raise an :class:`ArgumentError` naming the first NaN or infinity of ``array`` and
    its position.

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
    raise ArgumentError(name, array, 'be finite', shown=f'{array[where]} at {position} '
                                                        f'({int(bad.sum())} non-finite value(s) '
                                                        f'in all)')


def class_labels(name: str, labels, num_classes: int, batch: int | None = None) -> np.ndarray:
    """``labels`` as an int array ``(B,)`` with values in ``[0, num_classes)``."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise WrongTypeError(name, labels, 'be integer class labels',
                             shown=f'dtype {labels.dtype}')
    expected = '(B,)' if batch is None else f'({batch},)'
    if labels.ndim != 1 or (batch is not None and len(labels) != batch):
        raise ArgumentError(name, labels, f'have shape {expected}', shown=str(labels.shape))
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ArgumentError(name, labels, f'lie in [0, {num_classes}) (the model has '
                                          f'{num_classes} outputs)',
                            shown=f'values in [{labels.min()}, {labels.max()}]')
    return labels


def _pair(name: str, value, form: str) -> tuple:
    try:
        first, second = value
    except (TypeError, ValueError):
        raise WrongTypeError(name, value, f'be a {form} pair') from None
    return first, second


def positive_range(name: str, value) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` pair of floats with ``0 < low <= high``."""
    low, high = _pair(name, value, '(low, high)')
    low = number(f'{name}[0]', low, sign='positive')
    high = number(f'{name}[1]', high, sign='positive')
    if low > high:
        raise ArgumentError(name, value, 'satisfy low <= high')
    return low, high


def height_width(name: str, value) -> tuple[int, int]:
    """``value`` as a ``(height, width)`` pair of positive ints."""
    height, width = _pair(name, value, '(height, width)')
    return (integer(f'{name}[0]', height, sign='positive'),
            integer(f'{name}[1]', width, sign='positive'))


def string(name: str, value) -> str:
    """``value`` if it is a ``str``."""
    if not isinstance(value, str):
        raise WrongTypeError(name, value, 'be a str')
    return value


def label_array(name: str, value, num_classes) -> tuple[np.ndarray, int]:
    """A data set's ``(N,)`` integer labels in ``[0, num_classes)`` as int32, and
    ``num_classes`` as a positive int."""
    labels = np.asarray(value)
    if labels.ndim != 1:
        raise ArgumentError(name, labels, 'have shape (N,)', shown=f'shape {labels.shape}')
    if not np.issubdtype(labels.dtype, np.integer):
        raise WrongTypeError(name, labels, 'be integers', shown=f'dtype {labels.dtype}')
    num_classes = integer('num_classes', num_classes, sign='positive')
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ArgumentError(name, labels, f'lie in [0, {num_classes})',
                            shown=f'values in [{labels.min()}, {labels.max()}]')
    return labels.astype(np.int32, copy=False), num_classes


def per_class_names(name: str, value, num_classes: int) -> tuple[str, ...] | None:
    """``value`` as a tuple of ``num_classes`` strings, or ``None``."""
    if value is None:
        return None
    expected = f'be {num_classes} strings'
    if isinstance(value, str):      # a str is a sequence of strings, one per character
        raise WrongTypeError(name, value, expected)
    try:
        names = tuple(value)
    except TypeError:
        raise WrongTypeError(name, value, expected) from None
    if len(names) != num_classes or not all(isinstance(c, str) for c in names):
        error = ArgumentError if len(names) != num_classes else WrongTypeError
        raise error(name, names, expected)
    return names


def index_array(name: str, value) -> np.ndarray:
    """``value`` as a 1-D intp index array (an empty one of any dtype included)."""
    indices = np.asarray(value)
    if indices.ndim != 1 or not (np.issubdtype(indices.dtype, np.integer) or indices.size == 0):
        error = ArgumentError if indices.ndim != 1 else WrongTypeError
        raise error(name, indices, 'be a 1-D integer array',
                    shown=f'shape {indices.shape} and dtype {indices.dtype}')
    return indices.astype(np.intp)
