"""Streaming datasets: the batches of the in-memory dataset, read lazily through a bounded LRU cache."""
import functools

import numpy as np
import pytest

from braintrace_conv.data import (EventDataset, StreamingEventDataset, events_to_frames,
                                  from_directory, from_tonic, load_event_file, moving_bars,
                                  stream_directory, stream_tonic, synthetic_shd)

SHD_BINNING = dict(sensor_size=(700, 1, 1), time_window_us=10_000.0, n_time_bins=12,
                   t_start_us=0)


@pytest.fixture(scope="module")
def shd_directory(tmp_path_factory):
    """Synthetic SHD recordings saved as root/<class>/<i>.npy|.npz, and the labels."""
    root = tmp_path_factory.mktemp("shd")
    ds, recordings = synthetic_shd(30, num_classes=3, T=12, duration_ms=120.0, seed=4)
    names = ("one", "three", "two")   # sorted, so label k is names[k]
    for i, (events, label) in enumerate(zip(recordings, ds.labels)):
        folder = root / names[label]
        folder.mkdir(exist_ok=True)
        if i % 2:
            np.save(folder / f"{i:03d}.npy", events)
        else:
            np.savez(folder / f"{i:03d}.npz", events=events)
    return root, names


def counting(read):
    """``read`` that records every source it is called with."""
    def wrapper(source):
        wrapper.calls.append(source)
        return read(source)
    wrapper.calls = []
    return wrapper


def assert_same_batches(a, b, **kwargs):
    batches_a, batches_b = list(a.batches(**kwargs)), list(b.batches(**kwargs))
    assert len(batches_a) == len(batches_b) == a.num_batches(
        kwargs["batch_size"], drop_last=kwargs.get("drop_last", False))
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        assert xa.dtype == xb.dtype == np.float32 and xa.flags.c_contiguous
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


class TestStreamDirectory:
    def test_matches_the_in_memory_dataset(self, shd_directory):
        root, names = shd_directory
        streamed = stream_directory(root, **SHD_BINNING, cache_size=4)
        in_memory = from_directory(root, **SHD_BINNING)
        assert isinstance(in_memory, EventDataset)
        assert isinstance(streamed, StreamingEventDataset)
        assert streamed.class_names == in_memory.class_names == names
        assert len(streamed) == 30 and streamed.num_classes == 3 and streamed.name == root.name
        assert streamed.num_steps == 12 and streamed.frame_shape == (1, 700)
        assert "StreamingEventDataset(" in repr(streamed) and "frame_shape=(1, 700)" in repr(streamed)
        np.testing.assert_array_equal(streamed.labels, in_memory.labels)
        for path, frames in zip(streamed.sources, in_memory.events):
            np.testing.assert_array_equal(
                frames, events_to_frames(load_event_file(path), **SHD_BINNING))
        for kwargs in (dict(shuffle=False), dict(seed=3), dict(seed=3, drop_last=True)):
            assert_same_batches(streamed, in_memory, batch_size=8, **kwargs)
        np.testing.assert_array_equal(streamed.to_memory().events, in_memory.events)

    def test_split_and_subset_match(self, shd_directory):
        root, _ = shd_directory
        streamed = stream_directory(root, **SHD_BINNING, cache_size=0)
        in_memory = from_directory(root, **SHD_BINNING)
        for part_s, part_m in zip(streamed.split(0.3, seed=2), in_memory.split(0.3, seed=2)):
            assert isinstance(part_s, StreamingEventDataset)
            np.testing.assert_array_equal(part_s.class_counts(), part_m.class_counts())
            assert_same_batches(part_s, part_m, batch_size=4, seed=1)
        picked = streamed.subset([5, 0, 5])
        assert picked.sources == (streamed.sources[5], streamed.sources[0], streamed.sources[5])
        np.testing.assert_array_equal(picked.to_memory().events,
                                      in_memory.events[[5, 0, 5]])

    def test_dvs_frames(self, tmp_path):
        # 2-D events in (t, x, y, p) on a 16x16 sensor, round trip through files.
        bars = moving_bars(8, T=4, seed=0)
        for i, (frames, label) in enumerate(zip(bars.events, bars.labels)):
            t, p, y, x = np.nonzero(frames)
            events = np.zeros(len(t), dtype=[("t", float), ("x", int), ("y", int), ("p", int)])
            events["t"], events["x"], events["y"], events["p"] = 10.0 * t, x, y, 1 - p
            (tmp_path / f"{label}").mkdir(exist_ok=True)
            np.save(tmp_path / f"{label}" / f"{i}.npy", np.repeat(
                events, frames[t, p, y, x].astype(int)))
        streamed = stream_directory(tmp_path, sensor_size=(16, 16, 2), time_window_us=10.0,
                                    n_time_bins=4, t_start_us=0)
        assert streamed.frame_shape == (2, 16, 16)
        order = np.argsort([int(p.stem) for p in streamed.sources])
        np.testing.assert_array_equal(streamed.to_memory().events[order], bars.events)

    def test_unequal_sample_shapes_name_the_file(self, shd_directory):
        root, _ = shd_directory
        streamed = stream_directory(root, sensor_size=(700, 1, 1), event_count=50)
        with pytest.raises(ValueError, match=r"sample .*\.np[yz].* gives frames of shape .* "
                                             r"fix the number of time steps \(e.g. n_time_bins\)"):
            streamed.to_memory()

    def test_validation(self, tmp_path):
        with pytest.raises(ValueError, match="existing directory"):
            stream_directory(tmp_path / "missing", **SHD_BINNING)
        with pytest.raises(ValueError, match="no .npy or .npz files"):
            stream_directory(tmp_path, **SHD_BINNING)
        with pytest.raises(TypeError, match=r"unknown binning keyword\(s\) \['n_bins'\]; "
                                            r"expected some of \['n_time_bins', 'time_window_us'"):
            stream_directory(tmp_path, sensor_size=(700, 1, 1), n_bins=3)


class TestCache:
    @pytest.fixture
    def sources(self, shd_directory):
        root, _ = shd_directory
        in_memory = from_directory(root, **SHD_BINNING)
        return stream_directory(root, **SHD_BINNING).sources, in_memory

    def make(self, sources, labels, cache_size):
        read = counting(load_event_file)
        ds = StreamingEventDataset(
            sources, labels, read=read,
            to_frames=functools.partial(events_to_frames, **SHD_BINNING),
            num_classes=3, cache_size=cache_size)
        return ds, read.calls

    def test_reads_lazily_and_stays_bounded(self, sources):
        paths, in_memory = sources
        ds, calls = self.make(paths, in_memory.labels, cache_size=5)
        assert calls == [paths[0]]                   # only the first sample, for its shape
        sizes = []
        for _ in ds.batches(4, seed=0):
            sizes.append(ds.cache_info()["size"])
        assert max(sizes) == 5 and ds.cache_info()["maxsize"] == 5
        assert sorted(map(str, calls)) == sorted(map(str, paths + paths[:1]))
        assert ds.cache_info()["misses"] == len(calls)

    def test_a_cache_holding_everything_reads_each_file_once(self, sources):
        paths, in_memory = sources
        ds, calls = self.make(paths, in_memory.labels, cache_size=len(paths))
        for epoch in range(3):
            assert_same_batches(ds, in_memory, batch_size=7, seed=epoch)
        assert sorted(map(str, calls)) == sorted(map(str, paths))
        assert ds.cache_info()["hits"] == 3 * len(paths) - (len(paths) - 1)

    def test_least_recently_used_is_evicted_and_subsets_share_the_cache(self, sources):
        paths, in_memory = sources
        ds, calls = self.make(paths, in_memory.labels, cache_size=2)

        def touch(i):
            next(ds.subset([i]).batches(1, shuffle=False))

        calls.clear()
        for i in (1, 0, 2, 0):      # cache after each: [0,1] [1,0] [0,2] [2,0]; 1 evicted
            touch(i)
        assert calls == [paths[1], paths[2]]
        touch(1)
        assert calls == [paths[1], paths[2], paths[1]]

    def test_no_cache(self, sources):
        paths, in_memory = sources
        ds, calls = self.make(paths, in_memory.labels, cache_size=0)
        for _ in range(2):
            assert_same_batches(ds, in_memory, batch_size=10, shuffle=False)
        assert len(calls) == 1 + 2 * len(paths) and ds.cache_info()["size"] == 0

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(cache_size=-1), ValueError, "cache_size must be a non-negative integer"),
            (dict(cache_size=2.0), TypeError, "cache_size must be a non-negative integer"),
            (dict(labels=[0, 1]), ValueError, "same length, got 3 sources and 2 labels"),
            (dict(labels=[0, 1, 3]), ValueError, r"labels must lie in \[0, 3\)"),
            (dict(read=None), TypeError, "read and to_frames must be callables"),
            (dict(to_frames=lambda events: np.zeros(3)), ValueError,
             r"\(T, \*frame_shape\) with a frame of at least one axis, got shape \(3,\)"),
        ],
    )
    def test_validation(self, sources, kwargs, error, match):
        paths, _ = sources
        arguments = dict(labels=[0, 1, 2], read=load_event_file,
                         to_frames=functools.partial(events_to_frames, **SHD_BINNING),
                         num_classes=3, cache_size=4)
        arguments.update(kwargs)
        with pytest.raises(error, match=match):
            StreamingEventDataset(paths[:3], arguments.pop("labels"), **arguments)


class FakeTonic:
    """Indexable (events, label) pairs with tonic's attributes; counts reads."""

    sensor_size = (700, 1, 1)
    classes = ["a", "b", "c"]

    def __init__(self, recordings, labels, with_targets):
        self.recordings, self.labels, self.reads = recordings, labels, []
        if with_targets:
            self.targets = list(labels)

    def __len__(self):
        return len(self.recordings)

    def __getitem__(self, index):
        self.reads.append(index)
        return self.recordings[index], int(self.labels[index])


@pytest.mark.parametrize("with_targets", [True, False])
def test_stream_tonic_matches_from_tonic(with_targets):
    ds, recordings = synthetic_shd(12, num_classes=3, T=12, duration_ms=120.0, seed=7)
    binning = {k: v for k, v in SHD_BINNING.items() if k != "sensor_size"}
    fake = FakeTonic(recordings, ds.labels, with_targets)
    streamed = stream_tonic(fake, cache_size=0, **binning)
    # With targets only the first sample is read up front, else one pass for the labels.
    assert fake.reads == ([0] if with_targets else list(range(12)) + [0])
    assert streamed.num_classes == 3 and streamed.name == "FakeTonic"
    in_memory = from_tonic(fake, **binning)
    np.testing.assert_array_equal(in_memory.events, ds.events)
    assert_same_batches(streamed, in_memory, batch_size=5, seed=0)
