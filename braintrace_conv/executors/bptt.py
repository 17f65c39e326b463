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
    """Backpropagation through time over the traced step (see module docstring).

    Args:
      model: a ``brainstate.nn.Module`` whose ``update(x)`` advances one step.
      check_finite: refuse inputs and targets holding a NaN or an infinity, naming the
        first such time step (default); ``False`` skips this one pass over the data.
    """

    algorithm = 'BPTT'

    def _sequence(self, prepared, loss_fn, params, hidden, state, xs, targets, return_outputs):
        total = lambda p: scanned_loss(prepared, loss_fn, p, hidden, xs, targets, return_outputs)
        (loss, (hidden, outs)), grads = jax.value_and_grad(total, has_aux=True)(params)
        return loss, grads, hidden, state, outs

    def _report(self, step, prepared) -> Report:
        return Report(self.algorithm, bptt_rows(step, truncated=self._advancing))
