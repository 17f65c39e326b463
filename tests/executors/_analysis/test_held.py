"""The dynamics at rest (``held.py``): every function differentiated as its value changes.

One neuron ``v' = 0.9 v + f(v - 1) + y`` per spike-like or smooth ``f``, written each way
the rule distinguishes (JAX's own primitives, ``stop_gradient``, ``custom_jvp``,
``custom_vjp``, a primitive from outside JAX), and ``Dbar`` at rest compared with the
derivative of ``f``'s value there (float64).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

import braintrace_conv as bc
from braintrace_conv.executors._analysis import held, spectrum
from braintrace_conv.executors._analysis.graph import analyse
from braintrace_conv.executors._analysis.step import capture_step

pytestmark = pytest.mark.usefixtures('float64')


def _primitive(name, value, derivative):
    """An elementwise primitive from outside JAX: ``value(x)`` with the JVP
    ``derivative(x) * dx``, lowered from ``value``."""
    prim = jex_core.Primitive(name)
    prim.def_impl(value)
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    ad.primitive_jvps[prim] = lambda p, t: (prim.bind(p[0]), derivative(p[0]) * t[0])
    batching.primitive_batchers[prim] = lambda args, dims: (prim.bind(args[0]), dims[0])
    mlir.register_lowering(prim, mlir.lower_fun(value, multiple_results=False))
    return prim


heaviside = lambda x: (x > 0).astype(x.dtype)
surrogate = lambda x: 4 * jax.nn.sigmoid(4 * x) * (1 - jax.nn.sigmoid(4 * x))
SPIKE_P = _primitive('test_spike', heaviside, surrogate)
SMOOTH_P = _primitive('test_softplus', jax.nn.softplus, jax.nn.sigmoid)
LYING_P = _primitive('test_lying_softplus', jax.nn.softplus, lambda x: 3 * jax.nn.sigmoid(x))


@jax.custom_jvp
def custom_spike(x):
    return heaviside(x)


custom_spike.defjvp(lambda p, t: (custom_spike(p[0]), surrogate(p[0]) * t[0]))


@jax.custom_vjp
def custom_vjp_spike(x):
    return heaviside(x)


custom_vjp_spike.defvjp(lambda x: (heaviside(x), x), lambda x, g: (g * surrogate(x),))


@jax.custom_jvp
def safe_softplus(x):
    """A smooth function with a custom derivative (its own): linearised, not held."""
    return jnp.logaddexp(x, 0.0)


safe_softplus.defjvp(lambda p, t: (safe_softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))

# Dbar is taken at the second step from v = 0 with zero input: at v = 0.1 softplus(-1)
SLOPE_AT_REST = float(jax.nn.sigmoid(0.1 * jax.nn.softplus(-1.0) - 1.0))
FUNCTIONS = {   # name: (f, d f(value)/dv at rest)
    'jax comparison': (heaviside, 0.0),
    'straight-through': (lambda x: jax.nn.sigmoid(4 * x)
                         + lax.stop_gradient(heaviside(x) - jax.nn.sigmoid(4 * x)), 0.0),
    'custom_jvp spike': (custom_spike, 0.0),
    'custom_vjp spike': (custom_vjp_spike, 0.0),
    'foreign spike': (SPIKE_P.bind, 0.0),
    'custom_jvp smooth': (safe_softplus, SLOPE_AT_REST),
    'foreign smooth': (SMOOTH_P.bind, SLOPE_AT_REST),
    'detached smooth': (lambda x: lax.stop_gradient(jax.nn.softplus(x)), SLOPE_AT_REST),
}


class Neuron(brainstate.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f
        self.fc = bc.nn.Linear(2, 3)

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, 3)))

    def update(self, x):
        self.v.value = 0.9 * self.v.value + 0.1 * self.f(self.v.value - 1.0) + self.fc(x)
        return self.v.value


def rest_jacobian(f):
    model = Neuron(f)
    brainstate.nn.init_all_states(model, 2)
    (Dbar,) = spectrum.mean_state_jacobians(analyse(capture_step(model, jnp.zeros((2, 2)))))
    return float(Dbar[0, 0])


@pytest.mark.parametrize('name', FUNCTIONS)
def test_each_function_adds_the_derivative_of_its_value(name):
    f, slope = FUNCTIONS[name]
    assert rest_jacobian(f) == pytest.approx(0.9 + 0.1 * slope, abs=1e-12)


def test_a_foreign_primitive_whose_derivative_is_not_that_of_its_value_is_refused():
    with pytest.raises(ValueError, match=r"cannot tell what test_lying_softplus computes .*"
                                         r"pass ES_D_RTRL\(model, decay=\.\.\.\)"):
        rest_jacobian(LYING_P.bind)


def test_a_spike_at_its_threshold_is_refused_rather_than_linearised():
    """At rest the potential sits on a foreign spike's step: neither constant nor smooth."""
    model = Neuron(lambda x: SPIKE_P.bind(x + 1.0))
    brainstate.nn.init_all_states(model, 2)
    with pytest.raises(ValueError, match='cannot tell what test_spike computes'):
        bc.ES_D_RTRL(model).value_and_grad(lambda o, t: jnp.sum(o), jnp.ones((3, 2, 2)),
                                           jnp.zeros((3, 2)))


def test_jax_primitives_are_not_foreign_and_others_are():
    assert not held.is_foreign(lax.add_p) and not held.is_foreign(lax.exp_p)
    assert held.is_foreign(SPIKE_P)
