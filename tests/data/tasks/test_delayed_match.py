"""delayed_match_to_sample: the published timing, the sample held across a 1,000-step delay,
and labels that only the pair of stimuli determines."""

import numpy as np
import pytest

from braintrace_conv.data import EventDataset, delayed_match_to_sample


@pytest.fixture(scope="module")
def data():
    return delayed_match_to_sample(40, seed=0)


def test_shapes_and_the_published_timing(data):
    assert isinstance(data, EventDataset)
    assert data.events.shape == (40, 3200, 1, 40)
    assert data.class_names == ("non-match", "match")
    assert data.labels.sum() == 20                              # balanced


def test_periods_and_the_label_from_sample_and_test(data):
    spikes = data.events[:, :, 0, :]
    fixation = spikes[..., :10].sum(-1)
    stimulus = np.stack([spikes[..., 10:20].sum(-1), spikes[..., 20:30].sum(-1)], -1)
    assert fixation[:, :2300].sum() > 0 and not fixation[:, 2300:].any()   # go signal
    quiet = np.r_[0:300, 800:1800, 2300:3200]                  # fixation, delay, decision
    assert not stimulus[:, quiet].any()
    sample = stimulus[:, 300:800].sum(1).argmax(-1)
    test = stimulus[:, 1800:2300].sum(1).argmax(-1)
    assert np.all((stimulus[:, 300:800].sum(1) > 0).sum(-1) == 1)   # one stimulus shown
    np.testing.assert_array_equal(data.labels, sample == test)
    assert 1800 - 800 >= 1000                                   # the delay to bridge


def test_the_test_stimulus_alone_says_nothing_about_the_label():
    data = delayed_match_to_sample(400, seed=1, channels_per_group=2)
    spikes = data.events[:, :, 0, :]
    test = spikes[:, 1800:2300, 2:6].reshape(400, 500, 2, 2).sum((1, 3)).argmax(-1)
    for stimulus in (0, 1):
        match_rate = data.labels[test == stimulus].mean()
        assert 0.4 < match_rate < 0.6


def test_seeded_and_parameters_checked():
    np.testing.assert_array_equal(delayed_match_to_sample(3, seed=2).events,
                                  delayed_match_to_sample(3, seed=2).events)
    short = delayed_match_to_sample(4, n_stimuli=3, fixation_steps=1, sample_steps=2,
                                    delay_steps=3, test_steps=2, decision_steps=1,
                                    channels_per_group=1)
    assert short.events.shape == (4, 9, 1, 5)
    with pytest.raises(ValueError, match="n_stimuli must be at least 2"):
        delayed_match_to_sample(2, n_stimuli=1)
