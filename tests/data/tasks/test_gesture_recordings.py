"""gesture_recordings: DVS Gesture's raw layout, segments of 1-3 s with gaps, noise, the
hand's motion telling the gestures apart, and camera files equal to the .npy events."""

import numpy as np
import pytest

from braintrace_conv.data import (
    GESTURE_NAMES,
    gesture_recordings,
    read_events,
    read_segments,
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gestures")
    return folder, gesture_recordings(folder, 2, duration_s=8.0, size=(24, 32), seed=1,
                                      formats=("npy",))


def test_files_follow_dvs_gestures_raw_layout(written):
    folder, recordings = written
    assert sorted(p.name for p in folder.iterdir()) == [
        "user01_synthetic.npy", "user01_synthetic_labels.csv",
        "user02_synthetic.npy", "user02_synthetic_labels.csv"]
    header = (folder / "user01_synthetic_labels.csv").read_text().splitlines()[0]
    assert header == "class,startTime_usec,endTime_usec"
    assert [r.events.name for r in recordings] == ["user01_synthetic.npy", "user02_synthetic.npy"]


def test_segments_last_one_to_three_seconds_with_gaps_inside_the_recording(written):
    folder, recordings = written
    for recording in recordings:
        segments = read_segments(recording.events.with_name(
            recording.events.stem + "_labels.csv"), num_classes=len(GESTURE_NAMES))
        events = read_events(recording.events)
        lengths = segments.end_us - segments.start_us
        gaps = segments.start_us[1:] - segments.end_us[:-1]
        assert len(segments) >= 2 and np.all((lengths >= 1e6) & (lengths <= 3e6))
        assert np.all((gaps >= 0.5e6) & (gaps <= 1.5e6))
        assert events["t"][0] <= segments.start_us[0] and segments.end_us[-1] <= events["t"][-1] + 1e3
        inside = segments.at(events["t"]) >= 0
        gap_rate = (~inside).sum() / ((events["t"][-1] - events["t"][0]) / 1e6 - lengths.sum() / 1e6)
        assert gap_rate > 0                                    # background noise everywhere
        assert inside.sum() / (lengths.sum() / 1e6) > 10 * gap_rate   # the hand dominates


def test_gestures_differ_in_how_the_hand_moves(tmp_path):
    """Per class, where the events lie (centred on the hand's centre) differs: the
    horizontal wave spreads along x, the vertical one along y."""
    recordings = gesture_recordings(tmp_path, 1, duration_s=20.0, size=(24, 24), seed=2,
                                    formats=("npy",), noise_hz=0.0)
    events = read_events(recordings[0].events)
    segments = recordings[0].segments
    index = segments.at(events["t"])
    spread = {}
    for label in (2, 3):
        mine = np.isin(index, np.flatnonzero(segments.labels == label))
        spread[label] = events["x"][mine].std() / events["y"][mine].std()
    assert spread[2] > 2 and spread[3] < 0.5


def test_equal_seeds_write_equal_files(tmp_path):
    a = gesture_recordings(tmp_path / "a", 1, duration_s=5.0, seed=3, formats=("npy",))
    b = gesture_recordings(tmp_path / "b", 1, duration_s=5.0, seed=3, formats=("npy",))
    np.testing.assert_array_equal(read_events(a[0].events), read_events(b[0].events))


def test_camera_files_hold_the_same_events(tmp_path):
    pytest.importorskip("faery")
    recordings = gesture_recordings(tmp_path, 1, duration_s=4.5, size=(16, 16), seed=4)
    events = read_events(recordings[0].events)
    for suffix in (".aedat4", ".raw"):
        np.testing.assert_array_equal(read_events(recordings[0].events.with_suffix(suffix)),
                                      events)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="duration_s=2.0 is too short"):
        gesture_recordings(tmp_path, 1, duration_s=2.0)
    with pytest.raises(ValueError, match="num_classes must be at most 6"):
        gesture_recordings(tmp_path, 1, num_classes=7)
    with pytest.raises(ValueError, match="formats must be a non-empty subset"):
        gesture_recordings(tmp_path, 1, formats=("dat",))
