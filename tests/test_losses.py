"""Losses of whole sequences: values against numpy, gradients of the two-pass training
against autodiff through the unrolled network (float64), and their use in Trainer."""
import brainstate
import jax
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


@pytest.fixture(autouse=True, scope='module')
def float64_params():
    old = brainstate.environ.get_precision()
    brainstate.environ.set(precision=64)
    jax.config.update('jax_enable_x64', True)
    yield
    brainstate.environ.set(precision=old)


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


def _unrolled_gradient(model, xs, labels, loss):
    """Autodiff through the unrolled network of the whole-sequence loss (the reference)."""
    params = model.states(brainstate.ParamState)
    weights = step_weights(loss, xs.shape[0])

    def total():
        brainstate.nn.init_all_states(model, xs.shape[1])
        scores = jnp.stack([model(x) for x in xs])
        return jnp.mean(sequence_loss(scores, labels, weights, loss))

    grads, value = brainstate.transform.grad(total, grad_states=params, return_value=True)()
    return value, grads


@pytest.mark.parametrize('loss', SEQUENCE_LOSSES)
def test_sequence_losses_train_exactly_with_d_rtrl(loss):
    brainstate.random.seed(1)
    model = Net()
    rng = np.random.default_rng(2)
    xs = (rng.random((6, 4, 2, 5, 5)) < 0.5).astype(np.float64)
    labels = rng.integers(0, 3, 4)
    ref_loss, ref = _unrolled_gradient(model, jnp.asarray(xs), jnp.asarray(labels), loss)
    trainer = Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss=loss, devices=1)
    value, grads = trainer.value_and_grad(xs, labels)
    np.testing.assert_allclose(value, ref_loss, rtol=1e-10)
    for key in ref:
        assert np.abs(ref[key]).max() > 0, key
        assert rel_err(grads[key], ref[key]) < EXACT, (key, rel_err(grads[key], ref[key]))


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
    assert np.isfinite(history[0]['train_loss']) and trainer.step == 2
    metrics = trainer.evaluate(data, batch_size=8)
    scores = trainer.learner.predict(jnp.asarray(np.moveaxis(data.events, 0, 1),
                                                 jnp.float64))
    ref_loss, ref_pred = _reference(np.asarray(scores), data.labels, 'count_mse', (0.9, 0.05))
    np.testing.assert_allclose(metrics['loss'], ref_loss.mean(), rtol=1e-5)
    assert metrics['accuracy'] == pytest.approx(np.mean(ref_pred == data.labels))


def test_sequence_loss_errors():
    model = Net()
    with pytest.raises(ValueError, match="loss 'count_ce' is a loss of the whole sequence"):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='count_ce', update_every=2)
    with pytest.raises(ValueError, match='target_rates must be two rates'):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='count_mse', target_rates=(2, 0))
    with pytest.raises(ValueError, match='loss must be one of'):
        Trainer(bc.D_RTRL(model), optax.sgd(0.1), loss='hinge')
    assert set(SEQUENCE_LOSSES) < set(LOSSES)
