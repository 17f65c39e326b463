r"""Spike encoders: static inputs (images, feature vectors) as time-major spike trains.

Layout: an encoder maps a batch of static inputs ``x`` of shape ``(B, ...)``
(e.g. ``(B, C, H, W)`` channels first) to spikes of shape ``(T, B, ...)``,
time first, the layout every executor and :class:`~braintrace_conv.Trainer`
scan over; values are ``0.``/``1.`` in the floating dtype of ``x`` (the
default float dtype for integer input). :func:`delta` detects changes and so
takes a sequence ``(T, B, ...)``.

* :func:`rate`: every step, each entry spikes with probability ``gain * x``
  (a Bernoulli process, the discrete-time Poisson process of rate ``gain * x``
  spikes per step); needs an explicit PRNG key.
* :func:`latency`: each entry spikes once, brighter earlier (time to first
  spike), with a linear or logarithmic (RC-charging) time code; deterministic.
* :func:`delta`: ON spikes where the input rose by at least ``threshold``
  since the previous step, OFF spikes where it fell by as much.

Inputs holding a NaN or an infinity are refused, naming the first such entry
(checked when the input is concrete, not under ``jit``).

To train with :class:`~braintrace_conv.Trainer`, put the encoded samples in an
:class:`~braintrace_conv.data.EventDataset`, which stores samples ``(N, T,
...)``: ``EventDataset(np.moveaxis(spikes, 0, 1), labels, num_classes)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import ArgumentError, finite, interval, one_of, positive

__all__ = ['rate', 'latency', 'delta', 'LATENCY_CODES']

#: Time codes of :func:`latency`.
LATENCY_CODES = ('linear', 'log')


def _float_input(name: str, x, min_ndim: int) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    if x.ndim < min_ndim:
        layout = '(T, B, ...)' if min_ndim == 2 else '(B, ...)'
        raise ValueError(f'{name} must have at least {min_ndim} axes {layout}, got shape '
                         f'{x.shape}.')
    return x


def _concrete(x):
    """``x`` as a NumPy array, or ``None`` under ``jit`` (a tracer has no values)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _finite(name: str, x, lead: tuple):
    """Refuse a NaN or an infinity in ``x`` ``(*lead, ...)``, naming the first one; returns
    ``x``'s values (``None`` under ``jit``, unchecked)."""
    values = _concrete(x)
    if values is not None:
        finite(name, values, lead + tuple(f'axis {i}' for i in range(len(lead), values.ndim)))
    return values


def _unit_interval(name: str, x: jax.Array) -> None:
    """Refuse values that are not finite or outside [0, 1] (when ``x`` is concrete)."""
    values = _finite(name, x, ('b',))
    if values is not None and values.size and (values.min() < 0 or values.max() > 1):
        raise ArgumentError(name, values, 'hold intensities in [0, 1]', 'scale the data first',
                            shown=f'values in [{values.min()}, {values.max()}]')


def rate(x, num_steps: int, key: jax.Array, *, gain: float = 1.0) -> jax.Array:
    r"""Rate (Bernoulli / discrete-time Poisson) coding.

    .. math::  s_{t,b,i} \sim \mathrm{Bernoulli}(g\, x_{b,i}),
               \quad \text{independent over } t, b, i

    so the expected spike count of an entry over ``T`` steps is ``T g x``.

    Args:
      x: intensities in ``[0, 1]``, shape ``(B, ...)``.
      num_steps: number of time steps ``T``.
      key: a ``jax.random`` key (``jax.random.key(0)`` or ``PRNGKey(0)``); the
        same key gives the same spikes.
      gain: scale of the firing probability, in ``(0, 1]``.

    Returns:
      Spikes ``(T, B, ...)``, ``0.``/``1.`` in the floating dtype of ``x``.

    Raises:
      ValueError: ``x`` not finite or outside ``[0, 1]``, fewer than one axis, or
        bad ``num_steps`` / ``gain``.
    """
    x = _float_input('x', x, 1)
    num_steps = positive('num_steps', num_steps)
    gain = interval('gain', gain, 0, 1, '(]', fix='it scales a spike probability per step')
    _unit_interval('x', x)
    p = gain * x
    return jax.random.bernoulli(key, p, (num_steps, *x.shape)).astype(x.dtype)


def latency(x, num_steps: int, *, code: str = 'linear', threshold: float = 0.01,
            tau: float = 5.0) -> jax.Array:
    r"""Latency (time-to-first-spike) coding: at most one spike per entry, stronger inputs earlier.

    With :math:`\theta` = ``threshold``, an entry with :math:`x \le \theta`
    never spikes; otherwise it spikes once, at step

    .. math::

        t_{\mathrm{linear}} &= \mathrm{round}\big((1 - x)\,(T - 1)\big) \\
        t_{\mathrm{log}} &= \mathrm{round}\big(\tau \ln \tfrac{x}{x - \theta}\big)

    ``'linear'`` spreads ``x`` in ``[0, 1]`` over the ``T`` steps (``x = 1``
    at step 0); ``'log'`` is the time an RC circuit with time constant
    ``tau`` (in steps) driven by ``x`` takes to charge to ``threshold``, so
    weak inputs are delayed more and those with :math:`t \ge T` do not spike.

    Args:
      x: intensities in ``[0, 1]``, shape ``(B, ...)``.
      num_steps: number of time steps ``T``.
      code: ``'linear'`` or ``'log'``.
      threshold: inputs at or below it do not spike, in ``[0, 1)``.
      tau: time constant of the ``'log'`` code, in steps; small enough that an input
        of 1 spikes within ``num_steps`` (otherwise no input could spike).

    Returns:
      Spikes ``(T, B, ...)``, ``0.``/``1.`` in the floating dtype of ``x``;
      at most one spike per entry.
    """
    x = _float_input('x', x, 1)
    num_steps = positive('num_steps', num_steps)
    one_of('code', code, LATENCY_CODES)
    tau = positive('tau', tau, float)
    threshold = interval('threshold', threshold, 0, 1, '[)')
    if code == 'log':
        _spikes_within(tau, threshold, num_steps)
    _unit_interval('x', x)
    fires = x > threshold
    if code == 'linear':
        t = jnp.round((1.0 - x) * (num_steps - 1))
    else:   # safe division: entries at or below the threshold are masked out below
        safe = jnp.where(fires, x, 1.0)
        t = jnp.round(tau * jnp.log(safe / (safe - threshold)))
    steps = jnp.arange(num_steps).reshape((num_steps,) + (1,) * x.ndim)
    return ((steps == t) & fires).astype(x.dtype)


def _spikes_within(tau: float, threshold: float, num_steps: int) -> None:
    """Refuse a ``'log'`` code under which no input spikes within ``num_steps``: the
    earliest spike, of ``x = 1``, is at step ``round(tau ln(1 / (1 - threshold)))``."""
    first = tau * np.log1p(threshold / (1 - threshold))
    if round(first) >= num_steps:
        bound = (num_steps - 0.5) / np.log1p(threshold / (1 - threshold))
        raise ArgumentError('tau', tau, f'be below {bound:.4g} for code=\'log\', threshold '
                            f'{threshold:g} and num_steps {num_steps}', 'even an input of 1 '
                            f'would spike only at step {first:.4g}, so no input would spike')


def delta(xs, threshold: float = 0.1, *, off_spikes: bool = True, initial=None) -> jax.Array:
    r"""Delta (change) coding of a sequence, with ON and OFF polarities.

    With :math:`d_t = x_t - x_{t-1}` (and :math:`x_{-1}` = ``initial``):

    .. math::  \mathrm{on}_t = [d_t \ge \theta], \qquad \mathrm{off}_t = [d_t \le -\theta]

    A static input shown from step 0 (``initial`` zero) gives ON spikes at
    step 0 only where it is at least ``threshold``; use it on sequences that
    change (video, a signal, or a static input moved, e.g. saccades).

    Args:
      xs: sequence ``(T, B, ...)``, any finite real values.
      threshold: positive change that triggers a spike.
      off_spikes: also emit OFF spikes; they are stacked with the ON spikes
        on a new polarity axis after the batch axis (ON = 0, OFF = 1, the
        layout of DVS frames).
      initial: the value before the first step, broadcastable to
        ``xs.shape[1:]``; default zeros.

    Returns:
      ``(T, B, 2, ...)`` ON/OFF spikes with ``off_spikes``, else ON spikes
      ``(T, B, ...)``; ``0.``/``1.`` in the floating dtype of ``xs``.
    """
    xs = _float_input('xs', xs, 2)
    threshold = positive('threshold', threshold, float)
    _finite('xs', xs, ('t', 'b'))
    previous = jnp.zeros(xs.shape[1:], xs.dtype) if initial is None else jnp.broadcast_to(
        jnp.asarray(initial, xs.dtype), xs.shape[1:])
    if initial is not None:
        _finite('initial', initial, ())
    d = jnp.diff(xs, axis=0, prepend=previous[None])
    on = (d >= threshold).astype(xs.dtype)
    if not off_spikes:
        return on
    return jnp.stack([on, (d <= -threshold).astype(xs.dtype)], axis=2)
