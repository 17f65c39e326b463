"""Validation and normalisation of the ``conv_general_dilated`` keyword surface.

One rank-generic place turns user arguments into the hashable parameters the
conv primitive is bound with, and rejects bad input before any compute, with a
message naming the argument and what was expected. The layers of
:mod:`braintrace_conv.nn` normalise their padding here too, and every extent of
a dilated window is :func:`dilated_extent`.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np
from jax import lax

from ._validation import positive, positive_ints

__all__ = ['conv_params', 'normalise_padding', 'dilated_extent']

_PADDING_STRINGS = ('SAME', 'SAME_LOWER', 'VALID')


def dilated_extent(size: int, dilation: int) -> int:
    """``(size - 1) * dilation + 1``: the span of ``size`` points ``dilation`` apart (a
    dilated kernel, an input with ``lhs_dilation``, the strided output positions)."""
    return (size - 1) * dilation + 1


def normalise_padding(padding, n_spatial: int, *, shorthand: bool = False,
                      crop: bool = True):
    """A padding string or ``n_spatial`` ``(low, high)`` int pairs, checked.

    Args:
      padding: ``'SAME'``, ``'SAME_LOWER'`` or ``'VALID'`` (any case), or
        ``n_spatial`` ``(low, high)`` pairs; with ``shorthand`` also an int or
        ``n_spatial`` ints, each padding both sides of a dimension.
      n_spatial: the number of spatial dimensions.
      shorthand: accept the int forms (the layers' surface).
      crop: accept negative pairs, which crop (``lax``'s surface).

    Returns:
      The upper-case string, or a tuple of ``n_spatial`` int pairs.

    Raises:
      ValueError: an unknown string, a wrong number of pairs, or a negative pair
        without ``crop``.
      TypeError: anything else.
    """
    forms = (f'an int, {n_spatial} ints or {n_spatial} (low, high) int pairs' if shorthand
             else f'a sequence of {n_spatial} (low, high) int pairs')
    if isinstance(padding, str):
        if padding.upper() not in _PADDING_STRINGS:
            raise ValueError(f'padding must be one of {_PADDING_STRINGS} or {forms}, '
                             f'got {padding!r}.')
        return padding.upper()
    if shorthand and isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        padding = (padding,) * n_spatial
    try:
        pairs = tuple((operator.index(p),) * 2 if shorthand and not isinstance(p, (tuple, list))
                      else _pair(p) for p in padding)
    except (TypeError, ValueError):
        raise TypeError(f'padding must be a string or {forms}, got {padding!r}.') from None
    if len(pairs) != n_spatial:
        raise ValueError(f'padding must have {n_spatial} (low, high) pairs, got {len(pairs)}.')
    if not crop and any(min(p) < 0 for p in pairs):
        raise ValueError(f'padding must give {n_spatial} non-negative (low, high) pairs, '
                         f'got {padding!r}.')
    return pairs


def _pair(p):
    lo, hi = p
    return operator.index(lo), operator.index(hi)


def _check_spec(name: str, spec: str, required: str, rank: int) -> None:
    if not isinstance(spec, str):
        raise TypeError(f'dimension_numbers {name} spec must be a string, got {spec!r}.')
    if len(spec) != rank or len(set(spec)) != rank or not set(required) <= set(spec):
        raise ValueError(
            f'dimension_numbers {name} spec {spec!r} must be a permutation of {rank} distinct '
            f'characters containing {", ".join(required)} and {rank - 2} spatial characters '
            f'(e.g. {required[0] + "HW"[:rank - 2] + required[1] if rank <= 4 else "..."}).')


def _dimension_numbers(dimension_numbers, rank: int) -> lax.ConvDimensionNumbers:
    if dimension_numbers is None:
        iota = tuple(range(rank))
        return lax.ConvDimensionNumbers(iota, iota, iota)
    if isinstance(dimension_numbers, lax.ConvDimensionNumbers):
        for name, spec in zip(('lhs', 'rhs', 'out'), dimension_numbers):
            if sorted(spec) != list(range(rank)):
                raise ValueError(f'dimension_numbers.{name}_spec must be a permutation of '
                                 f'range({rank}), got {spec!r}.')
        return lax.ConvDimensionNumbers(*(tuple(int(i) for i in s) for s in dimension_numbers))
    if not (isinstance(dimension_numbers, (tuple, list)) and len(dimension_numbers) == 3):
        raise TypeError('dimension_numbers must be None, a ConvDimensionNumbers or a triple of '
                        f"spec strings such as ('NHWC', 'HWIO', 'NHWC'); got {dimension_numbers!r}.")
    lhs, rhs, out = dimension_numbers
    _check_spec('lhs', lhs, 'NC', rank)
    _check_spec('rhs', rhs, 'OI', rank)
    _check_spec('out', out, 'NC', rank)
    spatial = set(lhs) - set('NC')
    if set(out) - set('NC') != spatial or set(rhs) - set('OI') != spatial:
        raise ValueError(f'dimension_numbers {dimension_numbers!r}: lhs, rhs and out specs must '
                         f'name the same spatial characters.')
    return lax.conv_dimension_numbers((1,) * rank, (1,) * rank, (lhs, rhs, out))


def conv_params(x_shape: Sequence[int], kernel_shape: Sequence[int], *, strides, padding,
                lhs_dilation, rhs_dilation, feature_group_count, batch_group_count,
                dimension_numbers, precision, preferred_element_type) -> dict[str, Any]:
    """Validate conv arguments and return the primitive's hashable params.

    Args:
      x_shape: input shape, rank ``n_spatial + 2`` (batch, channel, spatial in
        the order given by ``dimension_numbers``).
      kernel_shape: kernel shape, same rank.
      Others: as in :func:`jax.lax.conv_general_dilated`.

    Returns:
      ``dict(strides, padding, lhs_dilation, rhs_dilation, feature_group_count,
      batch_group_count, dimension_numbers, precision, preferred_element_type)``
      with tuples, an explicit ``ConvDimensionNumbers`` and validated groups.
    """
    rank = len(x_shape)
    if rank < 3:
        raise ValueError(f'x must have rank >= 3 (batch, channel and at least one spatial '
                         f'dimension), got shape {tuple(x_shape)}.')
    if len(kernel_shape) != rank:
        raise ValueError(f'kernel must have the same rank as x ({rank}), got kernel shape '
                         f'{tuple(kernel_shape)} for x shape {tuple(x_shape)}.')
    n_spatial = rank - 2
    dn = _dimension_numbers(dimension_numbers, rank)
    fgc = positive('feature_group_count', feature_group_count)
    bgc = positive('batch_group_count', batch_group_count)
    if fgc > 1 and bgc > 1:
        raise ValueError(f'feature_group_count ({fgc}) and batch_group_count ({bgc}) cannot '
                         f'both be > 1.')
    batch, in_ch = x_shape[dn.lhs_spec[0]], x_shape[dn.lhs_spec[1]]
    out_ch, k_in = kernel_shape[dn.rhs_spec[0]], kernel_shape[dn.rhs_spec[1]]
    if in_ch % fgc:
        raise ValueError(f'feature_group_count ({fgc}) must divide the input channels ({in_ch}).')
    if in_ch != k_in * fgc:
        raise ValueError(f'kernel input-channel size must be in_channels / feature_group_count '
                         f'= {in_ch} / {fgc} = {in_ch // fgc}, got {k_in} (kernel shape '
                         f'{tuple(kernel_shape)}).')
    for name, count in (('feature_group_count', fgc), ('batch_group_count', bgc)):
        if out_ch % count:
            raise ValueError(f'{name} ({count}) must divide the kernel output channels '
                             f'({out_ch}).')
    if batch % bgc:
        raise ValueError(f'batch_group_count ({bgc}) must divide the batch size ({batch}).')
    if isinstance(precision, str):
        precision = lax.Precision(precision)
    elif isinstance(precision, list):
        precision = tuple(precision)
    lhs_dilation = positive_ints('lhs_dilation', lhs_dilation, n_spatial, 1)
    padding = normalise_padding(padding, n_spatial)
    if isinstance(padding, str) and any(d > 1 for d in lhs_dilation):
        raise ValueError(f'padding {padding!r} is not defined together with lhs_dilation '
                         f'{lhs_dilation}; give explicit (low, high) pairs instead.')
    return dict(
        strides=positive_ints('strides', strides, n_spatial, None),
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=positive_ints('rhs_dilation', rhs_dilation, n_spatial, 1),
        feature_group_count=fgc,
        batch_group_count=bgc,
        dimension_numbers=dn,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
