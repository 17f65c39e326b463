"""write_events: files that read_events gives back event for event, in every format."""

import numpy as np
import pytest

from braintrace_conv.data import (
    CAMERA_EVENT_DTYPE,
    EventFileError,
    EventReader,
    read_events,
    write_events,
)
from random_events import random_events




def test_npy_round_trip(tmp_path):
    events = random_events(3000)
    path = write_events(tmp_path / "rec.npy", events)
    np.testing.assert_array_equal(read_events(path), events)


@pytest.mark.parametrize("suffix, format", [(".aedat4", "aedat4"), (".raw", "evt3"),
                                            (".raw", "evt2")])
def test_camera_files_round_trip_event_exact(tmp_path, suffix, format):
    pytest.importorskip("faery")
    events = random_events(20000, seed=3)
    path = write_events(tmp_path / f"rec{suffix}", events, sensor_size=(24, 16), format=format)
    reader = EventReader(path, block_events=1000)
    assert reader.format == format and reader.sensor_size == (24, 16)
    out = read_events(path)
    assert out.dtype == CAMERA_EVENT_DTYPE
    np.testing.assert_array_equal(out, events)
    np.testing.assert_array_equal(reader.read(12345, 12500), events[12345:12500])
    assert reader.seek_time(events["t"][7000]) == np.searchsorted(events["t"], events["t"][7000])


@pytest.mark.parametrize("suffix, format", [(".aedat4", "aedat4"), (".raw", "evt3"),
                                            (".raw", "evt2")])
def test_camera_files_keep_timestamps_across_silences_and_past_2_to_the_32(tmp_path, suffix,
                                                                         format):
    """AEDAT4 stores whole 64-bit timestamps; EVT files counters that wrap (prophesee)."""
    pytest.importorskip("faery")
    events = random_events(8)
    events["t"] = [10, 4_999, 16_777_200, 16_782_300, 36_000_000, (1 << 32) + 5,
                   (1 << 33) + 7, (1 << 35) + 1]
    path = write_events(tmp_path / f"late{suffix}", events, sensor_size=(24, 16),
                        format=format)
    np.testing.assert_array_equal(read_events(path), events)


def test_wrong_events_and_arguments_are_refused_before_writing(tmp_path):
    events = random_events(100)
    events["t"][50] = 0
    with pytest.raises(EventFileError, match="event 50 has the timestamp 0 us, earlier"):
        write_events(tmp_path / "rec.npy", events)
    assert not (tmp_path / "rec.npy").exists()
    with pytest.raises(ValueError, match="cannot tell the format of .*rec.raw"):
        write_events(tmp_path / "rec.raw", random_events(10), sensor_size=(24, 16))
    with pytest.raises(ValueError, match="evt3 files are named \\*.raw"):
        write_events(tmp_path / "rec.aedat4", random_events(10), sensor_size=(24, 16),
                     format="evt3")
    with pytest.raises(ValueError, match="needs sensor_size"):
        write_events(tmp_path / "rec.aedat4", random_events(10))
