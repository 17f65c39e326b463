"""Events of any rank into frames: a plain-loop reference, tonic itself, SHD-like data, Conv1d training."""

import math
from fractions import Fraction

import brainstate
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.data import EventDataset, events_to_frames, synthetic_shd
from braintrace_conv.data.spoken_digits import EVENT_DTYPE as SHD_DTYPE

FIELDS = {1: ("x",), 2: ("x", "y"), 3: ("x", "y", "z")}
# Sensor extents in tonic's order (x first); frames list them reversed.
EXTENTS = {1: (7,), 2: (5, 3), 3: (4, 3, 2)}


def random_events(rank, n_polarities, n_events=80, t_max=60, seed=0, sort=False):
    """Events with integer times in a small range, so bin edges are hit often."""
    rng = np.random.default_rng(seed)
    dtype = [("t", np.int64)] + [(f, np.int64) for f in FIELDS[rank]] + [("p", np.int8)]
    events = np.zeros(n_events, dtype=dtype)
    events["t"] = rng.integers(100, 100 + t_max, n_events)
    for field, extent in zip(FIELDS[rank], EXTENTS[rank]):
        events[field] = rng.integers(0, extent, n_events)
    events["p"] = rng.integers(0, 2, n_events) if n_polarities == 2 else 1
    return np.sort(events, order="t", kind="stable") if sort else events


def reference_frames(events, rank, n_polarities, *, n_time_bins=None, time_window=None,
                     event_count=None, t_start=None):
    """Frames by the documented definitions, one event at a time, in exact arithmetic."""
    times = [int(t) for t in events["t"]]
    t0 = min(times) if t_start is None else t_start
    kept = [i for i, t in enumerate(times) if t >= t0]
    t1 = max(times[i] for i in kept)
    if event_count is not None:
        order = sorted(kept, key=lambda i: times[i])   # sorted() is stable
        bin_of = {i: r // event_count for r, i in enumerate(order)}
        n_bins = -(-len(kept) // event_count)
    elif time_window is not None:
        bin_of = {i: (times[i] - t0) // time_window for i in kept}
        n_bins = (t1 - t0) // time_window + 1
    else:
        span = t1 - t0
        bin_of = {i: 0 if span == 0 else min(math.floor(Fraction(times[i] - t0) * n_time_bins
                                                        / span), n_time_bins - 1)
                  for i in kept}
    n_bins = n_time_bins if n_time_bins is not None else n_bins
    frames = np.zeros((n_bins, n_polarities) + EXTENTS[rank][::-1], dtype=np.float32)
    for i, k in bin_of.items():
        if k < n_bins:
            channel = 0 if n_polarities == 1 or events["p"][i] > 0 else 1
            coords = tuple(int(events[f][i]) for f in FIELDS[rank][::-1])
            frames[(k, channel) + coords] += 1
    return frames


BINNINGS = [
    dict(n_time_bins=4),
    dict(n_time_bins=3, t_start=110),
    dict(time_window=7),
    dict(time_window=10, t_start=90),
    dict(time_window=6, n_time_bins=5, t_start=105),
    dict(time_window=25, n_time_bins=6),
    dict(event_count=9),
    dict(event_count=20, n_time_bins=6),
]


def ours(events, rank, n_polarities, n_time_bins=None, time_window=None, event_count=None,
         t_start=None):
    return events_to_frames(events, sensor_size=EXTENTS[rank] + (n_polarities,),
                            n_time_bins=n_time_bins, time_window_us=time_window,
                            event_count=event_count, t_start_us=t_start)


class TestAgainstPlainReference:
    @pytest.mark.parametrize("binning", BINNINGS, ids=lambda b: ",".join(f"{k}={v}" for k, v in
                                                                         b.items()))
    @pytest.mark.parametrize("rank", [1, 2, 3])
    @pytest.mark.parametrize("n_polarities", [1, 2])
    def test_every_rank_and_binning(self, rank, n_polarities, binning):
        for seed in range(3):
            events = random_events(rank, n_polarities, seed=seed)
            frames = ours(events, rank, n_polarities, **binning)
            expected = reference_frames(events, rank, n_polarities, **binning)
            assert frames.dtype == np.float32 and frames.shape == expected.shape
            np.testing.assert_array_equal(frames, expected)

    def test_hand_computed_layouts(self):
        # 1-D (audio): frames[t, p, x]; tonic's (X, 1, P) form is accepted.
        audio = np.array([(0, 3, 1), (5, 0, 1), (10, 3, 1)], dtype=SHD_DTYPE)
        frames = events_to_frames(audio, sensor_size=(4, 1, 1), time_window_us=5.0)
        np.testing.assert_array_equal(frames[:, 0], [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1]])
        np.testing.assert_array_equal(
            events_to_frames(audio, sensor_size=(4, 1), time_window_us=5.0), frames)
        # 3-D: frames[t, p, z, y, x], ON first.
        dtype = [("t", float), ("x", int), ("y", int), ("z", int), ("p", bool)]
        volume = np.array([(0.0, 1, 2, 0, True), (1.0, 0, 0, 1, False)], dtype=dtype)
        frames = events_to_frames(volume, sensor_size=(2, 3, 2, 2), n_time_bins=1)
        assert frames.shape == (1, 2, 2, 3, 2)
        expected = np.zeros((1, 2, 2, 3, 2), np.float32)
        expected[0, 0, 0, 2, 1] = expected[0, 1, 1, 0, 0] = 1
        np.testing.assert_array_equal(frames, expected)

    def test_fixed_window_cuts_and_pads(self):
        events = np.array([(5, 0, 1), (12, 1, 1), (40, 2, 1)], dtype=SHD_DTYPE)
        frames = events_to_frames(events, sensor_size=(3, 1, 1), time_window_us=10,
                                  n_time_bins=6, t_start_us=0)
        # Bins [0, 10), [10, 20), ...: events in bins 0, 1 and 4; bin 5 is padding.
        np.testing.assert_array_equal(frames[:, 0].argmax(axis=1)[[0, 1, 4]], [0, 1, 2])
        np.testing.assert_array_equal(frames.sum(axis=(1, 2)), [1, 1, 0, 0, 1, 0])
        cut = events_to_frames(events, sensor_size=(3, 1, 1), time_window_us=10,
                               n_time_bins=2, t_start_us=10)
        np.testing.assert_array_equal(cut[:, 0], [[0, 1, 0], [0, 0, 0]])

    @pytest.mark.parametrize(
        "dtype, sensor_size, p, error, match",
        [
            ([("t", int), ("x", int), ("p", int)], (4, 2, 1), 1, ValueError,
             r"1 coordinate field\(s\) need sensor_size \(X, P\) or \(X, 1, P\)"),
            ([("t", int), ("x", int), ("y", int), ("p", int)], (4, 1), 1, ValueError,
             r"need sensor_size \(X, Y, P\)"),
            ([("t", int), ("x", int), ("y", int), ("z", int), ("p", int)], (4, 4, 1), 1,
             ValueError, r"need sensor_size \(X, Y, Z, P\)"),
            ([("t", int), ("x", int), ("z", int), ("p", int)], (4, 4, 1), 1, ValueError,
             "a coordinate is skipped"),
            ([("t", int), ("y", int), ("p", int)], (4, 1), 1, ValueError, r"missing \['x'\]"),
            ([("t", int), ("x", int), ("p", int)], (4, 1, 1), [0, 1], ValueError,
             "P=1 polarity channel but events field 'p' holds"),
            ([("t", int), ("x", int), ("p", int)], (4, 1, 3), 1, ValueError,
             r"sensor_size\[-1\] \(polarities\) must be 1 or 2"),
            ([("t", int), ("x", int), ("p", int)], (4, 0, 1), 1, ValueError,
             r"sensor_size\[1\] must be positive"),
        ],
    )
    def test_validation_names_what_was_expected(self, dtype, sensor_size, p, error, match):
        events = np.zeros(2, dtype=dtype)
        events["p"] = p
        with pytest.raises(error, match=match):
            events_to_frames(events, sensor_size=sensor_size, n_time_bins=2)


class TestAgainstTonic:
    """``tonic.transforms.ToFrame`` on time-sorted events, as the docstring states."""

    @pytest.fixture(autouse=True)
    def tonic(self):
        return pytest.importorskip("tonic")

    @staticmethod
    def theirs(events, sensor_size, **kwargs):
        import tonic
        # tonic writes into events['p'] for one-polarity sensors: give it a copy.
        frames = tonic.transforms.ToFrame(sensor_size=sensor_size, **kwargs)(events.copy())
        # tonic orders channels by polarity value (OFF first); ours are ON first.
        return np.asarray(frames)[:, ::-1] if sensor_size[-1] == 2 else np.asarray(frames)

    @pytest.mark.parametrize("rank", [1, 2])
    @pytest.mark.parametrize("n_polarities", [1, 2])
    @pytest.mark.parametrize("seed", range(4))
    def test_equivalences(self, rank, n_polarities, seed):
        events = random_events(rank, n_polarities, n_events=90, seed=seed, sort=True)
        span = int(events["t"][-1] - events["t"][0])
        n_events = len(events)

        sensor = (EXTENTS[2] if rank == 2 else (EXTENTS[1][0], 1)) + (n_polarities,)

        def check(ours_kwargs, **tonic_kwargs):
            np.testing.assert_array_equal(ours(events, rank, n_polarities, **ours_kwargs),
                                          self.theirs(events, sensor, **tonic_kwargs))

        window = next(w for w in (7, 8, 9, 11) if span % w)   # tonic drops t1 otherwise
        check(dict(time_window=window), time_window=window, include_incomplete=True)
        check(dict(time_window=6, n_time_bins=5, t_start=110),
              time_window=6, start_time=110, end_time=110 + 5 * 6)
        for n in (3, 4, 7):
            check(dict(time_window=span // n, n_time_bins=n), n_time_bins=n)
            check(dict(event_count=n_events // n, n_time_bins=n), n_event_bins=n)
        for count in (9, 30, 90):
            check(dict(event_count=count), event_count=count, include_incomplete=True)

    def test_shd_like_recording(self):
        _, recordings = synthetic_shd(2, T=20, duration_ms=200.0, seed=3)
        for events in recordings:
            frames = events_to_frames(events, sensor_size=(700, 1, 1), n_time_bins=20,
                                      time_window_us=10_000.0, t_start_us=0)
            theirs = self.theirs(events, (700, 1, 1), time_window=10_000.0, start_time=0,
                                 end_time=200_000.0)
            assert theirs.shape == frames.shape == (20, 1, 700)
            np.testing.assert_array_equal(frames, theirs)


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
            (dict(channel_shift=-1), ValueError, "channel_shift must be non-negative"),
            (dict(channel_shift=1.5), TypeError, "channel_shift must be an int"),
            (dict(band_width=0.0), ValueError, "band_width must be positive"),
            (dict(T=0), ValueError, "T must be positive"),
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
