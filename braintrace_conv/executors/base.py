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
import collections
import warnings
from typing import Callable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._validation import boolean, floating_dtype, integer, optional
from . import _scan
from ._inputs import check_finite, check_sequences, code_of, loss_key
from ._analysis.graph import StepGraph, analyse
from ._analysis.signals import StepSignals, init_release, jacobian_reads_only_state
from ._analysis.step import StepJaxpr, capture_step
from .report import Report, online_rows

__all__ = ['Learner', 'OnlineLearner', 'Report']


def _signature(step_inputs, model):
    leaves = jax.tree.leaves(step_inputs)
    states = [v for st in model.states().values() for v in jax.tree.leaves(st.value)]
    return (jax.tree.structure(step_inputs),
            tuple((np.shape(a), jnp.result_type(a)) for a in leaves),
            tuple((np.shape(a), jnp.result_type(a)) for a in states))


def _window_value(window):
    return optional(integer, 'window', window, sign='positive', means='eligibility traces only')


#: Compiled programs a learner keeps (least recently used dropped first).
MAX_COMPILED = 16


def _restored_carry(template, leaves):
    """The carry ``template`` (hidden leaves, algorithm state) with the saved ``leaves``."""
    spec = lambda a: (tuple(np.shape(a)), str(jnp.result_type(a)))
    expected, treedef = jax.tree.flatten(template)
    if [spec(a) for a in expected] != [spec(a) for a in leaves]:
        raise ValueError(f'restore_online_state: the saved run holds {len(leaves)} arrays of '
                         f'shapes and dtypes {[spec(a) for a in leaves]}, but this model and '
                         f'input need {[spec(a) for a in expected]}; restore it into the learner '
                         f'and model it was saved from, with inputs of the same shape.')
    return jax.tree.unflatten(treedef, [jnp.asarray(a, jnp.result_type(e)) for a, e in
                                        zip(leaves, expected)])


class Learner(abc.ABC):
    """Base of the three executors (see module docstring)."""

    algorithm = 'learner'
    #: Whether a call advances the algorithm's state in the buffers it arrives in (donated
    #: to the compiled call). Each executor keeps the faster choice for it, measured in
    #: ``benchmarks/call_overheads.py`` (``docs/benchmarks.md``).
    donate_state: bool = True

    def __init__(self, model: brainstate.nn.Module, *, check_finite: bool = True):
        if not isinstance(model, brainstate.nn.Module):
            raise TypeError(f'model must be a brainstate.nn.Module, got {type(model).__name__}.')
        self.model = model
        self.check_finite = boolean('check_finite', check_finite)
        self._steps: dict = {}      # input signature -> (step, what _prepare made of it)
        self._compiled = collections.OrderedDict()   # at most MAX_COMPILED programs
        self._warned_recompile = False
        self._state_specs: dict = {}    # id(prepared) -> shapes and dtypes of its state
        self._carry = None          # (hidden leaves, algorithm state) between advance() calls
        self._restored = None       # carry leaves from restore_online_state, for the next advance
        self._batch = None          # the batch size hidden states were initialised for
        self._last = None           # (step, prepared) of the last call
        self._advancing = False     # whether the last gradient came from advance()
        self._checked_losses = collections.OrderedDict()   # bounded like _compiled

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
        (_, batch), xs = check_sequences(xs, targets), self._inputs(xs)
        if reset:
            brainstate.nn.init_all_states(self.model, batch)
            self._batch = batch
        step, prepared = self._capture(xs)
        self._follow_parameters(prepared, continuing=False)
        self._advancing = False
        hidden = step.hidden_leaves()
        return self._call(step, prepared, loss_fn, hidden, self._take_state_buffers(prepared, hidden),
                          xs, targets, return_outputs, keep=False)

    def reset(self, batch_size: int) -> None:
        """Start a new online run: fresh hidden states and zero traces."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size <= 0:
            raise ValueError(f'reset(batch_size) takes a positive int, got {batch_size!r}.')
        brainstate.nn.init_all_states(self.model, batch_size)
        self._carry = self._restored = None
        self._batch = int(batch_size)

    def online_state(self) -> dict | None:
        """The online run's carry, for a checkpoint: ``{'batch_size': B, 'leaves': [...]}``
        with the hidden states and the algorithm's state (traces) as numpy arrays, or
        ``None`` before the first :meth:`advance` of a run. :meth:`restore_online_state`
        continues the run from it exactly, bit for bit."""
        if self._carry is None:
            return None
        return dict(batch_size=self._batch,
                    leaves=[np.asarray(a) for a in jax.tree.leaves(self._carry)])

    def restore_online_state(self, saved: dict) -> None:
        """Continue an online run saved by :meth:`online_state` (possibly in another
        process): the next :meth:`advance` starts from its hidden states and traces. The
        leaves are checked against this learner's model and the shapes of that call."""
        if not isinstance(saved, dict) or set(saved) != {'batch_size', 'leaves'}:
            raise ValueError(f'restore_online_state takes the dict online_state() returned, '
                             f'with keys batch_size and leaves; got {type(saved).__name__}.')
        self.reset(saved['batch_size'])
        self._restored = [jnp.asarray(a) for a in saved['leaves']]

    def advance(self, loss_fn: Callable, xs, targets, *, return_outputs: bool = False,
                check_finite: bool | None = None):
        """Run ``T`` more steps, keeping hidden states and traces; return this chunk's
        ``(loss, grads[, outputs])``. Parameters are read from the model at each call.

        ``check_finite`` overrides the learner's setting for this chunk: the check reads
        its result back, so it waits for the chunks before it to finish; a caller whose
        chunks are finite by construction (the event counts of a stream) passes ``False``
        to keep the next chunk queued while the host prepares it."""
        _, batch = check_sequences(xs, targets)
        if self._batch is None:
            raise RuntimeError('advance() continues an online run: call reset(batch_size) '
                               'first to start one (fresh hidden states and traces).')
        if batch != self._batch:
            raise ValueError(f'advance() got xs with batch size {batch}, but the run was '
                             f'started for {self._batch} sequences; call reset({batch}) to start '
                             f'a new run with this batch size.')
        xs = self._inputs(xs)
        step, prepared = self._capture(xs)
        self._follow_parameters(prepared, continuing=self._carry is not None)
        self._advancing = True
        if self._carry is None:
            hidden = step.hidden_leaves()
            self._carry = (hidden, self._fresh_state(prepared, hidden))
            if self._restored is not None:
                self._carry, self._restored = _restored_carry(self._carry, self._restored), None
        return self._call(step, prepared, loss_fn, *self._carry, xs, targets, return_outputs,
                          keep=True, check=check_finite)

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
        (_, batch), xs = check_sequences(xs, ()), self._inputs(xs)
        if reset:
            brainstate.nn.init_all_states(self.model, batch)
            self._batch = batch
        step, _ = self._capture(xs)
        key = ('predict', loss_key(observe),
               _signature(jax.tree.map(lambda a: a[0], xs), self.model))

        def run(params, hidden, xs):
            def body(h, x):
                new_h, out = step.evaluate(h, params, jax.tree.leaves(x))
                out = jax.tree.unflatten(step.out_tree, out)
                if observe is None:
                    return new_h, out
                return new_h, (out, step.observe(observe, new_h, params))
            return lax.scan(body, hidden, xs)

        hidden, outs = self._program(key, lambda: jax.jit(run), observe)(
            step.param_leaves(), step.hidden_leaves(), xs)
        step.write_hidden(hidden)
        return outs

    def lower(self, loss_fn: Callable, xs, targets):
        """The whole-sequence computation of :meth:`value_and_grad` (with reset), lowered
        but not run: ``learner.lower(...).compile().memory_analysis()`` gives XLA's
        memory figures."""
        (_, batch), xs = check_sequences(xs, targets), self._inputs(xs)
        brainstate.nn.init_all_states(self.model, batch)
        step, prepared = self._capture(xs)
        self._follow_parameters(prepared, continuing=False)
        hidden = step.hidden_leaves()
        return self._jitted(prepared, loss_fn, False).lower(
            step.param_leaves(), hidden, self._init_state(prepared, hidden), False, xs, targets,
            self._call_values(prepared))

    def analysis(self):
        """What the learner made of the model step for its last call: for the online
        executors the step's analysis (``ops``, ``groups`` with their state cuts,
        ``dynamic_params``; ``docs/architecture.md``), for BPTT the captured step. A hook
        for tests and for debugging a refusal; its fields are internal and may change."""
        if self._last is None:
            raise RuntimeError('analysis() describes the last call; call value_and_grad, '
                               'advance or predict first.')
        return self._last[1]

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
        """What the algorithm needs from a captured step, passed to its methods as
        ``prepared`` (BPTT: the step itself; the online executors: its analysis, a
        :class:`~._analysis.graph.StepGraph`)."""
        return step

    def _jitted(self, prepared, loss_fn, return_outputs):
        """The compiled sequence ``(params, hidden, state, keep, xs, targets, values)``,
        ``values`` those of :meth:`_call_values`.

        With :attr:`donate_state`, ``state`` is donated: the algorithm's state
        (D-RTRL's traces, up to gigabytes) is advanced in the buffers it arrives in
        and returned in them. With ``keep`` false it starts at zero, so a call that
        resets passes the last call's buffers (:meth:`_take_state_buffers`): memory
        the process has not written yet costs a page fault per page at its first
        write (``docs/benchmarks.md``)."""
        def run(p, h, s, keep, xs, ts, values):
            s = jax.tree.map(lambda a: jnp.where(keep, a, jnp.zeros((), a.dtype)), s)
            return self._traced_call(values, lambda: self._sequence(
                prepared, loss_fn, p, h, s, xs, ts, return_outputs))

        key = (id(prepared), loss_key(loss_fn), return_outputs, self.donate_state)
        donate = (2,) if self.donate_state else ()
        return self._program(key, lambda: jax.jit(run, donate_argnums=donate), loss_fn)

    def _program(self, key, build, fn):
        """The program cached under ``key = (what, loss_key(fn), *rest)`` (built by
        ``build()`` when missing) for the user function ``fn``; the least recently used is
        dropped beyond ``MAX_COMPILED``. Compiling again for the same code where only the
        function object differs warns once."""
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        code = getattr(fn, '__code__', None)
        same_but_fn = lambda other: other[:1] + other[2:] == key[:1] + key[2:]
        if (code is not None and not self._warned_recompile
                and any(same_but_fn(other) and code_of(other[1]) is code
                        for other in self._compiled)):
            self._warned_recompile = True
            warnings.warn(
                f'{type(self).__name__} compiles again for a new function object defined at '
                f'{code.co_filename}:{code.co_firstlineno}: it captures values that change '
                f'between calls or cannot be compared (arrays, say), so each is a new program '
                f'(seconds each). Define the function once and pass the same object at every '
                f'call, or pass changing values through the targets.', stacklevel=4)
        program = self._compiled[key] = build()
        while len(self._compiled) > MAX_COMPILED:
            self._compiled.popitem(last=False)
        return program

    def _take_state_buffers(self, prepared, hidden):
        """Buffers for a call that starts from zero state, taken from the learner: the last
        call's state when it has this call's shapes and dtypes (the call zeroes and
        overwrites it, and the learner no longer holds it), else fresh zeros."""
        spec = self._state_specs.get(id(prepared))
        if self._carry is not None and spec is not None:
            last = self._carry[1]
            as_spec = lambda a: (jnp.shape(a), jnp.result_type(a))
            same = (jax.tree.structure(last) == jax.tree.structure(spec)
                    and jax.tree.map(as_spec, last) == jax.tree.map(as_spec, spec))
            if same and all(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                            and not a.is_deleted() for a in jax.tree.leaves(last)):
                self._carry = None      # the buffers go to this call (donated, if so)
                return last
        return self._fresh_state(prepared, hidden)

    def _fresh_state(self, prepared, hidden):
        """``_init_state``, remembering its shapes and dtypes for :meth:`_take_state_buffers`."""
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
        key = (loss_key(loss_fn), str(shapes(out)), str(shapes(target)))
        if key in self._checked_losses:
            self._checked_losses.move_to_end(key)
            return
        try:
            jax.eval_shape(loss_fn, out, target)
        except Exception as err:    # whatever loss_fn raises: say which shapes it was given
            raise ValueError(f'loss_fn(output_t, target_t) fails for one step\'s model output '
                             f'{shapes(out)} and target {shapes(target)} (targets are (T, ...), '
                             f'time first, e.g. labels (T, B)): {err}') from err
        self._checked_losses[key] = True
        while len(self._checked_losses) > MAX_COMPILED:
            self._checked_losses.popitem(last=False)

    def _call(self, step, prepared, loss_fn, hidden, state, xs, targets, return_outputs, keep,
              check=None):
        self._check_loss(step, loss_fn, targets)
        if self.check_finite if check is None else check:
            check_finite('xs', xs)
            check_finite('targets', targets)
        loss, grads, hidden, state, outs = self._jitted(prepared, loss_fn, return_outputs)(
            step.param_leaves(), hidden, state, keep, xs, targets, self._call_values(prepared))
        step.write_hidden(hidden)
        self._carry = (hidden, state)
        grads = step.grads_tree(grads)
        return (loss, grads, outs) if return_outputs else (loss, grads)

    def _init_state(self, prepared, hidden):
        """The algorithm's state at the start of a run, all zeros, in new arrays (one per
        leaf: the state is donated to the call)."""
        return ()

    def _follow_parameters(self, prepared, continuing: bool) -> None:
        """Before a call: bring what the algorithm derived from the parameters (ES-D-RTRL's
        inferred decays) up to their current values; ``continuing`` when the call goes on
        with the traces of an ``advance()`` run."""

    def _call_values(self, prepared):
        """Numbers derived from the current parameters that the compiled program takes as
        an argument rather than as constants, so that they change without a new
        compilation (a pytree; ``()`` when there are none)."""
        return ()

    def _traced_call(self, values, sequence):
        """``sequence()``, traced with :meth:`_call_values`'s ``values`` at hand."""
        return sequence()

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
    The traces are then advanced through the block by the per-step recursion, on
    what BPTT's forward pass computed: each step of a block is evaluated once.
    Only paths that cross a block boundary through recurrent or cross-layer
    dynamics are truncated; ``k >= T`` is BPTT. Memory: ``k`` steps of BPTT
    residuals, the traces, and a second copy of them where they take no more bytes
    than one step's trace inputs, else ``k`` steps of those inputs; independent of
    ``T``.

    Mixed precision: with ``trace_dtype`` (e.g. ``jnp.float32`` for a bfloat16
    model) the step runs in the model's dtype while every trace and gradient
    accumulator is kept, and every trace update computed, in ``trace_dtype``;
    the gradients are returned in each parameter's dtype.
    """

    required_rules: tuple = ()   # ETP rules every op must provide

    def __init__(self, model: brainstate.nn.Module, *, trace_dtype=None, window=None,
                 check_finite: bool = True):
        super().__init__(model, check_finite=check_finite)
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

    def _init_state(self, prepared, hidden):
        dtype = self.dtype(prepared)
        hidden_dtype = jnp.result_type(*[prepared.step.hidden_vars[leaf].aval.dtype
                                         for grp in prepared.groups for leaf in grp.leaves]
                                       or [float])
        dyn = [jnp.zeros((*prepared.groups[dp.group].shape, prepared.groups[dp.group].m), dtype)
               for dp in prepared.dynamic_params]
        return dict(ops=self._init_traces(prepared, hidden),
                    release=init_release(prepared, hidden_dtype), dyn=dyn)

    def _early_jacobian(self, graph) -> bool:
        """Whether the state Jacobian of each step is evaluated at the end of the step
        before (``jacobian_reads_only_state`` of the step analysis); decided once per
        graph."""
        if id(graph) not in self._early:
            self._early[id(graph)] = jacobian_reads_only_state(graph)
        return self._early[id(graph)]

    def _sequence(self, prepared, loss_fn, params, hidden, state, xs, targets, return_outputs):
        scan = _scan.traced_sequence if self.window is None else _scan.windowed_sequence
        return scan(self, prepared, loss_fn, params, hidden, state, xs, targets, return_outputs)

    def _hops(self, graph):
        """The :class:`~._analysis.hops.Hop` entries whose ``psi`` the traces read (none)."""
        return ()

    def _across_layers(self, graph: StepGraph, k: int):
        """How grouped op ``k``'s trace treats the paths through later layers, for the
        report; ``None``: cut (the report says which)."""
        return None

    def _boundary(self, graph, state, g_hidden, weights):
        """Contract the cotangent of a window's start state with the traces held there
        (:func:`._scan.contract_boundary`); an executor may adjust its state first."""
        return _scan.contract_boundary(self, graph, state, g_hidden, weights)

    @abc.abstractmethod
    def _init_traces(self, graph: StepGraph, hidden):
        """Zeros of the algorithm's per-op traces."""

    @abc.abstractmethod
    def _advance_ops(self, graph: StepGraph, state, sig: StepSignals, weights):
        """The per-op traces advanced by one step, from the trace inputs of ``sig``
        (``op_inputs``, ``D``, ``Df``): in a window, its other fields are None."""

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

    def _report(self, step, prepared) -> Report:
        state_shapes = jax.eval_shape(lambda: self._init_state(prepared, None))
        return Report(self.algorithm, online_rows(self, step, prepared, state_shapes))

    @abc.abstractmethod
    def _trace_method(self, graph: StepGraph, k: int, slot: str) -> str:
        """Description of the traced operand ``slot`` of grouped op ``k``."""

    @abc.abstractmethod
    def _op_trace_bytes(self, graph: StepGraph, op_state) -> dict:
        """``{op: {slot: bytes}}`` of the op traces (from ``eval_shape`` of the state)."""
