"""Which element of a source each value of a step is computed from.

The executors need to know that the path from an ETP op to its neurons, and
from a neuron's old state to its new one, acts element by element (position
by position), possibly through position-preserving reshapes. Positions are
tracked with integer index arrays: ``index[v]`` has the shape of variable
``v`` and holds, for each element, the flat position of the source element
it is computed from. A primitive that combines several positions of one
source (a reduction, a matmul, a convolution) *mixes* and stops the tracking.
"""
from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from ...primitive import ETPPrimitive
from .jaxpr import is_literal, sub_jaxpr


# Primitives that act element by element (operands of equal shape, or scalars).
_ELEMENTWISE = {
    'abs', 'acos', 'acosh', 'add', 'add_any', 'and', 'asin', 'asinh', 'atan', 'atan2', 'atanh',
    'cbrt', 'ceil', 'clamp', 'conj', 'convert_element_type', 'copy', 'copy_p', 'cos', 'cosh',
    'digamma', 'div', 'eq', 'erf', 'erf_inv', 'erfc', 'exp', 'exp2', 'expm1', 'floor', 'ge',
    'gt', 'imag', 'integer_pow', 'is_finite', 'le', 'lgamma', 'log', 'log1p', 'logistic', 'lt',
    'max', 'min', 'mul', 'ne', 'neg', 'nextafter', 'not', 'or', 'pow', 'real',
    'reduce_precision', 'rem', 'round', 'rsqrt', 'select_n', 'sign', 'sin', 'sinh', 'sqrt',
    'square', 'stop_gradient', 'sub', 'tan', 'tanh', 'xor',
}


def register_elementwise(primitive) -> None:
    """Declare a primitive elementwise, so it may sit between an op and its neuron.

    Needed only for a primitive whose elementwise action cannot be read from its own
    definition (see :func:`acts_elementwise`), e.g. one implemented by a foreign
    lowering. Declaring a primitive that combines positions makes gradients wrong.

    Args:
      primitive: the ``jax.extend.core.Primitive`` itself, or its name (``prim.name``).

    Raises:
      TypeError: ``primitive`` is neither.
      ValueError: a name that no primitive JAX can lower has.
    """
    if isinstance(primitive, jex_core.Primitive):
        _ELEMENTWISE.add(primitive.name)
        return
    if not isinstance(primitive, str) or not primitive:
        raise TypeError(f'register_elementwise takes a JAX primitive or its name (a non-empty '
                        f'str), got {primitive!r}.')
    known = _lowered_primitive_names()
    if known is not None and primitive not in known:
        raise ValueError(f'register_elementwise: no JAX primitive named {primitive!r} is known '
                         f'(import the module that defines it first, or pass the primitive '
                         f'object itself).')
    _ELEMENTWISE.add(primitive)


def _lowered_primitive_names():
    """The names of every primitive with a lowering rule, or ``None`` where JAX's table of
    them cannot be read (it is internal)."""
    try:
        from jax._src.interpreters import mlir
        tables = [mlir._lowerings, *mlir._platform_specific_lowerings.values()]
    except (ImportError, AttributeError):
        return None
    return {p.name for table in tables for p in table}


MIXED = 'mixed'   # marker: a value in which positions of the source are combined


class Mixing(Exception):
    """Raised with the primitive's name when positions of a source get combined."""


def positions_through(eqn, index_in: dict, *, broadcast: bool = False):
    """Index arrays of ``eqn``'s outputs given those of its dependent operands.

    Args:
      eqn: a jaxpr equation (not a call; see :func:`propagate`).
      index_in: operand position -> index array, or :data:`MIXED`.
      broadcast: allow one source element to be copied to many positions
        (true for a parameter broadcast over positions; false for states,
        whose dynamics must stay one-to-one).

    Returns:
      One index array per output.

    Raises:
      Mixing: naming the primitive, when positions get combined.
    """
    name = eqn.primitive.name
    out_avals = [v.aval for v in eqn.outvars]
    if any(v is MIXED for v in index_in.values()):
        raise Mixing(name)
    if name in _ELEMENTWISE or acts_elementwise(eqn):
        shape = out_avals[0].shape
        result = None
        for idx in index_in.values():
            if idx.shape != shape:
                try:
                    if not broadcast:
                        raise ValueError
                    idx = np.broadcast_to(idx, shape)
                except ValueError:
                    raise Mixing(f'{name} (broadcasting a {idx.shape} operand to {shape})') from None
            if result is not None and not np.array_equal(result, idx):
                raise Mixing(f'{name} (combining different positions)')
            result = idx
        return [result] * len(out_avals)
    if len(index_in) != 1:
        raise Mixing(name)
    (slot, idx), = index_in.items()
    if name == 'reshape' and slot == 0:
        return [np.reshape(idx, eqn.params['new_sizes'])]
    if name == 'transpose':
        return [np.transpose(idx, eqn.params['permutation'])]
    if name == 'squeeze':
        return [np.squeeze(idx, tuple(eqn.params['dimensions']))]
    if name == 'broadcast_in_dim' and slot == 0:
        shape = eqn.params['shape']
        if int(np.prod(shape)) != idx.size and not broadcast:
            raise Mixing('broadcast_in_dim (copies one position to many)')
        placed = [1] * len(shape)          # operand axes at their dims, size 1 elsewhere
        for axis, d in enumerate(eqn.params['broadcast_dimensions']):
            placed[d] = idx.shape[axis]
        expanded = np.reshape(idx, placed)
        return [np.broadcast_to(expanded, shape)]
    if name == 'reduce_window_sum' and broadcast:
        return [_window_source(idx, eqn.params)]
    if getattr(lax, f'{name}_p', None) is not eqn.primitive:   # not one of lax's own
        raise Mixing(f'{name}, which is not known to act element by element; if it does, '
                     f'declare it with braintrace_conv.register_elementwise({name!r})')
    raise Mixing(name)


def _window_source(index, params):
    """The source element of each window sum over a broadcast value: defined when every
    element in a window copies the same one (a bias broadcast over the pooled axes)."""
    if any(d != 1 for d in (*params['base_dilation'], *params['window_dilation'])):
        raise Mixing('reduce_window_sum (dilated)')
    padded = np.pad(index, params['padding'], constant_values=-1)   # -1: padding, no source
    windows = np.lib.stride_tricks.sliding_window_view(padded, params['window_dimensions'])
    windows = windows[tuple(slice(None, None, s) for s in params['window_strides'])]
    windows = windows.reshape(*windows.shape[:index.ndim], -1)
    real = np.where(windows < 0, windows.max(-1, keepdims=True), windows)
    source = real.max(-1)
    if np.any(source < 0) or np.any(real.min(-1) != source):
        raise Mixing('reduce_window_sum (combining different positions)')
    return source


# Primitives whose definition is being read (name -> 'impl' or 'jvp'), see acts_elementwise.
_READING: dict[str, str] = {}
_VERDICTS: dict = {}


def acts_elementwise(eqn) -> bool:
    """Whether an undeclared primitive acts element by element, read from its definition.

    Brain-ecosystem packages bring their own primitives into neuron code (braintools'
    ``heaviside_surrogate_gradient``, saiunit's ``exprel``). Such a primitive counts as
    elementwise when, at this equation's parameters and shapes, (1) every operand has
    the output's shape or is a scalar, (2) its implementation (``primitive.impl``,
    traced) carries each output element from the same element of every operand, and
    (3) so does its JVP rule, for values and tangents alike -- the executors
    differentiate through it in forward mode and BPTT through the transpose of that
    rule. Both are checked with :func:`propagate` on the traced jaxprs, so the verdict
    is a dependency analysis, not a sample. An implementation that re-binds the
    primitive itself (a lowering-only primitive) shows nothing and is not elementwise;
    inside the JVP rule the primitive may re-bind itself, then read through its
    implementation. Verdicts are cached per primitive, parameters and shapes.
    """
    prim, name = eqn.primitive, eqn.primitive.name
    if _READING.get(name) == 'impl':
        return False
    try:
        key = (prim, tuple(sorted(eqn.params.items())),
               tuple((v.aval.shape, v.aval.dtype) for v in eqn.invars))
        hash(key)
    except TypeError:       # parameters holding jaxprs or other unhashable values
        return False
    if _READING.get(name) == 'jvp':
        return _VERDICTS.get(key) or _reads_elementwise(eqn, 'impl')
    if key not in _VERDICTS:
        _VERDICTS[key] = _reads_elementwise(eqn, 'impl') and _reads_elementwise(eqn, 'jvp')
    return _VERDICTS[key]


def _reads_elementwise(eqn, part: str) -> bool:
    out_shapes = {tuple(v.aval.shape) for v in eqn.outvars}
    in_avals = [v.aval for v in eqn.invars]
    if len(out_shapes) != 1 or any(a.shape not in out_shapes and a.ndim for a in in_avals):
        return False
    shape, = out_shapes
    prim, params = eqn.primitive, eqn.params
    floats = [i for i, a in enumerate(in_avals) if jnp.issubdtype(a.dtype, jnp.inexact)]

    def impl(*args):
        out = prim.impl(*args, **params)
        return list(out) if prim.multiple_results else [out]

    def jvp(*args):
        primals, tangents = args[:len(in_avals)], args[len(in_avals):]

        def f(*fl):
            full = list(primals)
            for i, v in zip(floats, fl):
                full[i] = v
            out = prim.bind(*full, **params)
            return list(out) if prim.multiple_results else [out]

        outs, touts = jax.jvp(f, [primals[i] for i in floats], list(tangents))
        return [*outs, *touts]

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
    if part == 'jvp':
        if not floats:
            return True
        specs += [specs[i] for i in floats]
    with _reading(prim.name, part):
        try:
            closed = jax.make_jaxpr(impl if part == 'impl' else jvp)(*specs)
        except Exception:     # no impl or JVP rule to read: nothing is shown
            return False
        jaxpr = closed.jaxpr
        ident = np.arange(int(np.prod(shape, dtype=int))).reshape(shape)
        sources = {v: ident for v in jaxpr.invars if tuple(v.aval.shape) == shape}
        reach = propagate(jaxpr, sources, {})
    if reach.mixing is not None:
        return False
    return all(v not in reach.index or np.array_equal(reach.index[v], ident)
               for v in jaxpr.outvars if not is_literal(v))


@contextlib.contextmanager
def _reading(name: str, part: str):
    before = _READING.get(name)
    _READING[name] = part
    try:
        yield
    finally:
        if before is None:
            del _READING[name]
        else:
            _READING[name] = before


@dataclasses.dataclass
class Reach:
    """What :func:`propagate` found downstream of its sources."""
    index: dict           # top-level var -> index array or MIXED
    finals: dict          # hidden leaf -> index array or MIXED
    etp_inputs: set       # eqn indices of ETP ops whose x it reaches
    etp_weights: set      # eqn indices of ETP ops whose weights it reaches
    mixing: str | None    # first mixing primitive met (if any)
    sinks: set = dataclasses.field(default_factory=set)   # tracked vars read by a mixing op
    etp_x_sinks: dict = dataclasses.field(default_factory=dict)  # tracked var -> ETP eqns reading it as x
    edges: list = dataclasses.field(default_factory=list)  # (tracked invar, tracked outvar)


def propagate(jaxpr, source_vars: dict, final_of: dict, *, stop_at_finals: bool = False,
              broadcast: bool = False) -> Reach:
    """Follow the positions of ``source_vars`` forward through ``jaxpr``.

    ETP ops stop the tracking (recording whose input or weights are reached);
    with ``stop_at_finals`` so do the new hidden values (``final_of``: var ->
    hidden leaf). Besides the index arrays, records the top-level dataflow
    edges between tracked values and the tracked values read by mixing
    primitives, which :mod:`.graph` uses to find where to cut a step.
    """
    index = dict(source_vars)
    reach = Reach(index, {}, set(), set(), None)
    etp_eqns = {i for i, e in enumerate(jaxpr.eqns) if isinstance(e.primitive, ETPPrimitive)}

    def visit(eqns, index, top):
        for i, eqn in enumerate(eqns):
            deps = {slot: index[v] for slot, v in enumerate(eqn.invars)
                    if not is_literal(v) and v in index}
            if not deps:
                continue
            if top and i in etp_eqns:
                prim = eqn.primitive
                if prim.x_invar_index in deps:
                    reach.etp_inputs.add(i)
                    x_var = eqn.invars[prim.x_invar_index]
                    reach.sinks.add(x_var)
                    reach.etp_x_sinks.setdefault(x_var, set()).add(i)
                if set(prim.trainable_invars(eqn.params).values()) & set(deps):
                    reach.etp_weights.add(i)
                continue
            sub = sub_jaxpr(eqn)
            try:
                if sub is not None and len(sub.invars) == len(eqn.invars):
                    inner = {sub.invars[slot]: idx for slot, idx in deps.items()}
                    visit(sub.eqns, inner, False)
                    outs = [inner.get(v) if not is_literal(v) else None for v in sub.outvars]
                    if any(o is MIXED for o in outs):
                        raise Mixing(eqn.primitive.name)
                else:
                    outs = positions_through(eqn, deps, broadcast=broadcast)
            except Mixing as err:
                reach.mixing = reach.mixing or str(err)
                outs = [MIXED] * len(eqn.outvars)
                if top:
                    reach.sinks.update(eqn.invars[slot] for slot in deps)
            for v, idx in zip(eqn.outvars, outs):
                if idx is None:
                    continue
                if top and idx is not MIXED:
                    reach.edges.extend((eqn.invars[slot], v) for slot in deps)
                if top and v in final_of:
                    reach.finals[final_of[v]] = idx
                    if stop_at_finals:
                        continue
                index[v] = idx

    visit(jaxpr.eqns, index, True)
    return reach
