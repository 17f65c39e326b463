r"""The per-step quantities of online learning (``docs/theory.md``).

The state of each hidden group is cut where its ops enter (:mod:`.graph`):
``z^t = G(h^{t-1}, y^t)``, ``h^t = R(z^t)``, elementwise. For one step this
computes, with JAX transformations of the traced step and no hand-written
Jacobians (every ETP op replaced by its recorded output, so no convolution is
recomputed):

* ``g^t``   — ``dL^t/dz^t``: the loss of step ``t`` differentiated with respect
  to a perturbation of each cut value where it is produced, so every later use
  within the step (spikes, resets, next layers, readout) counts. When one cut
  value is computed from another within the step (``Q = dz/d eps`` is not the
  identity), that path belongs to the transition: ``g = Q^{-T} dL/d eps``;
* ``D^t``   — ``dz^t/dz^{t-1} = (dz^t/dh^{t-1}) R^{t-1}``, ``m x m`` per
  element, with ``R^{t-1} = dh^{t-1}/dz^{t-1}`` carried from the previous step
  (the identity when the cut is the new state). When ``dz^t/dh^{t-1}`` reads the
  old state but not the step's inputs (:func:`jacobian_reads_only_state`), the
  executors evaluate it at the end of step ``t-1``, where the same state's
  learning signal is computed, so the two share their work;
* ``Df^t``  — ``dz^t/dy^t`` per grouped op, in the op's output layout;
* for each :class:`~.graph.DynamicParam` ``phi``: ``G_phi^t = dz^t/dphi`` at
  fixed ``h^{t-1}`` and the input of its trace ``(dz^t/dh^{t-1}) R_phi^{t-1} +
  G_phi^t`` with ``R_phi^{t-1} = dh^{t-1}/dphi`` at fixed ``z^{t-1}``;
* ``gamma^t`` — ``dL^t/dy^t`` for readouts, and the whole within-step gradient
  of parameters used outside ETP weight slots.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .graph import StepGraph
from .jaxpr import is_literal, reached_from


@dataclasses.dataclass
class StepSignals:
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


def init_release(graph: StepGraph, dtype) -> dict:
    """Zeros of ``R^{-1}`` (``(*shape, n, m)``) per group whose cut is not its new state,
    and of ``R_phi^{-1}`` (``(*shape, n)``) per dynamic parameter of such a group."""
    R = {g: jnp.zeros((*grp.shape, grp.n, grp.m), dtype) for g, grp in enumerate(graph.groups)
         if not grp.identity_release}
    Rphi = {j: jnp.zeros((*graph.groups[dp.group].shape, graph.groups[dp.group].n), dtype)
            for j, dp in enumerate(graph.dynamic_params) if dp.group in R}
    return dict(R=R, Rphi=Rphi)


def _hidden_basis(graph: StepGraph, hidden, column: int):
    """Ones on the hidden leaves that are state variable ``column`` of their group."""
    out = []
    for leaf, h in enumerate(hidden):
        g = graph.group_of_leaf.get(leaf)
        hit = g is not None and graph.groups[g].leaves.index(leaf) == column
        out.append(jnp.ones_like(h) if hit else jnp.zeros_like(h))
    return out


def _cut_basis(graph: StepGraph, cut_values, column: int):
    """Ones on the cut values that are cut variable ``column`` of their group."""
    out, i = [], 0
    for grp in graph.groups:
        for c in range(grp.m):
            out.append(jnp.ones_like(cut_values[i]) if c == column else jnp.zeros_like(cut_values[i]))
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
    """``count`` column arrays ``(..., r)`` -> ``(..., r, count)`` (missing columns: zeros)."""
    return jnp.stack(columns[:count], axis=-1)


def state_jacobian(graph: StepGraph, hidden, params, weights, inputs, op_outputs, *,
                   hold_custom: bool = False) -> list:
    """``A = dz/dh_prev`` per group, ``(*group.shape, m, n)``: one forward-mode pass per
    state variable through the step with its ETP outputs ``op_outputs`` (``{op index: y}``) in
    place of the ops, so no convolution is recomputed."""
    run = lambda h: graph.run(h, params, inputs, weights=weights, op_outputs=op_outputs,
                              hold_custom=hold_custom)[2]['cut']
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
                 release, *, hold_custom: bool = False, A=None,
                 next_jacobian: bool = False, op_outputs=None) -> StepSignals:
    """Evaluate one step and all learning signals (see module docstring).

    Args:
      graph: the analysed step.
      hidden, params, inputs: flat leaves at step ``t`` (``hidden`` is ``h^{t-1}``).
      weights: ``graph.weights(params)``, the ETP weight operands.
      target: the step's target pytree, passed to ``loss_fn``.
      loss_fn: ``loss_fn(output, target) -> scalar``.
      release: the previous step's ``StepSignals.release`` (or :func:`init_release`).
      hold_custom: hold functions with custom derivatives (surrogate spikes)
        constant in the Jacobians, which then describe the leak only.
      A: this step's :func:`state_jacobian`, if already evaluated (see
        :func:`jacobian_reads_only_state`); computed here otherwise.
      next_jacobian: also evaluate the next step's, at the new state (``A_next``).
      op_outputs: the step's ETP outputs (``{op index: y}``) if already computed: no op is
        evaluated again, but every path through an op is then cut from ``g``,
        ``gamma`` and the within-step gradients, so only the traces' inputs are valid.
    """
    ops, groups = graph.ops, graph.groups
    readouts = [k for k, op in enumerate(ops) if op.group is None]
    grouped = [k for k, op in enumerate(ops) if op.group is not None]
    direct = sorted(graph.direct_params)
    cut_vars = graph.cut_vars
    out_tree = graph.step.out_tree

    def forward(eps, deltas, direct_values):
        p = list(params)
        for k, v in zip(direct, direct_values):
            p[k] = v
        new_h, out, rec = graph.run(hidden, p, inputs, weights=weights, op_outputs=op_outputs,
                                    eps=dict(zip(cut_vars, eps)), delta=dict(zip(readouts, deltas)))
        loss = loss_fn(jax.tree.unflatten(out_tree, out), target)
        if jnp.shape(loss) != ():
            raise ValueError(f'loss_fn must return a scalar, got shape {jnp.shape(loss)}.')
        return loss, (new_h, out, rec)

    eps0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in cut_vars]
    deltas0 = [jnp.zeros(ops[k].y_aval.shape, ops[k].y_aval.dtype) for k in readouts]
    loss, vjp, (new_h, out, rec) = jax.vjp(forward, eps0, deltas0, [params[k] for k in direct],
                                           has_aux=True)
    g_eps, gammas, direct_grads = vjp(jnp.ones_like(loss))
    g = _per_group(graph, g_eps)
    op_outputs, z = rec['op_outputs'], rec['cut']

    # Every Jacobian below is of the step with ETP outputs replaced by their values.
    dyn_leaves = sorted({dp.leaf for dp in graph.dynamic_params})

    def cut_run(h_prev, deltas, phis, eps=None, override=None):
        p = list(params)
        for leaf, v in zip(dyn_leaves, phis):
            p[leaf] = v
        new, _, r = graph.run(h_prev, p, inputs, weights=weights, op_outputs=op_outputs,
                              hold_custom=hold_custom,
                              delta=dict(zip(grouped, deltas)),
                              eps=None if eps is None else dict(zip(cut_vars, eps)),
                              override=None if override is None else dict(zip(cut_vars, override)))
        return new, r['cut']

    deltas_g = [jnp.zeros(ops[k].y_aval.shape, ops[k].y_aval.dtype) for k in grouped]
    phis0 = [params[leaf] for leaf in dyn_leaves]
    m_max = max([grp.m for grp in groups], default=0)

    if A is None:
        A = state_jacobian(graph, hidden, params, weights, inputs, op_outputs,
                           hold_custom=hold_custom)
    A_next = (state_jacobian(graph, new_h, params, weights, inputs, op_outputs,
                             hold_custom=hold_custom)
              if next_jacobian else None)

    # Df = dz/dy: one reverse-mode pass per cut variable, in each op's own layout
    Df = {}
    if grouped:
        _, vjp_cut = jax.vjp(lambda d: cut_run(hidden, d, phis0)[1], deltas_g)
        rows = [vjp_cut(_cut_basis(graph, z, r))[0] for r in range(m_max)]
        for j, k in enumerate(grouped):
            Df[k] = jnp.stack([rows[r][j] for r in range(groups[ops[k].group].m)], axis=-1)

    # G_phi = dz/dphi at fixed h_prev: one forward pass per dynamic parameter leaf
    g_phi = {}
    for i, leaf in enumerate(dyn_leaves):
        tangents = [jnp.zeros_like(v) for v in phis0]
        tangents[i] = jnp.ones_like(phis0[i])
        g_phi[leaf] = _per_group(graph, jax.jvp(lambda ph: cut_run(hidden, deltas_g, ph)[1],
                                                (phis0,), (tangents,))[1])

    # chained cut values: g = Q^{-T} dL/d eps
    if any(grp.chained for grp in groups):
        q_cols = [_per_group(graph, jax.jvp(lambda e: cut_run(hidden, deltas_g, phis0, eps=e)[1],
                                            (eps0,), (_cut_basis(graph, z, c),))[1])
                  for c in range(m_max)]
        g = [jnp.linalg.solve(jnp.swapaxes(_stack_columns([col[gi] for col in q_cols], grp.m),
                                           -1, -2), gg[..., None])[..., 0]
             if grp.chained else gg for gi, (grp, gg) in enumerate(zip(groups, g))]

    # R = dh/dz and R_phi = dh/dphi at fixed z, carried to the next step
    new_release = dict(R={}, Rphi={})
    if release['R']:
        new_of = lambda h_new, grp: jnp.stack([h_new[l] for l in grp.leaves], axis=-1)
        r_cols = [jax.jvp(lambda zz: cut_run(hidden, deltas_g, phis0, override=zz)[0], (z,),
                          (_cut_basis(graph, z, c),))[1] for c in range(m_max)]
        for gi in release['R']:
            grp = groups[gi]
            new_release['R'][gi] = jnp.stack([new_of(col, grp) for col in r_cols[:grp.m]], axis=-1)
        for j in release['Rphi']:
            dp = graph.dynamic_params[j]
            i = dyn_leaves.index(dp.leaf)
            tangents = [jnp.zeros_like(v) for v in phis0]
            tangents[i] = jnp.ones_like(phis0[i])
            col = jax.jvp(lambda ph: cut_run(hidden, deltas_g, ph, override=z)[0], (phis0,),
                          (tangents,))[1]
            new_release['Rphi'][j] = new_of(col, groups[dp.group])

    D = []
    for gi, grp in enumerate(groups):
        if gi in release['R']:
            D.append(jnp.einsum('...mn,...nk->...mk', A[gi], release['R'][gi]))
        else:
            D.append(A[gi])
    phi_inst, phi_in = [], []
    for j, dp in enumerate(graph.dynamic_params):
        inst = g_phi[dp.leaf][dp.group]
        phi_inst.append(inst)
        if j in release['Rphi']:
            inst = inst + jnp.einsum('...mn,...n->...m', A[dp.group], release['Rphi'][j])
        phi_in.append(inst)
    return StepSignals(loss, new_h, out, rec['op_inputs'], g, dict(zip(readouts, gammas)),
                       list(direct_grads), D, Df, phi_inst, phi_in, new_release, A_next)
