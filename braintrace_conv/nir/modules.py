r"""The modules a loaded NIR graph is made of: one per node type that is not a plain layer.

NIR describes continuous-time dynamics and no step. A loaded graph advances by steps of
length ``dt`` (seconds) with the forward-Euler discretisation that the NIR libraries use
(snnTorch, Norse, Sinabs, Spyx). With :math:`q = dt / \tau`:

.. math::

    \text{LIF, LI:}\quad v_t &= v_{leak} + (\tilde v_{t-1} - v_{leak})(1 - q) + r q\, x_t \\
    \text{CubaLIF, CubaLI:}\quad I_t &= I_{t-1} (1 - q_{syn}) + w_{in} q_{syn}\, x_t, \qquad
        v_t = v_{leak} + (\tilde v_{t-1} - v_{leak})(1 - q_{mem}) + r q_{mem}\, I_t \\
    \text{IF, I:}\quad v_t &= \tilde v_{t-1} + r\, x_t \quad
        (\text{or } r\, dt\, x_t \text{ with } \texttt{integrator='euler'})

A spiking node fires :math:`s_t = [v_t > v_{threshold}]` (strictly above, as NIR says),
and :math:`\tilde v_{t-1}` is :math:`v_{t-1}` after the reset its spike causes: set to
``v_reset`` (``reset='value'``, NIR's), or lowered by ``v_threshold - v_reset``
(``'subtract'``), a reset NIR has no field for (see :func:`braintrace_conv.nir.load`).
``'subtract_after_leak'`` subtracts after the leak instead, :math:`v_t = v_{leak} + (v_{t-1}
- v_{leak})(1 - q) + r q\, x_t - (v_{threshold} - v_{reset})\, s_{t-1}`: snnTorch's subtract
reset with its default ``reset_delay=True``. The stored state is the
potential *before* the reset, as in :mod:`braintrace_conv.nn.neurons`, so a step's output
is a function of the new state alone and the previous step's output can be recomputed
from the stored state (:meth:`NIRNeuron.previous_output`), which is how a loaded graph
closes its cycles without storing spikes. ``v`` starts at ``v_leak`` (0 for IF and I),
``I`` at 0.

The surrogate gradient of a spike is that of ``spike_fn`` at the distance to threshold
divided by ``|v_threshold - v_reset|`` (by 1 where that is 0): the forward value is
``1 - spike_fn(-d)``, which is 1 exactly when ``d > 0``.

Every coefficient (``1 - q``, ``r q``, ...) is computed once, in float64 NumPy, from the
node's parameters, then cast to the default float dtype of ``brainstate``. Parameters keep
the node's full shape (NIR stores them so); the state has shape ``(batch, *shape)``.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..nn.surrogate import Sigmoid

__all__ = ['NIRNeuron', 'SpikingNeuron', 'EulerLIF', 'EulerCubaLIF', 'EulerIF', 'EulerLI', 'EulerCubaLI', 'EulerI',
           'Threshold', 'Scale', 'FlattenDims', 'SumPool2d', 'Delay', 'RESETS', 'INTEGRATORS']

#: The resets a loaded spiking node can apply (NIR's is ``'value'``; module docstring).
RESETS = ('value', 'subtract', 'subtract_after_leak')
#: How IF and I integrate their input per step: NIR libraries add ``r x`` (``'charge'``).
INTEGRATORS = ('charge', 'euler')


def _constant(value) -> jax.Array:
    return jnp.asarray(np.asarray(value, np.float64), brainstate.environ.dftype())


def _batched(shape: tuple, batch_size: Optional[int]) -> tuple:
    return shape if batch_size is None else (int(batch_size),) + shape


def strict_spike(distance, spike_fn: Callable) -> jax.Array:
    """``1.`` where ``distance > 0``, else ``0.``, with the surrogate of ``spike_fn``.

    ``spike_fn`` fires at ``distance >= 0``; ``1 - spike_fn(-distance)`` fires strictly
    above, with the derivative ``spike_fn'(-distance)`` (the same for the symmetric
    surrogates of :mod:`braintrace_conv.nn.surrogate`).
    """
    return 1.0 - spike_fn(-distance)


class NIRNeuron(brainstate.nn.Module):
    r"""Base of the stateful nodes: shape, the membrane state ``v`` and its first value.

    Args:
      shape (tuple of int): The node's shape without the batch axis (that of its parameters).
      v_initial (array): First value of ``v``, broadcastable to ``shape``.

    Attributes:
      v (brainstate.HiddenState): Membrane potential, stored before any reset.
    """

    def __init__(self, shape: Sequence[int], v_initial, name: Optional[str] = None):
        super().__init__(name=name)
        self.in_size = self.out_size = tuple(int(s) for s in shape)
        self._v_initial = np.broadcast_to(np.asarray(v_initial, np.float64), self.in_size)

    def _fresh(self, batch_size, value) -> jax.Array:
        return jnp.broadcast_to(_constant(value), _batched(self.in_size, batch_size))

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``v`` (``v_initial``), shape ``(batch_size, *shape)`` or ``shape``."""
        self.v = brainstate.HiddenState(self._fresh(batch_size, self._v_initial))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``v`` back to ``v_initial``."""
        self.v.value = self._fresh(batch_size, self._v_initial)

    def previous_output(self) -> jax.Array:
        """The output of the last step, from the stored state (zero before the first)."""
        return self.v.value


class SpikingNeuron(NIRNeuron):
    """Base of the spiking nodes: threshold, reset (:data:`RESETS`) and the spike.

    Args:
      shape, v_initial: As in :class:`NIRNeuron`.
      v_threshold, v_reset (array): Broadcastable to ``shape``.
      reset (str): One of :data:`RESETS` (module docstring).
      spike_fn (callable): Surrogate spike function (fires at ``x >= 0``).
    """

    def __init__(self, shape, v_initial, v_threshold, v_reset, reset: str, spike_fn: Callable,
                 name: Optional[str] = None):
        super().__init__(shape, v_initial, name=name)
        if reset not in RESETS:
            raise ValueError(f'reset must be one of {RESETS}, got {reset!r}.')
        if not callable(spike_fn):
            raise TypeError(f'spike_fn must be callable, got {type(spike_fn).__name__}.')
        v_threshold = np.broadcast_to(np.asarray(v_threshold, np.float64), self.in_size)
        v_reset = np.broadcast_to(np.asarray(v_reset, np.float64), self.in_size)
        width = np.abs(v_threshold - v_reset)
        self.v_threshold, self.v_reset = _constant(v_threshold), _constant(v_reset)
        self.width = _constant(np.where(width > 0, width, 1.0))
        self.reset, self.spike_fn = reset, spike_fn

    def spike(self, v=None) -> jax.Array:
        """Spike of ``v`` (default: the stored state): ``[v > v_threshold]``."""
        v = self.v.value if v is None else v
        return strict_spike((v - self.v_threshold) / self.width, self.spike_fn)

    def previous_output(self) -> jax.Array:
        return self.spike()

    def _after_reset(self, v):
        s = self.spike(v)
        if self.reset == 'subtract':
            return v - (self.v_threshold - self.v_reset) * s
        if self.reset == 'value':
            return v + (self.v_reset - v) * s
        return v    # 'subtract_after_leak': see _leak

    def _leak(self, drive):
        """``v_leak + (v~ - v_leak)(1 - q) + drive`` from the stored ``v``, reset included."""
        v = self.v.value
        new = self.v_leak + (self._after_reset(v) - self.v_leak) * self.decay + drive
        if self.reset == 'subtract_after_leak':
            new = new - (self.v_threshold - self.v_reset) * self.spike(v)
        return new


class EulerLIF(SpikingNeuron):
    r"""NIR ``LIF``: :math:`\tau \dot v = (v_{leak} - v) + r I`, spike above ``v_threshold``.

    Step (module docstring): :math:`v_t = v_{leak} + (\tilde v - v_{leak})(1 - q) + r q\,
    x_t`, :math:`q = dt / \tau`; returns the spikes :math:`[v_t > v_{threshold}]`.

    Args:
      tau, r, v_leak, v_threshold, v_reset (array): The node's parameters, full shape;
        ``tau`` in seconds.
      dt (float): Step in seconds.
      reset ({'value', 'subtract'}): How a spike resets ``v``.
      spike_fn (callable): Surrogate spike function.
    """

    def __init__(self, tau, r, v_leak, v_threshold, v_reset, dt: float, reset: str = 'value',
                 spike_fn: Callable = Sigmoid(4.0), name: Optional[str] = None):
        tau = np.asarray(tau, np.float64)
        super().__init__(tau.shape, v_leak, v_threshold, v_reset, reset, spike_fn, name=name)
        q = dt / tau
        self.decay, self.gain = _constant(1.0 - q), _constant(np.asarray(r, np.float64) * q)
        self.v_leak = _constant(np.broadcast_to(np.asarray(v_leak, np.float64), self.in_size))

    def update(self, x) -> jax.Array:
        """One step; ``x`` broadcastable to ``(batch, *shape)``; returns the spikes."""
        self.v.value = self._leak(self.gain * x)
        return self.spike()


class EulerIF(SpikingNeuron):
    r"""NIR ``IF``: :math:`\dot v = r I`, spike above ``v_threshold``, no leak.

    Step: :math:`v_t = \tilde v + g\, x_t` with ``g = r`` (``integrator='charge'``: the
    input is what one step delivers, as the NIR libraries run IF) or ``g = r dt``
    (``'euler'``). ``v`` starts at 0.
    """

    def __init__(self, r, v_threshold, v_reset, dt: float, reset: str = 'value',
                 integrator: str = 'charge', spike_fn: Callable = Sigmoid(4.0),
                 name: Optional[str] = None):
        r = np.asarray(r, np.float64)
        super().__init__(r.shape, 0.0, v_threshold, v_reset, reset, spike_fn, name=name)
        if integrator not in INTEGRATORS:
            raise ValueError(f'integrator must be one of {INTEGRATORS}, got {integrator!r}.')
        self.gain = _constant(r if integrator == 'charge' else r * dt)

    def update(self, x) -> jax.Array:
        """One step; returns the spikes."""
        v = self.v.value
        new = self._after_reset(v) + self.gain * x
        if self.reset == 'subtract_after_leak':     # no leak: the same as 'subtract'
            new = new - (self.v_threshold - self.v_reset) * self.spike(v)
        self.v.value = new
        return self.spike()


class EulerCubaLIF(SpikingNeuron):
    r"""NIR ``CubaLIF``: a leaky current ``I`` (``tau_syn``, input weight ``w_in``) drives a
    LIF membrane (``tau_mem``, ``r``).

    Step: :math:`I_t = I (1 - q_{syn}) + w_{in} q_{syn} x_t`, then the LIF step with input
    :math:`I_t`. Returns the spikes.

    Attributes:
      i (brainstate.HiddenState): Synaptic current, starts at 0.
    """

    def __init__(self, tau_syn, tau_mem, r, v_leak, v_threshold, v_reset, w_in, dt: float,
                 reset: str = 'value', spike_fn: Callable = Sigmoid(4.0),
                 name: Optional[str] = None):
        tau_syn, tau_mem = np.asarray(tau_syn, np.float64), np.asarray(tau_mem, np.float64)
        super().__init__(tau_mem.shape, v_leak, v_threshold, v_reset, reset, spike_fn, name=name)
        q_syn, q_mem = dt / tau_syn, dt / tau_mem
        self.syn_decay = _constant(1.0 - q_syn)
        self.syn_gain = _constant(np.asarray(w_in, np.float64) * q_syn)
        self.decay, self.gain = _constant(1.0 - q_mem), _constant(np.asarray(r, np.float64) * q_mem)
        self.v_leak = _constant(np.broadcast_to(np.asarray(v_leak, np.float64), self.in_size))

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``v`` (``v_leak``) and ``i`` (zeros)."""
        super().init_state(batch_size)
        self.i = brainstate.HiddenState(self._fresh(batch_size, 0.0))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``v`` back to ``v_leak`` and ``i`` to zero."""
        super().reset_state(batch_size)
        self.i.value = self._fresh(batch_size, 0.0)

    def update(self, x) -> jax.Array:
        """One step; returns the spikes."""
        self.i.value = self.i.value * self.syn_decay + self.syn_gain * x
        self.v.value = self._leak(self.gain * self.i.value)
        return self.spike()


class EulerLI(NIRNeuron):
    r"""NIR ``LI``: :math:`\tau \dot v = (v_{leak} - v) + r I`; returns ``v``.

    Step: :math:`v_t = v_{leak} + (v - v_{leak})(1 - q) + r q\, x_t`.
    """

    def __init__(self, tau, r, v_leak, dt: float, name: Optional[str] = None):
        tau = np.asarray(tau, np.float64)
        super().__init__(tau.shape, v_leak, name=name)
        q = dt / tau
        self.decay, self.gain = _constant(1.0 - q), _constant(np.asarray(r, np.float64) * q)
        self.v_leak = _constant(np.broadcast_to(np.asarray(v_leak, np.float64), self.in_size))

    def update(self, x) -> jax.Array:
        """One step; returns the new ``v``."""
        self.v.value = self.v_leak + (self.v.value - self.v_leak) * self.decay + self.gain * x
        return self.v.value


class EulerCubaLI(NIRNeuron):
    r"""NIR ``CubaLI``: the current and membrane of :class:`EulerCubaLIF` without spikes; returns
    ``v``.

    Attributes:
      i (brainstate.HiddenState): Synaptic current, starts at 0.
    """

    def __init__(self, tau_syn, tau_mem, r, v_leak, w_in, dt: float, name: Optional[str] = None):
        tau_syn, tau_mem = np.asarray(tau_syn, np.float64), np.asarray(tau_mem, np.float64)
        super().__init__(tau_mem.shape, v_leak, name=name)
        q_syn, q_mem = dt / tau_syn, dt / tau_mem
        self.syn_decay = _constant(1.0 - q_syn)
        self.syn_gain = _constant(np.asarray(w_in, np.float64) * q_syn)
        self.decay, self.gain = _constant(1.0 - q_mem), _constant(np.asarray(r, np.float64) * q_mem)
        self.v_leak = _constant(np.broadcast_to(np.asarray(v_leak, np.float64), self.in_size))

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``v`` (``v_leak``) and ``i`` (zeros)."""
        super().init_state(batch_size)
        self.i = brainstate.HiddenState(self._fresh(batch_size, 0.0))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``v`` back to ``v_leak`` and ``i`` to zero."""
        super().reset_state(batch_size)
        self.i.value = self._fresh(batch_size, 0.0)

    def update(self, x) -> jax.Array:
        """One step; returns the new ``v``."""
        self.i.value = self.i.value * self.syn_decay + self.syn_gain * x
        self.v.value = (self.v_leak + (self.v.value - self.v_leak) * self.decay
                        + self.gain * self.i.value)
        return self.v.value


class EulerI(NIRNeuron):
    r"""NIR ``I``: :math:`\dot v = r I`; returns ``v``. Step: :math:`v_t = v + g x_t`, ``g``
    as in :class:`EulerIF`. ``v`` starts at 0."""

    def __init__(self, r, dt: float, integrator: str = 'charge', name: Optional[str] = None):
        r = np.asarray(r, np.float64)
        super().__init__(r.shape, 0.0, name=name)
        if integrator not in INTEGRATORS:
            raise ValueError(f'integrator must be one of {INTEGRATORS}, got {integrator!r}.')
        self.gain = _constant(r if integrator == 'charge' else r * dt)

    def update(self, x) -> jax.Array:
        """One step; returns the new ``v``."""
        self.v.value = self.v.value + self.gain * x
        return self.v.value


# --------------------------------------------------------------------------- stateless nodes
class Threshold(brainstate.nn.Module):
    r"""NIR ``Threshold``: :math:`[x > \theta]`, surrogate width ``|theta|`` (1 where 0)."""

    def __init__(self, threshold, spike_fn: Callable = Sigmoid(4.0), name: Optional[str] = None):
        super().__init__(name=name)
        threshold = np.asarray(threshold, np.float64)
        self.threshold = _constant(threshold)
        self.width = _constant(np.where(threshold != 0, np.abs(threshold), 1.0))
        self.spike_fn = spike_fn

    def update(self, x) -> jax.Array:
        return strict_spike((x - self.threshold) / self.width, self.spike_fn)


class Scale(brainstate.nn.Module):
    r"""NIR ``Scale``: :math:`x \odot s` (a fixed factor of the node's shape)."""

    def __init__(self, scale, name: Optional[str] = None):
        super().__init__(name=name)
        self.scale = _constant(scale)

    def update(self, x) -> jax.Array:
        return x * self.scale


class FlattenDims(brainstate.nn.Module):
    """NIR ``Flatten``: merge axes ``start_dim..end_dim`` of a sample (the batch axis excluded).

    Args:
      start_dim, end_dim (int): Axes of one sample (negative: counted from the end).
    """

    def __init__(self, start_dim: int, end_dim: int, name: Optional[str] = None):
        super().__init__(name=name)
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def output_shape(self, shape: tuple) -> tuple:
        """The flattened shape of a sample of ``shape``."""
        n = len(shape)
        start, end = self.start_dim % n if n else 0, self.end_dim % n if n else 0
        if not (-n <= self.start_dim < n and -n <= self.end_dim < n) or start > end:
            raise ValueError(f'Flatten start_dim={self.start_dim}, end_dim={self.end_dim} do '
                             f'not fit a sample of shape {shape}.')
        return shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]

    def update(self, x) -> jax.Array:
        return jnp.reshape(x, x.shape[:1] + self.output_shape(tuple(x.shape[1:])))


class SumPool2d(brainstate.nn.Module):
    """NIR ``SumPool2d`` on channels-first ``(batch, C, H, W)``: window sums, zero padding.

    Args:
      kernel_size, stride (tuple of 2 ints), padding (tuple of 2 ints, each side).
    """

    def __init__(self, kernel_size, stride, padding, name: Optional[str] = None):
        super().__init__(name=name)
        self.kernel_size = tuple(int(k) for k in kernel_size)
        self.stride = tuple(int(s) for s in stride)
        self.padding = tuple(int(p) for p in padding)

    def update(self, x) -> jax.Array:
        pads = ((0, 0), (0, 0)) + tuple((p, p) for p in self.padding)
        return lax.reduce_window(x, np.zeros((), x.dtype), lax.add, (1, 1) + self.kernel_size,
                                 (1, 1) + self.stride, pads)


class Delay(brainstate.nn.Module):
    r"""NIR ``Delay``: :math:`y_t = x_{t-k}` with ``k = delay / dt`` steps per element
    (zero before the first ``k`` steps).

    A line of ``max(k)`` states, each taking the previous one's value every step; the output
    picks, per element, the input (``k = 0``) or slot ``k - 1`` with fixed 0/1 masks, so the
    step is element by element and exact.

    Attributes:
      line (list of brainstate.HiddenState): ``line[j]`` holds the input of ``j + 1`` steps
        ago, shape ``(batch, *shape)``.
    """

    def __init__(self, steps, name: Optional[str] = None):
        super().__init__(name=name)
        steps = np.asarray(steps, np.int64)
        self.in_size = self.out_size = steps.shape
        self.steps = steps
        self.masks = [_constant(steps == k) for k in range(int(steps.max(initial=0)) + 1)]

    def _fresh(self, batch_size):
        return jnp.zeros(_batched(self.in_size, batch_size), brainstate.environ.dftype())

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create the line (zeros)."""
        self.line = [brainstate.HiddenState(self._fresh(batch_size)) for _ in self.masks[1:]]

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set the line back to zeros."""
        for slot in self.line:
            slot.value = self._fresh(batch_size)

    def update(self, x) -> jax.Array:
        """One step; returns the input of ``k`` steps ago per element."""
        x = x * jnp.ones(self.in_size, brainstate.environ.dftype())
        out = x * self.masks[0]
        for slot, mask in zip(self.line, self.masks[1:]):
            out = out + slot.value * mask
        for j in range(len(self.line) - 1, 0, -1):
            self.line[j].value = self.line[j - 1].value
        if self.line:
            self.line[0].value = x
        return out
