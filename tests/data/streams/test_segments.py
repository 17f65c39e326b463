"""Segment files: DVS Gesture's CSV and our own read alike; every wrong row is one error
naming the file and its line."""

import re

import numpy as np
import pytest

from braintrace_conv.data import Segments, read_segments, write_segments


def write(tmp_path, text, name="labels.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_dvs_gesture_csv_classes_count_from_one_and_times_are_microseconds(tmp_path):
    path = write(tmp_path, "class,startTime_usec,endTime_usec\n"
                           "3,80048239,85092709\n11,89431170,95231007\n\n")
    segments = read_segments(path, num_classes=11)
    np.testing.assert_array_equal(segments.labels, [2, 10])
    np.testing.assert_array_equal(segments.start_us, [80048239, 89431170])
    np.testing.assert_array_equal(segments.end_us, [85092709, 95231007])


def test_label_columns_count_from_zero_and_units_come_from_the_names(tmp_path):
    path = write(tmp_path, "label,start_s,end_ms\n0,1.5,2500\n4,3,3200.5\n")
    segments = read_segments(path)
    np.testing.assert_array_equal(segments.labels, [0, 4])
    np.testing.assert_array_equal(segments.start_us, [1.5e6, 3e6])
    np.testing.assert_array_equal(segments.end_us, [2.5e6, 3.2005e6])


def test_write_segments_reads_back(tmp_path):
    segments = Segments(np.array([0, 5]), np.array([10, 500]), np.array([400, 900]))
    write_segments(tmp_path / "s.csv", segments)
    assert (tmp_path / "s.csv").read_text().splitlines()[0] == "class,startTime_usec,endTime_usec"
    back = read_segments(tmp_path / "s.csv")
    for field in ("labels", "start_us", "end_us"):
        np.testing.assert_array_equal(getattr(back, field), getattr(segments, field))


def test_at_gives_the_segment_of_each_time():
    segments = Segments(np.array([1, 2]), np.array([100, 300]), np.array([200, 400]))
    np.testing.assert_array_equal(segments.at([0, 100, 199, 200, 299, 300, 399, 400]),
                                  [-1, 0, 0, -1, -1, 1, 1, -1])


HEADER = "class,startTime_usec,endTime_usec\n"


@pytest.mark.parametrize("rows, message", [
    ("1,100,50\n", "line 2: the segment ends at 50 us, not after its start at 100 us"),
    ("1,100,200\n2,150,300\n", "line 3: the segment starts at 150 us, before the one above "
                               "it ends (200 us)"),
    ("1,300,400\n2,100,200\n", "line 3: the segment starts at 100 us, before the one above "
                               "it (300 us)"),
    ("1,-100,200\n", "line 2: the segment starts at the negative time -100 us"),
    ("0,100,200\n", "line 2: label -1 is negative"),
    ("1,100\n", "line 2: 2 field(s), expected a value in each of the 3 columns"),
    ("1,abc,200\n", "line 2: ['1', 'abc', '200'] is not an integer label and two numbers"),
    ("12,100,200\n", "line 2: label 11 is out of range for 11 classes"),
])
def test_a_wrong_row_is_one_error_naming_the_file_and_line(tmp_path, rows, message):
    path = write(tmp_path, HEADER + rows)
    with pytest.raises(ValueError, match=re.escape(f"{path}, {message}")):
        read_segments(path, num_classes=11)


def test_a_header_without_the_columns_or_units_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"lacks a column named 'label' or 'class'"):
        read_segments(write(tmp_path, "gesture,start,end\n1,2,3\n"))
    with pytest.raises(ValueError, match=r"the column 'start' does not say its unit"):
        read_segments(write(tmp_path, "label,start,end_us\n1,2,3\n"))
    with pytest.raises(ValueError, match="the file is empty"):
        read_segments(write(tmp_path, "\n"))
    path = write(tmp_path, HEADER + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: the file holds a header and no "
                                                   "segments; expected a row per segment")):
        read_segments(path)


@pytest.mark.parametrize("rows, message", [
    ("1,2000000,2100000\n1,9000000,9500000\n",
     "line 3: the segment [9e+06, 9.5e+06) us lies after the last event of rec.npy "
     "(5e+06 us)"),
    ("1,2000,2100\n", "line 2: the segment [2000, 2100) us lies before the first event of "
                      "rec.npy (1e+06 us)"),
    ("1,500000,1000000\n", "line 2: the segment [500000, 1e+06) us lies before the first"),
])
def test_a_segment_outside_its_recording_is_named(tmp_path, rows, message):
    """Segments in milliseconds under a _us header (the second case) fall before the
    first event of a recording whose clock does not start near 0."""
    path = write(tmp_path, HEADER + rows)
    segments = read_segments(path)
    with pytest.raises(ValueError, match=re.escape(f"{path}, {message}")):
        segments.check_recording(1_000_000, 5_000_000, "rec.npy")


def test_segments_overlapping_the_recording_at_either_end_are_kept(tmp_path):
    segments = read_segments(write(tmp_path, HEADER + "1,0,1000001\n2,5000000,9000000\n"))
    segments.check_recording(1_000_000, 5_000_000, "rec.npy")
    np.testing.assert_array_equal(Segments(np.zeros(0, int), [], []).at([1, 2]), [-1, -1])


def test_overlaps_trim_ends_a_segment_where_the_next_starts(tmp_path):
    path = write(tmp_path, HEADER + "9,100,250\n10,200,300\n")
    segments = read_segments(path, overlaps="trim")
    np.testing.assert_array_equal(segments.end_us, [200, 300])
    with pytest.raises(ValueError, match="overlaps must be one of"):
        read_segments(path, overlaps="merge")
