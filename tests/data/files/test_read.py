"""read_events and EventReader: every format read back event for event, block by block from
any position, and every wrong file or event named by file and position."""

import re

import numpy as np
import pytest

from braintrace_conv.data import (
    EventFileError,
    EventReader,
    load_event_file,
    read_events,
    write_events,
)
from random_events import random_events





@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("events")
    events = random_events(5000)
    np.save(folder / "a.npy", events)
    np.savez(folder / "stored.npz", events=events)
    np.savez_compressed(folder / "deflated.npz", events=events)
    return folder, events


@pytest.mark.parametrize("name", ["a.npy", "stored.npz", "deflated.npz"])
def test_array_files_read_back_whole_and_as_load_event_file_does(files, name):
    folder, events = files
    out = read_events(folder / name)
    np.testing.assert_array_equal(out, events)
    np.testing.assert_array_equal(out, load_event_file(folder / name))
    assert out.dtype == events.dtype


@pytest.mark.parametrize("name", ["a.npy", "stored.npz"])
def test_uncompressed_files_are_memory_mapped_not_loaded(files, name):
    folder, _ = files
    out = read_events(folder / name)
    assert isinstance(out, np.memmap) and not out.flags.writeable
    assert EventReader(folder / name).seekable
    assert not EventReader(folder / "deflated.npz").seekable


@pytest.mark.parametrize("name", ["a.npy", "stored.npz", "deflated.npz"])
def test_blocks_reads_and_time_ranges_from_any_position(files, name):
    folder, events = files
    reader = EventReader(folder / name, block_events=333)
    assert reader.num_events == len(events)
    offsets = [(offset, len(block)) for offset, block in reader.blocks(1000)]
    assert offsets[0][0] == 1000 and max(n for _, n in offsets) <= 333
    assert sum(n for _, n in offsets) == len(events) - 1000
    np.testing.assert_array_equal(reader.read(1234, 4321), events[1234:4321])
    for t in (0, events["t"][2500], events["t"][2500] + 1, 10**12):
        assert reader.seek_time(t) == np.searchsorted(events["t"], t)
    lo, hi = events["t"][700], events["t"][3900] + 5
    np.testing.assert_array_equal(reader.read_time(lo, hi),
                                  events[(events["t"] >= lo) & (events["t"] < hi)])
    assert reader.time_range() == (events["t"][0], events["t"][-1])


@pytest.mark.parametrize("name", ["a.npy", "stored.npz", "deflated.npz"])
def test_check_reads_every_event_and_gives_the_time_range(files, name):
    folder, events = files
    assert EventReader(folder / name, block_events=777).check() == (events["t"][0],
                                                                     events["t"][-1])


def test_check_finds_a_wrong_event_that_the_time_range_of_a_mapped_file_does_not_read(
        tmp_path):
    path = _write_bad(tmp_path, lambda e: e["t"].__setitem__(1998, 0))
    reader = EventReader(path)
    assert reader.time_range() is not None                 # two events read: nothing seen
    with pytest.raises(EventFileError, match="event 1998 has the timestamp 0 us") as info:
        reader.check()
    assert info.value.position == 1998
    np.save(tmp_path / "empty.npy", random_events(0))
    assert EventReader(tmp_path / "empty.npy").check() is None


def _write_bad(tmp_path, change, name="bad.npy"):
    events = random_events(2000)
    change(events)
    np.save(tmp_path / name, events)
    return tmp_path / name


@pytest.mark.parametrize("change, message, position", [
    (lambda e: e["t"].__setitem__(1500, e["t"][1499] - 1), "event 1500 has the timestamp", 1500),
    (lambda e: e["p"].__setitem__(77, 2), "event 77 has the polarity p = 2", 77),
])
def test_a_wrong_event_is_one_error_naming_the_file_and_its_index(tmp_path, change, message,
                                                                  position):
    path = _write_bad(tmp_path, change)
    with pytest.raises(EventFileError, match=re.escape(message)) as info:
        read_events(path)
    assert str(path) in str(info.value) and info.value.position == position
    assert len(str(info.value).split(". ")) == 1          # one sentence


def test_negative_timestamps_and_coordinates_outside_the_sensor_are_named(tmp_path):
    events = np.zeros(3, [("t", "<f8"), ("x", "<i4"), ("y", "<i4"), ("p", "<i1")])
    events["t"] = [-5.0, 1.0, 2.0]
    np.save(tmp_path / "neg.npy", events)
    with pytest.raises(EventFileError, match="event 0 has the negative timestamp"):
        read_events(tmp_path / "neg.npy")
    path = _write_bad(tmp_path, lambda e: e["x"].__setitem__(9, 24), "wide.npy")
    read_events(path)                                      # no sensor size: no upper bound
    with pytest.raises(EventFileError, match=r"event 9 has x = 24; expected .* \[0, 24\)"):
        read_events(path, sensor_size=(24, 16, 2))


def test_foreign_and_truncated_files_are_named(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(EventFileError, match="unknown event-file suffix '.txt'"):
        read_events(tmp_path / "notes.txt")
    np.save(tmp_path / "plain.npy", np.arange(5))
    with pytest.raises(EventFileError, match="expected a structured event array"):
        read_events(tmp_path / "plain.npy")
    data = (tmp_path / "ok.npy")
    np.save(data, random_events(100))
    (tmp_path / "cut.npy").write_bytes(data.read_bytes()[:-7])
    with pytest.raises(EventFileError, match=r"cut.npy: the file declares .* \(truncated"):
        read_events(tmp_path / "cut.npy")
    (tmp_path / "x.raw").write_text("% camera\nnonsense")
    with pytest.raises(EventFileError, match="names no 'evt 2.0' / 'evt 3.0' format"):
        read_events(tmp_path / "x.raw")
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        read_events(tmp_path / "missing.npy")


# ----------------------------------------------------------------- camera files (faery)
def test_damaged_camera_files_are_named(tmp_path):
    pytest.importorskip("faery")
    events = random_events(20000, seed=3)
    raw = write_events(tmp_path / "rec.raw", events, sensor_size=(24, 16), format="evt3")
    (tmp_path / "odd.raw").write_bytes(raw.read_bytes()[:-1])
    with pytest.raises(EventFileError, match="not a whole number of 2-byte words"):
        read_events(tmp_path / "odd.raw")
    aedat = write_events(tmp_path / "rec.aedat4", events, sensor_size=(24, 16))
    (tmp_path / "cut.aedat4").write_bytes(aedat.read_bytes()[:3000])
    with pytest.raises(EventFileError, match=r"cut.aedat4: .*(damaged|truncated)"):
        read_events(tmp_path / "cut.aedat4")
    with pytest.raises(EventFileError, match="is a 24 x 16 recording, but sensor_size gives"):
        read_events(aedat, sensor_size=(32, 32, 2))
