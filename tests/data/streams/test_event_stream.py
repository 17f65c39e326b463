"""EventStream: chunks equal the binning of whole recordings, targets follow the segments,
positions resume bit for bit, memory stays flat, and wrong inputs are named."""

import json
import re
import tracemalloc

import numpy as np
import pytest

from braintrace_conv.data import (
    CAMERA_EVENT_DTYPE,
    EventFileError,
    EventStream,
    Recording,
    Segments,
    events_to_frames,
    find_recordings,
    gesture_recordings,
    write_events,
    write_segments,
)
from braintrace_conv.data.binning import Binning
from braintrace_conv.data.transforms import (CenterCrop, Compose, Denoise, Downsample,
                                             MergePolarities, RefractoryPeriod)

SENSOR = (12, 8, 2)
DT = 1000


def events_between(rng, start_us, stop_us, n):
    events = np.zeros(n, CAMERA_EVENT_DTYPE)
    events["t"] = np.sort(rng.integers(start_us, stop_us, n))
    events["x"], events["y"] = rng.integers(0, SENSOR[0], n), rng.integers(0, SENSOR[1], n)
    events["p"] = rng.integers(0, 2, n)
    return events


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """Two recordings of different lengths on different clocks, with segments."""
    folder = tmp_path_factory.mktemp("streams")
    rng = np.random.default_rng(0)
    spans = [(2_000_123, 2_731_000, 9000), (50_000, 473_500, 6000)]
    segments = [Segments(np.array([2, 0, 1]), np.array([2_100_000, 2_300_000, 2_500_000]),
                         np.array([2_250_500, 2_420_000, 2_745_000])),
                Segments(np.array([1]), np.array([60_000]), np.array([300_000]))]
    out = []
    for i, ((start, stop, n), seg) in enumerate(zip(spans, segments)):
        events = events_between(rng, start, stop, n)
        write_events(folder / f"rec{i}.npy", events)
        write_segments(folder / f"rec{i}_labels.csv", seg)
        out.append(events)
    return folder, out, segments


def stream(folder, **kwargs):
    options = dict(sensor_size=SENSOR, dt_us=DT, chunk_steps=50, num_classes=3,
                   block_events=700)
    options.update(kwargs)
    return EventStream(find_recordings(folder), **options)


def collect(stream_):
    chunks = [(f, l, w, stream_.last_segments) for f, (l, w) in stream_]
    return [np.concatenate(parts) for parts in zip(*chunks)], len(chunks)


def test_one_stream_per_recording_equals_binning_each_recording_whole(recordings):
    folder, events, segments = recordings
    s = stream(folder)
    (frames, labels, weights, segment_ids), n_chunks = collect(s)
    assert s.batch_size == 2 and frames.dtype == np.float32
    assert frames.shape[1:] == (2, 2, 8, 12) and frames.shape[0] == s.num_steps
    assert n_chunks == -(-s.num_steps // 50)
    for b, (ev, seg) in enumerate(zip(events, segments)):
        origin = min(ev["t"][0], seg.start_us[0])
        steps = max((ev["t"][-1] - origin) // DT + 1, int(np.ceil((seg.end_us[-1] - origin) / DT)))
        whole = events_to_frames(ev, sensor_size=SENSOR, time_window_us=DT, n_time_bins=steps,
                                 t_start_us=origin)
        np.testing.assert_array_equal(frames[:steps, b], whole)
        assert not frames[steps:, b].any() and not weights[steps:, b].any()   # padded end
        index = seg.at(origin + np.arange(steps) * DT)
        np.testing.assert_array_equal(weights[:steps, b], index >= 0)
        np.testing.assert_array_equal(labels[:steps, b], np.where(index >= 0, seg.labels[index], 0))
    first = len(segments[0])
    assert set(np.unique(segment_ids[:, 1])) == {-1, first}      # numbered across recordings


def test_playlist_streams_start_at_offsets_and_each_plays_every_event_once(recordings):
    folder, events, _ = recordings
    s = stream(folder, batch_size=3)
    (frames, _, weights, _), _ = collect(s)
    total = s.num_steps
    assert frames.shape[:2] == (total, 3)
    counts = frames.sum(axis=(2, 3, 4))
    np.testing.assert_array_equal(counts.sum(axis=0), sum(len(e) for e in events))
    for b in (1, 2):    # stream b is stream 0 shifted by b * total // 3 steps
        np.testing.assert_array_equal(frames[:, b], np.roll(frames[:, 0], -(b * total // 3), 0))
        np.testing.assert_array_equal(weights[:, b], np.roll(weights[:, 0], -(b * total // 3), 0))


@pytest.mark.parametrize("batch_size, loop", [(None, False), (3, False), (2, True)])
def test_resuming_from_a_saved_position_gives_the_same_chunks_bit_for_bit(recordings,
                                                                         batch_size, loop):
    folder, _, _ = recordings
    uninterrupted = stream(folder, batch_size=batch_size, loop=loop)
    chunks, saved = [], None
    for i, (frames, (labels, weights)) in enumerate(uninterrupted):
        chunks.append((frames, labels, weights))
        if i == 6:
            saved = json.dumps(uninterrupted.position())     # what a checkpoint stores
        if len(chunks) == 25:
            break
    resumed = stream(folder, batch_size=batch_size, loop=loop, block_events=123)
    resumed.seek(json.loads(saved))
    for (frames, labels, weights), (f, (l, w)) in zip(chunks[7:], resumed):
        assert frames.tobytes() == f.tobytes()
        np.testing.assert_array_equal(labels, l)
        np.testing.assert_array_equal(weights, w)


@pytest.mark.parametrize("batch_size, loop, max_steps", [
    (None, False, None), (3, False, None), (None, False, 275), (3, False, 10**9),
    (2, True, 1_000)])
def test_labelled_chunks_are_the_chunks_played_with_a_labelled_step(recordings, batch_size,
                                                                      loop, max_steps):
    """What a learning-rate schedule is planned over: fit_stream updates on these chunks."""
    folder, _, _ = recordings
    s = stream(folder, batch_size=batch_size, loop=loop)
    planned = s.labelled_chunks(max_steps)
    played = 0
    for i, (_, (_, weights)) in enumerate(s):
        played += bool(weights.any())
        if max_steps is not None and (i + 1) * 50 >= max_steps:   # fit_stream's stop
            break
    assert planned == played > 0
    assert s.labelled_chunks(max_steps) == planned            # the position is untouched
    if loop:
        with pytest.raises(ValueError, match=r"max_steps must be given for an endless "):
            s.labelled_chunks()


def test_a_position_from_another_stream_is_refused(recordings):
    folder, _, _ = recordings
    position = stream(folder).position()
    with pytest.raises(ValueError, match="saved for a stream with dt_us=1000, but this stream "
                                         "has dt_us=500"):
        stream(folder, dt_us=500).seek(position)
    with pytest.raises(ValueError, match="position must be a dict from EventStream.position"):
        stream(folder).seek([1, 2])


def test_memory_does_not_grow_with_the_steps_seen(recordings):
    folder, _, _ = recordings
    s = iter(stream(folder, batch_size=2, loop=True))

    def peak(n):
        tracemalloc.start()
        for _ in range(n):
            next(s)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    # the first few thousand Binning objects (two per chunk) leave about 120 KiB of small
    # blocks behind in CPython, once; built first, they do not count as growth
    for t in range(3000):
        Binning(sensor_size=SENSOR, time_window_us=DT, n_time_bins=50, t_start_us=t)
    peak(5)
    early, late = peak(30), peak(300)      # 300 chunks: the recordings looped ~10 times
    assert late < 1.5 * early


# ----------------------------------------------------------------------------- transforms
#: Stateful transforms at the camera's pixels, then a smaller grid: 12 x 8 -> 6 x 4 x 1.
TRANSFORMS = [Denoise(window_us=1500), RefractoryPeriod(period_us=800), Downsample(factor=0.5),
              MergePolarities()]


def test_transformed_streams_equal_the_binning_of_each_whole_recording_transformed(recordings):
    folder, events, segments = recordings
    s = stream(folder, transforms=TRANSFORMS)
    assert s.frame_shape == (1, 4, 6) and s.sensor_size == SENSOR
    (frames, _, _, _), _ = collect(s)
    for b, (ev, seg) in enumerate(zip(events, segments)):
        origin = min(ev["t"][0], seg.start_us[0])
        whole = events_to_frames(ev, sensor_size=SENSOR, time_window_us=DT, transforms=TRANSFORMS,
                                 n_time_bins=len(frames), t_start_us=origin)
        np.testing.assert_array_equal(frames[:, b], whole)
        assert 0 < whole.sum() < len(ev)                 # the transforms dropped some events


def test_transformed_playlist_streams_that_start_mid_recording_rebuild_the_state(recordings):
    """Streams 1 and 2 start in the middle of a recording, with the transforms' state that
    playing it from its start gives: each stream is stream 0 shifted."""
    folder, _, _ = recordings
    s = stream(folder, batch_size=3, transforms=TRANSFORMS)
    (frames, _, _, _), _ = collect(s)
    total = s.num_steps
    for b in (1, 2):
        np.testing.assert_array_equal(frames[:, b], np.roll(frames[:, 0], -(b * total // 3), 0))


@pytest.mark.parametrize("batch_size, loop", [(None, False), (3, False), (2, True)])
def test_a_transformed_stream_resumes_bit_for_bit(recordings, batch_size, loop):
    """The position holds no state of the transforms: a resumed stream rebuilds it from the
    events of their look-back window, whatever the blocks it reads."""
    folder, _, _ = recordings
    options = dict(batch_size=batch_size, loop=loop, chunk_steps=37, transforms=TRANSFORMS)
    uninterrupted = stream(folder, **options)
    chunks = [frames for frames, _ in zip((f for f, _ in uninterrupted), range(30))]
    for cut in (1, 5, 11):
        resumed = stream(folder, **dict(options, block_events=97))
        replay = stream(folder, **options)
        for _ in zip(range(cut), replay):
            pass
        resumed.seek(json.loads(json.dumps(replay.position())))
        assert resumed.position() == replay.position()
        for expected, (f, _) in zip(chunks[cut:], resumed):
            assert expected.tobytes() == f.tobytes()


def test_a_position_of_a_stream_with_other_transforms_is_refused(recordings):
    folder, _, _ = recordings
    position = stream(folder, transforms=TRANSFORMS).position()
    with pytest.raises(ValueError, match=re.escape("position was saved for a stream with "
                                                   "transforms=['Denoise(window_us=1500)'")):
        stream(folder, transforms=TRANSFORMS[1:]).seek(position)
    assert "transforms" not in stream(folder).position()["config"]  # as before transforms


def test_a_large_camera_streamed_small_never_builds_a_full_size_frame(tmp_path):
    """1280 x 720 at 160 x 90: a chunk's allocations stay near the reduced chunk's size, far
    below one full-size frame (7 MiB); the benchmark benchmarks/camera.py measures it on a
    real recording."""
    rng = np.random.default_rng(7)
    n = 60_000
    events = np.zeros(n, CAMERA_EVENT_DTYPE)
    events["t"] = np.sort(rng.integers(0, 2_000_000, n))
    events["x"], events["y"] = rng.integers(0, 1280, n), rng.integers(0, 720, n)
    events["p"] = rng.integers(0, 2, n)
    write_events(tmp_path / "camera.npy", events)
    s = iter(EventStream([tmp_path / "camera.npy"], sensor_size=(1280, 720, 2), dt_us=10_000,
                         chunk_steps=50, num_classes=1,
                         transforms=[Downsample(factor=1 / 8), CenterCrop((128, 90))]))
    next(s)
    tracemalloc.start()
    frames, _ = next(s)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert frames.shape == (50, 1, 2, 90, 128)
    assert peak < 1.5 * frames.nbytes < 1280 * 720 * 2 * 4


def test_per_step_labels(tmp_path):
    rng = np.random.default_rng(1)
    write_events(tmp_path / "r.npy", events_between(rng, 0, 99_500, 500))
    step_labels = np.where(np.arange(100) % 10 < 4, -1, np.arange(100) % 3)
    s = EventStream([Recording(tmp_path / "r.npy", step_labels, t_start_us=0)],
                    sensor_size=SENSOR, dt_us=DT, chunk_steps=30, num_classes=3)
    (_, labels, weights, segments), _ = collect(s)
    np.testing.assert_array_equal(weights[:, 0], step_labels >= 0)
    np.testing.assert_array_equal(labels[:, 0], np.maximum(step_labels, 0))
    with pytest.raises(ValueError, match=r"r.npy: 50 labels for 100 steps of 1000 us"):
        EventStream([Recording(tmp_path / "r.npy", step_labels[:50], t_start_us=0)],
                    sensor_size=SENSOR,
                    dt_us=DT, chunk_steps=30, num_classes=3)
    with pytest.raises(ValueError, match=r"step 0 has label -3; expected a class index or -1"):
        Recording(tmp_path / "r.npy", step_labels - 2)


def test_wrong_labels_and_events_are_named_with_their_file(tmp_path, recordings):
    folder, _, _ = recordings
    with pytest.raises(ValueError, match=re.escape("rec0_labels.csv, line 2: label 2 is out "
                                                   "of range for 2 classes")):
        stream(folder, num_classes=2)
    events = events_between(np.random.default_rng(2), 0, 1_000_000, 3000)
    events["t"][2500] = 10
    np.save(tmp_path / "back.npy", events)
    s = EventStream([tmp_path / "back.npy"], sensor_size=SENSOR, dt_us=DT, chunk_steps=100,
                    num_classes=3)
    with pytest.raises(EventFileError, match=r"back.npy: event 2500 has the timestamp 10 us"):
        list(s)
    events = events_between(np.random.default_rng(2), 0, 1_000_000, 300)
    events["x"][7] = 40
    np.save(tmp_path / "wide.npy", events)
    with pytest.raises(EventFileError, match=r"wide.npy: event 7 has x = 40; .* \[0, 12\)"):
        list(EventStream([tmp_path / "wide.npy"], sensor_size=SENSOR, dt_us=DT,
                         chunk_steps=100, num_classes=3))


@pytest.mark.parametrize("rows, message", [
    ("1,2100000,2200000\n1,62731000,63000000\n", "line 3: the segment [6.2731e+07, 6.3e+07) "
                                                  "us lies after the last event of"),
    ("1,2100,2200\n", "line 2: the segment [2100, 2200) us lies before the first event of"),
], ids=["60 s after the end", "milliseconds under _us"])
def test_segments_outside_their_recording_are_refused_when_the_stream_is_built(
        tmp_path, recordings, rows, message):
    folder, events, _ = recordings
    np.save(tmp_path / "rec.npy", events[0])
    (tmp_path / "rec_labels.csv").write_text("class,startTime_usec,endTime_usec\n" + rows)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'rec_labels.csv'}, {message} "
                                                   f"{tmp_path / 'rec.npy'}")):
        EventStream(find_recordings(tmp_path), sensor_size=SENSOR, dt_us=DT, chunk_steps=50,
                    num_classes=3)


def test_generated_gestures_stream_identically_from_every_file_format(tmp_path):
    pytest.importorskip("faery")
    recordings = gesture_recordings(tmp_path, 2, duration_s=4.5, size=(16, 16), seed=5)
    assert recordings[0].segments is not None
    options = dict(sensor_size=(16, 16, 2), dt_us=DT, chunk_steps=400, num_classes=6)
    reference, _ = collect(EventStream(recordings, **options))
    for suffix in (".aedat4", ".raw"):
        found = find_recordings(tmp_path, suffix=suffix)
        got, _ = collect(EventStream(found, **options))
        for a, b in zip(reference, got):
            np.testing.assert_array_equal(a, b)
    assert reference[0].sum() > 0 and reference[2].any()
