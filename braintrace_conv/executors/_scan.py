"""The scans that drive the executors over a sequence (private).

* :func:`scanned_loss`: the model step scanned over the sequence, differentiable in
  every argument (what BPTT differentiates);
* :func:`traced_sequence`: the online executors' per-step scan, which carries hidden
  states, traces and gradient accumulators, so memory does not depend on ``T``;
* :func:`windowed_sequence`: blocks of ``window`` steps, BPTT inside each block and
  the traces across blocks (``docs/theory.md``, "Windows").

The online scans call the learner's hooks (``_advance_ops``, ``_contract``,
``_boundary``, ``readout_dw``, ``dtype``) and the per-step signals of
:mod:`._analysis.signals`. Names: ``graph`` is the analysed step, ``weights`` the ETP
ops' weight operands (``graph.weights(params)``), ``targets`` the per-step targets
passed to ``loss_fn``, ``k`` an op index.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..primitive import apply_state_jacobian
from ._analysis.hops import boundary_derivatives
from ._analysis.signals import (StepSignals, scalar_loss, state_jacobian, step_point,
                                step_signals, trace_inputs)
from ._analysis.step import StepJaxpr


def scanned_loss(step: StepJaxpr, loss_fn, params, hidden, xs, targets, return_outputs):
    """``(sum_t loss_fn(output_t, target_t), (final hidden, outputs or None))``: the model step
    scanned over ``xs`` from ``hidden`` (flat leaves), differentiable in every argument."""
    def body(h, inp):
        x, target = inp
        new_h, out = step.evaluate(h, params, jax.tree.leaves(x))
        out = jax.tree.unflatten(step.out_tree, out)
        return new_h, (scalar_loss(loss_fn, out, target), out if return_outputs else None)

    h_final, (losses, outs) = lax.scan(body, hidden, (xs, targets))
    return jnp.sum(losses), (h_final, outs)


# ----------------------------------------------------------------------------- one step
def first_jacobian(learner, graph, hidden, params, weights, xs):
    """The first step's state Jacobian when each step evaluates the next one's (see
    ``jacobian_reads_only_state``), else None."""
    if not learner._early_jacobian(graph):
        return None
    zeros_like = lambda a: jnp.zeros(a.shape, a.dtype)
    return state_jacobian(
        graph, hidden, params, weights, [zeros_like(a[0]) for a in jax.tree.leaves(xs)],
        {k: zeros_like(op.y_aval) for k, op in enumerate(graph.ops)})


def time_step(learner, graph, params, weights, carry, x, target, loss_fn):
    """One time step: ``(signals, new carry)`` with the carry ``((h, A), state)``."""
    (h, a), state = carry
    sig = step_signals(graph, h, params, weights, jax.tree.leaves(x), target, loss_fn,
                       state['release'], A=a, next_jacobian=learner._early_jacobian(graph),
                       hops=learner._hops(graph))
    return sig, ((sig.new_hidden, sig.A_next), advance_state(learner, graph, state, sig, weights))


def advance_state(learner, graph, state, sig, weights):
    """The algorithm's state (per-op traces, release Jacobians, dynamic traces) advanced by
    one step with the trace inputs of ``sig``."""
    return dict(ops=learner._advance_ops(graph, state['ops'], sig, weights), release=sig.release,
                dyn=dynamic_traces(learner, graph, state['dyn'], sig))


def dynamic_traces(learner, graph, traces, sig):
    """The exact traces of parameters inside the dynamics, advanced by one step."""
    dtype = learner.dtype(graph)
    return [apply_state_jacobian(sig.D[dp.group].astype(dtype), traces[j])
            + sig.phi_in[j].astype(dtype) for j, dp in enumerate(graph.dynamic_params)]


def op_grads(learner, graph, ops_state, g, weights, sig):
    """``{op: dw}`` of one step: traces contracted with the learning signals ``g`` (per
    group), readouts' within-step gradients."""
    dtype = learner.dtype(graph)
    return {k: (learner.readout_dw(graph, k, sig, weights) if op.group is None else
                learner._contract(graph, k, ops_state, graph.y_layout(op, g[op.group], 1)
                                  .astype(dtype), weights))
            for k, op in enumerate(graph.ops)}


# ----------------------------------------------------------------------------- whole sequence
def traced_sequence(learner, graph, loss_fn, params, hidden, state, xs, targets,
                    return_outputs):
    """``(loss, param-leaf grads, hidden, state, outputs or None)``: the per-step scan."""
    weights, pull_back = jax.vjp(graph.weights, params)
    direct = sorted(graph.direct_params)
    dtype = learner.dtype(graph)
    zeros = lambda a: jnp.zeros(jnp.shape(a), dtype)
    zeros_w = jax.tree.map(zeros, weights)
    zeros_p = [zeros(params[leaf]) for leaf in direct]
    zeros_dyn = [jnp.zeros(graph.groups[dp.group].shape, dtype) for dp in graph.dynamic_params]
    first_a = first_jacobian(learner, graph, hidden, params, weights, xs)

    def body(carry, inp):
        step_carry, acc_w, acc_p, acc_dyn, loss_sum = carry
        sig, step_carry = time_step(learner, graph, params, weights, step_carry, *inp, loss_fn)
        dw = op_grads(learner, graph, step_carry[1]['ops'], sig.g, weights, sig)
        acc_w = [jax.tree.map(lambda a, b: a + b.astype(dtype), a, dw[k])
                 for k, a in enumerate(acc_w)]
        acc_p = [a + b.astype(dtype) for a, b in zip(acc_p, sig.direct_grads)]
        # the within-step part (G_phi) is already in the parameter's direct gradient
        acc_dyn = [acc + jnp.sum(sig.g[dp.group].astype(dtype)
                                 * (e - sig.phi_inst[j].astype(dtype)), axis=-1)
                   for j, (dp, acc, e) in enumerate(zip(graph.dynamic_params, acc_dyn,
                                                        step_carry[1]['dyn']))]
        out = jax.tree.unflatten(graph.step.out_tree, sig.outputs) if return_outputs else None
        return (step_carry, acc_w, acc_p, acc_dyn,
                loss_sum + sig.loss.astype(loss_sum.dtype)), out

    carry = (((hidden, first_a), state), zeros_w, zeros_p, zeros_dyn,
             jnp.zeros((), jnp.result_type(float)))
    (((hidden, _), state), acc_w, acc_p, acc_dyn, loss), outs = lax.scan(body, carry,
                                                                        (xs, targets))
    grads = gather(graph, pull_back, weights, acc_w, acc_dyn, dict(zip(direct, acc_p)))
    return loss, grads, hidden, state, outs


def windowed_sequence(learner, graph, loss_fn, params, hidden, state, xs, targets,
                      return_outputs):
    """Blocks of ``learner.window`` steps: BPTT inside, traces across (``docs/theory.md``).

    Each block evaluates each of its steps once (:func:`_block`). When ``window`` does not
    divide ``T``, the last, shorter block is a second copy of the block in the program. A
    block of ``window`` steps with the missing ones masked would save that copy's compile
    time and memory, but compute the missing steps on any backend: 12 of 100 at T = 100,
    ``window`` = 16, where it took 1.1-1.2x the time per sequence (CPU)."""
    window = learner.window
    T = np.shape(jax.tree.leaves(xs)[0])[0]
    weights, pull_back = jax.vjp(graph.weights, params)
    dtype = learner.dtype(graph)
    zeros = lambda a: jnp.zeros(jnp.shape(a), dtype)
    # the state Jacobian a step evaluates for the next one carries across blocks
    first_a = first_jacobian(learner, graph, hidden, params, weights, xs)
    in_forward = _advance_in_forward(learner, graph, params, weights, hidden, first_a, state,
                                     xs)
    block = lambda carry, inp: _block(learner, graph, loss_fn, params, weights, return_outputs,
                                      in_forward, carry, inp)
    carry = (hidden, first_a, state, [zeros(p) for p in params], jax.tree.map(zeros, weights),
             [jnp.zeros(graph.groups[dp.group].shape, dtype) for dp in graph.dynamic_params],
             jnp.zeros((), jnp.result_type(float)))
    n_full, outs = T // window, []
    if n_full:
        # each block is read in place: the scanned blocks of a reshaped sequence were a
        # copy of it (XLA's temporaries grew by the input's bytes with T)
        take = lambda i, tree: jax.tree.map(
            lambda a: lax.dynamic_slice_in_dim(a, i * window, window), tree)
        carry, o = lax.scan(lambda c, i: block(c, (take(i, xs), take(i, targets))), carry,
                            jnp.arange(n_full))
    if n_full and return_outputs:
        outs.append(jax.tree.map(lambda a: jnp.reshape(a, (-1, *a.shape[2:])), o))
    if T % window:
        rest = lambda tree: jax.tree.map(lambda a: a[n_full * window:], tree)
        carry, o = block(carry, (rest(xs), rest(targets)))
        outs.append(o)
    hidden, _, state, acc_p, acc_w, acc_dyn, loss = carry
    outs = (jax.tree.map(lambda *a: jnp.concatenate(a), *outs) if return_outputs else None)
    grads = gather(graph, pull_back, weights, acc_w, acc_dyn, dict(enumerate(acc_p)))
    return loss, grads, hidden, state, outs


def _block(learner, graph, loss_fn, params, weights, return_outputs, in_forward, carry, inp):
    """One block in one pass over its steps (:func:`_block_forward`): BPTT of the block's
    loss from its stored start state, that state's cotangent contracted with the traces
    held there (once per block), and the traces advanced through the block, in the
    forward pass (``in_forward``) or after the backward pass on the trace inputs the
    forward pass kept (:func:`_advance_in_forward` says which)."""
    hidden, a, state, acc_p, acc_w, acc_dyn, loss_sum = carry
    xb, tb = inp
    dtype = learner.dtype(graph)
    traced = sorted(graph.group_of_leaf)     # hidden leaves that carry traces
    loss, vjp, (hidden, a, new_state, outs, kept) = jax.vjp(
        lambda p, h_traced: _block_forward(learner, graph, loss_fn, p, params, weights, hidden,
                                           traced, h_traced, a, state, xb, tb, in_forward,
                                           return_outputs),
        params, [hidden[leaf] for leaf in traced], has_aux=True)
    g_params, g_hidden = vjp(jnp.ones_like(loss))
    boundary = learner._boundary(graph, state, dict(zip(traced, g_hidden)), weights)
    if not in_forward:
        new_state = dict(_advance_after(learner, graph, state, kept, weights, boundary),
                         release=new_state['release'])
    dw, d_dyn = boundary
    acc_p = [a + b.astype(dtype) for a, b in zip(acc_p, g_params)]
    acc_w = [jax.tree.map(lambda a, b: a + b.astype(dtype), a, dw[k]) if k in dw else a
             for k, a in enumerate(acc_w)]
    acc_dyn = [a + b for a, b in zip(acc_dyn, d_dyn)]
    return (hidden, a, new_state, acc_p, acc_w, acc_dyn,
            loss_sum + loss.astype(loss_sum.dtype)), outs


def _block_forward(learner, graph, loss_fn, params, params_held, weights, hidden, traced,
                   h_traced, a, state, xb, tb, in_forward, return_outputs):
    """``(loss of the block, (final hidden leaves, A, state, outputs or None, trace inputs
    per step or None))`` from ``hidden`` with its traced leaves replaced by ``h_traced``.

    Each step is evaluated once (:func:`_evaluated_step`). With ``in_forward`` the traces
    advance here and ``state`` is returned advanced; otherwise only its release
    Jacobians are, and every step's trace inputs are returned."""
    h = list(hidden)
    for leaf, v in zip(traced, h_traced):
        h[leaf] = v

    def body(carry, inp):
        h, a, st = carry
        x, target = inp
        new_h, out, kept, release, a_next = _evaluated_step(
            learner, graph, params, params_held, weights, h, a, st['release'],
            jax.tree.leaves(x))
        out = jax.tree.unflatten(graph.step.out_tree, out)
        if in_forward:
            st, kept = advance_state(learner, graph, st, _advance_signals(kept, release),
                                     weights), None
        else:
            st = dict(release=release)
        return (new_h, a_next, st), (scalar_loss(loss_fn, out, target),
                                     out if return_outputs else None, kept)

    start = state if in_forward else dict(release=state['release'])
    (h, a, st), (losses, outs, kept) = lax.scan(body, (h, a, start), (xb, tb))
    return jnp.sum(losses), (h, a, st, outs, kept)


def _evaluated_step(learner, graph, params, params_held, weights, h, a, release, x):
    """One step evaluated once, with its ops, differentiable in ``params`` and ``h``:
    ``(new hidden leaves, outputs, trace inputs, release, A_next)``. The trace inputs
    (``op_inputs, D, Df, phi_in`` of :class:`StepSignals`, of the grouped ops, and the
    ``psi`` of the learner's one-hop traces) and the
    release Jacobians and next state Jacobian are taken from that evaluation's values,
    held (not differentiated), at ``params_held`` (the values of ``params``)."""
    held = lax.stop_gradient
    new_h, out, rec = graph.run(h, params, x)
    at = step_point(graph, held(h), params_held, weights, x, held(rec['op_outputs']))
    sig = trace_inputs(at, held(rec['cut']), held(new_h), release, A=a,
                       next_jacobian=learner._early_jacobian(graph))
    hops = learner._hops(graph)
    kept = dict(op_inputs={k: held(v) for k, v in rec['op_inputs'].items()
                           if graph.ops[k].group is not None},
                D=sig['D'], Df=sig['Df'], phi_in=sig['phi_in'],
                psi=boundary_derivatives(graph, at, list(hops)) if hops else [])
    return new_h, out, kept, sig['release'], sig['A_next']


def _advance_signals(kept, release):
    """The trace inputs ``kept`` of a step and its ``release`` as :class:`StepSignals`, the
    fields :meth:`~.base.OnlineLearner._advance_ops` reads (the others None)."""
    return StepSignals(None, None, None, kept['op_inputs'], None, None, None, kept['D'],
                       kept['Df'], None, kept['phi_in'], release, psi=kept['psi'])


def _advance_after(learner, graph, state, kept, weights, boundary):
    """The state advanced through a block on the trace inputs its forward pass kept, the
    release Jacobians None.

    The ``boundary`` terms (``({op: dw}, d_dyn)``) were contracted from the traces that
    this advance overwrites in place. Unless the writing depends on that reading, XLA
    copies the traces at each block's start (D-RTRL's on the standard workload, 14 MiB):
    the first step's inputs are therefore multiplied by a one computed from the boundary
    terms. At k = 1 this took the XLA temporaries from 16.3 to 2.7 MiB and the time per
    sequence to 0.45-0.54x (T = 100, CPU), where the former dependency, the boundary
    terms handed through the loop, vanished with its one-step loop; at k = 4 and 20 the
    two are alike. The values are unchanged, bit for bit."""
    read = sum(jnp.sum(leaf) for leaf in jax.tree.leaves(boundary))
    # exactly 1 for every boundary, non-finite ones too (x * 0 is NaN for x = inf), and
    # not a constant XLA could fold; real dtypes only: (a + bi) * 1 computes b * 0, NaN
    # for b = inf
    one = jnp.where(jnp.isfinite(read), read, 0) * 0 + 1
    kept = jax.tree.map(lambda a: a.at[0].multiply(one.astype(a.dtype))
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, kept)
    state, _ = lax.scan(lambda st, kept_t: (advance_state(
        learner, graph, st, _advance_signals(kept_t, None), weights), None),
        dict(state, release=None), kept)
    return state


def _advance_in_forward(learner, graph, params, weights, hidden, a, state, xs) -> bool:
    """Whether blocks advance the traces in their forward pass rather than after their
    backward pass: when the traces take no more bytes than one step's trace inputs.

    In the forward pass, a block holds the traces of its start until the backward pass
    has contracted them: XLA copies them, twice per block (D-RTRL on the standard
    workload: 1.08-1.16x the time of advancing after, k = 4 and 16, CPU). After the
    backward pass, a block holds every step's trace inputs (``window`` of them), written
    in the forward pass and read again (ES-D-RTRL: 1.06x and 1.18x the time of advancing
    in the forward pass at k = 4 and 16, the same at k = 1). Decided on bytes, so alike on
    every backend: ES-D-RTRL's traces are about one step's inputs, D-RTRL's kernel traces
    many steps' worth."""
    x = [leaf[0] for leaf in jax.tree.leaves(xs)]
    kept = jax.eval_shape(lambda: _evaluated_step(learner, graph, params, params, weights,
                                                  hidden, a, state['release'], x)[2])
    nbytes = lambda tree: sum(math.prod(v.shape) * jnp.dtype(v.dtype).itemsize
                              for v in jax.tree.leaves(tree))
    return nbytes((state['ops'], state['dyn'])) <= nbytes(kept)


def contract_boundary(learner, graph, state, g_hidden, weights):
    """Contract the cotangent of the block-start state (``{hidden leaf: dL/dh}``) with the
    traces held there: ``({op: dw}, per dynamic parameter: per-element gradient)``."""
    dtype = learner.dtype(graph)
    release = state['release']
    g_hid = hidden_cotangents(learner, graph, g_hidden)
    g_cut = cut_cotangents(learner, graph, state, g_hidden)
    dw = {k: learner._contract(graph, k, state['ops'], graph.y_layout(op, g_cut[op.group], 1),
                               weights)
          for k, op in enumerate(graph.ops) if op.group is not None}
    d_dyn = []
    for j, dp in enumerate(graph.dynamic_params):
        d = jnp.sum(g_cut[dp.group] * state['dyn'][j], axis=-1)
        if j in release['Rphi']:   # dh/dphi at fixed z
            d = d + jnp.sum(g_hid[dp.group] * release['Rphi'][j].astype(dtype), axis=-1)
        d_dyn.append(d)
    return dw, d_dyn


def hidden_cotangents(learner, graph, g_hidden) -> list:
    """Per group, the cotangent of its hidden leaves (``{leaf: dL/dh}``) stacked to
    ``(*shape, n)`` in the trace dtype."""
    return [jnp.stack([g_hidden[leaf] for leaf in grp.leaves], axis=-1).astype(learner.dtype(graph))
            for grp in graph.groups]


def cut_cotangents(learner, graph, state, g_hidden) -> list:
    """Per group, the cotangent of its state cut, ``(*shape, m)``: ``R^T dL/dh`` with the
    release Jacobian held in ``state`` (``dL/dh`` itself where the cut is the new state)."""
    release, dtype = state['release'], learner.dtype(graph)
    return [gh if gi not in release['R'] else
            jnp.einsum('...n,...nm->...m', gh, release['R'][gi].astype(dtype))
            for gi, gh in enumerate(hidden_cotangents(learner, graph, g_hidden))]


def gather(graph, pull_back, weights, acc_w, acc_dyn, acc_p: dict):
    """Parameter-leaf gradients from the accumulators: weight operands pulled back,
    parameter gradients (``{leaf: acc}``) added, dynamic-parameter ones contracted."""
    (grads,) = pull_back(jax.tree.map(lambda a, w: a.astype(w.dtype), acc_w, weights))
    grads = list(grads)
    for leaf, acc in acc_p.items():
        grads[leaf] = grads[leaf] + acc.astype(grads[leaf].dtype)
    for dp, acc in zip(graph.dynamic_params, acc_dyn):
        grads[dp.leaf] = grads[dp.leaf] + jnp.reshape(
            dp.contract(acc), grads[dp.leaf].shape).astype(grads[dp.leaf].dtype)
    return grads
