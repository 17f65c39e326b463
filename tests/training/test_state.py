"""Saving and restoring a Trainer: round trips (bitwise, bfloat16 too), loading parameters for
inference, and a restore that checks everything before it changes anything."""

import json

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import moving_bars
from braintrace_conv.training import (LAST_CHECKPOINT, CheckpointError, ConfigMismatchError,
                                      Trainer, checkpoint)
from braintrace_conv.training.state import run_differences, snapshot

from trainers import SIZE, assert_same, model, refused, state_of, trainer


def rewritten(run, tmp_path, edit):
    """The run's last checkpoint re-written as a well-formed archive after ``edit(arrays, meta)``
    (zip CRCs are valid; only the digest or the content can tell)."""
    arrays, meta = checkpoint.read(run[0] / LAST_CHECKPOINT)
    edit(arrays, meta)
    path = tmp_path / 'edited.npz'
    checkpoint.write(path, arrays, meta)
    return path


@pytest.mark.parametrize('edit, make, error, match', [
    (lambda a, m: a.pop('param/fc.bias'), None, CheckpointError,
     r"do not match the model: only in the checkpoint \[\], only in the model \['fc.bias'\]"),
    (None, lambda: trainer(channels=(3, 4)), CheckpointError,
     r'parameter blocks.0.ff.bias in .* has shape \(2,\), the model has \(3,\)'),
    (None, lambda: trainer(optimizer=optax.sgd(0.1, momentum=0.9)), CheckpointError,
     'the optimiser state in .* does not match this one'),
    (None, lambda: trainer(update_every=3), ConfigMismatchError,
     "update_every: None in the checkpoint, 3 now"),
    (lambda a, m: a.update({k: v.astype(np.float32) for k, v in a.items()
                            if k.startswith('param/')}), None, CheckpointError,
     r'is float32, the model is float64 \(set jax_enable_x64'),
    (lambda a, m: m['rng'].update(state='broken'), None, CheckpointError,
     'invalid generator states'),
    (lambda a, m: m.pop('history'), None, CheckpointError, "lacks a valid 'history' entry"),
    (lambda a, m: m.update(epoch='3'), None, CheckpointError, "lacks a valid 'epoch' entry"),
    (lambda a, m: m['units'].update({'fc.weight': 'mV'}), None, CheckpointError,
     "parameter fc.weight in .* is in unit 'mV', the model has '1'"),
])
def test_restore_validates_everything_before_changing_anything(run, tmp_path, edit, make,
                                                                 error, match):
    path = rewritten(run, tmp_path, edit or (lambda a, m: None))
    tr = (make or (lambda: trainer(seed=9)))()
    refused(tr, lambda: tr.restore_checkpoint(path), error, match, tmp_path)


def test_a_bfloat16_model_is_saved_and_restored_bitwise(tmp_path):
    def bf16_trainer():
        m = model()
        for st in m.states(brainstate.ParamState).values():
            st.value = jax.tree.map(lambda v: v.astype(jnp.bfloat16), st.value)
        return Trainer(bc.BPTT(m), optax.adam(1e-2))
    tr = bf16_trainer()
    tr.fit(moving_bars(16, T=4, size=SIZE, seed=0), epochs=1, batch_size=8, progress=False)
    tr.save_checkpoint(tmp_path / 'bf16.npz')
    restored = bf16_trainer()
    restored.restore_checkpoint(tmp_path / 'bf16.npz')
    assert_same(state_of(tr), state_of(restored))
    assert {v.dtype for v in restored.params().values()} == \
        {np.dtype(jnp.bfloat16)}


def test_save_and_restore_checkpoint_round_trip(bars, tmp_path):
    train, _ = bars
    tr = trainer()
    tr.fit(train, epochs=1, batch_size=8, progress=False)
    path = tmp_path / 'ckpt.npz'
    tr.save_checkpoint(path)
    other = trainer(seed=5)
    other.restore_checkpoint(path)
    assert other.epoch == 1 and other.history == tr.history
    assert other.updates == tr.updates == len(train) // 8
    # parameters, optimiser state, counters, history and the shuffling generator
    assert_same(state_of(other), state_of(tr))


def test_a_trainer_updated_with_train_batch_restores_its_own_checkpoint(bars, tmp_path):
    # no fit, so no shuffling generator yet: the checkpoint holds none, and fit seeds one
    train, _ = bars
    tr = trainer()
    xs, labels = next(train.batches(8))
    tr.train_batch(xs, labels)
    path = tmp_path / 'ckpt.npz'
    tr.save_checkpoint(path)
    other = trainer(seed=5)
    other.restore_checkpoint(path)
    assert other.updates == 1 and other.epoch == 0
    assert_same(state_of(other), state_of(tr))
    assert trainer(seed=5, optimizer=None).load_params(path)['step'] == 1
    for continued in (tr, other):
        continued.fit(train, epochs=1, batch_size=8, seed=3, progress=False)
    continued, straight = state_of(other)[0], state_of(tr)[0]
    assert all(np.array_equal(continued[k], straight[k]) for k in straight)


def test_load_params_for_inference_needs_no_optimizer(evaluated_run, bars):
    out, tr = evaluated_run
    inference = trainer(seed=5, optimizer=None)
    meta = inference.load_params(out)                       # default: the best checkpoint
    assert meta['epoch'] == tr.best['epoch']
    assert inference.evaluate(bars[1], 12)['accuracy'] == tr.best['test_accuracy']
    inference.load_params(out, which='last')
    final = tr.evaluate(bars[1], 12)
    assert inference.evaluate(bars[1], 12) == final
    assert final['accuracy'] == tr.history[-1]['test_accuracy']


def test_a_larger_epochs_is_the_only_difference_a_resumed_run_may_have():
    stored = dict(epochs=2, lr=0.1)
    assert run_differences(stored, dict(epochs=3, lr=0.1), 3) == {}
    assert run_differences(stored, dict(epochs=2, lr=0.1), 2) == {}
    assert run_differences(stored, dict(epochs=1, lr=0.1), 1) == {'epochs': (2, 1)}
    # the given epochs is not the run's length: compared as any option
    assert run_differences(stored, dict(epochs=3, lr=0.1), 5) == {'epochs': (2, 3)}
    assert run_differences(stored, dict(epochs=3, lr=0.2), 3) == {'lr': (0.1, 0.2)}
    assert run_differences(dict(channels=[2, 4]), dict(channels=(2, 4)), 1) == {}


def test_a_snapshot_is_what_a_checkpoint_holds(run, tmp_path):
    _, tr = run
    arrays, meta = snapshot(tr)
    assert {name.split('/')[0] for name in arrays} == {'param', 'opt', 'rng'}
    assert (meta['epoch'], meta['step'], meta['trainer']) == (1, tr.updates, tr.config())
    tr.save_checkpoint(tmp_path / 'c.npz')
    saved_arrays, saved_meta = checkpoint.read(tmp_path / 'c.npz')
    assert saved_arrays.keys() == arrays.keys()
    assert {k: v for k, v in saved_meta.items() if k != 'format'} == \
        json.loads(json.dumps(meta))

