"""Speed and memory of BPTT, D-RTRL and ES-D-RTRL on the standard workload.

Workload: batch 8, input 2x32x32 Bernoulli(p=0.1) spikes, conv3x3 2->8 + LIF,
conv3x3 stride 2 8->16 + LIF, dense readout to 10, cross-entropy at every step
(``braintrace_conv.models.standard_benchmark_snn``). Every (algorithm, T)
runs in a fresh process and reports: compile time, median wall time per
sequence over ``--repeats`` runs (``block_until_ready``), XLA temp memory from
the compiled executable's memory analysis, process peak RSS, and the cosine
of its gradient to BPTT's on the same data.

    python benchmarks/executors.py                      # T in 25 100 400 1600
    python benchmarks/executors.py --lengths 25 100 --repeats 5

Prints a Markdown table and writes JSON (default benchmarks/results/executors.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ALGORITHMS = ('bptt', 'es-d-rtrl', 'd-rtrl')


def _worker(algorithm: str, T: int, repeats: int, grad_file: str) -> dict:
    import brainstate
    import jax
    import jax.numpy as jnp

    import braintrace_conv as bc
    from braintrace_conv.models import standard_benchmark_snn

    brainstate.random.seed(0)
    model = standard_benchmark_snn()
    decay = model.membrane_decay()
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.random((T, 8, 2, 32, 32)) < 0.1, jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, (T, 8)))

    def loss_fn(logits, label):
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(logits.shape[0]), label])

    learner = {'bptt': lambda: bc.BPTT(model), 'd-rtrl': lambda: bc.D_RTRL(model),
               'es-d-rtrl': lambda: bc.ES_D_RTRL(model, decay)}[algorithm]()
    start = time.perf_counter()
    compiled = learner.lower(loss_fn, xs, labels).compile()
    temp_bytes = compiled.memory_analysis().temp_size_in_bytes
    compile_s = time.perf_counter() - start
    loss, grads = learner.value_and_grad(loss_fn, xs, labels)    # warm-up (and jit cache)
    jax.block_until_ready(grads)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss, grads = learner.value_and_grad(loss_fn, xs, labels)
        jax.block_until_ready(grads)
        times.append(time.perf_counter() - start)
    np.savez(grad_file, *[np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(grads)])
    return dict(algorithm=algorithm, T=T, compile_s=compile_s, times_s=times,
                median_s=float(np.median(times)), temp_mb=temp_bytes / 2**20,
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                loss=float(loss), trace_mb=learner.report().trace_bytes / 2**20)


def _flat(grad_file):
    with np.load(grad_file) as data:
        return np.concatenate([data[k] for k in sorted(data, key=lambda s: int(s.split('_')[1]))])


def _run(algorithm, T, repeats, tmp):
    grad_file = os.path.join(tmp, f'{algorithm}_{T}.npz')
    cmd = [sys.executable, __file__, '--worker', algorithm, str(T), str(repeats), grad_file]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f'{algorithm} T={T} failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1]), grad_file


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[25, 100, 400, 1600])
    parser.add_argument('--algorithms', nargs='+', choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'executors.json'))
    parser.add_argument('--worker', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        algorithm, T, repeats, grad_file = args.worker
        print(json.dumps(_worker(algorithm, int(T), int(repeats), grad_file)))
        return 0
    if 'bptt' not in args.algorithms:
        args.algorithms.insert(0, 'bptt')       # the reference for the cosines
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in args.lengths:
            reference = None
            for algorithm in args.algorithms:
                row, grad_file = _run(algorithm, T, args.repeats, tmp)
                grad = _flat(grad_file)
                if algorithm == 'bptt':
                    reference = grad
                row['cosine_to_bptt'] = float(grad @ reference /
                                              (np.linalg.norm(grad) * np.linalg.norm(reference)))
                rows.append(row)
                print(f"  {algorithm:>9} T={T:<5} {row['median_s']:.3f} s/seq  "
                      f"temp {row['temp_mb']:.1f} MiB  cos {row['cosine_to_bptt']:.4f}",
                      file=sys.stderr, flush=True)
    by = {(r['algorithm'], r['T']): r for r in rows}
    for r in rows:
        r['time_vs_bptt'] = r['median_s'] / by['bptt', r['T']]['median_s']
        r['temp_vs_shortest'] = r['temp_mb'] / max(by[r['algorithm'], min(args.lengths)]['temp_mb'],
                                                   1e-9)
    print('| algorithm | T | compile s | s / sequence | vs BPTT | XLA temp MiB | temp vs '
          f'T={min(args.lengths)} | peak RSS MiB | trace MiB | cosine to BPTT |')
    print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['algorithm']} | {r['T']} | {r['compile_s']:.1f} | {r['median_s']:.3f} | "
              f"{r['time_vs_bptt']:.2f}x | {r['temp_mb']:.1f} | {r['temp_vs_shortest']:.2f}x | "
              f"{r['peak_rss_mb']:.0f} | {r['trace_mb']:.2f} | {r['cosine_to_bptt']:.4f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(dict(machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                                    python=platform.python_version()),
                       rows=rows), f, indent=2)
    print(f'wrote {args.out}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
