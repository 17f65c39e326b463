"""The recurrent conv cell: shapes, one step by hand, units, argument errors, and a stack that spikes."""
import functools
import math

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from jax import lax

import braintrace_conv.nn as bnn

DT = 1.0


@pytest.fixture(autouse=True)
def _seed():
    brainstate.random.seed(0)


def _np(x, unit=None):
    return np.asarray(x.to_decimal(unit) if unit is not None else x)


# =========================================================================== layers
def lax_conv(x, w, b, stride, padding, dilation, groups, dn):
    y = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
                                 feature_group_count=groups, dimension_numbers=dn,
                                 precision=lax.Precision.HIGHEST)
    if b is not None:
        shape = [1] * y.ndim
        shape[dn[2].index('C')] = -1
        y = y + b.reshape(shape)
    return y


# =========================================================================== networks
def _steady_rates(net, xs):
    neurons = list(net.nodes(bnn.Neuron).values())

    def step(x):
        net(x)
        return [n.spike().mean() for n in neurons]

    with brainstate.environ.context(dt=DT):
        rates = brainstate.transform.for_loop(step, xs)
    return [float(r[len(xs) // 2:].mean()) for r in rates]


def _bernoulli_input(T=24, B=2, seed=0):
    return jax.random.bernoulli(jax.random.PRNGKey(seed), 0.1, (T, B, 32, 32, 2)).astype(float)


def test_default_recurrent_stack_spikes():
    net = brainstate.nn.Sequential(bnn.RecurrentConvCell((32, 32, 2), 16, 3),
                                   bnn.AvgPool2d(2),
                                   bnn.RecurrentConvCell((16, 16, 16), 32, 3))
    brainstate.nn.init_all_states(net, batch_size=2)
    rates = _steady_rates(net, _bernoulli_input())
    assert all(0.02 < r < 0.4 for r in rates), rates


@pytest.mark.parametrize('layout', ['channels_last', 'channels_first'])
def test_recurrent_cell_shapes(layout):
    size = (9, 8, 3) if layout == 'channels_last' else (3, 9, 8)
    cell = bnn.RecurrentConvCell(size, 5, 3, stride=2, layout=layout)
    out = (5, 4, 5) if layout == 'channels_last' else (5, 5, 4)
    assert cell.out_size == out and cell.neuron.in_size == out
    assert cell.rec.weight.value.shape == ((3, 3, 5, 5) if layout == 'channels_last' else (5, 5, 3, 3))
    assert cell.rec.bias is None
    brainstate.nn.init_all_states(cell, batch_size=4)
    assert set(cell.states(brainstate.HiddenState).keys()) == {('neuron', 'V')}
    with brainstate.environ.context(dt=DT):
        assert cell(jnp.ones((4,) + size)).shape == (4,) + out
    brainstate.nn.init_all_states(cell)  # one sample, no batch axis
    with brainstate.environ.context(dt=DT):
        assert cell(jnp.ones(size)).shape == out
    c1 = bnn.RecurrentConvCell((10, 2), 4, 3, neuron=functools.partial(bnn.ALIF, tau=20.0))
    c3 = bnn.RecurrentConvCell((4, 4, 4, 1), 2, (1, 3, 3), padding='VALID')
    assert isinstance(c1.neuron, bnn.ALIF) and c1.out_size == (10, 4)
    assert c3.out_size == (4, 2, 2, 2)


def test_recurrent_cell_one_step_by_hand():
    cell = bnn.RecurrentConvCell((6, 5, 2), 3, 3)
    cell.ff.bias.value = jnp.array([0.1, -0.1, 0.2])
    brainstate.nn.init_all_states(cell, batch_size=2)
    V0 = jax.random.uniform(jax.random.PRNGKey(1), (2, 6, 5, 3), minval=0.0, maxval=2.0)
    cell.neuron.V.value = V0
    x = jax.random.bernoulli(jax.random.PRNGKey(2), 0.5, (2, 6, 5, 2)).astype(float)
    with brainstate.environ.context(dt=DT):
        s = cell(x)
    dn = ('NHWC', 'HWIO', 'NHWC')
    s_prev = (V0 >= 1.0).astype(V0.dtype)
    current = (lax_conv(x, cell.ff.weight.value, cell.ff.bias.value, (1, 1), 'SAME', (1, 1), 1, dn)
               + lax_conv(s_prev, cell.rec.weight.value, None, (1, 1), 'SAME', (1, 1), 1, dn))
    V1 = (V0 - s_prev) * math.exp(-DT / 10.0) + current
    np.testing.assert_allclose(cell.neuron.V.value, V1, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s, (V1 >= 1.0).astype(np.float32))
    assert 0 < float(s_prev.mean()) < 1 and 0 < float(s.mean()) < 1


def test_recurrent_cell_with_units():
    w = bnn.FanInNormal(4.0, unit=u.mV)
    cell = bnn.RecurrentConvCell(
        (8, 8, 2), 4, 3, w_init=w, rec_w_init=bnn.FanInNormal(0.5, unit=u.mV),
        neuron=lambda size: bnn.LIF(size, tau=10 * u.ms, V_th=1 * u.mV))
    brainstate.nn.init_all_states(cell, batch_size=1)
    with brainstate.environ.context(dt=1 * u.ms):
        for _ in range(3):
            s = cell(jnp.ones((1, 8, 8, 2)))
    assert u.get_unit(cell.neuron.V.value) == u.mV and s.shape == (1, 8, 8, 4)


def test_recurrent_cell_argument_errors():
    with pytest.raises(ValueError, match='in_size'):
        bnn.RecurrentConvCell((4, 4, 4, 4, 2), 3, 3)
    with pytest.raises(ValueError, match='in_size'):
        bnn.RecurrentConvCell((4, 0, 2), 3, 3)
    with pytest.raises(TypeError, match='neuron'):
        bnn.RecurrentConvCell((4, 4, 2), 3, 3, neuron=lambda size: bnn.Linear(2, 2))
