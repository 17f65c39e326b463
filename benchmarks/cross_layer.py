"""ES-D-RTRL with one hop across layers (``cross_layer=1``) against ES-D-RTRL and BPTT.

``--part cosine``: the cosine of each block's kernel gradient to BPTT's on the 4-block
net (``recurrent_conv_snn((2, 32, 32), 8, channels=(8, 16, 16, 32), kernel_size=3,
recurrent=False, tau=10)``), float64, the first 8 moving-bars samples at 32x32, T = 32,
cross-entropy at every step, per model seed; at the initial parameters, or after
``--bptt-updates N`` Adam updates (lr 5e-3) of BPTT on batches of 8 other samples (64
samples of another data seed, in turn). ``--net recurrent`` takes the shape of the
command line's digits model instead: 16x16 frames, T = 24, a recurrent convolution in
blocks 1-3 (``recurrent=True``).

``--part cost``: seconds per step of the whole-sequence gradient (median of interleaved
rounds, float32, decays inferred) and trace bytes (``report()``), ES-D-RTRL and
``cross_layer=1``, on the DVS-sized net in both layouts (``workloads.make_dvs_model``:
batch 16, 2x64x64, 4 conv blocks, average pooling between them) and on the 4-block net.

``--part accuracy``: the command line's runs, one fresh process per seed:
``braintrace-conv train --task TASK --channels 8,16,16,32`` with ES-D-RTRL,
``--cross-layer 1`` and BPTT, the task's other defaults.

    python3 benchmarks/cross_layer.py --part cosine --seeds 0 1 2
    python3 benchmarks/cross_layer.py --part cosine --seeds 0 --bptt-updates 60
    python3 benchmarks/cross_layer.py --part cost --lengths 20
    python3 benchmarks/cross_layer.py --part accuracy --tasks digits --seeds 0 1 2

Prints Markdown tables and writes JSON (default benchmarks/results/cross_layer_<part>.json),
each result added as soon as it is measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from long_memory import train  # noqa: E402
from timing import interleaved  # noqa: E402

#: The command line's configurations (``long_memory.parse_config``) of ``--part accuracy``.
CONFIGS = ('es-d-rtrl', 'es-d-rtrl/cross_layer=1', 'bptt')


def _load() -> list:
    return [round(v, 2) for v in os.getloadavg()]


#: ``(frame side, T, recurrent)`` of each net of the cosine part.
NETS = {'4-block': (32, 32, False), 'recurrent': (16, 24, True)}


def four_blocks(seed: int, net: str = '4-block'):
    import brainstate
    from braintrace_conv.models import recurrent_conv_snn
    side, _, recurrent = NETS[net]
    brainstate.random.seed(seed)
    return recurrent_conv_snn((2, side, side), 8, channels=(8, 16, 16, 32), kernel_size=3,
                              recurrent=recurrent, tau=10)


def _bars(T: int = 32, batch: int = 8, seed: int = 0, side: int = 32):
    import jax.numpy as jnp
    from braintrace_conv.data.tasks.moving_bars import moving_bars
    data = moving_bars(batch, T=T, size=(side, side), seed=seed)
    xs = jnp.asarray(np.asarray(data.events, np.float64)).swapaxes(0, 1)   # (T, B, 2, 32, 32)
    return xs, jnp.broadcast_to(jnp.asarray(data.labels), xs.shape[:2])


def xent(logits, label):
    import jax
    import jax.numpy as jnp
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), label[:, None], 1))


def cosines(seed: int, bptt_updates: int, net: str) -> list:
    import brainstate
    import optax
    import braintrace_conv as bc
    bc.use_float64()
    side, T, _ = NETS[net]
    xs, labels = _bars(T, side=side)
    model = four_blocks(seed, net)
    if bptt_updates:
        bptt = bc.BPTT(model)
        params = model.states(brainstate.ParamState)
        opt = optax.adam(5e-3)
        state = opt.init({k: p.value for k, p in params.items()})
        train_xs, train_labels = _bars(T, batch=64, seed=1, side=side)
        for n in range(bptt_updates):
            part = slice(8 * (n % 8), 8 * (n % 8) + 8)
            _, grads = bptt.value_and_grad(xent, train_xs[:, part], train_labels[:, part])
            updates, state = opt.update(grads, state)
            for k, p in params.items():
                p.value = optax.apply_updates(p.value, updates[k])
    _, reference = bc.BPTT(model).value_and_grad(xent, xs, labels)
    out = []
    for name, cross_layer in (('es-d-rtrl', 0), ('cross-layer', 1)):
        learner = bc.ES_D_RTRL(model, cross_layer=cross_layer)
        _, grads = learner.value_and_grad(xent, xs, labels)
        report = learner.report()
        cos = {}
        for row in report.rows:
            if row['parameter'].endswith('weight'):
                g = np.ravel(report.gradient(grads, row['parameter']))
                r = np.ravel(report.gradient(reference, row['parameter']))
                cos[row['parameter']] = float(g @ r / (np.linalg.norm(g) * np.linalg.norm(r)))
        out.append(dict(net=net, config=name, seed=seed, bptt_updates=bptt_updates, cosine=cos,
                        load_average=_load()))
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def costs(T: int, repeats: int) -> list:
    import jax
    import braintrace_conv as bc
    from workloads import cross_entropy, make_dvs_data, make_dvs_model
    nets = {layout: (lambda layout=layout: make_dvs_model(layout), make_dvs_data(layout, T))
            for layout in ('channels-first', 'channels-last')}
    xs, labels = _bars(T)
    nets['4-block'] = (lambda: four_blocks(0), (xs.astype('float32'), labels))
    out = []
    for net, (make, (x, y)) in nets.items():
        model = make()
        calls, rows = {}, {}
        for name, cross_layer in (('es-d-rtrl', 0), ('cross-layer', 1)):
            learner = bc.ES_D_RTRL(model, cross_layer=cross_layer)
            loss = cross_entropy if net != '4-block' else xent
            jax.block_until_ready(learner.value_and_grad(loss, x, y))      # compiled
            calls[name] = lambda learner=learner, loss=loss: jax.block_until_ready(
                learner.value_and_grad(loss, x, y))
            rows[name] = dict(net=net, config=name, T=T,
                              trace_bytes=learner.report().trace_bytes)
        for name, seconds in interleaved(calls, repeats).items():
            rows[name].update(s_per_step=float(np.median(seconds)) / T, load_average=_load())
        for name in rows:
            rows[name]['time_ratio'] = rows[name]['s_per_step'] / rows['es-d-rtrl']['s_per_step']
            rows[name]['bytes_ratio'] = (rows[name]['trace_bytes']
                                         / rows['es-d-rtrl']['trace_bytes'])
            print(json.dumps(rows[name]), file=sys.stderr, flush=True)
        out += list(rows.values())
    return out


# ----------------------------------------------------------------------------- tables
def cosine_table(results: list) -> str:
    lines = ['| net | model seed | BPTT updates | executor | blocks: kernel cosines |',
             '| --- | ---: | ---: | --- | --- |']
    for r in sorted(results, key=lambda r: (r.get('net', '4-block'), r['bptt_updates'],
                                            r['seed'], r['config'])):
        blocks = [f"{k.removeprefix('blocks.').removesuffix('.weight')} {v:.3f}"
                  for k, v in r['cosine'].items() if k.startswith('blocks.')]
        lines.append(f"| {r.get('net', '4-block')} | {r['seed']} | {r['bptt_updates']} | "
                     f"{r['config']} | {', '.join(blocks)} |")
    return '\n'.join(lines)


def cost_table(results: list) -> str:
    lines = ['| net | T | executor | ms per step | x ES | trace MiB | x ES | load average |',
             '| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |']
    for r in results:
        lines.append(f"| {r['net']} | {r['T']} | {r['config']} | {1e3 * r['s_per_step']:.2f} | "
                     f"{r['time_ratio']:.2f} | {r['trace_bytes'] / 2**20:.2f} | "
                     f"{r['bytes_ratio']:.2f} | {' '.join(map(str, r['load_average']))} |")
    return '\n'.join(lines)


def accuracy_table(results: list) -> str:
    lines = ['| task | executor | test accuracy, seeds | mean |', '| --- | --- | --- | ---: |']
    keys = sorted({(r['task'], r['config']) for r in results})
    for task, config in keys:
        accs = [r['test_accuracy'] for r in sorted(results, key=lambda r: r['seed'])
                if (r['task'], r['config']) == (task, config)]
        lines.append(f"| {task} | {config} | {' / '.join(f'{100 * a:.1f}' for a in accs)} | "
                     f"{100 * np.mean(accs):.1f} |")
    return '\n'.join(lines)


TABLES = {'cosine': cosine_table, 'cost': cost_table, 'accuracy': accuracy_table}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--part', choices=tuple(TABLES), default='cosine')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--bptt-updates', type=int, default=0)
    parser.add_argument('--net', choices=tuple(NETS), default='4-block')
    parser.add_argument('--lengths', type=int, nargs='+', default=[20])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--tasks', nargs='+', default=['digits'])
    parser.add_argument('--configs', nargs='+', choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument('--json', help='results file (default benchmarks/results/'
                                       'cross_layer_<part>.json), added to')
    args = parser.parse_args(argv)
    path = args.json or default_path(f'cross_layer_{args.part}')
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)['results']
    identity = lambda r: tuple(r.get(k) for k in ('task', 'net', 'T', 'config', 'seed',
                                                  'bptt_updates'))

    def add(new: list) -> None:
        keys = {identity(r) for r in new}
        results[:] = [r for r in results if identity(r) not in keys] + new
        write_results(path, part=args.part, results=results)

    if args.part == 'cosine':
        for seed in args.seeds:
            add(cosines(seed, args.bptt_updates, args.net))
    elif args.part == 'cost':
        for T in args.lengths:
            add(costs(T, args.repeats))
    else:
        for task in args.tasks:
            for seed in args.seeds:
                for config in args.configs:
                    add([train(task, config, seed, ['--channels', '8,16,16,32'])])
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(TABLES[args.part](results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
