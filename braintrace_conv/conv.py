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
"conv kernel trace"), one entry per output element, cut value (``m`` per element: the
state variables of most neurons, see :mod:`braintrace_conv.primitive`) and kernel entry
``P = I_kernel * prod(kernel spatial)`` (channel-major, like the ``(I, *spatial)`` part
of an ``OI...`` kernel). The bias trace is the trace of one more kernel entry whose
input is always 1; both are summed over positions only on contraction. Whatever the
layout of the output, they are stored as (:func:`_merged`)::

    kernel trace (K m, P, N)        bias trace (K m, 1, N)

with row ``k m + j`` for channel ``k`` and state ``j``, and ``N`` the output's axes
other than ``K`` (the batch first, in the usual layouts) flattened in order. The one
exception is an output of a batch and channels only (a dense layer,
:mod:`braintrace_conv.dense`): its positions are just the batch, too short to be the
minor axis, and its traces keep the output's layout ``(B, K, m, P)``.

The per-step update multiplies ``D`` and ``Df`` (given per output element) into the
trace, with its operands first brought into the trace's order (:func:`_transposed`),
so that it runs over the trace in order. The contraction with ``g`` is one
matrix-vector product per row, ``(P, N) @ (N,)``, batched over the rows, rather than a
sum of a broadcast product, or a column reduction over a channels-last output's own
layout (``docs/benchmarks.md`` gives the step times of each).
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

from .conv_args import conv_params, dilated_extent
from .primitive import derived_transpose, register_primitive
from .units import bias_in_unit, join_unit, split_unit

__all__ = ['etp_conv_p', 'conv']


# --------------------------------------------------------------------------- forward
def _lax_conv(x, kernel, params):
    return lax.conv_general_dilated(
        x, kernel, window_strides=params['strides'], padding=params['padding'],
        lhs_dilation=params['lhs_dilation'], rhs_dilation=params['rhs_dilation'],
        dimension_numbers=params['dimension_numbers'],
        feature_group_count=params['feature_group_count'],
        batch_group_count=params['batch_group_count'],
        precision=params['precision'], preferred_element_type=params['preferred_element_type'])


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


def _channels_last_conv(x, kernel, params):
    """``_lax_conv`` computed on channels-last copies of ``x`` and ``kernel``.

    XLA's CPU backend runs convolutions inside loop bodies (every executor's scan)
    fast only in this layout, and lax's gradient convolutions keep their operands in
    other orders; the transposes cost little next to that (``benchmarks/conv_lowering.py``,
    tables in ``docs/benchmarks.md``, "Convolutions inside a loop").
    """
    dn, n_spatial = params['dimension_numbers'], x.ndim - 2
    x_cl = jnp.transpose(x, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1]))
    k_cl = jnp.transpose(kernel, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0]))
    y = _lax_conv(x_cl, k_cl, dict(params, dimension_numbers=_channels_last(n_spatial)))
    # the axis of y holding canonical dim j (N, K, *S)
    at = (0, n_spatial + 1, *range(1, n_spatial + 1))
    perm = [0] * y.ndim
    for j, axis in enumerate(dn.out_spec):
        perm[axis] = at[j]
    return jnp.transpose(y, perm)


def _conv_impl(x, kernel, *bias, has_bias, pool=None, convolution=_lax_conv, **params):
    y = convolution(x, kernel, params)
    if has_bias:
        (b,) = bias
        channel_axis = params['dimension_numbers'].out_spec[1]
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
def _groups(params) -> int:
    return params['feature_group_count'] * params['batch_group_count']


def _kernel_spatial(kernel_shape, params):
    return tuple(kernel_shape[i] for i in params['dimension_numbers'].rhs_spec[2:])


def _explicit_padding(dilated_sizes, extent, params):
    """The ``(low, high)`` padding of each spatial dimension (a padding string resolved
    for inputs of ``dilated_sizes`` and kernels of ``extent``)."""
    if isinstance(params['padding'], str):
        return lax.padtype_to_pads(dilated_sizes, extent, params['strides'], params['padding'])
    return params['padding']


def _window_copies(x, window, params, lhs_spec):
    """``x`` (laid out as ``lhs_spec``) with its channel axis ``C`` replaced by ``C *
    prod(window)`` (channel-major) and its spatial axes by the output's: for every output
    position, the input values under each kernel tap, as
    ``lax.conv_general_dilated_patches`` returns them.

    Built from one pad (padding and input dilation) and one strided slice per tap: pure
    copies, so no rounding on any backend, and measured 2x faster on CPU than the 0/1
    convolution that extracts the same values.
    """
    channel, spatial = lhs_spec[1], lhs_spec[2:]
    dilated = tuple(dilated_extent(x.shape[a], ld)
                    for a, ld in zip(spatial, params['lhs_dilation']))
    extent = tuple(map(dilated_extent, window, params['rhs_dilation']))
    padding = _explicit_padding(dilated, extent, params)
    config = [(0, 0, 0)] * x.ndim
    for a, (lo, hi), ld in zip(spatial, padding, params['lhs_dilation']):
        config[a] = (lo, hi, ld - 1)
    xp = lax.pad(x, np.zeros((), x.dtype), config)
    out = tuple(max(0, (xp.shape[a] - e) // st + 1)
                for a, e, st in zip(spatial, extent, params['strides']))
    taps = []
    for tap in np.ndindex(*window):
        start, stop, step = [0] * x.ndim, list(xp.shape), [1] * x.ndim
        for a, t, rd, o, st in zip(spatial, tap, params['rhs_dilation'], out, params['strides']):
            start[a], step[a] = t * rd, st
            stop[a] = start[a] + dilated_extent(o, st) if o else start[a]
        taps.append(lax.slice(xp, start, stop, step))
    stacked = jnp.stack(taps, axis=channel + 1)               # (..., C, prod(window), ...)
    return stacked.reshape(*stacked.shape[:channel], -1, *stacked.shape[channel + 2:])


def _patches(x, kernel_shape, y_shape, params):
    """Receptive-field patches in the layout of a kernel-trace term (:func:`_trace_form`),
    ``(G, 1, P, N)``: a channel axis of one entry per group (broadcast over the group's
    channels) and a unit state axis. Entry ``p`` of an output element is the
    input value it sees under kernel entry ``p`` (input channel within the group and
    tap, channel-major), pooled like the output if a pooling is folded in."""
    dn = params['dimension_numbers']
    lhs_spec = dn.lhs_spec
    if lhs_spec[1] != 0 and not _entries_minor(params, len(y_shape)):
        # channel axis first before the taps are stacked, so that the patches come out
        # in the trace's order rather than transposed inside its update
        order = (lhs_spec[1], *(i for i in range(x.ndim) if i != lhs_spec[1]))
        x = _transposed(x, order)
        lhs_spec = tuple(order.index(i) for i in lhs_spec)
    windows = (_window_copies(x, _kernel_spatial(kernel_shape, params), params, lhs_spec)
               if x.ndim > 2 else x)
    # to the output's layout, channel axis split into (G, P)
    in_y = jnp.transpose(windows, [lhs_spec[i] for i in np.argsort(dn.out_spec)])
    c, fgc, bgc = dn.out_spec[1], params['feature_group_count'], params['batch_group_count']
    b = dn.out_spec[0]
    if bgc > 1:   # output channel group g reads input batch block g
        in_y = in_y.reshape(*in_y.shape[:b], bgc, -1, *in_y.shape[b + 1:])
        in_y = jnp.moveaxis(in_y, b, c)                       # batch block before the taps
        in_y = in_y.reshape(*in_y.shape[:c + 1], 1, *in_y.shape[c + 1:])
    else:         # output channel group g reads input channel block g
        in_y = in_y.reshape(*in_y.shape[:c], fgc, 1, -1, *in_y.shape[c + 1:])
    if params.get('pool') is not None:
        window, strides, padding, scale = params['pool']
        at = lambda seq, fill: (*seq[:c + 1], fill, fill, *seq[c + 1:])
        in_y = _pool(in_y, (at(window, 1), at(strides, 1), at(padding, (0, 0)), scale))
    groups, channels = _groups(params), y_shape[c]
    if groups > 1 and channels > groups:                      # K/G channels per group
        in_y = jnp.repeat(in_y, channels // groups, axis=c)
    if _entries_minor(params, len(y_shape)):
        return in_y                                           # (B, G, 1, P)
    in_y = jnp.moveaxis(in_y, (c, c + 1, c + 2), (0, 1, 2))   # (G, 1, P, *other axes)
    return in_y.reshape(*in_y.shape[:3], -1)


def _taps(kernel_shape, params) -> int:
    """``P``: kernel entries per output channel (input channels of a group x taps)."""
    in_channels = kernel_shape[params['dimension_numbers'].rhs_spec[1]]
    return in_channels * math.prod(_kernel_spatial(kernel_shape, params))


def _kernel_from_taps(dk, kernel_shape, params):
    """``(K, P)`` -> kernel layout."""
    rhs_spec = params['dimension_numbers'].rhs_spec
    canonical_shape = tuple(kernel_shape[i] for i in rhs_spec)           # (O, I, *U)
    return jnp.transpose(dk.reshape(canonical_shape), np.argsort(rhs_spec))


def _spatial_axes_of_out(params, y_ndim):
    out_spec = params['dimension_numbers'].out_spec
    return tuple(i for i in range(y_ndim) if i != out_spec[1])


def _entries_minor(params, y_ndim: int) -> bool:
    """Whether the traces keep the output's own layout ``(B, K, m, P)``: an output of a
    batch and channels only (a dense layer)."""
    return y_ndim == 2 and params['dimension_numbers'].out_spec[1] == 1


def _state_axis(params, y_ndim: int) -> int:
    """The trace's axis of state variables ``m``; its channel axis comes before, its
    kernel-entry axis ``P`` right after."""
    return 2 if _entries_minor(params, y_ndim) else 1


def _trace_form(a, params, n_state_axes: int, extra: int = 0):
    """``(*y.shape, *state)`` -> ``(K, *state, *(1,) * extra, N)``, the layout the rules
    compute the trace terms in (module docstring): ``N`` the axes of ``y`` other than its
    channel axis ``K``, flattened in order; a dense layer's ``(B, K, *state, *(1,) *
    extra)``."""
    c = params['dimension_numbers'].out_spec[1]
    rank = a.ndim - n_state_axes
    if _entries_minor(params, rank):
        return a.reshape(*a.shape, *(1,) * extra)
    order = (c, *range(rank, a.ndim), *(i for i in range(rank) if i != c))
    a = _transposed(a, order) if c != 0 else jnp.transpose(a, order)
    return a.reshape(*a.shape[:1 + n_state_axes], *(1,) * extra, -1)


def _merged(a, params, y_ndim: int):
    """A trace term ``(K, m, P, N)`` -> the stored trace ``(K m, P, N)`` (row ``k m + j``
    for channel ``k`` and state ``j``); a dense layer's term is stored as it is."""
    return a if _entries_minor(params, y_ndim) else a.reshape(-1, *a.shape[2:])


def _split(trace, params, y_ndim: int, m: int):
    """The stored trace -> ``(K, m, P, N)``; the inverse of :func:`_merged`."""
    return trace if _entries_minor(params, y_ndim) else trace.reshape(-1, m, *trace.shape[1:])


def _transposed(a, order):
    """``jnp.transpose(a, order)`` computed into an array of its own, for an ``order``
    that brings the channel axis of ``a`` (not its first axis) to the front.

    XLA's CPU backend fuses a transpose into its consumer (and drops optimization
    barriers). Fused into a trace update, a transpose slows the loop over the trace: one
    that moves the minor axis turns it into strided, unvectorised reads of the operand
    (measured on the channels-last DVS-sized net, the update of a 288 MiB trace took
    4-6x as long as with the operand already in the trace's order), and any other
    needs an index division per entry of the trace's flattened positions (measured on
    the channels-first standard workload, 2-2.5x as long). The axis is therefore moved
    by a product with the identity matrix, which XLA computes on its own. The product is
    exact (each output is one input times 1 plus zeros) unless ``a`` holds an infinity
    or a NaN, which then spreads along the moved axis.
    """
    n, rest = a.shape[order[0]], order[1:]
    flat = jnp.transpose(a, (*rest, order[0])).reshape(-1, n)
    moved = lax.dot_general(jnp.eye(n, dtype=a.dtype), flat, (((1,), (1,)), ((), ())),
                            precision=lax.Precision.HIGHEST)
    return moved.reshape(n, *(a.shape[i] for i in rest))


# --------------------------------------------------------------------------- ETP rules
# D-RTRL traces (module docstring): the kernel trace ``(K m, P, N)`` and the bias trace
# ``(K m, 1, N)``, the latter being the trace of one more kernel entry whose input is
# always 1 (with a folded pooling, the pooled count). The rules compute on ``(K, m, P,
# N)`` (:func:`_split`, :func:`_merged`).
def _yw_to_w(D, trace, **params):
    """Apply ``D^t`` (``(*y.shape, m, m)``) to the traces, element by element."""
    y_ndim, n = D.ndim - 2, D.shape[-1]
    D_form = _trace_form(D, params, 2, extra=1)                   # (K, m, m, 1, N)
    if n == 1 and not _entries_minor(params, y_ndim):
        # one state: scaled as stored, so that XLA updates the trace in place (a reshape
        # of the trace inside the update made it write a new one and copy it back)
        d = D_form.reshape(D_form.shape[0], 1, -1)                # (K, 1, N)
        return {slot: d * e for slot, e in trace.items()}
    m = _state_axis(params, y_ndim)
    # out[i] = sum_j D[i, j] E[j], written as a sum of broadcast products (a reduction
    # over the middle state axis made XLA's CPU backend crash in jaxlib 0.10)
    apply = lambda e: sum(lax.index_in_dim(D_form, j, axis=m + 1, keepdims=False)
                          * lax.slice_in_dim(e, j, j + 1, axis=m)
                          for j in range(n))
    return {slot: _merged(apply(_split(e, params, y_ndim, n)), params, y_ndim)
            for slot, e in trace.items()}


def _xdf_to_trace(x, Df, weights, **params):
    """Instantaneous term ``E[k, j, p] = Df^t[k, j] * patch[k, p]`` per output element and
    cut value ``j``, for ``Df^t`` of shape ``(*y.shape, m)`` (with a folded pooling, the
    pooled patch)."""
    y_ndim = Df.ndim - 1
    Df_form = _trace_form(Df, params, 1, extra=1)                 # (K, m, 1, N)
    patches = _patches(x, weights['weight'].shape, Df.shape[:-1], params)
    out = {'weight': Df_form * patches.astype(Df_form.dtype)}
    if params['has_bias']:
        if params.get('pool') is None:
            out['bias'] = Df_form
        else:   # d y'/d b = the pooled count of the window at each output position
            count = _pool(jnp.ones(_unpooled_shape(x, weights, params), Df.dtype),
                          params['pool'])
            out['bias'] = _trace_form(Df * count[..., None], params, 1, extra=1)
    return {slot: _merged(e, params, y_ndim) for slot, e in out.items()}


def _trace_to_dw(trace, g, weights, **params):
    """``dK[k, p] = sum_{b,s,j} g[b,s,k,j] E[b,s,k,j,p]`` for the learning signal ``g``
    (``(*y.shape, m)``), and the bias likewise: the traces summed over positions here,
    and only here."""
    y_ndim, n = g.ndim - 1, g.shape[-1]
    g_form = _trace_form(g, params, 1)                            # (K, m, N)
    if _entries_minor(params, y_ndim):
        # (B, K, m, P) against (B, K, m): summed over the state axis first, so that the
        # sum over the batch runs over whole rows
        contract = lambda e: jnp.sum(sum(g_form[..., j, None] * e[..., j, :]
                                         for j in range(n)), axis=0)
    else:
        # one matrix-vector product per row (channel, state) of the trace. On CPU it ran
        # 1.7-2.7x faster than the sum of the broadcast product, which XLA reduces on
        # one thread. It reads the stored trace itself: with a reshape in between, XLA
        # computed the update a second time for it and copied the old trace.
        rows = g_form.reshape(-1, g_form.shape[-1])               # (K m, N)

        def contract(e):   # (K m, P, N) -> (K, P)
            dtype = jnp.result_type(e, rows)
            per_row = lax.dot_general(e, rows, (((2,), (1,)), ((0,), (0,))),
                                      precision=lax.Precision.HIGHEST,
                                      preferred_element_type=jnp.promote_types(
                                          dtype, jnp.float32))
            return per_row.reshape(-1, n, e.shape[1]).sum(axis=1).astype(dtype)

    out = {'weight': _kernel_from_taps(contract(trace['weight']), weights['weight'].shape,
                                       params)}
    if params['has_bias']:
        out['bias'] = contract(trace['bias'])[:, 0]
    return out


def _xy_to_dw(x, cotangent, weights, **params):
    """Weight-shaped VJP ``sum_{b,s} cotangent * dy/dtheta``: the kernel gradient is a
    convolution of ``x`` with the cotangent (:func:`_kernel_gradient`), the bias gradient
    the cotangent summed over batch and positions (a folded pooling is undone first)."""
    cot = _unpool(cotangent, x, weights['weight'], params)
    out = {'weight': _kernel_gradient(x, cot, weights['weight'].shape, params)
           .astype(cotangent.dtype)}
    if params['has_bias']:
        out['bias'] = jnp.sum(cot, axis=_spatial_axes_of_out(params, cot.ndim))
    return out


def _kernel_gradient(x, cot, kernel_shape, params):
    """``dK[k,c,u] = sum_{b,s} cot[b,s,k] x[b, sigma(s,u), c]`` as a convolution: ``x`` with
    batch and feature roles swapped is the input, the cotangent the kernel (its batch axis
    the kernel's input axis), the forward strides become its kernel dilation and the
    forward kernel dilation its strides. Feature groups become batch groups and vice
    versa. Written as this primitive, it lowers like a forward convolution (channels-last
    on CPU: see :func:`_channels_last_conv`; it also measured 1.2-3x faster per step than
    a matrix product of the cotangent with the receptive-field patches)."""
    dn = params['dimension_numbers']
    taps = [kernel_shape[a] for a in dn.rhs_spec[2:]]
    dilated = [dilated_extent(x.shape[a], d) for a, d in zip(dn.lhs_spec[2:],
                                                             params['lhs_dilation'])]
    extent = list(map(dilated_extent, taps, params['rhs_dilation']))
    padding = _explicit_padding(dilated, extent, params)
    out_sizes = [cot.shape[a] for a in dn.out_spec[2:]]
    # the high padding that makes the input span exactly the kernel and the strided outputs
    pads = tuple((low, e + dilated_extent(o, s) - 1 - size - low)
                 for size, o, e, s, (low, _) in zip(dilated, out_sizes, extent,
                                                    params['strides'], padding))
    dtype = jnp.result_type(x, cot)
    return etp_conv_p.bind(
        x.astype(dtype), cot.astype(dtype), has_bias=False, pool=None,
        strides=tuple(params['rhs_dilation']), padding=pads,
        lhs_dilation=tuple(params['lhs_dilation']), rhs_dilation=tuple(params['strides']),
        feature_group_count=params['batch_group_count'],
        batch_group_count=params['feature_group_count'],
        dimension_numbers=lax.ConvDimensionNumbers(
            (dn.lhs_spec[1], dn.lhs_spec[0], *dn.lhs_spec[2:]),
            (dn.out_spec[1], dn.out_spec[0], *dn.out_spec[2:]),
            (dn.rhs_spec[1], dn.rhs_spec[0], *dn.rhs_spec[2:])),
        precision=params['precision'], preferred_element_type=params['preferred_element_type'])


def _unpooled_shape(x, weights, params):
    return jax.eval_shape(lambda a, k: _lax_conv(a, k, params), x, weights['weight']).shape


def _unpool(cotangent, x, kernel, params):
    """The cotangent of the convolution's output before a folded pooling (its transpose)."""
    if params.get('pool') is None:
        return cotangent
    unpooled = jnp.zeros(_unpooled_shape(x, {'weight': kernel}, params), cotangent.dtype)
    return jax.vjp(lambda y: _pool(y, params['pool']), unpooled)[1](cotangent)[0]


def _init_drtrl(x_aval, y_aval, weight_avals, m, **params):
    # the trace form of y with unit state and kernel-entry axes, which are then sized
    shape = jax.eval_shape(lambda y: _trace_form(y, params, 0, extra=2),
                           jax.ShapeDtypeStruct(y_aval.shape, y_aval.dtype)).shape
    at = _state_axis(params, len(y_aval.shape))
    trace = lambda taps: _merged(jnp.zeros((*shape[:at], m, taps, *shape[at + 2:]),
                                           y_aval.dtype), params, len(y_aval.shape))
    out = {'weight': trace(_taps(weight_avals['weight'].shape, params))}
    if params['has_bias']:
        out['bias'] = trace(1)
    return out


def _init_pp(x_aval, y_aval, weight_avals, m, **params):
    return jnp.zeros((*y_aval.shape, m), y_aval.dtype)


def _fold_pool(params, window, strides, padding, scale):
    """``params`` with ``scale * reduce_window_sum(y)`` folded into the op (:func:`_pool`),
    or ``None`` when the pooling also runs over the batch or channel axis or a pooling
    is folded in already."""
    if params.get('pool') is not None:
        return None
    if any(window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0)
           for a in params['dimension_numbers'].out_spec[:2]):
        return None
    return dict(params, pool=(window, strides, padding, scale))


# --------------------------------------------------------------------------- JAX rules
# The convolution is bilinear: the tangent in x is the primitive itself (no bias), so the
# input gradient is this module's transposed convolution, which lowers like any other.
def _conv_jvp(primals, tangents, *, has_bias, **params):
    x, kernel, *bias = primals
    x_dot, *weight_dots = tangents
    parts = []
    if type(x_dot) is not ad.Zero:
        parts.append(etp_conv_p.bind(x_dot, kernel, has_bias=False, **params))
    if any(type(t) is not ad.Zero for t in weight_dots):   # linear in (kernel, bias) jointly
        parts.append(etp_conv_p.bind(x, *map(ad.instantiate_zeros, weight_dots),
                                     has_bias=has_bias, **params))
    return etp_conv_p.bind(*primals, has_bias=has_bias, **params), sum(parts[1:], parts[0])


def _conv_transpose(cotangent, x, *weights, has_bias, **params):
    if not ad.is_undefined_primal(x):
        return derived_transpose(etp_conv_p, cotangent, x, *weights, has_bias=has_bias, **params)
    if has_bias or any(ad.is_undefined_primal(w) for w in weights):
        raise NotImplementedError('etp_conv is linear in x only without a bias and for a '
                                  'fixed kernel.')
    cotangent = _unpool(ad.instantiate_zeros(cotangent), x.aval, weights[0], params)
    dx = _input_gradient(cotangent, weights[0], x.aval.shape, params)
    return [dx.astype(x.aval.dtype), None]


def _input_gradient(cotangent, kernel, x_shape, params):
    """``dL/dx`` of ``y = conv(x, kernel)``: a convolution of the cotangent, with input
    dilation by the strides, the kernel's taps flipped and its in/out roles swapped
    within each feature group, and the padding that restores ``x``'s extent."""
    dn, n_spatial = params['dimension_numbers'], len(x_shape) - 2
    if params['batch_group_count'] > 1 or any(d != 1 for d in params['lhs_dilation']):
        # (rare) forms whose transpose is not such a convolution: lax's own rule
        zeros = jnp.zeros(x_shape, cotangent.dtype)
        conv_of = lambda a: _lax_conv(a, kernel, dict(params, pool=None))
        return jax.vjp(conv_of, zeros)[1](cotangent)[0]
    fgc = params['feature_group_count']
    swapped = jnp.transpose(kernel, dn.rhs_spec)                            # (O, I, *U)
    out_ch, in_ch, taps = swapped.shape[0], swapped.shape[1], swapped.shape[2:]
    swapped = swapped.reshape(fgc, out_ch // fgc, in_ch, *taps).swapaxes(1, 2)
    swapped = swapped.reshape(fgc * in_ch, out_ch // fgc, *taps)
    swapped = jnp.flip(swapped, axis=tuple(range(2, n_spatial + 2)))
    in_sizes = [x_shape[a] for a in dn.lhs_spec[2:]]
    out_sizes = [cotangent.shape[a] for a in dn.out_spec[2:]]
    extent = list(map(dilated_extent, taps, params['rhs_dilation']))
    padding = _explicit_padding(in_sizes, extent, params)
    pads = []
    for size, out, e, stride, (low, _) in zip(in_sizes, out_sizes, extent, params['strides'],
                                              padding):
        before = e - 1 - low
        pads.append((before, size + e - 1 - dilated_extent(out, stride) - before))
    iota = tuple(range(n_spatial + 2))
    return etp_conv_p.bind(
        cotangent, swapped, **dict(params, has_bias=False, pool=None, strides=(1,) * n_spatial,
                                   padding=tuple(pads), lhs_dilation=tuple(params['strides']),
                                   dimension_numbers=lax.ConvDimensionNumbers(dn.out_spec, iota,
                                                                              dn.lhs_spec)))


etp_conv_p = register_primitive('etp_conv', _conv_impl,
                                trainable_invars_fn=_trainable_invars, x_invar_index=0,
                                linear_in_weights=True, jvp=_conv_jvp, transpose=_conv_transpose)
etp_conv_p.register_etp_rules(yw_to_w=_yw_to_w, xy_to_dw=_xy_to_dw, init_drtrl=_init_drtrl,
                              init_pp=_init_pp, xdf_to_trace=_xdf_to_trace,
                              trace_to_dw=_trace_to_dw, fold_pool=_fold_pool)
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
