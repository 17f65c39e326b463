"""Windowed D-RTRL / ES-D-RTRL (``window=k``): gradient fidelity, time and memory against k.

Fidelity (float64, deterministic): the cosine of each parameter's gradient to BPTT's
for k in 1, 2, 4, 8, 16, 32, T (and without a window) on

* ``recurrent-ours``: :func:`braintrace_conv.models.recurrent_conv_snn` with a recurrent
  second block (input 2x16x16, channels 8, 16, batch 4);
* ``recurrent-reset``: the same shape written as users write it: ``brainstate.nn.Conv2d``
  layers, a recurrent ``Conv2d`` of the second layer's last spikes, reset-after-spike LIF;
* ``standard-ours`` / ``standard-reset``: the standard two-layer workload of
  ``workloads.py`` in both neuron styles (batch 8, 2x32x32).

Cost (float32): median time per sequence and XLA temp memory of ES-D-RTRL and D-RTRL
with windows against BPTT and the window-free executors, on the standard workload for
each ``T`` (``--part cost``). Timings depend on the machine's load: take them on an
otherwise idle machine.

    python benchmarks/windows.py --part fidelity --lengths 32
    python benchmarks/windows.py --part cost --lengths 100 400 --windows 1 4 16

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
    """``(model, xs (T, B, ...), labels (T, B))``."""
    import brainstate
    import jax.numpy as jnp
    from workloads import make_data, make_model

    import braintrace_conv.models as models
    if name.startswith('standard-'):
        style = 'ours' if name == 'standard-ours' else 'reset-after-spike'
        model = make_model(style)
        xs, labels = make_data(style, T)
        return model, xs.astype(jnp.float64), labels
    brainstate.random.seed(0)
    rng = np.random.default_rng(0)
    xs = rng.random((T, 4, 2, 16, 16)) < 0.15
    if name == 'recurrent-ours':
        model = models.recurrent_conv_snn((2, 16, 16), 4, channels=(8, 16), recurrent=True,
                                          readout='linear')
    else:
        model = recurrent_reset_net()
        xs = xs.transpose(0, 1, 3, 4, 2)
    return model, jnp.asarray(xs, jnp.float64), jnp.asarray(rng.integers(0, 4, (T, 4)))


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


def cost(T: int, windows, repeats: int, algorithms) -> list[dict]:
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy, make_data, make_model
    model = make_model('ours')
    xs, labels = make_data('ours', T)
    learners = {('bptt', None): bc.BPTT(model)}
    make = {'es-d-rtrl': bc.ES_D_RTRL, 'd-rtrl': bc.D_RTRL}
    for k in [None, *windows]:
        for name in algorithms:
            learners[name, k] = make[name](model, window=k)
    rows = {}
    for key, learner in learners.items():
        compiled = learner.lower(cross_entropy, xs, labels).compile()
        if repeats:     # warm-up
            jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels)[1])
        rows[key] = dict(algorithm=key[0], window=key[1], T=T, times_s=[],
                         temp_mb=compiled.memory_analysis().temp_size_in_bytes / 2**20)
        print(f"  {key[0]} k={key[1]} T={T}: XLA temp {rows[key]['temp_mb']:.1f} MiB",
              file=sys.stderr, flush=True)
    times = interleaved({key: (lambda l=learner: jax.block_until_ready(
        l.value_and_grad(cross_entropy, xs, labels)[1])) for key, learner in learners.items()},
        repeats)
    for key, row in rows.items():
        row['times_s'] = times[key]
    base = float(np.median(rows['bptt', None]['times_s'])) if repeats else float('nan')
    for row in rows.values():
        row['median_s'] = float(np.median(row['times_s'])) if repeats else float('nan')
        row['vs_bptt'] = row['median_s'] / base
        row['temp_vs_bptt'] = row['temp_mb'] / rows['bptt', None]['temp_mb']
    return list(rows.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--part', choices=('fidelity', 'cost'), default='fidelity')
    parser.add_argument('--models', nargs='+', default=list(FIDELITY_MODELS),
                        choices=FIDELITY_MODELS)
    parser.add_argument('--lengths', type=int, nargs='+', default=None,
                        help='T (default: 32 for fidelity, 100 400 for cost)')
    parser.add_argument('--windows', type=int, nargs='+', default=None,
                        help='k (default: 1 2 4 8 16 32 T for fidelity, 1 4 16 for cost)')
    parser.add_argument('--repeats', type=int, default=5,
                        help='timed rounds (cost; 0: XLA memory only)')
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
    else:
        rows = []
        for T in args.lengths or [100, 400]:
            rows += cost(T, args.windows or [1, 4, 16], args.repeats, args.algorithms)
        print('| algorithm | window | T | s / sequence | vs BPTT | XLA temp MiB | temp vs BPTT |')
        print('|---|---:|---:|---:|---:|---:|---:|')
        timed = lambda v, fmt: '-' if np.isnan(v) else format(v, fmt)
        for r in rows:
            print(f"| {r['algorithm']} | {r['window'] or '-'} | {r['T']} | "
                  f"{timed(r['median_s'], '.3f')} | {timed(r['vs_bptt'], '.2f')}x | "
                  f"{r['temp_mb']:.1f} | {r['temp_vs_bptt']:.2f} |")
    write_results(args.out.replace('.json', f'_{args.part}.json')
                  if args.out == default_path('windows') else args.out, part=args.part,
                  rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
