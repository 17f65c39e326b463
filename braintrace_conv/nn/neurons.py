r"""Spiking (LIF, ALIF, CubaLIF, IF) and leaky-integrator (LI) neurons for online learning.

State convention
----------------
The hidden state ``V`` stores the membrane potential **before** reset. One call
of ``update(x)`` (one step of length ``dt``):

1. computes the spike of the stored state, :math:`s_{t-1} = f((V_{t-1} -
   \theta) / (V_{th} - V_{reset}))`, and applies the reset it causes;
2. decays towards ``V_rest`` and adds the input:
   :math:`V_t = V_{rest} + (\tilde V_{t-1} - V_{rest})\, e^{-dt/\tau} + x_t`;
3. stores :math:`V_t` and returns :math:`s_t = f((V_t - \theta) / (V_{th} -
   V_{reset}))`.

So the output of a step is a function of the new hidden state alone, and
every operation on the path input -> state -> spike is elementwise.

Units
-----
The voltage unit of a neuron is the unit of ``V_th`` (``V_rest`` for
:class:`LI`); ``V_reset``, ``V_rest`` and ``beta`` must have the same
dimension (a plain ``0`` is accepted as zero of any unit). The input ``x`` is
the **voltage increment delivered during the step** (a current pulse
integrated over the step, ``R * I * dt / tau``), in the voltage unit; the
integration above is exact for such pulse inputs. With unitless constants
everything is unitless. Mismatches raise :class:`saiunit.DimensionMismatchError`
and are never converted.

Trainable constants
-------------------
``trainable=('tau', 'V_th')`` (any of the names in the class's
:attr:`~Neuron.TRAINABLE`) makes those constants :class:`brainstate.ParamState`
(the parametric LIF, "PLIF", of the spiking-network literature, with the time
constant itself as the parameter). A scalar gives one value shared by the
layer; an array broadcastable to ``in_size`` (e.g. ``(C, 1, 1)`` channels
first) one value per entry. The parameter keeps its unit and dtype (the default
float dtype). Each enters the step elementwise, so the online executors give it
an exact trace of its own. Nothing constrains it during training: keep the
learning rate such that time constants stay positive and ``V_th`` above
``V_reset``.

Time step
---------
``dt`` is read at every ``update`` from ``brainstate.environ`` (``set(dt=...)``
or ``context(dt=...)``). It must have the same kind as the time constants: a
time quantity (e.g. ``1 * u.ms``) when ``tau`` is a quantity, a plain number
(milliseconds by convention) when ``tau`` is a plain number. When ``dt`` is
unset, :data:`DEFAULT_DT` (1 ms, in the matching kind) is used.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import saiunit as u

from .._validation import ArgumentError, WrongTypeError, integer, one_of, optional
from .surrogate import Sigmoid

__all__ = ['DEFAULT_DT', 'Neuron', 'LIF', 'ALIF', 'CubaLIF', 'IF', 'LI']

#: Step length (in ms) used when ``brainstate.environ`` has no ``dt``.
DEFAULT_DT = 1.0

_RESET_MODES = ('subtract', 'zero')


# --------------------------------------------------------------------------- checks
def _format_size(in_size, name: str = 'in_size') -> tuple:
    sizes = (in_size,) if isinstance(in_size, (int, np.integer)) else tuple(in_size)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0
                        for s in sizes):
        raise ArgumentError(name, in_size, 'be a positive int or a non-empty tuple of positive '
                                           'ints')
    return tuple(int(s) for s in sizes)


def _time_constant(name: str, tau):
    """Check that ``tau`` is positive and either plain or a time quantity."""
    if isinstance(tau, u.Quantity):
        u.fail_for_dimension_mismatch(
            tau, u.ms, f'{name} must be a time (e.g. 10 * u.ms) or a plain number in ms')
    mantissa = np.asarray(u.get_mantissa(tau))
    if not np.issubdtype(mantissa.dtype, np.number) or not np.all(mantissa > 0):
        raise ArgumentError(name, tau, 'be positive', shown=repr(tau))
    return tau


def _voltage(name: str, value, ref, ref_name: str):
    """Return ``value`` expressed with the dimension of ``ref`` (a plain 0 takes ref's unit)."""
    if u.get_dim(value) == u.get_dim(ref):
        return value
    if u.get_dim(value).is_dimensionless and np.all(np.asarray(u.get_mantissa(value)) == 0):
        return u.maybe_decimal(u.math.asarray(value) * u.get_unit(ref))
    raise u.DimensionMismatchError(
        f'{name} must have the unit of {ref_name} ({u.get_unit(ref)}), got {value!r}.')


def _value(constant):
    """The value of a neuron constant: a trainable one is a ``brainstate.ParamState``."""
    return constant.value if isinstance(constant, brainstate.State) else constant


def _decay(tau) -> jax.Array:
    """``exp(-dt / tau)`` with ``dt`` from ``brainstate.environ``, unit-checked."""
    tau = _value(tau)
    dt = brainstate.environ.get('dt', default=None)
    if dt is None:
        dt = DEFAULT_DT * u.ms if isinstance(tau, u.Quantity) else DEFAULT_DT
    u.fail_for_dimension_mismatch(
        dt, tau,
        'dt (brainstate.environ) and the time constants must both be time quantities '
        '(e.g. dt=1 * u.ms, tau=10 * u.ms) or both plain numbers in ms')
    return jnp.exp(-jnp.asarray(u.maybe_decimal(dt / tau)))


# --------------------------------------------------------------------------- base
class Neuron(brainstate.nn.Module):
    r"""Base class of the neurons: size handling, hidden-state creation, input checks.

    Args:
      in_size (int or tuple of int):
        Shape of one sample of the population, e.g. ``N`` or ``(H, W, C)``.
        Hidden states have shape ``(batch_size, *in_size)``, or ``in_size``
        when created without a batch size.
      name (str, optional): Module name.

    Attributes:
      TRAINABLE (tuple of str): Names of the constants that ``trainable=`` may turn into parameters.
    """

    TRAINABLE: tuple = ()

    def __init__(self, in_size: Union[int, Sequence[int]], name: Optional[str] = None):
        super().__init__(name=name)
        self.in_size = _format_size(in_size)
        self.out_size = self.in_size

    def _make_trainable(self, trainable) -> None:
        """Replace the constants named in ``trainable`` by ``brainstate.ParamState``."""
        names = (trainable,) if isinstance(trainable, str) else tuple(trainable)
        unknown = [n for n in names if n not in self.TRAINABLE]
        if unknown:
            raise ArgumentError(f'trainable of {type(self).__name__}', unknown,
                                f'name constants among {self.TRAINABLE}')
        for n in names:
            value = getattr(self, n)
            mantissa = jnp.asarray(u.get_mantissa(value), brainstate.environ.dftype())
            setattr(self, n, brainstate.ParamState(
                u.maybe_decimal(u.Quantity(mantissa, unit=u.get_unit(value)))))

    def _state_shape(self, batch_size: Optional[int]) -> tuple:
        if batch_size is None:
            return self.in_size
        batch_size = optional(integer, 'batch_size', batch_size, sign='positive',
                              means='no batch axis')
        return (batch_size,) + self.in_size

    @staticmethod
    def _filled(shape: tuple, value):
        """Array of ``shape`` filled with ``value`` (keeps its unit), default float dtype."""
        mantissa = jnp.broadcast_to(jnp.asarray(u.get_mantissa(value), brainstate.environ.dftype()),
                                    shape)
        return u.maybe_decimal(u.Quantity(mantissa, unit=u.get_unit(value)))

    def _check_input(self, x, ref):
        """Check that input ``x`` has the voltage dimension of ``ref`` and fits the state."""
        u.fail_for_dimension_mismatch(
            x, ref,
            f'the input x of {type(self).__name__} is a voltage increment and must have the '
            f'unit of V ({u.get_unit(ref)})')
        shape = jnp.shape(ref)
        try:
            fits = np.broadcast_shapes(jnp.shape(x), shape) == shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f'the input x of {type(self).__name__} has shape {jnp.shape(x)}, '
                             f'which does not broadcast to the state shape {shape}.')


# --------------------------------------------------------------------------- LIF
class LIF(Neuron):
    r"""Leaky integrate-and-fire neuron (one hidden state ``V``, stored before reset).

    One ``update(x)`` step (see the module docstring for the convention):

    .. math::

        s_{t-1} &= f\big((V_{t-1} - V_{th}) / (V_{th} - V_{reset})\big) \\
        \tilde V &= V_{t-1} - (V_{th} - V_{reset})\, s_{t-1}
            \quad\text{('subtract')}\qquad
            \tilde V = V_{t-1} + (V_{reset} - V_{t-1})\, s_{t-1}
            \quad\text{('zero')} \\
        V_t &= V_{rest} + (\tilde V - V_{rest})\, e^{-dt/\tau} + x_t \\
        s_t &= f\big((V_t - V_{th}) / (V_{th} - V_{reset})\big)

    Args:
      in_size (int or tuple of int): Shape of one sample, e.g. ``N`` or ``(H, W, C)``.
      tau (float or Quantity, default 10.0):
        Membrane time constant; a plain number is in ms, else a time quantity.
        May be an array broadcastable to ``in_size``.
      V_th (float or Quantity, default 1.0):
        Firing threshold; its unit is the neuron's voltage unit.
      V_reset (float or Quantity, default 0.0):
        Potential after a spike with ``reset='zero'``; with ``'subtract'``, a
        spike lowers ``V`` by ``V_th - V_reset``. Must be below ``V_th``.
      V_rest (float or Quantity, default 0.0):
        Resting potential: the leak target and the initial value of ``V``.
      spike_fn (callable, default ``Sigmoid(4.0)``):
        Elementwise spike function with surrogate gradient applied to the
        dimensionless ``(V - threshold) / (V_th - V_reset)``; see
        :mod:`braintrace_conv.nn.surrogate`.
      reset ({'subtract', 'zero'}, default 'subtract'):
        Reset by subtraction (soft) or to ``V_reset`` (hard).
      detach_reset (bool, default False):
        If true, no gradient flows through the spike that drives the reset.
      trainable (str or sequence of str, default ()):
        Constants among ``('tau', 'V_th')`` to learn (module docstring,
        "Trainable constants"); e.g. ``trainable='tau'`` is a PLIF neuron.
      name (str, optional): Module name.

    Attributes:
      V (brainstate.HiddenState): Membrane potential before reset, shape ``(batch, *in_size)`` or
        ``in_size``, in the voltage unit. Created by :meth:`init_state`.
      tau, V_th (Quantity, array or brainstate.ParamState):
        The constants; a ``ParamState`` when named in ``trainable``.

    Raises:
      ValueError: Unknown ``reset``, non-positive ``tau``, ``V_th <= V_reset``, bad ``in_size``.
      saiunit.DimensionMismatchError: ``tau`` not a time, or voltages with different dimensions.

    Examples:
      >>> import brainstate, jax.numpy as jnp, saiunit as u
      >>> from braintrace_conv.nn import LIF
      >>> lif = LIF(4, tau=10 * u.ms, V_th=1 * u.mV)
      >>> lif.init_state(batch_size=2)
      >>> with brainstate.environ.context(dt=1 * u.ms):
      ...     s = lif(jnp.full((2, 4), 1.5) * u.mV)   # spikes, shape (2, 4), unitless
      >>> s[0].tolist()                                # 1.5 mV > V_th: every neuron fires
      [1.0, 1.0, 1.0, 1.0]
    """

    TRAINABLE = ('tau', 'V_th')

    def __init__(
        self,
        in_size: Union[int, Sequence[int]],
        tau=10.0,
        V_th=1.0,
        V_reset=0.0,
        V_rest=0.0,
        spike_fn: Callable = Sigmoid(4.0),
        reset: str = 'subtract',
        detach_reset: bool = False,
        trainable: Union[str, Sequence[str]] = (),
        name: Optional[str] = None,
    ):
        super().__init__(in_size, name=name)
        self.tau = None if isinstance(self, IF) else _time_constant('tau', tau)   # IF: no leak
        one_of('reset', reset, _RESET_MODES)
        if not callable(spike_fn):
            raise WrongTypeError('spike_fn', spike_fn, 'be callable',
                                 shown=type(spike_fn).__name__)
        self.V_th = V_th
        self.V_reset = _voltage('V_reset', V_reset, V_th, 'V_th')
        self.V_rest = _voltage('V_rest', V_rest, V_th, 'V_th')
        if not np.all(np.asarray(u.get_mantissa(self.V_th - self.V_reset)) > 0):
            raise ArgumentError('V_th', V_th, f'be larger than {{V_reset}} ({V_reset!r})',
                                refs=('V_reset',), shown=repr(V_th))
        self.spike_fn = spike_fn
        self.reset = reset
        self.detach_reset = bool(detach_reset)
        self._make_trainable(trainable)

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``V`` filled with ``V_rest``, shape ``(batch_size, *in_size)`` or ``in_size``."""
        self.V = brainstate.HiddenState(self._filled(self._state_shape(batch_size), self.V_rest))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``V`` back to ``V_rest`` (with a new batch size if given)."""
        self.V.value = self._filled(self._state_shape(batch_size), self.V_rest)

    def threshold(self):
        """Current firing threshold (``V_th`` for LIF), in the voltage unit."""
        return _value(self.V_th)

    def _spike_of(self, V, threshold):
        scale = _value(self.V_th) - self.V_reset
        return self.spike_fn(u.maybe_decimal((V - threshold) / scale))

    def spike(self) -> jax.Array:
        """Spike of the stored state, ``f((V - threshold) / (V_th - V_reset))``.

        Returns:
          jax.Array: Unitless ``0.``/``1.`` array with the shape of ``V``.
        """
        return self._spike_of(self.V.value, self.threshold())

    def _reset(self, V, spike, threshold):
        if self.detach_reset:
            spike = jax.lax.stop_gradient(spike)
        if self.reset == 'subtract':
            return V - (threshold - self.V_reset) * spike
        return V + (self.V_reset - V) * spike

    def _integrate(self, V, x):
        return self.V_rest + (V - self.V_rest) * _decay(self.tau) + x

    def _step(self, x):
        """Spike and reset of the stored state, then the input ``x``; returns the new spike."""
        V = self.V.value
        self._check_input(x, V)
        threshold = self.threshold()
        V = self._reset(V, self._spike_of(V, threshold), threshold)
        self.V.value = self._integrate(V, x)
        return self.spike()

    def update(self, x) -> jax.Array:
        """Advance one step of length ``dt``.

        Args:
          x (array_like or Quantity): Voltage increment of this step, in the unit of ``V``; shape
            broadcastable to the state shape ``(batch, *in_size)``.

        Returns:
          jax.Array: Spikes of the new state, unitless, shape of ``V``.
        """
        return self._step(x)


# --------------------------------------------------------------------------- ALIF
class ALIF(LIF):
    r"""Adaptive LIF neuron: a spike-driven adaptation ``a`` raises the threshold.

    States ``V`` (before reset) and ``a`` (unitless). With threshold
    :math:`\theta = V_{th} + \beta a`, one ``update(x)`` step is

    .. math::

        s_{t-1} &= f\big((V_{t-1} - \theta_{t-1}) / (V_{th} - V_{reset})\big) \\
        a_t &= a_{t-1}\, e^{-dt/\tau_a} + s_{t-1} \\
        V_t &= V_{rest} + (\tilde V - V_{rest})\, e^{-dt/\tau} + x_t \\
        s_t &= f\big((V_t - \theta_t) / (V_{th} - V_{reset})\big)

    where :math:`\tilde V` is the reset of :math:`V_{t-1}` by
    :math:`s_{t-1}`: subtracting :math:`(\theta_{t-1} - V_{reset})\, s_{t-1}`
    ('subtract') or moving to ``V_reset`` ('zero').

    Args:
      in_size, tau, V_th, V_reset, V_rest, spike_fn, reset, name: As in :class:`LIF`.
      trainable (str or sequence of str, default ()):
        Constants among ``('tau', 'tau_a', 'V_th', 'beta')`` to learn.
      detach_reset (bool, default False):
        If true, no gradient flows through the spike that drives the reset and
        the adaptation increment.
      tau_a (float or Quantity, default 100.0):
        Adaptation time constant (same kind as ``tau``: plain ms or time).
      beta (float or Quantity, optional):
        Threshold increase per unit of ``a``, in the voltage unit. Default
        ``0.05 * (V_th - V_reset)``.

    Attributes:
      V (brainstate.HiddenState): Membrane potential before reset, in the voltage unit.
      a (brainstate.HiddenState): Adaptation variable (unitless, +1 per spike), same shape as ``V``.
    """

    TRAINABLE = ('tau', 'tau_a', 'V_th', 'beta')

    def __init__(
        self,
        in_size: Union[int, Sequence[int]],
        tau=10.0,
        tau_a=100.0,
        V_th=1.0,
        V_reset=0.0,
        V_rest=0.0,
        beta=None,
        spike_fn: Callable = Sigmoid(4.0),
        reset: str = 'subtract',
        detach_reset: bool = False,
        trainable: Union[str, Sequence[str]] = (),
        name: Optional[str] = None,
    ):
        super().__init__(in_size, tau=tau, V_th=V_th, V_reset=V_reset, V_rest=V_rest,
                         spike_fn=spike_fn, reset=reset, detach_reset=detach_reset, name=name)
        self.tau_a = _time_constant('tau_a', tau_a)
        u.fail_for_dimension_mismatch(self.tau_a, self.tau, 'tau_a must have the kind of tau')
        if beta is None:
            beta = 0.05 * (self.V_th - self.V_reset)
        self.beta = _voltage('beta', beta, V_th, 'V_th')
        self._make_trainable(trainable)

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``V`` (filled with ``V_rest``) and ``a`` (zeros)."""
        super().init_state(batch_size)
        self.a = brainstate.HiddenState(self._filled(self._state_shape(batch_size), 0.0))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``V`` back to ``V_rest`` and ``a`` to zero."""
        super().reset_state(batch_size)
        self.a.value = self._filled(self._state_shape(batch_size), 0.0)

    def threshold(self):
        """Current threshold ``V_th + beta * a`` (voltage unit, shape of ``a``)."""
        return _value(self.V_th) + _value(self.beta) * self.a.value

    def update(self, x) -> jax.Array:
        """Advance one step of length ``dt``; ``x`` and the return value as in :meth:`LIF.update`."""
        V = self.V.value
        self._check_input(x, V)
        threshold = self.threshold()
        spike = self._spike_of(V, threshold)
        V = self._reset(V, spike, threshold)
        if self.detach_reset:
            spike = jax.lax.stop_gradient(spike)
        self.a.value = self.a.value * _decay(self.tau_a) + spike
        self.V.value = self._integrate(V, x)
        return self.spike()


# --------------------------------------------------------------------------- IF
class IF(LIF):
    r"""Integrate-and-fire neuron without leak (one hidden state ``V``, stored before reset).

    As :class:`LIF` with an infinite time constant:

    .. math::

        V_t = \tilde V + x_t, \qquad s_t = f\big((V_t - V_{th}) / (V_{th} - V_{reset})\big)

    where :math:`\tilde V` is :math:`V_{t-1}` reset by its spike :math:`s_{t-1}`.
    ``V_rest`` is only the initial value of ``V``. No time constant, so ``dt``
    is not read.

    Args:
      in_size, V_th, V_reset, V_rest, spike_fn, reset, detach_reset, name: As in :class:`LIF`.
      trainable (str or sequence of str, default ()): ``'V_th'`` to learn the threshold.

    Attributes:
      V (brainstate.HiddenState): Membrane potential before reset, in the voltage unit.
    """

    TRAINABLE = ('V_th',)

    def __init__(
        self,
        in_size: Union[int, Sequence[int]],
        V_th=1.0,
        V_reset=0.0,
        V_rest=0.0,
        spike_fn: Callable = Sigmoid(4.0),
        reset: str = 'subtract',
        detach_reset: bool = False,
        trainable: Union[str, Sequence[str]] = (),
        name: Optional[str] = None,
    ):
        super().__init__(in_size, tau=None, V_th=V_th, V_reset=V_reset, V_rest=V_rest,
                         spike_fn=spike_fn, reset=reset, detach_reset=detach_reset,
                         trainable=trainable, name=name)

    def _integrate(self, V, x):
        return V + x


# --------------------------------------------------------------------------- CubaLIF
class CubaLIF(LIF):
    r"""Current-based LIF: a leaky synaptic current ``I`` drives a LIF membrane ``V``.

    States ``V`` (before reset) and ``I``, both in the voltage unit: ``I`` is
    the synaptic drive expressed as the voltage increment it delivers in one
    step. One ``update(x)`` step:

    .. math::

        s_{t-1} &= f\big((V_{t-1} - V_{th}) / (V_{th} - V_{reset})\big) \\
        I_t &= I_{t-1}\, e^{-dt/\tau_{syn}} + x_t \\
        V_t &= V_{rest} + (\tilde V - V_{rest})\, e^{-dt/\tau} + I_t \\
        s_t &= f\big((V_t - V_{th}) / (V_{th} - V_{reset})\big)

    with :math:`\tilde V` the reset of :math:`V_{t-1}` by :math:`s_{t-1}` as in
    :class:`LIF`. An input pulse ``x`` at one step thus raises ``V`` over the
    following steps with a difference of two exponentials (the "synaptic"
    neuron of the literature).

    Args:
      in_size, tau, V_th, V_reset, V_rest, spike_fn, reset, detach_reset, name: As in :class:`LIF`.
      tau_syn (float or Quantity, default 5.0):
        Synaptic time constant (same kind as ``tau``: plain ms or a time).
      trainable (str or sequence of str, default ()):
        Constants among ``('tau', 'tau_syn', 'V_th')`` to learn.

    Attributes:
      V (brainstate.HiddenState): Membrane potential before reset, in the voltage unit.
      I (brainstate.HiddenState):
        Synaptic drive, in the voltage unit, same shape as ``V``; starts at 0.
    """

    TRAINABLE = ('tau', 'tau_syn', 'V_th')

    def __init__(
        self,
        in_size: Union[int, Sequence[int]],
        tau=10.0,
        tau_syn=5.0,
        V_th=1.0,
        V_reset=0.0,
        V_rest=0.0,
        spike_fn: Callable = Sigmoid(4.0),
        reset: str = 'subtract',
        detach_reset: bool = False,
        trainable: Union[str, Sequence[str]] = (),
        name: Optional[str] = None,
    ):
        super().__init__(in_size, tau=tau, V_th=V_th, V_reset=V_reset, V_rest=V_rest,
                         spike_fn=spike_fn, reset=reset, detach_reset=detach_reset, name=name)
        self.tau_syn = _time_constant('tau_syn', tau_syn)
        u.fail_for_dimension_mismatch(self.tau_syn, self.tau,
                                      'tau_syn must have the kind of tau')
        self._make_trainable(trainable)

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``V`` (filled with ``V_rest``) and ``I`` (zeros in the voltage unit)."""
        super().init_state(batch_size)
        self.I = brainstate.HiddenState(self._filled(self._state_shape(batch_size),
                                                     self.V_rest * 0))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``V`` back to ``V_rest`` and ``I`` to zero."""
        super().reset_state(batch_size)
        self.I.value = self._filled(self._state_shape(batch_size), self.V_rest * 0)

    def update(self, x) -> jax.Array:
        """Advance one step of length ``dt``; ``x`` (the synaptic input of the step, in the
        unit of ``V``) and the return value as in :meth:`LIF.update`."""
        self._check_input(x, self.V.value)
        self.I.value = self.I.value * _decay(self.tau_syn) + x
        return self._step(self.I.value)


# --------------------------------------------------------------------------- LI
class LI(Neuron):
    r"""Leaky integrator readout (non-spiking), one hidden state ``V``.

    .. math::  V_t = V_{rest} + (V_{t-1} - V_{rest})\, e^{-dt/\tau} + x_t

    and the step returns :math:`V_t`.

    Args:
      in_size (int or tuple of int): Shape of one sample, e.g. the number of classes.
      tau (float or Quantity, default 10.0):
        Time constant; a plain number is in ms, else a time quantity.
      V_rest (float or Quantity, default 0.0):
        Resting and initial value; its unit is the unit of ``V`` and of the input.
      trainable (str or sequence of str, default ()):
        ``'tau'`` to learn the time constant (see the module docstring).
      name (str, optional): Module name.

    Attributes:
      V (brainstate.HiddenState):
        Shape ``(batch, *in_size)`` or ``in_size``, in the unit of ``V_rest``.
    """

    TRAINABLE = ('tau',)

    def __init__(self, in_size: Union[int, Sequence[int]], tau=10.0, V_rest=0.0,
                 trainable: Union[str, Sequence[str]] = (), name: Optional[str] = None):
        super().__init__(in_size, name=name)
        self.tau = _time_constant('tau', tau)
        self.V_rest = V_rest
        self._make_trainable(trainable)

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create ``V`` filled with ``V_rest``."""
        self.V = brainstate.HiddenState(self._filled(self._state_shape(batch_size), self.V_rest))

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set ``V`` back to ``V_rest``."""
        self.V.value = self._filled(self._state_shape(batch_size), self.V_rest)

    def update(self, x):
        """Advance one step; ``x`` is the increment in the unit of ``V``. Returns the new ``V``."""
        V = self.V.value
        self._check_input(x, V)
        self.V.value = self.V_rest + (V - self.V_rest) * _decay(self.tau) + x
        return self.V.value
