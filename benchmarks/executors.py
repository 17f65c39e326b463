"""Speed and memory of BPTT, D-RTRL and ES-D-RTRL on the standard workload, both neuron styles.

Workload (``workloads.py``): batch 8, input 2x32x32 Bernoulli(0.1) spikes,
conv3x3 2->8 + LIF, conv3x3 stride 2 8->16 + LIF, dense readout to 10,
cross-entropy at every step; written with this library's neurons (``ours``)
and the way brainpy / snnTorch / braintrace users write it
(``reset-after-spike``: ``brainstate.nn`` layers, state stored after the reset).

For each style and ``T`` all three algorithms run in one process: each is
compiled once (compile time, XLA temp memory from the executable's memory
analysis, number of convolutions in the optimised HLO), then timed in
interleaved rounds (the order rotates every round, so load drifts alike) and
the median per sequence is reported with its ratio to BPTT and the cosine of
the gradient to BPTT's. ES-D-RTRL infers its decays from the model.

    python benchmarks/executors.py                          # T = 100 400, both styles
    python benchmarks/executors.py --lengths 25 100 --repeats 7 --styles ours

Prints a Markdown table and writes JSON (default benchmarks/results/executors.json).
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

ALGORITHMS = ('bptt', 'es-d-rtrl', 'd-rtrl')


def measure(style: str, T: int, repeats: int) -> list[dict]:
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy, make_data, make_model

    model = make_model(style)
    xs, labels = make_data(style, T)
    learners = {'bptt': bc.BPTT(model), 'es-d-rtrl': bc.ES_D_RTRL(model),
                'd-rtrl': bc.D_RTRL(model)}
    rows, grads = {}, {}
    for name, learner in learners.items():
        start = time.perf_counter()
        compiled = learner.lower(cross_entropy, xs, labels).compile()
        compile_s = time.perf_counter() - start
        _, grads[name] = learner.value_and_grad(cross_entropy, xs, labels)   # warm-up
        jax.block_until_ready(grads[name])
        rows[name] = dict(style=style, algorithm=name, T=T, compile_s=compile_s,
                          temp_mb=compiled.memory_analysis().temp_size_in_bytes / 2**20,
                          convolutions=compiled.as_text().count(' convolution('),
                          trace_mb=learner.report().trace_bytes / 2**20, times_s=[])
    times = interleaved({name: (lambda l=learner: jax.block_until_ready(
        l.value_and_grad(cross_entropy, xs, labels))) for name, learner in learners.items()},
        repeats)
    for name, row in rows.items():
        row['times_s'] = times[name]
    flat = lambda g: np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(g)])
    ref = flat(grads['bptt'])
    for name, row in rows.items():
        row['median_s'] = float(np.median(row['times_s']))
        row['vs_bptt'] = row['median_s'] / float(np.median(rows['bptt']['times_s']))
        g = flat(grads[name])
        row['cosine_to_bptt'] = float(g @ ref / (np.linalg.norm(g) * np.linalg.norm(ref)))
    return list(rows.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[100, 400])
    parser.add_argument('--styles', nargs='+', default=['ours', 'reset-after-spike'],
                        choices=['ours', 'reset-after-spike'])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', default=default_path('executors'))
    args = parser.parse_args(argv)
    rows = []
    for style in args.styles:
        for T in args.lengths:
            for row in measure(style, T, args.repeats):
                rows.append(row)
                print(f"  {style:>17} {row['algorithm']:>9} T={T:<4} {row['median_s']:.3f} s  "
                      f"{row['vs_bptt']:.2f}x  temp {row['temp_mb']:.1f} MiB  "
                      f"cos {row['cosine_to_bptt']:.4f}", file=sys.stderr, flush=True)
    print('| style | algorithm | T | s / sequence | vs BPTT | compile s | XLA temp MiB | '
          'convolutions | trace MiB | cosine to BPTT |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['style']} | {r['algorithm']} | {r['T']} | {r['median_s']:.3f} | "
              f"{r['vs_bptt']:.2f}x | {r['compile_s']:.1f} | {r['temp_mb']:.1f} | "
              f"{r['convolutions']} | {r['trace_mb']:.2f} | {r['cosine_to_bptt']:.4f} |")
    write_results(args.out, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
