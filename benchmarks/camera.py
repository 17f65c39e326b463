"""Learning from a real camera: can it keep up with the sensor?

The recording: the Prophesee EVK4 file of faery 0.7.1's tests (``evt3.raw``: EVT 3.0,
1280 x 720, 1,218,618 events over 10.77 s), fetched once from PyPI into a cache
(``tests/camera_files.py``). It is streamed (:class:`braintrace_conv.data.EventStream`, one
stream, chunks of ``--chunk`` steps) through ``Downsample(factor=1/8)`` to 160 x 90 frames
(``--transforms denoise`` puts ``Denoise(window_us=10_000)`` and
``RefractoryPeriod(period_us=1_000)`` at the camera's own pixels first), into the
DVS-sized net of the other benchmarks (``workloads.DvsChannelsFirst((90, 160))``: conv 5x5
stride 2 2->16, 3x3 16->32, 32->64, 64->64, LIF neurons of tau = 20 steps, average
pooling, dense 3200 -> 11), batch 1.

The recording has no labels, so the target is self-supervised: step ``k`` is labelled with
the activity of step ``k + 1``, the class ``min(10, floor(log2(1 + n)))`` of the number
``n`` of the camera's events in that step (all pixels, before the transforms): 11
classes, the net's output, cross-entropy at every step. Inference is the forward pass
(``BPTT.predict``, the scores read one chunk behind, as a live system would);
training is ``Trainer.fit_stream`` with ES-D-RTRL (decay ``exp(-1/20)``) and Adam, one
update per chunk, everything a run does but checkpoints.

Parts (each run in a fresh process, so that its peak RSS is its own):

* ``run``: per ``dt`` (1 and 10 ms) and mode (inference, training): the real-time factor
  (seconds of recording per second of wall time), steps/s, the camera's events/s and the
  peak RSS, after the first chunk (which compiles); the stream loops over the recording so
  that every chunk has the same shape.
* ``memory``: the stream alone at 160 x 90 and at 1280 x 720: a chunk's bytes, the peak
  of what Python allocates while it builds a chunk (``tracemalloc``), the peak RSS.
* ``profile``: where the time goes, seconds per second of recording: reading (decoding
  EVT 3.0 and checking every event), the transforms, binning (the rest of the stream) and
  the net (forward; ES-D-RTRL's advance and update) on chunks already in memory.

The machine is shared: every result records the load average at its start and end.

    python3 tests/camera_files.py                  # fetch the recordings once
    python3 benchmarks/camera.py                   # everything, tables and JSON
    python3 benchmarks/camera.py --parts run --dts 10
    python3 benchmarks/camera.py --table benchmarks/results/camera.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import tracemalloc

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'tests'))
from results_file import default_path, run_fresh, write_results  # noqa: E402

RECORDING = 'evt3.raw'
CAMERA = (1280, 720, 2)
CLASSES = 11
TAU_STEPS = 20.0
MIB = 2**20


# ----------------------------------------------------------------------------- the data
def recording() -> str:
    """The EVK4 recording, fetched once (``tests/camera_files.py``)."""
    from camera_files import fetch
    return str(fetch() / RECORDING)


def transforms(name: str) -> list:
    from braintrace_conv.data.transforms import Denoise, Downsample, RefractoryPeriod
    small = [Downsample(factor=1 / 8)]
    return small if name == 'downsample' else \
        [Denoise(window_us=10_000), RefractoryPeriod(period_us=1_000)] + small


def step_counts(path: str, dt_us: int) -> tuple:
    """``(events per step of dt_us from the first event, first timestamp)``: the camera's
    activity, before any transform."""
    from braintrace_conv.data import EventReader
    reader = EventReader(path)
    first, last = (int(t) for t in reader.time_range())
    counts = np.zeros((last - first) // dt_us + 1, np.int64)
    for _, events in reader.blocks():
        counts += np.bincount((events['t'] - first) // dt_us, minlength=len(counts))
    return counts, first


def activity_labels(counts: np.ndarray) -> np.ndarray:
    """Step ``k``'s label: the activity class of step ``k + 1`` (-1 for the last step)."""
    classes = np.minimum(CLASSES - 1, np.floor(np.log2(1 + counts))).astype(np.int64)
    return np.append(classes[1:], -1)


def make_stream(path: str, dt_us: int, chunk: int, transform_name: str | None,
                loop: bool = False, block_events: int | None = None):
    """``(the recording as one stream, its events per step)``; ``block_events=None``: the
    stream's default."""
    from braintrace_conv.data import EventStream, Recording
    counts, first = step_counts(path, dt_us)
    block = {} if block_events is None else dict(block_events=block_events)
    return EventStream([Recording(path, activity_labels(counts), t_start_us=first)],
                       sensor_size=CAMERA, dt_us=dt_us, chunk_steps=chunk,
                       num_classes=CLASSES, loop=loop, **block,
                       transforms=None if transform_name is None else transforms(transform_name)
                       ), counts


def make_model(frame_shape):
    from workloads import make_dvs_model
    return make_dvs_model('channels-first', in_hw=frame_shape[1:])


def _status() -> dict:
    fields = {}
    with open('/proc/self/status') as f:
        for line in f:
            key, _, value = line.partition(':')
            if key in ('VmRSS', 'VmHWM'):
                fields[key] = int(value.split()[0]) * 1024 / MIB
    return fields


def _load() -> list:
    return [round(v, 2) for v in os.getloadavg()]


# ----------------------------------------------------------------------------- one run
def run(path: str, dt_us: int, mode: str, chunk: int, transform_name: str,
        block_events: int) -> dict:
    """The real-time factor of ``mode`` ('inference' or 'training') at ``dt_us``."""
    import optax
    import braintrace_conv as bc
    from braintrace_conv.training import Trainer
    load_start = _load()
    stream, counts = make_stream(path, dt_us, chunk, transform_name, loop=True,
                                 block_events=block_events)
    steps_in_recording = len(counts)
    chunks = math.ceil(steps_in_recording / chunk) + 1      # the first one compiles
    model = make_model(stream.frame_shape)
    before = _status()['VmRSS']
    if mode == 'inference':
        predictor = bc.BPTT(model)
        iterator = iter(stream)
        xs, _ = next(iterator)
        np.asarray(predictor.predict(xs, reset=True))       # compiles
        start, pending = time.perf_counter(), None
        for _ in range(chunks - 1):
            xs, _ = next(iterator)
            outputs = predictor.predict(xs, reset=False)
            if pending is not None:
                np.asarray(pending)                         # read one chunk behind
            pending = outputs
        np.asarray(pending)
        seconds = time.perf_counter() - start
    else:
        import csv
        trainer = Trainer(bc.ES_D_RTRL(model, math.exp(-1 / TAU_STEPS)), optax.adam(1e-3))
        with tempfile.TemporaryDirectory() as out:
            trainer.fit_stream(stream, max_steps=chunks * chunk, out_dir=out, log_every=1,
                               progress=False)
            with open(os.path.join(out, 'scalars.csv'), newline='') as f:
                rows = [float(r['time_s']) for r in csv.DictReader(f)]
        seconds = rows[-1] - rows[0]                        # after the first chunk
    timed_steps = (chunks - 1) * chunk
    played = np.arange(chunk, chunks * chunk) % steps_in_recording
    events = int(counts[played].sum())
    return dict(mode=mode, dt_ms=dt_us / 1000, chunk=chunk, transforms=transform_name,
                frame_shape=list(stream.frame_shape), timed_steps=timed_steps,
                seconds=seconds, real_time_factor=timed_steps * dt_us / 1e6 / seconds,
                steps_per_s=timed_steps / seconds, events_per_s=events / seconds,
                rss_before_mib=before, peak_rss_mib=_status()['VmHWM'],
                load_average_start=load_start, load_average=_load())


# ----------------------------------------------------------------------------- memory
def memory(path: str, dt_us: int, chunk: int, transform_name: str | None,
           block_events: int) -> dict:
    """The stream alone: a chunk's bytes, the largest Python allocation while a chunk is
    built, and the process's peak RSS."""
    load_start = _load()
    stream, counts = make_stream(path, dt_us, chunk, transform_name, block_events=block_events)
    before = _status()['VmRSS']
    iterator = iter(stream)
    chunk_bytes, peaks = 0, []
    for i, (frames, (labels, weights)) in enumerate(iterator):
        chunk_bytes = max(chunk_bytes, frames.nbytes + labels.nbytes + weights.nbytes)
        if i == 4:
            break
    for _ in range(5):       # after the first chunks: steady state, tracemalloc is slow
        tracemalloc.start()
        frames, (labels, weights) = next(iterator)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        del frames, labels, weights
    for _ in iterator:
        pass
    frame_bytes = 4 * int(np.prod(stream.frame_shape)) * chunk
    return dict(dt_ms=dt_us / 1000, chunk=chunk, transforms=transform_name,
                block_events=stream._block, frame_shape=list(stream.frame_shape),
                frames_mib=frame_bytes / MIB, chunk_mib=chunk_bytes / MIB,
                traced_peak_mib=max(peaks) / MIB,
                traced_peak_over_chunk=max(peaks) / chunk_bytes,
                rss_before_mib=before, peak_rss_mib=_status()['VmHWM'],
                load_average_start=load_start, load_average=_load())


# ----------------------------------------------------------------------------- profile
def profile(path: str, dt_us: int, chunk: int, transform_name: str, block_events: int,
            compute_chunks: int) -> dict:
    """Seconds per second of recording in reading, the transforms, binning and the net."""
    import jax
    import optax
    import braintrace_conv as bc
    from braintrace_conv.data import EventReader
    from braintrace_conv.training import Trainer
    from braintrace_conv.training.stream import _step_loss
    load_start = _load()
    stream, _ = make_stream(path, dt_us, chunk, transform_name, block_events=block_events)
    reader = EventReader(path, sensor_size=CAMERA, block_events=stream._block)
    first, last = (int(t) for t in reader.time_range())
    duration = (last - first) / 1e6

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def read():
        for _ in reader.blocks():
            pass

    def read_and_transform():
        bound = bc.data.transforms.compose(transforms(transform_name)).bind(CAMERA)
        for _, events in reader.blocks():
            bound(events)

    seconds = dict(read=timed(read), read_and_transform=timed(read_and_transform),
                   stream=timed(lambda: [None for _ in stream]))
    stream.seek(None)
    chunks = iter(stream)
    held = [next(chunks) for _ in range(compute_chunks)]
    model = make_model(stream.frame_shape)
    predictor = bc.BPTT(model)
    np.asarray(predictor.predict(held[0][0], reset=True))
    start = time.perf_counter()
    for xs, _ in held:
        np.asarray(predictor.predict(xs, reset=False))
    forward = (time.perf_counter() - start) / (compute_chunks * chunk)
    trainer = Trainer(bc.ES_D_RTRL(model, math.exp(-1 / TAU_STEPS)), optax.adam(1e-3))
    learner = trainer.learner
    learner.reset(1)
    update = jax.jit(lambda grads, state, params: trainer._candidate_update(
        grads, state, params, 0.0)[:2])

    def learn(xs, targets):
        _, grads = learner.advance(_step_loss, xs, targets, check_finite=False)
        params, state = update(trainer._view.grad_mantissas(grads), trainer.opt_state,
                               trainer._view.mantissas())
        trainer._view.assign(params)
        trainer.opt_state = state
        jax.block_until_ready(params)

    learn(*held[0])
    start = time.perf_counter()
    for xs, targets in held:
        learn(xs, targets)
    training = (time.perf_counter() - start) / (compute_chunks * chunk)
    steps_per_s = 1e6 / dt_us
    return dict(dt_ms=dt_us / 1000, chunk=chunk, transforms=transform_name,
                block_events=stream._block, recording_s=duration,
                reading=seconds['read'] / duration,
                transforms_=(seconds['read_and_transform'] - seconds['read']) / duration,
                binning=(seconds['stream'] - seconds['read_and_transform']) / duration,
                forward=forward * steps_per_s, es_d_rtrl=training * steps_per_s,
                compute_chunks=compute_chunks, load_average_start=load_start,
                load_average=_load())


# ----------------------------------------------------------------------------- driver
def tables(content: dict) -> str:
    """Markdown tables of a results file's content."""
    out = []
    runs = content.get('run', [])
    if runs:
        out += ['| mode | dt | frames | real-time factor | steps/s | camera events/s | '
                'peak RSS MiB | load avg. (start, end) |',
                '|---|---:|---|---:|---:|---:|---:|---|']
        for r in runs:
            out.append(f"| {r['mode']} | {r['dt_ms']:g} ms | {'x'.join(map(str, r['frame_shape']))} | "
                       f"{r['real_time_factor']:.2f}x | {r['steps_per_s']:,.0f} | "
                       f"{r['events_per_s']:,.0f} | {r['peak_rss_mib']:,.0f} | "
                       f"{r['load_average_start'][0]:.1f}, {r['load_average'][0]:.1f} |")
    memories = content.get('memory', [])
    if memories:
        out += ['', '| frames | transforms | chunk MiB | Python peak while building a chunk '
                    'MiB | ratio | peak RSS MiB | RSS before MiB | load avg. |',
                '|---|---|---:|---:|---:|---:|---:|---|']
        for m in memories:
            out.append(f"| {'x'.join(map(str, m['frame_shape']))} | {m['transforms'] or 'none'} | "
                       f"{m['chunk_mib']:,.2f} | {m['traced_peak_mib']:,.2f} | "
                       f"{m['traced_peak_over_chunk']:.2f} | {m['peak_rss_mib']:,.0f} | "
                       f"{m['rss_before_mib']:,.0f} | {m['load_average'][0]:.1f} |")
    profiles = content.get('profile', [])
    if profiles:
        out += ['', '| dt | reading | transforms | binning | forward | ES-D-RTRL advance + '
                    'update | load avg. |', '|---:|---:|---:|---:|---:|---:|---|']
        for p in profiles:
            out.append(f"| {p['dt_ms']:g} ms | {p['reading']:.3f} | {p['transforms_']:.3f} | "
                       f"{p['binning']:.3f} | {p['forward']:.3f} | {p['es_d_rtrl']:.3f} | "
                       f"{p['load_average'][0]:.1f} |")
    return '\n'.join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--parts', nargs='+', choices=('run', 'memory', 'profile'),
                        default=['run', 'memory', 'profile'])
    parser.add_argument('--dts', type=int, nargs='+', default=[1, 10], metavar='MS',
                        help='step lengths, milliseconds (default 1 10)')
    parser.add_argument('--modes', nargs='+', choices=('inference', 'training'),
                        default=['inference', 'training'])
    parser.add_argument('--chunk', type=int, default=50, help='steps per chunk (update)')
    parser.add_argument('--transforms', choices=('downsample', 'denoise'), default='downsample')
    parser.add_argument('--block-events', type=int,
                        help="events read from the file at a time (default: EventStream's)")
    parser.add_argument('--compute-chunks', type=int, default=10,
                        help='profile: chunks held in memory to time the net on')
    parser.add_argument('--json', help='results file (default benchmarks/results/camera.json)')
    parser.add_argument('--table', metavar='JSON', help='print the tables of a results file')
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(tables(json.load(f)))
        return 0
    path = recording()
    if args.child:
        part, *rest = args.child.split(':')
        dt_us = int(rest[0]) * 1000
        if part == 'run':
            result = run(path, dt_us, rest[1], args.chunk, args.transforms, args.block_events)
        elif part == 'memory':
            result = memory(path, dt_us, args.chunk, None if rest[1] == 'none' else rest[1],
                            args.block_events)
        else:
            result = profile(path, dt_us, args.chunk, args.transforms, args.block_events,
                             args.compute_chunks)
        print(json.dumps(result))
        return 0
    common = ['--chunk', str(args.chunk), '--transforms', args.transforms, '--compute-chunks',
              str(args.compute_chunks)]
    if args.block_events is not None:
        common += ['--block-events', str(args.block_events)]
    results = {part: [] for part in args.parts}
    for dt in args.dts:
        for part in args.parts:
            jobs = ([f'run:{dt}:{mode}' for mode in args.modes] if part == 'run' else
                    [f'memory:{dt}:{args.transforms}', f'memory:{dt}:none'] if part == 'memory'
                    else [f'profile:{dt}'])
            for job in jobs:
                if part == 'memory' and dt != args.dts[-1]:
                    continue                     # the stream's memory hardly depends on dt
                results[part].append(run_fresh(__file__, [*common, '--child', job]))
                print(json.dumps(results[part][-1]), file=sys.stderr)
    out = args.json or default_path('camera')
    write_results(out, recording=dict(file=RECORDING, sensor=list(CAMERA)),
                  chunk=args.chunk, transforms=args.transforms, **results,
                  machine=dict(load_average=_load()))
    with open(out) as f:
        print(tables(json.load(f)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
