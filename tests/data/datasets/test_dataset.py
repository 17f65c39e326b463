"""EventDataset: storage, batches, stratified splits and subsets."""
import numpy as np
import pytest

from braintrace_conv.data import EventDataset


def toy_dataset(n=12, T=3, H=4, W=5, num_classes=3, seed=0):
    rng = np.random.default_rng(seed)
    events = rng.integers(0, 2, size=(n, T, 2, H, W)).astype(np.float32)
    labels = np.arange(n) % num_classes
    return EventDataset(events=events, labels=labels, num_classes=num_classes, name="toy")


class TestEventDataset:
    def test_stores_float32_int32_read_only(self):
        ds = EventDataset(
            events=np.ones((4, 3, 2, 5, 6), dtype=np.int64),
            labels=np.array([0, 1, 1, 0], dtype=np.int64),
            num_classes=2,
        )
        assert ds.events.dtype == np.float32 and ds.labels.dtype == np.int32
        assert len(ds) == 4 and ds.num_steps == 3 and ds.frame_shape == (2, 5, 6)
        assert not ds.events.flags.writeable and not ds.labels.flags.writeable
        np.testing.assert_array_equal(ds.class_counts(), [2, 2])
        assert "samples=4" in repr(ds)

    def test_does_not_freeze_callers_array(self):
        events = np.zeros((2, 1, 2, 3, 3), dtype=np.float32)
        EventDataset(events=events, labels=np.array([0, 1]), num_classes=2)
        assert events.flags.writeable

    @pytest.mark.parametrize(
        "events_shape, labels, num_classes, match",
        [
            ((4, 3), [0, 1, 0, 1], 2, r"events must have shape \(N, T, \*frame_shape\)"),
            ((4,), [0, 1, 0, 1], 2, "a frame of at least one axis"),
            ((4, 3, 2, 5, 5), [[0, 1, 0, 1]], 2, "labels must have shape"),
            ((4, 3, 2, 5, 5), [0, 1, 0], 2, "same length"),
            ((4, 3, 2, 5, 5), [0, 1, 2, 1], 2, r"labels must lie in \[0, 2\)"),
            ((4, 3, 2, 5, 5), [0, -1, 0, 1], 2, r"labels must lie in \[0, 2\)"),
            ((4, 3, 2, 5, 5), [0, 1, 0, 1], 0, "num_classes must be a positive integer"),
        ],
    )
    def test_rejects_invalid_contents(self, events_shape, labels, num_classes, match):
        with pytest.raises(ValueError, match=match):
            EventDataset(
                events=np.zeros(events_shape), labels=np.array(labels), num_classes=num_classes
            )

    @pytest.mark.parametrize("frame_shape", [(700,), (1, 700), (2, 4, 5), (2, 3, 4, 5)])
    def test_frames_of_any_rank(self, frame_shape):
        events = np.random.default_rng(0).integers(0, 3, (6, 4) + frame_shape)
        ds = EventDataset(events=events, labels=np.arange(6) % 2, num_classes=2)
        assert ds.num_steps == 4 and ds.frame_shape == frame_shape
        (xs, ys), = ds.batches(6, shuffle=False)
        assert xs.shape == (4, 6) + frame_shape
        np.testing.assert_array_equal(xs, np.swapaxes(events, 0, 1))
        train, test = ds.split(0.5)
        assert train.frame_shape == test.frame_shape == frame_shape

    def test_rejects_wrong_types(self):
        events = np.zeros((2, 1, 2, 3, 3))
        with pytest.raises(TypeError, match="labels must be integers"):
            EventDataset(events=events, labels=np.array([0.0, 1.0]), num_classes=2)
        with pytest.raises(TypeError, match="num_classes must be a positive integer"):
            EventDataset(events=events, labels=np.array([0, 1]), num_classes=2.0)
        with pytest.raises(ValueError, match="class_names must be 2 strings"):
            EventDataset(events=events, labels=np.array([0, 1]), num_classes=2, class_names=("a",))

    def test_batches_are_time_major_and_cover_every_sample_once(self):
        ds = toy_dataset(n=10)
        seen = []
        for xs, ys in ds.batches(4, seed=3):
            assert xs.dtype == np.float32 and ys.dtype == np.int32
            assert xs.shape == (3, len(ys), 2, 4, 5) and xs.flags.c_contiguous
            # Match each batch element back to its source sample.
            for b in range(len(ys)):
                (idx,) = [
                    i for i in range(len(ds)) if np.array_equal(ds.events[i], xs[:, b])
                ]
                assert ds.labels[idx] == ys[b]
                seen.append(idx)
        assert sorted(seen) == list(range(10))
        assert [len(y) for _, y in ds.batches(4)] == [4, 4, 2]
        assert ds.num_batches(4) == 3

    def test_batches_order_and_drop_last(self):
        ds = toy_dataset(n=10)
        ordered = [y for _, y in ds.batches(4, shuffle=False)]
        np.testing.assert_array_equal(np.concatenate(ordered), ds.labels)
        assert [len(y) for _, y in ds.batches(4, drop_last=True)] == [4, 4]
        assert ds.num_batches(4, drop_last=True) == 2
        first = [x for x, _ in ds.batches(3, seed=1)]
        again = [x for x, _ in ds.batches(3, seed=1)]
        other = [x for x, _ in ds.batches(3, seed=2)]
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        assert not all(np.array_equal(a, b) for a, b in zip(first, other))

    @pytest.mark.parametrize(
        "batch_size, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError)]
    )
    def test_batches_rejects_bad_batch_size(self, batch_size, error):
        with pytest.raises(error, match="batch_size"):
            next(toy_dataset().batches(batch_size))

    def test_split_is_stratified_disjoint_and_deterministic(self):
        ds = toy_dataset(n=30)
        train, test = ds.split(0.2, seed=5)
        np.testing.assert_array_equal(test.class_counts(), [2, 2, 2])
        np.testing.assert_array_equal(train.class_counts(), [8, 8, 8])
        rows = lambda d: {d.events[i].tobytes() + bytes([d.labels[i]]) for i in range(len(d))}
        assert rows(train).isdisjoint(rows(test)) and rows(train) | rows(test) == rows(ds)
        again_train, again_test = ds.split(0.2, seed=5)
        np.testing.assert_array_equal(again_test.events, test.events)
        _, other_test = ds.split(0.2, seed=6)
        assert not np.array_equal(other_test.events, test.events)
        assert train.name == "toy" and train.num_classes == 3

    @pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, float("nan")])
    def test_split_rejects_fraction_outside_unit_interval(self, fraction):
        with pytest.raises(ValueError, match="test_fraction"):
            toy_dataset().split(fraction)

    def test_split_rejects_empty_part(self):
        with pytest.raises(ValueError, match="empty training or test set"):
            toy_dataset(n=3).split(0.1)

    def test_subset(self):
        ds = toy_dataset()
        sub = ds.subset([5, 1])
        np.testing.assert_array_equal(sub.events, ds.events[[5, 1]])
        np.testing.assert_array_equal(sub.labels, ds.labels[[5, 1]])
        with pytest.raises(ValueError, match="indices must be a 1-D integer array"):
            ds.subset([0.5])
