"""What a learner's call receives, checked before anything is compiled or run (private).

* :func:`check_sequences`: inputs and targets with one leading time axis ``T`` and one
  batch size ``B``;
* :func:`check_finite`: no NaN or infinity in them, naming the first (the gradients would
  not be finite behind a loss that may still be);
* :func:`loss_key`: the key under which a learner keeps the programs it compiled for a
  user's function (a loss function written again at every call compiles once).
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import ArgumentError, finite


def check_sequences(xs, targets):
    """``(T, B)`` of inputs ``xs`` (``(T, B, ...)`` leaves) and ``targets`` (``(T, ...)``),
    or an error saying which leaves disagree."""
    x_leaves, t_leaves = jax.tree.leaves(xs), jax.tree.leaves(targets)
    if not x_leaves:
        raise ValueError('xs is empty: expected arrays of shape (T, B, ...).')
    lengths = {np.shape(a)[0] if np.ndim(a) else None for a in x_leaves}
    if None in lengths or len(lengths) != 1:
        raise ValueError(f'every leaf of xs must have the same leading time axis (T, B, ...); '
                         f'got shapes {[np.shape(a) for a in x_leaves]}.')
    (T,) = lengths
    if T == 0:
        raise ValueError('xs has zero time steps.')
    if any(np.ndim(a) < 2 for a in x_leaves):
        raise ValueError(f'xs leaves must be (T, B, ...) with a batch axis; got shapes '
                         f'{[np.shape(a) for a in x_leaves]}.')
    t_lengths = {np.shape(a)[0] if np.ndim(a) else None for a in t_leaves}
    if t_leaves and t_lengths != {T}:
        raise ValueError(f'targets must have the same number of time steps as xs ({T}); got '
                         f'leading sizes {sorted(t_lengths, key=str)}.')
    batch = {np.shape(a)[1] for a in x_leaves}
    if len(batch) != 1:
        raise ValueError(f'xs leaves disagree on the batch size (axis 1): {sorted(batch)}.')
    return T, batch.pop()


@jax.jit
def _all_finite_on_device(leaves):
    # x * 0 is NaN exactly where x is NaN or infinite, and its sum never overflows
    return jnp.isfinite(sum(jnp.sum(a * 0) for a in leaves))


def _all_finite(leaves) -> bool:
    """Whether every element of ``leaves`` is finite: numpy for arrays in host memory
    (numpy's, or JAX's on the CPU: no copy, and faster there than a compiled reduction,
    ``benchmarks/call_overheads.py``), one compiled reduction for the others."""
    on_host = lambda a: isinstance(a, np.ndarray) or (
        a.is_fully_addressable and len(a.devices()) == 1 and next(iter(a.devices())).platform == 'cpu')
    host = [a for a in leaves if on_host(a)]
    device = [a for a in leaves if not on_host(a)]
    return (all(np.isfinite(np.asarray(a)).all() for a in host)
            and (not device or bool(_all_finite_on_device(device))))


def check_finite(name: str, tree) -> None:
    """Refuse a NaN or an infinity among the floating-point leaves of ``tree`` (``(T, B,
    ...)``), naming the first one: the gradients would not be finite, and nothing else
    would say why. One pass over the data (:func:`_all_finite`)."""
    floating = lambda a: jnp.issubdtype(jnp.result_type(a), jnp.inexact)
    leaves = [a for a in jax.tree.leaves(tree)
              if floating(a) and not isinstance(a, jax.core.Tracer)]
    if not leaves or _all_finite(leaves):
        return
    for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if floating(a) and not getattr(a, 'is_fully_addressable', True):   # across processes
            raise ArgumentError(name + jax.tree_util.keystr(path), a, 'be finite',
                                'the gradients of this call would not be finite',
                                shown='NaN or infinity (in an array spread over processes)')
        if floating(a):
            axes = ('t', 'b')[:np.ndim(a)] + tuple(f'axis {i}' for i in range(2, np.ndim(a)))
            try:
                finite(name + jax.tree_util.keystr(path), a, axes)
            except ArgumentError as err:
                raise ArgumentError(err.name, a, err.expected, fix='the gradients of this call '
                                    'would not be finite; clean the data, or construct the '
                                    'learner with check_finite=False to skip this check',
                                    shown=err.shown) from None


def loss_key(fn):
    """The key under which programs compiled for the function ``fn`` are cached.

    A plain Python function is keyed by its code and the values it reads when they are
    all hashable (defaults, closure cells, the globals its code names): a lambda written
    again at every call, ``learner.value_and_grad(lambda o, t: ..., xs, ys)``, then
    compiles once, and a captured value that changes compiles anew. Anything else (a
    callable object, a function capturing an array) is keyed by the object itself.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    code, seen, stack = fn.__code__, set(), [fn.__code__]
    names = []
    while stack:                              # the code and the code objects nested in it
        c = stack.pop()
        names += [n for n in c.co_names if n in fn.__globals__ and n not in seen]
        seen.update(c.co_names)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    values = (fn.__defaults__, tuple(sorted((fn.__kwdefaults__ or {}).items())),
              tuple(cell.cell_contents for cell in fn.__closure__ or ()),
              tuple(fn.__globals__[n] for n in names))
    typed = jax.tree.map(lambda v: (type(v), v), values)
    try:
        hash(typed)
    except TypeError:
        return fn
    return code, typed


def code_of(key):
    """The code object behind a :func:`loss_key`, or None."""
    if isinstance(key, types.FunctionType):
        return key.__code__
    if isinstance(key, tuple) and key and isinstance(key[0], types.CodeType):
        return key[0]
    return None
