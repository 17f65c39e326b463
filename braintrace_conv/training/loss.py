r"""Time-weighted softmax cross-entropy of per-step class scores, for training and evaluation.

A model maps one step ``(B, ...)`` to class scores ``(B, K)``; over a
sequence they stack to ``(T, B, K)``. With per-step weights ``w`` (``(T,)``,
summing to one) the loss of sample ``b`` with label ``y_b`` is

.. math::  L_b = \sum_t w_t \, \mathrm{CE}(s_{t,b}, y_b),
           \qquad \mathrm{CE}(s, y) = \log \sum_c e^{s_c} - s_y,

the batch loss is the mean of ``L_b`` over ``b``, and the prediction is
``argmax_c sum_t w_t s_{t,b,c}``. ``'every_step'`` weights every step
``1 / T``; ``'final'`` weights the last ``k`` steps ``1 / k`` and the others 0.
Scores must be dimensionless (a ``saiunit`` quantity with a unit is refused:
the cross-entropy of scores in mV would change with the unit).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import saiunit as u

from .._validation import one_of, positive

__all__ = ['LOSSES', 'step_weights', 'cross_entropy', 'weighted_cross_entropy',
           'sequence_loss', 'predicted_labels']

#: Names of the step weightings.
LOSSES = ('every_step', 'final')


def step_weights(loss: str, num_steps: int, final_steps: int = 1) -> np.ndarray:
    """Per-step weights ``w``, float32 ``(num_steps,)`` (module docstring)."""
    one_of('loss', loss, LOSSES)
    num_steps = positive('num_steps', num_steps)
    if loss == 'every_step':
        return np.full(num_steps, 1.0 / num_steps, np.float32)
    final_steps = positive('final_steps', final_steps)
    if final_steps > num_steps:
        raise ValueError(f'final_steps must be at most the number of time steps of the data '
                         f'({num_steps}), got {final_steps}.')
    w = np.zeros(num_steps, np.float32)
    w[num_steps - final_steps:] = 1.0 / final_steps
    return w


def _logits(scores):
    logits = u.maybe_decimal(scores)
    if isinstance(logits, u.Quantity):
        raise ValueError(f'class scores must be dimensionless for the cross-entropy, got unit '
                         f'{u.get_unit(scores)}; divide them by a reference (e.g. V / u.mV).')
    return logits


def cross_entropy(scores, labels):
    """``CE(scores[..., :], labels[...])``: scores ``(..., K)``, int labels ``(...)``."""
    return optax.softmax_cross_entropy_with_integer_labels(_logits(scores), labels)


def weighted_cross_entropy(scores, target):
    """One step's loss ``w_t * mean_b CE``, the ``loss_fn`` given to the executors.

    ``scores``: ``(B, K)``; ``target``: ``(labels (B,) int, w_t scalar)``.
    """
    labels, weight = target
    return weight * jnp.mean(cross_entropy(scores, labels))


def sequence_loss(scores, labels, weights) -> np.ndarray:
    """``L_b`` per sample: scores ``(T, B, K)``, labels ``(B,)``, weights ``(T,)`` -> ``(B,)``."""
    ce = cross_entropy(scores, jnp.broadcast_to(labels, np.shape(scores)[:2]))
    return np.asarray(jnp.tensordot(jnp.asarray(weights, ce.dtype), ce, axes=1))


def predicted_labels(scores, weights) -> np.ndarray:
    """``argmax_c sum_t w_t scores[t, b, c]``: scores ``(T, B, K)`` -> int ``(B,)``."""
    pooled = np.tensordot(np.asarray(weights), np.asarray(_logits(scores)), axes=1)
    return np.argmax(pooled, axis=-1)
