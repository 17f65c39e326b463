"""The losses: every loss against NumPy, sequence losses and the rate regulariser trained
exactly (against the gradient of the unrolled sequence), and their errors."""
import brainstate
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.data import EventDataset
from braintrace_conv.training import Trainer
from braintrace_conv.training.loss import (LOSSES, SEQUENCE_LOSSES, predicted_labels,
                                           sequence_loss, step_weights)

from snn_reference import EXACT, rel_err

pytestmark = pytest.mark.usefixtures('float64')


def _np_ce(z, y):
    z = z - z.max(axis=-1, keepdims=True)
    return np.log(np.exp(z).sum(axis=-1)) - np.take_along_axis(z, y[:, None], -1)[:, 0]


def _reference(scores, labels, loss, rates=(0.8, 0.2)):
    """(per-sample loss, prediction) by plain numpy."""
    T = scores.shape[0]
    if loss == 'count_ce':
        pooled = scores.sum(0)
        return _np_ce(pooled, labels), pooled.argmax(-1)
    if loss == 'count_mse':
        pooled = scores.sum(0)
        target = np.full(pooled.shape, rates[1])
        target[np.arange(len(labels)), labels] = rates[0]
        return ((pooled / T - target) ** 2).mean(-1), pooled.argmax(-1)
    pooled = scores.max(0) if loss == 'max_membrane' else scores.mean(0)
    return _np_ce(pooled, labels), pooled.argmax(-1)


@pytest.mark.parametrize('loss', SEQUENCE_LOSSES)
def test_sequence_losses_match_numpy(loss):
    rng = np.random.default_rng(0)
    scores = (rng.random((5, 4, 3)) < 0.4).astype(float) + 0.1 * rng.normal(size=(5, 4, 3))
    labels = rng.integers(0, 3, 4)
    ref_loss, ref_pred = _reference(scores, labels, loss, (0.7, 0.1))
    weights = step_weights(loss, 5)
    np.testing.assert_allclose(sequence_loss(scores, labels, weights, loss, (0.7, 0.1)), ref_loss,
                               rtol=1e-12)
    np.testing.assert_array_equal(predicted_labels(scores, weights, loss), ref_pred)


class Net(brainstate.nn.Module):
    """conv -> LIF -> flatten -> linear readout, 3 classes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first', w_init=nn.FanInNormal(6.0))
        self.lif = nn.LIF((3, 5, 5), tau=5.0)
        self.flat, self.readout = nn.Flatten(), nn.Linear(75, 3)

    def update(self, x):
        return self.readout(self.flat(self.lif(self.conv(x))))


def _unrolled_gradient(model, xs, labels, loss, rate_target=None, strength=0.0):
    """Autodiff through the unrolled network of the whole-sequence loss (the reference),
    with the rate penalty of the 'hidden' spikes when ``rate_target`` is given."""
    weights = step_weights(loss, xs.shape[0])

    def total():
        brainstate.nn.init_all_states(model, xs.shape[1])
        outs = [model(x) for x in xs]
        if rate_target is None:
            return jnp.mean(sequence_loss(jnp.stack(outs), labels, weights, loss))
        scores = jnp.stack([o[0] for o in outs])
        hidden = jnp.stack([o[1]['hidden'] for o in outs])
        rate = hidden.reshape(hidden.shape[0], hidden.shape[1], -1).mean(axis=(0, 2))
        penalty = strength * (rate - rate_target) ** 2
        return jnp.mean(sequence_loss(scores, labels, weights, loss) + penalty)

    grads, value = brainstate.transform.grad(
        total, grad_states=model.states(brainstate.ParamState), return_value=True)()
    return value, grads


def _check_trainer_gradient(model, loss, seed, **kwargs):
    """Trainer(D_RTRL).value_and_grad equals the unrolled reference; returns the gradient."""
    rng = np.random.default_rng(seed)
    xs = (rng.random((6, 4, 2, 5, 5)) < 0.5).astype(np.float64)
    labels = rng.integers(0, 3, 4)
    rates = kwargs.get('rate_targets')
    ref_loss, ref = _unrolled_gradient(model, jnp.asarray(xs), jnp.asarray(labels), loss,
                                       rates and rates['hidden'],
                                       kwargs.get('rate_strength', 1.0))
    trainer = Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss=loss, devices=1, **kwargs)
    value, grads = trainer.value_and_grad(xs, labels)
    np.testing.assert_allclose(value, ref_loss, rtol=1e-10)
    for key in ref:
        assert np.abs(ref[key]).max() > 0, key
        assert rel_err(grads[key], ref[key]) < EXACT, (key, rel_err(grads[key], ref[key]))
    return grads


@pytest.mark.parametrize('loss', [loss if loss in ('count_ce', 'max_membrane')
                                  else pytest.param(loss, marks=pytest.mark.slow)
                                  for loss in SEQUENCE_LOSSES])   # the others with -m slow
def test_sequence_losses_train_exactly_with_d_rtrl(loss):
    brainstate.random.seed(1)
    _check_trainer_gradient(Net(), loss, seed=2)


def test_sequence_loss_in_fit_and_evaluate():
    brainstate.random.seed(3)
    model = Net()
    rng = np.random.default_rng(4)
    data = EventDataset((rng.random((8, 4, 2, 5, 5)) < 0.5).astype(np.float32),
                        rng.integers(0, 3, 8), 3)
    trainer = Trainer(bc.ES_D_RTRL(model), optax.adam(1e-2), loss='count_mse',
                      target_rates=(0.9, 0.05), devices=1)
    assert trainer.config()['target_rates'] == [0.9, 0.05]
    history = trainer.fit(data, epochs=1, batch_size=4, eval_dataset=data, progress=False)
    assert np.isfinite(history[0]['train_loss']) and trainer.updates == 2
    metrics = trainer.evaluate(data, batch_size=8)
    scores = trainer.learner.predict(jnp.asarray(np.moveaxis(data.events, 0, 1),
                                                 jnp.float64))
    ref_loss, ref_pred = _reference(np.asarray(scores), data.labels, 'count_mse', (0.9, 0.05))
    np.testing.assert_allclose(metrics['loss'], ref_loss.mean(), rtol=1e-5)
    assert metrics['accuracy'] == pytest.approx(np.mean(ref_pred == data.labels))


def test_sequence_loss_errors():
    model = Net()
    with pytest.raises(ValueError, match=r"^loss must be a per-step loss \(every_step, final\) "
                                         r"with update_every \(2\), got 'count_ce'; a loss of "
                                         r"the whole sequence needs the outputs of every step"):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='count_ce', update_every=2)
    with pytest.raises(ValueError, match='target_rates must be two rates'):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='count_mse', target_rates=(2, 0))
    with pytest.raises(ValueError, match='loss must be one of'):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='hinge')
    assert set(SEQUENCE_LOSSES) < set(LOSSES)


# ----------------------------------------------------------------------------- rate regulariser
def test_rate_penalty_matches_numpy():
    from braintrace_conv.training.loss import rate_penalty
    rng = np.random.default_rng(5)
    spikes = {'a': (rng.random((4, 3, 2, 5)) < 0.3).astype(float),
              'b': (rng.random((4, 3, 7)) < 0.6).astype(float)}
    ref = 0.5 * ((spikes['a'].mean(axis=(0, 2, 3)) - 0.1) ** 2
                 + (spikes['b'].mean(axis=(0, 2)) - 0.4) ** 2)
    np.testing.assert_allclose(rate_penalty(spikes, {'a': 0.1, 'b': 0.4}, 0.5), ref, rtol=1e-12)


class SpikingNet(Net):
    """Net whose step also returns the hidden spikes, the way the regulariser reads them."""

    def update(self, x):
        z = self.lif(self.conv(x))
        return self.readout(self.flat(z)), {'hidden': z}


@pytest.mark.parametrize('loss', ['every_step', 'count_ce'])
def test_rate_regulariser_trains_exactly_with_d_rtrl(loss):
    brainstate.random.seed(6)
    model = SpikingNet()
    grads = _check_trainer_gradient(model, loss, seed=7, rate_targets={'hidden': 0.05},
                                    rate_strength=2.0)
    # the regulariser changes the gradient: it is not silently dropped
    rng = np.random.default_rng(7)
    xs = (rng.random((6, 4, 2, 5, 5)) < 0.5).astype(np.float64)
    _, plain = Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss=loss,
                       devices=1).value_and_grad(xs, rng.integers(0, 3, 4))
    assert rel_err(plain['conv', 'weight'], grads['conv', 'weight']) > 1e-3


def test_rate_regulariser_errors():
    with pytest.raises(ValueError, match=r"rate_targets names layers \['out'\] whose spikes"):
        Trainer(bc.D_RTRL(SpikingNet()), optax.sgd(0.1), rate_targets={'out': 0.1},
                devices=1).value_and_grad(np.zeros((2, 2, 2, 5, 5)), np.zeros(2, int))
    with pytest.raises(ValueError, match='rate_targets must be a dict'):
        Trainer(bc.D_RTRL(SpikingNet()), optax.sgd(0.1), rate_targets={'hidden': 3})
    with pytest.raises(ValueError, match=r"^rate_targets must be empty with update_every \(2\), "
                                         r"got \{'hidden': 0.1\}; the firing-rate regulariser"):
        Trainer(bc.D_RTRL(SpikingNet()), optax.sgd(0.1), rate_targets={'hidden': 0.1},
                update_every=2)


def test_step_weights():
    np.testing.assert_array_equal(step_weights('every_step', 4), [0.25] * 4)
    np.testing.assert_array_equal(step_weights('final', 4, 2), [0, 0, 0.5, 0.5])
    with pytest.raises(ValueError, match=r'^final_steps must be at most num_steps \(1\), got 2'):
        step_weights('final', 1, 2)
