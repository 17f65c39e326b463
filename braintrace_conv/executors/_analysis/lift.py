"""Plain JAX layers as ETP ops: ``lax.conv_general_dilated`` and ``lax.dot_general``.

Users write layers with plain JAX (``brainstate.nn.Conv2d``, ``brainstate.nn.Linear``,
hand-written ``x @ W``). When the weight operand of such an equation is computed
from parameters only and its other operand carries the step's data, the executors
rebind it as the ETP primitive whose rules apply (``etp_conv_p`` / ``etp_dense_p``),
so it gets exactly the traces it would get if written with :func:`~braintrace_conv.conv`
or :func:`~braintrace_conv.dense`. Results are unchanged: the ETP primitives compute
the same function.

:func:`register_lift` adds a rule for another JAX primitive; a rule receives the
equation's operands and parameters and returns the ETP-op output, or ``None`` when
the equation does not have a form it handles (it then stays a plain op, and a
parameter reaching the state only through it is reported as instantaneous).
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

from ...conv import etp_conv_p
from ...dense import etp_dense_p


_LIFTS: dict[str, tuple[Callable, int]] = {}


def register_lift(primitive_name: str, rule: Callable, *, weight_operand: int) -> None:
    """Rebind equations of ``primitive_name`` as ETP ops.

    Args:
      primitive_name: the JAX primitive's name, e.g. ``'conv_general_dilated'``.
      rule: ``rule(operands, params) -> (etp_primitive, operands, params) or None``.
      weight_operand: index of the operand that must be computed from parameters only.
    """
    _LIFTS[primitive_name] = (rule, int(weight_operand))


def lift_rule(primitive_name: str):
    """``(rule, weight_operand)`` registered for ``primitive_name``, or ``None``."""
    return _LIFTS.get(primitive_name)


def _lift_conv(operands, params):
    return etp_conv_p, list(operands), dict(
        has_bias=False, strides=tuple(params['window_strides']),
        padding=tuple(tuple(p) for p in params['padding']),
        lhs_dilation=tuple(params['lhs_dilation']), rhs_dilation=tuple(params['rhs_dilation']),
        feature_group_count=params['feature_group_count'],
        batch_group_count=params['batch_group_count'],
        dimension_numbers=params['dimension_numbers'], precision=params['precision'],
        preferred_element_type=params['preferred_element_type'])


def _lift_dot(operands, params):
    """``x (B, in) . W`` with ``W`` as ``(in, out)`` or ``(out, in)``; other forms stay plain."""
    x, w = operands
    (x_contract, w_contract), (x_batch, w_batch) = params['dimension_numbers']
    if x.ndim != 2 or w.ndim != 2 or x_batch or w_batch or tuple(x_contract) != (1,):
        return None
    out_type = params.get('preferred_element_type')
    if out_type is not None and out_type != jnp.result_type(x, w):
        return None
    if tuple(w_contract) == (1,):
        w = lax.transpose(w, (1, 0))
    elif tuple(w_contract) != (0,):
        return None
    return etp_dense_p, [x, w], dict(has_bias=False)


register_lift('conv_general_dilated', _lift_conv, weight_operand=1)
register_lift('dot_general', _lift_dot, weight_operand=1)
