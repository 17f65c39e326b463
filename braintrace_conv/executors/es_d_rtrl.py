r"""ES-D-RTRL: linear-memory traces, input trace ⊗ output trace (DESIGN.md section 3).

Per step, with a decay ``alpha`` and ``Z^t = sum_{r=0..t} alpha^r`` counted
from the sequence start inside the scan::

    ex^t = alpha * ex^{t-1} + x^t                 one per distinct op input
    ef^t = D^t ef^{t-1} + Df^t                    per op, (*y.shape, n)
    dW  += xy_to_dw(ex^t / Z^t, sum_n g^t * ef^t)

i.e. one weight-gradient convolution per op and step, the work BPTT does per
step. The bias gradient only involves ``ef`` and is exact. On a linear leaky
layer ``h = alpha h + conv(x) + b`` with the executor's decay equal to the
layer's, this equals BPTT; on spiking layers it is an approximation.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from ..primitive import ES_DRTRL_RULES, apply_state_jacobian
from .base import OnlineLearner, Report
from .graph import depends_on

__all__ = ['ES_D_RTRL']


class ES_D_RTRL(OnlineLearner):
    """ES-D-RTRL executor (see module docstring).

    Args:
      model: a ``brainstate.nn.Module``.
      decay: the input-trace decay ``alpha`` in ``(0, 1]``, typically the
        synaptic/membrane decay ``exp(-dt / tau)`` of the network's neurons.
    """

    algorithm = 'ES-D-RTRL'
    required_rules = ES_DRTRL_RULES

    def __init__(self, model, decay: float):
        super().__init__(model)
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
            raise ValueError(f'decay must be a number in (0, 1] (e.g. exp(-dt/tau)), got {decay!r}.')
        self.decay = float(decay)

    @staticmethod
    def _input_slots(graph):
        """``(slots, readers)``: op index -> index of its input trace (ops reading the same
        value share one), and for each input trace the first op that reads it."""
        keys, slots, readers = [], {}, []
        jaxpr = graph.step.closed_jaxpr.jaxpr
        for k, op in enumerate(graph.ops):
            if op.group is None:
                continue
            var = jaxpr.eqns[op.eqn].invars[op.primitive.x_invar_index]
            key = var if not isinstance(var, jex_core.Literal) else ('literal', k)
            if key not in keys:
                keys.append(key)
                readers.append(k)
            slots[k] = keys.index(key)
        return slots, readers

    def _init_state(self, graph, hidden):
        slots, readers = self._input_slots(graph)
        x_traces = [None] * len(readers)
        out_traces = {}
        for k, slot in slots.items():
            op = graph.ops[k]
            x_traces[slot] = jnp.zeros(op.x_aval.shape, op.y_aval.dtype)
            out_traces[k] = op.primitive.rule('init_pp')(
                op.x_aval, op.y_aval, op.weight_avals, graph.groups[op.group].n, **op.params)
        return dict(x=x_traces, f=out_traces, norm=jnp.zeros((), jnp.result_type(float)))

    def _update(self, graph, state, sig, weights):
        slots, readers = self._input_slots(graph)
        alpha = self.decay
        norm = alpha * state['norm'] + 1.0
        x_traces = [alpha * trace + sig.xs[k] for trace, k in zip(state['x'], readers)]
        out_traces, dw = {}, {}
        for k, op in enumerate(graph.ops):
            if op.group is None:
                dw[k] = self.instantaneous_dw(graph, k, sig, weights)
                continue
            d, df, g = self.signals_in_y_layout(graph, k, sig)
            out_traces[k] = apply_state_jacobian(d, state['f'][k]) + df
            x_hat = x_traces[slots[k]] / norm.astype(x_traces[slots[k]].dtype)
            dw[k] = op.primitive.rule('xy_to_dw')(x_hat, jnp.sum(g * out_traces[k], axis=-1),
                                                  weights[k], **op.params)
            if op.bypass:
                dw[k] = jax.tree.map(jnp.add, dw[k],
                                     self.instantaneous_dw(graph, k, sig, weights, df, g))
        return dict(x=x_traces, f=out_traces, norm=norm), dw

    def _report(self, graph) -> Report:
        shapes = jax.eval_shape(lambda: self._init_state(graph, None))
        slots, _ = self._input_slots(graph)
        nbytes = lambda a: math.prod(a.shape) * a.dtype.itemsize
        sharing = {s: sum(1 for v in slots.values() if v == s) for s in set(slots.values())}
        # the output trace serves every operand of an op; it is counted with the first
        slot_bytes = {k: {next(iter(graph.ops[k].weight_slots)):
                          nbytes(shapes['f'][k]) + nbytes(shapes['x'][s]) // sharing[s]}
                      for k, s in slots.items()}
        exact = {(k, slot) for k in slots for slot in self._input_free_slots(graph.ops[k])}
        return self._method_rows(
            graph, lambda k, slot: ('exact trace (ES-D-RTRL output trace; does not involve x)'
                                    if (k, slot) in exact else
                                    f'approximate trace (ES-D-RTRL, decay {self.decay:.4g})'),
            slot_bytes)

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
