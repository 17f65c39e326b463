"""The SHD-like spoken words: format, rates, seeds, and a Conv1d net that learns them online."""
import math

import brainstate
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.data import EventDataset, events_to_frames, synthetic_shd
from braintrace_conv.data.tasks.spoken_digits import EVENT_DTYPE as SHD_DTYPE


class TestSyntheticSHD:
    def test_format_balance_and_consistency_with_its_events(self):
        ds, recordings = synthetic_shd(40, num_classes=4, T=20, duration_ms=300.0, seed=1)
        assert isinstance(ds, EventDataset) and ds.name == "synthetic_shd"
        assert ds.events.shape == (40, 20, 1, 700) and ds.num_classes == 4
        np.testing.assert_array_equal(ds.class_counts(), [10, 10, 10, 10])
        assert len(recordings) == 40
        for events, frames in zip(recordings, ds.events):
            assert events.dtype == SHD_DTYPE and (events["p"] == 1).all()
            assert np.all(np.diff(events["t"]) >= 0)
            assert events["t"].min() >= 0 and events["t"].max() < 300_000
            assert events["x"].min() >= 0 and events["x"].max() < 700
            np.testing.assert_array_equal(
                frames, events_to_frames(events, sensor_size=(700, 1, 1), n_time_bins=20,
                                         time_window_us=15_000.0, t_start_us=0))
            assert frames.sum() == len(events)

    def test_rates_match_the_parameters(self):
        # Background only: Poisson spikes at background_hz on every channel.
        ds, recordings = synthetic_shd(20, n_channels=100, duration_ms=500.0,
                                       band_rate_hz=0.0, background_hz=4.0, seed=2)
        counts = np.array([len(e) for e in recordings])
        expected = 4.0 * 0.5 * 100
        assert abs(counts.mean() - expected) < 4 * math.sqrt(expected / len(counts))
        # Bands only: spikes concentrate in the utterance, which lasts 0.6 * speed of it.
        ds, recordings = synthetic_shd(20, duration_ms=500.0, background_hz=0.0,
                                       speed=(1.0, 1.0), seed=2)
        spans = [e["t"].max() - e["t"].min() for e in recordings]
        assert max(spans) <= 0.6 * 500_000 and min(spans) > 0.4 * 500_000

    def test_seeds_and_templates(self):
        a, _ = synthetic_shd(12, T=10, duration_ms=100.0, seed=5)
        b, _ = synthetic_shd(12, T=10, duration_ms=100.0, seed=5)
        c, _ = synthetic_shd(12, T=10, duration_ms=100.0, seed=6)
        np.testing.assert_array_equal(a.events, b.events)
        assert not np.array_equal(a.events, c.events)
        # Same template_seed, different seed: the same words (a class's mean spectrum,
        # without shifts or jitter, in blocks of 10 channels against Poisson noise), so
        # train and test sets can be drawn apart.
        kwargs = dict(num_classes=2, T=1, duration_ms=200.0, channel_shift=0,
                      formant_jitter=0.0, background_hz=0.0, speed=(1.0, 1.0))
        first, _ = synthetic_shd(100, seed=0, **kwargs)
        second, _ = synthetic_shd(100, seed=1, **kwargs)
        other, _ = synthetic_shd(100, seed=0, template_seed=1, **kwargs)

        def spectra(ds):
            return np.stack([ds.events[ds.labels == k].mean(axis=(0, 1, 2)).reshape(70, 10)
                             .sum(axis=1) for k in range(2)])

        def distance(u, v):
            return np.abs(u - v).sum() / np.abs(u).sum()

        assert distance(spectra(first), spectra(second)) < 0.15
        assert distance(spectra(first), spectra(other)) > 0.5

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(speed=(0.9, 1.7)), ValueError, "speed must stay below 1.667"),
            (dict(channel_shift=-1), ValueError, "channel_shift must be a non-negative integer"),
            (dict(channel_shift=1.5), TypeError, "channel_shift must be a non-negative integer"),
            (dict(band_width=0.0), ValueError, "band_width must be a positive number"),
            (dict(T=0), ValueError, "T must be a positive integer"),
        ],
    )
    def test_validation(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            synthetic_shd(4, **kwargs)


class Conv1dSNN(brainstate.nn.Module):
    """Conv1d over the 700 channels, LIF, pooling, dense readout into a leaky integrator."""

    def __init__(self, num_classes, tau=20.0):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 15, stride=5, layout="channels_first")   # (8, 140)
        self.lif = nn.LIF((8, 140), tau=tau)
        self.pool = nn.AvgPool1d(7, layout="channels_first")                 # (8, 20)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8 * 20, num_classes)
        self.out = nn.LI(num_classes, tau=tau)

    def update(self, x):                        # x: (B, 1, 700), one time step
        return self.out(self.fc(self.flat(self.pool(self.lif(self.conv(x))))))


def test_conv1d_snn_learns_synthetic_shd_online():
    T, tau, epochs = 25, 20.0, 6
    ds, _ = synthetic_shd(400, T=T, duration_ms=10.0 * T, seed=0)
    train, test = ds.split(0.25, seed=0)
    brainstate.random.seed(0)
    net = Conv1dSNN(ds.num_classes, tau)
    learner = bc.ES_D_RTRL(net, decay=math.exp(-1 / tau))
    params = net.states(brainstate.ParamState)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init({k: p.value for k, p in params.items()})

    def loss_fn(scores, labels):                # every step, averaged over T
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(scores, labels)) / T

    for epoch in range(epochs):
        for xs, labels in train.batches(32, seed=epoch, drop_last=True):
            _, grads = learner.value_and_grad(loss_fn, jnp.asarray(xs),
                                              jnp.broadcast_to(labels, (T, len(labels))))
            values = {k: p.value for k, p in params.items()}
            updates, opt_state = optimizer.update(grads, opt_state, values)
            for k, v in optax.apply_updates(values, updates).items():
                params[k].value = v
    xs, labels = next(test.batches(len(test), shuffle=False))
    scores = np.asarray(learner.predict(jnp.asarray(xs)))
    accuracy = np.mean(scores.sum(axis=0).argmax(axis=-1) == labels)
    assert accuracy > 0.5, accuracy                 # chance: 0.1
