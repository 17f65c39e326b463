"""Event transforms: tonic's rules event for event, state carried across blocks, sensor
sizes passed along, binning at the transformed size, and wrong arguments named."""

import re

import numpy as np
import pytest

from braintrace_conv.data import CAMERA_EVENT_DTYPE, events_to_frames
from braintrace_conv.data.transforms import (CenterCrop, Compose, Crop, Denoise, Downsample,
                                             MergePolarities, RefractoryPeriod, compose)

SENSOR = (40, 30, 2)


def camera_events(n=20_000, sensor=SENSOR, start_us=20_000, stop_us=200_000, seed=0):
    """``n`` events in time order, some pixels busier than others (so that refractory and
    denoise keep some and drop some), timestamps from ``start_us`` on."""
    rng = np.random.default_rng(seed)
    events = np.zeros(n, CAMERA_EVENT_DTYPE)
    events["t"] = np.sort(rng.integers(start_us, stop_us, n))
    busy = rng.random(n) < 0.5
    events["x"] = np.where(busy, rng.integers(0, sensor[0] // 4, n), rng.integers(0, sensor[0], n))
    events["y"] = np.where(busy, rng.integers(0, sensor[1] // 4, n), rng.integers(0, sensor[1], n))
    events["p"] = rng.integers(0, 2, n)
    return events


def assert_same_events(a, b):
    assert a.dtype == b.dtype and len(a) == len(b)
    for name in a.dtype.names:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# ----------------------------------------------------------------------------- against tonic
@pytest.fixture(scope="module")
def tonic():
    return pytest.importorskip("tonic.transforms")


@pytest.mark.parametrize("ours, theirs", [
    (Downsample(factor=0.25), lambda T: T.Downsample(spatial_factor=0.25)),
    (Downsample(factor=(0.5, 1 / 3)), lambda T: T.Downsample(spatial_factor=(0.5, 1 / 3))),
    (Downsample(size=(13, 7)), lambda T: T.Downsample(sensor_size=SENSOR, target_size=(13, 7))),
    (CenterCrop((17, 11)), lambda T: T.CenterCrop(sensor_size=SENSOR, size=(17, 11))),
    (CenterCrop(20), lambda T: T.CenterCrop(sensor_size=SENSOR, size=20)),
    (RefractoryPeriod(period_us=3000), lambda T: T.RefractoryPeriod(delta=3000)),
    (RefractoryPeriod(period_us=0), lambda T: T.RefractoryPeriod(delta=0)),
    (Denoise(window_us=2000), lambda T: T.Denoise(filter_time=2000)),
    (Denoise(window_us=20_000), lambda T: T.Denoise(filter_time=20_000)),
    (MergePolarities(), lambda T: T.MergePolarities()),
], ids=["downsample 1/4", "downsample per axis", "downsample to a size", "center crop",
        "square center crop", "refractory", "refractory 0", "denoise 2 ms", "denoise 20 ms",
        "merge polarities"])
def test_each_transform_gives_tonics_events_event_for_event(tonic, ours, theirs):
    """Events from t = 20 ms on, after the windows where tonic's start differs (module
    docstring of braintrace_conv.data.transforms)."""
    events = camera_events()
    expected = theirs(tonic)(events)
    got = ours(events, sensor_size=SENSOR)
    assert_same_events(got, expected)
    if isinstance(ours, (RefractoryPeriod, Denoise)):
        assert 0 < len(got) < len(events)        # the rule keeps some events and drops some


def test_frames_of_a_tonic_pipeline_equal_binning_with_transforms(tonic):
    events = camera_events()
    steps = [Denoise(window_us=5000), RefractoryPeriod(period_us=1000), Downsample(factor=0.25)]
    frames = events_to_frames(events, sensor_size=SENSOR, transforms=steps,
                              time_window_us=10_000, n_time_bins=18, t_start_us=20_000)
    pipeline = tonic.Compose([tonic.Denoise(filter_time=5000), tonic.RefractoryPeriod(delta=1000),
                              tonic.Downsample(spatial_factor=0.25),
                              tonic.ToFrame(sensor_size=(10, 8, 2), time_window=10_000,
                                            start_time=20_000, end_time=200_000)])
    expected = pipeline(events)
    assert frames.shape == (18, 2, 8, 10)
    # tonic orders the channels by the value of p (OFF first), this library ON first
    np.testing.assert_array_equal(frames, expected[:, ::-1])
    assert 0 < frames.sum() < len(events)


def test_where_tonic_starts_differently(tonic):
    """tonic's RefractoryPeriod drops a pixel's first event at t = 0; its Denoise keeps every
    event before t = window. Here neither depends on where the clock starts."""
    events = np.zeros(3, CAMERA_EVENT_DTYPE)
    events["t"], events["x"], events["y"] = [0, 10, 5000], [3, 20, 3], [4, 5, 4]
    assert len(tonic.RefractoryPeriod(delta=100)(events)) == 2
    assert len(RefractoryPeriod(period_us=100)(events, sensor_size=SENSOR)) == 3
    assert len(tonic.Denoise(filter_time=1000)(events)) == 2
    assert len(Denoise(window_us=1000)(events, sensor_size=SENSOR)) == 0
    shifted = events.copy()
    shifted["t"] += 10**9
    for transform in (RefractoryPeriod(period_us=100), Denoise(window_us=1000)):
        kept = transform(events, sensor_size=SENSOR)
        np.testing.assert_array_equal(transform(shifted, sensor_size=SENSOR)["t"] - 10**9,
                                      kept["t"])


# ----------------------------------------------------------------------------- the rules
def test_refractory_counts_dropped_events_and_treats_both_polarities_as_one_pixel():
    events = np.zeros(5, CAMERA_EVENT_DTYPE)
    events["t"] = [100, 150, 220, 400, 401]
    events["p"] = [1, 0, 1, 1, 0]        # all at pixel (0, 0)
    kept = RefractoryPeriod(period_us=100)(events, sensor_size=SENSOR)
    # 150 and 220 each follow the event before by less than 100 us (220 - 150 = 70)
    np.testing.assert_array_equal(kept["t"], [100, 400])


def test_denoise_needs_a_four_neighbour_earlier_in_the_array():
    events = np.zeros(6, CAMERA_EVENT_DTYPE)
    events["t"] = [1000, 1000, 1500, 1600, 3000, 3100]
    events["x"] = [5, 6, 6, 7, 8, 0]      # (6,5) and (5,5) neighbours; (7,6) diagonal to (6,5)
    events["y"] = [5, 5, 5, 6, 5, 0]
    kept = Denoise(window_us=1000)(events, sensor_size=SENSOR)
    # event 1 follows event 0 (same time, earlier in the array); event 2 follows event 1;
    # event 0 has no neighbour before it; event 3 only a diagonal one; event 4's neighbour
    # (7, 5) never fired
    np.testing.assert_array_equal(kept["t"], [1000, 1500])


def test_blocks_of_a_recording_give_the_events_of_the_whole_recording():
    events = camera_events(start_us=0)
    steps = Compose([Denoise(window_us=3000), Downsample(factor=0.5),
                     RefractoryPeriod(period_us=2000), CenterCrop((16, 12))])
    whole = steps(events, sensor_size=SENSOR)
    rng = np.random.default_rng(3)
    cuts = np.sort(rng.choice(len(events), 40, replace=False))
    bound = steps.bind(SENSOR)
    blocks = [bound(part) for part in np.split(events, cuts)]
    assert_same_events(np.concatenate(blocks), whole)
    assert bound.sensor_size == (16, 12, 2) and bound.lookback_us == 5000


def test_a_stateful_transform_depends_only_on_its_lookback_window():
    """What lets a stream rebuild the state where it resumes: replaying the events of the
    last ``lookback_us`` before a time gives the events after it unchanged."""
    events = camera_events(start_us=0)
    steps = Compose([Denoise(window_us=3000), RefractoryPeriod(period_us=2000)])
    whole = steps(events, sensor_size=SENSOR)
    t0 = 100_000
    replayed = events[np.searchsorted(events["t"], t0 - steps.lookback_us):]
    after = steps(replayed, sensor_size=SENSOR)
    assert_same_events(after[after["t"] >= t0], whole[whole["t"] >= t0])
    late = steps(events[np.searchsorted(events["t"], t0 - 2000):], sensor_size=SENSOR)
    assert not np.array_equal(late[late["t"] >= t0], whole[whole["t"] >= t0])  # too short


def test_sensor_sizes_are_passed_along():
    camera = (1280, 720, 2)
    assert Downsample(factor=1 / 8).output_size(camera) == (160, 90, 2)
    assert Downsample(size=(160, 90)).output_size(camera) == (160, 90, 2)
    assert Downsample(factor=0.3).output_size(camera) == (384, 216, 2)   # floor(0.3 * 1279) + 1
    assert CenterCrop(128).output_size(camera) == (128, 128, 2)
    assert Crop(origin=(10, 20), size=(100, 50)).output_size(camera) == (100, 50, 2)
    assert MergePolarities().output_size(camera) == (1280, 720, 1)
    chain = compose([CenterCrop((720, 720)), Downsample(size=(64, 64)), MergePolarities()])
    assert chain.output_size(camera) == (64, 64, 1)
    assert compose(None) is None and compose([]) is None
    assert compose(Denoise(window_us=1)) == Compose([Denoise(window_us=1)])


def test_crop_keeps_the_region_and_moves_it_to_the_corner():
    events = camera_events()
    kept = Crop(origin=(5, 3), size=(10, 20))(events, sensor_size=SENSOR)
    inside = ((events["x"] >= 5) & (events["x"] < 15) & (events["y"] >= 3) & (events["y"] < 23))
    np.testing.assert_array_equal(kept["x"], events["x"][inside] - 5)
    np.testing.assert_array_equal(kept["y"], events["y"][inside] - 3)
    np.testing.assert_array_equal(kept["t"], events["t"][inside])


def test_one_dimensional_events_with_tonics_audio_sensor_size():
    rng = np.random.default_rng(4)
    events = np.zeros(500, [("t", "<f8"), ("x", "<i4"), ("p", "<i1")])
    events["t"], events["x"], events["p"] = np.sort(rng.random(500) * 1e5), rng.integers(0, 700, 500), 1
    steps = [Denoise(window_us=5000), Downsample(factor=0.5)]
    frames = events_to_frames(events, sensor_size=(700, 1, 1), transforms=steps, n_time_bins=4)
    assert compose(steps).output_size((700, 1, 1)) == (350, 1, 1)
    kept = Denoise(window_us=5000)(events, sensor_size=(700, 1, 1))
    assert frames.shape == (4, 1, 350) and frames.sum() == len(kept) > 0


def test_binning_with_transforms_equals_binning_the_transformed_events():
    events = camera_events()
    steps = [RefractoryPeriod(period_us=500), Downsample(factor=0.25), MergePolarities()]
    transformed = compose(steps)(events, sensor_size=SENSOR)
    expected = events_to_frames(transformed, sensor_size=(10, 8, 1), n_time_bins=7)
    np.testing.assert_array_equal(
        events_to_frames(events, sensor_size=SENSOR, transforms=steps, n_time_bins=7), expected)


def test_events_are_not_changed_in_place():
    events = camera_events(1000)
    before = events.copy()
    for transform in (Downsample(factor=0.5), Crop((0, 0), (40, 30)), MergePolarities(),
                      RefractoryPeriod(period_us=10), Denoise(window_us=10), Compose([])):
        out = transform(events, sensor_size=SENSOR)
        assert out is not events
    assert_same_events(events, before)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("make, error, message", [
    (lambda: Downsample(factor=0), ValueError, "factor must be a number in (0, 1], got 0"),
    (lambda: Downsample(factor=2), ValueError, "factor must be a number in (0, 1], got 2"),
    (lambda: Downsample(factor=(0.5, "a")), TypeError, "factor[1] must be a number in (0, 1]"),
    (lambda: Downsample(), ValueError, "Downsample takes exactly one of factor and size"),
    (lambda: Downsample(factor=0.5, size=(3, 3)), ValueError, "exactly one of factor and size"),
    (lambda: Downsample(size=(0, 3)), ValueError, "size[0] must be a positive integer, got 0"),
    (lambda: Crop(origin=5, size=(3, 3)), TypeError, "origin must be a tuple with one entry"),
    (lambda: Crop(origin=(-1, 0), size=(3, 3)), ValueError,
     "origin[0] must be a non-negative integer, got -1"),
    (lambda: Crop(origin=(0, 0), size=(3, 3, 3)), ValueError, "size must have 2 entries"),
    (lambda: CenterCrop(0), ValueError, "size must be a positive integer, got 0"),
    (lambda: RefractoryPeriod(period_us=-1), ValueError,
     "period_us must be a non-negative number, got -1"),
    (lambda: Denoise(window_us=0), ValueError, "window_us must be a positive number, got 0"),
    (lambda: compose("downsample"), TypeError, "transforms must be a transform or a sequence"),
    (lambda: compose([Downsample(factor=0.5), print]), TypeError, "transforms[1] must be a "
                                                                   "transform"),
])
def test_wrong_arguments_are_named_in_one_sentence(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


@pytest.mark.parametrize("transform, sensor, message", [
    (CenterCrop(50), SENSOR, "size must fit the sensor (40, 30), got 50"),
    (Crop(origin=(30, 0), size=(20, 5)), SENSOR, "size must fit the sensor (40, 30) from the "
                                                 "origin (30, 0), got (20, 5)"),
    (Downsample(size=(80, 10)), SENSOR, "size must fit the sensor (40, 30)"),
    (Downsample(factor=(0.5, 0.5, 0.5)), SENSOR, "factor must have 2 entries (one per"),
    (Downsample(factor=0.5), (40, 30, 3), "sensor_size[-1] (polarities) must be 1 or 2"),
])
def test_a_transform_that_does_not_fit_the_sensor_is_refused_when_bound(transform, sensor,
                                                                       message):
    with pytest.raises(ValueError, match=re.escape(message)):
        transform.bind(sensor)
    with pytest.raises(ValueError, match=re.escape(message)):
        events_to_frames(camera_events(10), sensor_size=sensor, transforms=transform,
                         n_time_bins=1)


def test_events_outside_the_sensor_are_named():
    events = camera_events(100)
    events["x"][7] = 45
    with pytest.raises(ValueError, match=re.escape("events field 'x' must lie in [0, 40) for "
                                                   "this sensor_size, got values in [0, 45]")):
        Downsample(factor=0.5)(events, sensor_size=SENSOR)
    with pytest.raises(TypeError, match="events must be a structured array with fields t, x"):
        Denoise(window_us=10)(np.zeros(3), sensor_size=SENSOR)
    with pytest.raises(ValueError, match=r"coordinate fields \['x', 'y'\] do not fit "
                                         r"sensor_size \(40, 2\)"):
        MergePolarities()(events, sensor_size=(40, 2))


# ----------------------------------------------------------------------------- a real camera
@pytest.mark.camera_files
def test_the_evk4_recording_transformed_and_streamed_equals_tonic_on_the_whole_file(tonic):
    """faery's EVK4 recording (1280 x 720, 1.2 M events): tonic's transforms on the whole
    file give the events of ours, and a stream at 160 x 90 gives the frames of binning them,
    also where it resumes (python3 tests/camera_files.py fetches it; run with -m
    camera_files)."""
    from camera_files import fetch

    from braintrace_conv.data import EventStream, read_events

    path = fetch() / "evt3.raw"
    events = read_events(path)
    camera = (1280, 720, 2)
    ours = [Denoise(window_us=10_000), RefractoryPeriod(period_us=1000), Downsample(factor=1 / 8)]
    theirs = tonic.Compose([tonic.Denoise(filter_time=10_000), tonic.RefractoryPeriod(delta=1000),
                            tonic.Downsample(spatial_factor=1 / 8)])
    # tonic's clocks start at 0, the recording's at 11.2 s: no early event is treated apart
    transformed = compose(ours)(events, sensor_size=camera)
    assert_same_events(transformed, theirs(events))
    assert 0.2 * len(events) < len(transformed) < 0.9 * len(events)
    t0 = int(events["t"][0])
    stream = EventStream([path], sensor_size=camera, dt_us=10_000, chunk_steps=100,
                         num_classes=1, transforms=ours)
    frames = np.concatenate([f for f, _ in stream])[:, 0]
    assert frames.shape[1:] == (2, 90, 160)
    np.testing.assert_array_equal(frames, events_to_frames(
        transformed, sensor_size=(160, 90, 2), time_window_us=10_000, n_time_bins=len(frames),
        t_start_us=t0))
    resumed = EventStream([path], sensor_size=camera, dt_us=10_000, chunk_steps=100,
                          num_classes=1, transforms=ours)
    stream.seek(None)
    for _ in zip(range(4), stream):     # 4 chunks, then resume where they stopped
        pass
    resumed.seek(stream.position())
    rest = np.concatenate([f for f, _ in resumed])[:, 0]
    assert rest.tobytes() == frames[400:].tobytes()
