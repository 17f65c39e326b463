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

import dataclasses

import numpy as np

from ..primitive import ETPPrimitive
from .jaxpr import is_literal, sub_jaxpr

__all__ = ['register_elementwise', 'MIXED', 'Mixing', 'positions_through', 'Reach', 'propagate']

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


def register_elementwise(name: str) -> None:
    """Declare primitive ``name`` elementwise, so it may sit between an op and its neuron."""
    _ELEMENTWISE.add(name)


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
    if name in _ELEMENTWISE:
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
    (pos, idx), = index_in.items()
    if name == 'reshape' and pos == 0:
        return [np.reshape(idx, eqn.params['new_sizes'])]
    if name == 'transpose':
        return [np.transpose(idx, eqn.params['permutation'])]
    if name == 'squeeze':
        return [np.squeeze(idx, tuple(eqn.params['dimensions']))]
    if name == 'broadcast_in_dim' and pos == 0:
        shape = eqn.params['shape']
        if int(np.prod(shape)) != idx.size and not broadcast:
            raise Mixing('broadcast_in_dim (copies one position to many)')
        expanded = np.reshape(idx, [shape[d] if d in eqn.params['broadcast_dimensions'] else 1
                                    for d in range(len(shape))])
        return [np.broadcast_to(expanded, shape)]
    raise Mixing(name)


@dataclasses.dataclass
class Reach:
    """What :func:`propagate` found downstream of its sources."""
    index: dict           # top-level var -> index array or MIXED
    finals: dict          # hidden leaf -> index array or MIXED
    outputs: bool         # reaches an output leaf
    etp_inputs: set       # eqn indices of ETP ops whose x it reaches
    etp_weights: set      # eqn indices of ETP ops whose weights it reaches
    mixing: str | None    # first mixing primitive met (if any)
    sinks: set = dataclasses.field(default_factory=set)   # tracked vars read by a mixing op
    etp_x_sinks: dict = dataclasses.field(default_factory=dict)  # tracked var -> ETP eqns reading it as x
    edges: list = dataclasses.field(default_factory=list)  # (tracked invar, tracked outvar)


def propagate(jaxpr, source_vars: dict, final_of: dict, out_vars: set,
              stop_at_finals: bool = False, broadcast: bool = False) -> Reach:
    """Follow the positions of ``source_vars`` forward through ``jaxpr``.

    ETP ops stop the tracking (recording whose input or weights are reached);
    with ``stop_at_finals`` so do the new hidden values (``final_of``: var ->
    hidden leaf). Besides the index arrays, records the top-level dataflow
    edges between tracked values and the tracked values read by mixing
    primitives, which :mod:`.graph` uses to find where to cut a step.
    """
    index = dict(source_vars)
    reach = Reach(index, {}, False, set(), set(), None)
    etp_eqns = {i for i, e in enumerate(jaxpr.eqns) if isinstance(e.primitive, ETPPrimitive)}

    def visit(eqns, index, top):
        for i, eqn in enumerate(eqns):
            deps = {p: index[v] for p, v in enumerate(eqn.invars)
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
                    inner = {sub.invars[p]: idx for p, idx in deps.items()}
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
                    reach.sinks.update(eqn.invars[p] for p in deps)
            for v, idx in zip(eqn.outvars, outs):
                if idx is None:
                    continue
                if top and idx is not MIXED:
                    reach.edges.extend((eqn.invars[p], v) for p in deps)
                if top and v in final_of:
                    reach.finals[final_of[v]] = idx
                    if stop_at_finals:
                        continue
                index[v] = idx

    visit(jaxpr.eqns, index, True)
    reach.outputs = any(v in index for v in out_vars)
    return reach
