"""Digit saccades: a simulated DVS camera over scikit-learn's digits."""
import sys

import numpy as np
import pytest

from braintrace_conv.data import digits_saccades, saccade_path


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
            (dict(n_samples=5000),
             r"n_samples must be at most the number of digits \(1797\), got 5000"),
            (dict(background=1.0), r"background must lie in \(0, 1\)"),
            (dict(jitter=-1.0), "jitter must be a non-negative number"),
        ],
    )
    def test_validation(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            digits_saccades(**kwargs)

    def test_missing_sklearn_is_reported(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
        with pytest.raises(ImportError, match="needs scikit-learn"):
            digits_saccades(n_samples=2, T=3)
