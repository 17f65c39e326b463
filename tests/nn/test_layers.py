"""Layers against lax: convolutions of every rank and layout, linear, flatten, pooling, and a
default conv stack that spikes."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from jax import lax

import braintrace_conv.nn as bnn
from braintrace_conv.nn import layers as layers_mod

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


CONV_CASES = [
    # rank, layout, kwargs
    (1, 'channels_last', dict(kernel_size=3, stride=2, padding='SAME')),
    (1, 'channels_first', dict(kernel_size=(4,), dilation=2, padding='VALID', groups=2)),
    (2, 'channels_last', dict(kernel_size=3)),
    (2, 'channels_first', dict(kernel_size=3)),
    (2, 'channels_last', dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2),
                              padding=((1, 0), (2, 1)), groups=2)),
    (2, 'channels_first', dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2),
                               padding=((1, 0), (2, 1)), groups=2)),
    (2, 'channels_first', dict(kernel_size=3, padding=1, groups=4, bias=False)),
    (3, 'channels_last', dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding='VALID', groups=2)),
    (3, 'channels_first', dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding='VALID', groups=2)),
]


@pytest.mark.parametrize('rank, layout, kw', CONV_CASES)
def test_conv_matches_lax(rank, layout, kw):
    cls = {1: bnn.Conv1d, 2: bnn.Conv2d, 3: bnn.Conv3d}[rank]
    layer = cls(4, 8, layout=layout, b_init=lambda s: jnp.linspace(-1, 1, s[0]), **kw)
    spatial = {1: (9,), 2: (9, 8), 3: (5, 6, 4)}[rank]
    shape = (2,) + (spatial + (4,) if layout == 'channels_last' else (4,) + spatial)
    x = jax.random.normal(jax.random.PRNGKey(rank), shape)
    y = layer(x)
    ks = layer.kernel_size
    pad = layer.padding
    ref = lax_conv(x, layer.weight.value, None if layer.bias is None else layer.bias.value,
                   layer.stride, pad, layer.dilation, layer.groups, layer.dimension_numbers)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    expect_w = (ks + (4 // layer.groups, 8) if layout == 'channels_last'
                else (8, 4 // layer.groups) + ks)
    assert layer.weight.value.shape == expect_w
    assert isinstance(layer.weight, brainstate.ParamState)
    assert (layer.bias is None) == (kw.get('bias') is False)
    out_spatial = y.shape[1:-1] if layout == 'channels_last' else y.shape[2:]
    assert layer.output_spatial_shape(spatial) == out_spatial


def test_conv_accepts_one_sample_without_batch_axis():
    layer = bnn.Conv1d(3, 2, 3, layout='channels_first')
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 6))
    np.testing.assert_allclose(layer(x[1]), layer(x)[1], rtol=1e-5, atol=1e-5)


def test_conv_channels_first_uses_transposed_initialiser():
    brainstate.random.seed(3)
    last = bnn.Conv2d(3, 6, (3, 2), groups=3)
    brainstate.random.seed(3)
    first = bnn.Conv2d(3, 6, (3, 2), groups=3, layout='channels_first')
    np.testing.assert_array_equal(first.weight.value, jnp.transpose(last.weight.value, (3, 2, 0, 1)))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 5, 3))
    np.testing.assert_allclose(first(jnp.moveaxis(x, -1, 1)), jnp.moveaxis(last(x), -1, 1),
                               rtol=1e-5, atol=1e-5)


def test_params_enter_only_through_etp_ops(monkeypatch):
    calls = []

    def spy(real):
        def wrapped(*args, **kwargs):
            calls.append(args)
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(layers_mod, 'conv', spy(layers_mod.conv))
    monkeypatch.setattr(layers_mod, 'dense', spy(layers_mod.dense))
    conv = bnn.Conv2d(2, 3, 3)
    lin = bnn.Linear(4, 5)
    conv(jnp.ones((1, 4, 4, 2)))
    lin(jnp.ones((1, 4)))
    assert calls[0][1] is conv.weight.value and calls[0][2] is conv.bias.value
    assert calls[1][1] is lin.weight.value and calls[1][2] is lin.bias.value
    assert len(conv.states(brainstate.ParamState)) == len(lin.states(brainstate.ParamState)) == 2


def test_conv_and_linear_argument_errors():
    with pytest.raises(ValueError, match='kernel_size must have 2 entries'):
        bnn.Conv2d(2, 4, (3, 3, 3))
    with pytest.raises(ValueError, match='groups'):
        bnn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match='layout'):
        bnn.Conv2d(2, 4, 3, layout='NHWC')
    with pytest.raises(ValueError, match='padding'):
        bnn.Conv2d(2, 4, 3, padding='FULL')
    with pytest.raises(ValueError, match='stride'):
        bnn.Conv1d(2, 4, 3, stride=0)
    with pytest.raises(TypeError, match='dilation'):
        bnn.Conv1d(2, 4, 3, dilation=1.5)
    with pytest.raises(ValueError, match='in_channels'):
        bnn.Conv1d(0, 4, 3)
    with pytest.raises(ValueError, match='w_init must have shape'):
        bnn.Conv1d(2, 4, 3, w_init=jnp.ones((3, 4, 2)))
    layer = bnn.Conv2d(2, 4, 3)
    with pytest.raises(ValueError, match='input channels'):
        layer(jnp.ones((1, 5, 5, 3)))
    with pytest.raises(ValueError, match='rank'):
        layer(jnp.ones((5, 5)))
    with pytest.raises(ValueError, match='smaller than'):
        bnn.Conv2d(2, 4, 5, padding='VALID').output_spatial_shape((3, 3))
    with pytest.raises(ValueError, match='out_features'):
        bnn.Linear(3, -1)


def test_layer_padding_forms():
    # the conv normaliser with the layers' int shorthands and no cropping
    assert bnn.Conv2d(2, 4, 3, padding=1).padding == ((1, 1), (1, 1))
    assert bnn.Conv2d(2, 4, 3, padding=(1, (0, 2))).padding == ((1, 1), (0, 2))
    assert bnn.Conv2d(2, 4, 3, padding='same_lower').padding == 'SAME_LOWER'
    assert bnn.AvgPool2d(2, padding='same').padding == 'SAME'
    with pytest.raises(ValueError, match='non-negative'):
        bnn.Conv2d(2, 4, 3, padding=-1)
    with pytest.raises(TypeError, match=r'an int, 2 ints or 2 \(low, high\) int pairs'):
        bnn.Conv2d(2, 4, 3, padding=1.5)
    with pytest.raises(ValueError, match='must have 2'):
        bnn.Conv2d(2, 4, 3, padding=(1, 1, 1))
    with pytest.raises(ValueError, match='input features'):
        bnn.Linear(3, 2)(jnp.ones((1, 4)))


def test_linear_matches_matmul_and_units():
    lin = bnn.Linear(4, 3, b_init=jnp.array([0.1, -0.2, 0.3]))
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 4))
    ref = x @ lin.weight.value + lin.bias.value
    np.testing.assert_allclose(lin(x), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin(x[0]), ref[0], rtol=1e-5, atol=1e-6)
    assert bnn.Linear(4, 3, bias=False).bias is None
    lin_mv = bnn.Linear(4, 3, w_init=bnn.FanInNormal(2.0, unit=u.mV))
    assert u.get_unit(lin_mv(x)) == u.mV and u.get_unit(lin_mv.bias.value) == u.mV


def test_flatten():
    x = jnp.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(bnn.Flatten()(x), x.reshape(2, 60))
    np.testing.assert_array_equal(bnn.Flatten(start_axis=-3)(x[0]), x[0].reshape(60))
    assert u.get_unit(bnn.Flatten()(x * u.mV)) == u.mV
    with pytest.raises(ValueError, match='start_axis'):
        bnn.Flatten(start_axis=4)(x)
    with pytest.raises(TypeError, match='start_axis'):
        bnn.Flatten(start_axis=1.0)


def test_avgpool():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 4, 3))
    ref = np.asarray(x).reshape(2, 3, 2, 2, 2, 3).mean(axis=(2, 4))
    np.testing.assert_allclose(bnn.AvgPool2d(2)(x), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(bnn.AvgPool((2, 2))(x[0]), ref[0], rtol=1e-6, atol=1e-6)
    cf = bnn.AvgPool2d((2, 2), layout='channels_first')(jnp.moveaxis(x, -1, 1))
    np.testing.assert_allclose(cf, np.moveaxis(ref, -1, 1), rtol=1e-6, atol=1e-6)
    # 1-D, overlapping windows with padding counted as zeros
    x1 = jnp.arange(1.0, 6.0).reshape(1, 5, 1)
    y1 = bnn.AvgPool1d(3, stride=2, padding=1)(x1)
    np.testing.assert_allclose(y1[0, :, 0], [(0 + 1 + 2) / 3, (2 + 3 + 4) / 3, (4 + 5 + 0) / 3])
    y3 = bnn.AvgPool3d(2)(jnp.ones((1, 4, 4, 4, 2)) * u.mV)
    assert y3.shape == (1, 2, 2, 2, 2) and u.get_unit(y3) == u.mV
    assert not bnn.AvgPool2d(2).states(brainstate.ParamState)
    # differentiable (also under jit): the gradient spreads 1 / window over each window
    g = jax.grad(lambda x: jax.jit(bnn.AvgPool2d(2))(x).sum())(x)
    np.testing.assert_allclose(g, np.full(x.shape, 0.25))
    with pytest.raises(TypeError, match='tuple'):
        bnn.AvgPool(2)
    with pytest.raises(ValueError, match='rank'):
        bnn.AvgPool2d(2)(jnp.ones((4, 4)))


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


@pytest.mark.parametrize('neuron', [bnn.LIF, bnn.ALIF])
def test_default_conv_stack_spikes(neuron):
    net = brainstate.nn.Sequential(bnn.Conv2d(2, 16, 3), neuron((32, 32, 16)),
                                   bnn.Conv2d(16, 32, 3), neuron((32, 32, 32)))
    brainstate.nn.init_all_states(net, batch_size=2)
    rates = _steady_rates(net, _bernoulli_input())
    assert all(0.02 < r < 0.3 for r in rates), rates
