"""ES-D-RTRL: exact on linear leaky layers, an approximation elsewhere; its decays.

The decay is given or inferred per op from the leak of the neurons it drives
(concrete values only: not inside an outer ``jax.jit`` before a first call); the
time index of its normalisation counts steps, not calls (float64, against BPTT).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from snn_reference import EXACT, rel_err, xent
from user_models import (LinearLeaky, OneLayer, assert_matches_bptt, compare, methods, sin_loss,
                         spikes_and_labels)

pytestmark = pytest.mark.usefixtures('float64')


def test_es_drtrl_equals_bptt_on_linear_leaky_layer():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(9, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 4, 4, 5)))
    assert_matches_bptt(model, bc.ES_D_RTRL(model, decay=0.8), xs, targets, sin_loss)


def test_es_drtrl_decay_mismatch_is_an_approximation():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(9, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 4, 4, 5)))
    _, ref = bc.BPTT(model).value_and_grad(sin_loss, xs, targets)
    _, grads = bc.ES_D_RTRL(model, decay=0.3).value_and_grad(sin_loss, xs, targets)
    assert rel_err(grads['K',], ref['K',]) > 1e-3          # the kernel trace is approximate
    assert rel_err(grads['b',], ref['b',]) < EXACT         # the bias trace is exact


def test_es_decay_inference_inside_jit_is_a_clear_error():
    """Inferred decays need concrete values: inside an outer jax.jit the first call says so;
    once inferred by a call outside, the jitted call gives the same gradients."""
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(7)
    xs = jnp.asarray(rng.normal(size=(4, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(4, 2, 4, 4, 5)))
    learner = bc.ES_D_RTRL(model)
    jitted = jax.jit(lambda a, b: learner.value_and_grad(sin_loss, a, b)[1])
    with pytest.raises(ValueError, match='abstract inside jax.jit.*decay='):
        jitted(xs, targets)
    _, want = learner.value_and_grad(sin_loss, xs, targets)
    got = jitted(xs, targets)
    for key in want:
        assert rel_err(got[key], want[key]) < 1e-12, key


def test_es_time_index_counts_steps_not_calls():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(7)
    xs = jnp.asarray(rng.normal(size=(6, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(6, 2, 4, 4, 5)))
    learner = bc.ES_D_RTRL(model, decay=0.8)
    _, whole = learner.value_and_grad(sin_loss, xs, targets)
    learner.reset(2)
    parts = [learner.advance(sin_loss, xs[s:s + 2], targets[s:s + 2])[1] for s in (0, 2, 4)]
    summed = jax.tree.map(lambda *g: sum(g), *parts)
    for key in whole:
        assert rel_err(summed[key], whole[key]) < 1e-10


# ----------------------------------------------------------------------------- decays
class TwoLeaky(brainstate.nn.Module):
    """Two parallel linear leaky layers with decays 0.7 and 0.5 and a shared readout."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.K1 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 3))))
        self.K2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 2))))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(3 * 7 + 3 * 7, 2)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h1 = brainstate.HiddenState(jnp.zeros((batch_size, 3, 7)))
        self.h2 = brainstate.HiddenState(jnp.zeros((batch_size, 3, 7)))

    def update(self, x):
        h1 = 0.7 * self.h1.value + bc.conv(x, self.K1.value, strides=1, padding='SAME')
        h2 = 0.5 * self.h2.value + bc.conv(x, self.K2.value, strides=1, padding='SAME')
        self.h1.value, self.h2.value = h1, h2
        feat = jnp.concatenate([h1.reshape(h1.shape[0], -1), h2.reshape(h2.shape[0], -1)], 1)
        return bc.dense(feat, self.W.value)


def test_es_drtrl_infers_one_decay_per_op_and_is_exact_on_linear_layers():
    model = TwoLeaky()
    rng = np.random.default_rng(2)
    xs = jnp.asarray(rng.normal(size=(9, 2, 2, 7)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 2)))
    learner = bc.ES_D_RTRL(model)
    errors = compare(model, learner, xs, targets, lambda o, t: jnp.sum((o - t) ** 2))
    assert max(errors.values()) < EXACT, errors
    rows = methods(learner)
    assert 'decay 0.7, inferred' in rows['K1'] and 'decay 0.5, inferred' in rows['K2']


def test_es_drtrl_infers_the_membrane_decay_of_a_spiking_neuron():
    model = OneLayer('subtract')
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=3)
    learner = bc.ES_D_RTRL(model)
    learner.value_and_grad(xent, xs, labels)
    assert 'decay 0.9, inferred' in methods(learner)['K']


@pytest.mark.parametrize('decay', [0.9, np.float32(0.9), np.float64(0.9), jnp.float32(0.9),
                                   jnp.asarray(0.9), 1])
def test_es_drtrl_accepts_any_real_scalar_decay(decay):
    assert bc.ES_D_RTRL(OneLayer('subtract'), decay=decay).decay == pytest.approx(0.9 if decay != 1 else 1.0, rel=1e-6)


@pytest.mark.parametrize('decay', [0, 1.5, -0.2, True, 'fast', [0.9], np.ones(2), 0.5 + 0.1j])
def test_es_drtrl_rejects_bad_decays(decay):
    with pytest.raises(ValueError, match='decay'):
        bc.ES_D_RTRL(OneLayer('subtract'), decay=decay)
