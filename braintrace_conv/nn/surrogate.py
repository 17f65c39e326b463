r"""Spike functions with surrogate gradients.

A spike function maps a *dimensionless* distance to threshold ``x`` (for a
neuron, ``(V - V_th) / (V_th - V_reset)``) to a spike:

.. math::  s = H(x) = \begin{cases} 1 & x \ge 0 \\ 0 & x < 0 \end{cases}

The step has zero derivative almost everywhere, so learning replaces
:math:`H'(x)` by a smooth *surrogate* :math:`\sigma'(x)` in the backward and
forward-mode passes. Each surrogate here is implemented with
:func:`jax.custom_jvp` and is purely elementwise (the Jacobian of the spike with
respect to its input is diagonal), which online eligibility-trace learners
rely on.

Any other elementwise spike function is accepted wherever these are, braintools'
surrogates included (``braintools.surrogate.Sigmoid()`` etc.). This module stays
because the core install does not depend on braintools, because it refuses a
dimensioned input, and because its derivatives keep their digits in float32: the
sigmoid's is computed as ``alpha e / (1 + e)^2`` with ``e = exp(-alpha |x|)``, where
the ``s (1 - s)`` form rounds to zero above threshold. Measured with
``benchmarks/surrogates.py`` (slope 4, float32): relative error 4e-8 at x = 5 and 20
here, 1.0 (a zero derivative) with braintools' sigmoid. Speed is no reason either way:
on the standard workload at T = 100 this one took 0.99-1.12x the time of braintools'
under BPTT, ES-D-RTRL and D-RTRL (one interleaved run of 5 rounds), with gradients
equal to a cosine of 0.99994 or more.

Usage::

    spike_fn = surrogate.sigmoid(alpha=4.0)      # or surrogate.Sigmoid(4.0)
    s = spike_fn(x)                              # 0./1. values, dtype of x
    jax.grad(lambda x: spike_fn(x).sum())(x)     # == Sigmoid.derivative(x)
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import saiunit as u

__all__ = [
    'heaviside',
    'Surrogate',
    'Sigmoid',
    'Arctan',
    'FastSigmoid',
    'sigmoid',
    'arctan',
    'fast_sigmoid',
]


def _as_float_array(x, name: str = 'x') -> jax.Array:
    """Return ``x`` as a floating-point array; reject quantities with a dimension."""
    if isinstance(x, u.Quantity):
        if not u.get_dim(x).is_dimensionless:
            raise u.DimensionMismatchError(
                f'{name} of a spike function must be dimensionless (e.g. (V - V_th) / '
                f'(V_th - V_reset)), but it has unit {u.get_unit(x)}.')
        x = x.to_decimal()
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def heaviside(x) -> jax.Array:
    r"""Heaviside step :math:`H(x) = 1` for :math:`x \ge 0`, else ``0``.

    This is the forward pass of every surrogate spike function. It has no
    surrogate gradient of its own (its derivative is zero almost everywhere).

    Args:
      x (array_like): Dimensionless input of any shape (a dimensionless ``saiunit`` quantity
        is accepted). Integer inputs are promoted to the default float dtype.

    Returns:
      jax.Array: ``0.`` / ``1.`` values, same shape and (floating) dtype as ``x``.

    Raises:
      saiunit.DimensionMismatchError: If ``x`` carries a physical unit.
    """
    x = _as_float_array(x)
    return jnp.where(x >= 0, 1.0, 0.0).astype(x.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _spike(x, surrogate):
    return heaviside(x)


@_spike.defjvp
def _spike_jvp(surrogate, primals, tangents):
    (x,), (dx,) = primals, tangents
    return _spike(x, surrogate), surrogate.derivative(x) * dx


class Surrogate:
    r"""Base class of surrogate-gradient spike functions.

    Calling an instance returns :func:`heaviside` of the input in the forward
    pass, while forward- and reverse-mode differentiation use the elementwise
    :meth:`derivative`. Subclasses implement :meth:`derivative` only.

    Args:
      alpha (float): Positive slope (sharpness) of the surrogate. It is a fixed
        hyper-parameter: it is not differentiated.

    Raises:
      ValueError: If ``alpha`` is not a finite positive number.

    Notes:
      Instances compare equal (and hash equal) when they have the same type and
      ``alpha``, so re-creating a surrogate does not trigger a new compilation.
    """

    def __init__(self, alpha: float):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) \
                or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(
                f'alpha of {type(self).__name__} must be a finite positive number, '
                f'got {alpha!r}.')
        self.alpha = float(alpha)

    def derivative(self, x: jax.Array) -> jax.Array:
        """Surrogate derivative :math:`\\sigma'(x)`, elementwise, same shape as ``x``."""
        raise NotImplementedError

    def __call__(self, x) -> jax.Array:
        """Spike ``H(x)`` of a dimensionless array ``x`` (any shape) with surrogate gradient.

        Returns ``0.``/``1.`` values with the shape and floating dtype of ``x``.
        """
        return _spike(_as_float_array(x), self)

    def __eq__(self, other):
        return type(other) is type(self) and other.alpha == self.alpha

    def __hash__(self):
        return hash((type(self), self.alpha))

    def __repr__(self):
        return f'{type(self).__name__}(alpha={self.alpha})'


class Sigmoid(Surrogate):
    r"""Spike with the derivative of a scaled logistic sigmoid as surrogate.

    .. math::  \sigma'(x) = \alpha\, S(\alpha x)\,(1 - S(\alpha x)),
               \qquad S(z) = 1 / (1 + e^{-z})

    The peak value is :math:`\alpha / 4` at :math:`x = 0`.

    Args:
      alpha (float, default 4.0): Slope of the sigmoid.
    """

    def __init__(self, alpha: float = 4.0):
        super().__init__(alpha)

    def derivative(self, x):
        # S(z) (1 - S(z)) == e / (1 + e)^2 with e = exp(-|z|): no cancellation for |z| >> 0,
        # and one exponential instead of two (it sits in every step's backward pass)
        e = jnp.exp(-jnp.abs(self.alpha * x))
        return self.alpha * e / (1.0 + e) ** 2


class Arctan(Surrogate):
    r"""Spike with the derivative of a scaled arctangent as surrogate.

    .. math::  \sigma'(x) = \frac{\alpha / 2}{1 + (\tfrac{\pi}{2} \alpha x)^2}

    The peak value is :math:`\alpha / 2` at :math:`x = 0`.

    Args:
      alpha (float, default 2.0): Slope of the arctangent.
    """

    def __init__(self, alpha: float = 2.0):
        super().__init__(alpha)

    def derivative(self, x):
        return (self.alpha / 2.0) / (1.0 + (math.pi / 2.0 * self.alpha * x) ** 2)


class FastSigmoid(Surrogate):
    r"""Spike with the fast-sigmoid ("SuperSpike") surrogate.

    .. math::  \sigma'(x) = \frac{1}{(1 + \alpha |x|)^2}

    The peak value is ``1`` at :math:`x = 0`; ``alpha`` sets how fast it decays.

    Args:
      alpha (float, default 10.0): Decay rate of the surrogate away from threshold.
    """

    def __init__(self, alpha: float = 10.0):
        super().__init__(alpha)

    def derivative(self, x):
        return 1.0 / (1.0 + self.alpha * jnp.abs(x)) ** 2


def sigmoid(alpha: float = 4.0) -> Sigmoid:
    """Sigmoid surrogate spike function; shorthand for :class:`Sigmoid` ``(alpha)``."""
    return Sigmoid(alpha)


def arctan(alpha: float = 2.0) -> Arctan:
    """Arctangent surrogate spike function; shorthand for :class:`Arctan` ``(alpha)``."""
    return Arctan(alpha)


def fast_sigmoid(alpha: float = 10.0) -> FastSigmoid:
    """Fast-sigmoid surrogate spike function; shorthand for :class:`FastSigmoid` ``(alpha)``."""
    return FastSigmoid(alpha)
