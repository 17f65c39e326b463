"""Neurons against reference recursions, with and without units, and their argument errors."""
import math

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import braintrace_conv.nn as bnn
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
