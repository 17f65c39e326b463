"""The interface every executor shares, and the scan that drives the online ones.

A learner wraps a ``brainstate.nn.Module`` whose ``update(x)`` advances one
time step. Two ways to use it:

* whole sequences: ``loss, grads = learner.value_and_grad(loss_fn, xs, targets)``;
* truly online: ``learner.reset(batch_size)`` once, then repeatedly
  ``loss, grads = learner.advance(loss_fn, xs_chunk, targets_chunk)``, update
  the parameters, and continue: hidden states and traces are kept between
  calls, gradients are those of the chunk's steps.

``xs`` and ``targets`` are pytrees of arrays with a leading time axis
``(T, B, ...)``; ``loss_fn(output_t, target_t)`` returns a scalar and the loss
is the sum over steps. ``grads`` is keyed exactly like
``model.states(brainstate.ParamState)``; each value has the structure of the
state's value. For a ``saiunit`` quantity parameter the gradient is a
quantity in the inverse unit (``dL/dtheta``, the loss being unitless); its
mantissa is the derivative with respect to the parameter's mantissa, which is
what an optimiser updates.

With ``window=k`` the online executors cut every call's sequence into windows
of ``k`` steps (the last one shorter when ``k`` does not divide ``T``): a
window never spans two calls, so ``advance()`` chunks whose length is a
multiple of ``k`` give the gradients of one whole-sequence call.
"""
from __future__ import annotations

import abc
import math
from typing import Callable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._validation import floating_dtype, integer, optional
from ..primitive import apply_state_jacobian
from ._analysis.graph import StepGraph, analyse
from ._analysis.signals import (StepSignals, init_release, jacobian_reads_only_state,
                                scalar_loss, state_jacobian, step_signals)
from ._analysis.step import StepJaxpr, capture_step
from .report import (APPROX_READOUT, EXACT_OUTPUT_PARAM, EXACT_READOUT, MIXING_PARAM, UNUSED,
                     Report)

__all__ = ['Learner', 'OnlineLearner', 'Report']


def _check_sequences(xs, targets):
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


def _signature(step_inputs, model):
    leaves = jax.tree.leaves(step_inputs)
    states = [v for st in model.states().values() for v in jax.tree.leaves(st.value)]
    return (jax.tree.structure(step_inputs),
            tuple((np.shape(a), jnp.result_type(a)) for a in leaves),
            tuple((np.shape(a), jnp.result_type(a)) for a in states))


def sequence_loss(step: StepJaxpr, loss_fn, params, hidden, xs, targets, return_outputs):
    """``(sum_t loss_fn(output_t, target_t), (final hidden, outputs or None))``: the model step
    scanned over ``xs`` from ``hidden`` (flat leaves), differentiable in every argument."""
    def body(h, inp):
        x, target = inp
        new_h, out = step.evaluate(h, params, jax.tree.leaves(x))
        out = jax.tree.unflatten(step.out_tree, out)
        return new_h, (scalar_loss(loss_fn, out, target), out if return_outputs else None)

    h_final, (losses, outs) = lax.scan(body, hidden, (xs, targets))
    return jnp.sum(losses), (h_final, outs)


def _window_value(window):
    return optional(integer, 'window', window, sign='positive', means='eligibility traces only')


def _no_loss(output, target):
    return jnp.zeros(())


class Learner(abc.ABC):
    """Base of the three executors (see module docstring)."""

    algorithm = 'learner'

    def __init__(self, model: brainstate.nn.Module):
        if not isinstance(model, brainstate.nn.Module):
            raise TypeError(f'model must be a brainstate.nn.Module, got {type(model).__name__}.')
        self.model = model
        self._steps: dict = {}      # input signature -> (step, what _prepare made of it)
        self._compiled: dict = {}
        self._state_specs: dict = {}    # id(prepared) -> shapes and dtypes of its state
        self._carry = None          # (hidden leaves, algorithm state) between advance() calls
        self._batch = None          # the batch size hidden states were initialised for
        self._last = None           # (step, prepared) of the last call
        self._checked_losses: set = set()

    # ------------------------------------------------------------------ public API
    def value_and_grad(self, loss_fn: Callable, xs, targets, *, reset: bool = True,
                       return_outputs: bool = False):
        """Loss summed over the sequence and its gradient (see module docstring).

        Args:
          loss_fn: ``loss_fn(output_t, target_t) -> scalar``.
          xs: pytree of ``(T, B, ...)`` inputs.
          targets: pytree of ``(T, ...)`` targets.
          reset: re-initialise hidden states for batch size ``B`` first
            (``brainstate.nn.init_all_states``); otherwise start from the
            model's current hidden states. Traces always start at zero.
          return_outputs: also return the stacked outputs ``(T, ...)``.

        Returns:
          ``(loss, grads)`` or ``(loss, grads, outputs)``.
        """
        (_, batch), xs = _check_sequences(xs, targets), self._inputs(xs)
        if reset:
            brainstate.nn.init_all_states(self.model, batch)
            self._batch = batch
        step, prepared = self._capture(xs)
        hidden = step.hidden_leaves()
        return self._call(step, prepared, loss_fn, hidden, self._state_buffers(prepared, hidden),
                          xs, targets, return_outputs, keep=False)

    def reset(self, batch_size: int) -> None:
        """Start a new online run: fresh hidden states and zero traces."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size <= 0:
            raise ValueError(f'reset(batch_size) takes a positive int, got {batch_size!r}.')
        brainstate.nn.init_all_states(self.model, batch_size)
        self._carry = None
        self._batch = int(batch_size)

    def advance(self, loss_fn: Callable, xs, targets, *, return_outputs: bool = False):
        """Run ``T`` more steps, keeping hidden states and traces; return this chunk's
        ``(loss, grads[, outputs])``. Parameters are read from the model at each call."""
        _, batch = _check_sequences(xs, targets)
        if self._batch is None:
            raise RuntimeError('advance() continues an online run: call reset(batch_size) '
                               'first to start one (fresh hidden states and traces).')
        if batch != self._batch:
            raise ValueError(f'advance() got xs with batch size {batch}, but the run was '
                             f'started for {self._batch} sequences; call reset({batch}) to start '
                             f'a new run with this batch size.')
        xs = self._inputs(xs)
        step, prepared = self._capture(xs)
        if self._carry is None:
            hidden = step.hidden_leaves()
            self._carry = (hidden, self._fresh_state(prepared, hidden))
        return self._call(step, prepared, loss_fn, *self._carry, xs, targets, return_outputs,
                          keep=True)

    def predict(self, xs, *, reset: bool = True, observe: Callable | None = None):
        """Forward pass only.

        Args:
          xs: pytree of ``(T, B, ...)`` inputs.
          reset: re-initialise hidden states for batch size ``B`` first.
          observe: optional ``observe(model) -> pytree`` called after every
            step, with the model's states holding that step's new hidden
            values and the current parameters (e.g. ``lambda m:
            m.lif1.spike()`` for spike rates). It must be a pure read of the
            states.

        Returns:
          The stacked outputs ``(T, ...)``; with ``observe``, the pair
          ``(outputs, observed)`` where every leaf of ``observed`` gains a
          leading time axis ``T``.
        """
        (_, batch), xs = _check_sequences(xs, ()), self._inputs(xs)
        if reset:
            brainstate.nn.init_all_states(self.model, batch)
            self._batch = batch
        step, _ = self._capture(xs)
        key = ('predict', observe, _signature(jax.tree.map(lambda a: a[0], xs), self.model))
        if key not in self._compiled:
            def run(params, hidden, xs):
                def body(h, x):
                    new_h, out = step.evaluate(h, params, jax.tree.leaves(x))
                    out = jax.tree.unflatten(step.out_tree, out)
                    if observe is None:
                        return new_h, out
                    return new_h, (out, step.observe(observe, new_h, params))
                return lax.scan(body, hidden, xs)
            self._compiled[key] = jax.jit(run)
        hidden, outs = self._compiled[key](step.param_leaves(), step.hidden_leaves(), xs)
        step.write_hidden(hidden)
        return outs

    def lower(self, loss_fn: Callable, xs, targets):
        """The whole-sequence computation of :meth:`value_and_grad` (with reset), lowered
        but not run: ``learner.lower(...).compile().memory_analysis()`` gives XLA's
        memory figures."""
        (_, batch), xs = _check_sequences(xs, targets), self._inputs(xs)
        brainstate.nn.init_all_states(self.model, batch)
        step, prepared = self._capture(xs)
        hidden = step.hidden_leaves()
        return self._jitted(prepared, loss_fn, False).lower(
            step.param_leaves(), hidden, self._init_state(prepared, hidden), False, xs, targets)

    def report(self) -> Report:
        """How each parameter's gradient is computed and the trace memory, for the
        shapes of the last call (raises if the learner was never called)."""
        if self._last is None:
            raise RuntimeError('report() describes the last call; call value_and_grad, advance '
                               'or predict first.')
        return self._report(*self._last)

    # ------------------------------------------------------------------ internals
    def _inputs(self, xs):
        """``xs`` with floating-point leaves in the model's floating-point dtype (that of its
        parameters), so float64 data drives a float32 model (or bfloat16 one) as it would in
        a plain forward call; integer and boolean leaves are left as they are."""
        floats = [jnp.result_type(v) for st in self.model.states(brainstate.ParamState).values()
                  for v in jax.tree.leaves(st.value) if jnp.issubdtype(jnp.result_type(v),
                                                                        jnp.floating)]
        if not floats:
            return xs
        dtype = jnp.result_type(*floats)
        cast = lambda a: (jnp.asarray(a, dtype) if jnp.issubdtype(jnp.result_type(a), jnp.floating)
                          and jnp.result_type(a) != dtype else a)
        return jax.tree.map(cast, xs)

    def _capture(self, xs):
        x0 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), xs)
        key = _signature(x0, self.model)
        if key not in self._steps:
            step = capture_step(self.model, x0)
            self._steps[key] = (step, self._prepare(step))
        self._last = self._steps[key]
        return self._last

    def _prepare(self, step: StepJaxpr):
        """What the algorithm needs from a captured step (BPTT: the step itself)."""
        return step

    def _jitted(self, prepared, loss_fn, return_outputs):
        """The compiled sequence ``(params, hidden, state, keep, xs, targets)``.

        ``state`` is donated: the algorithm's state (D-RTRL's traces, up to
        gigabytes) is advanced in the buffers it arrives in and returned in them.
        With ``keep`` false it starts at zero, so a call that resets passes the
        last call's buffers (:meth:`_state_buffers`). Memory the process has not
        written yet costs a page fault per page at its first write; on the
        DVS-sized net, zero traces in fresh memory cost more per call than several
        steps (``docs/benchmarks.md``)."""
        key = (id(prepared), loss_fn, return_outputs)
        if key not in self._compiled:
            def run(p, h, s, keep, xs, ts):
                s = jax.tree.map(lambda a: jnp.where(keep, a, jnp.zeros((), a.dtype)), s)
                return self._sequence(prepared, loss_fn, p, h, s, xs, ts, return_outputs)
            self._compiled[key] = jax.jit(run, donate_argnums=2)
        return self._compiled[key]

    def _state_buffers(self, prepared, hidden):
        """Buffers for a call that starts from zero state: the last call's state when it
        has this call's shapes and dtypes (the call zeroes and overwrites it), else
        fresh zeros."""
        spec = self._state_specs.get(id(prepared))
        if self._carry is not None and spec is not None:
            last = self._carry[1]
            as_spec = lambda a: (jnp.shape(a), jnp.result_type(a))
            same = (jax.tree.structure(last) == jax.tree.structure(spec)
                    and jax.tree.map(as_spec, last) == jax.tree.map(as_spec, spec))
            if same and all(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                            and not a.is_deleted() for a in jax.tree.leaves(last)):
                self._carry = None      # the buffers are donated to this call
                return last
        return self._fresh_state(prepared, hidden)

    def _fresh_state(self, prepared, hidden):
        """``_init_state``, remembering its shapes and dtypes for :meth:`_state_buffers`."""
        state = self._init_state(prepared, hidden)
        self._state_specs[id(prepared)] = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), state)
        return state

    def _check_loss(self, step: StepJaxpr, loss_fn: Callable, targets) -> None:
        """Evaluate ``loss_fn`` on one step's abstract output and target, so that targets
        that do not fit the outputs (e.g. another batch size) are an error naming both."""
        shapes = lambda tree: jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), tree)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in step.output_vars]
        out = jax.tree.unflatten(step.out_tree, outs)
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:],
                                                             jnp.result_type(a)), targets)
        key = (loss_fn, str(shapes(out)), str(shapes(target)))
        if key in self._checked_losses:
            return
        try:
            jax.eval_shape(loss_fn, out, target)
        except Exception as err:    # whatever loss_fn raises: say which shapes it was given
            raise ValueError(f'loss_fn(output_t, target_t) fails for one step\'s model output '
                             f'{shapes(out)} and target {shapes(target)} (targets are (T, ...), '
                             f'time first, e.g. labels (T, B)): {err}') from err
        self._checked_losses.add(key)

    def _call(self, step, prepared, loss_fn, hidden, state, xs, targets, return_outputs, keep):
        self._check_loss(step, loss_fn, targets)
        loss, grads, hidden, state, outs = self._jitted(prepared, loss_fn, return_outputs)(
            step.param_leaves(), hidden, state, keep, xs, targets)
        step.write_hidden(hidden)
        self._carry = (hidden, state)
        grads = step.grads_tree(grads)
        return (loss, grads, outs) if return_outputs else (loss, grads)

    def _init_state(self, prepared, hidden):
        """The algorithm's state at the start of a run, all zeros, in new arrays (one per
        leaf: the state is donated to the call)."""
        return ()

    @abc.abstractmethod
    def _sequence(self, prepared, loss_fn, params, hidden, state, xs, targets, return_outputs):
        """``(loss, param-leaf grads, hidden, state, outputs or None)`` for one sequence."""

    @abc.abstractmethod
    def _report(self, step: StepJaxpr, prepared) -> Report:
        ...


class OnlineLearner(Learner):
    """Shared scan of D-RTRL and ES-D-RTRL, and the base class of a new online executor.

    Per step, the analysis of the model step gives its signals (``D``, ``Df``, the
    learning signal ``g``, ... of ``docs/theory.md``). A subclass says how its per-op
    traces start (``_init_traces``), advance (``_advance_ops``) and contract with a
    learning signal into weight gradients (``_contract``), how :meth:`report`
    describes them (``_trace_method``, ``_op_trace_bytes``), and which ETP rules it
    calls (``required_rules``, checked for every op). The exact traces of parameters
    inside the dynamics, which both algorithms share, are kept here::

        E_phi^t = D^t E_phi^{t-1} + (dz^t/dh^{t-1}) R_phi^{t-1} + G_phi^t
        dphi   += sum_i g^t[i] (E_phi^t[i] - G_phi^t[i])  (+ the within-step gradient)

    Gradients are accumulated in the carry, so memory does not depend on ``T``.

    Windows (``window=k``): the sequence is cut into blocks ``(t0, t0+k]``.
    Each block's loss is differentiated exactly (BPTT over ``k`` steps, every
    path) with respect to the parameters, the state ``h^{t0}`` at its start held
    fixed, and with respect to ``h^{t0}``; that cotangent ``hbar`` is mapped to
    the state cut, ``zbar = R^{t0 T} hbar``, and contracted with the traces held
    at ``t0`` like a learning signal (plus ``hbar . R_phi^{t0}`` for parameters
    inside the dynamics), since ``dh^{t0}/dtheta = R^{t0} E^{t0} + R_phi^{t0}``.
    The traces are then advanced through the block by the per-step recursion.
    Only paths that cross a block boundary through recurrent or cross-layer
    dynamics are truncated; ``k >= T`` is BPTT. Memory: ``k`` steps of BPTT
    residuals plus the traces, independent of ``T``.

    Mixed precision: with ``trace_dtype`` (e.g. ``jnp.float32`` for a bfloat16
    model) the step runs in the model's dtype while every trace and gradient
    accumulator is kept, and every trace update computed, in ``trace_dtype``;
    the gradients are returned in each parameter's dtype.
    """

    required_rules: tuple = ()   # ETP rules every op must provide

    def __init__(self, model: brainstate.nn.Module, *, trace_dtype=None, window=None):
        super().__init__(model)
        self.trace_dtype = optional(floating_dtype, 'trace_dtype', trace_dtype,
                                    means="the model's dtype")
        self.window = _window_value(window)
        self._early: dict = {}      # graph id -> state Jacobian evaluated a step early

    def _prepare(self, step):
        try:
            graph = analyse(step)
        except ValueError as err:    # say which executor refused the model
            raise ValueError(f'{self.algorithm} cannot train this model: {err}') from None
        for op in graph.ops:
            missing = op.primitive.missing_rules(self.required_rules)
            if missing:
                raise NotImplementedError(f'{op.label} lacks the ETP rules {missing} that '
                                          f'{self.algorithm} needs.')
        return graph

    def dtype(self, graph: StepGraph):
        """The dtype of traces and accumulators: ``trace_dtype``, else that of the op outputs."""
        if self.trace_dtype is not None:
            return self.trace_dtype
        return jnp.result_type(*[op.y_aval.dtype for op in graph.ops]) if graph.ops \
            else jnp.result_type(float)

    def _init_state(self, graph, hidden):
        dtype = self.dtype(graph)
        hidden_dtype = jnp.result_type(*[graph.step.hidden_vars[l].aval.dtype
                                         for grp in graph.groups for l in grp.leaves]
                                       or [float])
        dyn = [jnp.zeros((*graph.groups[dp.group].shape, graph.groups[dp.group].m), dtype)
               for dp in graph.dynamic_params]
        return dict(ops=self._init_traces(graph, hidden),
                    release=init_release(graph, hidden_dtype), dyn=dyn)

    def _early_jacobian(self, graph) -> bool:
        """Whether the state Jacobian of each step is evaluated at the end of the step
        before (``jacobian_reads_only_state`` of the step analysis); decided once per
        graph."""
        if id(graph) not in self._early:
            self._early[id(graph)] = jacobian_reads_only_state(graph)
        return self._early[id(graph)]

    def _first_jacobian(self, graph, hidden, params, weights, xs):
        """The first step's state Jacobian when each step evaluates the next one's, else None."""
        if not self._early_jacobian(graph):
            return None
        zeros_like = lambda a: jnp.zeros(a.shape, a.dtype)
        return state_jacobian(
            graph, hidden, params, weights, [zeros_like(a[0]) for a in jax.tree.leaves(xs)],
            {k: zeros_like(op.y_aval) for k, op in enumerate(graph.ops)})

    def _step(self, graph, params, weights, carry, x, target, loss_fn, op_outputs=None):
        """One step: ``(signals, new carry)`` with the carry ``((h, A), state)``."""
        (h, a), st = carry
        sig = step_signals(graph, h, params, weights, jax.tree.leaves(x), target, loss_fn,
                           st['release'], A=a, next_jacobian=self._early_jacobian(graph),
                           op_outputs=op_outputs)
        st = dict(ops=self._advance_ops(graph, st['ops'], sig, weights), release=sig.release,
                  dyn=self._dynamic_traces(graph, st['dyn'], sig))
        return sig, ((sig.new_hidden, sig.A_next), st)

    def _sequence(self, graph, loss_fn, params, hidden, state, xs, targets, return_outputs):
        if self.window is not None:
            return self._windowed_sequence(graph, loss_fn, params, hidden, state, xs, targets,
                                           return_outputs)
        weights, pull_back = jax.vjp(graph.weights, params)
        direct = sorted(graph.direct_params)
        dtype = self.dtype(graph)
        zeros = lambda a: jnp.zeros(jnp.shape(a), dtype)
        zeros_w = jax.tree.map(zeros, weights)
        zeros_p = [zeros(params[k]) for k in direct]
        zeros_dyn = [jnp.zeros(graph.groups[dp.group].shape, dtype)
                     for dp in graph.dynamic_params]
        first_a = self._first_jacobian(graph, hidden, params, weights, xs)

        def body(carry, inp):
            step_carry, acc_w, acc_p, acc_dyn, loss_sum = carry
            sig, step_carry = self._step(graph, params, weights, step_carry, *inp, loss_fn)
            st = step_carry[1]
            dw = self._op_grads(graph, st['ops'], sig.g, weights, sig)
            acc_w = [jax.tree.map(lambda a, b: a + b.astype(dtype), a, dw[k])
                     for k, a in enumerate(acc_w)]
            acc_p = [a + b.astype(dtype) for a, b in zip(acc_p, sig.direct_grads)]
            # the within-step part (G_phi) is already in the parameter's direct gradient
            acc_dyn = [acc + jnp.sum(sig.g[dp.group].astype(dtype)
                                     * (e - sig.phi_inst[j].astype(dtype)), axis=-1)
                       for j, (dp, acc, e) in enumerate(zip(graph.dynamic_params, acc_dyn,
                                                            st['dyn']))]
            out = jax.tree.unflatten(graph.step.out_tree, sig.outputs) if return_outputs else None
            return (step_carry, acc_w, acc_p, acc_dyn,
                    loss_sum + sig.loss.astype(loss_sum.dtype)), out

        loss0 = jnp.zeros((), jnp.result_type(float))
        (((hidden, _), state), acc_w, acc_p, acc_dyn, loss), outs = lax.scan(
            body, (((hidden, first_a), state), zeros_w, zeros_p, zeros_dyn, loss0), (xs, targets))
        grads = self._gather(graph, pull_back, weights, acc_w, acc_dyn, dict(zip(direct, acc_p)))
        return loss, grads, hidden, state, outs

    def _windowed_sequence(self, graph, loss_fn, params, hidden, state, xs, targets,
                           return_outputs):
        """Blocks of ``window`` steps: BPTT inside, traces across (class docstring)."""
        k, step = self.window, graph.step
        T = np.shape(jax.tree.leaves(xs)[0])[0]
        weights, pull_back = jax.vjp(graph.weights, params)
        dtype = self.dtype(graph)
        zeros = lambda a: jnp.zeros(jnp.shape(a), dtype)
        traced = sorted(graph.group_of_leaf)     # hidden leaves that carry traces

        def block(carry, inp):
            hidden, state, acc_p, acc_w, acc_dyn, loss_sum = carry
            xb, tb = inp

            def block_loss(p, h_traced):
                h = list(hidden)
                for leaf, v in zip(traced, h_traced):
                    h[leaf] = v

                def body(h, inp):
                    x, target = inp
                    new_h, out, rec = graph.run(h, p, jax.tree.leaves(x))
                    out = jax.tree.unflatten(step.out_tree, out)
                    return new_h, (scalar_loss(loss_fn, out, target),
                                   out if return_outputs else None,
                                   jax.tree.map(lax.stop_gradient, rec['op_outputs']))

                _, (losses, outs, op_outputs) = lax.scan(body, h, (xb, tb))
                return jnp.sum(losses), (outs, op_outputs)

            # the ops' outputs of the block's forward pass serve the trace updates too
            loss, vjp, (outs, op_outputs) = jax.vjp(
                block_loss, params, [hidden[l] for l in traced], has_aux=True)
            g_params, g_hidden = vjp(jnp.ones_like(loss))
            dw, d_dyn = self._boundary(graph, state, dict(zip(traced, g_hidden)), weights)
            acc_p = [a + b.astype(dtype) for a, b in zip(acc_p, g_params)]
            acc_w = [jax.tree.map(lambda a, b: a + b.astype(dtype), a, dw[j]) if j in dw else a
                     for j, a in enumerate(acc_w)]
            acc_dyn = [a + b for a, b in zip(acc_dyn, d_dyn)]
            first_a = self._first_jacobian(graph, hidden, params, weights, xb)
            ((hidden, _), state), _ = lax.scan(
                lambda c, inp: (self._step(graph, params, weights, c, inp[0], None, _no_loss,
                                           op_outputs=inp[1])[1], None),
                ((hidden, first_a), state), (xb, op_outputs))
            return (hidden, state, acc_p, acc_w, acc_dyn,
                    loss_sum + loss.astype(loss_sum.dtype)), outs

        carry = (hidden, state, [zeros(p) for p in params], jax.tree.map(zeros, weights),
                 [jnp.zeros(graph.groups[dp.group].shape, dtype) for dp in graph.dynamic_params],
                 jnp.zeros((), jnp.result_type(float)))
        n_full, outs = T // k, []
        if n_full:
            blocks = lambda tree: jax.tree.map(
                lambda a: jnp.reshape(a[:n_full * k], (n_full, k, *np.shape(a)[1:])), tree)
            carry, o = lax.scan(block, carry, (blocks(xs), blocks(targets)))
            if return_outputs:
                outs.append(jax.tree.map(lambda a: jnp.reshape(a, (-1, *a.shape[2:])), o))
        if T % k:
            rest = lambda tree: jax.tree.map(lambda a: a[n_full * k:], tree)
            carry, o = block(carry, (rest(xs), rest(targets)))
            outs.append(o)
        hidden, state, acc_p, acc_w, acc_dyn, loss = carry
        outs = (jax.tree.map(lambda *a: jnp.concatenate(a), *outs) if return_outputs else None)
        grads = self._gather(graph, pull_back, weights, acc_w, acc_dyn, dict(enumerate(acc_p)))
        return loss, grads, hidden, state, outs

    def _boundary(self, graph, state, g_hidden, weights):
        """Contract the cotangent of the block-start state (``{hidden leaf: dL/dh}``) with
        the traces held there: ``({op: dw}, per dynamic parameter: per-element gradient)``."""
        dtype = self.dtype(graph)
        release = state['release']
        g_hid, g_cut = [], []
        for gi, grp in enumerate(graph.groups):
            gh = jnp.stack([g_hidden[l] for l in grp.leaves], axis=-1).astype(dtype)
            g_hid.append(gh)
            g_cut.append(gh if gi not in release['R'] else
                         jnp.einsum('...n,...nm->...m', gh, release['R'][gi].astype(dtype)))
        dw = {k: self._contract(graph, k, state['ops'], graph.y_layout(op, g_cut[op.group], 1),
                                weights)
              for k, op in enumerate(graph.ops) if op.group is not None}
        d_dyn = []
        for j, dp in enumerate(graph.dynamic_params):
            d = jnp.sum(g_cut[dp.group] * state['dyn'][j], axis=-1)
            if j in release['Rphi']:   # dh/dphi at fixed z
                d = d + jnp.sum(g_hid[dp.group] * release['Rphi'][j].astype(dtype), axis=-1)
            d_dyn.append(d)
        return dw, d_dyn

    def _gather(self, graph, pull_back, weights, acc_w, acc_dyn, acc_p: dict):
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

    def _dynamic_traces(self, graph, traces, sig):
        """The exact traces of parameters inside the dynamics, advanced by one step."""
        dtype = self.dtype(graph)
        return [apply_state_jacobian(sig.D[dp.group].astype(dtype), traces[j])
                + sig.phi_in[j].astype(dtype) for j, dp in enumerate(graph.dynamic_params)]

    def _op_grads(self, graph, ops_state, g, weights, sig):
        """``{op: dw}`` of one step: traces contracted with the learning signals ``g`` (per
        group), readouts' within-step gradients."""
        return {k: (self.readout_dw(graph, k, sig, weights) if op.group is None else
                    self._contract(graph, k, ops_state, graph.y_layout(op, g[op.group], 1)
                                   .astype(self.dtype(graph)), weights))
                for k, op in enumerate(graph.ops)}

    @abc.abstractmethod
    def _init_traces(self, graph: StepGraph, hidden):
        """Zeros of the algorithm's per-op traces."""

    @abc.abstractmethod
    def _advance_ops(self, graph: StepGraph, state, sig: StepSignals, weights):
        """The per-op traces advanced by one step."""

    @abc.abstractmethod
    def _contract(self, graph: StepGraph, k: int, state, g, weights):
        """Op ``k``'s weight-operand gradients ``{slot: dw}`` from its traces in ``state``
        and a learning signal ``g`` on its group's cut, in the op's output layout
        (``(*y.shape, m)``, trace dtype)."""

    # -------------------------------------------------------------- shared pieces
    def signals_in_y_layout(self, graph: StepGraph, k: int, sig: StepSignals):
        """``(D, Df)`` of grouped op ``k`` in its output layout and the trace dtype."""
        op, dtype = graph.ops[k], self.dtype(graph)
        return graph.y_layout(op, sig.D[op.group], 2).astype(dtype), sig.Df[k].astype(dtype)

    def op_trace_zeros(self, graph: StepGraph, k: int, rule: str):
        """Grouped op ``k``'s ``rule`` (``'init_drtrl'`` or ``'init_pp'``): zeros of its
        traces for its shapes in the trace dtype and its group's cut size ``m``.

        The rule gives the layout only (it is evaluated for shapes); the zeros are new
        arrays, one per trace, because trace buffers are donated to each call: a rule
        may return one array for two traces, or an array it keeps."""
        op, dtype = graph.ops[k], self.dtype(graph)
        as_dtype = lambda a: jax.ShapeDtypeStruct(a.shape, dtype)
        layout = jax.eval_shape(lambda: op.primitive.rule(rule)(
            as_dtype(op.x_aval), as_dtype(op.y_aval),
            {name: as_dtype(a) for name, a in op.weight_avals.items()},
            graph.groups[op.group].m, **op.params))
        return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), layout)

    def op_weights(self, graph: StepGraph, k: int, weights):
        """Op ``k``'s weight operands in the trace dtype (its rules then compute in it)."""
        return jax.tree.map(lambda w: w.astype(self.dtype(graph)), weights[k])

    def readout_dw(self, graph: StepGraph, k: int, sig: StepSignals, weights):
        """The within-step gradient of readout ``k``: ``xy_to_dw(x, dL/dy)``."""
        op, dtype = graph.ops[k], self.dtype(graph)
        return op.primitive.rule('xy_to_dw')(sig.op_inputs[k].astype(dtype),
                                             sig.gamma[k].astype(dtype),
                                             self.op_weights(graph, k, weights), **op.params)

    def _report(self, step, graph) -> Report:
        state = jax.eval_shape(lambda: self._init_state(graph, None))
        nbytes = lambda a: math.prod(a.shape) * a.dtype.itemsize
        methods = {leaf: [] for leaf in range(step.n_params)}
        bytes_of = {leaf: 0 for leaf in range(step.n_params)}
        op_bytes = self._op_trace_bytes(graph, state['ops'])
        for k, op in enumerate(graph.ops):
            for slot, slot_leaves in op.slot_params.items():
                if op.group is not None:
                    method = self._trace_method(graph, k, slot)
                    grp = graph.groups[op.group]
                    if grp.feeds and method.startswith('exact'):
                        method = (f'exact within its layer, truncated across layers '
                                  f'({_across(grp, op.group)})')
                    elif grp.feeds:
                        method = f'{method}; truncated across layers ({_across(grp, op.group)})'
                else:
                    method = EXACT_READOUT if op.exact_readout else APPROX_READOUT
                for leaf in slot_leaves:
                    methods[leaf].append(f'{method} via {op.primitive.name} #{k}')
                    bytes_of[leaf] += op_bytes.get(k, {}).get(slot, 0) // len(slot_leaves)
        traced = set()
        for dp, trace in zip(graph.dynamic_params, state['dyn']):
            grp = graph.groups[dp.group]
            method = ('exact trace (elementwise in the dynamics of '
                      f'{"/".join(grp.names)}, summed over positions)')
            if grp.feeds:
                method = (f'exact within its layer, truncated across layers '
                          f'({_across(grp, dp.group)}): elementwise in the dynamics of '
                          f'{"/".join(grp.names)}')
            methods[dp.leaf].append(method)
            bytes_of[dp.leaf] += nbytes(trace)
            traced.add(dp.leaf)
        for leaf, kind in graph.direct_params.items():
            if leaf not in traced:
                methods[leaf].append(EXACT_OUTPUT_PARAM if kind == 'output' else MIXING_PARAM)
        if self.window is not None:   # what is not exact already is exact within a window
            methods = {leaf: [method if method.startswith('exact (instantaneous') else
                              f'exact within windows of {self.window} steps; across windows: '
                              f'{method}' for method in listed]
                       for leaf, listed in methods.items()}
        values = step.param_leaves()
        rows = [dict(parameter=step.param_names[leaf], shape=tuple(np.shape(values[leaf])),
                     method='; '.join(methods[leaf]) or UNUSED, trace_bytes=bytes_of[leaf])
                for leaf in range(step.n_params)]
        return Report(self.algorithm, rows)

    @abc.abstractmethod
    def _trace_method(self, graph: StepGraph, k: int, slot: str) -> str:
        """Description of the traced operand ``slot`` of grouped op ``k``."""

    @abc.abstractmethod
    def _op_trace_bytes(self, graph: StepGraph, op_state) -> dict:
        """``{op: {slot: bytes}}`` of the op traces (from ``eval_shape`` of the state)."""


def _across(group, index) -> str:
    kinds = []
    if index in group.feeds:
        kinds.append('recurrent synapses onto the same neurons are cut from the trace')
    if group.feeds - {index}:
        kinds.append('its effect through the dynamics of later layers is cut')
    return '; '.join(kinds)
