"""Windowed D-RTRL / ES-D-RTRL (``window=k``): gradient fidelity, time and memory against k.

Fidelity (float64, deterministic): the cosine of each parameter's gradient to BPTT's
for k in 1, 2, 4, 8, 16, 32, T (and without a window) on

* ``recurrent-ours``: :func:`braintrace_conv.models.recurrent_conv_snn` with a recurrent
  second block (input 2x16x16, channels 8, 16, batch 4);
* ``recurrent-reset``: the same shape written as users write it: ``brainstate.nn.Conv2d``
  layers, a recurrent ``Conv2d`` of the second layer's last spikes, reset-after-spike LIF;
* ``standard-ours`` / ``standard-reset``: the standard two-layer workload of
  ``workloads.py`` in both neuron styles (batch 8, 2x32x32).

Cost (float32, ``--part cost``): per workload and ``T``, BPTT, ES-D-RTRL and D-RTRL
without a window and with each window ``k``, each compiled once (compile time, XLA temp
memory), then timed in interleaved rounds in one process (the order rotates every round,
so a drift in the machine's load falls on all alike): median time per sequence, wall
clock and the process's CPU time, and its ratio to the same executor without a window
and to BPTT. The workloads are those of the fidelity part (``--workloads``; the standard
ones at batch 8, 2x32x32, the recurrent ones at batch 4, 2x16x16). The load average is
recorded before and after each workload's rounds; timings depend on it, ratios much less.

    python benchmarks/windows.py --part fidelity --lengths 32
    python benchmarks/windows.py --part cost --lengths 100 400 --windows 1 4 16 20

Prints Markdown tables and writes JSON (default benchmarks/results/windows.json).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from timing import interleaved  # noqa: E402

FIDELITY_MODELS = ('recurrent-ours', 'recurrent-reset', 'standard-ours', 'standard-reset')


def recurrent_reset_net():
    """Input Conv2d 2->8 + LIF, Conv2d stride 2 8->16 plus a recurrent Conv2d 16->16 of the
    last spikes + LIF, Linear readout; LIF stores the post-reset potential."""
    import brainstate
    import jax.numpy as jnp
    from workloads import ResetLIF, fan_in_conv2d

    class RecurrentReset(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = fan_in_conv2d((16, 16, 2), 8, 3)
            self.lif1 = ResetLIF((16, 16, 8))
            self.conv2 = fan_in_conv2d((16, 16, 8), 16, 3, stride=2)
            self.rec = fan_in_conv2d((8, 8, 16), 16, 3, gain=2.0, b_init=None)
            self.lif2 = ResetLIF((8, 8, 16))
            self.readout = brainstate.nn.Linear(8 * 8 * 16, 4)

        def init_state(self, batch_size=None, **kw):
            self.s2 = brainstate.HiddenState(jnp.zeros((batch_size, 8, 8, 16),
                                                       brainstate.environ.dftype()))

        def update(self, x):
            s = self.lif2(self.conv2(self.lif1(self.conv1(x))) + self.rec(self.s2.value))
            self.s2.value = s
            return self.readout(s.reshape(s.shape[0], -1))

    return RecurrentReset()


def fidelity_case(name: str, T: int):
    """``(model, xs (T, B, ...), labels (T, B))``, ``xs`` in the default float dtype (float64
    for the fidelity part, float32 for the cost part)."""
    import brainstate
    import jax.numpy as jnp
    from workloads import make_data, make_model

    import braintrace_conv.models as models
    if name.startswith('standard-'):
        style = 'ours' if name == 'standard-ours' else 'reset-after-spike'
        model = make_model(style)
        xs, labels = make_data(style, T)
        return model, xs.astype(jnp.result_type(float)), labels
    brainstate.random.seed(0)
    rng = np.random.default_rng(0)
    xs = rng.random((T, 4, 2, 16, 16)) < 0.15
    if name == 'recurrent-ours':
        model = models.recurrent_conv_snn((2, 16, 16), 4, channels=(8, 16), recurrent=True,
                                          readout='linear')
    else:
        model = recurrent_reset_net()
        xs = xs.transpose(0, 1, 3, 4, 2)
    return (model, jnp.asarray(xs, jnp.result_type(float)),
            jnp.asarray(rng.integers(0, 4, (T, 4))))


def cosines(grads, ref) -> dict:
    import jax
    out = {}
    for key in ref:
        for (path, r), g in zip(jax.tree_util.tree_flatten_with_path(ref[key])[0],
                                jax.tree.leaves(grads[key])):
            a, b = np.ravel(np.asarray(g, np.float64)), np.ravel(np.asarray(r, np.float64))
            out['.'.join(map(str, key)) + jax.tree_util.keystr(path)] = float(
                a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return out


def fidelity(name: str, T: int, windows) -> list[dict]:
    import braintrace_conv as bc
    from workloads import cross_entropy
    model, xs, labels = fidelity_case(name, T)
    _, ref = bc.BPTT(model).value_and_grad(cross_entropy, xs, labels)
    rows = []
    for algorithm, make in (('d-rtrl', bc.D_RTRL), ('es-d-rtrl', bc.ES_D_RTRL)):
        for k in [None, *sorted({min(w, T) for w in windows})]:
            learner = make(model, window=k)
            _, grads = learner.value_and_grad(cross_entropy, xs, labels)
            row = dict(model=name, algorithm=algorithm, T=T, window=k,
                       cosine=cosines(grads, ref))
            rows.append(row)
            print(f'  {name} {algorithm} T={T} k={k}: '
                  + ' '.join(f'{p} {c:.4f}' for p, c in row['cosine'].items()),
                  file=sys.stderr, flush=True)
    return rows


def load_average() -> list:
    """The 1-, 5- and 15-minute load averages (empty where the system has none)."""
    try:
        return list(os.getloadavg())
    except OSError:
        return []


def cost(name: str, T: int, windows, repeats: int, algorithms) -> list[dict]:
    import time

    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy
    model, xs, labels = fidelity_case(name, T)
    learners = {('bptt', None): bc.BPTT(model)}
    make = {'es-d-rtrl': bc.ES_D_RTRL, 'd-rtrl': bc.D_RTRL}
    for algorithm in algorithms:
        for k in [None, *windows]:
            learners[algorithm, k] = make[algorithm](model, window=k)
    rows = {}
    for key, learner in learners.items():
        start = time.perf_counter()
        compiled = learner.lower(cross_entropy, xs, labels).compile()
        compile_s = time.perf_counter() - start
        if repeats:     # warm-up
            jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels)[1])
        rows[key] = dict(workload=name, algorithm=key[0], window=key[1], T=T, times_s=[],
                         compile_s=compile_s,
                         temp_mb=compiled.memory_analysis().temp_size_in_bytes / 2**20)
        print(f"  {name} {key[0]} k={key[1]} T={T}: compiled in {compile_s:.1f} s, XLA temp "
              f"{rows[key]['temp_mb']:.1f} MiB", file=sys.stderr, flush=True)
    cpu = {key: [] for key in learners}

    def call(key):
        def run():
            start = time.process_time()
            jax.block_until_ready(learners[key].value_and_grad(cross_entropy, xs, labels)[1])
            cpu[key].append(time.process_time() - start)
        return run

    load_before = load_average()
    times = interleaved({key: call(key) for key in learners}, repeats)
    load = dict(load_before=load_before, load_after=load_average())
    median = lambda runs: {key: float(np.median(runs[key])) if repeats else float('nan')
                           for key in rows}
    wall, cpu_median = median(times), median(cpu)
    for key, row in rows.items():
        row.update(load, times_s=times[key], median_s=wall[key], cpu_times_s=cpu[key],
                   cpu_s=cpu_median[key], vs_bptt=wall[key] / wall['bptt', None],
                   vs_no_window=wall[key] / wall[key[0], None],
                   cpu_vs_no_window=cpu_median[key] / cpu_median[key[0], None],
                   temp_vs_bptt=row['temp_mb'] / rows['bptt', None]['temp_mb'])
    return list(rows.values())


def cost_tables(rows, windows) -> str:
    """Markdown: the ratio of each window's time to the executor's without one (wall clock;
    in brackets the process's CPU time, which other processes on the machine disturb
    less), then every row in full."""
    timed = lambda v, fmt: '-' if np.isnan(v) else format(v, fmt)
    head = ' | '.join(f'k = {k}' for k in windows)
    lines = [f'| workload | T | algorithm | no window: s, vs BPTT | {head} | load before, after |',
             '|---|---:|---|---:|' + '---:|' * len(windows) + '---|']
    by_key = {(r['workload'], r['T'], r['algorithm'], r['window']): r for r in rows}
    for (name, T, algorithm, k), r in by_key.items():
        if k is not None or algorithm == 'bptt':
            continue
        ratio = lambda r: (f"{timed(r['vs_no_window'], '.2f')}x "
                           f"({timed(r['cpu_vs_no_window'], '.2f')}x)")
        ratios = ' | '.join(ratio(by_key[name, T, algorithm, w])
                            if (name, T, algorithm, w) in by_key else '-' for w in windows)
        load = lambda v: ' '.join(f'{x:.1f}' for x in v) or '-'
        lines.append(f"| {name} | {T} | {algorithm} | {timed(r['median_s'], '.3f')} s, "
                     f"{timed(r['vs_bptt'], '.2f')}x | {ratios} | {load(r['load_before'])}; "
                     f"{load(r['load_after'])} |")
    lines += ['', '| workload | algorithm | window | T | s / sequence | CPU s | vs no window | '
              'vs BPTT | compile s | XLA temp MiB | temp vs BPTT |',
              '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        lines.append(f"| {r['workload']} | {r['algorithm']} | {r['window'] or '-'} | {r['T']} | "
                     f"{timed(r['median_s'], '.3f')} | {timed(r['cpu_s'], '.3f')} | "
                     f"{timed(r['vs_no_window'], '.2f')}x | {timed(r['vs_bptt'], '.2f')}x | "
                     f"{r['compile_s']:.1f} | {r['temp_mb']:.1f} | {r['temp_vs_bptt']:.2f} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--part', choices=('fidelity', 'cost'), default='fidelity')
    parser.add_argument('--models', nargs='+', default=list(FIDELITY_MODELS),
                        choices=FIDELITY_MODELS, help='workloads (fidelity)')
    parser.add_argument('--workloads', nargs='+', default=list(FIDELITY_MODELS),
                        choices=FIDELITY_MODELS, help='workloads (cost)')
    parser.add_argument('--lengths', type=int, nargs='+', default=None,
                        help='T (default: 32 for fidelity, 100 400 for cost)')
    parser.add_argument('--windows', type=int, nargs='+', default=None,
                        help='k (default: 1 2 4 8 16 32 T for fidelity, 1 4 16 20 for cost)')
    parser.add_argument('--repeats', type=int, default=5,
                        help='timed rounds (cost; 0: compile and XLA memory only)')
    parser.add_argument('--algorithms', nargs='+', default=['es-d-rtrl', 'd-rtrl'],
                        choices=['es-d-rtrl', 'd-rtrl'], help='online executors (cost)')
    parser.add_argument('--out', default=default_path('windows'))
    args = parser.parse_args(argv)
    import brainstate
    import jax
    if args.part == 'fidelity':
        brainstate.environ.set(precision=64)
        jax.config.update('jax_enable_x64', True)
        rows = []
        for T in args.lengths or [32]:
            for name in args.models:
                rows += fidelity(name, T, args.windows or [1, 2, 4, 8, 16, 32, T])
        print('| model | algorithm | T | window | cosine to BPTT per parameter |')
        print('|---|---|---:|---:|---|')
        for r in rows:
            print(f"| {r['model']} | {r['algorithm']} | {r['T']} | {r['window'] or '-'} | "
                  + ', '.join(f'{p} {c:.3f}' for p, c in r['cosine'].items()) + ' |')
    out = (args.out.replace('.json', f'_{args.part}.json') if args.out == default_path('windows')
           else args.out)
    machine = dict(jax=jax.__version__, backend=jax.default_backend(),
                   device=jax.devices()[0].device_kind)
    if args.part == 'cost':
        rows, windows = [], args.windows or [1, 4, 16, 20]
        for name in args.workloads:
            for T in args.lengths or [100, 400]:
                rows += cost(name, T, windows, args.repeats, args.algorithms)
                # after each workload, so a run stopped early keeps what it measured
                write_results(out, part=args.part, rows=rows, machine=machine)
        print(f"jax {machine['jax']}, backend {machine['backend']} ({machine['device']})\n")
        print(cost_tables(rows, windows))
    else:
        write_results(out, part=args.part, rows=rows, machine=machine)
    return 0


if __name__ == '__main__':
    sys.exit(main())
