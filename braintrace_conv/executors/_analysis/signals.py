r"""The per-step quantities of online learning (``docs/theory.md``).

The state of each hidden group is cut where its ops enter (:mod:`.graph`):
``z^t = G(h^{t-1}, y^t)``, ``h^t = R(z^t)``, elementwise. For one step
:func:`step_signals` computes, with JAX transformations of the captured step and
no hand-written Jacobians (every ETP op replaced by its recorded output, so no
convolution is recomputed), one function per quantity:

* ``g^t``   — ``dL^t/dz^t``: the loss of step ``t`` differentiated with respect
  to a perturbation of each cut value where it is produced, so every later use
  within the step (spikes, resets, next layers, readout) counts
  (:func:`learning_signals`). When one cut value is computed from another within
  the step (``Q = dz/d eps`` is not the identity), that path belongs to the
  transition: ``g = Q^{-T} dL/d eps`` (:func:`chained_learning_signal`);
* ``gamma^t`` — ``dL^t/dy^t`` for readouts, and the whole within-step gradient
  of parameters used outside ETP weight slots, from the same VJP;
* ``D^t``   — ``dz^t/dz^{t-1} = A^t R^{t-1}``, ``m x m`` per element
  (:func:`transition`), with ``A^t = dz^t/dh^{t-1}`` (:func:`state_jacobian`) and
  ``R^{t-1} = dh^{t-1}/dz^{t-1}`` carried from the previous step
  (:func:`release_jacobians`; the identity when the cut is the new state). When
  ``A^t`` reads the old state but not the step's inputs
  (:func:`jacobian_reads_only_state`), the executors evaluate it at the end of
  step ``t-1``, where the same state's learning signal is computed, so the two
  share their work;
* ``Df^t``  — ``dz^t/dy^t`` per grouped op, in the op's output layout
  (:func:`output_jacobian`);
* for each :class:`~.graph.DynamicParam` ``phi``: ``G_phi^t = dz^t/dphi`` at
  fixed ``h^{t-1}`` (:func:`parameter_jacobians`) and the input of its trace
  ``A^t R_phi^{t-1} + G_phi^t`` with ``R_phi^{t-1} = dh^{t-1}/dphi`` at fixed
  ``z^{t-1}`` (:func:`dynamic_trace_inputs`).

The last four, what advances the traces, come from :func:`trace_inputs`, also on their
own: a windowed executor takes them from the step its BPTT evaluates.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .graph import StepGraph
from .hops import boundary_derivatives
from .jaxpr import is_literal, reached_from


@dataclasses.dataclass
class StepSignals:
    """Everything one step gives the online executors (:func:`step_signals`)."""
    loss: jax.Array
    new_hidden: list
    outputs: list
    op_inputs: dict     # op index -> x^t
    g: list             # per group: (*group.shape, m)
    gamma: dict         # readout op index -> dL/dy
    direct_grads: list  # per direct parameter (sorted leaf order): within-step gradient
    D: list             # per group: (*group.shape, m, m)
    Df: dict            # grouped op index -> (*y.shape, m), output layout
    phi_inst: list      # per dynamic parameter entry: G_phi, (*group.shape, m)
    phi_in: list        # per dynamic parameter entry: trace input, (*group.shape, m)
    release: dict       # carry for the next step (see init_release)
    A_next: list = None  # with next_jacobian: the next step's dz/dh_prev (see state_jacobian)
    psi: list = ()      # per hop asked for: db/dz of the group read, (*group.shape, m)


def init_release(graph: StepGraph, dtype) -> dict:
    """The release Jacobians before the first step, ``R^0`` and ``R_phi^0``, all zero (the
    initial state does not depend on the cut or the parameters): ``(*shape, n, m)`` per
    group whose cut is not its new state, ``(*shape, n)`` per dynamic parameter of such a
    group."""
    R = {gi: jnp.zeros((*grp.shape, grp.n, grp.m), dtype)
         for gi, grp in enumerate(graph.groups) if not grp.identity_release}
    Rphi = {j: jnp.zeros((*graph.groups[dp.group].shape, graph.groups[dp.group].n), dtype)
            for j, dp in enumerate(graph.dynamic_params) if dp.group in R}
    return dict(R=R, Rphi=Rphi)


def _hidden_basis(graph: StepGraph, hidden, column: int):
    """Ones on the hidden leaves that are state variable ``column`` of their group."""
    out = []
    for leaf, h in enumerate(hidden):
        gi = graph.group_of_leaf.get(leaf)
        hit = gi is not None and graph.groups[gi].leaves.index(leaf) == column
        out.append(jnp.ones_like(h) if hit else jnp.zeros_like(h))
    return out


def _cut_basis(graph: StepGraph, cut_values, column: int):
    """Ones on the cut values that are cut variable ``column`` of their group."""
    out, i = [], 0
    for grp in graph.groups:
        for c in range(grp.m):
            fill = jnp.ones_like if c == column else jnp.zeros_like
            out.append(fill(cut_values[i]))
            i += 1
    return out


def _per_group(graph: StepGraph, flat_cut, n_extra: int = 0):
    """Flat list over ``graph.cut_vars`` -> per group ``(*shape, m, *extra)``."""
    out, i = [], 0
    for grp in graph.groups:
        out.append(grp.to_hidden(flat_cut[i:i + grp.m], n_extra))
        i += grp.m
    return out


def _stack_columns(columns, count):
    """The first ``count`` column arrays ``(..., r)`` -> ``(..., r, count)`` (the columns
    are computed for the largest group; a smaller group uses its first ``count``)."""
    return jnp.stack(columns[:count], axis=-1)


def state_jacobian(graph: StepGraph, hidden, params, weights, inputs, op_outputs, *,
                   rest=None) -> list:
    """``A^t = dz^t/dh^{t-1}`` per group, ``(*group.shape, m, n)``: one forward-mode pass
    per state variable through the step with its ETP outputs ``op_outputs`` (``{op index:
    y}``) in place of the ops, so no convolution is recomputed."""
    run = lambda h: graph.run(h, params, inputs, weights=weights, op_outputs=op_outputs,
                              rest=rest)[2]['cut']
    n_max = max([grp.n for grp in graph.groups], default=0)
    cols = [_per_group(graph, jax.jvp(run, (hidden,), (_hidden_basis(graph, hidden, c),))[1])
            for c in range(n_max)]
    return [_stack_columns([col[gi] for col in cols], grp.n)
            for gi, grp in enumerate(graph.groups)]


def jacobian_reads_only_state(graph: StepGraph) -> bool:
    """Whether :func:`state_jacobian` depends on the old state but not on the step's inputs
    and ETP outputs (as for a spiking neuron whose input current is added to its state).
    Then the Jacobian a step needs can be evaluated at the end of the step before, beside
    the learning signal of the same state, and XLA shares their work (the surrogate
    derivative). A Jacobian that depends on neither (a leak) stays in its step, where XLA
    folds it to a constant."""
    step = graph.step
    specs = lambda variables: [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in variables]
    h, p, x = specs(step.hidden_vars), specs(step.param_vars), specs(step.input_vars)
    y = {k: jax.ShapeDtypeStruct(op.y_aval.shape, op.y_aval.dtype)
         for k, op in enumerate(graph.ops)}
    jaxpr = jax.make_jaxpr(lambda h, p, x, y: state_jacobian(graph, h, p, graph.weights(p),
                                                             x, y))(h, p, x, y).jaxpr
    n_h, first_x = len(h), len(h) + len(p)
    reaches = lambda sources: any(not is_literal(v) and v in reached_from(jaxpr, sources)
                                  for v in jaxpr.outvars)
    return reaches(set(jaxpr.invars[:n_h])) and not reaches(set(jaxpr.invars[first_x:]))


def step_signals(graph: StepGraph, hidden, params, weights, inputs, target, loss_fn,
                 release, *, rest=None, A=None,
                 next_jacobian: bool = False, hops=()) -> StepSignals:
    """Evaluate one step and all learning signals (see module docstring).

    Args:
      graph: the analysed step.
      hidden, params, inputs: flat leaves at step ``t`` (``hidden`` is ``h^{t-1}``).
      weights: ``graph.weights(params)``, the ETP weight operands.
      target: the step's target pytree, passed to ``loss_fn``.
      loss_fn: ``loss_fn(output, target) -> scalar``.
      release: the previous step's ``StepSignals.release`` (or :func:`init_release`).
      rest: a :class:`~.held.Rest`: the Jacobians of the dynamics at rest, spikes
        held constant (:mod:`.held`), which then describe the leak and couplings only.
      A: this step's :func:`state_jacobian`, if already evaluated (see
        :func:`jacobian_reads_only_state`); computed here otherwise.
      next_jacobian: also evaluate the next step's, at the new state (``A_next``).
      hops: :class:`~.hops.Hop` entries whose ``psi`` (:func:`~.hops.boundary_derivatives`)
        the caller needs.
    """
    eps0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in graph.cut_vars]
    loss, new_h, out, record, g, gamma, direct_grads = learning_signals(
        graph, hidden, params, weights, inputs, target, loss_fn, eps0)
    at = step_point(graph, hidden, params, weights, inputs, record['op_outputs'], rest)
    if any(grp.chained for grp in graph.groups):
        g = chained_learning_signal(at, eps0, record['cut'], g)
    psi = boundary_derivatives(graph, at, list(hops)) if hops else ()
    return StepSignals(loss, new_h, out, record['op_inputs'], g, gamma, direct_grads,
                       **trace_inputs(at, record['cut'], new_h, release, A=A,
                                      next_jacobian=next_jacobian), psi=psi)


def trace_inputs(at: StepPoint, z, new_hidden, release, *, A=None,
                 next_jacobian: bool = False) -> dict:
    """What advances the traces by one step, from the step at its point ``at`` (its ETP
    outputs in place of the ops), its cut values ``z`` and new hidden leaves
    ``new_hidden``: the :class:`StepSignals` fields ``D, Df, phi_inst, phi_in, release,
    A_next`` (``A``, ``next_jacobian`` and ``release`` as for :func:`step_signals`).

    A step evaluated once, with its ops, gives ``z``, ``new_hidden`` and the ops' outputs
    (:meth:`~.graph.StepGraph.run`'s record): nothing of it is evaluated again here but
    the step's elementwise part, in the forward and reverse passes of its Jacobians."""
    graph, rest = at.graph, at.rest
    if A is None:
        A = state_jacobian(graph, at.hidden, at.params, at.weights, at.inputs, at.op_outputs,
                           rest=rest)
    A_next = (state_jacobian(graph, new_hidden, at.params, at.weights, at.inputs,
                             at.op_outputs, rest=rest) if next_jacobian else None)
    phi_inst, phi_in = dynamic_trace_inputs(graph, A, parameter_jacobians(at), release)
    return dict(D=transition(graph, A, release), Df=output_jacobian(at, z), phi_inst=phi_inst,
                phi_in=phi_in, release=release_jacobians(at, z, release), A_next=A_next)


def scalar_loss(loss_fn, output, target):
    """``loss_fn(output, target)``, checked to be a scalar."""
    loss = loss_fn(output, target)
    if jnp.shape(loss) != ():
        raise ValueError(f'loss_fn must return a scalar, got shape {jnp.shape(loss)}.')
    return loss


def learning_signals(graph: StepGraph, hidden, params, weights, inputs, target, loss_fn,
                     eps0):
    """The step's loss and, from one VJP, ``dL^t/d eps`` per group, ``gamma`` and the
    within-step gradients of the parameters used outside ETP weight slots.

    ``eps`` (zeros ``eps0``) is added to every cut value where it is produced, so
    ``dL^t/d eps`` sees every later use within the step; it is the learning signal
    ``g^t = dL^t/dz^t`` unless a cut value is computed from another
    (:func:`chained_learning_signal`). ``gamma = dL^t/dy^t`` for each readout.

    Returns:
      ``(loss, new_hidden, outputs, record, g per group (*shape, m), {readout: gamma},
      [within-step gradient per sorted direct parameter])``, ``record`` as returned by
      :meth:`~.graph.StepGraph.run`.
    """
    readouts = [k for k, op in enumerate(graph.ops) if op.group is None]
    direct = sorted(graph.direct_params)

    def forward(eps, deltas, direct_values):
        p = list(params)
        for leaf, v in zip(direct, direct_values):
            p[leaf] = v
        new_h, out, record = graph.run(hidden, p, inputs, weights=weights,
                                       eps=dict(zip(graph.cut_vars, eps)),
                                       delta=dict(zip(readouts, deltas)))
        loss = scalar_loss(loss_fn, jax.tree.unflatten(graph.step.out_tree, out), target)
        return loss, (new_h, out, record)

    deltas0 = [jnp.zeros(graph.ops[k].y_aval.shape, graph.ops[k].y_aval.dtype) for k in readouts]
    loss, vjp, (new_h, out, record) = jax.vjp(forward, eps0, deltas0,
                                              [params[leaf] for leaf in direct], has_aux=True)
    g_eps, gammas, direct_grads = vjp(jnp.ones_like(loss))
    return (loss, new_h, out, record, _per_group(graph, g_eps), dict(zip(readouts, gammas)),
            list(direct_grads))


@dataclasses.dataclass(frozen=True, eq=False)
class StepPoint:
    """One step at the point where its Jacobians are taken (:func:`step_point`).

    The ETP op outputs ``op_outputs`` stand for the ops, so no op is evaluated again
    and every path through an op is cut; ``deltas`` (zeros, one per grouped op) and
    ``phis`` (the values of the parameter leaves inside the dynamics, in
    ``dynamic_leaves`` order) are where the outputs and those parameters are varied.
    """
    graph: StepGraph
    hidden: list
    params: list
    weights: list
    inputs: list
    op_outputs: dict
    rest: object           # a held.Rest, or None
    grouped: list          # indices of the ops that feed a group
    dynamic_leaves: list   # parameter leaves with a DynamicParam
    deltas: list
    phis: list

    def run(self, deltas, phis, *, eps=None, override=None):
        """``(new hidden leaves, cut values)`` with ``deltas`` added to the grouped ops'
        outputs, the dynamic parameter leaves set to ``phis``, and ``eps`` added to (or
        ``override`` replacing) the values of ``graph.cut_vars``."""
        p = list(self.params)
        for leaf, v in zip(self.dynamic_leaves, phis):
            p[leaf] = v
        cut_vars = self.graph.cut_vars
        new, _, record = self.graph.run(
            self.hidden, p, self.inputs, weights=self.weights, op_outputs=self.op_outputs,
            rest=self.rest, delta=dict(zip(self.grouped, deltas)),
            eps=None if eps is None else dict(zip(cut_vars, eps)),
            override=None if override is None else dict(zip(cut_vars, override)))
        return new, record['cut']


def step_point(graph: StepGraph, hidden, params, weights, inputs, op_outputs,
               rest=None) -> StepPoint:
    """The :class:`StepPoint` of one step, from its leaves and ETP outputs."""
    grouped = [k for k, op in enumerate(graph.ops) if op.group is not None]
    dynamic_leaves = sorted({dp.leaf for dp in graph.dynamic_params})
    deltas = [jnp.zeros(graph.ops[k].y_aval.shape, graph.ops[k].y_aval.dtype) for k in grouped]
    return StepPoint(graph, hidden, params, weights, inputs, op_outputs, rest, grouped,
                     dynamic_leaves, deltas, [params[leaf] for leaf in dynamic_leaves])


def _largest_cut(graph: StepGraph) -> int:
    return max([grp.m for grp in graph.groups], default=0)


def _unit_tangent(values: list, i: int) -> list:
    """Tangents of ``values``: ones for entry ``i``, zeros elsewhere."""
    tangents = [jnp.zeros_like(v) for v in values]
    tangents[i] = jnp.ones_like(values[i])
    return tangents


def output_jacobian(at: StepPoint, z) -> dict:
    """``Df^t = dz^t/dy^t`` per grouped op, ``(*y.shape, m)`` in the op's output layout.

    One reverse-mode pass per cut column ``r``: the VJP of ``y -> z`` with the cotangent
    that is one on column ``r`` of every group's cut gives row ``r`` of ``Df`` for every
    op at once (ops of one group read disjoint outputs, groups disjoint cuts).
    """
    if not at.grouped:
        return {}
    graph = at.graph
    _, vjp_cut = jax.vjp(lambda d: at.run(d, at.phis)[1], at.deltas)
    rows = [vjp_cut(_cut_basis(graph, z, r))[0] for r in range(_largest_cut(graph))]
    return {k: jnp.stack([rows[r][j] for r in range(graph.groups[graph.ops[k].group].m)],
                         axis=-1)
            for j, k in enumerate(at.grouped)}


def parameter_jacobians(at: StepPoint) -> dict:
    """``G_phi^t = dz^t/dphi`` at fixed ``h^{t-1}``: ``{leaf: per group (*shape, m)}``, one
    forward-mode pass per parameter leaf inside the dynamics (all its elements at once:
    :class:`~.graph.DynamicParam` says which element each neuron uses)."""
    return {leaf: _per_group(at.graph, jax.jvp(lambda ph: at.run(at.deltas, ph)[1],
                                               (at.phis,), (_unit_tangent(at.phis, i),))[1])
            for i, leaf in enumerate(at.dynamic_leaves)}


def chained_learning_signal(at: StepPoint, eps0, z, g_eps: list) -> list:
    """``g = Q^{-T} dL/d eps`` for the groups whose cut values are computed from one
    another within the step, ``Q = dz/d eps`` (``m x m`` per element, one forward pass
    per cut column): that path belongs to the transition, and the learning signal of a
    cut value holds the others fixed. Other groups keep ``g = dL/d eps``."""
    graph = at.graph
    q_cols = [_per_group(graph, jax.jvp(lambda e: at.run(at.deltas, at.phis, eps=e)[1],
                                        (eps0,), (_cut_basis(graph, z, c),))[1])
              for c in range(_largest_cut(graph))]
    return [jnp.linalg.solve(jnp.swapaxes(_stack_columns([col[gi] for col in q_cols], grp.m),
                                          -1, -2), gg[..., None])[..., 0]
            if grp.chained else gg for gi, (grp, gg) in enumerate(zip(graph.groups, g_eps))]


def release_jacobians(at: StepPoint, z, release: dict) -> dict:
    """The release Jacobians carried to the next step, for the groups in ``release``:
    ``R^t = dh^t/dz^t`` (``(*shape, n, m)``) and ``R_phi^t = dh^t/dphi`` at fixed
    ``z^t`` (``(*shape, n)``), by forward passes with the cut values replaced by ``z``."""
    new_release = dict(R={}, Rphi={})
    if not release['R']:
        return new_release
    graph = at.graph
    new_of = lambda h_new, grp: jnp.stack([h_new[leaf] for leaf in grp.leaves], axis=-1)
    r_cols = [jax.jvp(lambda zz: at.run(at.deltas, at.phis, override=zz)[0], (z,),
                      (_cut_basis(graph, z, c),))[1] for c in range(_largest_cut(graph))]
    for gi in release['R']:
        grp = graph.groups[gi]
        new_release['R'][gi] = jnp.stack([new_of(col, grp) for col in r_cols[:grp.m]], axis=-1)
    for j in release['Rphi']:
        dp = graph.dynamic_params[j]
        tangents = _unit_tangent(at.phis, at.dynamic_leaves.index(dp.leaf))
        col = jax.jvp(lambda ph: at.run(at.deltas, ph, override=z)[0], (at.phis,),
                      (tangents,))[1]
        new_release['Rphi'][j] = new_of(col, graph.groups[dp.group])
    return new_release


def transition(graph: StepGraph, A: list, release: dict) -> list:
    """``D^t = dz^t/dz^{t-1} = A^t R^{t-1}`` per group (``(*shape, m, m)``), with
    ``A^t = dz^t/dh^{t-1}`` (:func:`state_jacobian`) and the previous step's release
    ``R^{t-1}``; ``D^t = A^t`` for a group whose cut is its new state."""
    return [jnp.einsum('...mn,...nk->...mk', A[gi], release['R'][gi])
            if gi in release['R'] else A[gi] for gi in range(len(graph.groups))]


def dynamic_trace_inputs(graph: StepGraph, A: list, G_phi: dict, release: dict):
    """Per :class:`~.graph.DynamicParam`: ``G_phi^t`` and the input of its trace,
    ``G_phi^t + A^t R_phi^{t-1}`` (the second term only when the group's cut is not its
    new state), each ``(*shape, m)``."""
    phi_inst, phi_in = [], []
    for j, dp in enumerate(graph.dynamic_params):
        inst = G_phi[dp.leaf][dp.group]
        phi_inst.append(inst)
        if j in release['Rphi']:
            inst = inst + jnp.einsum('...mn,...n->...m', A[dp.group], release['Rphi'][j])
        phi_in.append(inst)
    return phi_inst, phi_in
