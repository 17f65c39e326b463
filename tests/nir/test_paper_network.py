"""The NIR paper's N-MNIST CNN, rebuilt with the nir package at its published shapes: it
loads, runs, trains online with D-RTRL, and D-RTRL computes exactly what it documents."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nir as bnir
from snn_reference import EXACT, rel_err

nir = pytest.importorskip('nir')
pytestmark = pytest.mark.usefixtures('float64')

T, B = 8, 2


def paper_cnn(seed: int = 0):
    """Input 2x34x34; conv 2->16 k5 s2 p1, IF; conv 16->16 k3 p1, IF, sum-pool 2; conv
    16->8 k3 p1, IF, sum-pool 2; flatten; affine 128->256, IF; affine 256->10, IF."""
    rng = np.random.default_rng(seed)

    def conv(c_in, c_out, k, stride, hw):
        w = rng.normal(size=(c_out, c_in, k, k)) * np.sqrt(6.0 / (c_in * k * k))
        return nir.Conv2d(input_shape=hw, weight=w, stride=stride, padding=1, dilation=1, groups=1,
                          bias=np.zeros(c_out))

    def spiking(*shape):
        return nir.IF(r=np.ones(shape), v_threshold=np.ones(shape))

    def affine(n_in, n_out):
        return nir.Affine(weight=rng.normal(size=(n_out, n_in)) * np.sqrt(6.0 / n_in),
                          bias=np.zeros(n_out))

    def pool():
        return nir.SumPool2d(kernel_size=np.array([2, 2]), stride=np.array([2, 2]),
                             padding=np.array([0, 0]))

    nodes = {'input': nir.Input(np.array([2, 34, 34])),
             '0': conv(2, 16, 5, 2, (34, 34)), '1': spiking(16, 16, 16),
             '2': conv(16, 16, 3, 1, (16, 16)), '3': spiking(16, 16, 16), '4': pool(),
             '5': conv(16, 8, 3, 1, (8, 8)), '6': spiking(8, 8, 8), '7': pool(),
             '8': nir.Flatten(input_type={'input': np.array([8, 4, 4])}, start_dim=0),
             '9': affine(128, 256), '10': spiking(256), '11': affine(256, 10), '12': spiking(10),
             'output': nir.Output(np.array([10]))}
    names = list(nodes)
    return nir.NIRGraph(nodes, list(zip(names[:-1], names[1:])))   # nir's own type check


def data(seed=1):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.random((T, B, 2, 34, 34)) < 0.15, jnp.float64),
            jnp.asarray(rng.integers(0, 10, (T, B))))


def loss(out, label):
    return jnp.mean((out - jax.nn.one_hot(label, 10)) ** 2)


@pytest.mark.slow
def test_loads_runs_and_trains_online(tmp_path):
    nir.write(tmp_path / 'paper.nir', paper_cnn())
    net = bnir.load(tmp_path / 'paper.nir', dt=1e-3)
    xs, labels = data()
    assert net.input_shape == (2, 34, 34)
    assert 0 < float(bc.BPTT(net).predict(xs).mean()) < 1
    learner = bc.D_RTRL(net)
    params = net.states(brainstate.ParamState)
    optimiser = optax.adam(1e-2)
    opt_state = optimiser.init({k: p.value for k, p in params.items()})
    losses = []
    for _ in range(4):                 # online: weights change between chunks of 4 steps
        learner.reset(B)
        total = 0.0
        for start in range(0, T, 4):
            value, grads = learner.advance(loss, xs[start:start + 4], labels[start:start + 4])
            updates, opt_state = optimiser.update(grads, opt_state)
            for k, u in updates.items():
                params[k].value = params[k].value + u
            total += float(value)
        losses.append(total)
    assert losses[-1] < losses[0]


def test_d_rtrl_is_exact_where_its_report_says_so():
    net = bnir.load(paper_cnn(), dt=1e-3)
    xs, labels = data()
    _, ref = bc.BPTT(net).value_and_grad(loss, xs, labels)
    learner = bc.D_RTRL(net)
    _, got = learner.value_and_grad(loss, xs, labels)
    exact = sorted(r['shape'] for r in learner.report().rows if r['method'].startswith('exact trace'))
    assert exact == [(10,), (256, 10)]      # the last affine map: nothing after it has dynamics
    for key in ref:
        if np.shape(ref[key]) in exact:
            assert rel_err(got[key], ref[key]) < EXACT


class CutAcrossLayers(brainstate.nn.Module):
    """The loaded network with every other layer's old state read without gradient: BPTT of
    it is, for ``layer``'s parameters, the gradient D-RTRL documents (exact within the layer,
    its effect through later layers' dynamics cut)."""

    def __init__(self, net, layer: str):
        super().__init__()
        self.net, self.layer = net, layer

    def update(self, x):
        for name, node in self.net.layers.items():
            if name != self.layer and isinstance(node, bnir.modules.NIRNeuron):
                node.v.value = jax.lax.stop_gradient(node.v.value)
        return self.net(x)


@pytest.mark.slow
def test_d_rtrl_equals_its_documented_truncation_on_every_layer():
    net = bnir.load(paper_cnn(), dt=1e-3)
    xs, labels = data()
    _, got = bc.D_RTRL(net).value_and_grad(loss, xs, labels)
    for weights, neuron in (('0', '1'), ('2', '3'), ('5', '6'), ('9', '10'), ('11', '12')):
        _, ref = bc.BPTT(CutAcrossLayers(net, neuron)).value_and_grad(loss, xs, labels)
        for leaf in ('weight', 'bias'):
            assert rel_err(got['layers', weights, leaf], ref['net', 'layers', weights, leaf]) < EXACT
