"""Checkpoint files: digest-checked .npz archives that are never unpickled; crafted, corrupt,
truncated and hostile files are refused, and a failed write leaves the previous file."""
import os
import pickle
import zipfile

import numpy as np
import pytest

import braintrace_conv as bc
from braintrace_conv.training import LAST_CHECKPOINT, CheckpointError, Trainer, checkpoint

from trainers import model, refused, trainer


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
    (lambda a, m: m.update(rng=None), r'invalid generator states: the shuffling generator is '
                                      r'None after 1 epoch\(s\); a run saves it from its first '
                                      r'epoch on'),
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


def test_a_failed_write_leaves_the_previous_checkpoint(evaluated_run, tmp_path, monkeypatch):
    out, tr = evaluated_run
    path = tmp_path / 'ckpt.npz'
    tr.save_checkpoint(path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'fsync', disk_full)
    with pytest.raises(OSError, match="No space left on device: '.*ckpt.npz'"):
        tr.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ['ckpt.npz']
