"""Tests of braintrace_conv.data: container, synthetic generators, event files."""

import dataclasses
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braintrace_conv.data import (
    DIRECTION_NAMES,
    EventDataset,
    MotionScenes,
    delayed_bars,
    digits_saccades,
    dvs_events,
    events_to_frames,
    from_directory,
    from_tonic,
    moving_bars,
    render_scenes,
    sample_scenes,
    saccade_path,
)

EVENT_DTYPE = np.dtype([("x", np.int64), ("y", np.int64), ("t", np.int64), ("p", np.int64)])
FLOAT_X_DTYPE = np.dtype([("x", np.float64), ("y", np.int64), ("t", np.int64), ("p", np.int64)])


def make_events(records, dtype=EVENT_DTYPE):
    return np.array([tuple(r) for r in records], dtype=dtype)


def toy_dataset(n=12, T=3, H=4, W=5, num_classes=3, seed=0):
    rng = np.random.default_rng(seed)
    events = rng.integers(0, 2, size=(n, T, 2, H, W)).astype(np.float32)
    labels = np.arange(n) % num_classes
    return EventDataset(events=events, labels=labels, num_classes=num_classes, name="toy")


# ---------------------------------------------------------------------------
# EventDataset
# ---------------------------------------------------------------------------


class TestEventDataset:
    def test_stores_float32_int32_read_only(self):
        ds = EventDataset(
            events=np.ones((4, 3, 2, 5, 6), dtype=np.int64),
            labels=np.array([0, 1, 1, 0], dtype=np.int64),
            num_classes=2,
        )
        assert ds.events.dtype == np.float32 and ds.labels.dtype == np.int32
        assert len(ds) == 4 and ds.num_steps == 3 and ds.frame_shape == (2, 5, 6)
        assert not ds.events.flags.writeable and not ds.labels.flags.writeable
        np.testing.assert_array_equal(ds.class_counts(), [2, 2])
        assert "samples=4" in repr(ds)

    def test_does_not_freeze_callers_array(self):
        events = np.zeros((2, 1, 2, 3, 3), dtype=np.float32)
        EventDataset(events=events, labels=np.array([0, 1]), num_classes=2)
        assert events.flags.writeable

    @pytest.mark.parametrize(
        "events_shape, labels, num_classes, match",
        [
            ((4, 3), [0, 1, 0, 1], 2, r"events must have shape \(N, T, \*frame_shape\)"),
            ((4,), [0, 1, 0, 1], 2, "a frame of at least one axis"),
            ((4, 3, 2, 5, 5), [[0, 1, 0, 1]], 2, "labels must have shape"),
            ((4, 3, 2, 5, 5), [0, 1, 0], 2, "same length"),
            ((4, 3, 2, 5, 5), [0, 1, 2, 1], 2, r"labels must lie in \[0, 2\)"),
            ((4, 3, 2, 5, 5), [0, -1, 0, 1], 2, r"labels must lie in \[0, 2\)"),
            ((4, 3, 2, 5, 5), [0, 1, 0, 1], 0, "num_classes must be positive"),
        ],
    )
    def test_rejects_invalid_contents(self, events_shape, labels, num_classes, match):
        with pytest.raises(ValueError, match=match):
            EventDataset(
                events=np.zeros(events_shape), labels=np.array(labels), num_classes=num_classes
            )

    @pytest.mark.parametrize("frame_shape", [(700,), (1, 700), (2, 4, 5), (2, 3, 4, 5)])
    def test_frames_of_any_rank(self, frame_shape):
        events = np.random.default_rng(0).integers(0, 3, (6, 4) + frame_shape)
        ds = EventDataset(events=events, labels=np.arange(6) % 2, num_classes=2)
        assert ds.num_steps == 4 and ds.frame_shape == frame_shape
        (xs, ys), = ds.batches(6, shuffle=False)
        assert xs.shape == (4, 6) + frame_shape
        np.testing.assert_array_equal(xs, np.swapaxes(events, 0, 1))
        train, test = ds.split(0.5)
        assert train.frame_shape == test.frame_shape == frame_shape

    def test_rejects_wrong_types(self):
        events = np.zeros((2, 1, 2, 3, 3))
        with pytest.raises(TypeError, match="labels must be integers"):
            EventDataset(events=events, labels=np.array([0.0, 1.0]), num_classes=2)
        with pytest.raises(TypeError, match="num_classes must be an int"):
            EventDataset(events=events, labels=np.array([0, 1]), num_classes=2.0)
        with pytest.raises(ValueError, match="class_names must be 2 strings"):
            EventDataset(events=events, labels=np.array([0, 1]), num_classes=2, class_names=("a",))

    def test_batches_are_time_major_and_cover_every_sample_once(self):
        ds = toy_dataset(n=10)
        seen = []
        for xs, ys in ds.batches(4, seed=3):
            assert xs.dtype == np.float32 and ys.dtype == np.int32
            assert xs.shape == (3, len(ys), 2, 4, 5) and xs.flags.c_contiguous
            # Match each batch element back to its source sample.
            for b in range(len(ys)):
                (idx,) = [
                    i for i in range(len(ds)) if np.array_equal(ds.events[i], xs[:, b])
                ]
                assert ds.labels[idx] == ys[b]
                seen.append(idx)
        assert sorted(seen) == list(range(10))
        assert [len(y) for _, y in ds.batches(4)] == [4, 4, 2]
        assert ds.num_batches(4) == 3

    def test_batches_order_and_drop_last(self):
        ds = toy_dataset(n=10)
        ordered = [y for _, y in ds.batches(4, shuffle=False)]
        np.testing.assert_array_equal(np.concatenate(ordered), ds.labels)
        assert [len(y) for _, y in ds.batches(4, drop_last=True)] == [4, 4]
        assert ds.num_batches(4, drop_last=True) == 2
        first = [x for x, _ in ds.batches(3, seed=1)]
        again = [x for x, _ in ds.batches(3, seed=1)]
        other = [x for x, _ in ds.batches(3, seed=2)]
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        assert not all(np.array_equal(a, b) for a, b in zip(first, other))

    @pytest.mark.parametrize(
        "batch_size, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError)]
    )
    def test_batches_rejects_bad_batch_size(self, batch_size, error):
        with pytest.raises(error, match="batch_size"):
            next(toy_dataset().batches(batch_size))

    def test_split_is_stratified_disjoint_and_deterministic(self):
        ds = toy_dataset(n=30)
        train, test = ds.split(0.2, seed=5)
        np.testing.assert_array_equal(test.class_counts(), [2, 2, 2])
        np.testing.assert_array_equal(train.class_counts(), [8, 8, 8])
        rows = lambda d: {d.events[i].tobytes() + bytes([d.labels[i]]) for i in range(len(d))}
        assert rows(train).isdisjoint(rows(test)) and rows(train) | rows(test) == rows(ds)
        again_train, again_test = ds.split(0.2, seed=5)
        np.testing.assert_array_equal(again_test.events, test.events)
        _, other_test = ds.split(0.2, seed=6)
        assert not np.array_equal(other_test.events, test.events)
        assert train.name == "toy" and train.num_classes == 3

    @pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, float("nan")])
    def test_split_rejects_fraction_outside_unit_interval(self, fraction):
        with pytest.raises(ValueError, match="test_fraction"):
            toy_dataset().split(fraction)

    def test_split_rejects_empty_part(self):
        with pytest.raises(ValueError, match="empty training or test set"):
            toy_dataset(n=3).split(0.1)

    def test_subset(self):
        ds = toy_dataset()
        sub = ds.subset([5, 1])
        np.testing.assert_array_equal(sub.events, ds.events[[5, 1]])
        np.testing.assert_array_equal(sub.labels, ds.labels[[5, 1]])
        with pytest.raises(ValueError, match="indices must be a 1-D integer array"):
            ds.subset([0.5])


# ---------------------------------------------------------------------------
# DVS pixel model
# ---------------------------------------------------------------------------


class TestDvsEvents:
    LOG_INTENSITY = np.array([0.0, 0.7, 0.7, 1.0, 1.5, 0.2])

    def test_hand_computed_pixel(self):
        # Reference 0 -> +0.7: 1 ON (ref 0.7); 0.7: none; 1.0: +0.3 below
        # threshold; 1.5: +0.8 -> 1 ON (ref 1.5); 0.2: -1.3 -> 2 OFF.
        video = self.LOG_INTENSITY.reshape(1, 6, 1, 1)
        frames = dvs_events(video, threshold=0.5, substeps=1)
        assert frames.shape == (1, 5, 2, 1, 1) and frames.dtype == np.float32
        np.testing.assert_array_equal(frames[0, :, 0, 0, 0], [1, 0, 0, 1, 0])
        np.testing.assert_array_equal(frames[0, :, 1, 0, 0], [0, 0, 0, 0, 2])
        summed = dvs_events(video, threshold=0.5, substeps=5)
        np.testing.assert_array_equal(summed[0, 0, :, 0, 0], [2, 2])

    def test_validation(self):
        with pytest.raises(ValueError, match="multiple of substeps=2"):
            dvs_events(np.zeros((1, 4, 2, 2)), threshold=0.5, substeps=2)
        with pytest.raises(ValueError, match="log_intensity must have shape"):
            dvs_events(np.zeros((4, 2, 2)), threshold=0.5, substeps=1)
        with pytest.raises(ValueError, match="threshold must be positive"):
            dvs_events(np.zeros((1, 3, 2, 2)), threshold=0.0, substeps=1)


# ---------------------------------------------------------------------------
# Moving bars
# ---------------------------------------------------------------------------


def centroid_velocity(events):
    """Least-squares slope over time of the event centroid, ``(N, 2)`` (row, col)."""
    total = events.sum(axis=2).astype(np.float64)  # (N, T, H, W)
    mass = total.sum(axis=(2, 3))
    rows = np.arange(total.shape[2])[:, None]
    cols = np.arange(total.shape[3])[None, :]
    weight = (mass > 0).astype(np.float64)
    t = np.arange(total.shape[1], dtype=np.float64)
    velocity = []
    for grid in (rows, cols):
        centroid = (total * grid).sum(axis=(2, 3)) / np.maximum(mass, 1)
        t_mean = (weight * t).sum(1, keepdims=True) / weight.sum(1, keepdims=True)
        c_mean = (weight * centroid).sum(1, keepdims=True) / weight.sum(1, keepdims=True)
        velocity.append((weight * (t - t_mean) * (centroid - c_mean)).sum(1))
    return np.stack(velocity, axis=1)


def on_minus_off_centroid(frame):
    """Single-frame motion cue: ON centroid minus OFF centroid, ``(N, 2)``."""
    rows = np.arange(frame.shape[-2])[:, None]
    cols = np.arange(frame.shape[-1])[None, :]

    def centroid(img):
        mass = np.maximum(img.sum(axis=(1, 2)), 1)
        moments = [(img * grid).sum(axis=(1, 2)) for grid in (rows, cols)]
        return np.stack(moments, axis=1) / mass[:, None]

    return centroid(frame[:, 0]) - centroid(frame[:, 1])


def angle_features(vectors):
    """Angle of 2-D vectors encoded by its first and second harmonics."""
    angle = np.arctan2(vectors[:, 0], vectors[:, 1])
    return np.stack([np.cos(angle), np.sin(angle), np.cos(2 * angle), np.sin(2 * angle)], 1)


class TestMovingBars:
    def test_shapes_dtypes_and_balanced_labels(self):
        ds = moving_bars(40, T=12, size=(14, 18))
        assert ds.events.shape == (40, 12, 2, 14, 18) and ds.events.dtype == np.float32
        assert ds.labels.dtype == np.int32 and ds.num_classes == 8
        np.testing.assert_array_equal(ds.class_counts(), np.full(8, 5))
        assert ds.class_names == DIRECTION_NAMES
        assert np.all(ds.events >= 0) and np.all(ds.events == np.round(ds.events))

    def test_deterministic_given_seed(self):
        a, b, c = (moving_bars(16, T=8, seed=seed) for seed in (3, 3, 4))
        np.testing.assert_array_equal(a.events, b.events)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert not np.array_equal(a.events, c.events)

    def test_events_are_sparse_but_present(self):
        events = moving_bars(64, seed=1).events
        active = (events > 0).mean()
        assert 0.005 < active < 0.15
        per_frame = events.sum(axis=(2, 3, 4))
        assert (per_frame > 0).mean() > 0.85
        assert events[:, :, 0].sum() > 0 and events[:, :, 1].sum() > 0

    @pytest.mark.parametrize("objects", [("bar",), ("dots",), "dots"])
    def test_single_object_kind(self, objects):
        scenes = sample_scenes(16, objects=objects)
        np.testing.assert_array_equal(scenes.is_bar, objects == ("bar",))
        assert render_scenes(scenes, T=6).sum() > 0

    @settings(max_examples=10, deadline=None)
    @given(
        seed=st.integers(0, 2**31 - 1),
        T=st.integers(1, 12),
        substeps=st.integers(1, 5),
        height=st.integers(6, 20),
        width=st.integers(6, 20),
        slow=st.floats(0.1, 2.0),
        objects=st.sampled_from([("bar",), ("dots",), ("bar", "dots")]),
        contrast=st.floats(0.6, 3.0),
    )
    def test_mirrored_scene_gives_same_frames_reversed(
        self, seed, T, substeps, height, width, slow, objects, contrast
    ):
        size = (height, width)
        scenes = sample_scenes(
            24, size=size, speed=(slow, slow + 0.5), objects=objects, seed=seed
        )
        mirror = scenes.mirrored()
        assert isinstance(mirror, MotionScenes)
        np.testing.assert_array_equal((mirror.direction - scenes.direction) % 8, 4)
        np.testing.assert_array_equal(mirror.polarity, 1 - scenes.polarity)
        kwargs = dict(T=T, size=size, substeps=substeps, contrast=contrast, threshold=0.6)
        frames = render_scenes(scenes, **kwargs)
        mirrored = render_scenes(mirror, **kwargs)
        np.testing.assert_array_equal(mirrored, frames[:, ::-1])

    def test_every_frame_is_shared_by_opposite_labels(self):
        # Mirror partners are produced with the same probability by the generator
        # (direction and polarity are independent and uniform), so every frame
        # is equally consistent with label d and label d + 4.
        scenes = sample_scenes(16, seed=11)
        frames = render_scenes(scenes)
        mirrored = render_scenes(scenes.mirrored())
        for i in range(len(scenes)):
            for t in range(frames.shape[1]):
                assert any(np.array_equal(frames[i, t], m) for m in mirrored[i])
        assert np.all(scenes.mirrored().direction != scenes.direction)
        # Time-summed counts cannot tell the partners apart either.
        np.testing.assert_array_equal(frames.sum(axis=1), mirrored.sum(axis=1))

    def test_scene_container_validation(self):
        scenes = sample_scenes(8)
        with pytest.raises(ValueError, match=r"speed must have shape \(8,\)"):
            dataclasses.replace(scenes, speed=scenes.speed[:3])
        with pytest.raises(ValueError, match="direction must hold integers in 0..7"):
            dataclasses.replace(scenes, direction=scenes.direction + 8)
        with pytest.raises(ValueError, match="dot_offsets must have shape"):
            dataclasses.replace(scenes, dot_offsets=scenes.dot_offsets[..., :1])
        with pytest.raises(TypeError, match="scenes must be MotionScenes"):
            render_scenes({"direction": scenes.direction})

    def test_polarity_independent_of_direction(self):
        scenes = sample_scenes(4000, seed=2)
        for d in range(8):
            assert abs(scenes.polarity[scenes.direction == d].mean() - 0.5) < 0.06

    def test_direction_needs_time_not_a_single_frame(self):
        linear_model = pytest.importorskip("sklearn.linear_model")
        ds = moving_bars(320, seed=7)
        train, test = slice(0, 240), slice(240, None)

        def accuracy(features):
            clf = linear_model.LogisticRegression(max_iter=1000)
            clf.fit(features[train], ds.labels[train])
            return clf.score(features[test], ds.labels[test])

        temporal = accuracy(angle_features(centroid_velocity(ds.events)))
        single = accuracy(angle_features(on_minus_off_centroid(ds.events[:, ds.num_steps // 2])))
        assert temporal > 0.9
        # A single frame identifies at most the axis of motion: chance is 1/8 and
        # the best possible accuracy is 1/2.
        assert single < 0.55

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(n_samples=0), ValueError, "n_samples must be positive"),
            (dict(speed=(1.0, 0.5)), ValueError, "speed must satisfy low <= high"),
            (dict(speed=(0.0, 0.5)), ValueError, r"speed\[0\] must be positive"),
            (dict(speed=0.5), TypeError, r"speed must be a \(low, high\) pair"),
            (dict(size=(16,)), TypeError, r"size must be a \(height, width\) pair"),
            (dict(objects=("bar", "disc")), ValueError, "objects must be"),
            (dict(contrast=0.3, threshold=0.5), ValueError, "contrast=0.3 is below threshold"),
            (dict(center_spread=1.5), ValueError, "center_spread"),
            (dict(T=0), ValueError, "T must be positive"),
        ],
    )
    def test_validation(self, kwargs, error, match):
        kwargs = {"n_samples": 4, **kwargs}
        with pytest.raises(error, match=match):
            moving_bars(kwargs.pop("n_samples"), **kwargs)


# ---------------------------------------------------------------------------
# Delayed bars
# ---------------------------------------------------------------------------


class TestDelayedBars:
    def test_a_bars_clip_then_blank_frames_and_its_labels(self):
        ds = delayed_bars(24, stimulus_steps=5, delay_steps=7, size=(8, 10), seed=3)
        assert ds.events.shape == (24, 12, 2, 8, 10) and ds.events.dtype == np.float32
        assert ds.labels.dtype == np.int32 and ds.num_classes == 8
        assert ds.class_names == DIRECTION_NAMES and ds.name == "delayed_bars"
        clip = moving_bars(24, T=5, size=(8, 10), objects=("bar",), seed=3)
        np.testing.assert_array_equal(ds.events[:, :5], clip.events)
        np.testing.assert_array_equal(ds.labels, clip.labels)
        assert np.all(ds.events[:, 5:] == 0)
        # every sample's stimulus has events, in its last step too
        assert np.all(ds.events[:, :5].sum(axis=(1, 2, 3, 4)) > 0)
        assert ds.events[:, 4].sum() > 0

    def test_cues_end_with_the_labelled_clip_after_distractors(self):
        ds = delayed_bars(24, stimulus_steps=4, delay_steps=3, cues=3, size=(8, 8), seed=5)
        assert ds.events.shape == (24, 21, 2, 8, 8)
        last = delayed_bars(24, stimulus_steps=4, delay_steps=3, size=(8, 8), seed=5)
        np.testing.assert_array_equal(ds.events[:, 14:], last.events)   # the last trial
        np.testing.assert_array_equal(ds.labels, last.labels)
        for start in (0, 7):   # distractor clips with events, each followed by a blank delay
            assert np.all(ds.events[:, start:start + 4].sum(axis=(1, 2, 3, 4)) > 0)
            assert np.all(ds.events[:, start + 4:start + 7] == 0)
        # distractor clips differ from each other and from the labelled one
        assert not np.array_equal(ds.events[:, 0:4], ds.events[:, 7:11])
        assert not np.array_equal(ds.events[:, 7:11], ds.events[:, 14:18])

    def test_moving_bars_options_reach_the_clip(self):
        ds = delayed_bars(8, stimulus_steps=4, delay_steps=2, size=(16, 16), objects=("dots",),
                          speed=(1, 1))
        clip = moving_bars(8, T=4, size=(16, 16), objects=("dots",), speed=(1, 1))
        np.testing.assert_array_equal(ds.events[:, :4], clip.events)

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(stimulus_steps=1), ValueError, "stimulus_steps must be at least 2"),
            (dict(stimulus_steps=2.0), TypeError, "stimulus_steps must be an int"),
            (dict(delay_steps=0), ValueError, "delay_steps must be positive"),
            (dict(cues=0), ValueError, "cues must be positive"),
            (dict(n_samples=0), ValueError, "n_samples must be positive"),
            (dict(objects=("disc",)), ValueError, "objects must be"),
        ],
    )
    def test_validation(self, kwargs, error, match):
        kwargs = {"n_samples": 4, **kwargs}
        with pytest.raises(error, match=match):
            delayed_bars(kwargs.pop("n_samples"), **kwargs)


# ---------------------------------------------------------------------------
# Digits with saccades
# ---------------------------------------------------------------------------


class TestDigitsSaccades:
    def test_shapes_labels_and_event_counts(self):
        pytest.importorskip("sklearn")
        ds = digits_saccades(n_samples=150, T=9, size=(14, 14), digit_size=10)
        assert ds.events.shape == (150, 9, 2, 14, 14) and ds.events.dtype == np.float32
        assert ds.labels.dtype == np.int32 and ds.num_classes == 10
        assert set(ds.labels.tolist()) == set(range(10))
        per_frame = ds.events.sum(axis=(2, 3, 4))
        assert per_frame.mean() > 10 and (per_frame > 0).mean() > 0.95
        assert ds.events[:, :, 0].sum() > 0 and ds.events[:, :, 1].sum() > 0
        assert (ds.events > 0).mean() < 0.3

    def test_deterministic_given_seed(self):
        pytest.importorskip("sklearn")
        a = digits_saccades(n_samples=20, T=6, seed=1)
        b = digits_saccades(n_samples=20, T=6, seed=1)
        c = digits_saccades(n_samples=20, T=6, seed=2)
        np.testing.assert_array_equal(a.events, b.events)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert not np.array_equal(a.events, c.events)

    def test_saccade_path_is_a_closed_centred_triangle(self):
        path = saccade_path(6, 4, 2.0)
        assert path.shape == (25, 2)
        np.testing.assert_allclose(path[0], path[-1])
        corners = path[[0, 8, 16]]
        np.testing.assert_allclose(corners.mean(axis=0), 0.0, atol=1e-12)
        np.testing.assert_allclose(corners[1] - corners[0], [2.0, 1.0])
        np.testing.assert_allclose(corners[2] - corners[1], [0.0, -2.0])
        step = np.linalg.norm(np.diff(path, axis=0), axis=1)
        assert step.max() < 0.3

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            (dict(digit_size=7), r"digit_size must lie in \[8, 16\]"),
            (dict(digit_size=20), r"digit_size must lie in \[8, 16\]"),
            (dict(n_samples=5000), "n_samples must be at most 1797"),
            (dict(background=1.0), r"background must lie in \(0, 1\)"),
            (dict(jitter=-1.0), "jitter must be non-negative"),
        ],
    )
    def test_validation(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            digits_saccades(**kwargs)

    def test_missing_sklearn_is_reported(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
        with pytest.raises(ImportError, match="needs scikit-learn"):
            digits_saccades(n_samples=2, T=3)


# ---------------------------------------------------------------------------
# Event files
# ---------------------------------------------------------------------------

# Sensor of width 3 and height 2 (tonic order: W, H, P).
SENSOR = (3, 2, 2)
HAND_EVENTS = [
    # x, y,   t, p
    (0, 0, 1000, 1),
    (2, 1, 1050, 0),
    (1, 0, 1099, 1),
    (1, 0, 1100, 1),
    (1, 1, 1020, 0),
]


class TestEventsToFrames:
    def test_hand_computed_time_bins(self):
        frames = events_to_frames(make_events(HAND_EVENTS), sensor_size=SENSOR, n_time_bins=2)
        expected = np.zeros((2, 2, 2, 3), dtype=np.float32)
        expected[0, 0, 0, 0] = 1  # t=1000 -> bin 0, ON at row 0, col 0
        expected[0, 1, 1, 1] = 1  # t=1020 -> bin 0, OFF at row 1, col 1
        expected[1, 1, 1, 2] = 1  # t=1050 -> bin 1 (boundary), OFF at row 1, col 2
        expected[1, 0, 0, 1] = 2  # t=1099 and the last event t=1100 -> bin 1
        assert frames.dtype == np.float32
        np.testing.assert_array_equal(frames, expected)

    def test_hand_computed_time_window(self):
        frames = events_to_frames(make_events(HAND_EVENTS), sensor_size=SENSOR, time_window_us=40)
        # Bins [1000, 1040), [1040, 1080), [1080, 1120).
        assert frames.shape == (3, 2, 2, 3)
        np.testing.assert_array_equal(frames.sum(axis=(1, 2, 3)), [2, 1, 2])
        assert frames[2, 0, 0, 1] == 2 and frames[1, 1, 1, 2] == 1

    @pytest.mark.parametrize(
        "polarity, dtype",
        [
            ([1, 0, 1, 1, 0], np.int64),
            ([1, -1, 1, 1, -1], np.int8),
            ([True, False, True, True, False], bool),
        ],
    )
    def test_polarity_codings_agree(self, polarity, dtype):
        event_dtype = np.dtype(
            [("t", np.float64), ("x", np.uint16), ("y", np.uint16), ("p", dtype)]
        )
        records = [(t, x, y, p) for (x, y, t, _), p in zip(HAND_EVENTS, polarity)]
        events = make_events(records, event_dtype)
        frames = events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)
        reference = events_to_frames(make_events(HAND_EVENTS), sensor_size=SENSOR, n_time_bins=2)
        np.testing.assert_array_equal(frames, reference)

    def test_degenerate_inputs(self):
        same_time = make_events([(0, 0, 5, 1), (1, 1, 5, 0)])
        frames = events_to_frames(same_time, sensor_size=SENSOR, n_time_bins=3)
        assert frames[0].sum() == 2 and frames[1:].sum() == 0
        empty = make_events([])
        assert events_to_frames(empty, sensor_size=SENSOR, n_time_bins=4).shape == (4, 2, 2, 3)
        by_window = events_to_frames(empty, sensor_size=SENSOR, time_window_us=10.0)
        assert by_window.shape == (0, 2, 2, 3)

    @settings(max_examples=25, deadline=None)
    @given(
        data=st.lists(
            st.tuples(st.integers(0, 6), st.integers(0, 4), st.integers(0, 10**6), st.booleans()),
            min_size=1,
            max_size=60,
        ),
        n_bins=st.integers(1, 9),
    )
    def test_counts_are_preserved(self, data, n_bins):
        events = make_events(data)
        frames = events_to_frames(events, sensor_size=(7, 5, 2), n_time_bins=n_bins)
        assert frames.shape == (n_bins, 2, 5, 7)
        assert frames[:, 0].sum() == events["p"].sum()
        assert frames[:, 1].sum() == len(events) - events["p"].sum()
        per_pixel = np.zeros((5, 7))
        np.add.at(per_pixel, (events["y"], events["x"]), 1)
        np.testing.assert_array_equal(frames.sum(axis=(0, 1)), per_pixel)

    @pytest.mark.parametrize(
        "records, dtype, error, match",
        [
            (None, None, TypeError, "structured array"),
            ([(0, 0, 0)], [("x", int), ("y", int), ("t", int)], ValueError, r"missing \['p'\]"),
            ([(3, 0, 0, 1)], EVENT_DTYPE, ValueError, r"'x' must lie in \[0, 3\)"),
            ([(0, 2, 0, 1)], EVENT_DTYPE, ValueError, r"'y' must lie in \[0, 2\)"),
            ([(0.5, 0, 0, 1)], FLOAT_X_DTYPE, ValueError, "integer pixel coordinates"),
            ([(0, 0, 0, 2)], EVENT_DTYPE, ValueError, "0/1, -1/1 or bool"),
            ([(0, 0, 0, -1), (0, 0, 1, 0)], EVENT_DTYPE, ValueError, "0/1, -1/1 or bool"),
        ],
    )
    def test_rejects_invalid_events(self, records, dtype, error, match):
        events = np.zeros((3, 4)) if records is None else make_events(records, np.dtype(dtype))
        with pytest.raises(error, match=match):
            events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"time_window_us": 5.0, "event_count": 3}, ValueError, "at most one of"),
            ({"n_time_bins": None}, ValueError, "give n_time_bins, time_window_us or"),
            ({"n_time_bins": 0}, ValueError, "n_time_bins must be positive"),
            ({"n_time_bins": None, "time_window_us": -1.0}, ValueError, "time_window_us must be"),
            ({"sensor_size": (3, 2)}, ValueError, r"need sensor_size \(X, Y, P\)"),
            ({"sensor_size": 3}, TypeError, r"sensor_size must be \(X, P\), \(X, Y, P\)"),
            ({"sensor_size": (3, 2, 4)}, ValueError, "must be 1 or 2"),
        ],
    )
    def test_rejects_invalid_arguments(self, kwargs, error, match):
        kwargs = {"sensor_size": SENSOR, "n_time_bins": 2, **kwargs}
        with pytest.raises(error, match=match):
            events_to_frames(make_events([(0, 0, 0, 1)]), **kwargs)


class FakeTonicDataset:
    """Minimal stand-in for a tonic dataset: indexable (events, label) pairs."""

    sensor_size = SENSOR
    classes = ["a", "b", "c"]

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def fake_samples():
    return [
        (make_events(HAND_EVENTS), 2),
        (make_events([(0, 1, 10, 0), (2, 0, 30, 1)]), np.int64(0)),
        (make_events([(1, 1, 0, 1)]), 1),
    ]


class TestFromTonic:
    def test_duck_typed_dataset(self):
        ds = from_tonic(FakeTonicDataset(fake_samples()), n_time_bins=2)
        assert ds.events.shape == (3, 2, 2, 2, 3) and ds.num_classes == 3
        np.testing.assert_array_equal(ds.labels, [2, 0, 1])
        assert ds.name == "FakeTonicDataset"
        for i, (events, _) in enumerate(fake_samples()):
            np.testing.assert_array_equal(
                ds.events[i], events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)
            )

    def test_indices_sensor_size_and_num_classes(self):
        samples = fake_samples()
        ds = from_tonic(samples, n_time_bins=3, sensor_size=SENSOR, indices=[2, 0], name="list")
        np.testing.assert_array_equal(ds.labels, [1, 2])
        assert ds.num_classes == 3 and ds.name == "list" and ds.num_steps == 3

    def test_validation(self):
        with pytest.raises(ValueError, match="sensor_size is required"):
            from_tonic(fake_samples(), n_time_bins=2)
        with pytest.raises(TypeError, match="expected a scalar integer class index"):
            from_tonic([(make_events(HAND_EVENTS), "cat")], n_time_bins=2, sensor_size=SENSOR)
        with pytest.raises(TypeError, match=r"dataset\[0\] must be an \(events, label\) pair"):
            from_tonic([make_events(HAND_EVENTS)], n_time_bins=2, sensor_size=SENSOR)
        with pytest.raises(ValueError, match="no samples"):
            from_tonic(FakeTonicDataset([]), n_time_bins=2)

    def test_agrees_with_tonic_frames(self):
        tonic = pytest.importorskip("tonic")
        events = make_events(HAND_EVENTS)
        events = np.sort(events, order="t")
        theirs = tonic.transforms.ToFrame(sensor_size=SENSOR, event_count=len(events))(events)
        ours = events_to_frames(events, sensor_size=SENSOR, n_time_bins=1)
        # tonic orders channels by polarity value (OFF first); ours is ON first.
        np.testing.assert_array_equal(ours[0], np.asarray(theirs).sum(axis=0)[::-1])


class TestFromDirectory:
    def test_class_folders_of_npy_and_npz(self, tmp_path):
        (tmp_path / "left").mkdir()
        (tmp_path / "right").mkdir()
        samples = fake_samples()
        np.save(tmp_path / "left" / "a.npy", samples[0][0])
        np.savez(tmp_path / "left" / "b.npz", events=samples[1][0])
        np.savez(tmp_path / "right" / "c.npz", samples[2][0])
        (tmp_path / "right" / "notes.txt").write_text("ignored")
        ds = from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)
        assert ds.class_names == ("left", "right") and ds.num_classes == 2
        np.testing.assert_array_equal(ds.labels, [0, 0, 1])
        for i, (events, _) in enumerate(samples):
            np.testing.assert_array_equal(
                ds.events[i], events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)
            )

    def test_validation(self, tmp_path):
        with pytest.raises(ValueError, match="existing directory"):
            from_directory(tmp_path / "missing", sensor_size=SENSOR, n_time_bins=2)
        (tmp_path / "cls").mkdir()
        with pytest.raises(ValueError, match="no .npy or .npz files"):
            from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)
        for name in ("cls", "other"):     # two classes, as a classifier needs
            (tmp_path / name).mkdir(exist_ok=True)
            np.savez(tmp_path / name / "two.npz", a=np.zeros(1), b=np.zeros(1))
        with pytest.raises(ValueError, match="'events' or exactly one array"):
            from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)
