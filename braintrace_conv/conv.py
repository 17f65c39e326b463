r"""The convolution ETP primitive ``etp_conv_p`` and the ``conv`` wrapper.

Forward (the full :func:`jax.lax.conv_general_dilated` surface, any rank):

.. math::  y_{b,s,k} = \sum_{u,c} x_{b(k),\,\sigma(s,u),\,c}\; K_{u,c,k} + \beta_k

where ``s`` is an output position, ``u`` a kernel tap, ``c`` an input channel of
the group of ``k`` and ``\sigma`` the (strided, padded, dilated) window map.
Since ``y`` is linear in ``K``, ``dy[b,s,k]/dK[u,c,k'] = delta(k,k') P[b,s,k,u,c]``
where ``P`` is the receptive-field patch of ``x`` seen by output element
``(b,s,k)``: the patches of the input, restricted to the channel group (feature
grouping) or batch block (batch grouping) that feeds channel ``k``.

Exact D-RTRL therefore keeps the kernel trace **position-resolved** (``docs/theory.md``,
"conv kernel trace"); it is stored in a canonical layout, independent of the user's
``dimension_numbers``::

    kernel trace: (G, K/G, P, N, n, S)    P = I_kernel * prod(kernel spatial)
    bias trace:   (*y.shape, n)            output layout, summed only on contraction

with ``G = feature_group_count * batch_group_count`` and ``S`` the output
positions flattened row-major. ``P`` is ordered channel-major, like the
``(I, *spatial)`` part of an ``OI...`` kernel. Positions are the minor axis: the
per-position factors ``D``, ``Df`` and ``g`` broadcast over ``P`` and patches over
output channels along one long contiguous axis, and the contraction with the
learning signal reduces the contiguous block ``(N, n, S)`` of each (channel, tap).
Measured in the executors' loop on the benchmark: positions minor 20% faster than
``P`` minor, flattened positions and ``P`` before ``N`` each about 20% faster on
channels-first layers; the contraction written as a matrix product 2x slower.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad, mlir

from .conv_args import conv_params
from .primitive import apply_state_jacobian, register_primitive
from .units import bias_in_unit, join_unit, split_unit

__all__ = ['etp_conv_p', 'conv']


# --------------------------------------------------------------------------- forward
def _lax_conv(x, kernel, p):
    return lax.conv_general_dilated(
        x, kernel, window_strides=p['strides'], padding=p['padding'],
        lhs_dilation=p['lhs_dilation'], rhs_dilation=p['rhs_dilation'],
        dimension_numbers=p['dimension_numbers'],
        feature_group_count=p['feature_group_count'], batch_group_count=p['batch_group_count'],
        precision=p['precision'], preferred_element_type=p['preferred_element_type'])


def _bias_shape(rank: int, channel_axis: int, out_ch: int):
    shape = [1] * rank
    shape[channel_axis] = out_ch
    return shape


def _channels_last(n_spatial: int) -> lax.ConvDimensionNumbers:
    """Dimension numbers of ``x (N, *S, C)``, ``kernel (*U, I, O)``, ``y (N, *S, K)``."""
    spatial = tuple(range(1, n_spatial + 1))
    return lax.ConvDimensionNumbers((0, n_spatial + 1, *spatial),
                                    (n_spatial + 1, n_spatial, *range(n_spatial)),
                                    (0, n_spatial + 1, *spatial))


def _channels_last_conv(x, kernel, p):
    """``_lax_conv`` computed on channels-last copies of ``x`` and ``kernel``.

    XLA's CPU backend runs convolutions inside loop bodies (every executor's scan)
    fast only in this layout. Measured per step in a scan against plain ``lax``
    (``benchmarks/conv_lowering.py``, jaxlib 0.10, 2 cores): channels-first forward
    1.0-51x faster (51x at 128 channels, 16x16), input gradient 0.9-56x, kernel
    gradient 1.1-164x (lax's gradient convolutions keep operands in other orders),
    channels-last forward equal. The transposes cost little next to that.
    """
    dn, n = p['dimension_numbers'], x.ndim - 2
    x_cl = jnp.transpose(x, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1]))
    k_cl = jnp.transpose(kernel, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0]))
    y = _lax_conv(x_cl, k_cl, dict(p, dimension_numbers=_channels_last(n)))
    at = (0, n + 1, *range(1, n + 1))   # axis of y holding canonical dim j (N, K, *S)
    perm = [0] * y.ndim
    for j, axis in enumerate(dn.out_spec):
        perm[axis] = at[j]
    return jnp.transpose(y, perm)


def _conv_impl(x, kernel, *bias, has_bias, pool=None, convolution=_lax_conv, **p):
    y = convolution(x, kernel, p)
    if has_bias:
        (b,) = bias
        channel_axis = p['dimension_numbers'].out_spec[1]
        y = y + jnp.reshape(b, _bias_shape(y.ndim, channel_axis, b.shape[0])).astype(y.dtype)
    return y if pool is None else _pool(y, pool)


def _pool(y, pool):
    """``scale * reduce_window_sum(y)``: sum/average pooling folded into the op.

    ``pool = (window, strides, padding, scale)`` in the output layout, with
    window 1 on the batch and channel axes (so it mixes positions only).
    """
    window, strides, padding, scale = pool
    pooled = lax.reduce_window(y, np.zeros((), y.dtype), lax.add, window, strides, padding)
    return pooled * jnp.asarray(scale, y.dtype)


def _trainable_invars(params):
    return {'weight': 1, 'bias': 2} if params['has_bias'] else {'weight': 1}


# --------------------------------------------------------------------------- geometry
def _groups(p) -> int:
    return p['feature_group_count'] * p['batch_group_count']


def _out_to_canonical(a, p, n_extra: int):
    """Output-layout array with ``n_extra`` trailing axes -> ``(G, K/G, N, *extra, S)``,
    output positions flattened row-major into ``S``."""
    rank = a.ndim - n_extra
    out_spec = p['dimension_numbers'].out_spec
    a = jnp.transpose(a, (out_spec[1], out_spec[0], *range(rank, a.ndim), *out_spec[2:]))
    g = _groups(p)
    return a.reshape(g, a.shape[0] // g, *a.shape[1:2 + n_extra], -1)


def _kernel_spatial(kernel_shape, p):
    return tuple(kernel_shape[i] for i in p['dimension_numbers'].rhs_spec[2:])


def _explicit_padding(dilated_sizes, extent, p):
    """The ``(low, high)`` padding of each spatial dimension (a padding string resolved
    for inputs of ``dilated_sizes`` and kernels of ``extent``)."""
    if isinstance(p['padding'], str):
        return lax.padtype_to_pads(dilated_sizes, extent, p['strides'], p['padding'])
    return p['padding']


def _window_copies(x_c, window, p):
    """``(N, C * prod(window), *S_out)``: for every output position, the input values under
    each kernel tap (channel-major), as ``lax.conv_general_dilated_patches`` returns them.

    Built from one pad (padding and input dilation) and one strided slice per tap: pure
    copies, so no rounding on any backend, and measured 2x faster on CPU than the 0/1
    convolution that extracts the same values.
    """
    dilated = tuple((d - 1) * ld + 1 for d, ld in zip(x_c.shape[2:], p['lhs_dilation']))
    extent = tuple((k - 1) * rd + 1 for k, rd in zip(window, p['rhs_dilation']))
    padding = _explicit_padding(dilated, extent, p)
    config = [(0, 0, 0)] * 2 + [(lo, hi, ld - 1) for (lo, hi), ld
                                in zip(padding, p['lhs_dilation'])]
    xp = lax.pad(x_c, np.zeros((), x_c.dtype), config)
    out = tuple(max(0, (size - e) // st + 1)
                for size, e, st in zip(xp.shape[2:], extent, p['strides']))
    taps = []
    for tap in np.ndindex(*window):
        start = [t * rd for t, rd in zip(tap, p['rhs_dilation'])]
        stop = [st0 + (o - 1) * st + 1 if o else st0
                for st0, o, st in zip(start, out, p['strides'])]
        taps.append(lax.slice(xp, (0, 0, *start), (*xp.shape[:2], *stop), (1, 1, *p['strides'])))
    stacked = jnp.stack(taps, axis=2)                         # (N, C, prod(window), *S_out)
    return stacked.reshape(x_c.shape[0], x_c.shape[1] * len(taps), *out)


def _patches(x, kernel_shape, p):
    """Receptive-field patches ``(G, N_out, P, *S_out)`` of ``x`` (P channel-major)."""
    dn = p['dimension_numbers']
    x_c = jnp.transpose(x, dn.lhs_spec)                       # (N_in, C, *S_in)
    if x.ndim == 2:   # no spatial dimensions (a dense layer): the patch is the input
        return x_c[None]
    patches = _window_copies(x_c, _kernel_spatial(kernel_shape, p), p)
    n_in, feat, *spatial = patches.shape                      # feat = C * prod(U)
    fgc, bgc = p['feature_group_count'], p['batch_group_count']
    if bgc > 1:   # output channel group g reads input batch block g
        patches = patches.reshape(bgc, n_in // bgc, feat, *spatial)
    elif fgc > 1:  # output channel group g reads input channel block g
        patches = patches.reshape(n_in, fgc, feat // fgc, *spatial).swapaxes(0, 1)
    else:         # one group: a reshape (a transpose of a unit axis is a needless copy)
        patches = patches[None]
    return patches


def _trace_shape(y_shape, kernel_shape, p, n_state):
    y_c = tuple(y_shape[i] for i in p['dimension_numbers'].out_spec)
    g = _groups(p)
    k_in = kernel_shape[p['dimension_numbers'].rhs_spec[1]]
    taps = k_in * math.prod(_kernel_spatial(kernel_shape, p))
    return (g, y_c[1] // g, taps, y_c[0], n_state, math.prod(y_c[2:]))


def _kernel_from_canonical(dk, kernel_shape, p):
    """``(G, K/G, P)`` -> kernel layout."""
    rhs_spec = p['dimension_numbers'].rhs_spec
    canonical_shape = tuple(kernel_shape[i] for i in rhs_spec)           # (O, I, *U)
    dk = dk.reshape(canonical_shape)
    return jnp.transpose(dk, np.argsort(rhs_spec))


def _spatial_axes_of_out(p, y_ndim):
    out_spec = p['dimension_numbers'].out_spec
    return tuple(i for i in range(y_ndim) if i != out_spec[1])


# --------------------------------------------------------------------------- ETP rules
def _yw_to_w(hidden_dim, trace, **p):
    """Apply ``D^t`` (``(*y.shape, n, n)``) to the trace, position by position."""
    d_c = _out_to_canonical(hidden_dim, p, 2)[:, :, None]     # (G, K/G, 1, N, n, n, S)
    e = trace['weight']                                       # (G, K/G, P, N, n, S)
    # out[m] = sum_k D[m, k] E[k], written as a sum of broadcast products (a reduction
    # over the middle state axis made XLA's CPU backend crash in jaxlib 0.10)
    decayed = sum(d_c[:, :, :, :, :, k] * e[:, :, :, :, None, k] for k in range(d_c.shape[5]))
    out = {'weight': decayed}
    if 'bias' in trace:
        out['bias'] = apply_state_jacobian(hidden_dim, trace['bias'])
    return out


def _pooled_patches(patches, p):
    """Patches ``(G, N, P, *S)`` pooled like the output: what a pooled output sees."""
    window, strides, padding, scale = p['pool']
    spatial = p['dimension_numbers'].out_spec[2:]
    at = lambda seq, fill: (fill, fill, fill, *[seq[a] for a in spatial])
    return _pool(patches, (at(window, 1), at(strides, 1), at(padding, (0, 0)), scale))


def _xdf_to_trace(x, hidden_dim, weights, **p):
    """Instantaneous term ``Df^t[b,s,k,:] * P[b,s,k,u,c]`` for ``hidden_dim = Df^t``
    (with a folded pooling, ``P`` is the pooled patch)."""
    df_c = _out_to_canonical(hidden_dim, p, 1)                # (G, K/G, N, n, S)
    patches = _patches(x, weights['weight'].shape, p)         # (G, N, P, *S)
    if p.get('pool') is not None:
        patches = _pooled_patches(patches, p)
    patches = patches.reshape(*patches.shape[:3], -1).swapaxes(1, 2)   # (G, P, N, S)
    out = {'weight': df_c[:, :, None] * patches[:, None, :, :, None].astype(df_c.dtype)}
    if p['has_bias']:
        if p.get('pool') is None:
            out['bias'] = hidden_dim
        else:   # d y'/d b = the pooled count of the window at each output position
            count = _pool(jnp.ones(_unpooled_shape(x, weights, p), hidden_dim.dtype), p['pool'])
            out['bias'] = hidden_dim * count[..., None]
    return out


def _trace_to_dw(trace, hidden_dim, weights, **p):
    """``dK[u,c,k] = sum_{b,s,n} g[b,s,k,n] E[b,s,k,u,c,n]``; bias likewise."""
    g_c = _out_to_canonical(hidden_dim, p, 1)                 # (G, K/G, N, n, S)
    dk = jnp.sum(trace['weight'] * g_c[:, :, None], axis=(3, 4, 5))     # (G, K/G, P)
    out = {'weight': _kernel_from_canonical(dk, weights['weight'].shape, p)}
    if p['has_bias']:
        axes = _spatial_axes_of_out(p, hidden_dim.ndim - 1) + (hidden_dim.ndim - 1,)
        out['bias'] = jnp.sum(hidden_dim * trace['bias'], axis=axes)
    return out


def _xy_to_dw(x, hidden_dim, weights, **p):
    """Weight-shaped VJP ``sum_{b,s} hidden_dim * dy/dtheta``: the kernel gradient is a
    convolution of ``x`` with the cotangent (:func:`_kernel_gradient`), the bias gradient
    the cotangent summed over batch and positions (a folded pooling is undone first)."""
    cot = _unpool(hidden_dim, x, weights['weight'], p)
    out = {'weight': _kernel_gradient(x, cot, weights['weight'].shape, p).astype(hidden_dim.dtype)}
    if p['has_bias']:
        out['bias'] = jnp.sum(cot, axis=_spatial_axes_of_out(p, cot.ndim))
    return out


def _kernel_gradient(x, cot, kernel_shape, p):
    """``dK[k,c,u] = sum_{b,s} cot[b,s,k] x[b, sigma(s,u), c]`` as a convolution: ``x`` with
    batch and feature roles swapped is the input, the cotangent the kernel (its batch axis
    the kernel's input axis), the forward strides become its kernel dilation and the
    forward kernel dilation its strides. Feature groups become batch groups and vice
    versa. Written as this primitive, it lowers like a forward convolution (channels-last
    on CPU: see :func:`_channels_last_conv`; it also measured 1.2-3x faster per step than
    a matrix product of the cotangent with the receptive-field patches)."""
    dn = p['dimension_numbers']
    taps = [kernel_shape[a] for a in dn.rhs_spec[2:]]
    dilated = [(x.shape[a] - 1) * d + 1 for a, d in zip(dn.lhs_spec[2:], p['lhs_dilation'])]
    extent = [(t - 1) * r + 1 for t, r in zip(taps, p['rhs_dilation'])]
    padding = _explicit_padding(dilated, extent, p)
    out_sizes = [cot.shape[a] for a in dn.out_spec[2:]]
    pads = tuple((low, (t - 1) * r + (o - 1) * s + 1 - size - low) for size, o, t, r, s, (low, _)
                 in zip(dilated, out_sizes, taps, p['rhs_dilation'], p['strides'], padding))
    dtype = jnp.result_type(x, cot)
    return etp_conv_p.bind(
        x.astype(dtype), cot.astype(dtype), has_bias=False, pool=None,
        strides=tuple(p['rhs_dilation']), padding=pads, lhs_dilation=tuple(p['lhs_dilation']),
        rhs_dilation=tuple(p['strides']),
        feature_group_count=p['batch_group_count'], batch_group_count=p['feature_group_count'],
        dimension_numbers=lax.ConvDimensionNumbers(
            (dn.lhs_spec[1], dn.lhs_spec[0], *dn.lhs_spec[2:]),
            (dn.out_spec[1], dn.out_spec[0], *dn.out_spec[2:]),
            (dn.rhs_spec[1], dn.rhs_spec[0], *dn.rhs_spec[2:])),
        precision=p['precision'], preferred_element_type=p['preferred_element_type'])


def _unpooled_shape(x, weights, p):
    return jax.eval_shape(lambda a, k: _lax_conv(a, k, p), x, weights['weight']).shape


def _unpool(cotangent, x, kernel, p):
    """The cotangent of the convolution's output before a folded pooling (its transpose)."""
    if p.get('pool') is None:
        return cotangent
    unpooled = jnp.zeros(_unpooled_shape(x, {'weight': kernel}, p), cotangent.dtype)
    return jax.vjp(lambda y: _pool(y, p['pool']), unpooled)[1](cotangent)[0]


def _init_drtrl(x_aval, y_aval, weight_avals, n_state, **p):
    out = {'weight': jnp.zeros(_trace_shape(y_aval.shape, weight_avals['weight'].shape, p, n_state),
                               y_aval.dtype)}
    if p['has_bias']:
        out['bias'] = jnp.zeros((*y_aval.shape, n_state), y_aval.dtype)
    return out


def _init_pp(x_aval, y_aval, weight_avals, n_state, **p):
    return jnp.zeros((*y_aval.shape, n_state), y_aval.dtype)


etp_conv_p = register_primitive('etp_conv', _conv_impl, batched=True,
                                trainable_invars_fn=_trainable_invars, x_invar_index=0,
                                linear_in_weights=True)
etp_conv_p.register_etp_rules(yw_to_w=_yw_to_w, xy_to_dw=_xy_to_dw, init_drtrl=_init_drtrl,
                              init_pp=_init_pp, xdf_to_trace=_xdf_to_trace,
                              trace_to_dw=_trace_to_dw)


# --------------------------------------------------------------------------- JAX rules
# The convolution is bilinear: the tangent in x is the primitive itself (no bias), so the
# input gradient is this module's transposed convolution, which lowers like any other.
def _conv_jvp(primals, tangents, *, has_bias, **p):
    x, kernel, *bias = primals
    x_dot, *weight_dots = tangents
    parts = []
    if type(x_dot) is not ad.Zero:
        parts.append(etp_conv_p.bind(x_dot, kernel, has_bias=False, **p))
    if any(type(t) is not ad.Zero for t in weight_dots):   # linear in (kernel, bias) jointly
        parts.append(etp_conv_p.bind(x, *map(ad.instantiate_zeros, weight_dots),
                                     has_bias=has_bias, **p))
    return etp_conv_p.bind(*primals, has_bias=has_bias, **p), sum(parts[1:], parts[0])


def _conv_transpose(cotangent, x, *weights, has_bias, **p):
    if not ad.is_undefined_primal(x):
        return _weights_transpose(cotangent, x, *weights, has_bias=has_bias, **p)
    if has_bias or any(ad.is_undefined_primal(w) for w in weights):
        raise NotImplementedError('etp_conv is linear in x only without a bias and for a '
                                  'fixed kernel.')
    cotangent = _unpool(ad.instantiate_zeros(cotangent), x.aval, weights[0], p)
    dx = _input_gradient(cotangent, weights[0], x.aval.shape, p)
    return [dx.astype(x.aval.dtype), None]


def _input_gradient(cotangent, kernel, x_shape, p):
    """``dL/dx`` of ``y = conv(x, kernel)``: a convolution of the cotangent, with input
    dilation by the strides, the kernel's taps flipped and its in/out roles swapped
    within each feature group, and the padding that restores ``x``'s extent."""
    dn, n = p['dimension_numbers'], len(x_shape) - 2
    if p['batch_group_count'] > 1 or any(d != 1 for d in p['lhs_dilation']):
        # (rare) forms whose transpose is not such a convolution: lax's own rule
        zeros = jnp.zeros(x_shape, cotangent.dtype)
        return jax.vjp(lambda a: _lax_conv(a, kernel, dict(p, pool=None)), zeros)[1](cotangent)[0]
    g = p['feature_group_count']
    k = jnp.transpose(kernel, dn.rhs_spec)                                  # (O, I, *U)
    out_ch, in_ch, taps = k.shape[0], k.shape[1], k.shape[2:]
    k = k.reshape(g, out_ch // g, in_ch, *taps).swapaxes(1, 2).reshape(g * in_ch, out_ch // g,
                                                                        *taps)
    k = jnp.flip(k, axis=tuple(range(2, n + 2)))
    in_sizes = [x_shape[a] for a in dn.lhs_spec[2:]]
    out_sizes = [cotangent.shape[a] for a in dn.out_spec[2:]]
    extent = [(t - 1) * r + 1 for t, r in zip(taps, p['rhs_dilation'])]
    padding = _explicit_padding(in_sizes, extent, p)
    pads = []
    for size, out, e, stride, (low, _) in zip(in_sizes, out_sizes, extent, p['strides'],
                                              padding):
        before = e - 1 - low
        pads.append((before, size + e - 1 - ((out - 1) * stride + 1) - before))
    iota = tuple(range(n + 2))
    return etp_conv_p.bind(
        cotangent, k, **dict(p, has_bias=False, pool=None, strides=(1,) * n, padding=tuple(pads),
                             lhs_dilation=tuple(p['strides']),
                             dimension_numbers=lax.ConvDimensionNumbers(dn.out_spec, iota,
                                                                        dn.lhs_spec)))


_weights_transpose = ad.primitive_transposes[etp_conv_p]   # the derived rule (xy_to_dw)
ad.primitive_jvps[etp_conv_p] = _conv_jvp
ad.primitive_transposes[etp_conv_p] = _conv_transpose
mlir.register_lowering(etp_conv_p, mlir.lower_fun(partial(_conv_impl,
                                                          convolution=_channels_last_conv),
                                                  multiple_results=False), platform='cpu')


# --------------------------------------------------------------------------- public wrapper
def conv(x, kernel, bias=None, *, strides: Sequence[int] | int, padding: str | Sequence = 'VALID',
         lhs_dilation: Optional[Sequence[int]] = None, rhs_dilation: Optional[Sequence[int]] = None,
         feature_group_count: int = 1, batch_group_count: int = 1, dimension_numbers: Any = None,
         precision: Any = None, preferred_element_type: Any = None):
    r"""Trainable N-D convolution (``jax.lax.conv_general_dilated`` semantics) plus bias.

    Args:
      x: input, rank ``n_spatial + 2`` with a batch axis; layout given by
        ``dimension_numbers`` (default ``NC...``, e.g. ``NCHW``). May be a
        ``saiunit`` quantity.
      kernel: kernel, same rank; layout default ``OI...`` (e.g. ``OIHW``). Its
        input-channel size is ``in_channels / feature_group_count``. May carry
        a unit.
      bias: optional ``(out_channels,)``, added along the output channel axis;
        its unit must have the dimension of ``unit(x) * unit(kernel)``.
      strides: window strides, an int or one per spatial dimension.
      padding: ``'SAME'``, ``'SAME_LOWER'``, ``'VALID'`` or ``n_spatial``
        explicit ``(low, high)`` pairs (negative values crop).
      lhs_dilation, rhs_dilation: input / kernel dilation, one per spatial dim.
      feature_group_count, batch_group_count: grouping as in lax (not both > 1).
      dimension_numbers: ``None``, a spec triple like ``('NHWC', 'HWIO',
        'NHWC')``, or a ``lax.ConvDimensionNumbers``.
      precision, preferred_element_type: passed to lax.

    Returns:
      ``y`` in the output layout, with unit ``unit(x) * unit(kernel)``; a plain
      array when both are unitless.

    Raises:
      ValueError / TypeError naming the offending argument, before any compute.
    """
    x_v, x_unit = split_unit(x, 'x')
    k_v, k_unit = split_unit(kernel, 'kernel')
    params = conv_params(jnp.shape(x_v), jnp.shape(k_v), strides=strides, padding=padding,
                         lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                         feature_group_count=feature_group_count,
                         batch_group_count=batch_group_count,
                         dimension_numbers=dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type)
    dtype = jnp.result_type(x_v, k_v)
    operands = [jnp.asarray(x_v, dtype), jnp.asarray(k_v, dtype)]
    unit = x_unit * k_unit
    if bias is not None:
        out_ch = jnp.shape(k_v)[params['dimension_numbers'].rhs_spec[0]]
        operands.append(bias_in_unit(bias, unit, (out_ch,), dtype))
    y = etp_conv_p.bind(*operands, has_bias=bias is not None, **params)
    return join_unit(y, unit)
