"""Splitting and re-joining ``saiunit`` quantities around unit-free primitives.

Primitives compute on plain arrays (mantissas); the public wrappers strip the
units of their operands, bind the primitive and attach the product unit to
the result. Plain arrays stay plain arrays.
"""
from __future__ import annotations

import jax.numpy as jnp
import saiunit as u

__all__ = ['split_unit', 'join_unit', 'bias_in_unit']


def split_unit(value, name: str):
    """``(mantissa, unit)`` of ``value``; a plain array has the unitless unit."""
    try:
        return u.split_mantissa_unit(value)
    except Exception as err:  # saiunit raises several types for non-numeric input
        raise TypeError(f'{name} must be an array or a saiunit quantity, '
                        f'got {type(value).__name__}.') from err


def join_unit(mantissa, unit):
    """Attach ``unit`` to ``mantissa``; unitless results stay plain arrays."""
    return u.maybe_decimal(u.Quantity(mantissa, unit=unit))


def bias_in_unit(bias, unit, shape, dtype):
    """The mantissa of ``bias`` expressed in ``unit``, checked to have ``shape``.

    Raises:
      ValueError: if the bias has the wrong shape or a unit whose dimension is
        not that of ``unit`` (the unit of ``x * kernel``).
    """
    b_val, b_unit = split_unit(bias, 'bias')
    if tuple(jnp.shape(b_val)) != tuple(shape):
        raise ValueError(f'bias must have shape {tuple(shape)} (one value per output channel), '
                         f'got {tuple(jnp.shape(b_val))}.')
    if not b_unit.has_same_dim(unit):
        raise ValueError(f'bias has unit {b_unit} but the output has unit {unit} '
                         f'(unit(x) * unit(kernel)); give the bias a unit of that dimension.')
    scale = (1.0 * b_unit).to_decimal(unit)
    return jnp.asarray(b_val * scale if scale != 1.0 else b_val, dtype)
