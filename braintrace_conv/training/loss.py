r"""Losses of class scores over a sequence, for training and evaluation.

A model maps one step ``(B, ...)`` to class scores ``(B, K)``; over a
sequence they stack to ``s`` of shape ``(T, B, K)`` (spikes of an output
layer, potentials of a readout, or any score). The loss of a batch is the
mean over samples ``b`` of a per-sample loss ``L_b``; the prediction is the
argmax over classes of a pooled score ``p_b`` ``(B, K)``. With
:math:`\mathrm{CE}(z, y) = \log \sum_c e^{z_c} - z_y`:

* ``'every_step'``: :math:`L_b = \sum_t w_t\, \mathrm{CE}(s_{t,b}, y_b)` with
  :math:`w_t = 1/T`; :math:`p_b = \sum_t w_t s_{t,b}`.
* ``'final'``: the same with :math:`w_t = 1/F` on the last :math:`F` steps
  (``final_steps``), 0 before.
* ``'count_ce'``: :math:`L_b = \mathrm{CE}(n_b, y_b)` of the counts
  :math:`n_b = \sum_t s_{t,b}`; :math:`p_b = n_b`.
* ``'count_mse'``: :math:`L_b = \frac1K \sum_c (n_{b,c} / T - \rho_{b,c})^2`;
  :math:`p_b = n_b`.
* ``'max_membrane'``: :math:`L_b = \mathrm{CE}(\max_t s_{t,b}, y_b)`;
  :math:`p_b = \max_t s_{t,b}`.
* ``'mean_membrane'``: :math:`L_b = \mathrm{CE}(\bar s_b, y_b)` with
  :math:`\bar s_b = \frac1T \sum_t s_{t,b}`; :math:`p_b = \bar s_b`.

Firing-rate regulariser
-----------------------
With target rates :math:`\rho_l` per hidden layer ``l`` (fraction of its
neurons spiking per step), :func:`rate_penalty` adds to every :math:`L_b`

.. math::  R_b = \lambda \sum_l (r_{l,b} - \rho_l)^2, \qquad
           r_{l,b} = \frac{1}{T N_l} \sum_{t,i} z_{l,t,b,i},

where :math:`z_l` are the spikes of layer ``l`` (:math:`N_l` neurons) that
the model returns with its scores (``(scores, {name: spikes})`` per step).
A function of the whole sequence, it is trained like the sequence losses.

In ``'count_mse'`` the target rate (per step) :math:`\rho_{b,c}` is
``target_rates[0]`` for the true class and ``target_rates[1]`` for the others
(spike-count MSE; with spiking outputs, ``n / T`` is the firing rate).

Step losses and sequence losses
-------------------------------
``'every_step'`` and ``'final'`` are sums of per-step losses
(:func:`weighted_cross_entropy`), the form the executors take
(``loss_fn(output_t, target_t)`` summed over steps), so they train truly
online (``Trainer(update_every=k)``).

The others (:data:`SEQUENCE_LOSSES`) are functions of the whole sequence:
the derivative of ``L`` with respect to an early output depends on outputs
not seen yet (a count, a maximum, a mean), so no per-step loss has their
gradient while the sequence runs. They are trained exactly, online in memory,
in two passes over each batch: a forward pass gives the outputs ``s`` and the
cotangents :math:`g_t = \partial L / \partial s_t` (``jax.grad`` of
:func:`sequence_loss`), then the executor differentiates the per-step loss
:math:`\langle g_t, s_t \rangle` (:func:`linearised_step_loss`, ``g`` held
fixed), whose gradient is, by the chain rule,
:math:`\sum_t g_t\, \partial s_t / \partial \theta = \partial L / \partial
\theta` -- exact wherever the executor is exact for per-step losses (for
``'max_membrane'``, :math:`g_t` is non-zero only at the step of the
maximum). The price is one extra forward pass, and the update waits for the
end of the sequence: a sequence loss with ``update_every`` is refused.

Scores must be dimensionless (a ``saiunit`` quantity with a unit is refused:
the loss of scores in mV would change with the unit).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import saiunit as u

from .._validation import ArgumentError, at_most, one_of, positive

__all__ = ['LOSSES', 'SEQUENCE_LOSSES', 'DEFAULT_TARGET_RATES', 'step_weights',
           'cross_entropy', 'weighted_cross_entropy', 'pooled_scores', 'sequence_loss',
           'predicted_labels', 'linearised_step_loss',
           'check_target_rates', 'rate_penalty', 'check_rate_targets']

#: Names of the losses (module docstring).
LOSSES = ('every_step', 'final', 'count_ce', 'count_mse', 'max_membrane', 'mean_membrane')
#: The losses of the whole sequence, trained in two passes (module docstring).
SEQUENCE_LOSSES = ('count_ce', 'count_mse', 'max_membrane', 'mean_membrane')
#: Target rates per step ``(true class, other classes)`` of ``'count_mse'``.
DEFAULT_TARGET_RATES = (0.8, 0.2)


def step_weights(loss: str, num_steps: int, final_steps: int = 1) -> np.ndarray:
    """The loss weights ``w_t`` of the time steps, float32 ``(num_steps,)``: ``1/F`` on the
    last ``F = final_steps`` steps for ``'final'``, ``1/T`` on every step for the other
    losses."""
    one_of('loss', loss, LOSSES)
    num_steps = positive('num_steps', num_steps)
    if loss != 'final':
        return np.full(num_steps, 1.0 / num_steps, np.float32)
    final_steps = at_most('final_steps', positive('final_steps', final_steps), num_steps,
                          'num_steps')
    w = np.zeros(num_steps, np.float32)
    w[num_steps - final_steps:] = 1.0 / final_steps
    return w


def check_target_rates(value) -> tuple:
    """``value`` as the pair ``(true class, other classes)`` of rates in [0, 1] per step."""
    try:
        rates = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        rates = ()
    if len(rates) != 2 or not all(0 <= r <= 1 for r in rates):
        raise ArgumentError('target_rates', value, 'be two rates per step in [0, 1] (true '
                                                   'class, other classes)', shown=repr(value))
    return rates


def _logits(scores):
    logits = u.maybe_decimal(scores)
    if isinstance(logits, u.Quantity):
        raise ValueError(f'class scores must be dimensionless for the loss, got unit '
                         f'{u.get_unit(scores)}; divide them by a reference (e.g. V / u.mV).')
    return logits


def cross_entropy(scores, labels):
    """``CE(scores[..., :], labels[...])``: scores ``(..., K)``, int labels ``(...)``."""
    return optax.softmax_cross_entropy_with_integer_labels(_logits(scores), labels)


def weighted_cross_entropy(scores, target):
    """One step's loss ``w_t * mean_b CE``, the ``loss_fn`` given to the executors.

    ``scores``: ``(B, K)``; ``target``: ``(labels (B,) int, w_t)``, the weight a scalar
    (one per step) or ``(B,)``, one per sequence, as a stream's segments give them
    (:class:`~braintrace_conv.data.EventStream`): then the loss is
    ``mean_b w_{t,b} CE(s_{t,b}, y_{t,b})``.
    """
    labels, weight = target
    if jnp.ndim(weight) == 0:
        return weight * jnp.mean(cross_entropy(scores, labels))
    return jnp.mean(weight * cross_entropy(scores, labels))


def pooled_scores(scores, step_weights, loss: str = 'every_step'):
    """The pooled score ``p`` of the module docstring: scores ``(T, B, K)``, step weights
    ``(T,)`` (:func:`step_weights`; used by ``'every_step'`` and ``'final'``) -> ``(B, K)``."""
    one_of('loss', loss, LOSSES)
    s = jnp.asarray(_logits(scores))
    if loss in ('every_step', 'final'):
        return jnp.tensordot(jnp.asarray(step_weights, s.dtype), s, axes=1)
    if loss == 'max_membrane':
        return jnp.max(s, axis=0)
    if loss == 'mean_membrane':
        return jnp.mean(s, axis=0)
    return jnp.sum(s, axis=0)   # spike counts


def sequence_loss(scores, labels, step_weights, loss: str = 'every_step',
                  rates: tuple = DEFAULT_TARGET_RATES):
    """``L_b`` per sample: scores ``(T, B, K)``, int labels ``(B,)``, step weights ``(T,)``
    (:func:`step_weights`) -> ``(B,)`` (a JAX array, differentiable in ``scores``).
    ``rates``: the target rates of ``'count_mse'`` (:func:`check_target_rates`)."""
    s = jnp.asarray(_logits(scores))
    labels = jnp.asarray(labels)
    if loss in ('every_step', 'final'):
        ce = cross_entropy(s, jnp.broadcast_to(labels, s.shape[:2]))
        return jnp.tensordot(jnp.asarray(step_weights, ce.dtype), ce, axes=1)
    pooled = pooled_scores(s, step_weights, loss)
    if loss != 'count_mse':
        return cross_entropy(pooled, labels)
    onehot = jax.nn.one_hot(labels, s.shape[-1], dtype=s.dtype)
    target = onehot * rates[0] + (1 - onehot) * rates[1]
    return jnp.mean((pooled / s.shape[0] - target) ** 2, axis=-1)


def predicted_labels(scores, step_weights, loss: str = 'every_step') -> np.ndarray:
    """``argmax_c p[b, c]`` (module docstring): scores ``(T, B, K)``, step weights ``(T,)``
    -> int ``(B,)``."""
    return np.argmax(np.asarray(pooled_scores(scores, step_weights, loss)), axis=-1)


def linearised_step_loss(outputs, cotangents):
    """``<g_t, s_t>``, the per-step loss whose gradient summed over steps is that of a
    sequence loss (module docstring): ``outputs`` of one step (scores ``(B, K)``, or a
    pytree such as ``(scores, {name: spikes})``) and cotangents ``g_t`` of the same
    structure; sums over every leaf."""
    is_q = lambda v: isinstance(v, u.Quantity)
    leaves = jax.tree.leaves(outputs, is_leaf=is_q)
    return sum(jnp.sum(_logits(o) * jax.lax.stop_gradient(g))
               for o, g in zip(leaves, jax.tree.leaves(cotangents), strict=True))


def check_rate_targets(value) -> dict:
    """``value`` as ``{layer name: target rate in [0, 1]}`` (``None`` -> ``{}``)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, bool) and 0 <= v <= 1 for k, v in value.items()):
        raise ArgumentError('rate_targets', value, 'be a dict {layer name: target fraction of '
                                                   'its neurons spiking per step, in [0, 1]}',
                            shown=repr(value))
    return {k: float(v) for k, v in value.items()}


def rate_penalty(spikes: dict, rate_targets: dict, strength: float):
    """``R_b`` of the module docstring: ``spikes`` ``{name: (T, B, ...)}`` (every name of
    ``rate_targets`` present), ``rate_targets`` ``{name: rate}``, ``strength``
    (:math:`\\lambda`) -> ``(B,)``."""
    total = 0.0
    for name, target in rate_targets.items():
        z = jnp.asarray(u.get_mantissa(spikes[name]))
        rate = jnp.mean(jnp.reshape(z, jnp.shape(z)[:2] + (-1,)), axis=(0, 2))
        total = total + (rate - target) ** 2
    return strength * total
