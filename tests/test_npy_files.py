"""Reading .npy and .npz files without trusting them: headers checked before anything is
allocated, never a pickle, every problem a NpyFileError naming the file."""
import zipfile

import numpy as np
import pytest

from braintrace_conv._npy_files import (NpyFileError, available_memory, npy_entries, npy_header,
                                        read_npy, read_npz)

EVENTS = np.zeros(5, np.dtype([('t', np.int64), ('x', np.int16), ('p', bool)]))


def test_arrays_round_trip_and_headers_are_read_alone(tmp_path):
    np.save(tmp_path / 'a.npy', EVENTS)
    np.save(tmp_path / 'f.npy', np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    np.savez(tmp_path / 'b.npz', events=EVENTS, w=np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(read_npy(tmp_path / 'a.npy'), EVENTS)
    np.testing.assert_array_equal(read_npy(tmp_path / 'f.npy'), np.arange(6.0).reshape(2, 3))
    assert npy_header(tmp_path / 'a.npy') == ((5,), EVENTS.dtype)
    archive = read_npz(tmp_path / 'b.npz')
    assert set(archive) == {'events', 'w'} and archive['w'].dtype == np.float32
    assert npy_entries(tmp_path / 'b.npz') == [('events', (5,), EVENTS.dtype),
                                               ('w', (2, 2), np.dtype(np.float32))]


def header(shape: str, descr: str = "'<f4'") -> bytes:
    text = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}".encode()
    text += b' ' * (117 - len(text)) + b'\n'
    return b'\x93NUMPY\x01\x00' + len(text).to_bytes(2, 'little') + text


@pytest.mark.parametrize('content, problem', [
    (b'', 'is not a NumPy .npy array'),
    (b'epoch: 3\n', 'is not a NumPy .npy array'),
    (header('(10,)') + b'\0' * 8, r'declares 10 elements of float32 \(40 bytes\) but holds 8 '
                                  r'bytes of data'),
    (header(f'({10**15},)'), 'declares 1000000000000000 elements'),
    (header('(2,)', "'|O'") + b'\0' * 16, r'holds Python objects \(dtype object\), which are '
                                          r'never loaded'),
])
def test_a_bad_npy_file_is_named_before_anything_is_allocated(tmp_path, content, problem):
    path = tmp_path / 'bad.npy'
    path.write_bytes(content)
    with pytest.raises(NpyFileError, match=problem) as error:
        read_npy(path)
    assert error.value.path == path and str(error.value).startswith(f'{path}: ')


def test_a_bad_npz_archive_is_named(tmp_path):
    np.savez(tmp_path / 'good.npz', a=np.ones(3))
    with zipfile.ZipFile(tmp_path / 'text.npz', 'w') as archive:
        archive.writestr('notes.txt', 'not an array')
    with zipfile.ZipFile(tmp_path / 'bz.npz', 'w', compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr('a.npy', (tmp_path / 'good.npz').read_bytes())
    (tmp_path / 'plain.npz').write_bytes(b'not a zip')
    for name, problem in [('text.npz', "entry 'notes.txt' is not a .npy array"),
                          ('bz.npz', 'uses zip compression method 12; only stored and deflated'),
                          ('plain.npz', 'not a zip archive, as an .npz file is')]:
        with pytest.raises(NpyFileError, match=problem):
            read_npz(tmp_path / name)


def test_available_memory_is_a_positive_number_of_bytes():
    available = available_memory()
    assert available is None or (isinstance(available, int) and available > 0)
