"""Camera-file readers compared: events per second and peak memory reading a large file.

A recording of ``--events`` events on a 128 x 128 sensor (timestamps rising at about
one event per microsecond, random pixels and polarities) is written once as AEDAT4 (LZ4,
faery's default), EVT3, EVT2 and DAT, then read by every reader that can read that
format, each run in a fresh process so that its peak memory is its own:

* ``faery`` (AEDAT4, EVT2, EVT3, DAT; also writes them),
* ``aedat`` (AEDAT4 only),
* ``expelliarmus`` (EVT2, EVT3, DAT; tonic's dependency),
* ``prophesee``: the library's own EVT2/EVT3 and DAT decoders
  (:func:`braintrace_conv.data.files.prophesee.decode`, ``decode_dat``) alone, to compare
  with faery's,
* ``braintrace_conv``: :class:`~braintrace_conv.data.EventReader` block by block and
  :func:`~braintrace_conv.data.read_events` (faery underneath for AEDAT4, the decoder
  above for EVT, plus the checks of every event and the conversion to
  ``CAMERA_EVENT_DTYPE``), also on the same events saved as ``.npy`` (memory-mapped).

With ``--silences`` the recording pauses after every 100,000 events, for 1 ms, 5 ms,
100 ms, 1 s, 8.5 s and 20 s in turn, as a sparse recording does: its timestamps then
pass many wraps of EVT3's 24-bit time base after a silence, which faery 0.7.1 misses.

Every reader's events are compared with the written ones, and one that does not give
them back exactly is marked.

Two ways of reading: ``packets`` walks the file packet by packet, as a stream does
(memory stays at one packet), and ``array`` builds one array of every event, as
:func:`braintrace_conv.data.read_events` does. Runs are interleaved over ``--repeats``
rounds; the table gives medians of the events per second by the clock and by the
process's CPU time (less moved by other work on a shared machine).

    python benchmarks/event_readers.py                  # 20 million events, 3 rounds
    python benchmarks/event_readers.py --events 2000000 --repeats 1
    python benchmarks/event_readers.py --silences       # timestamps past many EVT3 wraps
    python benchmarks/event_readers.py --readers faery prophesee --formats EVT3 EVT2

Needs faery; aedat and expelliarmus are left out when not installed (``pip install faery
aedat expelliarmus``). Prints a Markdown table and writes JSON (default
benchmarks/results/event_readers.json, or event_readers_silences.json).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

SENSOR = (128, 128)
FORMATS = {'AEDAT4': 'recording.aedat4', 'EVT3': 'recording_evt3.raw',
           'EVT2': 'recording_evt2.raw', 'DAT': 'recording.dat', 'npy': 'recording.npy'}
READERS = {'faery': ('AEDAT4', 'EVT3', 'EVT2', 'DAT'), 'aedat': ('AEDAT4',),
           'expelliarmus': ('EVT3', 'EVT2', 'DAT'), 'prophesee': ('EVT3', 'EVT2', 'DAT'),
           'braintrace_conv': ('AEDAT4', 'EVT3', 'EVT2', 'DAT', 'npy')}
SILENCES_US = (1_000, 5_000, 100_000, 1_000_000, 8_500_000, 20_000_000)
SILENCE_EVERY = 100_000


def written_events(n: int, silences: bool = False) -> np.ndarray:
    import faery
    rng = np.random.default_rng(0)
    events = np.zeros(n, dtype=faery.EVENTS_DTYPE)
    events['t'] = 1_000_000 + np.cumsum(rng.integers(0, 3, n))
    if silences:
        pause = np.zeros(n, np.int64)
        after = pause[SILENCE_EVERY::SILENCE_EVERY]
        after[:] = np.resize(SILENCES_US, len(after))
        events['t'] += np.cumsum(pause).astype(np.uint64)
    events['x'] = rng.integers(0, SENSOR[0], n)
    events['y'] = rng.integers(0, SENSOR[1], n)
    events['on'] = rng.integers(0, 2, n).astype(bool)
    return events


def write_files(folder: str, n: int, silences: bool) -> None:
    import faery
    events = written_events(n, silences)
    blocks = lambda: (events[i:i + 65536] for i in range(0, n, 65536))
    faery.file_encoder.events_to_file(blocks(), os.path.join(folder, FORMATS['AEDAT4']),
                                      dimensions=SENSOR)
    for version in ('EVT3', 'EVT2', 'DAT'):
        faery.file_encoder.events_to_file(blocks(), os.path.join(folder, FORMATS[version]),
                                          dimensions=SENSOR, zero_t0=False,
                                          version='dat2' if version == 'DAT' else version.lower())
    from braintrace_conv.data import write_events
    ours = np.zeros(n, [('t', '<i8'), ('x', '<u2'), ('y', '<u2'), ('p', 'u1')])
    for field in ('t', 'x', 'y', 'p'):
        ours[field] = events[field]
    write_events(os.path.join(folder, FORMATS['npy']), ours)


def _packets(reader: str, path: str, fmt: str):
    if reader == 'faery':
        import faery
        yield from faery.file_decoder.Decoder(path)
    elif reader == 'braintrace_conv':
        from braintrace_conv.data import EventReader
        for _, events in EventReader(path).blocks():
            yield events
    elif reader == 'prophesee':
        from braintrace_conv.data import CAMERA_EVENT_DTYPE
        from braintrace_conv.data.files import prophesee
        header = prophesee.read_header(path)
        if fmt == 'DAT':           # version 2, after the event type and size bytes
            yield from prophesee.decode_dat(path, 2, data_offset=header.data_offset + 2,
                                            dtype=CAMERA_EVENT_DTYPE)
        else:
            yield from prophesee.decode(path, header.version, data_offset=header.data_offset,
                                        dtype=CAMERA_EVENT_DTYPE)
    elif reader == 'aedat':
        import aedat
        for packet in aedat.Decoder(path):
            if 'events' in packet:
                yield packet['events']
    else:
        import expelliarmus
        wizard = expelliarmus.Wizard(encoding=fmt.lower(), chunk_size=65536)
        wizard.set_file(path)
        yield from wizard.read_chunk()


def _memory(field: str) -> int:
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def _import(reader: str) -> None:
    """Import the reader's packages before timing (braintrace_conv imports faery lazily)."""
    modules = {'braintrace_conv': ('braintrace_conv.data', 'faery'),
               'prophesee': ('braintrace_conv.data',)}
    for module in modules.get(reader, (reader,)):
        __import__(module)


def child(reader: str, path: str, fmt: str, mode: str, n: int, silences: bool) -> dict:
    """Read ``path`` once: seconds (by the clock and of the process's CPU), bytes of peak
    memory above the process before the read (the kernel's high-water mark, reset after
    the imports) and, for ``array``, whether the events are exactly those written."""
    _import(reader)
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')                  # reset VmHWM to the current resident size
    start = _memory('VmRSS:')
    t0, cpu0 = time.perf_counter(), time.process_time()
    if mode == 'packets':
        count = 0
        for packet in _packets(reader, path, fmt):
            count += len(packet)
        events = None
    elif reader == 'braintrace_conv':
        from braintrace_conv.data import read_events
        events = read_events(path)
        events = np.asarray(events) if fmt != 'npy' else events
        count = len(events)
    else:
        events = np.concatenate(list(_packets(reader, path, fmt)))
        count = len(events)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    peak = _memory('VmHWM:') - start
    exact = None
    if events is not None:
        written = written_events(n, silences)
        exact = bool(len(events) == n and all(
            np.array_equal(events[f].astype(np.int64), written[f].astype(np.int64))
            for f in ('t', 'x', 'y', 'p')))
    return dict(events=count, seconds=seconds, cpu_seconds=cpu_seconds, peak_bytes=peak,
                exact=exact)


def run_child(*args) -> dict:
    proc = subprocess.run([sys.executable, __file__, '--child', *map(str, args)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--events', type=int, default=20_000_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--silences', action='store_true',
                        help='pause after every 100,000 events (module docstring)')
    parser.add_argument('--readers', nargs='+', choices=READERS, default=list(READERS),
                        help='the readers to run (default: all that are installed)')
    parser.add_argument('--formats', nargs='+', choices=FORMATS, default=list(FORMATS),
                        help='the formats to read (default: all)')
    parser.add_argument('--out', default=None)
    parser.add_argument('--child', nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        reader, path, fmt, mode, n, silences = args.child
        print(json.dumps(child(reader, path, fmt, mode, int(n), silences == '1')))
        return
    out = args.out or default_path('event_readers' + ('_silences' if args.silences else ''))
    with tempfile.TemporaryDirectory() as folder:
        write_files(folder, args.events, args.silences)
        sizes = {fmt: os.path.getsize(os.path.join(folder, name)) for fmt, name in FORMATS.items()}
        missing = [r for r in READERS if importlib.util.find_spec(
            'braintrace_conv' if r == 'prophesee' else r) is None]
        if missing:
            print(f'not installed, left out: {", ".join(missing)}', file=sys.stderr)
        cases = [(reader, fmt, mode) for reader, fmts in READERS.items() for fmt in fmts
                 for mode in ('packets', 'array')
                 if reader not in missing and reader in args.readers and fmt in args.formats]
        runs = {case: [] for case in cases}
        for _ in range(args.repeats):
            for reader, fmt, mode in cases:
                runs[reader, fmt, mode].append(run_child(
                    reader, os.path.join(folder, FORMATS[fmt]), fmt, mode, args.events,
                    int(args.silences)))
    rows = []
    for (reader, fmt, mode), results in runs.items():
        seconds = statistics.median(r['seconds'] for r in results)
        cpu_seconds = statistics.median(r['cpu_seconds'] for r in results)
        rows.append(dict(reader=reader, format=fmt, mode=mode, file_bytes=sizes[fmt],
                         events=results[0]['events'], seconds=seconds,
                         events_per_second=results[0]['events'] / seconds,
                         cpu_seconds=cpu_seconds,
                         events_per_cpu_second=results[0]['events'] / cpu_seconds,
                         peak_mib=statistics.median(r['peak_bytes'] for r in results) / 2**20,
                         exact=results[0]['exact']))
    silences = ', silences after every 100,000 events' if args.silences else ''
    with open('/proc/loadavg') as f:
        load = f.read().split()[:3]
    print(f'{args.events:,} events, 128 x 128{silences}, median of {args.repeats} rounds, '
          f'load average {" ".join(load)}\n')
    print('| format | reader | read | M events/s | M events/CPU s | peak memory (MiB) | '
          'events exact |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    for r in sorted(rows, key=lambda r: (r['format'], r['mode'], r['reader'])):
        exact = '' if r['exact'] is None else ('yes' if r['exact'] else '**no**')
        print(f"| {r['format']} ({r['file_bytes'] / 2**20:.0f} MiB) | {r['reader']} | "
              f"{r['mode']} | {r['events_per_second'] / 1e6:.1f} | "
              f"{r['events_per_cpu_second'] / 1e6:.1f} | {r['peak_mib']:.0f} | {exact} |")
    write_results(out, events=args.events, repeats=args.repeats, silences=args.silences,
                  load_average=load, rows=rows)


if __name__ == '__main__':
    main()
