r"""The per-step quantities of online learning (DESIGN.md section 1).

For one step ``h^t = F(h^{t-1}, y^t)``, ``y^t = op(x^t, theta)`` this computes,
with JAX transformations of the traced step and no hand-written Jacobians:

* ``D^t``  — ``n x n`` per element, ``dh^t/dh^{t-1}`` within each hidden group
  with every path through an ETP op cut (forward-mode, one JVP per state
  variable);
* ``Df^t`` — ``dh^t/dy^t`` per op, in the op's output layout (reverse-mode,
  one VJP per state variable, paths through ETP ops cut);
* ``g^t``  — ``dL^t/dh^t``: the loss of step ``t`` differentiated with respect
  to a perturbation ``eps`` of each new hidden value where it is produced, so
  every later use within the step (spikes, next layers, readout) counts. When
  a group computes one new value from another within the step (``Q = dh^t /
  d eps`` is not the identity), that path belongs to the transition, not to
  the loss: ``g = Q^{-T} dL/d eps``, per element;
* ``gamma^t`` — ``dL^t/dy^t`` for readouts and ops with a bypass path, and
  the instantaneous gradient of parameters used outside ETP weight slots;

all from one reverse pass, plus the op inputs ``x^t`` and the new hidden state.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .graph import StepGraph

__all__ = ['StepSignals', 'step_signals']


@dataclasses.dataclass
class StepSignals:
    loss: jax.Array
    new_hidden: list
    outputs: list
    xs: dict            # op index -> x^t
    g: list             # per group: (*group.shape, n)
    gamma: dict         # op index -> dL/dy (readouts and bypass ops)
    direct_grads: list  # per direct parameter (graph order): instantaneous gradient
    D: list             # per group: (*group.shape, n, n)
    Df: dict            # grouped op index -> (*y.shape, n), output layout


def _basis(graph: StepGraph, hidden, position: int):
    """Ones on the hidden leaves that are state variable ``position`` of their group."""
    out = []
    for leaf, h in enumerate(hidden):
        g = graph.group_of_leaf.get(leaf)
        hit = g is not None and graph.groups[g].leaves.index(leaf) == position
        out.append(jnp.ones_like(h) if hit else jnp.zeros_like(h))
    return out


def step_signals(graph: StepGraph, hidden, params, weights, inputs, target, loss_fn,
                 *, need_d: bool = True) -> StepSignals:
    """Evaluate one step and all learning signals (see module docstring).

    Args:
      graph: the analysed step.
      hidden, params, inputs: flat leaves at step ``t`` (``hidden`` is ``h^{t-1}``).
      weights: ``graph.weights(params)``, the ETP weight operands.
      target: the step's target pytree, passed to ``loss_fn``.
      loss_fn: ``loss_fn(output, target) -> scalar``.
      need_d: compute ``D`` and ``Df`` (all online executors do).
    """
    ops = graph.ops
    gamma_ops = [k for k, op in enumerate(ops) if op.group is None or op.bypass]
    direct = sorted(graph.direct_params)
    out_tree = graph.step.out_tree

    def forward(eps, deltas, direct_values):
        p = list(params)
        for k, v in zip(direct, direct_values):
            p[k] = v
        new_h, out, xs, ys = graph.run(hidden, p, inputs, weights=weights, eps=eps,
                                       delta=dict(zip(gamma_ops, deltas)), record=True)
        loss = loss_fn(jax.tree.unflatten(out_tree, out), target)
        if jnp.shape(loss) != ():
            raise ValueError(f'loss_fn must return a scalar, got shape {jnp.shape(loss)}.')
        return loss, (new_h, out, xs, ys)

    eps0 = [jnp.zeros_like(h) for h in hidden]
    deltas0 = [jnp.zeros(ops[k].y_aval.shape, ops[k].y_aval.dtype) for k in gamma_ops]
    loss, vjp, (new_h, out, xs, ys) = jax.vjp(forward, eps0, deltas0, [params[k] for k in direct],
                                          has_aux=True)
    g_leaves, gammas, direct_grads = vjp(jnp.ones_like(loss))
    g = [jnp.stack([g_leaves[l] for l in grp.leaves], axis=-1) for grp in graph.groups]

    D, Df = [], {}
    grouped = [k for k, op in enumerate(ops) if op.group is not None]
    if need_d and graph.groups:
        def cut_step(h_prev, deltas, eps=None):
            new, _ = graph.run(h_prev, params, inputs, weights=weights, cut_etp=ys, eps=eps,
                               delta=dict(zip(grouped, deltas)))
            return new

        deltas_g = [jnp.zeros(ops[k].y_aval.shape, ops[k].y_aval.dtype) for k in grouped]
        n_max = max(grp.n for grp in graph.groups)
        per_group = lambda cols, grp: jnp.stack(
            [jnp.stack([cols[c][l] for c in range(grp.n)], axis=-1) for l in grp.leaves], axis=-2)
        columns = [jax.jvp(lambda h: cut_step(h, deltas_g), (hidden,),
                           (_basis(graph, hidden, c),))[1] for c in range(n_max)]
        D = [per_group(columns, grp) for grp in graph.groups]
        if any(grp.chained for grp in graph.groups):
            q_cols = [jax.jvp(lambda e: cut_step(hidden, deltas_g, e), (eps0,),
                              (_basis(graph, hidden, c),))[1] for c in range(n_max)]
            g = [jnp.linalg.solve(jnp.swapaxes(per_group(q_cols, grp), -1, -2), gg[..., None])[..., 0]
                 if grp.chained else gg for grp, gg in zip(graph.groups, g)]
        if grouped:
            _, vjp_cut = jax.vjp(lambda d: cut_step(hidden, d), deltas_g)
            rows = [vjp_cut(_basis(graph, hidden, m))[0] for m in range(n_max)]
            for j, k in enumerate(grouped):
                n = graph.groups[ops[k].group].n
                Df[k] = jnp.stack([rows[m][j] for m in range(n)], axis=-1)
    return StepSignals(loss, new_h, out, xs, g, dict(zip(gamma_ops, gammas)),
                       list(direct_grads), D, Df)
