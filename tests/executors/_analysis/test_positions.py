"""Positions (``positions.py``): which element each value comes from, and which
undeclared primitives count as elementwise, read from their definitions."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

import braintrace_conv as bc
from braintrace_conv.executors._analysis.positions import MIXED, acts_elementwise, propagate
from snn_reference import xent


# ----------------------------------------------------------------------------- positions
def _reach(fn, *args, **kw):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    source = jaxpr.invars[0]
    ident = np.arange(source.aval.size).reshape(source.aval.shape)
    return jaxpr, ident, propagate(jaxpr, {source: ident}, {}, **kw)


def test_positions_follow_elementwise_ops_reshapes_and_transposes():
    x = jnp.ones((2, 3))
    jaxpr, ident, reach = _reach(lambda x: (jnp.tanh(2.0 * x) + 1.0).T.reshape(6), x)
    assert reach.mixing is None
    np.testing.assert_array_equal(reach.index[jaxpr.outvars[0]], ident.T.reshape(6))


def test_a_reduction_mixes_positions_and_is_named():
    jaxpr, _, reach = _reach(lambda x: jnp.sum(x, axis=1) * 2.0, jnp.ones((2, 3)))
    assert reach.mixing == 'reduce_sum'
    assert reach.index[jaxpr.outvars[0]] is MIXED
    assert jaxpr.invars[0] in reach.sinks      # the value the mixing op read


def test_a_broadcast_copies_a_position_only_when_allowed():
    fn = lambda b, x: x + b          # a per-channel bias over (batch, channel)
    b, x = jnp.ones(3), jnp.ones((2, 3))
    jaxpr, _, reach = _reach(fn, b, x, broadcast=True)
    np.testing.assert_array_equal(reach.index[jaxpr.outvars[0]], [[0, 1, 2], [0, 1, 2]])
    _, _, strict = _reach(fn, b, x)
    assert strict.mixing is not None


def test_new_hidden_values_are_recorded_as_finals():
    jaxpr = jax.make_jaxpr(lambda h: (0.5 * h, jnp.flip(h)))(jnp.ones(4)).jaxpr
    ident = np.arange(4)
    final_of = {jaxpr.outvars[0]: 0, jaxpr.outvars[1]: 1}
    reach = propagate(jaxpr, {jaxpr.invars[0]: ident}, final_of)
    np.testing.assert_array_equal(reach.finals[0], ident)
    assert reach.mixing == 'rev'               # flip reorders positions: not followed


# ----------------------------------------------------------------------------- elementwise
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


@pytest.fixture
def elementwise_registry(monkeypatch):
    """A copy of the registry ``register_elementwise`` adds to, for one test: a declaration
    cannot be undone through the public API, and later tests need the primitive
    undeclared (so this reads the module's private registry)."""
    from braintrace_conv.executors._analysis import positions
    monkeypatch.setattr(positions, '_ELEMENTWISE', set(positions._ELEMENTWISE))


def test_a_declared_primitive_is_accepted(elementwise_registry):
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


def test_a_primitive_object_can_be_declared(elementwise_registry):
    bc.register_elementwise(no_definition)
    _grads(no_definition, bc.D_RTRL)            # refused before the declaration
