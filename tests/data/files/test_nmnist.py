"""nmnist: N-MNIST / N-Caltech101 ``.bin`` files read event for event as tonic's reader
reads them, overflow markers included, whole and block by block; wrong files named."""

import re

import numpy as np
import pytest

from braintrace_conv.data import CAMERA_EVENT_DTYPE, EventFileError, EventReader, read_events


def write_bin(path, x, y, p, t):
    """Records of 5 bytes, packed from the layout's description: x, y, then the polarity
    bit above 23 bits of timestamp, most significant byte first."""
    x, y, p, t = (np.asarray(a, np.int64) for a in (x, y, p, t))
    assert (0 <= t).all() and (t < 1 << 23).all() and (p <= 1).all()
    word = (p << 23) | t
    raw = np.stack([x, y, word >> 16, (word >> 8) & 0xFF, word & 0xFF], axis=1)
    path.write_bytes(raw.astype(np.uint8).tobytes())
    return path


def digit(n=4000, seed=0):
    """A recording shaped like N-MNIST's: 34 x 34 pixels over about 0.3 s."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 34, n), rng.integers(0, 34, n), rng.integers(0, 2, n),
            np.cumsum(rng.integers(0, 150, n)))


def tonic_reading(path):
    tonic_io = pytest.importorskip("tonic.io")
    dtype = np.dtype([("x", "<i8"), ("y", "<i8"), ("t", "<i8"), ("p", "<i8")])
    return tonic_io.read_mnist_file(str(path), dtype=dtype)


def assert_same(ours, theirs):
    assert ours.dtype == CAMERA_EVENT_DTYPE
    for field in ("t", "x", "y", "p"):
        np.testing.assert_array_equal(ours[field].astype(np.int64), theirs[field])


def test_a_recording_reads_as_tonic_reads_it_whole_and_in_blocks(tmp_path):
    x, y, p, t = digit()
    path = write_bin(tmp_path / "00002.bin", x, y, p, t)
    reader = EventReader(path, sensor_size=(34, 34, 2), block_events=333)
    assert reader.format == "nmnist" and reader.sensor_size == (34, 34)
    ours = read_events(path)
    np.testing.assert_array_equal(ours["t"], t)
    assert_same(ours, tonic_reading(path))
    np.testing.assert_array_equal(reader.read(1000, 3500), ours[1000:3500])
    assert reader.check() == (t[0], t[-1])


def test_overflow_markers_are_no_events_and_move_time_on_as_tonic_does(tmp_path):
    """A record with y = 240 marks an overflow: dropped, 2^13 us added to what follows
    (the rule of the datasets' authors' readers), across blocks."""
    x, y, p, t = (a.copy() for a in digit(600, seed=1))
    markers = [100, 101, 350]
    y[markers] = 240
    t[101:] -= 5000                       # the counter may restart lower after a marker
    t[350:] -= 3000
    assert (t >= 0).all() and (np.diff(t) < 0).sum() == 2
    path = write_bin(tmp_path / "late.bin", x, y, p, t)
    theirs = tonic_reading(path)
    for block in (7, 100, 1 << 16):
        blocks = [b for _, b in EventReader(path, block_events=block).blocks()]
        assert_same(np.concatenate(blocks), theirs)
    ours = read_events(path)
    assert len(ours) == 600 - len(markers) and (ours["y"] != 240).all()
    expected = t + np.cumsum(y == 240) * 8192
    np.testing.assert_array_equal(ours["t"], expected[y != 240])


def test_wrong_files_are_named(tmp_path):
    x, y, p, t = digit(10)
    path = write_bin(tmp_path / "cut.bin", x, y, p, t)
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(EventFileError, match=re.escape(
            f"{path}: holds 48 bytes, not a whole number of 5-byte N-MNIST events")):
        read_events(path)
    t = t.copy()
    t[6] = t[5] - 1
    back = write_bin(tmp_path / "back.bin", x, y, p, t)
    with pytest.raises(EventFileError, match="event 6 has the timestamp .* earlier than "
                                             "event 5's") as info:
        read_events(back)
    assert info.value.position == 6
    wide = write_bin(tmp_path / "wide.bin", [3, 40], [1, 2], [0, 1], [5, 9])
    with pytest.raises(EventFileError, match=r"event 1 has x = 40; expected an integer pixel "
                                             r"coordinate in \[0, 34\)"):
        read_events(wide, sensor_size=(34, 34, 2))
