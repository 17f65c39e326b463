"""Saving and restoring a Trainer: round trips (bitwise, bfloat16 too), loading parameters for
inference, and a restore that checks everything before it changes anything."""
import hashlib
import json
import os

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventDataset, moving_bars
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import (LAST_CHECKPOINT, CheckpointError, ConfigMismatchError,
                                      Trainer, checkpoint)

T, SIZE, K = 6, (8, 8), 8


def model(seed=0, channels=(2, 4)):
    brainstate.random.seed(seed)
    return recurrent_conv_snn((2,) + SIZE, K, channels=channels)


def trainer(seed=0, optimizer='adam', channels=(2, 4), **kwargs):
    m = model(seed, channels)
    opt = optax.adam(1e-2) if optimizer == 'adam' else optimizer
    return Trainer(bc.ES_D_RTRL(m, m.membrane_decay()), opt, **kwargs)


def events_with(value, at, n=16):
    """A dataset of n samples whose events hold ``value`` at index ``at`` (sample, t, c, y, x)."""
    events = (np.random.default_rng(0).random((n, T, 2) + SIZE) < 0.3).astype(np.float32)
    events[at] = value
    return EventDataset(events, np.arange(n) % K, K)


@pytest.fixture(scope='module')
def data():
    return moving_bars(32, T=T, size=SIZE, seed=0).split(0.25, seed=0)


@pytest.fixture(scope='module')
def run(data, tmp_path_factory):
    """A finished one-epoch run directory and the trainer that wrote it."""
    out = tmp_path_factory.mktemp('run')
    tr = trainer()
    tr.fit(data[0], epochs=1, batch_size=8, eval_dataset=data[1], out_dir=out, progress=False)
    return out, tr


def state_of(tr) -> dict:
    """Everything a failed call must leave unchanged."""
    return dict(
        params={k: np.array(v) for k, v in tr._view.named(tr._view.mantissas()).items()},
        opt=[np.array(x) for x in jax.tree.leaves(tr.opt_state)],
        counters=(tr.epoch, tr.step, tr.skipped_updates, json.dumps(tr.history), tr.best,
                  json.dumps(tr.run_config)),
        rng=None if tr._rng is None else json.dumps(tr._rng.bit_generator.state),
        key=np.array(jax.random.key_data(brainstate.random.get_key())))


def files_of(directory) -> dict:
    return {os.path.relpath(os.path.join(root, f), directory):
            hashlib.sha256(open(os.path.join(root, f), 'rb').read()).hexdigest()
            for root, _, names in os.walk(directory) for f in names}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert a[k].keys() == b[k].keys()
            assert all(np.array_equal(a[k][n], b[k][n]) for n in a[k]), k
        elif isinstance(a[k], list):
            assert len(a[k]) == len(b[k]) and all(map(np.array_equal, a[k], b[k])), k
        elif isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def refused(tr, call, error, match, directory=None):
    """``call()`` raises ``error`` matching ``match`` and changes neither ``tr`` nor ``directory``."""
    before, disk = state_of(tr), files_of(directory) if directory else None
    with pytest.raises(error, match=match):
        call()
    assert_same(before, state_of(tr))
    if directory is not None:
        assert files_of(directory) == disk


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
    assert {np.asarray(v).dtype for v in restored._view.mantissas().values()} == \
        {np.dtype(jnp.bfloat16)}


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


def adam_trainer(seed=0, optimizer=True):
    brainstate.random.seed(seed)
    model = recurrent_conv_snn((2,) + SIZE, 8, channels=(2, 4))
    return Trainer(bc.ES_D_RTRL(model, model.membrane_decay()),
                   optax.adam(2e-2) if optimizer else None)


@pytest.fixture(scope='module')
def evaluated_run(bars, tmp_path_factory):
    out = tmp_path_factory.mktemp('run')
    tr = adam_trainer()
    tr.fit(bars[0], epochs=3, batch_size=12, eval_dataset=bars[1], out_dir=out, progress=False)
    return out, tr


def test_load_params_for_inference_needs_no_optimizer(evaluated_run, bars):
    out, tr = evaluated_run
    inference = adam_trainer(seed=5, optimizer=False)
    meta = inference.load_params(out)                       # default: the best checkpoint
    assert meta['epoch'] == tr.best['epoch']
    assert inference.evaluate(bars[1], 12)['accuracy'] == tr.best['test_accuracy']
    inference.load_params(out, which='last')
    final = tr.evaluate(bars[1], 12)
    assert inference.evaluate(bars[1], 12) == final
    assert final['accuracy'] == tr.history[-1]['test_accuracy']
