"""Labelled collections of recordings: tonic datasets and directories of event files, and
every bad file or layout named."""
import re

import numpy as np
import pytest

from braintrace_conv.data import events_to_frames, from_directory, from_tonic, stream_directory
from braintrace_conv.data.transforms import CenterCrop, Downsample, RefractoryPeriod

EVENT_DTYPE = np.dtype([("x", np.int64), ("y", np.int64), ("t", np.int64), ("p", np.int64)])


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


class FakeTonicDataset:
    """Minimal stand-in for a tonic dataset: indexable (events, label) pairs."""

    sensor_size = SENSOR
    classes = ["a", "b", "c"]

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def fake_samples():
    return [
        (make_events(HAND_EVENTS), 2),
        (make_events([(0, 1, 10, 0), (2, 0, 30, 1)]), np.int64(0)),
        (make_events([(1, 1, 0, 1)]), 1),
    ]


class TestFromTonic:
    def test_duck_typed_dataset(self):
        ds = from_tonic(FakeTonicDataset(fake_samples()), n_time_bins=2)
        assert ds.events.shape == (3, 2, 2, 2, 3) and ds.num_classes == 3
        np.testing.assert_array_equal(ds.labels, [2, 0, 1])
        assert ds.name == "FakeTonicDataset"
        for i, (events, _) in enumerate(fake_samples()):
            np.testing.assert_array_equal(
                ds.events[i], events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)
            )

    def test_indices_sensor_size_and_num_classes(self):
        samples = fake_samples()
        ds = from_tonic(samples, n_time_bins=3, sensor_size=SENSOR, indices=[2, 0], name="list")
        np.testing.assert_array_equal(ds.labels, [1, 2])
        assert ds.num_classes == 3 and ds.name == "list" and ds.num_steps == 3

    def test_validation(self):
        with pytest.raises(ValueError, match="sensor_size is required"):
            from_tonic(fake_samples(), n_time_bins=2)
        with pytest.raises(TypeError, match="expected a scalar integer class index"):
            from_tonic([(make_events(HAND_EVENTS), "cat")], n_time_bins=2, sensor_size=SENSOR)
        with pytest.raises(TypeError, match=r"dataset\[0\] must be an \(events, label\) pair"):
            from_tonic([make_events(HAND_EVENTS)], n_time_bins=2, sensor_size=SENSOR)
        with pytest.raises(ValueError, match="no samples"):
            from_tonic(FakeTonicDataset([]), n_time_bins=2)

    def test_agrees_with_tonic_frames(self):
        tonic = pytest.importorskip("tonic")
        events = make_events(HAND_EVENTS)
        events = np.sort(events, order="t")
        theirs = tonic.transforms.ToFrame(sensor_size=SENSOR, event_count=len(events))(events)
        ours = events_to_frames(events, sensor_size=SENSOR, n_time_bins=1)
        # tonic orders channels by polarity value (OFF first); ours is ON first.
        np.testing.assert_array_equal(ours[0], np.asarray(theirs).sum(axis=0)[::-1])


class TestFromDirectory:
    def test_class_folders_of_npy_and_npz(self, tmp_path):
        (tmp_path / "left").mkdir()
        (tmp_path / "right").mkdir()
        samples = fake_samples()
        np.save(tmp_path / "left" / "a.npy", samples[0][0])
        np.savez(tmp_path / "left" / "b.npz", events=samples[1][0])
        np.savez(tmp_path / "right" / "c.npz", samples[2][0])
        (tmp_path / "right" / "notes.txt").write_text("ignored")
        ds = from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)
        assert ds.class_names == ("left", "right") and ds.num_classes == 2
        np.testing.assert_array_equal(ds.labels, [0, 0, 1])
        for i, (events, _) in enumerate(samples):
            np.testing.assert_array_equal(
                ds.events[i], events_to_frames(events, sensor_size=SENSOR, n_time_bins=2)
            )

    def test_transforms_are_applied_to_every_sample_before_binning(self, tmp_path):
        steps = [RefractoryPeriod(period_us=60), Downsample(factor=0.5)]
        samples = fake_samples()
        for name, (events, _) in zip(("a", "b", "c"), samples):
            (tmp_path / name).mkdir()
            np.save(tmp_path / name / "s.npy", np.sort(events, order="t"))
        ds = stream_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2, transforms=steps)
        assert ds.frame_shape == (2, 1, 2)
        frames = ds.to_memory().events
        for i, (events, _) in enumerate(samples):
            np.testing.assert_array_equal(frames[i], events_to_frames(
                np.sort(events, order="t"), sensor_size=SENSOR, n_time_bins=2,
                transforms=steps))
        tonic_ds = from_tonic(FakeTonicDataset(samples), n_time_bins=2, transforms=steps)
        assert tonic_ds.events.shape == (3, 2, 2, 1, 2)
        with pytest.raises(ValueError, match=re.escape("size must fit the sensor (3, 2)")):
            stream_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2,
                             transforms=CenterCrop(4))

    def test_validation(self, tmp_path):
        with pytest.raises(ValueError, match="existing directory"):
            from_directory(tmp_path / "missing", sensor_size=SENSOR, n_time_bins=2)
        (tmp_path / "cls").mkdir()
        with pytest.raises(ValueError, match="no .npy or .npz files"):
            from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)
        for name in ("cls", "other"):     # two classes, as a classifier needs
            (tmp_path / name).mkdir(exist_ok=True)
            np.savez(tmp_path / name / "two.npz", a=np.zeros(1), b=np.zeros(1))
        with pytest.raises(ValueError, match="'events' or exactly one array"):
            from_directory(tmp_path, sensor_size=SENSOR, n_time_bins=2)


# --------------------------------------------------------------- directories that say what they hold
AUDIO = np.dtype([("t", np.int64), ("x", np.int64), ("p", np.int64)])


BINNING = dict(sensor_size=(16, 1, 1), n_time_bins=4)


def recording(n=20, seed=0, **values):
    rng = np.random.default_rng(seed)
    events = np.zeros(n, AUDIO)
    events["t"] = np.sort(rng.integers(0, 1000, n))
    events["x"], events["p"] = rng.integers(0, 16, n), 1
    for field, value in values.items():
        events[field][-1] = value
    return events


def dataset_tree(root, classes=("a", "b"), files=2):
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(files):
            np.save(root / name / f"{i}.npy", recording(seed=i))
    return root


def tree_of(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_hidden_entries_case_and_depth(tmp_path):
    root = dataset_tree(tmp_path / "data")
    (root / ".ipynb_checkpoints").mkdir()
    np.save(root / ".ipynb_checkpoints" / "x.npy", recording())
    with open(root / "b" / "UPPER.NPY", "wb") as f:
        np.save(f, recording())
    np.save(root / "b" / ".hidden.npy", recording())
    np.save(root / "loose.npy", recording())
    (root / "b" / "deeper").mkdir()
    np.save(root / "b" / "deeper" / "x.npy", recording())
    before = tree_of(root)
    with pytest.warns(UserWarning, match=r"2 event file\(s\) in .*data are not directly in a "
                                         r"class directory and are ignored \(e.g. "):
        data = stream_directory(root, **BINNING)
    assert data.class_names == ("a", "b") and len(data) == 5
    assert [p.name for p in data.sources] == ["0.npy", "1.npy", "0.npy", "1.npy", "UPPER.NPY"]
    assert tree_of(root) == before


def test_files_only_at_the_top_are_refused_with_the_layout(tmp_path):
    np.save(tmp_path / "a.npy", recording())
    with pytest.raises(ValueError, match=r"no .npy or .npz files found in the class "
                                         r"sub-directories of .* \(1 lie at another depth, e.g. "
                                         r".*a.npy; the layout is root/<class>/<sample>.npy\)"):
        stream_directory(tmp_path, **BINNING)


def test_empty_and_single_classes_are_refused(tmp_path):
    root = dataset_tree(tmp_path / "data", classes=("a", "b"))
    (root / "c").mkdir()
    with pytest.raises(ValueError, match=r"1 of the 3 class directories of .*data hold no "
                                         r"\.npy or \.npz event files: c; remove them"):
        stream_directory(root, **BINNING)
    single = dataset_tree(tmp_path / "single", classes=("only",))
    with pytest.raises(ValueError, match=r"holds a single class directory \(only\); a "
                                         r"classifier needs .* at least two"):
        from_directory(single, **BINNING)


def test_links_outside_the_root_are_named(tmp_path):
    root = dataset_tree(tmp_path / "data")
    elsewhere = dataset_tree(tmp_path / "elsewhere", classes=("c",))
    (root / "c").symlink_to(elsewhere / "c")
    with pytest.warns(UserWarning, match=r"1 entries of .*data link to outside it and are read "
                                         r"\(e.g. .*c -> .*elsewhere/c\)"):
        data = stream_directory(root, **BINNING)
    assert data.class_names == ("a", "b", "c")


def test_empty_recordings_are_counted_or_refused(tmp_path):
    root = dataset_tree(tmp_path / "data")
    np.save(root / "a" / "2.npy", recording(n=0))
    with pytest.warns(UserWarning, match=r"1 of the 5 event files in .*data hold no events "
                                         r"\(e.g. .*2.npy\); they give all-zero frames"):
        stream_directory(root, **BINNING)
    for path in root.rglob("*.npy"):
        np.save(path, recording(n=0))
    with pytest.raises(ValueError, match="every event file in .*data is empty"):
        stream_directory(root, **BINNING)


def _write_npz(path, content):
    np.savez(path, events=content)
    path.write_bytes(path.read_bytes()[:-40])


def _huge_header(path, _):
    header = b"{'descr': [('t', '<i8'), ('x', '<i8'), ('p', '<i8')], 'fortran_order': False, " \
             b"'shape': (1000000000000,), }"
    header += b" " * (127 - 10 - len(header)) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 48)


def _cut_header(path, _):
    header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (3,"
    header += b" " * (127 - 10 - len(header)) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)


BAD_FILES = [  # (name, write(path, recording), error at listing?, message)
    ("z.npy", _cut_header, True, "not a readable .npy array"),
    ("z.npy", lambda p, r: p.write_bytes(b""), True, "not a NumPy .npy array"),
    ("z.npz", _write_npz, True, "not a readable .npz archive|not a zip archive"),
    ("z.npy", _huge_header, True, r"declares 1000000000000 elements .* holds 48 bytes"),
    ("z.npy", lambda p, r: p.write_bytes(np.random.default_rng(0).bytes(300)), True,
     "not a NumPy .npy array"),
    ("z.npy", lambda p, r: np.save(p, np.array([r, None], dtype=object), allow_pickle=True),
     True, r"holds Python objects \(dtype object\), which are never loaded"),
    ("z.npy", lambda p, r: np.save(p, np.zeros(5)), True,
     "holds a float64 array of shape .*; expected a one-dimensional structured event array"),
    ("z.npy", lambda p, r: np.save(p, recording(x=99)), False,
     r"events field 'x' must lie in \[0, 16\)"),
    ("z.npy", lambda p, r: np.save(p, _nan_t()), False, "events field 't' must be finite"),
]


def _nan_t():
    events = recording().astype([("t", np.float64), ("x", np.int64), ("p", np.int64)])
    events["t"][-1] = np.nan
    return events


@pytest.mark.parametrize("name, write, at_listing, match", BAD_FILES)
def test_every_bad_event_file_is_named(tmp_path, name, write, at_listing, match):
    root = dataset_tree(tmp_path / "data")
    bad = root / "b" / name    # not the first file: streaming reads it only in a batch
    write(bad, recording())
    before = tree_of(root)
    with pytest.raises(ValueError) as error:
        data = stream_directory(root, **BINNING, cache_size=0)
        assert not at_listing, "the listing should have refused the file"
        list(data.batches(5))
    assert str(bad) in str(error.value) and re.search(match, str(error.value)), error.value
    assert tree_of(root) == before
