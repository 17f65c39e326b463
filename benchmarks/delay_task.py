"""A task where recurrence matters: test accuracy of BPTT, D-RTRL and ES-D-RTRL, with and
without windows, on ``delayed-bars``.

Every run is the command line's (``braintrace-conv train --task delayed-bars``): the
data of :func:`braintrace_conv.data.delayed_bars` (``--cues`` trials of a moving bar
followed by ``--delay`` blank steps; the last bar's direction asked for at the last
step), the model of :func:`braintrace_conv.models.recurrent_conv_snn` (recurrent second
block, leaky readout, tau = 5 ms, dt = 1 ms) and its
:class:`~braintrace_conv.training.Trainer`.
Each configuration -- BPTT; ES-D-RTRL and D-RTRL without a window and with each
``--windows`` k -- is trained once per seed (the seed draws the data, the split, the
initial weights and the shuffling). The table gives the test accuracy after the last
epoch, mean and sample standard deviation over the seeds, and the difference of the
means to BPTT's in percentage points.

    python benchmarks/delay_task.py --jobs 2           # task defaults: T = 128, k = 4, 16, 32
    python benchmarks/delay_task.py --seeds 3          # one more seed
    python benchmarks/delay_task.py --cues 1 --steps 32 --windows 8   # no distractors
    python benchmarks/delay_task.py --configs es-d-rtrl:128 --windows 128  # k = T is BPTT

The defaults (three seeds, 27 runs of 1-2 minutes each) take about 20 minutes with
``--jobs 2`` on a 2-core CPU. Prints a Markdown table and writes JSON (default
benchmarks/results/delay_task.json). Wall times are per run and depend on what else the
machine is doing.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import multiprocessing
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

# Options of ``braintrace-conv train`` passed on when given (otherwise the task's defaults),
# with their types.
TRAIN_OPTIONS = dict(samples=int, size=int, steps=int, delay=int, cues=int, epochs=int,
                     batch_size=int, lr=float, clip_norm=float, channels=str, final_steps=int,
                     tau=float)
ONLINE = ('es-d-rtrl', 'd-rtrl')


def configurations(windows) -> list[tuple[str, int | None]]:
    """``(algorithm, window)``: BPTT, then each online executor without a window and with
    each of ``windows``."""
    return [('bptt', None)] + [(a, k) for a in ONLINE for k in (None, *windows)]


def train(algorithm: str, window, seed: int, options: dict) -> dict:
    """One ``braintrace-conv train`` run (its output discarded); its ``metrics.json``."""
    from braintrace_conv.cli import main
    argv = ['train', '--task', 'delayed-bars', '--algorithm', algorithm, '--seed', str(seed),
            '--quiet']
    for key, value in options.items():
        if value is not None:
            argv += ['--' + key.replace('_', '-'), str(value)]
    if window is not None:
        argv += ['--window', str(window)]
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        code = main([*argv, '--out', out, '--overwrite'])
        if code != 0:
            raise RuntimeError(f'braintrace-conv {" ".join(argv)} failed (exit code {code})')
        with open(os.path.join(out, 'metrics.json')) as f:
            return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--windows', type=int, nargs='*', default=[4, 16, 32],
                        help='window lengths k of the online executors, besides none '
                             '(default 4 16 32: at most T / 4 of the task\'s T = 128)')
    parser.add_argument('--jobs', type=int, default=1,
                        help='runs trained at once, each in its own process')
    parser.add_argument('--configs', nargs='+', metavar='ALGORITHM[:K]',
                        help='only these configurations, e.g. bptt es-d-rtrl d-rtrl:14')
    for key, kind in TRAIN_OPTIONS.items():
        parser.add_argument('--' + key.replace('_', '-'), type=kind,
                            help='braintrace-conv train option (default: the task\'s)')
    parser.add_argument('--out', default=default_path('delay_task'))
    args = parser.parse_args(argv)
    options = {key: getattr(args, key) for key in TRAIN_OPTIONS}
    configs = configurations(args.windows)
    if args.configs:
        wanted = {(name, int(k) if k else None)
                  for name, _, k in (c.partition(':') for c in args.configs)}
        configs = [c for c in configs if c in wanted]
        if not configs:
            parser.error(f'--configs selects none of {configurations(args.windows)}')
    runs = [(algorithm, window, seed) for algorithm, window in configs for seed in args.seeds]
    # 'spawn': a forked child would inherit the parent's JAX threads
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {run: pool.submit(train, *run, options) for run in runs}
        for run, future in futures.items():
            metrics = future.result()
            print(f"  {run[0]} window={run[1]} seed={run[2]}: test accuracy "
                  f"{metrics['test_accuracy']:.3f} ({metrics['wall_time_s']:.0f} s)",
                  file=sys.stderr, flush=True)
    rows = []
    for algorithm, window in configs:
        per_seed = []
        for seed in args.seeds:
            metrics = futures[algorithm, window, seed].result()
            per_seed.append(dict(seed=seed, test_accuracy=metrics['test_accuracy'],
                                 train_accuracy=metrics['train_accuracy'][-1],
                                 wall_time_s=metrics['wall_time_s']))
        accuracies = [r['test_accuracy'] for r in per_seed]
        rows.append(dict(algorithm=algorithm, window=window, runs=per_seed,
                         mean=float(np.mean(accuracies)),
                         std=float(np.std(accuracies, ddof=1)) if len(per_seed) > 1 else None))
    stored = futures[runs[0]].result()['run_config']
    task = {k: stored.get(k) for k in ('samples', 'size', 'steps', 'cues', 'delay', 'tau',
                                       'epochs', 'batch_size', 'lr', 'clip_norm', 'channels',
                                       'loss', 'final_steps', 'test_fraction')}
    trial = task['steps'] // task['cues']
    bptt = next((r['mean'] for r in rows if r['algorithm'] == 'bptt'), None)
    print(f"delayed-bars: {task['samples']} samples ({1 - task['test_fraction']:.0%} train), "
          f"T = {task['steps']} steps: {task['cues']} trial(s) of {trial - task['delay']} "
          f"steps of a moving bar and {task['delay']} blank; tau = {task['tau']:g} ms, "
          f"{task['size']}x{task['size']} pixels; {task['epochs']} epochs, lr {task['lr']:g}, "
          f"gradient norm clipped at {task['clip_norm']:g}; seeds "
          f"{', '.join(map(str, args.seeds))}")
    print()
    print('| algorithm | window | test accuracy, mean ± std | vs BPTT, points | per seed '
          '| wall s / run |')
    print('|---|---:|---:|---:|---|---:|')
    for r in rows:
        spread = '' if r['std'] is None else f" ± {100 * r['std']:.1f}"
        versus = '-' if bptt is None else f"{100 * (r['mean'] - bptt):+.1f}"
        per_seed = ', '.join(f"{100 * x['test_accuracy']:.1f}" for x in r['runs'])
        print(f"| {r['algorithm']} | {r['window'] or '-'} | {100 * r['mean']:.1f}{spread} | "
              f"{versus} | {per_seed} | {np.mean([x['wall_time_s'] for x in r['runs']]):.0f} |")
    write_results(args.out, task=task, seeds=args.seeds, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
