"""Spike rates: of neuron modules with spike() or get_spike(), and of spikes a model returns."""
import brainstate
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.data import EventDataset
from braintrace_conv.training import Trainer
from braintrace_conv.training.spikes import (fraction_spiking, spike_method, spike_rate_observer,
                                             spiking_layers, split_output)

pytestmark = pytest.mark.usefixtures('float64')


class Net(brainstate.nn.Module):
    """conv -> LIF -> flatten -> linear readout, 3 classes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first', w_init=nn.FanInNormal(6.0))
        self.lif = nn.LIF((3, 5, 5), tau=5.0)
        self.flat, self.readout = nn.Flatten(), nn.Linear(75, 3)

    def update(self, x):
        return self.readout(self.flat(self.lif(self.conv(x))))


# ----------------------------------------------------------------------------- spike rates
class ResetAfterSpike(brainstate.nn.Module):
    """A user-written neuron that stores V after the reset: no spike() to call."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def init_state(self, batch_size=None, **kw):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape)))

    def update(self, x):
        v = 0.8 * self.v.value + x
        z = nn.surrogate.Sigmoid()(v - 1.0)
        self.v.value = v - z
        return z


class UserNet(brainstate.nn.Module):
    def __init__(self, neuron, returns_spikes):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first', w_init=nn.FanInNormal(6.0))
        self.neu, self.returns_spikes = neuron, returns_spikes
        self.flat, self.readout = nn.Flatten(), nn.Linear(75, 3)

    def update(self, x):
        z = self.neu(self.conv(x))
        scores = self.readout(self.flat(z))
        return (scores, {'neu': z}) if self.returns_spikes else scores


def _rates_of(model, data):
    trainer = Trainer(bc.BPTT(model), optax.sgd(0.1), devices=1)
    xs = jnp.asarray(np.moveaxis(data.events, 0, 1), jnp.float64)
    brainstate.nn.init_all_states(model, len(data.labels))
    spikes = []
    for x in xs:
        out = model(x)
        spikes.append(out[1]['neu'] if model.returns_spikes else model.neu.get_spike())
    expected = float(np.mean(spikes))
    return trainer, trainer.evaluate(data, batch_size=8)['spike_rates'], expected


def test_spike_rates_of_returned_spikes_and_of_get_spike(capsys):
    rng = np.random.default_rng(8)
    data = EventDataset((rng.random((8, 4, 2, 5, 5)) < 0.5).astype(np.float32),
                        rng.integers(0, 3, 8), 3)
    brainstate.random.seed(9)
    trainer, rates, expected = _rates_of(UserNet(ResetAfterSpike((3, 5, 5)), True), data)
    assert trainer.spiking_layers == {} and set(rates) == {'neu'}
    assert 0 < expected < 1 and rates['neu'] == pytest.approx(expected, rel=1e-6)
    bs = pytest.importorskip('brainpy.state')
    import saiunit as u
    brainstate.random.seed(9)
    neuron = bs.LIF((3, 5, 5), tau=5 * u.ms, V_th=1 * u.mV, R=1 * u.ohm)
    model = UserNet(neuron, False)
    model.conv.weight.value = model.conv.weight.value * 10 * u.mA   # strong enough to spike
    model.conv.bias.value = (model.conv.bias.value + 1) * u.mA
    with brainstate.environ.context(dt=1 * u.ms):
        trainer, rates, expected = _rates_of(model, data)
    assert list(trainer.spiking_layers) == ['neu'] and 0 < expected < 1
    assert rates['neu'] == pytest.approx(expected, rel=1e-6)


def test_a_model_output_is_scores_or_scores_and_spikes():
    scores, spikes = jnp.ones((2, 3)), {'layer': jnp.zeros((2, 4))}
    assert split_output(scores) == (scores, {})
    assert split_output((scores, spikes)) == (scores, spikes)
    pair = (scores, scores)              # a pair without a dict of spikes is one output
    assert split_output(pair) == (pair, {})


def test_the_spiking_layers_of_a_model_and_their_rates():
    net = Net()
    assert list(spiking_layers(net)) == ['lif']
    assert spike_method(net.lif) == net.lif.spike and spike_method(net.conv) is None
    assert spike_method(object()) is None
    brainstate.nn.init_all_states(net, 2)
    net(jnp.ones((2, 2, 5, 5)) * 50.0)        # a drive large enough to make every neuron spike
    rates = spike_rate_observer([net.lif])(net)
    assert len(rates) == 1 and rates[0].shape == (2,)
    spikes = (np.arange(3 * 2 * 4) % 4 == 0).astype(float).reshape(3, 2, 4)
    np.testing.assert_allclose(fraction_spiking(spikes), np.full((3, 2), 0.25))

