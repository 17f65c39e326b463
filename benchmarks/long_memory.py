"""Long-memory tasks: accuracy and memory of BPTT, ES-D-RTRL and D-RTRL (with and without
a window) on e-prop's cue accumulation and on delayed match-to-sample.

Every run is the command line's (``braintrace-conv train --task cue-accumulation`` or
``--task delayed-match``) with the task's defaults (published timings: 2250 and 3200
steps of 1 ms; 40 input channels at one position, so the blocks are dense layers of
adaptive LIF neurons, ``--tau-adapt 2000``; the loss over the read-out period), in a fresh
process, once per seed: its test accuracy after the last epoch, its wall time and its
peak resident memory. ``--part memory`` compiles each executor's whole-sequence gradient
at the task's length and with a delay four times as long and reports XLA's memory
analysis (arguments excluded: the input sequence itself grows with T for every method).

    python3 benchmarks/long_memory.py                       # both tasks, every executor
    python3 benchmarks/long_memory.py --tasks cue-accumulation --configs bptt es-d-rtrl:150
    python3 benchmarks/long_memory.py --part memory

Prints Markdown tables and writes JSON (default benchmarks/results/long_memory.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

TASKS = ('cue-accumulation', 'delayed-match')
#: ``algorithm`` or ``algorithm:window``: BPTT, and each online executor without a window
#: and with one covering the read-out period (150 and 900 steps) plus some of the steps
#: before it.
CONFIGS = {'cue-accumulation': ('bptt', 'es-d-rtrl', 'es-d-rtrl:250', 'd-rtrl', 'd-rtrl:250'),
           'delayed-match': ('bptt', 'es-d-rtrl', 'es-d-rtrl:1000', 'd-rtrl', 'd-rtrl:1000')}
MIB = 2**20


def train(task: str, config: str, seed: int, options: list) -> dict:
    """One ``braintrace-conv train`` run in a fresh process; its ``metrics.json``."""
    algorithm, _, window = config.partition(':')
    argv = ['train', '--task', task, '--algorithm', algorithm, '--seed', str(seed), '--quiet',
            *(['--window', window] if window else []), *options]
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, '-m', 'braintrace_conv.cli', *argv, '--out', out],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f'braintrace-conv {" ".join(argv)} failed:\n{done.stderr[-3000:]}')
        with open(os.path.join(out, 'metrics.json')) as f:
            metrics = json.load(f)
    return dict(task=task, config=config, seed=seed, test_accuracy=metrics['test_accuracy'],
                best=metrics['best'], wall_s=time.perf_counter() - start,
                peak_rss_mib=metrics['peak_rss_mb'], skipped_updates=metrics['skipped_updates'],
                load_average=[round(v, 2) for v in os.getloadavg()])


def memory(task: str, config: str, delay_factor: int) -> dict:
    """XLA's memory (temporaries and outputs) of the whole-sequence gradient of a batch of
    the task, with its delay ``delay_factor`` times the published one."""
    import numpy as np

    import braintrace_conv as bc
    from braintrace_conv.data import cue_accumulation, delayed_match_to_sample
    from braintrace_conv.models import recurrent_conv_snn
    from braintrace_conv.training.loss import step_weights, weighted_cross_entropy
    if task == 'cue-accumulation':
        data, final = cue_accumulation(32, delay_steps=1050 * delay_factor, seed=0), 150
    else:
        data, final = delayed_match_to_sample(32, delay_steps=1000 * delay_factor, seed=0), 900
    xs = np.swapaxes(data.events, 2, 3).transpose(1, 0, 2, 3)          # (T, B, 40, 1)
    targets = (np.broadcast_to(data.labels, xs.shape[:2]),
               step_weights('final', len(xs), final))
    model = recurrent_conv_snn((40, 1), 2, channels=(64, 64), kernel_size=1, tau=20.0,
                               tau_adapt=2000.0)
    algorithm, _, window = config.partition(':')
    window = int(window) if window else None
    learner = {'bptt': lambda: bc.BPTT(model), 'd-rtrl': lambda: bc.D_RTRL(model, window=window),
               'es-d-rtrl': lambda: bc.ES_D_RTRL(model, model.membrane_decay(), window=window)
               }[algorithm]()
    stats = learner.lower(weighted_cross_entropy, xs, targets).compile().memory_analysis()
    return dict(task=task, config=config, steps=len(xs),
                xla_mib=(stats.temp_size_in_bytes + stats.output_size_in_bytes) / MIB)


def accuracy_table(results: list) -> str:
    import numpy as np
    lines = ['| task | algorithm | window | test accuracy % | vs BPTT, points | run s | '
             'peak RSS MiB |', '|---|---|---:|---:|---:|---:|---:|']
    for task in TASKS:
        runs = [r for r in results if r['task'] == task]
        bptt = [100 * r['test_accuracy'] for r in runs if r['config'] == 'bptt']
        for config in dict.fromkeys(r['config'] for r in runs):
            got = [r for r in runs if r['config'] == config]
            acc = [100 * r['test_accuracy'] for r in got]
            algorithm, _, window = config.partition(':')
            gap = f'{np.mean(acc) - np.mean(bptt):+.1f}' if bptt else ''
            lines.append(f"| {task} | {algorithm} | {window or '-'} | "
                         f"{' / '.join(f'{a:.1f}' for a in acc)} | {gap} | "
                         f"{' / '.join(str(round(r['wall_s'])) for r in got)} | "
                         f"{max(r['peak_rss_mib'] for r in got):.0f} |")
    return '\n'.join(lines)


def memory_table(results: list) -> str:
    lines = ['| task | algorithm | window | T | XLA MiB | T | XLA MiB |',
             '|---|---|---:|---:|---:|---:|---:|']
    for task in TASKS:
        for config in dict.fromkeys(r['config'] for r in results if r['task'] == task):
            got = sorted((r for r in results if r['task'] == task and r['config'] == config),
                         key=lambda r: r['steps'])
            algorithm, _, window = config.partition(':')
            lines.append(f"| {task} | {algorithm} | {window or '-'} | "
                         + ' | '.join(f"{r['steps']:,} | {r['xla_mib']:.1f}" for r in got) + ' |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tasks', nargs='+', choices=TASKS, default=list(TASKS))
    parser.add_argument('--configs', nargs='+', help='algorithm or algorithm:window (default: '
                                                     'BPTT and both online executors with and '
                                                     'without the task\'s window)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--part', choices=('accuracy', 'memory'), default='accuracy')
    parser.add_argument('--options', nargs=argparse.REMAINDER, default=[],
                        help='further options of braintrace-conv train (last)')
    parser.add_argument('--json', help='results file (default benchmarks/results/'
                                       'long_memory[_memory].json)')
    args = parser.parse_args(argv)
    results = []
    for task in args.tasks:
        for config in args.configs or CONFIGS[task]:
            if args.part == 'memory':
                results += [memory(task, config, factor) for factor in (1, 4)]
                continue
            for seed in args.seeds:
                results.append(train(task, config, seed, args.options))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    name = 'long_memory' if args.part == 'accuracy' else 'long_memory_memory'
    write_results(args.json or default_path(name), part=args.part, results=results,
                  options=args.options)
    print(accuracy_table(results) if args.part == 'accuracy' else memory_table(results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
