"""Fingerprints of data sets: equal for the same data wherever it lies, and a changed file
named by what changed."""
import hashlib
import os

import numpy as np
import pytest

from braintrace_conv.data import EventDataset, stream_directory
from braintrace_conv.training.fingerprint import VERSION, data_change, data_fingerprint

AUDIO = np.dtype([('t', np.int64), ('x', np.int64), ('p', np.int64)])


def recordings(root, files=2):
    for label in ('a', 'b'):
        (root / label).mkdir(parents=True)
        for i in range(files):
            events = np.zeros(20, AUDIO)
            events['t'] = np.arange(20) * 10
            events['x'], events['p'] = (np.arange(20) + i) % 16, 1
            np.save(root / label / f'{i}.npy', events)
    return root


def streamed(root):
    return stream_directory(root, sensor_size=(16, 1, 1), n_time_bins=4)


def in_memory(labels=(0, 1, 0, 1)):
    events = np.arange(4 * 3 * 2 * 5, dtype=np.float32).reshape(4, 3, 2, 5)
    return EventDataset(events, np.array(labels), 2)


def test_a_data_set_in_memory_is_fingerprinted_by_its_events_and_labels():
    fingerprint = data_fingerprint(in_memory())
    assert fingerprint['samples'] == 4 and fingerprint['shape'] == [4, 3, 2, 5]
    assert fingerprint['version'] == VERSION and len(fingerprint['sha256']) == 64
    assert data_fingerprint(in_memory()) == fingerprint
    assert data_fingerprint(in_memory((1, 0, 0, 1)))['sha256'] != fingerprint['sha256']
    assert data_change(fingerprint, in_memory()) == (None, None)
    change, _ = data_change(fingerprint, in_memory((1, 0, 0, 1)))
    assert change == 'other samples or labels (4 samples then, 4 samples now)'
    assert data_fingerprint(None) is None and data_change(None, None) == (None, None)
    assert data_change(fingerprint, None) == ('4 samples then, none now', None)


def test_a_streamed_data_set_keeps_its_fingerprint_when_moved(tmp_path):
    here, there = recordings(tmp_path / 'here'), tmp_path / 'there'
    fingerprint = data_fingerprint(streamed(here))
    assert len(fingerprint['files']) == 4
    os.rename(here, there)
    assert data_change(fingerprint, streamed(there)) == (None, None)


def test_a_changed_file_is_named_and_an_old_fingerprint_says_what_it_cannot_see(tmp_path):
    root = recordings(tmp_path / 'data')
    fingerprint, old = data_fingerprint(streamed(root)), data_fingerprint(streamed(root), 1)
    assert 'version' not in old and 'files' not in old
    changed = root / 'b' / '1.npy'
    st = os.stat(changed)
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    change, note = data_change(fingerprint, streamed(root))
    assert change == ('1 of its 4 files changed since (size or modification time): '
                      f'{changed}') and note is None
    change, note = data_change(old, streamed(root))
    assert change is None and "changes to the files' contents cannot be detected" in note


@pytest.mark.parametrize('stored, expected', [
    ('abc', 'its stored fingerprint is not valid'),
    (dict(version=9), 'of version 9, is not one this version of braintrace_conv can check'),
])
def test_a_fingerprint_that_cannot_be_checked_is_a_change(stored, expected):
    change, _ = data_change(stored, in_memory())
    assert expected in change


def test_contents_name_a_file_rewritten_with_its_size_and_time_kept(tmp_path, monkeypatch):
    root = recordings(tmp_path / 'data')
    plain, verified = data_fingerprint(streamed(root)), data_fingerprint(streamed(root),
                                                                          contents=True)
    assert 'contents' not in plain and len(verified['contents']) == 4
    assert {k: v for k, v in verified.items() if k != 'contents'} == plain
    changed = root / 'a' / '1.npy'
    st = os.stat(changed)
    events = np.load(changed)
    events['x'] = 15 - events['x']
    np.save(changed, events)
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert data_change(plain, streamed(root)) == (None, None)      # what only contents see
    assert data_change(verified, streamed(root))[0] == (
        f'1 of its 4 files changed since (content, with size and modification time kept): '
        f'{changed}')
    reads = []      # a fingerprint made already is used, not made again
    monkeypatch.setattr(hashlib, 'file_digest', lambda *a: reads.append(a) or hashlib.sha256())
    now = data_fingerprint(streamed(root), contents=True)
    assert len(reads) == 4
    data_change(verified, streamed(root), now=now)
    data_change(verified, streamed(root), now=data_fingerprint(streamed(root)))
    assert len(reads) == 8      # the second had no contents: they were read
