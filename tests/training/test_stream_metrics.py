"""Online metrics of a stream: per step, and per segment by a majority of its steps."""
import json

import numpy as np
import pytest

from braintrace_conv.training.stream_metrics import StreamMetrics


def one_hot_scores(predictions, num_classes=3):
    """Scores ``(T, B, K)`` whose argmax is ``predictions`` ``(T, B)``."""
    return np.eye(num_classes)[np.asarray(predictions)]


def chunk(predictions, labels, segments):
    """``(loss sum, scores, labels, weights, segments)`` of one chunk; weight 1 inside a
    segment."""
    segments = np.asarray(segments)
    return (0.5 * np.sum(segments >= 0), one_hot_scores(predictions), np.asarray(labels),
            (segments >= 0).astype(np.float32), segments)


def test_a_segment_is_decided_by_the_majority_of_its_steps_across_chunks():
    metrics = StreamMetrics(batch_size=1, num_classes=3)
    # segment 0 (label 2) spans both chunks: votes 2, 2, 1 | 1, 2 -> 2 is right
    metrics.add(*chunk([[2], [2], [1], [0]], [[2], [2], [2], [2]], [[0], [0], [0], [0]]))
    assert metrics.total.segments == 0                  # still open
    metrics.add(*chunk([[1], [2], [0], [0]], [[2], [2], [1], [1]], [[0], [0], [1], [1]]))
    summary = metrics.total.summary()
    assert summary['segments'] == 1 and summary['segment_accuracy'] == 1.0
    metrics.finish()                                    # segment 1 (label 1): votes 0, 0
    summary = metrics.total.summary()
    assert (summary['segments'], summary['segment_accuracy']) == (2, 0.5)
    assert summary['labelled_steps'] == 8 and summary['step_accuracy'] == 3 / 8
    assert summary['loss'] == 0.5


def test_settling_steps_do_not_vote_and_a_shorter_segment_is_undecided():
    metrics = StreamMetrics(batch_size=2, num_classes=3, settle_steps=2)
    predictions = [[0, 1], [0, 1], [2, 1], [2, 0]]
    labels = [[2, 1], [2, 1], [2, 1], [2, 1]]
    segments = [[4, 7], [4, 7], [4, -1], [4, -1]]
    metrics.add(*chunk(predictions, labels, segments))
    metrics.finish()
    total = metrics.total
    # stream 0: the two wrong steps settle, the two right ones vote; stream 1: 2 steps only
    assert (total.segments, total.correct_segments, total.undecided) == (1, 1, 1)
    assert total.correct_steps == 4


def test_the_state_continues_exactly_and_is_json():
    rng = np.random.default_rng(0)
    segments = np.repeat(np.arange(12), 5)[:, None] * np.ones((1, 2), int)
    segments[rng.random(segments.shape) < 0.2] = -1
    labels = np.where(segments >= 0, segments % 3, 0)
    predictions = rng.integers(0, 3, segments.shape)
    chunks = [chunk(predictions[i:i + 7], labels[i:i + 7], segments[i:i + 7])
              for i in range(0, 60, 7)]
    straight = StreamMetrics(2, 3, settle_steps=1)
    for c in chunks:
        straight.add(*c)
    resumed = StreamMetrics(2, 3, settle_steps=1)
    for c in chunks[:4]:
        resumed.add(*c)
    resumed = StreamMetrics.from_state(json.loads(json.dumps(resumed.state())))
    for c in chunks[4:]:
        resumed.add(*c)
    assert resumed.state() == straight.state()
    assert straight.take_period() == straight.total.summary()
    assert straight.period.steps == 0 and straight.total.steps == 120


def test_a_saved_state_that_does_not_fit_is_refused():
    state = StreamMetrics(2, 3).state()
    state['open'] = [None]
    with pytest.raises(ValueError, match=r'state must hold one open segment per stream, with '
                                         r'one vote per class \(2 streams, 3 classes\), got 1 '
                                         r'segments'):
        StreamMetrics.from_state(state)
    with pytest.raises(ValueError, match='state must be the saved stream metrics that '
                                         'StreamMetrics.state returns'):
        StreamMetrics.from_state({'batch_size': 2})
