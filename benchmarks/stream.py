"""Learning on a stream: peak memory, steps/s and events/s against the stream's length T.

Every executor learns from a generated gesture recording
(:func:`braintrace_conv.data.gesture_recordings`, 1 ms steps) played as one stream
(``Trainer.fit_stream``: one update per chunk, state carried across chunks), for ``--steps``
T steps, in a fresh process per executor, so that the process's peak memory is that of
one run. Workloads (``benchmarks/workloads.py``):

* ``standard``: the standard workload's net (``standard_benchmark_snn``: 3x3 conv 2->8 +
  LIF, 3x3 conv stride 2 8->16 + LIF, dense 4096->10) on a 32x32 camera;
* ``dvs``: the DVS-Gesture-sized net (four conv+LIF layers 16-32-64-64, 11 classes) on a
  64x64 camera.

Per executor it records the peak resident memory of the process (``VmHWM``), the peaks
of its anonymous and file-backed parts (sampled every 20 ms: a ``.npy`` recording is
memory-mapped, and the pages of the file it has read count as resident until the system
reclaims them), the resident memory before the stream starts, and steps/s and events/s
after the first chunk (which compiles). BPTT cannot learn from a stream without cutting
its gradient (that is truncated BPTT), so it is measured as the whole-sequence gradient of
the same T frames held in memory where that fits in ``--bptt-budget-gib``; its memory is
otherwise predicted from XLA's memory analysis of the compiled sequence at two shorter
lengths (a line through them), which also gives the T at which it passes 24 GiB.

    python3 benchmarks/stream.py --steps 1000 --json benchmarks/results/stream-1e3.json
    python3 benchmarks/stream.py --steps 100000 --workload dvs --json dvs-1e5.json
    python3 benchmarks/stream.py --part overhead --chunks 32 100   # stream vs in memory
    python3 benchmarks/stream.py --table benchmarks/results/stream-*.json

``--part overhead`` compares, in one process with interleaved rounds, the steps/s of
``fit_stream`` (reading, binning, advancing, updating, counting metrics) with those of
``value_and_grad`` over the same frames already in memory, per chunk length.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, run_fresh, write_results  # noqa: E402

ONLINE = ('es-d-rtrl', 'd-rtrl')
#: Camera size, classes and membrane time constant (ms) of each workload's net.
WORKLOADS = {'standard': dict(size=32, classes=10, tau=10.0),
             'dvs': dict(size=64, classes=11, tau=20.0)}
DT_US = 1000
MIB, GIB = 2**20, 2**30


# ----------------------------------------------------------------------------- data and nets
def recording(workload: str, seconds: int, data_dir: str, fmt: str = 'npy') -> str:
    """The event file of a gesture recording of ``seconds`` seconds for ``workload``'s
    camera, its segments beside it (generated once into ``data_dir``)."""
    from braintrace_conv.data import gesture_recordings
    size = WORKLOADS[workload]['size']
    folder = os.path.join(data_dir, f'{workload}-{seconds}s')
    events = os.path.join(folder, 'user01_synthetic' + {'npy': '.npy', 'aedat4': '.aedat4'}[fmt])
    if not os.path.exists(events):
        gesture_recordings(folder, 1, duration_s=seconds, size=(size, size), formats=(fmt,),
                           seed=0)
    return events


def stream(workload: str, events: str, chunk: int, batch: int):
    """The recording ``events`` as ``batch`` parallel streams of chunks of ``chunk`` steps."""
    from braintrace_conv.data import EventStream, find_recordings
    size = WORKLOADS[workload]['size']
    recordings = find_recordings(os.path.dirname(events), suffix=os.path.splitext(events)[1])
    return EventStream(recordings, sensor_size=(size, size, 2), dt_us=DT_US, chunk_steps=chunk,
                       num_classes=WORKLOADS[workload]['classes'],
                       batch_size=None if batch == 1 else batch)


def model(workload: str):
    from braintrace_conv.models import standard_benchmark_snn
    from workloads import make_dvs_model
    return standard_benchmark_snn() if workload == 'standard' else make_dvs_model()


def learner(algorithm: str, workload: str):
    """The executor of ``algorithm`` on a new net of ``workload`` (ES-D-RTRL's decay that of
    its neurons)."""
    import braintrace_conv as bc
    net = model(workload)
    if algorithm == 'bptt':
        return bc.BPTT(net)
    if algorithm == 'd-rtrl':
        return bc.D_RTRL(net)
    return bc.ES_D_RTRL(net, math.exp(-1 / WORKLOADS[workload]['tau']))


# ----------------------------------------------------------------------------- memory
def _status() -> dict:
    """``VmRSS``, ``RssAnon``, ``RssFile`` and ``VmHWM`` of this process, bytes."""
    fields = {}
    with open('/proc/self/status') as f:
        for line in f:
            key, _, value = line.partition(':')
            if key in ('VmRSS', 'RssAnon', 'RssFile', 'VmHWM'):
                fields[key] = int(value.split()[0]) * 1024
    return fields


class Sampler(threading.Thread):
    """The largest anonymous and file-backed resident memory seen, every 20 ms."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = dict(RssAnon=0, RssFile=0)
        self.running = True

    def run(self):
        while self.running:
            now = _status()
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now.get(key, 0))
            time.sleep(0.02)

    def stop(self) -> dict:
        self.running = False
        self.join()
        self.run_once()
        return {k: v / MIB for k, v in self.peak.items()}

    def run_once(self):
        now = _status()
        for key in self.peak:
            self.peak[key] = max(self.peak[key], now.get(key, 0))


# ----------------------------------------------------------------------------- one run
def online_run(workload: str, algorithm: str, steps: int, chunk: int, batch: int,
               events: str) -> dict:
    """``fit_stream`` over ``steps`` steps: memory and rates (this process)."""
    import optax
    from braintrace_conv.training import Trainer
    trainer = Trainer(learner(algorithm, workload), optax.adam(1e-3))
    source = stream(workload, events, chunk, batch)
    before = _status()
    sampler = Sampler()
    sampler.start()
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = trainer.fit_stream(source, max_steps=steps, out_dir=out, log_every=1,
                                    progress=False)
        wall = time.perf_counter() - start
        with open(os.path.join(out, 'scalars.csv'), newline='') as f:
            rows = [{k: float(row[k]) for k in ('step', 'events_per_s', 'time_s')}
                    for row in csv.DictReader(f)]
    peaks = sampler.stop()
    after = _status()
    timed = rows[1:]                 # after the first chunk, which compiles
    seconds = timed[-1]['time_s'] - rows[0]['time_s'] if timed else float('nan')
    events = sum(r['events_per_s'] * (r['time_s'] - p['time_s'])
                 for p, r in zip(rows, timed))
    played = (timed[-1]['step'] - rows[0]['step']) * batch if timed else 0
    return dict(algorithm=algorithm, steps=result['steps'], batch=batch, chunk=chunk,
                wall_s=wall, steps_per_s=(timed[-1]['step'] - rows[0]['step']) / seconds,
                stream_steps_per_s=played / seconds, events_per_s=events / seconds,
                events=result['events'], first_chunk_s=rows[0]['time_s'],
                rss_before_mib=before['VmRSS'] / MIB, peak_rss_mib=after['VmHWM'] / MIB,
                peak_anon_mib=peaks['RssAnon'], peak_file_mib=peaks['RssFile'],
                report_trace_mib=trainer.learner.report().trace_bytes / MIB)


def _frames(workload: str, steps: int, batch: int, events: str):
    """The first ``steps`` steps of the stream in memory: ``(xs, (labels, weights))``."""
    parts = []
    for xs, (labels, weights) in stream(workload, events, 100, batch):
        parts.append((xs, labels, weights))
        if sum(len(p[0]) for p in parts) >= steps:
            break
    xs, labels, weights = (np.concatenate(a)[:steps] for a in zip(*parts))
    return xs, (labels, weights)


def _bptt_memory(workload: str, steps: int, batch: int, events: str) -> int:
    """XLA's total (arguments, outputs, temporaries) of BPTT's compiled sequence, bytes."""
    from braintrace_conv.training.stream import _step_loss
    xs, targets = _frames(workload, steps, batch, events)
    memory = learner('bptt', workload).lower(_step_loss, xs, targets).compile() \
        .memory_analysis()
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes)


def bptt_run(workload: str, steps: int, batch: int, events: str) -> dict:
    """The whole-sequence BPTT gradient of the stream's first ``steps`` frames in memory."""
    import jax
    from braintrace_conv.training.stream import _step_loss
    xs, targets = _frames(workload, steps, batch, events)
    bptt = learner('bptt', workload)
    sampler = Sampler()
    sampler.start()
    start = time.perf_counter()
    jax.block_until_ready(bptt.value_and_grad(_step_loss, xs, targets))
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(bptt.value_and_grad(_step_loss, xs, targets))
    seconds = time.perf_counter() - start
    peaks = sampler.stop()
    return dict(algorithm='bptt', steps=steps, batch=batch, wall_s=first + seconds,
                steps_per_s=steps / seconds, events_per_s=float(np.sum(xs)) / seconds,
                peak_rss_mib=_status()['VmHWM'] / MIB, peak_anon_mib=peaks['RssAnon'],
                peak_file_mib=peaks['RssFile'], measured=True)


def bptt_prediction(workload: str, steps: int, batch: int, events: str,
                    budget_gib: float) -> dict:
    """BPTT's XLA memory at T = 200 and 400, the line through them, the prediction at
    ``steps`` and the T at which it passes ``budget_gib``."""
    lengths = (200, 400)
    totals = [_bptt_memory(workload, t, batch, events) for t in lengths]
    slope = (totals[1] - totals[0]) / (lengths[1] - lengths[0])
    base = totals[0] - slope * lengths[0]
    return dict(algorithm='bptt', steps=steps, batch=batch, measured=False,
                xla_mib_at=dict(zip(map(str, lengths), [t / MIB for t in totals])),
                xla_mib_per_step=slope / MIB, predicted_mib=(base + slope * steps) / MIB,
                passes_budget_at=math.ceil((budget_gib * GIB - base) / slope),
                budget_gib=budget_gib)


# ----------------------------------------------------------------------------- overhead
def overhead(workload: str, algorithm: str, chunks, steps: int, batch: int, rounds: int,
             events: str) -> list:
    """Steps/s of ``fit_stream`` at each chunk length against ``value_and_grad`` over the
    same frames in memory: interleaved rounds in this process, medians."""
    import jax
    import optax
    from braintrace_conv.training import Trainer
    from braintrace_conv.training.stream import _step_loss
    from timing import interleaved
    xs, targets = _frames(workload, steps, batch, events)
    reference = learner(algorithm, workload)
    calls = {'in memory': lambda: jax.block_until_ready(
        reference.value_and_grad(_step_loss, xs, targets))}
    for chunk in chunks:
        trainer = Trainer(learner(algorithm, workload), optax.adam(1e-3))
        source = stream(workload, events, chunk, batch)
        calls[f'stream, chunks of {chunk}'] = (
            lambda t=trainer, s=source: t.fit_stream(s, max_steps=steps, progress=False))
    for call in calls.values():     # compile
        call()
    times = interleaved(calls, rounds)
    memory = steps / float(np.median(times['in memory']))
    return [dict(algorithm=algorithm, workload=workload, how=name, steps=steps, batch=batch,
                 steps_per_s=steps / float(np.median(t)),
                 vs_in_memory=steps / float(np.median(t)) / memory,
                 seconds=[round(s, 4) for s in t])
            for name, t in times.items()]


# ----------------------------------------------------------------------------- driver
def table(paths) -> str:
    """A Markdown table of the results files ``paths``."""
    rows = []
    for path in paths:
        with open(path) as f:
            content = json.load(f)
        for r in content.get('results', []):
            rows.append((content['workload'], r))
    lines = ['| workload | algorithm | B | T | peak RSS MiB | anon. peak MiB | file peak MiB | '
             'RSS before MiB | steps/s | events/s | run s |',
             '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
    for workload, r in sorted(rows, key=lambda x: (x[0], x[1]['algorithm'], x[1]['steps'])):
        if r.get('measured') is False:
            lines.append(f"| {workload} | bptt | {r['batch']} | {r['steps']:,} | "
                         f"{r['predicted_mib']:,.0f} (XLA, predicted) | | | | | | |")
            continue
        before = f"{r['rss_before_mib']:,.0f}" if 'rss_before_mib' in r else ''
        lines.append(f"| {workload} | {r['algorithm']} | {r['batch']} | {r['steps']:,} | "
                     f"{r['peak_rss_mib']:,.0f} | {r['peak_anon_mib']:,.0f} | "
                     f"{r['peak_file_mib']:,.0f} | {before} | {r['steps_per_s']:,.0f} | "
                     f"{r['events_per_s']:,.0f} | {r['wall_s']:,.0f} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=1000, help='stream length T (steps)')
    parser.add_argument('--workload', choices=tuple(WORKLOADS), default='standard')
    parser.add_argument('--algorithms', nargs='+', default=[*ONLINE, 'bptt'],
                        choices=(*ONLINE, 'bptt'))
    parser.add_argument('--batch', type=int, default=1, help='parallel streams B')
    parser.add_argument('--chunk', type=int, default=100, help='steps per chunk (update)')
    parser.add_argument('--format', choices=('npy', 'aedat4'), default='npy',
                        help='file format of the recording')
    parser.add_argument('--recording-s', type=int,
                        help='length of the generated recording, s (default: T steps and 2 s, '
                             'at least 10 s); runs of several T may share one')
    parser.add_argument('--events', help=argparse.SUPPRESS)
    parser.add_argument('--bptt-budget-gib', type=float, default=6.0,
                        help='run BPTT only where XLA predicts at most this (default 6)')
    parser.add_argument('--data', default=os.path.join(os.path.dirname(default_path('x')),
                                                       'stream-data'),
                        help='where generated recordings are kept')
    parser.add_argument('--part', choices=('memory', 'overhead'), default='memory')
    parser.add_argument('--chunks', type=int, nargs='+', default=[32, 100],
                        help='--part overhead: chunk lengths')
    parser.add_argument('--rounds', type=int, default=5, help='--part overhead: rounds')
    parser.add_argument('--json', help='results file (default benchmarks/results/stream.json)')
    parser.add_argument('--table', nargs='+', metavar='JSON', help='print the table of files')
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(sorted(p for pattern in args.table for p in glob.glob(pattern))))
        return 0
    if args.child:
        what, algorithm = args.child.split(':')
        result = (online_run(args.workload, algorithm, args.steps, args.chunk, args.batch,
                             args.events) if what == 'online' else
                  bptt_run(args.workload, args.steps, args.batch, args.events) if what == 'bptt'
                  else bptt_prediction(args.workload, args.steps, args.batch, args.events, 24.0))
        result['load_average'] = [round(v, 2) for v in os.getloadavg()]
        print(json.dumps(result))
        return 0
    seconds = args.recording_s or max(10, math.ceil(args.steps * DT_US / 1e6) + 2)
    events = recording(args.workload, seconds, args.data, args.format)       # generated once
    common = ['--workload', args.workload, '--steps', str(args.steps), '--batch',
              str(args.batch), '--events', events]
    if args.part == 'overhead':
        results = [r for algorithm in args.algorithms if algorithm in ONLINE
                   for r in overhead(args.workload, algorithm, args.chunks, args.steps,
                                     args.batch, args.rounds, events)]
        for r in results:
            print(f"{r['algorithm']:10s} {r['how']:22s} {r['steps_per_s']:8.0f} steps/s "
                  f"({r['vs_in_memory']:.2f}x in memory)")
    else:
        results = []
        for algorithm in args.algorithms:
            if algorithm in ONLINE:
                results.append(run_fresh(__file__, [*common, '--chunk', str(args.chunk),
                                                    '--child', f'online:{algorithm}']))
                continue
            predicted = run_fresh(__file__, [*common, '--child', 'predict:bptt'])
            results.append(predicted)
            if predicted['predicted_mib'] <= args.bptt_budget_gib * 1024:
                results.append(run_fresh(__file__, [*common, '--child', 'bptt:bptt']))
            print(json.dumps(results[-1]), file=sys.stderr)
    from braintrace_conv._memory import peak_rss_mib
    load = os.getloadavg()
    write_results(args.json or default_path('stream'), workload=args.workload,
                  steps=args.steps, part=args.part, recording=events, results=results,
                  machine=dict(load_average=[round(v, 2) for v in load],
                               peak_rss_parent_mib=peak_rss_mib()))
    if args.part == 'memory':
        print(table([args.json or default_path('stream')]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
