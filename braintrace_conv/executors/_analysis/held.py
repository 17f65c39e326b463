r"""The dynamics at rest: what the decay analysis differentiates, spikes held constant.

ES-D-RTRL's decays (:mod:`.spectrum`) are those of ``Dbar``, the neurons' state
Jacobian at rest with every spike held constant (``docs/theory.md``). A spike is
recognised by what it computes, not by how it is written, with one rule:

    **In the decay analysis each function of the step is differentiated as its value
    changes.** A spike's value is a step function of the membrane potential, constant
    almost everywhere, so it adds nothing to ``Dbar``; its surrogate derivative is a
    device for learning, not part of the dynamics.

Applied equation by equation (:class:`Rest`):

* JAX's own primitives by their JAX derivatives, which are those of their values (a
  comparison, a rounding or a sign has derivative zero, so a Heaviside written with
  them is constant);
* ``stop_gradient`` passes the derivative through: it changes derivatives, never
  values, so a straight-through spike ``x + stop_gradient(H(x) - x)`` is constant as
  ``H`` is, and a detached reset is differentiated like any other;
* a function with a custom derivative (``jax.custom_jvp``, ``jax.custom_vjp``: surrogate
  spikes, numerically safe forms of smooth functions) by the derivative of its own
  forward computation, read from its jaxpr with this same rule;
* a primitive from outside JAX (``braintools``' ``heaviside_surrogate_gradient``,
  another library's), whose forward computation is not a jaxpr, is probed at the
  points of the analysis (:func:`probe`): every floating operand moved by ``±delta``
  (``delta = eps^(1/3) (1 + |x|)``). Outputs that do not change make it constant
  there (a spike: held); outputs that change as its JVP says make the JVP its
  derivative; anything else is refused in one sentence naming the primitive, with
  ``ES_D_RTRL(model, decay=...)`` as the way out. It is never linearised silently.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core

from ...primitive import ETPPrimitive
from .jaxpr import bind_eqn, interpret, read, sub_jaxpr

#: How far a probe's finite difference may stray from a primitive's JVP, relative to the
#: larger of the two, for the JVP to count as the derivative of its value.
PROBE_TOLERANCE = 1e-2


_JAX_PRIMITIVES = {'modules': 0, 'found': set()}


def _jax_primitives() -> set:
    """Every primitive defined in JAX's own modules (read again when modules were imported
    since the last look)."""
    if len(sys.modules) != _JAX_PRIMITIVES['modules']:
        for name, module in list(sys.modules.items()):
            if module is not None and (name == 'jax' or name.startswith(('jax.', 'jaxlib.'))):
                _JAX_PRIMITIVES['found'].update(
                    v for v in list(vars(module).values()) if isinstance(v, jex_core.Primitive))
        _JAX_PRIMITIVES['modules'] = len(sys.modules)
    return _JAX_PRIMITIVES['found']


def is_foreign(primitive) -> bool:
    """Whether ``primitive`` comes from outside JAX (and is no ETP op): its derivative is
    whatever its author declared, so only a probe tells what its value does."""
    return not isinstance(primitive, ETPPrimitive) and primitive not in _jax_primitives()


_CUSTOM = ('custom_jvp_call', 'custom_vjp_call', 'custom_vjp_call_jaxpr')
#: Equations that call a jaxpr once with their operands (jitted helpers, rematerialised
#: blocks): the rule applies inside them.
_CALLS = ('pjit', 'jit', 'closed_call', 'core_call', 'checkpoint', 'remat')


def _call_body(eqn):
    """The closed jaxpr an equation calls with all its operands (a custom-derivative
    function's forward computation, a jitted helper), or None."""
    sub = None
    for key in ('call_jaxpr', 'fun_jaxpr', 'jaxpr'):
        value = eqn.params.get(key)
        if isinstance(value, jex_core.ClosedJaxpr):
            sub = value
            break
        if isinstance(value, jex_core.Jaxpr):
            sub = jex_core.ClosedJaxpr(value, ())
            break
    if sub is None or len(sub.jaxpr.invars) != len(eqn.invars):
        return None
    return sub


class Rest:
    """The rule of the module docstring as a ``bind`` hook of :func:`~.jaxpr.interpret`.

    Args:
      held: the foreign equations (by ``id``) found constant by :func:`probe`; the other
        probed ones keep their JVP.
      probing: instead, record each foreign equation's probe (:meth:`probes`) and bind
        it as it is.
    """

    def __init__(self, held=frozenset(), *, probing: bool = False):
        self.held = frozenset(held)
        self.probing = probing
        self.found = []     # with probing: (equation, constant flag, smooth flag)

    def bind(self, eqn, invals):
        """The outputs of ``eqn`` under the rule, or None to bind it as it is."""
        name = eqn.primitive.name
        if name == 'stop_gradient' and not self.probing:
            return [invals[0]]
        body = _call_body(eqn) if name in _CUSTOM + _CALLS else None
        if body is not None:
            if name in _CALLS and not self.probing and not _contains_rule_work(body.jaxpr):
                return None
            env = interpret(body, dict(zip(body.jaxpr.invars, invals)),
                            bind=lambda i, e, vals: self.bind(e, vals))
            return [read(env, v) for v in body.jaxpr.outvars]
        if is_foreign(eqn.primitive):
            if self.probing:
                self.found.append((eqn, *_probe_flags(eqn, invals)))
                return None
            if id(eqn) in self.held:
                return [lax.stop_gradient(o) for o in bind_eqn(eqn, invals)]
        return None


def _contains_rule_work(jaxpr) -> bool:
    """Whether a called jaxpr holds anything the rule treats differently."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == 'stop_gradient' or eqn.primitive.name in _CUSTOM \
                or is_foreign(eqn.primitive):
            return True
        sub = sub_jaxpr(eqn)
        if sub is not None and _contains_rule_work(sub):
            return True
    return False


def _probe_flags(eqn, invals):
    """``(constant, smooth)`` of one foreign equation at its operands (module docstring):
    scalar booleans, traced."""
    values = [jnp.asarray(v) for v in invals]
    floating = [i for i, v in enumerate(values) if jnp.issubdtype(v.dtype, jnp.floating)]
    outs = bind_eqn(eqn, values)
    if not floating or not any(jnp.issubdtype(o.dtype, jnp.floating) for o in outs):
        return jnp.bool_(True), jnp.bool_(True)
    deltas = [jnp.finfo(values[i].dtype).eps ** (1 / 3) * (1 + jnp.abs(values[i]))
              for i in floating]

    def moved(sign):
        vals = list(values)
        for i, d in zip(floating, deltas):
            vals[i] = values[i] + sign * d
        return bind_eqn(eqn, vals)

    def call(*moving):
        vals = list(values)
        for i, v in zip(floating, moving):
            vals[i] = v
        return bind_eqn(eqn, vals)

    plus, minus = moved(1.0), moved(-1.0)
    _, tangents = jax.jvp(call, [values[i] for i in floating], deltas)
    constant, smooth = jnp.bool_(True), jnp.bool_(True)
    for o, p, q, t in zip(outs, plus, minus, tangents):
        if not jnp.issubdtype(o.dtype, jnp.floating):
            continue
        constant &= jnp.all((p == o) & (q == o))
        difference = (p - q) / 2
        scale = jnp.maximum(jnp.abs(difference), jnp.abs(t))
        floor = 100 * jnp.finfo(o.dtype).eps * (1 + jnp.abs(o))
        smooth &= jnp.all(jnp.abs(difference - t) <= PROBE_TOLERANCE * scale + floor)
    return constant, smooth


def probe(run_steps) -> tuple:
    """Probe the foreign equations of the step at the points of the analysis.

    Args:
      run_steps: ``run_steps(rest) -> None``, evaluating the step where the analysis
        differentiates it, with ``rest`` (a probing :class:`Rest`) as the hook; it is
        traced once, under ``jax.jit``.

    Returns:
      ``(held, unclear)``: the ids of the equations constant at every point, and the
      names of the primitives that are neither constant nor differentiated by their JVP.
    """
    recorder = Rest(probing=True)

    def flags():
        run_steps(recorder)
        return [(c, s) for _, c, s in recorder.found]

    values = jax.jit(flags)()
    eqns = [eqn for eqn, _, _ in recorder.found]
    constant, smooth = {}, {}
    for eqn, (c, s) in zip(eqns, values):
        constant[id(eqn)] = constant.get(id(eqn), True) and bool(c)
        smooth[id(eqn)] = smooth.get(id(eqn), True) and bool(s)
    held = frozenset(k for k, c in constant.items() if c)
    unclear = sorted({eqn.primitive.name for eqn in eqns
                      if not constant[id(eqn)] and not smooth[id(eqn)]})
    return held, unclear
