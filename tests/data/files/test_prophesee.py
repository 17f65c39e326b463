"""prophesee: EVT 2.0 and 3.0 decoded event for event against a word-by-word reference,
across counter wraps, long silences and 2^32 us, written by our writer and by faery's
encoder, cross-checked with expelliarmus; every wrong file refused in one sentence."""

import re

import numpy as np
import pytest

from braintrace_conv.data import (
    CAMERA_EVENT_DTYPE,
    EventFileError,
    EventReader,
    read_events,
    write_events,
)
from braintrace_conv.data.files import prophesee

SENSOR = (24, 16)
EVT3_WRAP = 1 << 24            # microseconds; EVT 2.0's timestamps wrap at 2^34


# ----------------------------------------------------------------- the reference decoder
def reference_evt3(words):
    """EVT 3.0 word by word, as the format's page describes it (module docstring for the
    wrap rule and what is dropped): ``[(t, x, y, p), ...]``."""
    events, high, loops, time_high, low, y, base, polarity = [], None, 0, None, 0, None, None, 0
    for word in map(int, words):
        kind, value = word >> 12, word & 0xFFF
        if kind == 0x0:
            y = value & 0x7FF
        elif kind == 0x8:
            if high is not None and high - value >= 2048:
                loops += 1
            if value != high:
                low = 0
            high, time_high = value, (loops * 4096 + value) << 12
        elif kind == 0x6:
            low = value
        elif kind == 0x3:
            base, polarity = value & 0x7FF, value >> 11
        elif kind == 0x2 and time_high is not None and y is not None:
            events.append((time_high + low, value & 0x7FF, y, value >> 11))
        elif kind in (0x4, 0x5):
            width = 12 if kind == 0x4 else 8
            if time_high is not None and y is not None and base is not None:
                events += [(time_high + low, base + bit, y, polarity)
                           for bit in range(width) if value >> bit & 1]
            base = None if base is None else base + width
    return events


def reference_evt2(words):
    events, high, loops, time_high = [], None, 0, None
    for word in map(int, words):
        kind = word >> 28
        if kind == 0x8:
            value = word & 0x0FFFFFFF
            if high is not None and high - value >= 1 << 27:
                loops += 1
            high, time_high = value, (loops * (1 << 28) + value) << 6
        elif kind <= 1 and time_high is not None:
            events.append((time_high + (word >> 22 & 0x3F), word >> 11 & 0x7FF, word & 0x7FF,
                           kind))
    return events


def header(version):
    """Ended by ``% end``, as Metavision writes: random words after it may look like text."""
    return f"% evt {version[-1]}.0\n% geometry 2048x2048\n% end\n".encode()


def write_words(path, version, words):
    words = np.asarray(words, "<u4" if version == "evt2" else "<u2")
    path.write_bytes(header(version) + words.tobytes())
    return path


def decoded(path, version, block_words):
    header = prophesee.read_header(path)
    blocks = list(prophesee.decode(path, version, data_offset=header.data_offset,
                                   dtype=CAMERA_EVENT_DTYPE, block_words=block_words))
    return [tuple(map(int, e)) for block in blocks for e in block]


def random_evt3_words(rng, n, sparse=False):
    """Random EVT 3.0 words; ``sparse``: nearly all of them events, few state words."""
    p = [.02, .7, .02, .1, .1, .02, .02, .005, .005, .005, .005] if sparse else \
        [.15, .2, .1, .1, .1, .15, .1, .025, .025, .025, .025]
    kinds = rng.choice([0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0x8, 0xA, 0xE, 0x7, 0xF], n, p=p)
    words = (kinds << 12) | rng.integers(0, 4096, n)
    bases = kinds == 0x3                       # base columns low enough to stay below 2048
    words[bases] = (0x3 << 12) | (rng.integers(0, 2, bases.sum()) << 11) | \
        rng.integers(0, 200, bases.sum())
    return words


def random_evt2_words(rng, n, sparse=False):
    p = [.45, .45, .02, .04, .02, .02] if sparse else [.35, .35, .15, .05, .05, .05]
    kinds = rng.choice([0x0, 0x1, 0x8, 0xA, 0xE, 0xF], n, p=p)
    return (kinds.astype(np.int64) << 28) | rng.integers(0, 1 << 28, n)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense states", "sparse states"])
@pytest.mark.parametrize("seed", range(3))
def test_the_decoders_equal_the_word_by_word_reference_whatever_the_blocks(tmp_path, seed,
                                                                           sparse):
    """Random words: every word type in any order, counters jumping back and forth
    (wraps, and drops that are time going backwards), state words split across blocks,
    as many as the events or few (the decoder looks them up in two ways)."""
    rng = np.random.default_rng(seed)
    for trial in range(25):
        n = int(rng.integers(1, 400))
        block = int(rng.integers(1, 80))
        evt3 = write_words(tmp_path / "a.raw", "evt3", random_evt3_words(rng, n, sparse))
        expected = reference_evt3(np.fromfile(evt3, "<u2", offset=len(header("evt3"))))
        assert decoded(evt3, "evt3", block) == expected, (seed, trial)
        evt2 = write_words(tmp_path / "b.raw", "evt2", random_evt2_words(rng, n, sparse))
        assert decoded(evt2, "evt2", block) == reference_evt2(
            np.fromfile(evt2, "<u4", offset=len(header("evt2")))), (seed, trial)


def test_blocks_of_many_vectors_equal_the_word_by_word_reference(tmp_path):
    """Blocks with hundreds of vector words, whose events the decoder puts in place in one
    pass rather than run by run."""
    rng = np.random.default_rng(7)
    words = random_evt3_words(rng, 6000)
    assert ((words >> 12) - 4 <= 1).sum() > 1000
    path = write_words(tmp_path / "vectors.raw", "evt3", words)
    expected = reference_evt3(words)
    for block in (4096, 1000, 300):
        assert decoded(path, "evt3", block) == expected, block


# ----------------------------------------------------------------- long recordings
SHORT_GAPS = (1_000, 4_999, 5_000, 100_000, 1_000_000)           # silences, microseconds
LONG_GAPS = (8_400_000, 8_500_000, 16_000_000, 1 << 24, 20_000_000)


def recording_with_gaps(crossing=SHORT_GAPS, seconds=100, seed=0):
    """Bursts of events (with repeated timestamps and neighbouring pixels, so that EVT
    3.0 vectors are written) separated by silences: one of each length of ``crossing``
    across a wrap of EVT 3.0's counter in turn, and between them silences of 1 ms to 1 s
    within one cycle (EVT 2.0's wraps lie far beyond); about ``seconds`` long."""
    rng = np.random.default_rng(seed)
    wrap, parts, t = EVT3_WRAP, [], 2_000_000

    def burst(start):
        n = int(rng.integers(5, 40))
        part = np.zeros(n, CAMERA_EVENT_DTYPE)
        steps = rng.integers(0, 3, n)
        steps[0] = 0
        part["t"] = start + np.cumsum(steps)                       # at most 80 us long
        part["y"] = rng.integers(0, SENSOR[1], n)
        part["x"] = (rng.integers(0, 6) + np.arange(n)) % SENSOR[0]
        part["p"] = rng.integers(0, 2, n)
        parts.append(part)
        return int(part["t"][-1])

    for gap in (*crossing, None):
        last = seconds * 1_000_000 if gap is None else (t // wrap + 1) * wrap - gap // 2 - 100
        while True:                     # silences that stay before the next wrap
            end = burst(t)
            short = int(rng.choice(SHORT_GAPS))
            if end + short + 100 > last:
                break
            t = end + short
        if gap is not None:             # the last burst ends just before the wrap
            t = max(end + 1, last)
            t = burst(t) + gap
    return np.concatenate(parts)


def faery_write(path, events, version, zero_t0=False):
    """``events`` written by faery's encoder as ``version`` (evt2, evt3, dat2, ...)."""
    faery = pytest.importorskip("faery")
    out = np.zeros(len(events), faery.EVENTS_DTYPE)
    out["t"], out["x"], out["y"], out["on"] = events["t"], events["x"], events["y"], \
        events["p"] > 0
    faery.file_encoder.events_to_file(iter([out]), path, dimensions=SENSOR, version=version,
                                      zero_t0=zero_t0)
    return path


@pytest.mark.parametrize("crossing", [SHORT_GAPS, LONG_GAPS], ids=["1ms-1s", "8s-20s"])
@pytest.mark.parametrize("version", ["evt3", "evt2"])
@pytest.mark.parametrize("writer", ["write_events", "faery"])
def test_recordings_of_100_s_with_silences_across_wraps_read_back_event_exact(
        tmp_path, version, writer, crossing):
    pytest.importorskip("faery")
    events = recording_with_gaps(crossing)
    t = events["t"]
    across = np.diff(t)[t[1:] // EVT3_WRAP != t[:-1] // EVT3_WRAP]
    assert set(crossing) <= set(across) and t[-1] >= 90_000_000
    path = tmp_path / "rec.raw"
    if writer == "faery":
        faery_write(path, events, version)
    else:
        write_events(path, events, sensor_size=SENSOR, format=version)
    np.testing.assert_array_equal(read_events(path), events)
    reader = EventReader(path, block_events=97)
    assert reader.check() == (events["t"][0], events["t"][-1])
    np.testing.assert_array_equal(reader.read(1000, 1500), events[1000:1500])


@pytest.mark.parametrize("version", ["evt3", "evt2"])
def test_the_offset_faery_writes_in_the_header_is_added_as_faery_adds_it(tmp_path, version):
    """faery's encoder, asked to start a recording at 0, writes ``% T0`` and timestamps
    from it; its decoder adds it back (10 s: no EVT 3.0 wrap, which faery 0.7 may miss)."""
    faery = pytest.importorskip("faery")
    events = recording_with_gaps(crossing=(), seconds=10)
    out = np.zeros(len(events), faery.EVENTS_DTYPE)
    out["t"], out["x"], out["y"], out["on"] = events["t"], events["x"], events["y"], \
        events["p"] > 0
    path = tmp_path / "zeroed.raw"
    faery.file_encoder.events_to_file(iter([out]), path, dimensions=SENSOR, version=version,
                                      zero_t0=True)
    assert prophesee.read_header(path).t0 == events["t"][0]
    np.testing.assert_array_equal(read_events(path), events)
    theirs = np.concatenate(list(faery.file_decoder.Decoder(path)))
    np.testing.assert_array_equal(theirs["t"].astype(np.int64), events["t"])


@pytest.mark.parametrize("version", ["evt3", "evt2"])
def test_timestamps_past_2_to_the_32_and_the_wrap_of_34_bits(tmp_path, version):
    """Beyond 2^32 us after a silence of more than an hour (EVT 2.0: beyond its own wrap
    at 2^34 us as well)."""
    pytest.importorskip("faery")
    t = [10, 20, (1 << 32) + 5, (1 << 32) + 4096, (1 << 33) + 7]
    if version == "evt2":
        t += [(1 << 34) + 3, (1 << 34) + 64, (1 << 35) + 1]
    events = np.zeros(len(t), CAMERA_EVENT_DTYPE)
    events["t"], events["x"], events["y"], events["p"] = t, 3, 5, 1
    path = write_events(tmp_path / "late.raw", events, sensor_size=SENSOR, format=version)
    np.testing.assert_array_equal(read_events(path), events)


@pytest.mark.parametrize("version", ["evt3", "evt2"])
def test_an_independent_decoder_agrees(tmp_path, version):
    """expelliarmus (EVT 2.0: whole events; EVT 3.0: pixels, polarities and the 12 low
    bits of the timestamps. Its EVT 3.0 timestamps run ahead by 4096 us at every TIME_LOW
    lower than the one before, TIME_HIGH or not: a rule of its own, not the format's)."""
    expelliarmus = pytest.importorskip("expelliarmus")
    events = recording_with_gaps()
    path = write_events(tmp_path / "rec.raw", events, sensor_size=SENSOR, format=version)
    wizard = expelliarmus.Wizard(encoding=version)
    wizard.set_file(str(path))
    theirs = wizard.read()
    ours = read_events(path)
    for field in ("x", "y", "p"):
        np.testing.assert_array_equal(theirs[field].astype(np.int64),
                                      ours[field].astype(np.int64))
    if version == "evt2":
        np.testing.assert_array_equal(theirs["t"], ours["t"])
    else:
        ahead = theirs["t"].astype(np.int64) - ours["t"]
        assert (ahead % 4096 == 0).all() and (np.diff(ahead) >= 0).all()


# ----------------------------------------------------------------- refused
def th3(value):
    return 0x8000 | value


def event3(x, y, low, p=1):
    return [0x0000 | y, 0x6000 | low, 0x2000 | (p << 11) | x]


def test_evt3_time_going_backwards_is_the_event_named(tmp_path):
    """A TIME_LOW lower than the one before under the same TIME_HIGH, and a TIME_HIGH
    drop of less than half the counter's range, are time going backwards; a drop of half
    the range or more is a wrap."""
    words = [th3(100), *event3(1, 2, 50), *event3(2, 2, 40)]
    path = write_words(tmp_path / "low.raw", "evt3", words)
    with pytest.raises(EventFileError, match=r"low.raw: event 1 has the timestamp 409640 us, "
                                             r"earlier than event 0's 409650 us") as info:
        read_events(path)
    assert info.value.position == 1
    words = [th3(3000), *event3(1, 2, 0), th3(1000), *event3(2, 2, 0)]
    with pytest.raises(EventFileError, match="event 1 has the timestamp 4096000 us, earlier"):
        read_events(write_words(tmp_path / "high.raw", "evt3", words))
    words = [th3(3000), *event3(1, 2, 0), th3(951), *event3(2, 2, 0)]   # 8.4 s later
    out = read_events(write_words(tmp_path / "wrap.raw", "evt3", words))
    assert list(out["t"]) == [3000 << 12, (4096 + 951) << 12]


def test_a_silence_of_more_than_half_a_cycle_across_a_wrap_without_time_high_is_refused(
        tmp_path):
    """The file cannot say how long such a silence was (module docstring): 10 s across
    the wrap at 2^24 us with no TIME_HIGH between reads as 6.8 s backwards."""
    t0, t1 = (1 << 24) - 2_000_000, (1 << 24) + 8_000_000
    words = [th3(t0 >> 12), *event3(1, 2, t0 & 0xFFF), th3((t1 >> 12) & 0xFFF),
             *event3(2, 2, t1 & 0xFFF)]
    with pytest.raises(EventFileError, match="event 1 has the timestamp .* earlier than "
                                             "event 0's"):
        read_events(write_words(tmp_path / "silent.raw", "evt3", words))


def test_evt2_time_going_backwards_is_the_event_named(tmp_path):
    """faery 0.7.1 gives such an event the timestamp of the one before it."""
    pytest.importorskip("faery")
    events = recording_with_gaps(seconds=30)
    path = write_events(tmp_path / "rec.raw", events, sensor_size=SENSOR, format="evt2")
    words = np.fromfile(path, "<u4", offset=prophesee.read_header(path).data_offset)
    # event 40 goes 5 ms back: a TIME_HIGH put before it and its 6 low bits rewritten
    at = np.flatnonzero(words >> 28 <= 1)[40]
    t = int(events["t"][39]) - 5_000
    moved = int(words[at]) & ~(0x3F << 22) | (t & 0x3F) << 22
    words = np.concatenate([words[:at], [0x8 << 28 | t >> 6, moved], words[at + 1:]])
    write_words(tmp_path / "back.raw", "evt2", words)
    with pytest.raises(EventFileError, match=rf"back.raw: event 40 has the timestamp {t} us, "
                                             r"earlier than event 39's") as info:
        read_events(tmp_path / "back.raw")
    assert info.value.position == 40


@pytest.mark.parametrize("version, words, word, message", [
    ("evt3", [th3(1), 0x9123], 1, "holds a word of type 0x9, which EVT 3.0 does not define"),
    ("evt3", [th3(1), 0x0005, 0x3000 | 2040, 0x4FFF], 3,
     "puts an event at column 2051, beyond EVT 3.0's 2048"),
    ("evt2", [0x8 << 28, 0x5 << 28], 1, "holds a word of type 0x5, which EVT 2.0 does not "
                                        "define"),
])
def test_words_that_are_not_evt_data_are_named_by_their_byte(tmp_path, version, words, word,
                                                             message):
    path = write_words(tmp_path / "bad.raw", version, words)
    byte = len(header(version)) + word * prophesee.WORD_BYTES[version]
    with pytest.raises(EventFileError, match=re.escape(f"{path}: byte {byte} {message}")) as info:
        read_events(path)
    assert len(str(info.value).split(". ")) == 1


def test_truncated_files_and_events_outside_the_sensor_are_named(tmp_path):
    path = write_words(tmp_path / "cut.raw", "evt2", [0x8 << 28, 0x1 << 28 | 3 << 11 | 4])
    (tmp_path / "cut.raw").write_bytes(path.read_bytes()[:-1])
    with pytest.raises(EventFileError, match=r"cut.raw: its EVT2 data holds 7 bytes, not a "
                                             r"whole number of 4-byte words"):
        read_events(tmp_path / "cut.raw")
    wide = tmp_path / "wide.raw"
    wide.write_bytes(b"% evt 3.0\n% geometry 24x16\n" +
                     np.array([th3(1), *event3(30, 2, 5)], "<u2").tobytes())
    with pytest.raises(EventFileError, match=r"wide.raw: event 0 has x = 30; expected an "
                                             r"integer pixel coordinate in \[0, 24\)"):
        read_events(wide)


def test_pixel_words_before_their_time_and_row_are_dropped(tmp_path):
    """A recording cut from a camera's stream may start mid-state."""
    words = [0x2000 | 7, 0x0004, 0x2000 | 8, th3(2), 0x6000 | 9, 0x2000 | 10,
             0x4000 | 0b11, 0x3000 | 20, 0x5000 | 0b101]
    out = read_events(write_words(tmp_path / "start.raw", "evt3", words))
    expected = [((2 << 12) + 9, 10, 4, 0), ((2 << 12) + 9, 20, 4, 0), ((2 << 12) + 9, 22, 4, 0)]
    assert [tuple(map(int, e)) for e in out] == expected
    out = read_events(write_words(tmp_path / "start2.raw", "evt2",
                                  [0x1 << 28 | 1, 0x8 << 28 | 3, 0x1 << 28 | 5 << 22 | 2]))
    assert [tuple(map(int, e)) for e in out] == [((3 << 6) + 5, 0, 2, 1)]


def test_the_header_ends_where_the_text_does(tmp_path):
    """A first word whose low byte is ``%`` (faery writes such files) is data."""
    pytest.importorskip("faery")
    events = np.zeros(2, CAMERA_EVENT_DTYPE)
    events["t"], events["x"], events["y"] = [0x25 << 12, (0x25 << 12) + 10], 3, 5
    path = faery_write(tmp_path / "pct.raw", events, "evt3")
    found = prophesee.read_header(path)
    assert found.version == "evt3" and found.geometry == SENSOR
    assert path.read_bytes()[found.data_offset:found.data_offset + 1] == b"%"
    np.testing.assert_array_equal(read_events(path), events)
    # after "% end" even words that read as a text line are data
    textlike = write_words(tmp_path / "text.raw", "evt3", np.frombuffer(b"%ab\n", "<u2"))
    assert prophesee.read_header(textlike).data_offset == len(header("evt3"))


@pytest.mark.slow
@pytest.mark.parametrize("version", ["evt3", "evt2"])
def test_a_million_events_with_every_silence_across_a_wrap_read_back_exact(tmp_path, version):
    pytest.importorskip("faery")
    events = recording_with_gaps(SHORT_GAPS + LONG_GAPS, seconds=100)
    rng = np.random.default_rng(1)
    dense = np.zeros(1_000_000, CAMERA_EVENT_DTYPE)
    dense["t"] = events["t"][-1] + 1 + np.cumsum(rng.integers(0, 3, len(dense)))
    dense["x"], dense["y"] = rng.integers(0, SENSOR[0], len(dense)), \
        rng.integers(0, SENSOR[1], len(dense))
    dense["p"] = rng.integers(0, 2, len(dense))
    events = np.concatenate([events, dense])
    for writer in ("write_events", "faery"):
        path = tmp_path / f"{writer}.raw"
        if writer == "faery":
            faery_write(path, events, version)
        else:
            write_events(path, events, sensor_size=SENSOR, format=version)
        np.testing.assert_array_equal(read_events(path), events)


# ----------------------------------------------------------------- DAT
def dat_recording(n=3000, seed=0, size=SENSOR):
    """Events across two wraps of DAT's 32-bit timestamps, each in a silence of 2^31 - 1
    us (36 min, the longest a wrap can be told from)."""
    rng = np.random.default_rng(seed)
    events = np.zeros(n, CAMERA_EVENT_DTYPE)
    steps = rng.integers(0, 50, n)
    steps[n // 3] = steps[2 * n // 3] = steps[5 * n // 6] = (1 << 31) - 1
    events["t"] = (1 << 32) - 30_000 + np.cumsum(steps)
    t = events["t"]
    wraps = (t[1:] >> 32) != (t[:-1] >> 32)
    assert wraps.sum() == 2 and (np.diff(t)[wraps] == (1 << 31) - 1).all()
    events["x"], events["y"] = rng.integers(0, size[0], n), rng.integers(0, size[1], n)
    events["p"] = rng.integers(0, 2, n)
    return events


def dat_file(path, words, *, lines=("Version 2", "Width 24", "Height 16"), kind=b"\x0c\x08"):
    """A DAT file of ``words`` (``(t, data)`` pairs), written byte by byte."""
    text = "".join(f"% {line}\n" for line in lines).encode()
    path.write_bytes(text + kind + np.asarray(words, "<u4").tobytes())
    return path


@pytest.mark.parametrize("zero_t0", [False, True], ids=["t0 0", "t0 in the header"])
@pytest.mark.parametrize("version", ["dat2", "dat1"])
def test_dat_files_written_by_faery_read_back_event_exact_as_faery_reads_them(
        tmp_path, version, zero_t0):
    """Across wraps of the 32-bit timestamps, whole and in blocks, with faery's reading
    (which adds the header's ``% T0``) as the independent one."""
    faery = pytest.importorskip("faery")
    events = dat_recording()
    path = faery_write(tmp_path / "rec.dat", events, version, zero_t0)
    reader = EventReader(path, block_events=101)
    assert (reader.format, reader.sensor_size, reader.num_events) == ("dat", SENSOR, len(events))
    np.testing.assert_array_equal(read_events(path), events)
    np.testing.assert_array_equal(reader.read(999, 2100), events[999:2100])
    theirs = np.concatenate(list(faery.file_decoder.Decoder(path)))
    for ours, field in (("t", "t"), ("x", "x"), ("y", "y"), ("p", "on")):
        np.testing.assert_array_equal(events[ours].astype(np.int64),
                                      theirs[field].astype(np.int64))


def test_dat_files_equal_expelliarmus_reading(tmp_path):
    expelliarmus = pytest.importorskip("expelliarmus")
    events = dat_recording(seed=1)
    path = faery_write(tmp_path / "rec.dat", events, "dat2")
    wizard = expelliarmus.Wizard(encoding="dat")
    wizard.set_file(str(path))
    theirs = wizard.read()
    ours = read_events(path)
    for field in ("t", "x", "y", "p"):
        np.testing.assert_array_equal(theirs[field].astype(np.int64),
                                      ours[field].astype(np.int64))


def test_dat_layouts_of_both_versions_bit_by_bit(tmp_path):
    """Version 2: x and y in 14 bits, the polarity in the top 4; version 1 (older ATIS
    files): x in 9 bits, y in 8, the polarity in the 4 after them; no version line:
    version 2."""
    v2 = (1 << 28) | (13 << 14) | 21
    out = read_events(dat_file(tmp_path / "v2.dat", [7, v2, 9, (15 << 14) | 3]))
    assert [tuple(map(int, e)) for e in out] == [(7, 21, 13, 1), (9, 3, 15, 0)]
    out = read_events(dat_file(tmp_path / "none.dat", [7, v2], lines=("Width 24", "Height 16")))
    assert [tuple(map(int, e)) for e in out] == [(7, 21, 13, 1)]
    v1 = (1 << 17) | (13 << 9) | 21
    out = read_events(dat_file(tmp_path / "v1.dat", [5, v1], lines=("Version 1",),
                               kind=b"\x00\x08"))
    assert [tuple(map(int, e)) for e in out] == [(5, 21, 13, 1)]


@pytest.mark.parametrize("words, message, position", [
    ([10, 1, 9, 1], "event 1 has the timestamp 9 us, earlier than event 0's 10 us", 1),
    ([10, 1, 11, 2 << 28], "event 1 has the polarity p = 2", 1),
    ([10, 1, 11, 30], r"event 1 has x = 30; expected an integer pixel coordinate in \[0, 24\)",
     1),
])
def test_wrong_dat_events_are_named(tmp_path, words, message, position):
    """faery 0.7 gives an event that goes back in time the timestamp before it."""
    with pytest.raises(EventFileError, match=message) as info:
        read_events(dat_file(tmp_path / "bad.dat", words))
    assert info.value.position == position


@pytest.mark.parametrize("kind, lines, cut, message", [
    (b"\x0e\x08", ("Version 2",), 0, "holds external trigger events (DAT event type 0x0e), "
                                     "not pixel events"),
    (b"\x07\x08", ("Version 2",), 0, "has the DAT event type 0x07; expected 0x00 (Event2d) "
                                     "or 0x0c (CD)"),
    (b"\x0c\x10", ("Version 2",), 0, "declares DAT events of 16 bytes; expected 8"),
    (b"\x0c\x08", ("Version 3",), 0, "is a DAT file of version 3; expected version 1 or 2"),
    (b"\x0c\x08", ("Version 2",), 3, "its DAT events fill 13 bytes, not a whole number of "
                                     "8-byte events (a truncated file?)"),
    (b"", ("Version 2",), 0, "ends inside its DAT header: the event type and size bytes"),
])
def test_foreign_and_truncated_dat_files_are_named(tmp_path, kind, lines, cut, message):
    path = dat_file(tmp_path / "bad.dat", [1, 2, 3, 4], lines=lines, kind=kind)
    if cut:
        path.write_bytes(path.read_bytes()[:-cut])
    elif not kind:
        path.write_bytes(b"% Version 2\n")
    with pytest.raises(EventFileError, match=re.escape(f"{path}: {message}")) as info:
        read_events(path)
    assert len(str(info.value).split(". ")) == 1


# ----------------------------------------------------------------- real recordings
@pytest.fixture(scope="module")
def camera_files():
    from camera_files import fetch
    return fetch()


@pytest.mark.camera_files
@pytest.mark.parametrize("name, fmt, size", [("gen4.dat", "dat", (1280, 720)),
                                             ("evt3.raw", "evt3", (1280, 720)),
                                             ("evt2.raw", "evt2", None)])
def test_real_recordings_equal_faery_reading(camera_files, name, fmt, size):
    """A Gen4 DAT file, an EVK4 EVT 3.0 file (10.8 s: no silence across a wrap, which
    faery reads right) and a Gen3 EVT 2.0 file (its header gives no size), event for
    event, whole and in blocks."""
    faery = pytest.importorskip("faery")
    path = camera_files / name
    reader = EventReader(path, block_events=50_000)
    assert (reader.format, reader.sensor_size) == (fmt, size)
    ours = read_events(path)
    theirs = np.concatenate(list(faery.file_decoder.Decoder(path)))
    assert len(ours) == len(theirs) > 100_000
    for mine, field in (("t", "t"), ("x", "x"), ("y", "y"), ("p", "on")):
        np.testing.assert_array_equal(ours[mine].astype(np.int64),
                                      theirs[field].astype(np.int64))
    np.testing.assert_array_equal(reader.read(len(ours) // 2, len(ours) // 2 + 70_000),
                                  ours[len(ours) // 2:len(ours) // 2 + 70_000])
