"""The DVS pixel model and the moving-bars scenes and recordings."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braintrace_conv.data import (DIRECTION_NAMES, MotionScenes, dvs_events, moving_bars,
                                  render_scenes, sample_scenes)


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
        with pytest.raises(ValueError, match="threshold must be a positive number"):
            dvs_events(np.zeros((1, 3, 2, 2)), threshold=0.0, substeps=1)


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
            (dict(n_samples=0), ValueError, "n_samples must be a positive integer"),
            (dict(speed=(1.0, 0.5)), ValueError, "speed must satisfy low <= high"),
            (dict(speed=(0.0, 0.5)), ValueError, r"speed\[0\] must be a positive number"),
            (dict(speed=0.5), TypeError, r"speed must be a \(low, high\) pair"),
            (dict(size=(16,)), TypeError, r"size must be a \(height, width\) pair"),
            (dict(objects=("bar", "disc")), ValueError, "objects must be"),
            (dict(contrast=0.3, threshold=0.5), ValueError, "contrast=0.3 is below threshold"),
            (dict(center_spread=1.5), ValueError, "center_spread"),
            (dict(T=0), ValueError, "T must be a positive integer"),
        ],
    )
    def test_validation(self, kwargs, error, match):
        kwargs = {"n_samples": 4, **kwargs}
        with pytest.raises(error, match=match):
            moving_bars(kwargs.pop("n_samples"), **kwargs)
