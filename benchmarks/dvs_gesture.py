"""Time per step and peak memory of BPTT, D-RTRL and ES-D-RTRL on a DVS-Gesture-sized net.

Workload (``workloads.make_dvs_model``): batch 16 of 2x64x64 Bernoulli(p=0.05) spike
frames (DVS128 Gesture pooled by 2), 11 classes, cross-entropy at every step,
float32, four conv+LIF layers with average pooling after the LIFs of layers 2-4
(so every conv drives its own neuron directly), dense readout; ``--layout
channels-first`` (this library's layers, the default) or ``channels-last``
(``brainstate.nn`` layers, reset-after-spike LIFs).
Every (algorithm, T) runs in a fresh process and reports: compile time,
median wall time per step over ``--repeats`` sequences, XLA's memory
analysis of the compiled sequence (``learner.lower(...)``: temporaries, and
the total of arguments, outputs and temporaries), the device's measured peak
where JAX reports one (GPUs), and the process peak RSS. Per algorithm, a
least-squares line through the XLA totals over T gives the memory per step;
the largest T fitting in ``--budget-gib`` (24 GiB by default) is predicted
from that line (it is measured only if a run exceeds the budget). The
totals include the input sequence itself, 0.5 MiB per step at batch 16,
which the online executors could avoid by feeding chunks to ``advance``.

    python benchmarks/dvs_gesture.py                       # T in 25 50 100 200
    python benchmarks/dvs_gesture.py --T 4 --quick         # smoke test
    python benchmarks/dvs_gesture.py --layout channels-last

Prints a Markdown table and writes JSON (default benchmarks/results/dvs_gesture.json).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

ALGORITHMS = ('bptt', 'es-d-rtrl', 'd-rtrl')
GIB = 2**30


def _worker(layout: str, algorithm: str, T: int, repeats: int) -> dict:
    import jax

    import braintrace_conv as bc
    from braintrace_conv._memory import peak_rss_mib
    from workloads import DVS_TAU, cross_entropy as loss_fn, make_dvs_data, make_dvs_model

    model = make_dvs_model(layout)
    xs, labels = make_dvs_data(layout, T)
    learner = {'bptt': lambda: bc.BPTT(model), 'd-rtrl': lambda: bc.D_RTRL(model),
               'es-d-rtrl': lambda: bc.ES_D_RTRL(model, math.exp(-1 / DVS_TAU))}[algorithm]()
    start = time.perf_counter()
    memory = learner.lower(loss_fn, xs, labels).compile().memory_analysis()
    compile_s = time.perf_counter() - start
    loss, grads = learner.value_and_grad(loss_fn, xs, labels)    # warm-up (and jit cache)
    jax.block_until_ready(grads)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss, grads = learner.value_and_grad(loss_fn, xs, labels)
        jax.block_until_ready(grads)
        times.append(time.perf_counter() - start)
    stats = jax.devices()[0].memory_stats() or {}
    xla_total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                 + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    return dict(algorithm=algorithm, T=T, device=jax.devices()[0].device_kind,
                compile_s=compile_s, times_s=times, s_per_step=float(np.median(times)) / T,
                xla_temp_mib=memory.temp_size_in_bytes / 2**20, xla_total_mib=xla_total / 2**20,
                device_peak_mib=(stats['peak_bytes_in_use'] / 2**20
                                 if 'peak_bytes_in_use' in stats else None),
                peak_rss_mib=peak_rss_mib(),
                trace_mib=learner.report().trace_bytes / 2**20, loss=float(loss))


def _run(layout: str, algorithm: str, T: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, '--worker', layout, algorithm, str(T), str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f'{algorithm} T={T} failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def largest_T(lengths, totals_mib, budget_gib: float) -> dict:
    """Largest T whose XLA total fits in the budget, from a line through the measurements.

    Returns the fitted ``mib_per_step`` and ``base_mib`` and ``largest_T``:
    an int, ``None`` when memory does not grow with T (any length fits,
    if the base does), or 0 when even the base exceeds the budget. With a
    single length the slope cannot be measured and ``largest_T`` is None.
    """
    budget = budget_gib * 1024
    lengths, totals = np.asarray(lengths, float), np.asarray(totals_mib, float)
    if len(set(lengths)) < 2:
        return dict(mib_per_step=None, base_mib=float(totals.max()), largest_T=None,
                    how='not predicted: needs two or more lengths')
    slope, base = np.polyfit(lengths, totals, 1)
    measured_over = lengths[totals > budget]
    if measured_over.size:
        fits = lengths[totals <= budget]
        return dict(mib_per_step=float(slope), base_mib=float(base),
                    largest_T=int(fits.max()) if fits.size else 0,
                    how=f'measured: T={int(measured_over.min())} exceeds the budget')
    # Growth below 1 KiB per step is within the noise of XLA's buffer assignment.
    if slope * 1024 < 1:
        return dict(mib_per_step=float(slope), base_mib=float(base),
                    largest_T=None if base <= budget else 0,
                    how='predicted: memory does not grow with T')
    return dict(mib_per_step=float(slope), base_mib=float(base),
                largest_T=int((budget - base) // slope) if base <= budget else 0,
                how='predicted from the fitted per-step slope')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--T', type=int, nargs='+', default=[25, 50, 100, 200],
                        help='sequence lengths')
    parser.add_argument('--algorithms', nargs='+', choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument('--layout', choices=['channels-first', 'channels-last'],
                        default='channels-first')
    parser.add_argument('--repeats', type=int, default=3, help='timed sequences per run')
    parser.add_argument('--quick', action='store_true', help='one timed sequence per run')
    parser.add_argument('--budget-gib', type=float, default=24.0)
    parser.add_argument('--out', default=default_path('dvs_gesture'))
    parser.add_argument('--worker', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        layout, algorithm, T, repeats = args.worker
        print(json.dumps(_worker(layout, algorithm, int(T), int(repeats))))
        return 0
    if min(args.T) <= 0 or args.repeats <= 0 or args.budget_gib <= 0:
        parser.error('--T, --repeats and --budget-gib must be positive')
    repeats = 1 if args.quick else args.repeats
    rows = []
    for algorithm in args.algorithms:
        for T in sorted(set(args.T)):
            row = _run(args.layout, algorithm, T, repeats)
            rows.append(row)
            print(f"  {algorithm:>9} T={T:<5} {1e3 * row['s_per_step']:.1f} ms/step  "
                  f"XLA total {row['xla_total_mib']:.0f} MiB", file=sys.stderr, flush=True)
    fits = {a: largest_T([r['T'] for r in rows if r['algorithm'] == a],
                         [r['xla_total_mib'] for r in rows if r['algorithm'] == a],
                         args.budget_gib)
            for a in args.algorithms}
    print(f'DVS-Gesture-sized net ({args.layout}), batch 16, device {rows[0]["device"]}\n')
    print('| algorithm | T | compile s | ms / step | XLA temp MiB | XLA total MiB | '
          'device peak MiB | peak RSS MiB | trace MiB |')
    print('|---|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        peak = '-' if r['device_peak_mib'] is None else f"{r['device_peak_mib']:.0f}"
        print(f"| {r['algorithm']} | {r['T']} | {r['compile_s']:.1f} | "
              f"{1e3 * r['s_per_step']:.1f} | {r['xla_temp_mib']:.1f} | "
              f"{r['xla_total_mib']:.1f} | {peak} | {r['peak_rss_mib']:.0f} | "
              f"{r['trace_mib']:.1f} |")
    print(f'\n| algorithm | XLA MiB per step | largest T in {args.budget_gib:g} GiB | how |')
    print('|---|---:|---:|---|')
    for a, fit in fits.items():
        per_step = '-' if fit['mib_per_step'] is None else f"{fit['mib_per_step']:.2f}"
        largest = ('any' if fit['largest_T'] is None and fit['mib_per_step'] is not None
                   else '-' if fit['largest_T'] is None else str(fit['largest_T']))
        print(f"| {a} | {per_step} | {largest} | {fit['how']} |")
    write_results(args.out, workload=dict(layout=args.layout, budget_gib=args.budget_gib),
                  rows=rows, largest_T=fits)
    return 0


if __name__ == '__main__':
    sys.exit(main())
