"""Learning from a stream: state carried across chunks, segments and recordings, truncated
BPTT, evaluation that leaves the run alone, and a resume equal to an uninterrupted run."""
import csv
import gc
import json
import weakref

import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventStream, gesture_recordings
from braintrace_conv.data.transforms import Denoise, RefractoryPeriod
from braintrace_conv.training import (CURVE_NAME, LAST_CHECKPOINT, METRICS_NAME, SCALARS_NAME,
                                      CheckpointError, ConfigMismatchError, Trainer, checkpoint,
                                      logs, run_dir)
from braintrace_conv.training.loss import weighted_cross_entropy
from braintrace_conv.training.stream import STREAM_COLUMNS

from trainers import K, SIZE, model

#: Steps of 10 ms, chunks of 20 steps: a recording of 2 s is 10 chunks.
DT_US, CHUNK = 10_000, 20


@pytest.fixture(scope='module')
def recordings(tmp_path_factory):
    """Two training recordings and one held-out recording of 2 s (8 x 8 pixels) with
    gestures of 0.3 to 0.6 s."""
    root = tmp_path_factory.mktemp('gestures')
    short = dict(duration_s=2.0, size=SIZE, segment_s=(0.3, 0.6), gap_s=(0.1, 0.3),
                 formats=('npy',))
    return (gesture_recordings(root / 'train', 2, seed=0, **short),
            gesture_recordings(root / 'held', 1, seed=1, **short))


def stream(recordings, cls=EventStream, **kwargs):
    return cls(recordings, sensor_size=(SIZE[1], SIZE[0], 2), dt_us=DT_US,
               chunk_steps=kwargs.pop('chunk_steps', CHUNK), num_classes=6, **kwargs)


def trainer(algorithm='es', lr=1e-2, **kwargs):
    m = model()
    learner = {'es': lambda: bc.ES_D_RTRL(m, m.membrane_decay()), 'd': lambda: bc.D_RTRL(m),
               'bptt': lambda: bc.BPTT(m)}[algorithm]()
    return Trainer(learner, optax.adam(lr), **kwargs)


class Interrupted(EventStream):
    """A stream whose iteration stops with KeyboardInterrupt before chunk ``stop_at``."""
    stop_at = None

    def __iter__(self):
        for i, chunk in enumerate(super().__iter__()):
            if i == self.stop_at:
                raise KeyboardInterrupt
            yield chunk


def test_state_carries_across_chunks_segments_and_recordings(recordings):
    """With a learning rate of 0 the online loss of the stream is the loss of one forward
    pass over the whole recordings: nothing is reset at any boundary."""
    train = stream(recordings[0])
    tr = trainer(lr=0.0)
    result = tr.fit_stream(train, progress=False)
    frames, labels, weights = zip(*[(f, y, w) for f, (y, w) in stream(recordings[0])])
    xs, ys, ws = map(np.concatenate, (frames, labels, weights))
    reference = bc.BPTT(model())
    loss, _ = reference.value_and_grad(weighted_cross_entropy, xs, (ys, ws))
    assert result['steps'] == len(xs) == train.num_steps
    assert result['chunks'] == len(frames) == -(-len(xs) // CHUNK) >= 10
    assert result['online']['loss'] == pytest.approx(float(loss) * 2 / ws.sum(), rel=1e-12)
    assert result['updates'] == sum(w.any() for w in weights) > 0


def test_an_interrupted_run_resumes_bit_for_bit(recordings, tmp_path):
    kwargs = dict(eval_every=4, checkpoint_every=3, log_every=2, progress=False)
    straight = trainer().fit_stream(stream(recordings[0]), eval_stream=stream(recordings[1]),
                                    out_dir=tmp_path / 'a', **kwargs)
    cut = stream(recordings[0], Interrupted)
    cut.stop_at = 7                             # after the checkpoint of chunk 6
    with pytest.raises(KeyboardInterrupt):
        trainer().fit_stream(cut, eval_stream=stream(recordings[1]), out_dir=tmp_path / 'b',
                             **kwargs)
    assert checkpoint.read(tmp_path / 'b' / LAST_CHECKPOINT)[1]['stream']['chunks'] == 6
    resumed = trainer(lr=1e-2).fit_stream(stream(recordings[0]),
                                          eval_stream=stream(recordings[1]),
                                          out_dir=tmp_path / 'b', resume=True, **kwargs)
    a, meta_a = checkpoint.read(tmp_path / 'a' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'b' / LAST_CHECKPOINT)
    assert a.keys() == b.keys() and any(k.startswith('carry/') for k in a)
    for name in a:                    # parameters, optimiser state, the learner's carry
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_a == meta_b and resumed == straight and straight['finished']
    assert [e['chunk'] for e in straight['evaluations']] == [4, 8, straight['chunks']]

    def rows(out):
        with open(out / SCALARS_NAME, newline='') as f:
            table = list(csv.reader(f))
        assert table[0] == list(STREAM_COLUMNS)
        return [row[:-3] for row in table[1:]]              # not the rates and times
    assert rows(tmp_path / 'a') == rows(tmp_path / 'b') and len(rows(tmp_path / 'a')) == 5


def test_an_interrupted_run_with_stateful_transforms_resumes_bit_for_bit(recordings, tmp_path):
    """Denoise and refractory state is not in the checkpoint: the resumed stream rebuilds it
    from the events before the position, so the run ends as the uninterrupted one."""
    transforms = [Denoise(window_us=20_000), RefractoryPeriod(period_us=15_000)]
    kwargs = dict(checkpoint_every=3, max_steps=8 * CHUNK, progress=False)
    straight = trainer().fit_stream(stream(recordings[0], transforms=transforms),
                                    out_dir=tmp_path / 'a', **kwargs)
    cut = stream(recordings[0], Interrupted, transforms=transforms)
    cut.stop_at = 5                             # after the checkpoint of chunk 3
    with pytest.raises(KeyboardInterrupt):
        trainer().fit_stream(cut, out_dir=tmp_path / 'b', **kwargs)
    resumed = trainer().fit_stream(stream(recordings[0], transforms=transforms),
                                   out_dir=tmp_path / 'b', resume=True, **kwargs)
    a, meta_a = checkpoint.read(tmp_path / 'a' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'b' / LAST_CHECKPOINT)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_a == meta_b and resumed == straight
    plain = sum(int(f.sum()) for f, _ in zip((f for f, _ in stream(recordings[0])), range(8)))
    assert 0 < straight['events'] < plain                    # the transforms dropped some


def test_a_larger_max_steps_extends_a_run_as_if_it_had_run_straight_on(recordings, tmp_path):
    straight = trainer().fit_stream(stream(recordings[0]), out_dir=tmp_path / 'a',
                                    progress=False)
    stopped = trainer().fit_stream(stream(recordings[0]), max_steps=100,
                                   out_dir=tmp_path / 'b', progress=False)
    assert stopped['finished'] and stopped['steps'] == 100
    assert trainer().fit_stream(stream(recordings[0]), max_steps=60, out_dir=tmp_path / 'b',
                                resume=True, progress=False) == stopped     # played already
    extended = trainer().fit_stream(stream(recordings[0]), out_dir=tmp_path / 'b',
                                    resume=True, progress=False)
    a, meta_a = checkpoint.read(tmp_path / 'a' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'b' / LAST_CHECKPOINT)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_a['stream'] == meta_b['stream'] and extended == straight


def test_a_larger_max_steps_in_the_run_options_extends_a_run(recordings, tmp_path):
    """``run_config`` stores the caller's options, ``max_steps`` among them: only it may
    differ when the run is resumed with that ``max_steps``."""
    stopped = trainer().fit_stream(stream(recordings[0]), max_steps=100, out_dir=tmp_path,
                                   run_config=dict(max_steps=100, lr=1e-2), progress=False)
    extended = trainer().fit_stream(stream(recordings[0]), max_steps=140, out_dir=tmp_path,
                                    resume=True, run_config=dict(max_steps=140, lr=1e-2),
                                    progress=False)
    assert extended['steps'] == 140 > stopped['steps']
    assert extended['run_config']['max_steps'] == 140
    with pytest.raises(ConfigMismatchError, match='lr: 0.01 in the checkpoint, 0.02 now'):
        trainer().fit_stream(stream(recordings[0]), max_steps=180, out_dir=tmp_path,
                             resume=True, run_config=dict(max_steps=180, lr=2e-2),
                             progress=False)


def test_a_run_killed_in_its_last_writes_is_repaired_on_resume(recordings, tmp_path):
    kwargs = dict(eval_stream=stream(recordings[1]), eval_every=4, out_dir=tmp_path,
                  progress=False)
    done = trainer().fit_stream(stream(recordings[0]), **kwargs)
    metrics, curve = (tmp_path / METRICS_NAME).read_bytes(), (tmp_path / CURVE_NAME).read_bytes()
    # killed after its last checkpoint: metrics.json is the one written before, no curve yet
    (tmp_path / METRICS_NAME).write_text(json.dumps(dict(json.loads(metrics), finished=False)))
    (tmp_path / CURVE_NAME).unlink()
    assert trainer().fit_stream(stream(recordings[0]), resume=True, **kwargs) == done
    assert (tmp_path / METRICS_NAME).read_bytes() == metrics
    assert (tmp_path / CURVE_NAME).read_bytes() == curve


def test_metrics_json_is_written_last_and_a_removed_run_directory_is_said_so(
        recordings, tmp_path, monkeypatch):
    written = []
    for name in ('write_metrics', 'write_curve'):
        write = getattr(logs, name)
        monkeypatch.setattr(logs, name, lambda *a, _w=write, _n=name, **k: (
            written.append(_n), _w(*a, **k))[1])
    trainer().fit_stream(stream(recordings[0]), eval_stream=stream(recordings[1]),
                         eval_every=4, out_dir=tmp_path / 'a', progress=False)
    assert written[-2:] == ['write_curve', 'write_metrics'] and len(written) >= 6
    assert all(b == 'write_metrics' for a, b in zip(written, written[1:]) if a == 'write_curve')

    class Removed(EventStream):     # the run directory is removed before chunk 3
        def __iter__(self):
            for i, chunk in enumerate(super().__iter__()):
                if i == 3:
                    (tmp_path / 'b').rename(tmp_path / 'gone')
                yield chunk
    with pytest.raises(run_dir.RunDirectoryLostError, match='was removed or replaced'):
        trainer().fit_stream(stream(recordings[0], Removed), out_dir=tmp_path / 'b',
                             checkpoint_every=2, progress=False)
    assert not (tmp_path / 'b').exists()


def test_a_trainer_that_streamed_is_freed(recordings):
    tr = trainer()
    tr.fit_stream(stream(recordings[0]), max_steps=40, progress=False)
    freed = weakref.ref(tr)
    del tr
    gc.collect()
    assert freed() is None


def test_a_finished_run_resumes_to_itself_and_other_settings_are_refused(recordings, tmp_path):
    done = trainer().fit_stream(stream(recordings[0]), out_dir=tmp_path, progress=False)
    again = trainer().fit_stream(stream(recordings[0]), out_dir=tmp_path, resume=True,
                                 progress=False)
    assert again == done
    with pytest.raises(ConfigMismatchError, match='settle_steps: 0 in the checkpoint, 3 now'):
        trainer().fit_stream(stream(recordings[0]), out_dir=tmp_path, resume=True,
                             settle_steps=3, progress=False)
    with pytest.raises(ConfigMismatchError, match=r'the held-out stream differs \(the run had '
                                                  r'none\)'):
        trainer().fit_stream(stream(recordings[0]), eval_stream=stream(recordings[1]),
                             out_dir=tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="does not continue this stream: position was "
                                              "saved for a stream with chunk_steps=20"):
        trainer().fit_stream(stream(recordings[0], chunk_steps=10), out_dir=tmp_path,
                             resume=True, progress=False)


def test_evaluation_leaves_the_online_run_as_it_was(recordings):
    plain = trainer()
    plain.fit_stream(stream(recordings[0]), progress=False)
    evaluated = trainer()
    result = evaluated.fit_stream(stream(recordings[0]), eval_stream=stream(recordings[1]),
                                  eval_every=1, progress=False)
    assert len(result['evaluations']) == result['chunks']
    for a, b in zip(plain.params().values(), evaluated.params().values()):
        np.testing.assert_array_equal(a, b)
    test = evaluated.evaluate_stream(stream(recordings[1]))
    assert test['segment_accuracy'] == result['test']['test_accuracy']
    assert test['steps'] == stream(recordings[1]).num_steps


@pytest.mark.parametrize('algorithm', ['d', 'bptt'])
def test_every_executor_learns_on_a_stream(recordings, algorithm):
    tr = trainer(algorithm)
    before = tr.params()
    result = tr.fit_stream(stream(recordings[0]), max_steps=100, progress=False)
    labelled = [w.any() for _, (_, w) in stream(recordings[0])][:5]
    assert result['steps'] == 100 and result['chunks'] == 5
    assert tr.updates == sum(labelled) > 0 and tr.skipped_updates == 0
    assert all(not np.array_equal(a, b) for a, b in zip(before.values(), tr.params().values()))


def test_windows_work_on_a_stream_and_may_not_span_two_chunks(recordings):
    m = model()
    windowed = Trainer(bc.ES_D_RTRL(m, m.membrane_decay(), window=10), optax.adam(1e-2))
    assert windowed.fit_stream(stream(recordings[0]), max_steps=40,
                               progress=False)['chunks'] == 2
    wide = Trainer(bc.D_RTRL(model(), window=30), optax.adam(1e-2))
    with pytest.raises(ValueError, match=r"the learner's window must be at most chunk_steps "
                                         r"\(20\), got 30; a window never spans two chunks"):
        wide.fit_stream(stream(recordings[0]), progress=False)


@pytest.mark.parametrize('make, call, match', [
    (lambda: trainer(loss='final'), {}, "loss must be 'every_step' to learn from a stream"),
    (lambda: trainer(update_every=5), {},
     r"update_every must be None or the stream's chunk_steps \(20\), got 5; a stream is "
     r'updated once per chunk'),
    (lambda: trainer(), dict(eval_every=2), 'eval_every must be None without eval_stream'),
    (lambda: trainer(), dict(max_steps=0),
     r'max_steps must be None \(until the stream ends\) or a positive integer, got 0'),
    (lambda: trainer(), dict(resume=True),
     r'resume needs out_dir \(the run directory to continue\)'),
    (lambda: trainer(), dict(overwrite=True),
     r'overwrite needs out_dir \(the run directory to replace\)'),
    (lambda: Trainer(bc.ES_D_RTRL(model()), None), {}, 'fit_stream needs an optimizer'),
])
def test_what_cannot_be_learned_from_a_stream_is_refused(recordings, make, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make().fit_stream(stream(recordings[0]), progress=False, **call)


def test_a_stream_with_more_classes_than_outputs_is_refused(recordings):
    many = EventStream(recordings[0], sensor_size=(SIZE[1], SIZE[0], 2), dt_us=DT_US,
                       chunk_steps=CHUNK, num_classes=K + 1)
    with pytest.raises(ValueError, match=f'stream has {K + 1} classes but the model has {K} '
                                         f'outputs'):
        trainer().fit_stream(many, progress=False)
    with pytest.raises(TypeError, match='stream must be a braintrace_conv.data.EventStream'):
        trainer().fit_stream([np.zeros((4, 1, 2, 8, 8))], progress=False)
