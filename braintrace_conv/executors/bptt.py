"""BPTT: ``jax.grad`` through a ``lax.scan`` of the model step — the reference.

Same interface as the online executors. Memory grows linearly with the
sequence length (the scan stores every step's residuals). With
:meth:`~braintrace_conv.executors.Learner.advance` (a stream) it is truncated BPTT:
the hidden state carries across chunks, gradients do not flow across chunk
boundaries -- the baseline the literature compares online rules with; its
:meth:`~braintrace_conv.executors.Learner.report` then says so.
"""
from __future__ import annotations

import jax

from ._scan import scanned_loss
from .base import Learner
from .report import Report, bptt_rows

__all__ = ['BPTT']


class BPTT(Learner):
    """BPTT: ``jax.grad`` through a ``lax.scan`` of the model's step, the exact reference.

    The same interface as the online executors; memory grows linearly with the sequence
    length, since the scan stores every step's residuals. Driven by
    :meth:`~braintrace_conv.executors.Learner.advance` (a stream) it is truncated BPTT:
    the hidden state carries across chunks, the gradient does not, and
    :meth:`~braintrace_conv.executors.Learner.report` says so
    (:mod:`braintrace_conv.executors.bptt`).

    Args:
      model: a ``brainstate.nn.Module`` whose ``update(x)`` advances one step.
      check_finite: refuse inputs and targets holding a NaN or an infinity, naming the
        first such time step (default); ``False`` skips this one pass over the data.

    Examples:
      A conv block of LIF neurons and a dense readout, 10 steps of 2 samples:

      >>> import brainstate, jax.numpy as jnp, optax
      >>> import braintrace_conv as bc
      >>> from braintrace_conv.models import recurrent_conv_snn
      >>> brainstate.random.seed(0)
      >>> model = recurrent_conv_snn((2, 8, 8), 3, channels=(4,), readout='linear')
      >>> xs = (brainstate.random.rand(10, 2, 2, 8, 8) < 0.2).astype(float)   # (T, B, C, H, W)
      >>> labels = jnp.zeros((10, 2), int)                                    # (T, B)
      >>> def loss_fn(scores, label):                   # one step: scores (B, 3), labels (B,)
      ...     return optax.softmax_cross_entropy_with_integer_labels(scores, label).mean()
      >>> learner = bc.BPTT(model)
      >>> loss, grads = learner.value_and_grad(loss_fn, xs, labels)   # loss summed over T
      >>> print(learner.report())
      BPTT: total trace memory 0.00 MiB
      parameter           shape            trace MiB  method
      blocks.0.ff.bias    (4,)                 0.000  exact (BPTT; memory grows with T)
      blocks.0.ff.weight  (4, 2, 3, 3)         0.000  exact (BPTT; memory grows with T)
      fc.bias             (3,)                 0.000  exact (BPTT; memory grows with T)
      fc.weight           (256, 3)             0.000  exact (BPTT; memory grows with T)
    """

    algorithm = 'BPTT'

    def _sequence(self, prepared, loss_fn, params, hidden, state, xs, targets, return_outputs):
        total = lambda p: scanned_loss(prepared, loss_fn, p, hidden, xs, targets, return_outputs)
        (loss, (hidden, outs)), grads = jax.value_and_grad(total, has_aux=True)(params)
        return loss, grads, hidden, state, outs

    def _report(self, step, prepared) -> Report:
        return Report(self.algorithm, bptt_rows(step, truncated=self._advancing))
