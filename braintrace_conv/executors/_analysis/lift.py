"""A captured step rewritten for the analysis: plain ops lifted, poolings folded, forward mode.

:func:`rewrite_step` re-traces a step's jaxpr twice (lifting with the forward mode,
then the pooling folds), never changing what the step computes:

* **lifting**: users write layers with plain JAX (``brainstate.nn.Conv2d``,
  ``brainstate.nn.Linear``, hand-written ``x @ W``). When the weight operand of such
  an equation is computed from parameters only and its other operand carries the
  step's data, it is rebound as the ETP primitive whose rules apply (``etp_conv_p`` /
  ``etp_dense_p``), so it gets exactly the traces it would get if written with
  :func:`~braintrace_conv.conv` or :func:`~braintrace_conv.dense`.
  :func:`register_lift` adds a rule for another JAX primitive: it receives the
  equation's operands and parameters and returns ``(etp_primitive, operands,
  params)``, or ``None`` when the equation does not have a form it handles (it then
  stays a plain op, and a parameter reaching the state only through it is reported
  as instantaneous);
* **pooling folds**: a sum or average pooling that is the only reader of an ETP op's
  output (possibly through a bias computed from parameters) becomes part of the op
  when its primitive has a ``fold_pool`` rule, so the op's output maps one to one
  onto the neurons it feeds;
* **forward mode**: a ``custom_vjp`` function gets a JVP (:func:`_forward_mode`).
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
from .jaxpr import bind_eqn, interpret, is_literal, read

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


def rewrite_step(step):
    """The closed jaxpr of ``step`` (a :class:`~.step.StepJaxpr`) with plain ops lifted,
    poolings folded into ETP ops and ``custom_vjp`` functions given a forward mode (see
    the module docstring); ``step.closed_jaxpr`` itself when nothing applies."""
    closed = _lift(step.closed_jaxpr, step.dependencies())
    return _fold_poolings(closed, dataclasses.replace(step, closed_jaxpr=closed).dependencies())


def _params_only(deps):
    """Whether a variable (or literal) is computed from parameters only."""
    return lambda v: is_literal(v) or not (deps.get(v, frozenset()) & {'h', 'x', 'y'})


def _retrace(closed, bind):
    """``closed`` evaluated with the ``bind`` hook of :func:`~.jaxpr.interpret`, as a
    new closed jaxpr."""
    jaxpr = closed.jaxpr

    def run(*args):
        env = interpret(closed, dict(zip(jaxpr.invars, args)), bind=bind)
        return [read(env, v) for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
                                 for v in jaxpr.invars])


def _lift(closed, deps):
    """Lift rules applied (weight operand from parameters only, another operand from
    states or inputs) and ``custom_vjp`` calls given a forward mode."""
    params_only = _params_only(deps)
    lifts = {}
    for i, eqn in enumerate(closed.jaxpr.eqns):
        found = lift_rule(eqn.primitive.name)
        if found is None:
            continue
        rule, w = found
        others = [v for slot, v in enumerate(eqn.invars) if slot != w]
        if params_only(eqn.invars[w]) and not all(params_only(v) for v in others):
            lifts[i] = rule
    vjp_calls = {i for i, e in enumerate(closed.jaxpr.eqns)
                 if e.primitive.name == 'custom_vjp_call'}
    if not lifts and not vjp_calls:
        return closed

    def bind(i, eqn, invals):
        lifted = lifts[i](invals, eqn.params) if i in lifts else None
        if lifted is not None:
            prim, operands, params = lifted
            return [prim.bind(*operands, **params)]
        return _forward_mode(eqn)(*invals) if i in vjp_calls else None

    return _retrace(closed, bind)


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
    """A sum/average pooling read from an ETP op's output, to fold into the op:
    ``scale * reduce_window_sum(y [+ c])``, with ``c`` (a bias) computed from
    parameters only. Fields are equation indices, the bias variable, the scale and
    the op's parameters with the pooling folded in (its ``fold_pool`` rule)."""
    reduce_eqn: int
    scale_eqn: int | None
    bias_eqn: int | None
    bias: Any
    scale: float
    params: dict


def _fold_poolings(closed, deps):
    """Poolings folded into the ETP ops they read (:func:`_pool_folds`)."""
    jaxpr = closed.jaxpr
    folds = _pool_folds(jaxpr, _params_only(deps))
    if not folds:
        return closed
    by_reduce = {fold.reduce_eqn: i for i, fold in folds.items()}
    by_bias = {fold.bias_eqn: i for i, fold in folds.items() if fold.bias_eqn is not None}
    by_scale = {fold.scale_eqn: i for i, fold in folds.items() if fold.scale_eqn is not None}
    operands, biases = {}, {}

    def bind(i, eqn, invals):
        if i in folds:                        # bound later, with the pooling
            operands[i] = invals
            return [None]
        if i in by_bias:
            biases[by_bias[i]] = invals[eqn.invars.index(folds[by_bias[i]].bias)]
            return [None]
        if i in by_reduce:
            op, fold = by_reduce[i], folds[by_reduce[i]]
            out = jaxpr.eqns[op].primitive.bind(*operands.pop(op), **fold.params)
            if fold.bias is not None:         # pool(y + c) = pool(y) + pool(c)
                shape = jaxpr.eqns[fold.bias_eqn].outvars[0].aval.shape
                c = jnp.broadcast_to(biases.pop(op), shape)
                out = out + eqn.primitive.bind(c, **eqn.params) * jnp.asarray(fold.scale, c.dtype)
            return [out]
        if i in by_scale:                     # the average's scale is in the op already
            pooled = jaxpr.eqns[folds[by_scale[i]].reduce_eqn].outvars[0]
            return [invals[eqn.invars.index(pooled)]]
        return None

    return _retrace(closed, bind)


def _pool_folds(jaxpr, params_only) -> dict:
    """``{op eqn: _PoolFold}`` for an ETP op with a ``fold_pool`` rule whose only reader
    is a ``reduce_window_sum`` -- directly, or through the addition of a parameter-only
    bias -- optionally followed by a multiplication or division by a constant scalar
    (average pooling), and whose rule accepts that pooling."""
    readers = {}
    for j, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not is_literal(v):
                readers.setdefault(v, []).append(j)
    outs = {v for v in jaxpr.outvars if not is_literal(v)}
    only_reader = lambda v: readers.get(v, [None])[0] if len(readers.get(v, [])) == 1 \
        and v not in outs else None
    folds = {}
    for i, eqn in enumerate(jaxpr.eqns):
        if not (isinstance(eqn.primitive, ETPPrimitive) and 'fold_pool' in eqn.primitive.etp_rules):
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
        if any(d != 1 for d in (*rw['base_dilation'], *rw['window_dilation'])):
            continue
        scale, k = 1.0, only_reader(jaxpr.eqns[j].outvars[0])
        if k is not None and jaxpr.eqns[k].primitive.name in ('mul', 'div'):
            a, b = jaxpr.eqns[k].invars
            c = b if a is jaxpr.eqns[j].outvars[0] else a
            if is_literal(c) and np.ndim(c.val) == 0 and \
                    (jaxpr.eqns[k].primitive.name == 'mul' or b is c):
                scale = float(c.val)
                scale = scale if jaxpr.eqns[k].primitive.name == 'mul' else 1.0 / scale
            else:
                k = None
        else:
            k = None
        params = eqn.primitive.rule('fold_pool')(
            dict(eqn.params), tuple(rw['window_dimensions']), tuple(rw['window_strides']),
            tuple(tuple(p) for p in rw['padding']), scale)
        if params is not None:
            folds[i] = _PoolFold(j, k, bias_eqn, bias, scale, params)
    return folds
