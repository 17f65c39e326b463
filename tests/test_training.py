"""Trainer (per-sequence and truly online updates, evaluation, checkpoints, logs) and models.

Bad inputs are in test_training_bad_inputs.py, units in test_training_units.py,
checkpoint files in test_checkpoint.py."""
import json

import brainstate
import jax
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventDataset, moving_bars
from braintrace_conv.models import recurrent_conv_snn, standard_benchmark_snn
from braintrace_conv.training import logs
from braintrace_conv.training import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT, METRICS_NAME,
                                     SCALAR_COLUMNS, SCALARS_NAME, Trainer, step_weights)

T = 6
SIZE = (8, 8)


@pytest.fixture(scope='module')
def bars():
    return moving_bars(48, T=T, size=SIZE, seed=0).split(0.25, seed=0)


def tiny_model(seed=0, channels=(2, 4)):
    brainstate.random.seed(seed)
    return recurrent_conv_snn((2,) + SIZE, 8, channels=channels)


def tiny_trainer(seed=0, lr=1e-2, **kwargs):
    model = tiny_model(seed)
    return Trainer(bc.ES_D_RTRL(model, model.membrane_decay()), optax.adam(lr), **kwargs)


def params_of(trainer):
    states = trainer.model.states(brainstate.ParamState)
    return {k: np.asarray(st.value) for k, st in states.items()}


def adam_count(trainer):
    return int(trainer.opt_state[0].count)


def first_batch(dataset, batch_size=8):
    return next(dataset.batches(batch_size, shuffle=False))


# ----------------------------------------------------------------------------- models
def test_standard_benchmark_snn_structure():
    model = standard_benchmark_snn()
    shapes = {'.'.join(map(str, k)): np.shape(st.value)
              for k, st in model.states(brainstate.ParamState).items()}
    assert shapes == {'blocks.0.ff.weight': (8, 2, 3, 3), 'blocks.0.ff.bias': (8,),
                      'blocks.1.ff.weight': (16, 8, 3, 3), 'blocks.1.ff.bias': (16,),
                      'fc.weight': (16 * 16 * 16, 10), 'fc.bias': (10,)}
    brainstate.nn.init_all_states(model, 3)
    assert model(np.zeros((3, 2, 32, 32), np.float32)).shape == (3, 10)
    assert model.membrane_decay() == pytest.approx(np.exp(-0.1))


@pytest.mark.parametrize('in_shape, pool', [((2,) + SIZE, 1), ((1, 40), 2)])
def test_every_parameter_goes_through_etp_ops(in_shape, pool):
    brainstate.random.seed(0)
    model = recurrent_conv_snn(in_shape, 8, channels=(2, 4), pool=pool)
    learner = bc.ES_D_RTRL(model, model.membrane_decay())
    learner.predict(np.zeros((1, 2) + in_shape, np.float32))
    report = learner.report()
    assert len(report.rows) == len(model.states(brainstate.ParamState))
    for row in report.rows:
        assert 'via etp_' in row['method'] and 'non-ETP' not in row['method'], row


@pytest.mark.parametrize('in_shape, kernel, features', [
    ((1, 700), (4, 1, 7), 6 * 87),                # 700 -pool-> 350 -stride-> 175 -pool-> 87
    ((2, 9, 9), (4, 2, 3, 3), 6 * 1 * 1),         # 9 -pool-> 4 -stride-> 2 -pool-> 1
    ((2, 8, 8, 8), (4, 2, 3, 3, 3), 6 * 1 * 1 * 1),
])
def test_models_of_every_rank_pool_after_the_neurons(in_shape, kernel, features):
    brainstate.random.seed(0)
    model = recurrent_conv_snn(in_shape, 5, channels=(4, 6), kernel_size=kernel[-1], pool=2)
    assert model.blocks[0].ff.weight.value.shape == kernel
    assert model.blocks[1].rec.weight.value.shape[:2] == (6, 6)
    assert len(model.pools) == 2 and model.fc.weight.value.shape == (features, 5)
    brainstate.nn.init_all_states(model, 3)
    assert model(np.ones((3,) + in_shape, np.float32)).shape == (3, 5)


def test_model_rejects_wrong_input_shape_and_arguments():
    model = tiny_model()
    brainstate.nn.init_all_states(model, 2)
    with pytest.raises(ValueError, match='expects inputs'):
        model(np.zeros((2, 2, 9, 9), np.float32))
    with pytest.raises(ValueError, match='readout'):
        recurrent_conv_snn((2, 8, 8), 8, readout='softmax')
    with pytest.raises(ValueError, match=r'channels\[1\]'):
        recurrent_conv_snn((2, 8, 8), 8, channels=(4, 0))
    with pytest.raises(ValueError, match=r'in_shape must be \(C, \*spatial\) with 1 to 3 spatial'):
        recurrent_conv_snn((700,), 8)
    with pytest.raises(ValueError, match=r'pool=3 is larger than the output of block 1, of shape '
                                         r'\(C, \*spatial\) = \(4, 1\)'):
        recurrent_conv_snn((1, 6), 8, channels=(2, 4), pool=3)


# ----------------------------------------------------------------------------- updates
def test_online_updates_every_k_steps(bars):
    train, _ = bars
    xs, labels = first_batch(train)
    per_sequence, online = tiny_trainer(), tiny_trainer(update_every=2)
    per_sequence.train_batch(xs, labels)
    online.train_batch(xs, labels)
    assert adam_count(per_sequence) == 1
    assert adam_count(online) == T // 2
    a, b = params_of(per_sequence), params_of(online)
    assert any(not np.allclose(a[k], b[k]) for k in a)

    final = tiny_trainer(update_every=2, loss='final', final_steps=2)
    final.train_batch(xs, labels)
    assert adam_count(final) == 1          # only the last chunk carries loss


def test_online_with_whole_sequence_chunk_matches_per_sequence(bars):
    train, _ = bars
    xs, labels = first_batch(train)
    old = brainstate.environ.get_precision()
    brainstate.environ.set(precision=64)
    try:
        per_sequence, one_chunk = tiny_trainer(), tiny_trainer(update_every=T)
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
    trainer = Trainer(bc.ES_D_RTRL(model, model.membrane_decay()), optax.adam(2e-2),
                      update_every=3)
    data = easy_dataset()
    before = trainer.evaluate(data, 16)
    history = trainer.fit(data, epochs=4, batch_size=8, progress=False)
    after = trainer.evaluate(data, 16)
    assert history[-1]['train_loss'] < 0.6 * history[0]['train_loss']
    assert after['loss'] < 0.5 * before['loss']
    assert after['accuracy'] >= 0.9


# ----------------------------------------------------------------------------- evaluation
def test_evaluate_excludes_padding_and_reports_spike_rates(bars):
    _, test = bars
    trainer = tiny_trainer()
    a, b = trainer.evaluate(test, batch_size=5), trainer.evaluate(test, batch_size=len(test))
    assert set(a['spike_rates']) == set(trainer.spiking_layers) == {'blocks.0.neuron',
                                                                    'blocks.1.neuron'}
    assert a['accuracy'] == b['accuracy'] and 0 <= a['accuracy'] <= 1
    assert a['loss'] == pytest.approx(b['loss'], rel=1e-5)
    for name, rate in a['spike_rates'].items():
        assert 0 < rate < 1
        assert rate == pytest.approx(b['spike_rates'][name], rel=1e-5)


def test_step_weights():
    np.testing.assert_array_equal(step_weights('every_step', 4), [0.25] * 4)
    np.testing.assert_array_equal(step_weights('final', 4, 2), [0, 0, 0.5, 0.5])
    with pytest.raises(ValueError, match='final_steps must be at most'):
        step_weights('final', 1, 2)


# ----------------------------------------------------------------------------- checkpoints
def test_resume_gives_identical_result(bars, tmp_path):
    train, test = bars
    kwargs = dict(batch_size=8, seed=3, eval_dataset=test, progress=False)
    straight = tiny_trainer(update_every=3)
    straight.fit(train, epochs=2, out_dir=tmp_path / 'straight', **kwargs)

    interrupted = tiny_trainer(update_every=3)
    interrupted.fit(train, epochs=1, out_dir=tmp_path / 'resumed', **kwargs)
    resumed = tiny_trainer(seed=7, update_every=3)       # other initial weights: restore must win
    resumed.fit(train, epochs=2, out_dir=tmp_path / 'resumed', resume=True, **kwargs)

    assert resumed.epoch == straight.epoch == 2
    a, b = params_of(straight), params_of(resumed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    for x, y in zip(jax.tree.leaves(straight.opt_state), jax.tree.leaves(resumed.opt_state)):
        np.testing.assert_array_equal(x, y)
    assert [r['train_loss'] for r in resumed.history] == \
        [r['train_loss'] for r in straight.history]
    assert resumed.history[1]['test_accuracy'] == straight.history[1]['test_accuracy']


def test_save_and_restore_checkpoint_round_trip(bars, tmp_path):
    train, _ = bars
    trainer = tiny_trainer()
    trainer.fit(train, epochs=1, batch_size=8, progress=False)
    path = tmp_path / 'ckpt.npz'
    trainer.save_checkpoint(path)
    other = tiny_trainer(seed=5)
    other.restore_checkpoint(path)
    assert other.epoch == 1 and other.history == trainer.history
    assert other.step == trainer.step == len(train) // 8
    for k, v in params_of(trainer).items():
        np.testing.assert_array_equal(params_of(other)[k], v)
    for x, y in zip(jax.tree.leaves(trainer.opt_state), jax.tree.leaves(other.opt_state)):
        np.testing.assert_array_equal(x, y)
    assert other._rng.bit_generator.state == trainer._rng.bit_generator.state


def test_fit_writes_metrics_and_learning_curve(bars, tmp_path):
    train, test = bars
    trainer = Trainer(bc.BPTT(tiny_model()), optax.adam(1e-2), loss='final', final_steps=2)
    trainer.fit(train, epochs=2, batch_size=8, eval_dataset=test, out_dir=tmp_path,
                progress=False)
    metrics = json.loads((tmp_path / METRICS_NAME).read_text())
    assert metrics['algorithm'] == 'BPTT' and metrics['loss'] == 'final'
    assert metrics['epochs_completed'] == 2 and len(metrics['train_loss']) == 2
    assert metrics['test_accuracy'] == metrics['history'][-1]['test_accuracy']
    assert set(metrics['history'][0]['spike_rates']) == {'blocks.0.neuron', 'blocks.1.neuron'}
    assert metrics['best']['test_accuracy'] == max(r['test_accuracy'] for r in metrics['history'])
    assert (tmp_path / CURVE_NAME).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert (tmp_path / LAST_CHECKPOINT).exists() and (tmp_path / BEST_CHECKPOINT).exists()
    rows = (tmp_path / SCALARS_NAME).read_text().splitlines()
    assert rows[0] == ','.join(SCALAR_COLUMNS)
    steps = [int(r.split(',')[0]) for r in rows[1:]]
    assert steps == list(range(1, 2 * (len(train) // 8) + 1))     # one row per update


def test_run_title_names_task_algorithm_and_settings():
    config = dict(task='digits', algorithm='D-RTRL', loss='final', final_steps=3,
                  update_every=5, lr=0.01, batch_size=16, channels=[4, 8], seed=2)
    assert logs.run_title(config) == ('digits, D-RTRL\nloss on the last 3 step(s) | update '
                                      'every 5 steps | lr 0.01 | batch 16 | channels 4,8 | seed 2')
