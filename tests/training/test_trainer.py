"""Trainer: construction, updates per sequence and truly online, evaluation, and the bad inputs
each of them refuses, leaving the trainer as it was."""
import json

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventDataset
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import Trainer

from trainers import SIZE, K, T, events_with, model, params_of, refused, state_of, trainer


def adam_count(trainer):
    return int(trainer.opt_state[0].count)


def first_batch(dataset, batch_size=8):
    return next(dataset.batches(batch_size, shuffle=False))


# ----------------------------------------------------------------------------- updates
def test_online_updates_every_k_steps(bars):
    train, _ = bars
    xs, labels = first_batch(train)
    per_sequence, online = trainer(), trainer(update_every=2)
    per_sequence.train_batch(xs, labels)
    online.train_batch(xs, labels)
    assert adam_count(per_sequence) == 1
    assert adam_count(online) == T // 2
    a, b = params_of(per_sequence), params_of(online)
    assert any(not np.allclose(a[k], b[k]) for k in a)

    final = trainer(update_every=2, loss='final', final_steps=2)
    final.train_batch(xs, labels)
    assert adam_count(final) == 1          # only the last chunk carries loss


def test_online_with_whole_sequence_chunk_matches_per_sequence(bars):
    train, _ = bars
    xs, labels = first_batch(train)
    old = brainstate.environ.get_precision()
    brainstate.environ.set(precision=64)
    try:
        per_sequence, one_chunk = trainer(), trainer(update_every=T)
        loss_a, hits_a = per_sequence.train_batch(xs, labels)
        loss_b, hits_b = one_chunk.train_batch(xs, labels)
    finally:
        brainstate.environ.set(precision=old)
    assert loss_a == pytest.approx(loss_b, rel=1e-10) and hits_a == hits_b
    a, b = params_of(per_sequence), params_of(one_chunk)
    for k in a:
        assert a[k].dtype == np.float64
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12)


def easy_dataset(n=32, seed=0):
    """Class 0: ON events in the left half; class 1: OFF events in the right half."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    events = np.zeros((n, T, 2) + SIZE, np.float32)
    half = SIZE[1] // 2
    for i, label in enumerate(labels):
        cols = slice(0, half) if label == 0 else slice(half, None)
        events[i, :, label, :, cols] = rng.random((T, SIZE[0], half)) < 0.3
    return EventDataset(events, labels, num_classes=2)


def test_online_training_decreases_loss_on_easy_problem():
    brainstate.random.seed(1)
    model = recurrent_conv_snn((2,) + SIZE, 2, channels=(2, 4))
    tr = Trainer(bc.ES_D_RTRL(model, model.membrane_decay()), optax.adam(2e-2),
                 update_every=3)
    data = easy_dataset()
    before = tr.evaluate(data, 16)
    history = tr.fit(data, epochs=4, batch_size=8, progress=False)
    after = tr.evaluate(data, 16)
    assert history[-1]['train_loss'] < 0.6 * history[0]['train_loss']
    assert after['loss'] < 0.5 * before['loss']
    assert after['accuracy'] >= 0.9


# ----------------------------------------------------------------------------- evaluation
def test_evaluate_excludes_padding_and_reports_spike_rates(bars):
    _, test = bars
    tr = trainer()
    a, b = tr.evaluate(test, batch_size=5), tr.evaluate(test, batch_size=len(test))
    assert set(a['spike_rates']) == set(tr.spiking_layers) == {'blocks.0.neuron',
                                                                    'blocks.1.neuron'}
    assert a['accuracy'] == b['accuracy'] and 0 <= a['accuracy'] <= 1
    assert a['loss'] == pytest.approx(b['loss'], rel=1e-5)
    for name, rate in a['spike_rates'].items():
        assert 0 < rate < 1
        assert rate == pytest.approx(b['spike_rates'][name], rel=1e-5)


# ----------------------------------------------------------------------------- construction
@pytest.mark.parametrize('make, error, match', [
    (lambda m: Trainer(m, optax.adam(1e-2)), TypeError, 'learner must be an executor'),
    (lambda m: Trainer(bc.BPTT(m), 'adam'), TypeError, 'optimizer must be an optax'),
    (lambda m: Trainer(bc.BPTT(m), loss='mean'), ValueError, 'loss must be one of'),
    (lambda m: Trainer(bc.BPTT(m), final_steps=1.5), ValueError,
     'final_steps must be a positive integer, got 1.5'),
    (lambda m: Trainer(bc.BPTT(m), update_every=0), ValueError,
     r'update_every must be None \(one update per sequence\) or a positive integer, '
     r'got 0\.'),
    (lambda m: Trainer(bc.BPTT(m), update_every=True), ValueError,
     r'update_every must be None \(one update per sequence\) or a positive integer, '
     r'got True\.'),
    (lambda m: Trainer(bc.BPTT(m), nonfinite='ignore'), ValueError,
     "nonfinite must be one of \\('skip', 'raise'\\)"),
    (lambda m: Trainer(bc.BPTT(m), rate_strength=float('inf')), ValueError,
     r'^rate_strength must be a positive number, got inf\.$'),
    (lambda m: Trainer(bc.BPTT(brainstate.nn.Module())), ValueError, 'no brainstate.ParamState'),
    # a setting given where it changes nothing is refused, not silently ignored
    (lambda m: Trainer(bc.BPTT(m), final_steps=3), ValueError,
     r"^final_steps must be None unless loss='final', got 3; it has no effect with "
     r"loss='every_step'\.$"),
    (lambda m: Trainer(bc.BPTT(m), loss='count_ce', target_rates=(0.9, 0.1)), ValueError,
     r"^target_rates must be None unless loss='count_mse', got \(0\.9, 0\.1\); it has no "
     r"effect with loss='count_ce'\.$"),
    (lambda m: Trainer(bc.BPTT(m), rate_strength=2.0), ValueError,
     r'^rate_strength must be None unless rate_targets is set, got 2\.0; it weights the '
     r'regulariser rate_targets turns on\.$'),
])
def test_construction(make, error, match):
    m = model()
    before = {k: np.array(st.value) for k, st in m.states(brainstate.ParamState).items()}
    with pytest.raises(error, match=match):
        make(m)
    assert all(np.array_equal(v, m.states(brainstate.ParamState)[k].value)
               for k, v in before.items())


# ----------------------------------------------------------------------------- batches
def batch(data, n=8):
    xs, labels = next(data[0].batches(n, shuffle=False))
    return xs.copy(), labels.copy()


@pytest.mark.parametrize('edit, error, match', [
    (lambda xs, y: (xs, y.astype(bool)), TypeError, 'labels must be integer class labels'),
    (lambda xs, y: (xs, y.astype(float)), TypeError, 'labels must be integer class labels'),
    (lambda xs, y: (xs, y[:5]), ValueError, r'labels must have shape \(8,\), got \(5,\)'),
    (lambda xs, y: (xs, np.full_like(y, K)), ValueError,
     r'labels must lie in \[0, 8\) \(the model has 8 outputs\), got values in \[8, 8\]'),
    (lambda xs, y: (xs, y - 10), ValueError, r'labels must lie in \[0, 8\)'),
    (lambda xs, y: (np.zeros((T, 8, 2, 9, 9), np.float32), y), ValueError,
     r'xs does not fit the model: one step of shape \(B, 2, 9, 9\)'),
    (lambda xs, y: (xs[0, 0, 0], y), ValueError, r'xs must be a numeric array \(T, B, ...\)'),
    (lambda xs, y: (xs.astype(str), y), ValueError, r'xs must be a numeric array'),
])
def test_train_batch(data, edit, error, match):
    tr = trainer()
    xs, labels = edit(*batch(data))
    refused(tr, lambda: tr.train_batch(xs, labels), error, match)


def test_nan_position_is_named(data):
    xs, labels = batch(data)
    xs[3, 5, 1, 2, 6] = np.nan
    tr = trainer()
    refused(tr, lambda: tr.train_batch(xs, labels), ValueError,
            r'xs must be finite, got nan at t=3, b=5, channel=1, row=2, column=6')


def test_the_learners_check_finite_switch_governs_the_trainers_input_check(data):
    xs, labels = batch(data)
    xs[3, 5, 1, 2, 6] = np.nan
    m = model()
    tr = Trainer(bc.ES_D_RTRL(m, m.membrane_decay(), check_finite=False), optax.adam(1e-2))
    with pytest.warns(RuntimeWarning, match='skipped an optimiser update: non-finite gradient'):
        tr.train_batch(xs, labels)                          # nonfinite='skip' decides
    assert (tr.updates, tr.skipped_updates) == (1, 1)
    # off, a data set is not checked either
    assert tr.evaluate(events_with(np.nan, (3, 0, 1, 0, 0)))['accuracy'] >= 0


class Loud(brainstate.nn.Module):
    """Returns a layer's spikes offset by 1e308: their mean, the penalty and its derivative
    overflow (as a large --rate-strength does in float32)."""

    def __init__(self):
        super().__init__()
        self.net = recurrent_conv_snn((2,) + SIZE, K, channels=(2, 4), return_spikes=True)

    def update(self, x):
        scores, spikes = self.net(x)
        return scores, {'loud': spikes['blocks.0.neuron'] + 1e308}


@pytest.mark.parametrize('nonfinite', ['skip', 'raise'])
def test_a_regulariser_that_overflows_is_a_nonfinite_update_not_bad_data(data, nonfinite):
    # the loss and its derivative with respect to the outputs are infinite for finite,
    # checked data: the trainer takes no gradient, and nonfinite decides
    tr = Trainer(bc.BPTT(Loud()), optax.adam(1e-2), rate_targets={'loud': 0.1},
                 nonfinite=nonfinite)
    xs, labels = batch(data)
    if nonfinite == 'raise':
        refused(tr, lambda: tr.train_batch(xs, labels), FloatingPointError,
                r'update 1 \(epoch 1\): non-finite loss; parameters and optimiser state are '
                r'unchanged')
        return
    with pytest.warns(RuntimeWarning, match='skipped an optimiser update: non-finite loss'):
        assert tr.train_batch(xs, labels)[0] == np.inf
    assert (tr.updates, tr.skipped_updates) == (1, 1)
    loss, grads = tr.value_and_grad(xs, labels)
    assert loss == np.inf and all(np.isnan(g).all() for g in jax.tree.leaves(grads))


# ----------------------------------------------------------------------------- gradients
def grads_like(tr, value=0.0):
    return {key: jnp.full_like(st.value, value)
            for key, st in tr.model.states(brainstate.ParamState).items()}


@pytest.mark.parametrize('edit, error, match', [
    (lambda g: {k: v for k, v in g.items() if k != ('fc', 'bias')}, ValueError,
     'grads must be a dict keyed like model.states'),
    (lambda g: {**g, ('fc', 'bias'): jnp.zeros(3)}, ValueError,
     r'the gradient of fc.bias must have shape \(8,\), got \(3,\)'),
    (lambda g: list(g.values()), ValueError, 'grads must be a dict keyed like'),
])
def test_apply_gradients_structure(edit, error, match):
    tr = trainer()
    refused(tr, lambda: tr.apply_gradients(edit(grads_like(tr))), error, match)


def test_nonfinite_gradient_raises_and_changes_nothing():
    tr = trainer(nonfinite='raise')
    grads = grads_like(tr, 0.1)
    grads['fc', 'weight'] = grads['fc', 'weight'].at[0, 0].set(jnp.nan)
    refused(tr, lambda: tr.apply_gradients(grads), FloatingPointError,
            r'update 1 \(epoch 1\): non-finite gradient of fc.weight; parameters and optimiser '
            r'state are unchanged')


def test_nonfinite_gradient_is_skipped_counted_and_warned():
    tr = trainer()
    grads = grads_like(tr, 0.1)
    grads['blocks', 0, 'ff', 'bias'] = grads['blocks', 0, 'ff', 'bias'] * jnp.inf
    before = state_of(tr)
    with pytest.warns(RuntimeWarning, match='skipped an optimiser update: non-finite gradient '
                                            'of blocks.0.ff.bias'):
        assert tr.apply_gradients(grads) is False
    assert (tr.updates, tr.skipped_updates) == (1, 1)
    after = state_of(tr)
    assert all(np.array_equal(before[0][name], after[0][name])
               for name in before[0] if name.startswith(('param/', 'opt/')))


class Fragile(brainstate.nn.Module):
    """Scores become NaN for a sample whose pixel (0, 0) of channel 0 holds 3 events
    (finite data the model cannot handle: log of a negative number)."""

    def __init__(self):
        super().__init__()
        self.net = model()

    def update(self, x):
        return self.net(x) + jnp.log(2.0 - x[:, 0, 0, 0])[:, None]


@pytest.mark.parametrize('nonfinite', ['skip', 'raise'])
def test_data_that_makes_the_loss_nan_never_reaches_the_weights(nonfinite, tmp_path):
    data = events_with(3.0, (1, 2, 0, 0, 0))
    tr = Trainer(bc.BPTT(Fragile()), optax.adam(1e-2), nonfinite=nonfinite)
    before = tr.params()
    if nonfinite == 'raise':        # stops at the first update, which is not applied
        with pytest.raises(FloatingPointError, match='update 1 .*non-finite gradient of'):
            tr.fit(data, epochs=1, batch_size=16, progress=False)
        assert (tr.updates, tr.epoch, tr.history) == (0, 0, [])
        assert all(np.array_equal(before[n], v) for n, v in tr.params().items())
        return
    with pytest.warns(RuntimeWarning, match='skipped an optimiser update'):
        history = tr.fit(data, epochs=1, batch_size=16, out_dir=tmp_path, progress=False)
    assert history[0]['skipped_updates'] == tr.skipped_updates == 1 and np.isnan(
        history[0]['train_loss'])
    assert all(np.array_equal(before[n], v) for n, v in tr.params().items())
    metrics = json.loads((tmp_path / 'metrics.json').read_text())   # strict JSON: NaN -> null
    assert metrics['skipped_updates'] == 1 and metrics['train_loss'] == [None]


# ----------------------------------------------------------------------------- evaluation
def test_evaluate_checks(data):
    tr = trainer()
    refused(tr, lambda: tr.evaluate(data[1], batch_size=0), ValueError,
            'batch_size must be a positive integer, got 0')
    refused(tr, lambda: tr.evaluate(events_with(-np.inf, (3, 0, 1, 0, 0))), ValueError,
            'dataset events must be finite, got -inf at sample=3, t=0, channel=1')


def test_bfloat16_inputs_are_accepted():
    import ml_dtypes
    tr = trainer()
    xs = (np.random.default_rng(0).random((T, 4, 2) + SIZE) < 0.3)
    labels = np.arange(4) % K
    loss_bf16, _ = tr.value_and_grad(xs.astype(ml_dtypes.bfloat16), labels)
    loss_f64, _ = tr.value_and_grad(xs.astype(np.float64), labels)
    assert loss_bf16 == loss_f64      # 0/1 events are exact in bfloat16


def test_checks_leave_the_model_and_the_random_key_as_they_were(data):
    tr = trainer()
    brainstate.nn.init_all_states(tr.model, 3)
    hidden = {key: (st, np.array(st.value)) for key, st in
              tr.model.states(brainstate.HiddenState).items()}
    key = np.array(jax.random.key_data(brainstate.random.get_key()))
    tr.check_fit(data[0], epochs=1, batch_size=8, eval_dataset=data[1])
    assert np.array_equal(key, jax.random.key_data(brainstate.random.get_key()))
    now = tr.model.states(brainstate.HiddenState)
    assert now.keys() == hidden.keys()
    for name, (state, value) in hidden.items():
        assert now[name] is state and np.array_equal(state.value, value), name   # batch of 3


def test_params_and_the_deprecated_step():
    tr = trainer()
    params = tr.params()
    assert set(params) == {'blocks.0.ff.weight', 'blocks.0.ff.bias',
                           'blocks.1.ff.weight', 'blocks.1.ff.bias', 'blocks.1.rec.weight',
                           'fc.weight', 'fc.bias'}
    assert all(isinstance(v, np.ndarray) for v in params.values())
    with pytest.warns(DeprecationWarning, match='Trainer.step is Trainer.updates'):
        assert tr.step == tr.updates == 0

