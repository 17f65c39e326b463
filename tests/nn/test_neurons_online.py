"""The nn neurons added for researchers (trainable constants, CubaLIF, IF) against hand
computations and, under D-RTRL, against BPTT in float64 (one conv layer + neuron +
readout, loss at every step)."""
import math

import brainstate
import braintools
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import braintrace_conv as bc
from braintrace_conv import nn
from snn_reference import EXACT, rel_err, xent


pytestmark = pytest.mark.usefixtures('float64')


class ConvNeuronNet(brainstate.nn.Module):
    """Channels-first conv -> neuron -> flatten -> linear readout (3 classes)."""

    def __init__(self, neuron, w_unit=None):
        super().__init__()
        w_init = nn.FanInNormal(6.0) if w_unit is None else nn.FanInNormal(6.0, unit=w_unit)
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first', w_init=w_init)
        self.neu = neuron
        self.flat, self.readout = nn.Flatten(), nn.Linear(3 * 5 * 5, 3)

    def update(self, x):
        return self.readout(self.flat(self.neu(self.conv(x))))


def _data(T=6, B=2, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.random((T, B, 2, 5, 5)) < 0.5, jnp.float64),
            jnp.asarray(rng.integers(0, 3, (T, B))))


SHAPE = (3, 5, 5)
NEURONS = {
    'LIF-plif': lambda: nn.LIF(SHAPE, tau=5.0, trainable=('tau', 'V_th')),
    'LIF-zero-per-channel': lambda: nn.LIF(SHAPE, tau=np.array([4.0, 6.0, 8.0])[:, None, None],
                                           V_th=0.8, reset='zero', trainable='tau'),
    'ALIF-all': lambda: nn.ALIF(SHAPE, tau=5.0, tau_a=20.0, beta=0.3,
                                trainable=('tau', 'tau_a', 'V_th', 'beta')),
    'CubaLIF': lambda: nn.CubaLIF(SHAPE, tau=5.0, tau_syn=3.0),
    'CubaLIF-trainable': lambda: nn.CubaLIF(SHAPE, tau=5.0, tau_syn=3.0, reset='zero',
                                            trainable=('tau', 'tau_syn', 'V_th')),
    'IF': lambda: nn.IF(SHAPE, V_th=1.5),
    'IF-trainable': lambda: nn.IF(SHAPE, V_th=1.5, reset='zero', trainable='V_th'),
    'LIF-arctan': lambda: nn.LIF(SHAPE, tau=5.0, spike_fn=nn.surrogate.Arctan(), trainable='tau'),
    'LI-trainable': lambda: nn.LI(SHAPE, tau=5.0, trainable='tau'),
}


@pytest.mark.parametrize('name', list(NEURONS))
def test_drtrl_is_exact_for_the_neurons_and_their_trainable_constants(name):
    brainstate.random.seed(2)
    model = ConvNeuronNet(NEURONS[name]())
    xs, labels = _data()
    loss_ref, ref = bc.BPTT(model).value_and_grad(xent, xs, labels)
    learner = bc.D_RTRL(model)
    loss, grads = learner.value_and_grad(xent, xs, labels)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-12)
    assert set(grads) == set(ref)
    trainable = [k for k in ref if k[0] == 'neu']
    assert len(trainable) == len(model.neu.states(brainstate.ParamState))
    for key in ref:
        assert np.abs(ref[key]).max() > 0, f'{key}: zero reference gradient, vacuous test'
        assert np.shape(grads[key]) == np.shape(ref[key])
        assert rel_err(grads[key], ref[key]) < EXACT, (key, rel_err(grads[key], ref[key]))
    rows = {r['parameter']: r['method'] for r in learner.report().rows}
    for key in trainable:
        assert rows['.'.join(key)].startswith('exact'), rows


def test_trainable_constants_with_units_are_exact_and_keep_their_unit():
    brainstate.random.seed(4)
    neuron = nn.CubaLIF(SHAPE, tau=5 * u.ms, tau_syn=2 * u.ms, V_th=1 * u.mV,
                        trainable=('tau', 'tau_syn', 'V_th'))
    model = ConvNeuronNet(neuron, w_unit=u.mV)
    xs, labels = _data(seed=3)
    loss = lambda out, label: xent(u.get_mantissa(out), label)
    with brainstate.environ.context(dt=0.5 * u.ms):
        _, ref = bc.BPTT(model).value_and_grad(loss, xs, labels)
        _, grads = bc.D_RTRL(model).value_and_grad(loss, xs, labels)
    assert neuron.tau.value.unit == u.ms and neuron.V_th.value.unit == u.mV
    for key, unit in [(('neu', 'tau'), u.ms ** -1), (('neu', 'tau_syn'), u.ms ** -1),
                      (('neu', 'V_th'), u.mV ** -1)]:
        g = grads[key]
        assert isinstance(g, u.Quantity) and g.unit == unit, (key, g)
        assert rel_err(g.mantissa, ref[key].mantissa) < EXACT, key


def test_trainable_tau_gradient_matches_finite_differences():
    """dV_T / dtau of a LIF that never spikes (V_t = V_{t-1} e^{-dt/tau} + x_t), by hand."""
    lif = nn.LIF(1, tau=4.0, V_th=100.0, detach_reset=True, trainable='tau')   # no spikes
    xs = jnp.asarray([0.3, 0.5, -0.2, 0.4])

    def final_v(tau):
        v = 0.0
        for x in np.asarray(xs):
            v = v * math.exp(-1.0 / tau) + x
        return v

    lif.init_state()

    def run():
        lif.reset_state()
        with brainstate.environ.context(dt=1.0):
            for x in xs:
                lif(x[None])
        return lif.V.value[0]

    grad = brainstate.transform.grad(run, grad_states=lif.tau)()
    fd = (final_v(4.0 + 1e-6) - final_v(4.0 - 1e-6)) / 2e-6
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_cuba_lif_and_if_by_hand():
    dt, tau, tau_syn = 1.0, 5.0, 2.0
    cuba = nn.CubaLIF(1, tau=tau, tau_syn=tau_syn, V_th=1.0)
    neuron_if = nn.IF(1, V_th=1.0, reset='zero')
    cuba.init_state()
    neuron_if.init_state()
    xs = [0.8, 0.0, 0.5, 0.9, 0.0]
    I = V = v_if = 0.0
    with brainstate.environ.context(dt=dt):
        for x in xs:
            s = float(V >= 1.0)
            V = V - s                                        # subtract V_th - V_reset = 1
            I = I * math.exp(-dt / tau_syn) + x
            V = V * math.exp(-dt / tau) + I
            v_if = (0.0 if v_if >= 1.0 else v_if) + x       # hard reset, no leak
            s_cuba, s_if = cuba(jnp.asarray([x])), neuron_if(jnp.asarray([x]))
            np.testing.assert_allclose(cuba.I.value, [I], rtol=1e-12)
            np.testing.assert_allclose(cuba.V.value, [V], rtol=1e-12)
            np.testing.assert_allclose(neuron_if.V.value, [v_if], rtol=1e-12)
            assert float(s_cuba[0]) == float(V >= 1.0) and float(s_if[0]) == float(v_if >= 1.0)


def test_neurons_accept_braintools_surrogates():
    """Any callable spike function works: a braintools surrogate gives its own derivative."""
    for cls in (nn.LIF, nn.ALIF, nn.CubaLIF, nn.IF):
        neuron = cls(4, spike_fn=braintools.surrogate.Sigmoid(alpha=4.0))
        neuron.init_state(2)
        x = jnp.linspace(0.2, 1.6, 8).reshape(2, 4)
        with brainstate.environ.context(dt=1.0):
            s = neuron(x)
        reference = cls(4)
        reference.init_state(2)
        with brainstate.environ.context(dt=1.0):
            np.testing.assert_array_equal(s, reference(x))
    lif = nn.LIF(3, spike_fn=braintools.surrogate.Arctan(alpha=2.0))
    lif.init_state()
    v = jnp.asarray([0.3, 1.0, 1.7])

    def spikes(x):      # one step from rest: V = x, the spike f(V - V_th) with V_th = 1
        lif.reset_state()
        with brainstate.environ.context(dt=1.0):
            return lif(x).sum()

    np.testing.assert_allclose(brainstate.transform.grad(spikes)(v),
                               nn.surrogate.Arctan(2.0).derivative(v - 1.0), rtol=1e-6)


def test_trainable_argument_errors():
    with pytest.raises(ValueError, match=r"trainable of LIF must name constants among \('tau', "
                                         r"'V_th'\), got \['beta'\]"):
        nn.LIF(3, trainable='beta')
    with pytest.raises(ValueError, match='trainable of IF'):
        nn.IF(3, trainable='tau')
    with pytest.raises(u.DimensionMismatchError):
        nn.CubaLIF(3, tau=5 * u.ms, tau_syn=2.0)
    lif = nn.LIF(3, trainable=['tau', 'V_th'])
    assert set(lif.states(brainstate.ParamState)) == {('tau',), ('V_th',)}
