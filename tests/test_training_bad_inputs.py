"""Bad inputs to the Trainer, its data and its checkpoints: each is refused with an error
naming what was expected, and leaves the trainer (parameters, optimiser state, counters,
history, generators) and the files on disk exactly as they were.

Units are covered in test_training_units.py, the command line in test_cli_bad_inputs.py.
"""
import hashlib
import json
import os
import pickle
import zipfile

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventDataset, moving_bars
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import (CheckpointError, ConfigMismatchError, LAST_CHECKPOINT,
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


# ----------------------------------------------------------------------------- construction
@pytest.mark.parametrize('make, error, match', [
    (lambda m: Trainer(m, optax.adam(1e-2)), TypeError, 'learner must be an executor'),
    (lambda m: Trainer(bc.BPTT(m), 'adam'), TypeError, 'optimizer must be an optax'),
    (lambda m: Trainer(bc.BPTT(m), loss='mean'), ValueError, 'loss must be one of'),
    (lambda m: Trainer(bc.BPTT(m), final_steps=1.5), ValueError,
     'final_steps must be a positive int, got 1.5'),
    (lambda m: Trainer(bc.BPTT(m), update_every=0), ValueError,
     'update_every must be a positive int, got 0'),
    (lambda m: Trainer(bc.BPTT(m), update_every=True), ValueError,
     'update_every must be a positive int, got True'),
    (lambda m: Trainer(bc.BPTT(m), nonfinite='ignore'), ValueError,
     "nonfinite must be one of \\('skip', 'raise'\\)"),
    (lambda m: Trainer(bc.BPTT(brainstate.nn.Module())), ValueError, 'no brainstate.ParamState'),
])
def test_construction(make, error, match):
    m = model()
    before = {k: np.array(st.value) for k, st in m.states(brainstate.ParamState).items()}
    with pytest.raises(error, match=match):
        make(m)
    assert all(np.array_equal(v, m.states(brainstate.ParamState)[k].value)
               for k, v in before.items())


# ----------------------------------------------------------------------------- fit arguments
@pytest.mark.parametrize('kwargs, error, match', [
    (dict(epochs=0), ValueError, 'epochs must be a positive int, got 0'),
    (dict(epochs=2.5), ValueError, 'epochs must be a positive int, got 2.5'),
    (dict(batch_size=0), ValueError, 'batch_size must be a positive int, got 0'),
    (dict(batch_size=25), ValueError,
     r'batch_size must be at most the number of training samples \(24\), got 25'),
    (dict(seed=-1), ValueError, 'seed must be a non-negative int, got -1'),
    (dict(log_every=0), ValueError, 'log_every must be a positive int, got 0'),
    (dict(eval_batch_size=0), ValueError, 'eval_batch_size must be a positive int, got 0'),
    (dict(resume=True), ValueError, 'resume and overwrite need out_dir'),
    (dict(overwrite=True), ValueError, 'resume and overwrite need out_dir'),
    (dict(run_config={'schedule': print}), TypeError, 'run_config must be a JSON-able dict'),
    (dict(run_config=[1, 2]), TypeError, 'run_config must be a dict, got list'),
])
def test_fit_arguments(data, kwargs, error, match):
    tr = trainer()
    refused(tr, lambda: tr.fit(data[0], **{'epochs': 1, 'batch_size': 8, 'progress': False,
                                           **kwargs}), error, match)


def test_fit_without_optimizer(data):
    m = model()
    tr = Trainer(bc.BPTT(m))
    refused(tr, lambda: tr.fit(data[0], epochs=1, batch_size=8), ValueError,
            'fit needs an optimizer; this Trainer was built without one')


# ----------------------------------------------------------------------------- datasets
@pytest.mark.parametrize('train, evaluate, error, match', [
    (lambda d: d.events, None, TypeError, 'train_dataset must be a FrameDataset'),
    (lambda d: events_with(np.nan, (5, 2, 1, 3, 4)), None, ValueError,
     r'train_dataset events must be finite, got nan at sample=5, t=2, channel=1, row=3, '
     r'column=4 \(1 non-finite'),
    (None, lambda d: events_with(np.inf, (0, 5, 0, 7, 7)), ValueError,
     'eval_dataset events must be finite, got inf at sample=0, t=5, channel=0, row=7, column=7'),
    (lambda d: EventDataset(d.events, d.labels, 10), None, ValueError,
     'train_dataset has 10 classes but the model has 8 outputs'),
    (None, lambda d: moving_bars(8, T=T, size=(9, 9), seed=0), ValueError,
     r'eval_dataset does not fit the model: one step of shape \(B, 2, 9, 9\) gives: '
     r'RecurrentConvSNN expects inputs'),
    (lambda d: d.subset([]), None, ValueError, 'train_dataset must hold at least one sample'),
])
def test_datasets_are_checked_before_the_first_step(data, train, evaluate, error, match):
    tr = trainer()
    train_set = data[0] if train is None else train(data[0])
    eval_set = None if evaluate is None else evaluate(data[1])
    refused(tr, lambda: tr.fit(train_set, epochs=1, batch_size=8, eval_dataset=eval_set,
                               progress=False), error, match)


def test_final_steps_longer_than_the_data(data):
    tr = trainer(loss='final', final_steps=T + 1)
    refused(tr, lambda: tr.fit(data[0], epochs=1, batch_size=8, progress=False), ValueError,
            rf'train_dataset: final_steps must be at most .*\({T}\), got {T + 1}')


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


# ----------------------------------------------------------------------------- gradients
def grads_like(tr, value=0.0):
    return jax.tree.map(lambda p: jnp.full_like(p, value), tr._view.mantissas())


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
    assert (tr.step, tr.skipped_updates) == (1, 1)
    after = state_of(tr)
    assert all(np.array_equal(before['params'][n], after['params'][n]) for n in before['params'])
    assert all(map(np.array_equal, before['opt'], after['opt']))


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
    before = state_of(tr)['params']
    if nonfinite == 'raise':        # stops at the first update, which is not applied
        with pytest.raises(FloatingPointError, match='update 1 .*non-finite gradient of'):
            tr.fit(data, epochs=1, batch_size=16, progress=False)
        assert (tr.step, tr.epoch, tr.history) == (0, 0, [])
        assert all(np.array_equal(before[n], v) for n, v in state_of(tr)['params'].items())
        return
    with pytest.warns(RuntimeWarning, match='skipped an optimiser update'):
        history = tr.fit(data, epochs=1, batch_size=16, out_dir=tmp_path, progress=False)
    assert history[0]['skipped_updates'] == tr.skipped_updates == 1 and np.isnan(
        history[0]['train_loss'])
    assert all(np.array_equal(before[n], v) for n, v in state_of(tr)['params'].items())
    metrics = json.loads((tmp_path / 'metrics.json').read_text())   # strict JSON: NaN -> null
    assert metrics['skipped_updates'] == 1 and metrics['train_loss'] == [None]


# ----------------------------------------------------------------------------- evaluation
def test_evaluate_checks(data):
    tr = trainer()
    refused(tr, lambda: tr.evaluate(data[1], batch_size=0), ValueError,
            'batch_size must be a positive int, got 0')
    refused(tr, lambda: tr.evaluate(events_with(-np.inf, (3, 0, 1, 0, 0))), ValueError,
            'dataset events must be finite, got -inf at sample=3, t=0, channel=1')


# ----------------------------------------------------------------------------- checkpoints
class RunsCode:
    """Unpickling this calls ``open(marker, 'w')``: code a checkpoint must never run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def crafted_pickle(path, marker):
    path.write_bytes(pickle.dumps({'format': 'braintrace_conv.Trainer/1',
                                   'params': RunsCode(str(marker))}))


def crafted_npz(path, marker):
    with open(path, 'wb') as f:       # an object array: .npy stores it pickled
        np.savez(f, **{'param/fc.bias': np.array([RunsCode(str(marker))], dtype=object)})


@pytest.mark.parametrize('craft', [crafted_pickle, crafted_npz])
def test_crafted_checkpoint_never_runs_code(tmp_path, craft):
    marker = tmp_path / 'code-was-run'
    path = tmp_path / 'evil.npz'
    craft(path, marker)
    tr = trainer()
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError,
            'corrupt or not a checkpoint archive .*never unpickled', tmp_path)
    refused(tr, lambda: tr.load_params(path), CheckpointError, 'never unpickled', tmp_path)
    assert not marker.exists()


def test_crafted_pickle_is_live(tmp_path):
    """Control: the crafted file does run code when unpickled, so the test above means it."""
    marker = tmp_path / 'code-was-run'
    crafted_pickle(tmp_path / 'evil.pkl', marker)
    pickle.loads((tmp_path / 'evil.pkl').read_bytes())
    assert marker.exists()


def test_every_flipped_byte_is_refused_or_harmless(run, tmp_path):
    out, _ = run
    good = (out / LAST_CHECKPOINT).read_bytes()
    arrays, meta = checkpoint.read(out / LAST_CHECKPOINT)
    tr = trainer(seed=9)
    positions = np.linspace(0, len(good) - 1, 60).astype(int)
    loaded_intact = 0
    for pos in positions:
        bad = bytearray(good)
        bad[pos] ^= 0x5A
        path = tmp_path / 'flipped.npz'
        path.write_bytes(bytes(bad))
        try:
            got_arrays, got_meta = checkpoint.read(path)
        except CheckpointError as err:
            assert 'corrupt' in str(err) or 'format' in str(err), err
            continue
        # a flip in zip bookkeeping the data does not depend on (e.g. a timestamp)
        assert got_meta == meta and got_arrays.keys() == arrays.keys()
        assert all(np.array_equal(got_arrays[k], arrays[k]) for k in arrays)
        loaded_intact += 1
    assert loaded_intact < len(positions) // 4
    flipped = _flip_in_data(good, tmp_path)
    refused(tr, lambda: tr.restore_checkpoint(flipped), CheckpointError, 'Bad CRC-32', tmp_path)


def _flip_in_data(good: bytes, tmp_path):
    """A copy with one byte of the fc.weight values flipped (the zip CRC catches it)."""
    start = good.index(b'param/fc.weight.npy')
    path = tmp_path / 'data-flip.npz'
    bad = bytearray(good)
    bad[start + 300] ^= 0x01
    path.write_bytes(bytes(bad))
    return path


def rewritten(run, tmp_path, edit):
    """The run's last checkpoint re-written as a well-formed archive after ``edit(arrays, meta)``
    (zip CRCs are valid; only the digest or the content can tell)."""
    arrays, meta = checkpoint.read(run[0] / LAST_CHECKPOINT)
    edit(arrays, meta)
    path = tmp_path / 'edited.npz'
    checkpoint.write(path, arrays, meta)
    return path


def test_value_changed_behind_the_digest_is_refused(run, tmp_path):
    """A well-formed archive (valid zip CRCs) whose fc.bias was edited: only the digest knows."""
    with np.load(run[0] / LAST_CHECKPOINT, allow_pickle=False) as archive:
        entries = {name: archive[name] for name in archive.files}
    entries['param/fc.bias'] = entries['param/fc.bias'] + 1e-3
    path = tmp_path / 'tampered.npz'
    with open(path, 'wb') as f:
        np.savez(f, **entries)
    tr = trainer(seed=9)
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError,
            'corrupt: its SHA-256 digest does not match', tmp_path)


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


def test_wrong_format_truncated_and_missing_files(run, tmp_path, monkeypatch):
    tr = trainer(seed=9)
    good = (run[0] / LAST_CHECKPOINT).read_bytes()
    (tmp_path / 'truncated.npz').write_bytes(good[:len(good) // 2])
    (tmp_path / 'text.npz').write_text('epoch: 3\n')
    np.save(tmp_path / 'array.npy', np.zeros(3))
    content = checkpoint.read(run[0] / LAST_CHECKPOINT)
    with monkeypatch.context() as m:       # a checkpoint of another (future) format
        m.setattr(checkpoint, 'FORMAT', 'other/9')
        checkpoint.write(tmp_path / 'other.npz', *content)
    for name, match in [('truncated.npz', 'corrupt or not a checkpoint archive'),
                        ('text.npz', 'corrupt or not a checkpoint archive'),
                        ('array.npy', 'corrupt or not a checkpoint archive .*: not a zip archive'),
                        ('other.npz', "has format 'other/9'; this version reads")]:
        refused(tr, lambda: tr.restore_checkpoint(tmp_path / name), CheckpointError, match,
                tmp_path)
    refused(tr, lambda: tr.restore_checkpoint(tmp_path / 'absent.npz'), FileNotFoundError,
            'no checkpoint at', tmp_path)
    refused(tr, lambda: tr.load_params(tmp_path / 'empty-dir-file', which=None),
            FileNotFoundError, 'no checkpoint at', tmp_path)
    (tmp_path / 'emptyrun').mkdir()
    refused(tr, lambda: tr.load_params(tmp_path / 'emptyrun'), FileNotFoundError,
            'holds no checkpoint', tmp_path)
    refused(tr, lambda: tr.load_params(run[0], which='worst'), ValueError,
            "which must be one of \\('best', 'last'\\)", run[0])
    inference = Trainer(bc.BPTT(model()))
    refused(inference, lambda: inference.restore_checkpoint(run[0] / LAST_CHECKPOINT),
            ValueError, 'restore_checkpoint .*needs an optimizer', run[0])


# ----------------------------------------------------------------------------- run directories
def test_a_run_is_never_overwritten_silently(run, data, tmp_path):
    out, _ = run
    fit = dict(epochs=2, batch_size=8, eval_dataset=data[1], progress=False)
    tr = trainer(seed=9)
    refused(tr, lambda: tr.fit(data[0], out_dir=out, **fit), FileExistsError,
            'already holds a run .*checkpoint-last.npz.*; pass resume=True to continue it or '
            'overwrite=True to replace it', out)
    refused(tr, lambda: tr.fit(data[0], out_dir=out, resume=True, overwrite=True, **fit),
            ValueError, 'resume and overwrite exclude each other', out)
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path, resume=True, **fit),
            FileNotFoundError, 'nothing to resume: .* has no checkpoint-last.npz', tmp_path)
    (tmp_path / 'file').write_text('x')
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path / 'file', **fit), ValueError,
            'exists and is not a directory', tmp_path)
    (tmp_path / 'old').mkdir()
    (tmp_path / 'old' / 'checkpoint.pkl').write_bytes(b'\x80\x04N.')
    refused(tr, lambda: tr.fit(data[0], out_dir=tmp_path / 'old', **fit), FileExistsError,
            r'already holds a run \(checkpoint.pkl\)', tmp_path)


@pytest.mark.parametrize('change, match', [
    (dict(batch_size=4), r"batch_size: 8 in the checkpoint, 4 now"),
    (dict(seed=1), r"seed: 0 in the checkpoint, 1 now"),
    (dict(train=lambda d: d.subset(np.arange(20))), r"train_data: "),
    (dict(eval=lambda d: None), r"eval_data: "),
    (dict(run_config={'lr': 0.1}), r"lr: None in the checkpoint, 0.1 now"),
])
def test_resume_refuses_another_configuration(run, data, change, match):
    out, _ = run
    tr = trainer(seed=9)
    train = change.get('train', lambda d: d)(data[0])
    eval_set = change.get('eval', lambda d: d)(data[1])
    refused(tr, lambda: tr.fit(train, epochs=2, batch_size=change.get('batch_size', 8),
                               seed=change.get('seed', 0), eval_dataset=eval_set, out_dir=out,
                               resume=True, run_config=change.get('run_config'),
                               progress=False),
            ConfigMismatchError, match, out)


# ----------------------------------------------------------------------------- hostile checkpoints
def forged(run, tmp_path, meta_text: bytes, edit=None):
    """The run's last checkpoint re-written with the raw metadata ``meta_text`` (and
    ``edit(entries)``) under a recomputed digest: what only the schema checks can refuse."""
    arrays, _ = checkpoint.read(run[0] / LAST_CHECKPOINT)
    entries = dict(arrays, __meta__=np.frombuffer(meta_text, np.uint8))
    if edit is not None:
        edit(entries)
    entries['__sha256__'] = np.frombuffer(checkpoint._digest(entries).encode(), np.uint8)
    path = tmp_path / 'forged.npz'
    with open(path, 'wb') as f:
        np.savez(f, **entries)
    return path


@pytest.mark.parametrize('edit, match', [
    (lambda a, m: m.pop('epoch'), "lacks a valid 'epoch' entry"),
    (lambda a, m: m.update(epoch=-1), r'epoch = -1 in its metadata; it must lie in \[0, inf\]'),
    (lambda a, m: m.update(epoch=10**30), 'invalid history: 10{30} epoch'),
    (lambda a, m: m.update(history=[1, 2]), 'invalid history'),
    (lambda a, m: m.update(skipped_updates=-5), 'skipped_updates = -5'),
    (lambda a, m: m.update(rng=None), 'invalid generator states: the shuffling generator is '
                                      'None after 3 update'),
    (lambda a, m: m.update(best=dict(epoch=4, test_accuracy=0.5)), 'invalid best entry'),
    (lambda a, m: m.update(devices=0), r'devices = 0 in its metadata; it must lie in \[1, inf\]'),
    (lambda a, m: a['param/fc.weight'].__setitem__((0, 0), np.nan),
     r'non-finite values \(NaN or infinity\) in param/fc.weight'),
    (lambda a, m: a['opt/1'].fill(np.inf), 'non-finite values .* in opt/1'),
])
def test_metadata_schema_is_checked_before_use(run, tmp_path, edit, match):
    def copy_and_edit(arrays, meta):
        for name in arrays:
            arrays[name] = np.array(arrays[name])
        edit(arrays, meta)
    path = rewritten(run, tmp_path, copy_and_edit)
    tr = trainer(seed=9)
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError, match, tmp_path)
    refused(tr, lambda: tr.load_params(path), CheckpointError, match, tmp_path)


def test_hostile_archives_are_checkpoint_errors(run, tmp_path):
    tr = trainer(seed=9)
    deep = b'{"format": "%s", "run": ' % checkpoint.FORMAT.encode() + b'[' * 200_000 \
        + b']' * 200_000 + b'}'
    path = forged(run, tmp_path, deep)
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError,
            'metadata nested deeper than 32 levels', tmp_path)
    # an entry whose header declares 10^14 floats: refused before anything is allocated
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000000,), }"
    header += b' ' * (117 - len(header)) + b'\n'
    path = tmp_path / 'huge.npz'
    with zipfile.ZipFile(path, 'w') as archive:
        archive.writestr('param/fc.weight.npy', b'\x93NUMPY\x01\x00\x76\x00' + header + b'\0' * 8)
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError,
            r"entry 'param/fc.weight.npy' declares 100000000000000 elements of float32 "
            r'\(400000000000000 bytes\) but holds 8 bytes', tmp_path)
    # a compression method the zip reader does not implement (a flipped method byte)
    good = bytearray((run[0] / LAST_CHECKPOINT).read_bytes())
    central = good.index(b'PK\x01\x02')
    good[central + 10] = 99
    path = tmp_path / 'method.npz'
    path.write_bytes(bytes(good))
    refused(tr, lambda: tr.restore_checkpoint(path), CheckpointError,
            'uses zip compression method 99; only stored and deflated', tmp_path)


def test_extension_dtypes_round_trip_bitwise(tmp_path):
    import ml_dtypes
    rng = np.random.default_rng(0)
    arrays = {'param/bf16': rng.normal(size=(3, 4)).astype(ml_dtypes.bfloat16),
              'param/f8': rng.normal(size=5).astype(ml_dtypes.float8_e4m3fn),
              'param/i4': np.arange(-8, 8).astype(ml_dtypes.int4),
              'param/f32': rng.normal(size=2).astype(np.float32)}
    meta = dict(epoch=0, step=0, skipped_updates=0, history=[], rng=None)
    checkpoint.write(tmp_path / 'c.npz', arrays, meta)
    got, got_meta = checkpoint.read(tmp_path / 'c.npz')
    assert got.keys() == arrays.keys()
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].tobytes() == a.tobytes(), name
    assert got_meta['dtypes'] == {'param/bf16': 'bfloat16', 'param/f8': 'float8_e4m3fn',
                                  'param/i4': 'int4'}


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


# ----------------------------------------------------------------------------- executor misuse
def _label_loss(output, label):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(output, label))


@pytest.mark.parametrize('call, error, match', [
    (lambda l, xs, ys: l.advance(_label_loss, xs, ys), RuntimeError,
     r'advance\(\) continues an online run: call reset\(batch_size\) first'),
    (lambda l, xs, ys: (l.reset(2), l.advance(_label_loss, xs[:, :1], ys[:, :1])), ValueError,
     r'advance\(\) got xs with batch size 1, but the run was started for 2 sequences; call '
     r'reset\(1\)'),
    (lambda l, xs, ys: l.value_and_grad(_label_loss, xs, np.zeros((3, 3), np.int32)),
     ValueError, r"loss_fn\(output_t, target_t\) fails for one step's model output \(\(2, 8\), "
                 r"'float64'\) and target \(\(3,\), 'int32'\)"),
    (lambda l, xs, ys: l.reset(1.5), ValueError, r'reset\(batch_size\) takes a positive int'),
])
def test_executor_misuse_gets_a_sentence(call, error, match):
    m = model()
    learner = bc.ES_D_RTRL(m, m.membrane_decay())
    xs = (np.random.default_rng(0).random((3, 2, 2) + SIZE) < 0.3).astype(np.float64)
    ys = np.zeros((3, 2), np.int32)
    with pytest.raises(error, match=match):
        call(learner, xs, ys)


def test_bfloat16_inputs_are_accepted():
    import ml_dtypes
    tr = trainer()
    xs = (np.random.default_rng(0).random((T, 4, 2) + SIZE) < 0.3)
    labels = np.arange(4) % K
    loss_bf16, _ = tr.value_and_grad(xs.astype(ml_dtypes.bfloat16), labels)
    loss_f64, _ = tr.value_and_grad(xs.astype(np.float64), labels)
    assert loss_bf16 == loss_f64      # 0/1 events are exact in bfloat16
