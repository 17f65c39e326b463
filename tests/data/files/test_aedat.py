"""aedat: AEDAT 3.1 (DVS Gesture's files) and AEDAT 2.0 (jAER) read event for event, with
tonic's readers as the independent ones, timestamp overflows and wraps included, whole and
block by block; AEDAT 4.0's damaged headers caught before faery reads them; the version
taken from the first line; wrong files named."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from braintrace_conv.data import (
    EventFileError,
    EventReader,
    read_events,
    write_events,
)
from random_events import random_events


def recording(n, size, seed=0, start_us=1_000_000):
    return random_events(n, size, seed, start_us=start_us, max_step_us=30)


# ----------------------------------------------------------------- AEDAT 3.1
AEDAT3_HEADER = (b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n"
                 b"#Start-Time: 2017-03-03 10:06:43 (TZ-0600)\r\n#!END-HEADER\r\n")


def packet(kind, words, overflow=0, event_bytes=8, ts_at=4):
    """One packet: the 28-byte header (type, source, size, timestamp offset, overflow,
    capacity, number, valid) and its events, from the format's description."""
    words = np.asarray(words, "<u4")
    number = len(words) * 4 // event_bytes
    head = np.array([kind | (1 << 16), event_bytes, ts_at, overflow, number, number, number],
                    "<i4")
    return head.tobytes() + words.tobytes()


def polarity_words(events, valid=None):
    """Data words (valid bit, polarity, y, x) and 31-bit timestamps, interleaved."""
    valid = np.ones(len(events), np.int64) if valid is None else valid
    data = (events["x"].astype(np.int64) << 17) | (events["y"].astype(np.int64) << 2) | \
        (events["p"].astype(np.int64) << 1) | valid
    words = np.empty(2 * len(events), np.int64)
    words[0::2], words[1::2] = data, events["t"] & 0x7FFFFFFF
    return words


def write_aedat3(path, events, per_packet=700, extras=True):
    """Polarity packets of ``per_packet`` events, each with its timestamps' overflow count;
    ``extras``: a special-event packet and an invalid event between them, to be skipped."""
    body = b""
    for i in range(0, len(events), per_packet):
        part = events[i:i + per_packet]
        overflows = part["t"] >> 31
        assert (overflows == overflows[0]).all()
        body += packet(1, polarity_words(part), overflow=int(overflows[0]))
        if extras:
            body += packet(0, [7 << 1 | 1, 12345, 3 << 1 | 1, 12346])      # special events
            stray = part[-1:].copy()
            stray["x"] = 0
            body += packet(1, polarity_words(stray, valid=np.zeros(1, np.int64)),
                           overflow=int(overflows[0]))
    path.write_bytes(AEDAT3_HEADER + body)
    return path


def tonic_addresses(path):
    """tonic's reading of an AEDAT file's records: ``(address, timestamp)``."""
    tonic_io = pytest.importorskip("tonic.io")
    version, start, _ = tonic_io.read_aedat_header_from_file(str(path))
    records = tonic_io.get_aer_events_from_file(str(path), version, start)
    return records["address"].astype(np.int64), records["timeStamp"].astype(np.int64)


def test_aedat3_reads_as_tonic_reads_dvs_gesture_files(tmp_path):
    """Polarity packets only (tonic reads every packet as polarity events), with cAER's
    layout applied to tonic's addresses: x bits 17-31, y bits 2-16, polarity bit 1."""
    events = recording(5000, (128, 128))
    path = write_aedat3(tmp_path / "user01_fluorescent.aedat", events, extras=False)
    reader = EventReader(path, block_events=333)
    assert (reader.format, reader.sensor_size) == ("aedat3", (128, 128))
    ours = read_events(path)
    np.testing.assert_array_equal(ours, events)
    address, stamp = tonic_addresses(path)
    np.testing.assert_array_equal(ours["t"], stamp)
    np.testing.assert_array_equal(ours["x"], address >> 17 & 0x7FFF)
    np.testing.assert_array_equal(ours["y"], address >> 2 & 0x7FFF)
    np.testing.assert_array_equal(ours["p"], address >> 1 & 1)
    np.testing.assert_array_equal(reader.read(1234, 4321), events[1234:4321])
    assert reader.check() == (events["t"][0], events["t"][-1])


def test_aedat3_timestamps_count_the_packets_overflows_and_skip_what_is_no_event(tmp_path):
    """64-bit timestamps from each packet's overflow count (2^31 us each), past 2^32 us;
    special-event packets and invalid events are not events."""
    events = recording(3000, (128, 128), start_us=(1 << 31) - 20_000)
    events["t"][1500:] += 3 << 31                  # a silence of hours: the count says it
    path = tmp_path / "late.aedat"
    parts = [events[(events["t"] >> 31) == k] for k in np.unique(events["t"] >> 31)]
    body = b"".join(write_aedat3(tmp_path / f"{i}.aedat", part).read_bytes()[len(AEDAT3_HEADER):]
                    for i, part in enumerate(parts))
    path.write_bytes(AEDAT3_HEADER + body)
    assert len(parts) == 3 and events["t"][-1] > 1 << 32
    for block in (50, 1 << 16):
        blocks = [b for _, b in EventReader(path, block_events=block).blocks()]
        np.testing.assert_array_equal(np.concatenate(blocks), events)


@pytest.mark.parametrize("cut, message", [
    (10, "its last packet header, at byte {at}, is cut short: 10 of its 28 bytes are there"),
    (40, "its packet at byte {at} is cut short: it declares 5600 bytes of events, 12 are "
         "there (a truncated file?)"),
])
def test_truncated_aedat3_files_are_named_by_byte(tmp_path, cut, message):
    events = recording(1400, (128, 128))
    data = write_aedat3(tmp_path / "whole.aedat", events, extras=False).read_bytes()
    at = len(AEDAT3_HEADER) + 28 + 700 * 8
    path = tmp_path / "cut.aedat"
    path.write_bytes(data[:at + cut])
    with pytest.raises(EventFileError, match=re.escape(f"{path}: " + message.format(at=at))):
        read_events(path)


def test_wrong_aedat3_files_and_events_are_named(tmp_path):
    events = recording(100, (128, 128))
    events["t"][60] = events["t"][59] - 1
    path = write_aedat3(tmp_path / "back.aedat", events, extras=False)
    with pytest.raises(EventFileError, match="event 60 has the timestamp .* earlier than "
                                             "event 59's") as info:
        read_events(path)
    assert info.value.position == 60
    odd = tmp_path / "odd.aedat"
    odd.write_bytes(AEDAT3_HEADER + packet(1, [1, 2, 3], event_bytes=12))
    with pytest.raises(EventFileError, match=re.escape(
            f"byte {len(AEDAT3_HEADER)} holds a polarity packet of 12-byte events with their "
            "timestamps at byte 4; expected 8 and 4")):
        read_events(odd)
    open_header = tmp_path / "open.aedat"
    open_header.write_bytes(AEDAT3_HEADER.replace(b"#!END-HEADER\r\n", b""))
    with pytest.raises(EventFileError, match="header has no '#!END-HEADER' line"):
        read_events(open_header)


# ----------------------------------------------------------------- AEDAT 2.0
def aedat2_header(chip):
    lines = ["#!AER-DAT2.0", "# This is a raw AE data file - do not edit",
             "# Data format is int32 address, int32 timestamp (8 bytes total), repeated for "
             "each event", "# Timestamps tick is 1 us"]
    lines += [f"# AEChip: {chip}"] if chip else []
    return ("\r\n".join(lines + ["# End Of ASCII Header"]) + "\r\n").encode()


def write_aedat2(path, chip, address, stamp):
    records = np.empty(2 * len(address), ">u4")
    records[0::2], records[1::2] = address, np.asarray(stamp) & 0xFFFFFFFF
    path.write_bytes(aedat2_header(chip) + records.tobytes())
    return path


def davis_address(events, size):
    """jAER's DAVIS layout: row (from the bottom) bits 22-30, column (from the right) bits
    12-21, polarity bit 11."""
    row = size[1] - 1 - events["y"].astype(np.int64)
    column = size[0] - 1 - events["x"].astype(np.int64)
    return (row << 22) | (column << 12) | (events["p"].astype(np.int64) << 11)


def dvs128_address(events):
    """jAER's DVS128 layout: row (from the bottom) bits 8-14, column (from the right) bits
    1-7, bit 0 set for OFF."""
    row, column = 127 - events["y"].astype(np.int64), 127 - events["x"].astype(np.int64)
    return (row << 8) | (column << 1) | (1 - events["p"].astype(np.int64))


def test_aedat2_davis346_reads_as_tonic_reads_it(tmp_path):
    """tonic's DAVIS346 reader is independent of ours from the bytes to the pixels."""
    tonic_io = pytest.importorskip("tonic.io")
    events = recording(4000, (346, 260))
    path = write_aedat2(tmp_path / "davis.aedat", "eu.seebetter.ini.chips.davis.Davis346B",
                        davis_address(events, (346, 260)), events["t"])
    reader = EventReader(path, block_events=300)
    assert (reader.format, reader.sensor_size) == ("aedat2", (346, 260))
    ours = read_events(path)
    np.testing.assert_array_equal(ours, events)
    _, _, theirs = tonic_io.read_davis_346(str(path))
    for field in ("t", "x", "y", "p"):
        np.testing.assert_array_equal(ours[field].astype(np.int64),
                                      theirs[field].astype(np.int64))
    np.testing.assert_array_equal(reader.read(999, 3001), events[999:3001])


@pytest.mark.parametrize("chip", ["ch.unizh.ini.jaer.chip.retina.DVS128", "Tmpdiff128",
                                  "eu.seebetter.ini.chips.davis.DAVIS240C"])
def test_aedat2_cameras_and_what_is_no_pixel_event(tmp_path, chip):
    """Special events (DVS128: bit 15 or 31; DAVIS: APS and IMU samples, bit 31, and
    external input events, bit 10) are skipped; the records are those tonic reads."""
    size = (128, 128) if "128" in chip else (240, 180)
    events = recording(3000, size, seed=2)
    address = dvs128_address(events) if size == (128, 128) else davis_address(events, size)
    special = [1 << 15, 1 << 31] if size == (128, 128) else [1 << 31 | 5, 1 << 10]
    at = np.arange(100, 3000, 250)
    address = np.insert(address, at, np.resize(special, len(at)))
    stamp = np.insert(events["t"], at, events["t"][at])
    path = write_aedat2(tmp_path / "rec.aedat", chip, address, stamp)
    theirs_address, theirs_stamp = tonic_addresses(path)
    np.testing.assert_array_equal(theirs_address, address)
    np.testing.assert_array_equal(theirs_stamp, stamp)
    for block in (64, 1 << 16):
        blocks = [b for _, b in EventReader(path, block_events=block).blocks()]
        np.testing.assert_array_equal(np.concatenate(blocks), events)


def test_aedat2_timestamps_wrap_after_silences_up_to_half_the_counter(tmp_path):
    """32-bit timestamps: a drop of 2^31 us or more is a wrap (2^32 us), a smaller one
    time going backwards."""
    events = recording(1000, (128, 128), start_us=(1 << 32) - 5_000)
    events["t"][500:] += (1 << 31) - 1
    assert (events["t"][-1] >> 32) == 1
    path = write_aedat2(tmp_path / "wrap.aedat", "DVS128", dvs128_address(events),
                        events["t"])
    np.testing.assert_array_equal(read_events(path), events)
    stamp = events["t"].copy()
    stamp[700] = stamp[699] - 10
    back = write_aedat2(tmp_path / "back.aedat", "DVS128", dvs128_address(events), stamp)
    with pytest.raises(EventFileError, match="event 700 has the timestamp .* earlier"):
        read_events(back)


@pytest.mark.parametrize("chip, address, message", [
    (None, 0, "is an AEDAT 2.0 file that names no camera (no '# AEChip:' header line), so "
              "what its addresses hold is not known"),
    ("DVS640", 0, "is an AEDAT 2.0 file of the camera 'DVS640', whose addresses are not "
                  "read here (known: DVS128, Tmpdiff128, DAVIS240, DAVIS346)"),
    ("Davis346red", 400 << 12, "byte {at} holds an event at column address 400, beyond the "
                               "Davis346red's 346 (a damaged file, or another camera's)"),
])
def test_aedat2_files_whose_addresses_cannot_be_read_are_named(tmp_path, chip, address,
                                                                message):
    path = write_aedat2(tmp_path / "bad.aedat", chip, [0, address], [5, 6])
    at = len(aedat2_header(chip)) + 8
    with pytest.raises(EventFileError, match=re.escape(f"{path}: {message.format(at=at)}")):
        read_events(path)


def test_truncated_aedat2_files_are_named(tmp_path):
    path = write_aedat2(tmp_path / "cut.aedat", "DVS128", [0, 2, 4], [5, 6, 7])
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(EventFileError, match=re.escape(
            f"{path}: its AEDAT 2.0 events fill 21 bytes, not a whole number of 8-byte events")):
        read_events(path)


# ----------------------------------------------------------------- AEDAT 4.0 (faery)
@pytest.fixture(scope="module")
def aedat4(tmp_path_factory):
    pytest.importorskip("faery")
    path = tmp_path_factory.mktemp("aedat4") / "rec.aedat4"
    return write_events(path, recording(20000, (24, 16), seed=3), sensor_size=(24, 16)).read_bytes()


def _damaged(tmp_path, data: bytes, name="damaged.aedat4"):
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def _one_ascii_sentence(err, path):
    message = str(err)
    assert message.startswith(f"{path}: ") and message.isascii() and message.isprintable()
    assert len(message.split(". ")) == 1


def test_an_aedat4_header_that_is_not_utf8_is_named_not_a_crash(aedat4, tmp_path):
    """faery 0.7.1 aborts the whole process on such a header: the check before it runs,
    here in a child process so that a regression cannot take the test run down."""
    at = aedat4.index(b"<node name=\"0\"")
    path = _damaged(tmp_path, aedat4[:at] + b"\x9c" + aedat4[at + 1:])
    code = ("from braintrace_conv.data import read_events, EventFileError\n"
            f"try:\n    read_events({str(path)!r})\n"
            "except EventFileError as err:\n    print(err)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "RUST_BACKTRACE": "0"}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.fullmatch(rf"{re.escape(str(path))}: has a damaged AEDAT4 header: its "
                        r"description is not UTF-8 XML \(.*\)\n", run.stdout)


def test_aedat4_errors_relayed_from_faery_are_one_ascii_sentence(aedat4, tmp_path):
    at = aedat4.index(b'type="string">LZ4')
    renamed = _damaged(tmp_path, aedat4[:at] + 'type="strïg">LZ4'.encode() +
                       aedat4[at + len(b'type="string">LZ4'):])
    with pytest.raises(EventFileError, match=r'unsupported type "str\\xefg"') as info:
        read_events(renamed)
    _one_ascii_sentence(info.value, renamed)
    middle = len(aedat4) // 2
    scrambled = _damaged(tmp_path, aedat4[:middle] + bytes(64) + aedat4[middle + 64:],
                         "scrambled.aedat4")
    with pytest.raises(EventFileError, match=r"cannot be decoded after event \d+, the file "
                                             r"is damaged or truncated \(RuntimeError: LZ4"):
        read_events(scrambled)
    cut = _damaged(tmp_path, aedat4[:middle], "cut.aedat4")
    with pytest.raises(EventFileError, match=r"is truncated: its AEDAT4 index starts at byte "
                                             rf"\d+, beyond its {middle} bytes") as info:
        read_events(cut)
    _one_ascii_sentence(info.value, cut)
    for name, data, message in [
            ("head.aedat4", aedat4[:40], "truncated inside its AEDAT4 header"),
            ("other.aedat4", b"#!AER-DAT2.0\r\n", "is not an AEDAT4 file")]:
        with pytest.raises(EventFileError, match=message):
            read_events(_damaged(tmp_path, data, name))


# ----------------------------------------------------------------- which version
def test_the_first_line_says_the_version(tmp_path):
    """A .aedat file may hold any version; AEDAT 4.0 under that name is read by faery."""
    faery = pytest.importorskip("faery")
    events = recording(2000, (24, 16))
    out = np.zeros(len(events), faery.EVENTS_DTYPE)
    out["t"], out["x"], out["y"], out["on"] = events["t"], events["x"], events["y"], \
        events["p"] > 0
    path = tmp_path / "dv.aedat"
    faery.file_encoder.events_to_file(iter([out]), tmp_path / "dv.aedat4", dimensions=(24, 16))
    (tmp_path / "dv.aedat4").rename(path)
    reader = EventReader(path)
    assert (reader.format, reader.sensor_size) == ("aedat4", (24, 16))
    np.testing.assert_array_equal(read_events(path), events)
    for first in (b"#!AER-DAT3.0\r\n", b"\x00\x01garbage\n"):
        (tmp_path / "other.aedat").write_bytes(first + b"#!END-HEADER\r\n")
        shown = first.rstrip(b"\r\n").decode("ascii", "backslashreplace")
        with pytest.raises(EventFileError, match=re.escape(
                f"is not an AEDAT 2.0, 3.1 or 4.0 file: its first line is {shown!r}")):
            read_events(tmp_path / "other.aedat")


def test_a_dvs_gesture_file_and_its_labels_stream_as_the_same_events_do(tmp_path):
    """EventStream reads an AEDAT 3.1 recording beside its segments CSV, as DVS Gesture
    ships them, chunk for chunk as the same events saved as .npy."""
    from braintrace_conv.data import EventStream, Recording
    events = recording(6000, (128, 128))
    labels = tmp_path / "user01_fluorescent_labels.csv"
    t0, t1 = int(events["t"][0]), int(events["t"][-1])
    labels.write_text(f"class,startTime_usec,endTime_usec\n3,{t0},{(t0 + t1) // 2}\n"
                      f"5,{(t0 + t1) // 2},{t1 + 1}\n")
    aedat = write_aedat3(tmp_path / "user01_fluorescent.aedat", events)
    np.save(tmp_path / "same.npy", events)
    streams = [EventStream([Recording(path, labels)], sensor_size=(128, 128, 2), dt_us=1000,
                           chunk_steps=16, num_classes=11, block_events=500)
               for path in (aedat, tmp_path / "same.npy")]
    chunks = [list(stream) for stream in streams]
    assert len(chunks[0]) == len(chunks[1]) > 3
    for (frames, (targets, weights)), (frames_npy, (targets_npy, weights_npy)) in zip(*chunks):
        np.testing.assert_array_equal(frames, frames_npy)
        np.testing.assert_array_equal(targets, targets_npy)
        np.testing.assert_array_equal(weights, weights_npy)
    assert {2, 4} <= set(np.concatenate([t.ravel() for _, (t, _) in chunks[0]]).tolist())


@pytest.mark.camera_files
def test_a_real_davis346_recording_reads_whole_and_in_blocks():
    """The DAVIS346 recording of faery's sources: as many events as its index declares,
    in time order, the same whole and in blocks."""
    pytest.importorskip("faery")
    from camera_files import fetch
    path = fetch() / "davis346.aedat4"
    reader = EventReader(path, block_events=10_000)
    assert (reader.format, reader.sensor_size) == ("aedat4", (346, 260))
    events = read_events(path)
    assert len(events) == reader.num_events > 50_000
    np.testing.assert_array_equal(reader.read(30_000, 70_000), events[30_000:70_000])
