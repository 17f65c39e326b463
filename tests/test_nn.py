"""Tests of braintrace_conv.nn: surrogates, neurons, layers, recurrent conv cell."""
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
from braintrace_conv.nn import layers as layers_mod
from braintrace_conv.nn import surrogate

DT = 1.0


@pytest.fixture(autouse=True)
def _seed():
    brainstate.random.seed(0)


@pytest.fixture
def no_dt():
    """Temporarily remove a globally set ``dt``."""
    saved = brainstate.environ.pop('dt', None)
    yield
    if saved is not None:
        brainstate.environ.set(dt=saved)


def _np(x, unit=None):
    return np.asarray(x.to_decimal(unit) if unit is not None else x)


# =========================================================================== surrogates
SURROGATES = [
    (surrogate.sigmoid, lambda a, x: a * (1 / (1 + np.exp(-a * x))) * (1 - 1 / (1 + np.exp(-a * x)))),
    (surrogate.arctan, lambda a, x: (a / 2) / (1 + (np.pi / 2 * a * x) ** 2)),
    (surrogate.fast_sigmoid, lambda a, x: 1 / (1 + a * np.abs(x)) ** 2),
]
XS = np.concatenate([np.linspace(-3, 3, 241), [0.0, 1e-6, -1e-6, 10.0, -10.0]]).astype(np.float32)


def test_heaviside_forward():
    np.testing.assert_array_equal(surrogate.heaviside(XS), (XS >= 0).astype(np.float32))
    assert surrogate.heaviside(jnp.array([0, -1, 2])).dtype == jnp.result_type(float)


@pytest.mark.parametrize('factory, formula', SURROGATES)
@pytest.mark.parametrize('alpha', [0.5, 2.0, 4.0, 10.0])
def test_surrogate_forward_and_gradient(factory, formula, alpha):
    fn = factory(alpha)
    np.testing.assert_array_equal(fn(XS), (XS >= 0).astype(np.float32))
    grad = jax.jit(jax.vmap(jax.grad(fn)))(XS)
    np.testing.assert_allclose(grad, formula(alpha, XS.astype(np.float64)), rtol=2e-5, atol=1e-7)
    # forward mode gives the same elementwise derivative, and the Jacobian is diagonal
    _, tangent = jax.jvp(fn, (XS,), (np.ones_like(XS),))
    np.testing.assert_allclose(tangent, grad, rtol=1e-6)
    jac = jax.jacfwd(fn)(XS[:7])
    np.testing.assert_allclose(jac, np.diag(np.diag(jac)))


def test_sigmoid_surrogate_keeps_relative_accuracy_far_from_threshold():
    # tiny but non-zero far from threshold, on both sides (no cancellation in 1 - S(z))
    x = np.array([-20.0, -5.0, 5.0, 20.0], np.float32)
    grad = jax.vmap(jax.grad(surrogate.sigmoid(4.0)))(x)
    z = 4.0 * x.astype(np.float64)
    reference = 4.0 / (1 + np.exp(-z)) / (1 + np.exp(z))
    assert np.all(np.asarray(grad) > 0)
    np.testing.assert_allclose(grad, reference, rtol=1e-5)


def test_surrogate_defaults_peaks_and_validation():
    assert surrogate.sigmoid() == surrogate.Sigmoid(4.0)
    assert hash(surrogate.arctan(3.0)) == hash(surrogate.Arctan(3.0))
    assert surrogate.sigmoid(4.0) != surrogate.arctan(4.0)
    assert float(jax.grad(surrogate.sigmoid(4.0))(0.0)) == pytest.approx(1.0)
    assert float(jax.grad(surrogate.arctan(2.0))(0.0)) == pytest.approx(1.0)
    for bad in (0.0, -1.0, float('nan'), '4', True):
        with pytest.raises(ValueError, match='alpha'):
            surrogate.Sigmoid(bad)
    with pytest.raises(u.DimensionMismatchError, match='dimensionless'):
        surrogate.sigmoid()(1.0 * u.mV)
    ratio = jnp.array([-2.0, 2.0]) * u.mV / (1.0 * u.volt)  # dimensionless quantity
    np.testing.assert_array_equal(surrogate.sigmoid()(ratio), [0.0, 1.0])


# =========================================================================== neurons: references
def ref_lif(xs, tau, dt, V_th, V_reset=0.0, V_rest=0.0, reset='subtract', tau_a=None, beta=0.0):
    """Step-by-step numpy reference of LIF (``tau_a=None``) / ALIF; returns spikes and states."""
    V = np.full(xs.shape[1:], V_rest, np.float64)
    a = np.zeros_like(V)
    spikes, Vs, As = [], [], []
    for x in xs:
        thr = V_th + beta * a
        s = (V >= thr).astype(float)
        V = V - (thr - V_reset) * s if reset == 'subtract' else np.where(s > 0, V_reset, V)
        if tau_a is not None:
            a = a * math.exp(-dt / tau_a) + s
        V = V_rest + (V - V_rest) * math.exp(-dt / tau) + x
        spikes.append((V >= V_th + beta * a).astype(float))
        Vs.append(V.copy())
        As.append(a.copy())
    return np.array(spikes), np.array(Vs), np.array(As)


def run_steps(neuron, xs, dt=DT, read=('V',)):
    out, states = [], {k: [] for k in read}
    with brainstate.environ.context(dt=dt):
        for x in xs:
            out.append(neuron(x))
            for k in read:
                states[k].append(getattr(neuron, k).value)
    return out, states


def test_lif_one_step_by_hand():
    lif = bnn.LIF(3, tau=10.0, V_th=1.0)
    lif.init_state()
    decay = math.exp(-0.1)
    with brainstate.environ.context(dt=1.0):
        s1 = lif(jnp.array([0.6, 1.2, 0.0]))
        np.testing.assert_allclose(lif.V.value, [0.6, 1.2, 0.0], rtol=1e-6)
        np.testing.assert_array_equal(s1, [0, 1, 0])
        s2 = lif(jnp.array([0.6, 0.0, 0.0]))
    # V stores the pre-reset value; the reset of step 1's spike is applied at step 2
    np.testing.assert_allclose(lif.V.value, [0.6 * decay + 0.6, 0.2 * decay, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(s2, [1, 0, 0])


@pytest.mark.parametrize('reset', ['subtract', 'zero'])
def test_lif_multi_step_unitless(reset):
    rng = np.random.default_rng(0)
    xs = rng.uniform(-0.2, 0.9, size=(25, 2, 3, 4)).astype(np.float32)
    lif = bnn.LIF((3, 4), tau=8.0, V_th=1.0, V_reset=-0.5, V_rest=0.1, reset=reset)
    lif.init_state(batch_size=2)
    assert lif.V.value.shape == (2, 3, 4)
    out, st = run_steps(lif, xs, dt=0.5)
    s_ref, V_ref, _ = ref_lif(xs, 8.0, 0.5, 1.0, -0.5, 0.1, reset)
    np.testing.assert_allclose(np.array(st['V']), V_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(out), s_ref)
    assert s_ref.mean() > 0.05  # the reference actually exercises the reset


@pytest.mark.parametrize('reset', ['subtract', 'zero'])
def test_lif_multi_step_with_units(reset):
    rng = np.random.default_rng(1)
    xs = rng.uniform(-0.2, 0.9, size=(20, 5)).astype(np.float32)
    lif = bnn.LIF(5, tau=10 * u.ms, V_th=1 * u.mV, V_reset=0, V_rest=-0.2 * u.mV, reset=reset)
    lif.init_state()
    assert u.get_unit(lif.V.value) == u.mV and lif.V.value.shape == (5,)
    # an input in volts has the right dimension and is added as the same voltage
    out, st = run_steps(lif, [x * 1e-3 * u.volt for x in xs], dt=1.0 * u.ms)
    s_ref, V_ref, _ = ref_lif(xs, 10.0, 1.0, 1.0, 0.0, -0.2, reset)
    np.testing.assert_allclose(np.array([_np(v, u.mV) for v in st['V']]), V_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(out), s_ref)


def test_alif_multi_step():
    rng = np.random.default_rng(2)
    xs = rng.uniform(0.0, 1.2, size=(30, 6)).astype(np.float32)
    for unit in (None, u.mV):
        w = (lambda v: v) if unit is None else (lambda v: v * unit)
        tau = (lambda t: t) if unit is None else (lambda t: t * u.ms)
        alif = bnn.ALIF(6, tau=tau(10.0), tau_a=tau(50.0), V_th=w(1.0), beta=w(0.3))
        alif.init_state()
        out, st = run_steps(alif, [w(x) for x in xs], dt=tau(1.0), read=('V', 'a'))
        s_ref, V_ref, A_ref = ref_lif(xs, 10.0, 1.0, 1.0, tau_a=50.0, beta=0.3)
        V = [v if unit is None else _np(v, unit) for v in st['V']]
        np.testing.assert_allclose(np.array(V), V_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.array(st['a']), A_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.array(out), s_ref)
        assert A_ref[-1].max() > 1.0  # adaptation took place


def test_alif_default_beta_and_zero_reset():
    alif = bnn.ALIF(2, V_th=2 * u.mV, V_reset=-1 * u.mV, tau=5 * u.ms, tau_a=20 * u.ms,
                    reset='zero')
    assert u.math.allclose(alif.beta, 0.15 * u.mV)
    alif.init_state()
    with brainstate.environ.context(dt=1 * u.ms):
        alif(jnp.array([3.0, 0.0]) * u.mV)
        alif(jnp.array([0.0, 0.0]) * u.mV)
    # neuron 0 spiked, was reset to V_reset, then decayed towards V_rest = 0
    np.testing.assert_allclose(_np(alif.V.value, u.mV), [-math.exp(-0.2), 0.0], rtol=1e-6)
    np.testing.assert_allclose(alif.a.value, [1.0, 0.0])


def test_li_multi_step():
    xs = np.random.default_rng(3).normal(size=(10, 2, 3)).astype(np.float32)
    for unit in (None, u.mV):
        li = bnn.LI(3, tau=4.0 if unit is None else 4.0 * u.ms,
                    V_rest=0.5 if unit is None else 0.5 * u.mV)
        li.init_state(batch_size=2)
        out, _ = run_steps(li, [x if unit is None else x * unit for x in xs],
                           dt=2.0 if unit is None else 2.0 * u.ms)
        V, ref = np.full((2, 3), 0.5), []
        for x in xs:
            V = 0.5 + (V - 0.5) * math.exp(-0.5) + x
            ref.append(V)
        got = [o if unit is None else _np(o, unit) for o in out]
        np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-5, atol=1e-5)


def test_lif_output_gradient_is_surrogate_of_new_state():
    lif = bnn.LIF(4, tau=10.0, V_th=1.0, V_reset=-1.0, spike_fn=surrogate.arctan(2.0))
    lif.init_state()
    x = jnp.array([0.3, 0.9, 1.1, 2.0])

    def total_spikes(x):
        lif.V.value = jnp.array([0.0, 0.5, 1.5, 0.2])
        return lif(x).sum()

    with brainstate.environ.context(dt=1.0):
        g = brainstate.transform.grad(total_spikes, argnums=0)(x)
        s_old = (np.array([0.0, 0.5, 1.5, 0.2]) >= 1).astype(float)
        V_new = (np.array([0.0, 0.5, 1.5, 0.2]) - 2 * s_old) * math.exp(-0.1) + np.array(x)
    expected = surrogate.Arctan(2.0).derivative(jnp.asarray((V_new - 1.0) / 2.0)) / 2.0
    np.testing.assert_allclose(g, expected, rtol=1e-5)


def test_neuron_update_is_elementwise():
    alif = bnn.ALIF((2, 3))
    alif.init_state()
    alif.V.value = jnp.linspace(0.0, 1.5, 6).reshape(2, 3)

    def step(x):
        return alif(x)

    with brainstate.environ.context(dt=1.0):
        jac = brainstate.transform.jacrev(step)(jnp.full((2, 3), 0.4)).reshape(6, 6)
    np.testing.assert_allclose(jac, np.diag(np.diag(jac)))
    assert np.all(np.diag(jac) > 0)


def test_default_dt_when_unset(no_dt):
    lif = bnn.LIF(1, tau=10 * u.ms, V_th=1 * u.mV)
    lif.init_state()
    lif(jnp.array([0.5]) * u.mV)
    lif(jnp.array([0.0]) * u.mV)
    np.testing.assert_allclose(_np(lif.V.value, u.mV), [0.5 * math.exp(-bnn.DEFAULT_DT / 10)],
                               rtol=1e-6)
    plain = bnn.LI(1, tau=10.0)
    plain.init_state()
    plain(jnp.array([1.0]))
    np.testing.assert_allclose(plain(jnp.array([0.0])), [math.exp(-bnn.DEFAULT_DT / 10)], rtol=1e-6)


def test_unit_mismatch_errors():
    lif = bnn.LIF(2, tau=10 * u.ms, V_th=1 * u.mV)
    lif.init_state()
    with brainstate.environ.context(dt=1 * u.ms):
        with pytest.raises(u.DimensionMismatchError, match='input x of LIF'):
            lif(jnp.ones(2))  # no unit
        with pytest.raises(u.DimensionMismatchError, match='input x of LIF'):
            lif(jnp.ones(2) * u.second)
    with brainstate.environ.context(dt=1.0):  # plain dt with a tau in ms
        with pytest.raises(u.DimensionMismatchError, match='dt'):
            lif(jnp.ones(2) * u.mV)
    plain = bnn.LIF(2)
    plain.init_state()
    with brainstate.environ.context(dt=1 * u.ms):  # dt with unit, tau plain
        with pytest.raises(u.DimensionMismatchError, match='dt'):
            plain(jnp.ones(2))
    with brainstate.environ.context(dt=1.0):
        with pytest.raises(u.DimensionMismatchError, match='input x of LIF'):
            plain(jnp.ones(2) * u.mV)
    with pytest.raises(u.DimensionMismatchError, match='tau'):
        bnn.LIF(2, tau=10 * u.mV)
    with pytest.raises(u.DimensionMismatchError, match='V_reset'):
        bnn.LIF(2, V_th=1 * u.mV, V_reset=-1.0)
    with pytest.raises(u.DimensionMismatchError, match='V_rest'):
        bnn.LIF(2, V_th=1.0, V_rest=0.5 * u.mV)
    with pytest.raises(u.DimensionMismatchError, match='beta'):
        bnn.ALIF(2, tau=10 * u.ms, tau_a=100 * u.ms, V_th=1 * u.mV, beta=0.1)
    with pytest.raises(u.DimensionMismatchError, match='tau_a'):
        bnn.ALIF(2, tau=10 * u.ms, tau_a=100.0)


def test_neuron_argument_errors():
    with pytest.raises(ValueError, match='reset'):
        bnn.LIF(2, reset='hard')
    with pytest.raises(ValueError, match='V_th must be larger than V_reset'):
        bnn.LIF(2, V_th=0.0, V_reset=0.0)
    with pytest.raises(ValueError, match='tau'):
        bnn.LIF(2, tau=-1.0)
    with pytest.raises(ValueError, match='in_size'):
        bnn.LIF((3, 0))
    with pytest.raises(TypeError, match='spike_fn'):
        bnn.LIF(2, spike_fn='sigmoid')
    lif = bnn.LIF(3)
    with pytest.raises(ValueError, match='batch_size'):
        lif.init_state(batch_size=0)
    lif.init_state(batch_size=2)
    with pytest.raises(ValueError, match='does not broadcast'):
        lif(jnp.ones((2, 4)))
    lif.reset_state(batch_size=5)
    assert lif.V.value.shape == (5, 3)


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
