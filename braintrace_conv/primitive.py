"""ETP primitives: JAX primitives that also carry the rules of an online learner.

An ETP ("eligibility-trace propagation") primitive is an ordinary
:class:`jax.extend.core.Primitive` whose every standard JAX rule is derived
from one Python implementation ``impl(*args, **params) -> array``:

* evaluation and MLIR lowering run ``impl`` itself,
* abstract evaluation is ``jax.eval_shape`` of ``impl``,
* the JVP is the JVP of ``impl`` (the primal output stays this primitive, so
  it remains visible in differentiated jaxprs),
* the transpose (for uses that are linear in some operands) is the VJP of
  ``impl`` with respect to those operands,
* batching is ``jax.vmap`` of ``impl``.

An operation that knows a better JVP or transpose passes it to
:func:`register_primitive` (``jvp=``, ``transpose=``); a transpose override may hand
the cases it does not treat to :func:`derived_transpose`.

So ``jax.jit``, ``jax.grad``, ``jax.vmap``, ``jax.lax.scan`` and BPTT work
unchanged. On top of that each primitive holds a read-only table of named
*ETP rules*, installed with :meth:`ETPPrimitive.register_etp_rules`, which the
online executors call (see ``docs/theory.md``, "rule contract"). Executors never look a
primitive up by identity: any primitive registered here with the same rules
is handled the same way.

Rule contract (``y`` is the primitive's output, ``m`` the number of values per
element at which the executors cut the state of the neurons the output feeds —
its state variables for most neurons, see ``docs/theory.md`` — arrays in the
primitive's own output layout unless said otherwise; the executors pass the
arguments by position):

=================  =============================================================
``yw_to_w``        ``(D, trace, **params) -> trace``: apply the state
                   Jacobian ``D^t`` (``(*y.shape, m, m)``) to a D-RTRL trace,
                   position by position.
``xy_to_dw``       ``(x, cotangent, weights, **params) -> dw``: the
                   weight-shaped VJP ``sum_{b,s} cotangent * dy/dtheta`` for a
                   ``cotangent`` of shape ``y.shape``.
``init_drtrl``     ``(x_aval, y_aval, weight_avals, m, **params)``: zeros of
                   the exact D-RTRL trace.
``init_pp``        ``(x_aval, y_aval, weight_avals, m, **params)``: zeros of
                   the ES-D-RTRL output trace, ``(*y.shape, m)``.
``xdf_to_trace``   ``(x, Df, weights, **params) -> trace``: the per-position
                   instantaneous term ``Df^t * dy/dtheta`` for ``Df^t`` of
                   shape ``(*y.shape, m)``.
``trace_to_dw``    ``(trace, g, weights, **params) -> dw``: contract a trace
                   with the learning signal ``g^t`` (``(*y.shape, m)``) into a
                   weight-shaped gradient.
``fold_pool``      optional, ``(params, window, strides, padding, scale) ->
                   params or None``: the op's parameters with
                   ``scale * reduce_window_sum(y)`` (``lax.reduce_window``
                   arguments in the output layout) folded into the op, or
                   ``None`` when it cannot absorb that pooling. A pooling that
                   is the only reader of the op's output is then folded in
                   before the analysis, so the op reaches its neurons one to one.
=================  =============================================================

``weights`` and ``dw`` are dicts keyed like ``trainable_invars_fn(params)``.
"""
from __future__ import annotations

import types
import warnings
from functools import partial
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

__all__ = ['ETPPrimitive', 'register_primitive', 'derived_transpose', 'STANDARD_RULES',
           'DRTRL_RULES', 'ES_DRTRL_RULES', 'weight_vjp', 'apply_state_jacobian']

#: Four rules of the rule contract (``docs/theory.md``), a name for code that lists them.
#: Nothing checks a primitive against it: an executor checks, when it analyses a model, that
#: each op has the rules that executor calls (:data:`DRTRL_RULES`, :data:`ES_DRTRL_RULES`),
#: so a primitive needs only those of the executors it is trained with.
STANDARD_RULES = ('yw_to_w', 'xy_to_dw', 'init_drtrl', 'init_pp')
#: Rules the D-RTRL executor calls.
DRTRL_RULES = ('yw_to_w', 'xy_to_dw', 'init_drtrl', 'xdf_to_trace', 'trace_to_dw')
#: Rules the ES-D-RTRL executor calls.
ES_DRTRL_RULES = ('xy_to_dw', 'init_pp')


class ETPPrimitive(jex_core.Primitive):
    """A JAX primitive with derived standard rules and a table of ETP rules.

    Create one with :func:`register_primitive`, not directly.

    Attributes:
      impl_fn: ``impl(*args, **params) -> array``, the forward computation.
      x_invar_index: position of the input ``x`` among the operands.
      linear_in_weights: ``impl`` is linear in its trainable operands jointly (a
        convolution or matrix product plus bias): gradients with respect to them,
        in BPTT too, come from the ``xy_to_dw`` rule.
    """

    def __init__(self, name: str, impl: Callable, *,
                 trainable_invars_fn: Callable[[Mapping[str, Any]], Mapping[str, int]],
                 x_invar_index: int, linear_in_weights: bool = False):
        super().__init__(name)
        self.impl_fn = impl
        self.linear_in_weights = bool(linear_in_weights)
        self.x_invar_index = int(x_invar_index)
        self._trainable_invars_fn = trainable_invars_fn
        self._rules: dict[str, Callable] = {}

    @property
    def etp_rules(self) -> Mapping[str, Callable]:
        """Read-only mapping from rule name to rule function."""
        return types.MappingProxyType(self._rules)

    def register_etp_rules(self, **rules: Callable) -> None:
        """Install (or replace) ETP rules, e.g. ``register_etp_rules(yw_to_w=f)``."""
        for name, fn in rules.items():
            if not callable(fn):
                raise TypeError(f'ETP rule {name!r} of primitive {self.name!r} must be '
                                f'callable, got {type(fn).__name__}.')
        self._rules.update(rules)

    def rule(self, name: str) -> Callable:
        """Return rule ``name``; raise a ``NotImplementedError`` naming what is missing."""
        try:
            return self._rules[name]
        except KeyError:
            raise NotImplementedError(
                f'ETP primitive {self.name!r} has no rule {name!r}; it provides '
                f'{sorted(self._rules)}. Register it with '
                f'{self.name}.register_etp_rules({name}=...).') from None

    def missing_rules(self, names) -> list[str]:
        """The names in ``names`` this primitive does not provide."""
        return [n for n in names if n not in self._rules]

    def trainable_invars(self, params: Mapping[str, Any]) -> dict[str, int]:
        """``{weight_name: operand_index}`` for the trainable operands of one bind."""
        return dict(self._trainable_invars_fn(params))


def _abstract_eval(impl, *avals, **params):
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    out = jax.eval_shape(partial(impl, **params), *structs)
    return jax.core.ShapedArray(out.shape, out.dtype)


def _jvp_rule(prim, primals, tangents, **params):
    # Differentiate only in the operands with non-zero tangents (no work on zeros).
    active = [type(t) is not ad.Zero for t in tangents]
    slots = set(prim.trainable_invars(params).values()) if prim.linear_in_weights else set()
    by_impl = [a and i not in slots for i, a in enumerate(active)]
    parts = []
    if any(a and i in slots for i, a in enumerate(active)):
        # linear in its weights: the weight tangent is the primitive itself, whose transpose
        # (the weight gradient) is then the primitive's own xy_to_dw rule
        parts.append(prim.bind(*[(ad.instantiate_zeros(t) if i in slots else p)
                                 for i, (p, t) in enumerate(zip(primals, tangents))], **params))
    if any(by_impl):
        def of_active(*values):
            it = iter(values)
            return prim.impl_fn(*[next(it) if a else p for p, a in zip(primals, by_impl)],
                                **params)

        parts.append(jax.jvp(of_active, tuple(p for p, a in zip(primals, by_impl) if a),
                             tuple(t for t, a in zip(tangents, by_impl) if a))[1])
    return prim.bind(*primals, **params), sum(parts[1:], parts[0])


def derived_transpose(prim: ETPPrimitive, cotangent, *args, **params) -> list:
    """The transpose rule :func:`register_primitive` derives for ``prim``.

    Called only where the primitive is used linearly in the undefined operands
    (``jax.interpreters.ad.UndefinedPrimal``). When those are trainable operands of a
    primitive declared ``linear_in_weights`` with an ``xy_to_dw`` rule, the rule gives
    their cotangents; otherwise they are the VJP of ``impl`` in those operands.

    Args:
      prim: the primitive.
      cotangent: the cotangent of its output.
      *args: its operands, undefined where a cotangent is wanted.
      **params: its parameters.

    Returns:
      One cotangent per operand, ``None`` for the defined ones.
    """
    undefined = [ad.is_undefined_primal(a) for a in args]
    slots = prim.trainable_invars(params)
    if prim.linear_in_weights and 'xy_to_dw' in prim.etp_rules \
            and {i for i, u in enumerate(undefined) if u} <= set(slots.values()):
        weights = {name: jnp.zeros(args[i].aval.shape, args[i].aval.dtype) if undefined[i]
                   else args[i] for name, i in slots.items()}
        dw = prim.rule('xy_to_dw')(args[prim.x_invar_index], ad.instantiate_zeros(cotangent),
                                   weights, **params)
        at = {i: name for name, i in slots.items()}
        return [dw[at[i]] if u else None for i, u in enumerate(undefined)]

    def linear_part(*lin_args):
        it = iter(lin_args)
        full = [next(it) if u else a for a, u in zip(args, undefined)]
        return prim.impl_fn(*full, **params)

    zeros = [jnp.zeros(a.aval.shape, a.aval.dtype) for a, u in zip(args, undefined) if u]
    _, vjp = jax.vjp(linear_part, *zeros)
    cts = iter(vjp(ad.instantiate_zeros(cotangent)))
    return [next(cts) if u else None for u in undefined]


def _batch_rule(impl, args, dims, **params):
    in_axes = tuple(d if isinstance(d, int) else None for d in dims)  # unmapped: None
    return jax.vmap(partial(impl, **params), in_axes=in_axes)(*args), 0


def register_primitive(name: str, impl: Callable, *,
                       trainable_invars_fn: Callable[[Mapping[str, Any]], Mapping[str, int]],
                       x_invar_index: int, linear_in_weights: bool = False,
                       jvp: Callable | None = None, transpose: Callable | None = None,
                       **removed) -> ETPPrimitive:
    """Create an :class:`ETPPrimitive` whose standard JAX rules derive from ``impl``.

    Args:
      name: primitive name, as shown in jaxprs.
      impl: ``impl(*operands, **params) -> array``, a pure JAX function.
      trainable_invars_fn: ``params -> {weight_name: operand_index}``, the
        operands the online learners compute gradients for.
      x_invar_index: operand index of the input ``x`` (the value an
        eligibility trace is built from).
      linear_in_weights: declare ``impl`` linear in the trainable operands jointly
        (for fixed ``x``). The weight tangent is then the primitive applied to the
        weight tangents, and its transpose — every weight gradient, BPTT's included
        — is the ``xy_to_dw`` rule, so a fast rule speeds up all executors.
      jvp: ``jvp(primals, tangents, **params) -> (primal_out, tangent_out)`` in place
        of the derived JVP rule (tangents may be ``jax.interpreters.ad.Zero``).
      transpose: ``transpose(cotangent, *operands, **params) -> cotangents`` in place
        of the derived transpose rule; it may return :func:`derived_transpose` for the
        cases it does not handle itself.

    Returns:
      The primitive. Add its ETP rules with ``register_etp_rules``.

    Raises:
      TypeError: for an unknown keyword argument. The former ``batched`` argument,
        which nothing read, is accepted with a ``DeprecationWarning``.
    """
    if removed.pop('batched', None) is not None:
        warnings.warn('register_primitive no longer takes batched (nothing read it); drop the '
                      'argument.', DeprecationWarning, stacklevel=2)
    if removed:
        raise TypeError(f'register_primitive() got unexpected keyword arguments '
                        f'{sorted(removed)}.')
    prim = ETPPrimitive(name, impl, trainable_invars_fn=trainable_invars_fn,
                        x_invar_index=x_invar_index, linear_in_weights=linear_in_weights)
    prim.def_impl(impl)
    prim.def_abstract_eval(partial(_abstract_eval, impl))
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))
    ad.primitive_jvps[prim] = jvp if jvp is not None else partial(_jvp_rule, prim)
    ad.primitive_transposes[prim] = (transpose if transpose is not None
                                     else partial(derived_transpose, prim))
    batching.primitive_batchers[prim] = partial(_batch_rule, impl)
    return prim


def weight_vjp(prim: ETPPrimitive, operands, cotangent, **params) -> dict:
    """``sum_{b,s} cotangent * dy/dtheta`` for every trainable operand ``theta``.

    The weight-shaped VJP of ``prim.impl_fn`` at ``operands``; the generic
    body of an ``xy_to_dw`` rule.
    """
    slots = prim.trainable_invars(params)
    names = list(slots)

    def of_weights(*ws):
        full = list(operands)
        for n, w in zip(names, ws):
            full[slots[n]] = w
        return prim.impl_fn(*full, **params)

    _, vjp = jax.vjp(of_weights, *[operands[slots[n]] for n in names])
    return dict(zip(names, vjp(cotangent)))


def apply_state_jacobian(jacobian, trace):
    """``out[..., i] = sum_j jacobian[..., i, j] * trace[..., j]``.

    Applies the per-element ``m x m`` state Jacobian ``D^t`` to an
    output-shaped trace whose last axis runs over the ``m`` cut values.
    """
    if jacobian.shape[-1] == 1:
        return jacobian[..., 0] * trace
    return jnp.sum(jacobian * trace[..., None, :], axis=-1)
