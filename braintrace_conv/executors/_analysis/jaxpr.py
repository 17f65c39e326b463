"""Walking a step's jaxpr: evaluation with hooks, sub-jaxprs, dependencies.

Everything that reads raw jaxpr equations lives here, in :mod:`.positions`
(which element each value comes from), in :mod:`.step` and :mod:`.lift` (which rewrite
the captured step) and in :mod:`.graph` (the analysis). The executors read the
analysis (:class:`.graph.StepGraph`, its ops, groups and cuts); ES-D-RTRL also asks
which operands' gradients involve an op's input. :func:`interpret` is the one
interpreter of a step: plain, perturbed, partial or rebound.
"""
from __future__ import annotations

from jax.extend import core as jex_core

from ...primitive import ETPPrimitive


def is_literal(v) -> bool:
    return isinstance(v, jex_core.Literal)


def sub_jaxpr(eqn):
    """The jaxpr of a call-like equation (pjit, custom_jvp_call, ...), or None."""
    for key in ('call_jaxpr', 'jaxpr', 'fun_jaxpr'):
        sub = eqn.params.get(key)
        if isinstance(sub, jex_core.ClosedJaxpr):
            return sub.jaxpr
        if isinstance(sub, jex_core.Jaxpr):
            return sub
    return None


def contains_etp(jaxpr) -> bool:
    """Whether any equation of ``jaxpr`` (or of its sub-jaxprs) is an ETP op."""
    for eqn in jaxpr.eqns:
        if isinstance(eqn.primitive, ETPPrimitive):
            return True
        sub = sub_jaxpr(eqn)
        if sub is not None and contains_etp(sub):
            return True
    return False


def depends_on(jaxpr, target, sources: set) -> bool:
    """Whether jaxpr variable ``target`` is computed from any of ``sources``."""
    return target in reached_from(jaxpr, sources)


def reached_from(jaxpr, sources: set) -> set:
    """Every variable of ``jaxpr`` computed from ``sources``, output by output through
    calls and the branches of a ``cond`` (e.g. ``lax.platform_dependent``), so an output
    that no branch computes from the sources is not reached."""
    reached = set(sources)
    for eqn in jaxpr.eqns:
        hits = [not is_literal(v) and v in reached for v in eqn.invars]
        if not any(hits):
            continue
        branches = eqn.params.get('branches')
        subs = [(b.jaxpr, 1) for b in branches] if branches is not None and not hits[0] else \
            [(sub_jaxpr(eqn), 0)] if sub_jaxpr(eqn) is not None else []
        if not subs or any(len(sub.invars) + off != len(eqn.invars) for sub, off in subs):
            reached |= set(eqn.outvars)
            continue
        for sub, off in subs:
            inner = reached_from(sub, {sub.invars[i - off] for i, hit in enumerate(hits)
                                       if hit and i >= off})
            reached |= {o for o, so in zip(eqn.outvars, sub.outvars)
                        if not is_literal(so) and so in inner}
    return reached


def dependency_sets(jaxpr, sources: dict) -> dict:
    """For every variable, the set of source kinds it is computed from.

    Args:
      jaxpr: the jaxpr.
      sources: ``{input variable: kinds}``, the kinds (any hashable labels) each input
        stands for.

    Returns:
      ``{variable: frozenset of kinds}``; the outputs of an ETP op also carry ``'y'``.
    """
    deps = {v: frozenset(kinds) for v, kinds in sources.items()}
    for eqn in jaxpr.eqns:
        d = frozenset().union(*[deps.get(v, frozenset()) for v in eqn.invars if not is_literal(v)])
        if isinstance(eqn.primitive, ETPPrimitive):
            d = d | {'y'}
        for v in eqn.outvars:
            deps[v] = d
    return deps


def read(env: dict, v):
    """The value of variable or literal ``v`` in ``env`` (``None`` where unknown)."""
    return v.val if is_literal(v) else env.get(v)


def interpret(closed, inputs: dict, *, bind=None, write=None) -> dict:
    """Evaluate a closed jaxpr equation by equation, with hooks.

    Args:
      closed: a ``ClosedJaxpr``.
      inputs: ``{input variable: value}``; a variable left out is unknown (``None``).
      bind: ``bind(i, eqn, invals) -> outputs or None``, asked first for equation
        ``i`` with its operand values (``None`` where unknown): a list of outputs
        stands for the equation's, ``None`` binds the equation to ``invals``.
      write: ``write(var, value) -> value``, applied to every given input and every
        equation output as it is stored.

    Returns:
      The environment ``{variable: value}``; read it with :func:`read`.
    """
    jaxpr = closed.jaxpr
    env = dict(zip(jaxpr.constvars, closed.consts))
    store = (lambda v, val: val) if write is None else write
    for v, val in inputs.items():
        env[v] = store(v, val)
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(env, v) for v in eqn.invars]
        outs = None if bind is None else bind(i, eqn, invals)
        if outs is None:
            outs = bind_eqn(eqn, invals)
        for v, val in zip(eqn.outvars, outs):
            env[v] = store(v, val)
    return env


def bind_eqn(eqn, invals) -> list:
    """Re-bind one jaxpr equation to new operands; always returns a list of outputs."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)  # older JAX: a pair
    outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]
