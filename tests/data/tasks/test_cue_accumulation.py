"""cue_accumulation: the published trial structure of e-prop's evidence-accumulation task."""

import numpy as np
import pytest

from braintrace_conv.data import EventDataset, cue_accumulation


@pytest.fixture(scope="module")
def data():
    return cue_accumulation(48, seed=0)


def test_shapes_and_the_published_length(data):
    assert isinstance(data, EventDataset)
    assert data.events.shape == (48, 2250, 1, 40) and data.num_steps == 2250
    assert data.class_names == ("left", "right") and data.num_classes == 2
    assert set(np.unique(data.events)) == {0.0, 1.0}


def test_cues_fire_only_in_their_windows_and_the_label_is_the_majority_side(data):
    spikes = data.events[:, :, 0, :]
    left, right = spikes[..., :10].sum(-1), spikes[..., 10:20].sum(-1)
    recall, noise = spikes[..., 20:30].sum(-1), spikes[..., 30:].sum(-1)
    in_cue = np.zeros(2250, bool)
    for k in range(7):
        in_cue[150 * k + 50:150 * (k + 1)] = True
    assert not (left[:, ~in_cue].any() or right[:, ~in_cue].any())
    assert not recall[:, :2100].any() and recall[:, 2100:].sum() > 0
    assert noise[:, :1000].any() and noise[:, -1000:].any()      # noise throughout
    cue_sides = []                                  # which group fired in each cue window
    for k in range(7):
        window = slice(150 * k + 50, 150 * (k + 1))
        l, r = left[:, window].sum(1), right[:, window].sum(1)
        assert not np.any((l > 0) & (r > 0))        # one side per cue
        cue_sides.append(r > l)
    # 10 channels at 40 Hz for 100 ms: a silent cue has probability 0.96**1000 ~ 1e-18
    right_cues = np.sum(cue_sides, axis=0)
    np.testing.assert_array_equal(data.labels, right_cues > 3)
    assert 0 < data.labels.sum() < len(data.labels)


def test_firing_rates_are_the_published_ones():
    data = cue_accumulation(200, seed=1)
    spikes = data.events[:, :, 0, :]
    rate_hz = lambda channels, steps: spikes[:, steps, channels].mean() * 1000
    assert rate_hz(slice(20, 30), slice(2100, 2250)) == pytest.approx(40, rel=0.05)
    assert rate_hz(slice(30, 40), slice(None)) == pytest.approx(10, rel=0.05)


def test_seeded_and_parameters_checked():
    np.testing.assert_array_equal(cue_accumulation(4, seed=3).events,
                                  cue_accumulation(4, seed=3).events)
    short = cue_accumulation(2, n_cues=3, delay_steps=10, recall_steps=5, channels_per_group=2)
    assert short.events.shape == (2, 3 * 150 + 10 + 5, 1, 8)
    with pytest.raises(ValueError, match="n_cues must be odd"):
        cue_accumulation(2, n_cues=6)
    with pytest.raises(ValueError, match="majority_probability must lie in"):
        cue_accumulation(2, majority_probability=0.4)
