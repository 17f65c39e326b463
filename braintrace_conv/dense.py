r"""The dense ETP primitive ``etp_dense_p`` and the ``dense`` wrapper.

``y[b, o] = sum_i x[b, i] W[i, o] + beta[o]`` with ``x: (B, in)``,
``W: (in, out)``. A dense layer is a convolution with no spatial dimensions
(input layout ``NC``, kernel ``IO``, output ``NC``), so its ETP rules *are* the
conv rules at rank 0: the D-RTRL kernel trace is ``(B, out, m, in)`` and the bias
trace ``(B, out, m, 1)``. Only the forward pass is specialised, to a matrix product.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .conv import etp_conv_p
from .primitive import register_primitive, weight_vjp
from .units import bias_in_unit, join_unit, split_unit

__all__ = ['etp_dense_p', 'dense']

# The conv parameters under which a rank-0 convolution is this dense layer.
_AS_CONV = dict(strides=(), padding=(), lhs_dilation=(), rhs_dilation=(),
                feature_group_count=1, batch_group_count=1,
                dimension_numbers=lax.ConvDimensionNumbers((0, 1), (1, 0), (0, 1)),
                precision=None, preferred_element_type=None)


def _dense_impl(x, weight, *bias, has_bias):
    y = jnp.dot(x, weight)
    return y + bias[0].astype(y.dtype) if has_bias else y


def _as_conv_rule(conv_rule):
    def rule(*args, has_bias):
        return conv_rule(*args, has_bias=has_bias, **_AS_CONV)
    rule.__doc__ = f'The conv rule ``{conv_rule.__name__}`` at rank 0.'
    return rule


def _xy_to_dw(x, cotangent, weights, *, has_bias):
    """Weight-shaped VJP ``sum_b cotangent[b, o] * dy[b, o]/dtheta``."""
    operands = [x, weights['weight']] + ([weights['bias']] if has_bias else [])
    return weight_vjp(etp_dense_p, operands, cotangent, has_bias=has_bias)


# the conv's operand slots: weight 1, bias 2 when has_bias
etp_dense_p = register_primitive('etp_dense', _dense_impl,
                                 trainable_invars_fn=etp_conv_p.trainable_invars,
                                 x_invar_index=0, linear_in_weights=True)
etp_dense_p.register_etp_rules(
    xy_to_dw=_xy_to_dw,
    **{name: _as_conv_rule(etp_conv_p.rule(name))
       for name in ('yw_to_w', 'init_drtrl', 'init_pp', 'xdf_to_trace', 'trace_to_dw')})


def dense(x, weight, bias=None):
    """Trainable affine map ``y = x @ weight + bias``.

    Args:
      x: ``(B, in)`` input (a batch axis is required); may carry a unit.
      weight: ``(in, out)``; may carry a unit.
      bias: optional ``(out,)`` with the dimension of ``unit(x) * unit(weight)``.

    Returns:
      ``(B, out)`` with unit ``unit(x) * unit(weight)`` (plain if unitless).

    Raises:
      ValueError / TypeError naming the offending argument.
    """
    x_v, x_unit = split_unit(x, 'x')
    w_v, w_unit = split_unit(weight, 'weight')
    if jnp.ndim(x_v) != 2:
        raise ValueError(f'x must have shape (batch, in_features), got {jnp.shape(x_v)}.')
    if jnp.ndim(w_v) != 2:
        raise ValueError(f'weight must have shape (in_features, out_features), '
                         f'got {jnp.shape(w_v)}.')
    if jnp.shape(x_v)[1] != jnp.shape(w_v)[0]:
        raise ValueError(f'x has {jnp.shape(x_v)[1]} features but weight expects '
                         f'{jnp.shape(w_v)[0]} (weight shape {jnp.shape(w_v)}).')
    dtype = jnp.result_type(x_v, w_v)
    operands = [jnp.asarray(x_v, dtype), jnp.asarray(w_v, dtype)]
    unit = x_unit * w_unit
    if bias is not None:
        operands.append(bias_in_unit(bias, unit, (jnp.shape(w_v)[1],), dtype))
    return join_unit(etp_dense_p.bind(*operands, has_bias=bias is not None), unit)
