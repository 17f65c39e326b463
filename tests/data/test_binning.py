"""Events of any rank into frames: hand-computed bins, a plain-loop reference and tonic itself."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braintrace_conv.data import events_to_frames, synthetic_shd
from braintrace_conv.data.tasks.spoken_digits import EVENT_DTYPE as SHD_DTYPE

EVENT_DTYPE = np.dtype([("x", np.int64), ("y", np.int64), ("t", np.int64), ("p", np.int64)])


FLOAT_X_DTYPE = np.dtype([("x", np.float64), ("y", np.int64), ("t", np.int64), ("p", np.int64)])


def make_events(records, dtype=EVENT_DTYPE):
    return np.array([tuple(r) for r in records], dtype=dtype)


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
            ({"n_time_bins": 0}, ValueError, "n_time_bins must be a positive integer"),
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
             r"sensor_size\[1\] must be a positive integer"),
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
