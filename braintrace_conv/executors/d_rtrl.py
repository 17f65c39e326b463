r"""D-RTRL: exact eligibility traces for diagonal dynamics (``docs/theory.md``).

Each hidden group's state is cut where its ops enter (``z``, see ``docs/theory.md``);
for every ETP op feeding a group, per step::

    E^t  = yw_to_w(D^t, E^{t-1}) + xdf_to_trace(x^t, Df^t)
    dW  += trace_to_dw(E^t, g^t)

with ``D^t = dz^t/dz^{t-1}``, ``Df^t = dz^t/dy^t`` and ``g^t = dL^t/dz^t``, and
the op's exact trace: the conv kernel trace keeps output positions and the
bias trace is summed over positions only on contraction. Since ``g^t`` sees
every path of the step, a neuron that outputs the spike of its pre-reset
potential and stores the post-reset one is handled like any other, with no
extra weight-gradient convolution. For a single layer whose hidden state
depends on its past only element by element this equals BPTT. Readouts get
their exact instantaneous gradient. The old trace has a single reader, the
update, so XLA overwrites it in place. Trace memory is ``B * S_out * |K| * m``
per conv: use it for small layers and verification, ES-D-RTRL for scale.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..primitive import DRTRL_RULES
from .base import OnlineLearner
from .report import DRTRL_TRACE

__all__ = ['D_RTRL']


class D_RTRL(OnlineLearner):
    """D-RTRL: exact eligibility traces, carried forward in time.

    Every conv or dense op keeps the trace of how the state it drives depends on its
    weights, updated each step and contracted with that step's loss gradient, so memory
    does not grow with the sequence but a conv's trace holds ``B * S_out * |K| * m``
    numbers (output positions times kernel size times state variables). For a layer whose
    state depends on its past only element by element, whatever the neuron style, the
    gradient equals BPTT's; across layers and recurrent synapses it is truncated, and
    readouts get their exact instantaneous gradient. Use it for small layers and
    verification, :class:`~braintrace_conv.ES_D_RTRL` for scale. The recursions:
    :mod:`braintrace_conv.executors.d_rtrl` and ``docs/theory.md``;
    :meth:`~braintrace_conv.executors.Learner.report` says which case each parameter is.

    Args:
      model: a ``brainstate.nn.Module`` whose ``update(x)`` advances one step.
      trace_dtype: ``None`` (traces in the model's dtype) or a floating dtype for
        the traces and gradient accumulators, e.g. ``jnp.float32`` for a bfloat16
        model (mixed precision).
      window: ``None`` (traces only) or a number of steps ``k``: exact BPTT inside
        windows of ``k`` steps, these traces across windows (see
        :class:`~braintrace_conv.executors.OnlineLearner`); ``k >= T`` is BPTT.
      check_finite: refuse inputs and targets holding a NaN or an infinity, naming the
        first such time step (default); ``False`` skips this one pass over the data.

    Examples:
      One conv block of LIF neurons and a dense readout, 10 steps of 2 samples: the
      gradient is BPTT's.

      >>> import brainstate, jax.numpy as jnp, optax
      >>> import braintrace_conv as bc
      >>> from braintrace_conv.models import recurrent_conv_snn
      >>> brainstate.random.seed(0)
      >>> model = recurrent_conv_snn((2, 8, 8), 3, channels=(4,), readout='linear')
      >>> xs = (brainstate.random.rand(10, 2, 2, 8, 8) < 0.2).astype(float)   # (T, B, C, H, W)
      >>> labels = jnp.zeros((10, 2), int)                                    # (T, B)
      >>> def loss_fn(scores, label):                   # one step: scores (B, 3), labels (B,)
      ...     return optax.softmax_cross_entropy_with_integer_labels(scores, label).mean()
      >>> exact = bc.D_RTRL(model).value_and_grad(loss_fn, xs, labels)[1]
      >>> reference = bc.BPTT(model).value_and_grad(loss_fn, xs, labels)[1]
      >>> all(jnp.allclose(exact[k], reference[k], rtol=1e-4, atol=1e-6) for k in reference)
      True
    """

    algorithm = 'D-RTRL'
    required_rules = DRTRL_RULES

    def _init_traces(self, graph, hidden):
        return {k: self.op_trace_zeros(graph, k, 'init_drtrl')
                for k, op in enumerate(graph.ops) if op.group is not None}

    def _advance_ops(self, graph, traces, sig, weights):
        return {k: advance_exact_trace(self, graph, k, traces[k], sig, weights) for k in traces}

    def _contract(self, graph, k, traces, g, weights):
        return contract_exact_trace(self, graph, k, traces[k], g, weights)

    def _trace_method(self, graph, k, slot):
        return DRTRL_TRACE

    def _op_trace_bytes(self, graph, op_state):
        return {k: exact_trace_bytes(t) for k, t in op_state.items()}


# Op by op, for D_RTRL and for the ops ES_D_RTRL gives exact traces (``exact=``).
def advance_exact_trace(learner, graph, k, trace, sig, weights):
    """Grouped op ``k``'s exact trace advanced by one step:
    ``yw_to_w(D, E) + xdf_to_trace(x, Df)``."""
    op = graph.ops[k]
    d, df = learner.signals_in_y_layout(graph, k, sig)
    rule, w = op.primitive.rule, learner.op_weights(graph, k, weights)
    return jax.tree.map(jnp.add, rule('yw_to_w')(d, trace, **op.params),
                        rule('xdf_to_trace')(sig.op_inputs[k], df, w, **op.params))


def contract_exact_trace(learner, graph, k, trace, g, weights):
    """Op ``k``'s weight gradients ``{slot: dw}`` from its exact trace and a learning signal."""
    op = graph.ops[k]
    return op.primitive.rule('trace_to_dw')(trace, g, learner.op_weights(graph, k, weights),
                                            **op.params)


def exact_trace_bytes(trace) -> dict:
    """``{slot: bytes}`` of one op's exact trace (arrays or their shapes)."""
    return {slot: math.prod(a.shape) * a.dtype.itemsize for slot, a in trace.items()}
