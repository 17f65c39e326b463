"""D-RTRL against its memory-bandwidth floor, per conv layer and in total.

D-RTRL keeps an exact, position-resolved trace per conv kernel and streams it
through memory every step: the update reads and writes it, the contraction with
the learning signal reads it again, so a step cannot take less than

    floor = trace bytes x passes / bandwidth        (passes = 3)

The bandwidth is measured here, with a STREAM-like triad ``a = b + s c`` (jitted,
median of ``--triad-repeats``; the bytes counted are two reads and one write) whose
arrays are each as large as the workload's traces, so that it sees the same level
of the memory hierarchy: a small net's traces stay in the last-level cache, the
DVS-sized net's stream from DRAM. The triad over 128 MiB arrays is printed too. For each workload one process
compiles BPTT, D-RTRL, and D-RTRL with one conv layer's parameters frozen
(turned into constants, so that layer keeps no trace), and times them in
interleaved rounds; BPTT is also timed alone, in a process of its own, because next to
D-RTRL's traces it runs slower (the two ratios are printed). A layer's measured cost is D-RTRL's step time minus the step
time with that layer frozen; its floor comes from its trace bytes
(``report()``).

Workloads: the DVS-Gesture-sized net in both layouts (``workloads.make_dvs_model``:
this library's channels-first layers, and ``brainstate.nn`` channels-last layers
with reset-after-spike LIFs) and the standard two-layer workload in both neuron
styles (``workloads.make_model``).

    python benchmarks/d_rtrl_floor.py                          # all four, T = 16 (DVS) / 100
    python benchmarks/d_rtrl_floor.py --workloads standard-ours --repeats 3

Prints Markdown tables and writes JSON (default benchmarks/results/d_rtrl_floor.json).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from timing import interleaved  # noqa: E402

WORKLOADS = ('dvs-channels-first', 'dvs-channels-last', 'standard-ours', 'standard-reset')
PASSES = 3


def triad_bandwidth(n: int = 2**25, repeats: int = 10) -> float:
    """Bytes per second of ``a = b + s c`` over float32 arrays of ``n`` elements.

    ``a`` reuses ``b``'s buffer (donated), as STREAM reuses its arrays: a fresh
    output buffer every call would time the kernel's page faults, not the memory."""
    import jax
    import jax.numpy as jnp

    a = jnp.arange(n, dtype=jnp.float32)
    c = jnp.ones(n, jnp.float32)
    triad = jax.jit(lambda b, c: b + 3.0 * c, donate_argnums=0)
    a = jax.block_until_ready(triad(a, c))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a = jax.block_until_ready(triad(a, c))
        times.append(time.perf_counter() - start)
    return 3 * n * 4 / float(np.median(times))


def _workload(name: str, T: int | None):
    from workloads import make_data, make_dvs_data, make_dvs_model, make_model
    if name.startswith('dvs-'):
        layout = name[len('dvs-'):]
        T = T or 16
        return make_dvs_model, layout, make_dvs_data(layout, T), T
    style = {'standard-ours': 'ours', 'standard-reset': 'reset-after-spike'}[name]
    T = T or 100
    return make_model, style, make_data(style, T), T


def measure(name: str, T: int | None, repeats: int, triad_repeats: int) -> dict:
    import brainstate
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy

    make, arg, (xs, labels), T = _workload(name, T)
    traced = bc.D_RTRL(make(arg))
    traced.value_and_grad(cross_entropy, xs, labels)
    layers = {}                                   # ParamState key -> trace bytes
    for row in traced.report().rows:
        if 'D-RTRL' in row['method'] or 'exact within its layer' in row['method']:
            key = row['parameter'].split('[')[0]
            layers[key] = layers.get(key, 0) + row['trace_bytes']
    learners = {'bptt': bc.BPTT(make(arg)), 'd-rtrl': bc.D_RTRL(make(arg))}
    for key in layers:
        model = make(arg)
        found = dict((('.'.join(map(str, k)) if isinstance(k, tuple) else str(k)), (k, st))
                     for k, st in model.states(brainstate.ParamState).items())
        path, state = found[key]
        owner = model
        for part in path[:-1]:          # attribute names, or indices into layer lists
            owner = owner[part] if isinstance(part, int) else getattr(owner, part)
        setattr(owner, path[-1], brainstate.State(state.value))   # a constant: no trace
        learners[f'd-rtrl without {key}'] = bc.D_RTRL(model)
    for learner in learners.values():                              # compile and warm up
        jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels))
    times = interleaved({key: (lambda l=learner: jax.block_until_ready(
        l.value_and_grad(cross_entropy, xs, labels))) for key, learner in learners.items()},
        repeats)
    per_step = {k: float(np.median(v)) / T for k, v in times.items()}
    bptt_alone = _bptt_alone(name, T, repeats)
    bandwidth = triad_bandwidth(max(sum(layers.values()) // 4, 2**16), triad_repeats)
    rows = [dict(layer=key, trace_mib=b / 2**20, floor_ms=1e3 * b * PASSES / bandwidth,
                 measured_ms=1e3 * (per_step['d-rtrl'] - per_step[f'd-rtrl without {key}']))
            for key, b in layers.items()]
    total = sum(layers.values())
    return dict(workload=name, T=T, bandwidth=bandwidth, bptt_ms=1e3 * per_step['bptt'],
                bptt_alone_ms=1e3 * bptt_alone,
                d_rtrl_ms=1e3 * per_step['d-rtrl'], trace_mib=total / 2**20,
                floor_ms=1e3 * total * PASSES / bandwidth, layers=rows)


def _bptt_alone(name: str, T: int, repeats: int) -> float:
    """Seconds per step of BPTT timed in a process of its own, where no D-RTRL learner
    (and none of its traces) shares the caches, the memory or the allocator."""
    import subprocess
    out = subprocess.run([sys.executable, os.path.abspath(__file__), '--bptt-only', name,
                          '--T', str(T), '--repeats', str(repeats)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def bptt_only(name: str, T: int | None, repeats: int) -> float:
    """Median seconds per step of BPTT alone on workload ``name`` (``--bptt-only``)."""
    import brainstate
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy

    make, arg, (xs, labels), T = _workload(name, T)
    brainstate.random.seed(0)
    learner = bc.BPTT(make(arg))
    run = lambda: jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels))
    run()
    return float(np.median(interleaved({'bptt': run}, repeats)['bptt'])) / T


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workloads', nargs='+', choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument('--T', type=int, default=None,
                        help='sequence length (default 16 for the DVS net, 100 otherwise)')
    parser.add_argument('--repeats', type=int, default=5, help='interleaved timed rounds')
    parser.add_argument('--triad-repeats', type=int, default=10)
    parser.add_argument('--out', default=default_path('d_rtrl_floor'))
    parser.add_argument('--bptt-only', choices=WORKLOADS, default=None,
                        help='time BPTT alone on one workload and print its seconds per step '
                             '(what the main run does in a process of its own)')
    args = parser.parse_args(argv)
    if args.bptt_only:
        print(bptt_only(args.bptt_only, args.T, args.repeats))
        return 0
    if (args.T is not None and args.T <= 0) or args.repeats <= 0 or args.triad_repeats <= 0:
        parser.error('--T, --repeats and --triad-repeats must be positive')
    dram = triad_bandwidth(repeats=args.triad_repeats)
    print(f'triad over 128 MiB arrays: {dram / 1e9:.1f} GB/s; floor = trace bytes x {PASSES} '
          f'/ triad bandwidth at the traces\' size\n')
    results = []
    for name in args.workloads:
        res = measure(name, args.T, args.repeats, args.triad_repeats)
        results.append(res)
        print(f"  {name}: D-RTRL {res['d_rtrl_ms']:.1f} ms/step, floor {res['floor_ms']:.1f}",
              file=sys.stderr, flush=True)
    print('| workload | T | trace MiB | triad GB/s | floor ms / step | D-RTRL ms / step | '
          'x floor | BPTT ms / step, interleaved | alone | D-RTRL / BPTT, interleaved | alone |')
    print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in results:
        print(f"| {r['workload']} | {r['T']} | {r['trace_mib']:.1f} | {r['bandwidth'] / 1e9:.1f} | "
              f"{r['floor_ms']:.2f} | "
              f"{r['d_rtrl_ms']:.2f} | {r['d_rtrl_ms'] / r['floor_ms']:.1f} | "
              f"{r['bptt_ms']:.2f} | {r['bptt_alone_ms']:.2f} | "
              f"{r['d_rtrl_ms'] / r['bptt_ms']:.1f} | {r['d_rtrl_ms'] / r['bptt_alone_ms']:.1f} |")
    print('\n| workload | layer | trace MiB | floor ms / step | measured ms / step | x floor |')
    print('|---|---|---:|---:|---:|---:|')
    for r in results:
        for layer in r['layers']:
            print(f"| {r['workload']} | {layer['layer']} | {layer['trace_mib']:.1f} | "
                  f"{layer['floor_ms']:.2f} | {layer['measured_ms']:.2f} | "
                  f"{layer['measured_ms'] / layer['floor_ms']:.1f} |")
    write_results(args.out, triad_128mib_bytes_per_s=dram, passes=PASSES, results=results)
    return 0


if __name__ == '__main__':
    sys.exit(main())
