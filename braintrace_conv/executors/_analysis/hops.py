r"""Where one group of neurons is read by the op of another: the one-hop cross-layer path.

ES-D-RTRL's cross-layer trace (``cross_layer=1``, ``docs/theory.md``) follows the effect
of a group ``l``'s state through the dynamics of the neurons driven by an op ``m`` that
reads ``l``. Within one step that read is split in two:

* ``psi^t = db^t/dz_l^t``, elementwise: ``b`` is the last value on the way from ``l``'s
  state cut ``z_l`` to ``m``'s input that is one value per neuron of ``l`` (the spikes;
  :attr:`Hop.boundary`). It changes from step to step (a surrogate derivative) and is
  kept per neuron in the traces (:func:`boundary_derivatives`);
* ``J = dy_m/db``: pooling, reshapes and the op ``m`` itself, which must be linear in
  ``b`` and read nothing else (:func:`reader_transpose`); it is applied at contraction
  time, to a cotangent on ``m``'s output.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .graph import StepGraph
from .jaxpr import bind_eqn, depends_on, interpret, is_literal, read, sub_jaxpr
from .positions import MIXED, propagate


@dataclasses.dataclass(frozen=True, eq=False)
class Hop:
    """Group ``source``'s neurons read by grouped op ``reader`` (of another group).

    Attributes:
      source: index of the group read.
      reader: index of the op that reads it.
      boundary: the jaxpr variable ``b`` (see module docstring).
      to_hidden: ``None`` when ``b`` is in the group's hidden layout, else the hidden
        flat position of each flat element of ``b``.
      own: ``b`` is computed from no other group's cut within the step (so one
        forward-mode pass gives the ``psi`` of every such hop at once).
    """
    source: int
    reader: int
    boundary: Any
    to_hidden: np.ndarray | None
    own: bool = True

    def hidden_of(self, graph: StepGraph, b):
        """A ``b``-shaped array in the source group's hidden layout."""
        if self.to_hidden is None:
            return b
        flat = jnp.reshape(b, (-1,))[np.argsort(self.to_hidden)]
        return jnp.reshape(flat, graph.groups[self.source].shape)


def find_hops(graph: StepGraph) -> list[Hop]:
    """Every (group, op of another group reading it) pair of the step, with the value
    ``b`` where the read leaves the group's neurons.

    Raises:
      ValueError: naming the op and the neurons, when ``m``'s input depends on the group's
        state other than through one value per neuron followed by a linear map.
    """
    hops, reached = [], []
    for gi, grp in enumerate(graph.groups):
        size = int(np.prod(grp.shape))
        sources = {v: (np.arange(size) if perm is None else np.asarray(perm)).reshape(v.aval.shape)
                   for v, perm in zip(grp.cut, grp.cut_to_hidden)}
        # positions followed up to the ETP ops: a later layer's op is read through its own
        reach = propagate(graph.step.closed_jaxpr.jaxpr, sources, {})
        reached.append(set(reach.index))
        for m, op in enumerate(graph.ops):
            if op.group is not None and op.group != gi and op.eqn in reach.etp_inputs:
                hops.append(Hop(gi, m, *_boundary(graph, grp, op, reach)))
    return [dataclasses.replace(h, own=not any(h.boundary in reached[gi]
                                               for gi in range(len(graph.groups))
                                               if gi != h.source)) for h in hops]


def _boundary(graph: StepGraph, grp, op, reach):
    jaxpr = graph.step.closed_jaxpr.jaxpr
    size = int(np.prod(grp.shape))
    order = {v: n for n, e in enumerate(jaxpr.eqns) for v in e.outvars}
    candidates = [v for v, idx in reach.index.items()
                  if idx is not MIXED and np.size(idx) == size
                  and np.array_equal(np.sort(np.ravel(idx)), np.arange(size))
                  and (v is op.x_var or depends_on(jaxpr, op.x_var, {v}))]
    for b in sorted(candidates, key=lambda v: order.get(v, -1), reverse=True):
        if _function_of(graph, b, op) is not None:
            flat = np.ravel(reach.index[b])
            return b, None if np.array_equal(flat, np.arange(size)) else flat
    raise ValueError(f'cross_layer=1: the input of {op.label} is not computed from one value '
                     f'per neuron of {grp.names} (their spikes) alone; the one-hop trace needs '
                     f'that input to be a linear map (pooling, reshapes) of such values.')


def _function_of(graph: StepGraph, b, op):
    """``x_m`` as a function of ``b`` alone (``None`` when it reads anything else)."""
    def x_of(value):
        env = _slice(graph, b, value)
        return read(env, op.x_var)
    out = jax.eval_shape(x_of, jax.ShapeDtypeStruct(b.aval.shape, b.aval.dtype))
    return x_of if out is not None else None


def _slice(graph: StepGraph, b, value) -> dict:
    """The step evaluated from ``b = value`` alone: every value that reads anything but
    ``b`` and constants is unknown (``None``), ETP ops included."""
    def bind(i, eqn, invals):
        if any(val is None for val in invals) or i in op_eqns:
            return [None] * len(eqn.outvars)
        return None
    op_eqns = {o.eqn for o in graph.ops}
    return interpret(graph.step.closed_jaxpr, {}, bind=bind,
                     write=lambda v, val: value if v is b else val)


#: Primitives linear in each operand that depends on ``b`` (the others must not).
_LINEAR = {
    'add', 'add_any', 'sub', 'neg', 'reshape', 'squeeze', 'expand_dims', 'broadcast_in_dim',
    'transpose', 'convert_element_type', 'copy', 'copy_p', 'reduce_sum', 'reduce_window_sum',
    'pad', 'slice', 'dynamic_slice', 'concatenate', 'rev', 'cumsum', 'real', 'imag',
    'select_n', 'conv_general_dilated', 'dot_general', 'mul', 'div',
}
#: Of those, the ones linear in one operand only (a product, a quotient by a constant).
_LINEAR_IN_ONE = {'mul': None, 'div': 0, 'conv_general_dilated': None, 'dot_general': None,
                  'select_n': -1}


def check_linear(graph: StepGraph, hop: Hop) -> None:
    """Refuse a map from ``b`` to the reader's input that is not linear (max pooling)."""
    op = graph.ops[hop.reader]
    jaxpr = graph.step.closed_jaxpr.jaxpr
    # the equations between b and the reader's input (other ops' outputs not followed)
    on_path = [i for i, e in enumerate(jaxpr.eqns) if i not in {o.eqn for o in graph.ops}
               and any(o is op.x_var or depends_on(jaxpr, op.x_var, {o}) for o in e.outvars)]
    culprit = _nonlinear(jaxpr, {hop.boundary}, on_path)
    if culprit is not None:
        raise ValueError(f'cross_layer=1: the input of {op.label} is not a linear map of the '
                         f'spikes of {graph.groups[hop.source].names} ({culprit} is on the '
                         f'way); use average or sum pooling there, or cross_layer=0.')


def _nonlinear(jaxpr, linear: set, eqns=None):
    """The first primitive of ``jaxpr`` (of its equations ``eqns``, by index; all by
    default) that is not linear in the values computed from ``linear`` (which it
    extends), or ``None``."""
    for i, eqn in enumerate(jaxpr.eqns):
        if eqns is not None and i not in eqns:
            continue
        hits = [i for i, v in enumerate(eqn.invars) if not is_literal(v) and v in linear]
        if not hits:
            continue
        name = eqn.primitive.name
        sub = sub_jaxpr(eqn)
        if sub is not None and len(sub.invars) == len(eqn.invars):
            inner = {sub.invars[i] for i in hits}
            culprit = _nonlinear(sub, inner)
            if culprit is not None:
                return culprit
            linear |= {o for o, so in zip(eqn.outvars, sub.outvars)
                       if not is_literal(so) and so in inner}
            continue
        if name == 'reduce_window' and all(e.primitive.name == 'add'
                                           for e in eqn.params['jaxpr'].eqns):
            pass
        elif name not in _LINEAR:
            return name
        elif name in _LINEAR_IN_ONE:
            allowed = _LINEAR_IN_ONE[name]
            if allowed == -1:                          # select_n: the predicate is data-free
                if 0 in hits:
                    return name
            elif allowed is None and len(hits) > 1:     # a product of two such values
                return name
            elif allowed is not None and hits != [allowed]:
                return name
        linear |= set(eqn.outvars)
    return None


def reader_transpose(graph: StepGraph, hop: Hop, weights, cotangent):
    """``J^T cotangent``: a cotangent on the reader's output (its output layout) pulled
    back to ``b`` (``b``'s shape), with the reader's weight operands ``weights``."""
    op = graph.ops[hop.reader]
    eqn = graph.step.closed_jaxpr.jaxpr.eqns[op.eqn]

    def y_of(b):
        env = _slice(graph, hop.boundary, b)
        invals = [read(env, v) for v in eqn.invars]
        for name, slot in op.weight_slots.items():
            invals[slot] = weights[name]
        return bind_eqn(eqn, invals)[0]

    b0 = jnp.zeros(hop.boundary.aval.shape, cotangent.dtype)
    _, vjp = jax.vjp(y_of, b0)
    return vjp(cotangent.astype(b0.dtype))[0]


def boundary_derivatives(graph: StepGraph, at, hops: list) -> list:
    """``psi^t = db^t/dz^t`` per hop, ``(*source group shape, m)`` in the hidden layout, at
    the step point ``at`` (:class:`~.signals.StepPoint`, the ETP outputs held): one
    forward-mode pass per cut column for every hop whose ``b`` reads its own group's cut
    only (the tangent is one on that column of every group's cut), one per group read
    and column for the others."""
    cut_vars = graph.cut_vars
    eps0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in cut_vars]
    out = [None] * len(hops)
    batches = [[j for j, h in enumerate(hops) if h.own]]
    batches += [[j for j, h in enumerate(hops) if not h.own and h.source == gi]
                for gi in sorted({h.source for h in hops if not h.own})]
    for mine in [b for b in batches if b]:
        groups = {hops[j].source for j in mine}
        watched = [hops[j].boundary for j in mine]
        run = lambda e: graph.run(at.hidden, at.params, at.inputs, weights=at.weights,
                                  op_outputs=at.op_outputs, rest=at.rest,
                                  eps=dict(zip(cut_vars, e)), watch=watched)[2]['watch']
        columns = []
        for c in range(max(graph.groups[gi].m for gi in groups)):
            column = {grp.cut[c] for gi, grp in enumerate(graph.groups)
                      if gi in groups and c < grp.m}
            tangent = [jnp.ones_like(e) if v in column else jnp.zeros_like(e)
                       for v, e in zip(cut_vars, eps0)]
            columns.append(jax.jvp(run, (eps0,), (tangent,))[1])
        for n, j in enumerate(mine):
            width = graph.groups[hops[j].source].m
            out[j] = jnp.stack([hops[j].hidden_of(graph, col[n]) for col in columns[:width]],
                               axis=-1)
    return out
