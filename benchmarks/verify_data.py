"""What ``--verify-data`` costs: fingerprinting a streamed data set by its files' contents.

A directory of ``--files`` SHD-like recordings (700 channels, ``--events`` events each,
tonic's ``t, x, p`` fields as int64: 24 bytes per event) is written once, then, in
interleaved rounds in one process:

* ``stat``: the default fingerprint
  (:func:`~braintrace_conv.training.fingerprint.data_fingerprint`), the files' sizes and
  modification times;
* ``contents``: the fingerprint with ``contents=True``, the SHA-256 of every file
  (what ``Trainer.fit(verify_data=True)`` and ``braintrace-conv train --verify-data`` add,
  once per run);
* ``epoch read``: one pass of ``StreamingEventDataset.batches`` over the same files
  (read and binned into ``--steps`` frames, no cache), what every epoch of a streamed run
  does anyway.

The files were just written, so they are read from the page cache; a data set read from
disk adds its read time (size / disk bandwidth) to ``contents`` and ``epoch read`` alike.

    python benchmarks/verify_data.py                     # 2000 files of 10000 events
    python benchmarks/verify_data.py --files 200 --repeats 1

Prints a Markdown table and writes JSON (default benchmarks/results/verify_data.json).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from timing import interleaved  # noqa: E402

from braintrace_conv.data import stream_directory  # noqa: E402
from braintrace_conv.training.fingerprint import data_fingerprint  # noqa: E402

EVENTS = np.dtype([('t', np.int64), ('x', np.int64), ('p', np.int64)])
CHANNELS = 700


def write_recordings(root: str, files: int, events: int) -> int:
    """``files`` recordings in two classes under ``root``; returns their total bytes."""
    rng = np.random.default_rng(0)
    total = 0
    for i in range(files):
        label = os.path.join(root, f'class{i % 2}')
        os.makedirs(label, exist_ok=True)
        recording = np.zeros(events, EVENTS)
        recording['t'] = np.sort(rng.integers(0, 1_000_000, events))
        recording['x'], recording['p'] = rng.integers(0, CHANNELS, events), 1
        path = os.path.join(label, f'{i:05d}.npy')
        np.save(path, recording)
        total += os.path.getsize(path)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--files', type=int, default=2000)
    parser.add_argument('--events', type=int, default=10_000)
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--out', default=default_path('verify_data'))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        total = write_recordings(root, args.files, args.events)
        data = stream_directory(root, sensor_size=(CHANNELS, 1, 1), n_time_bins=args.steps,
                                cache_size=0)

        def epoch_read():
            for _ in data.batches(64, shuffle=False):
                pass

        times = interleaved({'stat': lambda: data_fingerprint(data),
                             'contents': lambda: data_fingerprint(data, contents=True),
                             'epoch read': epoch_read}, args.repeats)
    median = {name: statistics.median(t) for name, t in times.items()}
    mib = total / 2**20
    print(f'{args.files} files, {mib:.0f} MiB, {args.repeats} rounds (median)\n')
    print('| fingerprint | s | ms / file | MiB/s | vs one epoch read |')
    print('|---|---:|---:|---:|---:|')
    for name, seconds in median.items():
        print(f'| {name} | {seconds:.3f} | {1e3 * seconds / args.files:.3f} | '
              f'{mib / seconds:.0f} | {seconds / median["epoch read"]:.2f}x |')
    write_results(args.out, files=args.files, events_per_file=args.events, bytes=total,
                  steps=args.steps, repeats=args.repeats, seconds=times, median_s=median)


if __name__ == '__main__':
    main()
