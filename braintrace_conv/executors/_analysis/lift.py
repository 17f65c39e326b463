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

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...conv import etp_conv_p
from ...dense import etp_dense_p
from ...primitive import ETPPrimitive
from .jaxpr import bind_eqn, is_literal

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


def lift_plain_ops(step):
    """Re-trace ``closed`` with plain ops rebound as ETP ops where a lift rule applies
    (weight operand from parameters only, data operand from states or inputs),
    sum/average pooling right after a convolution folded into it, and ``custom_vjp``
    functions given a forward-mode rule (:func:`_forward_mode`)."""
    closed = step.closed_jaxpr
    jaxpr = closed.jaxpr
    deps = step.dependencies()
    params_only = lambda v: is_literal(v) or not (deps.get(v, frozenset()) & {'h', 'x', 'y'})
    lifts = {}
    for i, eqn in enumerate(jaxpr.eqns):
        found = lift_rule(eqn.primitive.name)
        if found is None:
            continue
        rule, w = found
        others = [v for p, v in enumerate(eqn.invars) if p != w]
        if params_only(eqn.invars[w]) and not all(params_only(v) for v in others):
            lifts[i] = rule
    convs = {i for i, e in enumerate(jaxpr.eqns)
             if e.primitive is etp_conv_p or (i in lifts and e.primitive.name == 'conv_general_dilated')}
    folds = _pool_folds(jaxpr, convs, params_only)
    vjp_calls = {i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == 'custom_vjp_call'}
    if not lifts and not folds and not vjp_calls:
        return closed

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        read = lambda v: v.val if is_literal(v) else env[v]
        pending, skip = {}, set()
        for i, eqn in enumerate(jaxpr.eqns):
            if i in skip:
                continue
            if i in pending:                   # the pooling of a folded convolution
                (prim, operands, params), fold = pending.pop(i)
                out = prim.bind(*operands, **params, pool=fold.pool)
                if fold.bias is not None:      # pool(y + c) = pool(y) + pool(c)
                    shape = jaxpr.eqns[fold.bias_eqn].outvars[0].aval.shape
                    c = jnp.broadcast_to(read(fold.bias), shape)
                    scale = jnp.asarray(fold.pool[3], c.dtype)
                    out = out + eqn.primitive.bind(c, **eqn.params) * scale
                last = jaxpr.eqns[fold.scale_eqn] if fold.scale_eqn is not None else eqn
                skip.add(fold.scale_eqn)
                env[last.outvars[0]] = out
                continue
            invals = [read(v) for v in eqn.invars]
            bound = lifts[i](invals, eqn.params) if i in lifts else None
            if bound is None and isinstance(eqn.primitive, ETPPrimitive):
                bound = eqn.primitive, invals, dict(eqn.params)
            if i in folds:                     # bind later, with the pooling
                pending[folds[i].reduce_eqn] = (bound, folds[i])
                skip.add(folds[i].bias_eqn)
                continue
            if bound is not None:
                outs = [bound[0].bind(*bound[1], **bound[2])]
            elif i in vjp_calls:
                outs = _forward_mode(eqn)(*invals)
            else:
                outs = bind_eqn(eqn, invals)
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    return jax.make_jaxpr(run)(*specs)


def _forward_mode(eqn):
    """A ``custom_vjp`` call as a ``custom_jvp`` function with the same value, whose JVP
    is the transpose of the user's VJP.

    The online executors differentiate a step forward in time, which JAX refuses
    through ``custom_vjp``. A VJP rule is linear in the cotangent, so its transpose is
    the JVP that BPTT implicitly uses: D-RTRL stays exact, whatever the function (a
    spike with a surrogate derivative, typically). Reverse mode through the new
    function transposes that JVP back to the user's VJP.
    """
    @jax.custom_jvp
    def call(*args):
        return bind_eqn(eqn, list(args))

    @call.defjvp
    def jvp(primals, tangents):
        outs, vjp = jax.vjp(call.fun, *primals)
        out_tangents, = jax.linear_transpose(vjp, outs)(tuple(tangents))
        return outs, out_tangents

    return call


@dataclasses.dataclass(frozen=True)
class _PoolFold:
    """A sum/average pooling read from a convolution's output, to fold into the op:
    ``scale * reduce_window_sum(y [+ c])``, with ``c`` (a bias) computed from
    parameters only. Fields are equation indices, the bias variable and the op's
    ``pool`` parameter ``(window, strides, padding, scale)``."""
    reduce_eqn: int
    scale_eqn: int | None
    bias_eqn: int | None
    bias: Any
    pool: tuple


def _pool_folds(jaxpr, convs, params_only) -> dict:
    """``{conv eqn: _PoolFold}`` for a convolution whose only reader is a
    ``reduce_window_sum`` over spatial axes -- directly, or through the addition of a
    parameter-only bias -- optionally followed by a multiplication or division by a
    constant scalar (average pooling)."""
    readers = {}
    for j, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not is_literal(v):
                readers.setdefault(v, []).append(j)
    outs = {v for v in jaxpr.outvars if not is_literal(v)}
    only_reader = lambda v: readers.get(v, [None])[0] if len(readers.get(v, [])) == 1 \
        and v not in outs else None
    folds = {}
    for i in sorted(convs):
        eqn = jaxpr.eqns[i]
        if eqn.params.get('pool') is not None:
            continue
        y, bias_eqn, bias = eqn.outvars[0], None, None
        j = only_reader(y)
        if j is not None and jaxpr.eqns[j].primitive.name == 'add':
            a, b = jaxpr.eqns[j].invars
            c = b if a is y else a
            if c is y or not params_only(c):
                continue
            bias_eqn, bias, y = j, c, jaxpr.eqns[j].outvars[0]
            j = only_reader(y)
        if j is None or jaxpr.eqns[j].primitive.name != 'reduce_window_sum':
            continue
        rw = jaxpr.eqns[j].params
        spec = eqn.params['dimension_numbers'].out_spec
        window, strides = tuple(rw['window_dimensions']), tuple(rw['window_strides'])
        padding = tuple(tuple(p) for p in rw['padding'])
        if any(d != 1 for d in (*rw['base_dilation'], *rw['window_dilation'])) or \
                any(window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0) for a in spec[:2]):
            continue
        scale, k = 1.0, only_reader(jaxpr.eqns[j].outvars[0])
        if k is not None and jaxpr.eqns[k].primitive.name in ('mul', 'div'):
            a, b = jaxpr.eqns[k].invars
            c = b if a is jaxpr.eqns[j].outvars[0] else a
            if is_literal(c) and np.ndim(c.val) == 0 and \
                    (jaxpr.eqns[k].primitive.name == 'mul' or b is c):
                scale = float(c.val) if jaxpr.eqns[k].primitive.name == 'mul' else 1.0 / float(c.val)
            else:
                k = None
        else:
            k = None
        folds[i] = _PoolFold(j, k, bias_eqn, bias, (window, strides, padding, scale))
    return folds
