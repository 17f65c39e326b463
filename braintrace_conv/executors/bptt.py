"""BPTT: ``jax.grad`` through a ``lax.scan`` of the model step — the reference.

Same interface as the online executors. Memory grows linearly with the
sequence length (the scan stores every step's residuals). With
:meth:`~braintrace_conv.executors.base.Learner.advance` it is truncated BPTT:
gradients do not flow across chunk boundaries.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .base import Learner, Report

__all__ = ['BPTT']


class BPTT(Learner):
    """Backpropagation through time over the traced step (see module docstring)."""

    algorithm = 'BPTT'

    def _sequence(self, step, loss_fn, params, hidden, state, xs, targets, return_outputs):
        def total(params):
            def body(h, inp):
                x, target = inp
                new_h, out = step.evaluate(h, params, jax.tree.leaves(x))
                out = jax.tree.unflatten(step.out_tree, out)
                loss = loss_fn(out, target)
                if jnp.shape(loss) != ():
                    raise ValueError(f'loss_fn must return a scalar, got shape {jnp.shape(loss)}.')
                return new_h, (loss, out if return_outputs else None)

            h_final, (losses, outs) = lax.scan(body, hidden, (xs, targets))
            return jnp.sum(losses), (h_final, outs)

        (loss, (hidden, outs)), grads = jax.value_and_grad(total, has_aux=True)(params)
        return loss, grads, hidden, state, outs

    def _report(self, step, prepared) -> Report:
        leaves = step.param_leaves()
        rows = [dict(parameter=name, shape=tuple(jnp.shape(v)), trace_bytes=0,
                     method='exact (BPTT; memory grows with T)')
                for name, v in zip(step.param_names, leaves)]
        return Report(self.algorithm, rows)
