"""Which undeclared primitives count as elementwise: read from their definitions."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

import braintrace_conv as bc
from braintrace_conv.executors._analysis.positions import acts_elementwise, propagate
from snn_reference import xent


def _eqn(fn, *args):
    return jax.make_jaxpr(fn)(*args).jaxpr.eqns[-1]


def _primitive(name, impl, jvp=None):
    prim = Primitive(name)
    prim.def_impl(impl)
    prim.def_abstract_eval(lambda x: x)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))
    if jvp is not None:
        ad.primitive_jvps[prim] = jvp
    return prim


square = _primitive('test_square', lambda x: x * x,
                    lambda p, t: (p[0] * p[0], 2 * p[0] * t[0]))
running_sum = _primitive('test_running_sum', lambda x: jnp.cumsum(x, axis=-1),
                         lambda p, t: (jnp.cumsum(p[0], -1), jnp.cumsum(t[0], -1)))
# elementwise values, but a JVP rule that moves tangents to the neighbouring element
shifted_tangent = _primitive('test_shifted_tangent', lambda x: x * x,
                             lambda p, t: (p[0] * p[0], jnp.roll(t[0], 1, axis=-1)))
no_definition = Primitive('test_lowering_only')
no_definition.def_abstract_eval(lambda x: x)
mlir.register_lowering(no_definition, mlir.lower_fun(jnp.tanh, multiple_results=False))
ad.primitive_jvps[no_definition] = lambda p, t: (no_definition.bind(p[0]),
                                                 t[0] / jnp.cosh(p[0]) ** 2)

X = jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)


def _positions_kept(fn, x):
    """Whether the position analysis carries every element of ``fn(x)`` from ``x``'s own."""
    jaxpr = jax.make_jaxpr(fn)(x).jaxpr
    ident = np.arange(x.size).reshape(x.shape)
    reach = propagate(jaxpr, {jaxpr.invars[0]: ident}, {})
    return reach.mixing is None and np.array_equal(reach.index[jaxpr.outvars[0]], ident)


def test_ecosystem_primitives_are_elementwise():
    # braintools' spike binds its own primitive; saiunit's exprel is a primitive in some
    # versions and a custom_jvp function in others: either way no declaration is needed
    braintools = pytest.importorskip('braintools')
    import saiunit as u
    assert _positions_kept(braintools.surrogate.Sigmoid(), X)
    assert _positions_kept(lambda x: u.math.exprel(x), X)
    assert not _positions_kept(lambda x: jnp.cumsum(x, axis=-1), X)


@pytest.mark.parametrize('prim, expected', [(square, True), (running_sum, False),
                                            (shifted_tangent, False), (no_definition, False)])
def test_a_primitive_counts_as_elementwise_only_if_its_definition_shows_it(prim, expected):
    assert acts_elementwise(_eqn(prim.bind, X)) is expected


class Neuron(brainstate.nn.Module):
    """dense -> h = 0.8 h + y -> an activation written as a primitive -> readout."""

    def __init__(self, activation):
        super().__init__()
        rng = np.random.default_rng(0)
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 4))))
        self.R = brainstate.ParamState(jnp.asarray(rng.normal(size=(4, 2))))
        self.activation = activation

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 4)))

    def update(self, x):
        self.h.value = self.activation.bind(0.8 * self.h.value + bc.dense(x, self.W.value))
        return self.h.value @ self.R.value


def _grads(prim, learner):
    net = Neuron(prim)
    brainstate.nn.init_all_states(net, 2)
    xs = jnp.asarray(np.random.default_rng(1).normal(size=(4, 2, 3)), jnp.float32)
    return learner(net).value_and_grad(xent, xs, jnp.zeros((4, 2), int))[1]


@pytest.mark.parametrize('prim', [running_sum, no_definition])
def test_an_undeclared_primitive_is_refused_naming_it_and_the_declaration(prim):
    with pytest.raises(ValueError, match=rf"{prim.name}, which is not known to act element by "
                                         rf"element.*register_elementwise\('{prim.name}'\)"):
        _grads(prim, bc.D_RTRL)


def test_a_declared_primitive_is_accepted(monkeypatch):
    from braintrace_conv.executors._analysis import positions
    monkeypatch.setattr(positions, '_ELEMENTWISE', set(positions._ELEMENTWISE))
    bc.register_elementwise(no_definition.name)
    exact = _grads(no_definition, bc.D_RTRL)
    ref = _grads(no_definition, bc.BPTT)
    for key in ref:
        np.testing.assert_allclose(exact[key], ref[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad, error, match', [
    (42, TypeError, 'takes a JAX primitive or its name'),
    ('', TypeError, 'takes a JAX primitive or its name'),
    ('no_such_primitive', ValueError, "no JAX primitive named 'no_such_primitive' is known")])
def test_a_declaration_of_no_primitive_is_refused(bad, error, match):
    with pytest.raises(error, match=match):
        bc.register_elementwise(bad)


def test_a_primitive_object_can_be_declared(monkeypatch):
    from braintrace_conv.executors._analysis import positions
    monkeypatch.setattr(positions, '_ELEMENTWISE', set(positions._ELEMENTWISE))
    bc.register_elementwise(no_definition)
    _grads(no_definition, bc.D_RTRL)            # refused before the declaration
