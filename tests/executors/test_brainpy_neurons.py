"""The brain ecosystem's own neurons, as brainpy users write their nets.

``brainstate.nn.Conv2d`` layers drive the neurons that ``brainpy.state`` ships,
with ``braintools.surrogate`` spike functions and currents in physical units.
No registration call: the primitives these packages bring into a step
(``heaviside_surrogate_gradient``, ``exprel``) are read as elementwise from their
definitions. float64 against BPTT.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import braintrace_conv as bc
from snn_reference import EXACT, rel_err, xent

bps = pytest.importorskip('brainpy.state')
braintools = pytest.importorskip('braintools')


@pytest.fixture(autouse=True, scope='module')
def one_ms_steps(float64):
    with brainstate.environ.context(dt=1.0 * u.ms):     # brainpy neurons read dt from here
        yield


# neuron, input scale and unit: each fires on a fraction of the steps below
NEURONS = {
    'LIF-soft': (lambda s, f: bps.LIF(s, spk_fun=f, spk_reset='soft'), 4.0, u.mA),
    'LIF-hard': (lambda s, f: bps.LIF(s, spk_fun=f, spk_reset='hard'), 4.0, u.mA),
    'ALIF': (lambda s, f: bps.ALIF(s, spk_fun=f), 4.0, u.mA),
    'CubaLIF': (lambda s, f: bps.CubaLIF(s, spk_fun=f), 4.0, u.mA),
    # a threshold below the exponential's blow-up keeps BPTT's own gradient finite
    'ExpIF': (lambda s, f: bps.ExpIF(s, spk_fun=f, V_th=-50 * u.mV), 40.0, u.mA),
    'AdExIF': (lambda s, f: bps.AdExIF(s, spk_fun=f), 60.0, u.mA),
    'Izhikevich': (lambda s, f: bps.Izhikevich(s, spk_fun=f), 50.0, u.mV / u.ms),
}


class ConvNet(brainstate.nn.Module):
    """brainstate conv (with bias) -> a brainpy.state neuron -> brainstate readout."""

    def __init__(self, neuron, spike_fn, scale, unit):
        super().__init__()
        self.conv = brainstate.nn.Conv2d((6, 6, 2), 4, 3, padding='SAME',
                                         b_init=braintools.init.Constant(0.1))
        self.neu = NEURONS[neuron][0]((6, 6, 4), spike_fn)
        self.readout = brainstate.nn.Linear(6 * 6 * 4, 3)
        self.scale, self.unit = scale, unit

    def update(self, x):
        spikes = self.neu(self.conv(x) * self.scale * self.unit)
        return self.readout(spikes.reshape(spikes.shape[0], -1))


def data(T=8, B=2, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.random((T, B, 6, 6, 2)) < 0.5, jnp.float64),
            jnp.asarray(rng.integers(0, 3, (T, B))))


def make(neuron, spike_fn=None):
    brainstate.random.seed(0)
    _, scale, unit = NEURONS[neuron]
    net = ConvNet(neuron, spike_fn or braintools.surrogate.Sigmoid(), scale, unit)
    brainstate.nn.init_all_states(net, 2)
    return net


def spike_fraction(net, xs):
    brainstate.nn.init_all_states(net, xs.shape[1])
    fired = []
    for x in xs:
        net(x)
        fired.append(np.asarray(net.neu.get_spike()))
    return float(np.mean(fired))


def gradients(net, xs, ys, *learners):
    """BPTT's gradients and each learner's, flat and keyed by leaf path."""
    flat = lambda g: {jax.tree_util.keystr(p): np.asarray(v)
                      for p, v in jax.tree_util.tree_flatten_with_path(g)[0]}
    return [flat(learner.value_and_grad(xent, xs, ys)[1]) for learner in (bc.BPTT(net), *learners)]


def cosine(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# LIF, the exponential (saiunit's exprel) and the quadratic neuron by default; all with -m slow
IN_DEFAULT_RUN = ('LIF-soft', 'ExpIF', 'Izhikevich')


@pytest.mark.parametrize('neuron', [n if n in IN_DEFAULT_RUN else pytest.param(n, marks=pytest.mark.slow)
                                    for n in NEURONS])
def test_brainpy_state_neurons_drtrl_exact_es_drtrl_readout_exact(neuron):
    net, (xs, ys) = make(neuron), data()
    assert 0.02 < spike_fraction(net, xs) < 0.9, 'the comparison needs spikes and silences'
    ref, exact, approx = gradients(net, xs, ys, bc.D_RTRL(net), bc.ES_D_RTRL(net))
    assert set(ref) == set(exact) == set(approx)
    for name in ref:
        assert np.abs(ref[name]).max() > 0, f'{name}: vacuous reference'
        assert rel_err(exact[name], ref[name]) < EXACT, ('D-RTRL', name)
        if 'readout' in name:
            assert rel_err(approx[name], ref[name]) < EXACT, ('ES-D-RTRL', name)
        else:   # an approximation of the conv's gradient: aligned, never zero
            assert cosine(approx[name], ref[name]) > 0.5, ('ES-D-RTRL', name)


SURROGATES = ['GaussianGrad', 'ReluGrad', 'PiecewiseQuadratic']   # Sigmoid: above


@pytest.mark.parametrize('name', [SURROGATES[0], *(pytest.param(n, marks=pytest.mark.slow)
                                                  for n in SURROGATES[1:])])
def test_braintools_surrogates_are_exact_in_drtrl(name):
    spike_fn = getattr(braintools.surrogate, name)()
    net, (xs, ys) = make('LIF-soft', spike_fn), data(T=6)
    ref, got = gradients(net, xs, ys, bc.D_RTRL(net))
    for key in ref:
        assert np.abs(ref[key]).max() > 0, f'{key}: vacuous reference'
        assert rel_err(got[key], ref[key]) < EXACT, (name, key)


class OurLIF(brainstate.nn.Module):
    """This library's conv and LIF with a braintools spike function."""

    def __init__(self, spike_fn):
        super().__init__()
        from braintrace_conv import nn
        self.conv = nn.Conv2d(2, 4, 3, layout='channels_last')
        self.lif = nn.LIF((6, 6, 4), tau=5.0 * u.ms, spike_fn=spike_fn)
        self.readout = nn.Linear(6 * 6 * 4, 3)

    def update(self, x):
        spikes = self.lif(self.conv(x) * 2.0)
        return self.readout(spikes.reshape(spikes.shape[0], -1))


def test_braintools_surrogates_drive_this_librarys_neurons_exactly():
    brainstate.random.seed(0)
    net, (xs, ys) = OurLIF(braintools.surrogate.Arctan()), data()
    brainstate.nn.init_all_states(net, 2)
    ref, got = gradients(net, xs, ys, bc.D_RTRL(net))
    for key in ref:
        assert np.abs(ref[key]).max() > 0, f'{key}: vacuous reference'
        assert rel_err(got[key], ref[key]) < EXACT, key
