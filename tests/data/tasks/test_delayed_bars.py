"""Delayed bars: clips of moving bars, blank frames, distractor trials."""
import numpy as np
import pytest

from braintrace_conv.data import DIRECTION_NAMES, delayed_bars, moving_bars


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
            (dict(stimulus_steps=2.0), TypeError, "stimulus_steps must be a positive integer"),
            (dict(delay_steps=0), ValueError, "delay_steps must be a positive integer"),
            (dict(cues=0), ValueError, "cues must be a positive integer"),
            (dict(n_samples=0), ValueError, "n_samples must be a positive integer"),
            (dict(objects=("disc",)), ValueError, "objects must be"),
        ],
    )
    def test_validation(self, kwargs, error, match):
        kwargs = {"n_samples": 4, **kwargs}
        with pytest.raises(error, match=match):
            delayed_bars(kwargs.pop("n_samples"), **kwargs)
