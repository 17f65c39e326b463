r"""ES-D-RTRL: linear-memory traces, input trace ⊗ output trace (``docs/theory.md``).

Per grouped op, with a decay ``alpha`` and ``Z^t = sum_{r=0..t} alpha^r``
counted from the sequence start inside the scan::

    ex^t = alpha * ex^{t-1} + x^t                 one per distinct (op input, alpha)
    ef^t = D^t ef^{t-1} + Df^t                    per op, (*y.shape, m)
    dW  += xy_to_dw(ex^t / Z^t, sum_m g^t * ef^t)

i.e. one weight-gradient convolution per op and step, the work BPTT does per
step; ``D``, ``Df`` and ``g`` are those of the group's state cut, so a
reset-after-spike neuron costs no more than any other. Operands whose weight
gradient does not involve ``x`` (a bias) only need ``ef``, and are exact.
On a linear leaky layer ``h = alpha h + conv(x) + b`` with the executor's
decay equal to the layer's, this equals BPTT; on spiking layers it is an
approximation.

Without an explicit ``decay`` each op's ``alpha`` is inferred from the model:
the leak ``D`` of the state variable the op drives, averaged over the neurons,
after two steps from the model's initial state with zero input, with
functions that carry a custom derivative (surrogate spikes) held constant. For
a linear leaky layer that is its decay, for a LIF neuron in any style its
membrane decay ``exp(-dt/tau)``. :meth:`report` shows the decay used per op.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import interval, optional
from ..primitive import ES_DRTRL_RULES, apply_state_jacobian
from .base import OnlineLearner
from .report import ES_OUTPUT_TRACE, es_factorised_trace
from ._analysis.jaxpr import depends_on, is_literal
from ._analysis.signals import init_release, step_signals

__all__ = ['ES_D_RTRL']


def _decay_value(decay):
    return optional(interval, 'decay', decay, 0.0, 1.0, '(]', means='inferred from the model',
                    fix="a membrane's decay per step is exp(-dt/tau)")


class ES_D_RTRL(OnlineLearner):
    """ES-D-RTRL executor (see module docstring).

    Args:
      model: a ``brainstate.nn.Module``.
      decay: the input-trace decay ``alpha`` in ``(0, 1]`` (a Python, numpy or
        jax real scalar), used for every op; ``None`` (default) infers one per
        op from the dynamics of the neurons it feeds.
      trace_dtype: ``None`` (traces in the model's dtype) or a floating dtype for
        the traces and gradient accumulators, e.g. ``jnp.float32`` for a bfloat16
        model (mixed precision).
      window: ``None`` (traces only) or a number of steps ``k``: exact BPTT inside
        windows of ``k`` steps, these traces across windows (see
        :class:`~braintrace_conv.executors.OnlineLearner`); ``k >= T`` is BPTT.
      check_finite: refuse inputs and targets holding a NaN or an infinity, naming the
        first such time step (default); ``False`` skips this one pass over the data.
    """

    algorithm = 'ES-D-RTRL'
    required_rules = ES_DRTRL_RULES
    # Its traces are small: on the DVS-sized net a call with them donated took 1.14-1.18x
    # the time of one with fresh buffers (equal on the standard workload), while D-RTRL's
    # large traces gain from donation (0.87x); benchmarks/call_overheads.py.
    donate_state = False

    def __init__(self, model, decay=None, *, trace_dtype=None, window=None, check_finite=True):
        super().__init__(model, trace_dtype=trace_dtype, window=window, check_finite=check_finite)
        self.decay = _decay_value(decay)
        self._inferred = {}

    # ------------------------------------------------------------------ decays
    def decays(self, graph) -> dict:
        """``{op index: alpha}`` for the grouped ops of ``graph``."""
        grouped = [k for k, op in enumerate(graph.ops) if op.group is not None]
        if self.decay is not None:
            return {k: self.decay for k in grouped}
        if id(graph) not in self._inferred:
            self._inferred[id(graph)] = self._infer(graph, grouped)
        return self._inferred[id(graph)]

    @staticmethod
    def _infer(graph, grouped):
        step = graph.step
        params = step.param_leaves()
        inputs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in step.input_vars]
        no_loss = lambda out, target: jnp.zeros(())

        def two_steps(hidden):
            weights = graph.weights(params)
            release = init_release(graph, jnp.result_type(float))
            s0 = step_signals(graph, hidden, params, weights, inputs, None, no_loss, release,
                              hold_custom=True)
            s1 = step_signals(graph, s0.new_hidden, params, weights, inputs, None, no_loss,
                              s0.release, hold_custom=True)
            return s1.D, s1.Df

        hidden = step.hidden_leaves()
        if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves((params, hidden))):
            raise ValueError('ES_D_RTRL(model) infers its decays from the model\'s parameters '
                             'and initial state, which are abstract inside jax.jit: call the '
                             'learner outside jax.jit (it compiles its own calls), make its '
                             'first call outside, or pass ES_D_RTRL(model, decay=...).')
        D, Df = jax.jit(two_steps)(hidden)
        decays = {}
        for k in grouped:
            op = graph.ops[k]
            driven = int(np.argmax(np.mean(np.abs(np.asarray(Df[k])).reshape(-1, Df[k].shape[-1]),
                                           axis=0)))
            alpha = float(np.mean(np.asarray(D[op.group])[..., driven, driven]))
            if not 0 < alpha <= 1:
                raise ValueError(f'the decay inferred for {op.label} from the dynamics at the '
                                 f'initial state is {alpha:.4g}, outside (0, 1]; pass '
                                 f'ES_D_RTRL(model, decay=...) explicitly.')
            decays[k] = alpha
        return decays

    # ------------------------------------------------------------------ traces
    def _input_slots(self, graph):
        """``(slots, readers)``: op index -> index of its input trace (ops reading the same
        value with the same decay share one), and for each input trace the first op that
        reads it."""
        decays = self.decays(graph)
        keys, slots, readers = [], {}, []
        for k, op in enumerate(graph.ops):
            if op.group is None:
                continue
            key = (op.x_var if not is_literal(op.x_var) else ('literal', k), decays[k])
            if key not in keys:
                keys.append(key)
                readers.append(k)
            slots[k] = keys.index(key)
        return slots, readers

    def _init_traces(self, graph, hidden):
        slots, readers = self._input_slots(graph)
        dtype = self.dtype(graph)
        x_traces = [jnp.zeros(graph.ops[k].x_aval.shape, dtype) for k in readers]
        out_traces = {k: self.op_trace_zeros(graph, k, 'init_pp') for k in slots}
        norms = [jnp.zeros((), dtype) for _ in readers]
        return dict(x=x_traces, f=out_traces, norm=norms)

    def _advance_ops(self, graph, state, sig, weights):
        slots, readers = self._input_slots(graph)
        decays = self.decays(graph)
        alphas = [decays[k] for k in readers]
        norms = [a * z + 1.0 for a, z in zip(alphas, state['norm'])]
        x_traces = [a * trace + sig.op_inputs[k].astype(trace.dtype)
                    for a, trace, k in zip(alphas, state['x'], readers)]
        out_traces = {}
        for k in slots:
            d, df = self.signals_in_y_layout(graph, k, sig)
            out_traces[k] = apply_state_jacobian(d, state['f'][k]) + df
        return dict(x=x_traces, f=out_traces, norm=norms)

    def _contract(self, graph, k, state, g, weights):
        s = self._input_slots(graph)[0][k]
        x_hat = state['x'][s] / state['norm'][s].astype(state['x'][s].dtype)
        op = graph.ops[k]
        return op.primitive.rule('xy_to_dw')(x_hat, jnp.sum(g * state['f'][k], axis=-1),
                                             self.op_weights(graph, k, weights), **op.params)

    def _boundary(self, graph, state, g_hidden, weights):
        # a window may start before the first step, where the norm is 0 like the input
        # trace; any norm >= 1 then gives the right x_hat = 0 (later norms are >= 1)
        ops = dict(state['ops'], norm=[jnp.maximum(z, 1.0) for z in state['ops']['norm']])
        return super()._boundary(graph, dict(state, ops=ops), g_hidden, weights)

    # ------------------------------------------------------------------ report
    def _trace_method(self, graph, k, slot):
        if slot in self._input_free_slots(graph.ops[k]):
            return ES_OUTPUT_TRACE
        return es_factorised_trace(self.decays(graph)[k], given=self.decay is not None)

    def _op_trace_bytes(self, graph, op_state):
        slots, _ = self._input_slots(graph)
        nbytes = lambda a: math.prod(a.shape) * a.dtype.itemsize
        sharing = {s: sum(1 for v in slots.values() if v == s) for s in set(slots.values())}
        # the output trace serves every operand of an op; it is counted with the first
        return {k: {next(iter(graph.ops[k].weight_slots)):
                    nbytes(op_state['f'][k]) + nbytes(op_state['x'][s]) // sharing[s]}
                for k, s in slots.items()}

    @staticmethod
    def _input_free_slots(op):
        """Operands whose weight VJP does not depend on ``x`` (e.g. a bias): for them the
        output trace alone is the exact D-RTRL trace."""
        weights = {n: jnp.zeros(a.shape, a.dtype) for n, a in op.weight_avals.items()}
        cot = jnp.zeros(op.y_aval.shape, op.y_aval.dtype)
        jaxpr = jax.make_jaxpr(lambda x: op.primitive.rule('xy_to_dw')(x, cot, weights, **op.params))(
            jnp.zeros(op.x_aval.shape, op.x_aval.dtype))
        return [n for n, v in zip(sorted(weights), jaxpr.jaxpr.outvars)   # dicts flatten sorted
                if not depends_on(jaxpr.jaxpr, v, set(jaxpr.jaxpr.invars))]
