"""Long-memory tasks: accuracy, gradient cosines and memory of BPTT, ES-D-RTRL and D-RTRL
(with and without a window) on e-prop's cue accumulation and on delayed match-to-sample.

Every run is the command line's (``braintrace-conv train --task cue-accumulation`` or
``--task delayed-match``) with the task's defaults (published timings: 2250 and 3200
steps of 1 ms; 40 input channels at one position, so the blocks are dense layers of
adaptive LIF neurons, ``--tau-adapt 2000``; the loss over the read-out period), in a fresh
process, once per seed: its test accuracy after the last epoch, its wall time and its
peak resident memory. A configuration is ``algorithm``, then ``/option=value`` for
further options of the command line, then ``:window``: ``es-d-rtrl`` (decays inferred per
layer: the membrane's and the adaptation's), ``es-d-rtrl/decay=0.951229`` (one decay, the
membrane's, for every layer), ``es-d-rtrl/exact=blocks`` (D-RTRL's exact traces for the
adaptive blocks, ES-D-RTRL's for the read-out), ``d-rtrl:250``.

``--part cosine`` gives, per seed, the cosine of each weight's gradient to BPTT's on the
first batch of the training set at the initial parameters, in float64 (seconds per
configuration). ``--part memory`` compiles each executor's whole-sequence gradient at the
task's length and with a delay four times as long and reports XLA's memory analysis
(arguments excluded: the input sequence itself grows with T for every method).

    python3 benchmarks/long_memory.py                       # both tasks, every executor
    python3 benchmarks/long_memory.py --tasks cue-accumulation --configs bptt es-d-rtrl:150
    python3 benchmarks/long_memory.py --part cosine --seeds 0 1 2
    python3 benchmarks/long_memory.py --part memory

Prints Markdown tables and writes JSON (default benchmarks/results/long_memory[_part].json);
each result is added to the file as soon as it is measured, so runs spread over several
invocations accumulate there and the tables are printed from all of them.
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
#: ``algorithm[/option=value...][:window]`` (module docstring): BPTT, each online executor
#: without a window and with one covering the read-out period (150 and 900 steps) plus some
#: of the steps before it, ES-D-RTRL with one decay for every layer, and ES-D-RTRL with
#: exact traces on the adaptive blocks.
MEMBRANE = 'decay=0.951229'     # exp(-1/20): --tau 20 of both tasks
CONFIGS = {'cue-accumulation': ('bptt', 'es-d-rtrl', f'es-d-rtrl/{MEMBRANE}', 'es-d-rtrl:250',
                                'es-d-rtrl/exact=blocks', 'd-rtrl', 'd-rtrl:250'),
           'delayed-match': ('bptt', 'es-d-rtrl', f'es-d-rtrl/{MEMBRANE}', 'es-d-rtrl:1000',
                             'es-d-rtrl/exact=blocks', 'd-rtrl', 'd-rtrl:1000')}
MIB = 2**20
#: What each task's command line sets, for the parts that build the model here.
FINAL_STEPS = {'cue-accumulation': 150, 'delayed-match': 900}


def parse_config(config: str) -> tuple:
    """``(algorithm, {option: value}, window or None)`` of ``algorithm[/o=v...][:window]``."""
    head, _, window = config.partition(':')
    algorithm, *pairs = head.split('/')
    options = dict(pair.split('=', 1) for pair in pairs)
    return algorithm, options, int(window) if window else None


def train(task: str, config: str, seed: int, options: list) -> dict:
    """One ``braintrace-conv train`` run in a fresh process; its ``metrics.json``."""
    algorithm, extra, window = parse_config(config)
    argv = ['train', '--task', task, '--algorithm', algorithm, '--seed', str(seed), '--quiet',
            *(['--window', str(window)] if window else []),
            *[a for name, value in extra.items()
              for a in ('--' + name.replace('_', '-'), *value.split(','))], *options]
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


def _task_batch(task: str, seed: int, batch: int = 32, delay_factor: int = 1):
    """``(model, xs (T, B, 40, 1), targets)``: the model the command line builds for ``task``
    and ``seed``, and the first ``batch`` trials of its training set with the task's loss
    weights (``delay_factor``: a delay that many times the published one, from a data set
    of ``batch`` trials)."""
    import brainstate
    import numpy as np

    from braintrace_conv.data import EventDataset, cue_accumulation, delayed_match_to_sample
    from braintrace_conv.models import recurrent_conv_snn
    from braintrace_conv.training.loss import step_weights
    make = cue_accumulation if task == 'cue-accumulation' else delayed_match_to_sample
    if delay_factor == 1:       # the command line's data set (512 trials) and split
        data = make(512, seed=seed)
        data = EventDataset(np.swapaxes(data.events, 2, 3), data.labels, data.num_classes)
        data = data.split(0.25, seed=seed)[0]
    else:
        delay = {'cue-accumulation': 1050, 'delayed-match': 1000}[task] * delay_factor
        data = make(batch, delay_steps=delay, seed=seed)
        data = EventDataset(np.swapaxes(data.events, 2, 3), data.labels, data.num_classes)
    xs = np.asarray(data.events[:batch], np.float32).swapaxes(0, 1)      # (T, B, 40, 1)
    targets = (np.broadcast_to(np.asarray(data.labels[:batch]), xs.shape[:2]),
               step_weights('final', len(xs), FINAL_STEPS[task]))
    brainstate.random.seed(seed)
    model = recurrent_conv_snn((40, 1), 2, channels=(64, 64), kernel_size=1, tau=20.0,
                               tau_adapt=2000.0)
    return model, xs, targets


def learner_of(config: str, model):
    """The executor of a configuration, built as the command line builds it."""
    import braintrace_conv as bc
    algorithm, extra, window = parse_config(config)
    if algorithm == 'bptt':
        return bc.BPTT(model)
    if algorithm == 'd-rtrl':
        return bc.D_RTRL(model, window=window)
    budget = extra.get('exact_budget')
    return bc.ES_D_RTRL(model, float(extra['decay']) if 'decay' in extra else None,
                        exact=extra['exact'].split(',') if 'exact' in extra else None,
                        exact_budget=None if budget is None else int(float(budget) * MIB),
                        window=window)


def cosines(task: str, configs: list, seed: int) -> list:
    """Per configuration, the cosine of each weight's gradient to BPTT's on the first batch of
    32 training trials at the initial parameters (float64)."""
    import braintrace_conv as bc
    import numpy as np
    from braintrace_conv.training.loss import weighted_cross_entropy
    bc.use_float64()
    model, xs, targets = _task_batch(task, seed)
    _, reference = bc.BPTT(model).value_and_grad(weighted_cross_entropy, xs, targets)
    out = []
    for config in configs:
        if config == 'bptt':
            continue
        learner = learner_of(config, model)
        start = time.perf_counter()
        _, grads = learner.value_and_grad(weighted_cross_entropy, xs, targets)
        seconds = time.perf_counter() - start
        report = learner.report()
        cos = {}
        for row in report.rows:
            if not row['parameter'].endswith('weight'):
                continue
            g = np.ravel(report.gradient(grads, row['parameter']))
            r = np.ravel(report.gradient(reference, row['parameter']))
            cos[row['parameter']] = float(g @ r / (np.linalg.norm(g) * np.linalg.norm(r)))
        out.append(dict(task=task, config=config, seed=seed, cosine=cos, seconds=seconds,
                        trace_mib=report.trace_bytes / MIB,
                        load_average=[round(v, 2) for v in os.getloadavg()]))
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def memory(task: str, config: str, delay_factor: int) -> dict:
    """XLA's memory (temporaries and outputs) of the whole-sequence gradient of a batch of
    the task, with its delay ``delay_factor`` times the published one."""
    from braintrace_conv.training.loss import weighted_cross_entropy
    model, xs, targets = _task_batch(task, 0, delay_factor=delay_factor)
    learner = learner_of(config, model)
    stats = learner.lower(weighted_cross_entropy, xs, targets).compile().memory_analysis()
    return dict(task=task, config=config, steps=len(xs),
                xla_mib=(stats.temp_size_in_bytes + stats.output_size_in_bytes) / MIB)


def _label(config: str) -> tuple:
    """``(algorithm with its options, window)`` of a configuration, for a table."""
    algorithm, extra, window = parse_config(config)
    options = ', '.join(f'{k.replace("_", " ")} {v}' for k, v in extra.items())
    return f'{algorithm} ({options})' if options else algorithm, str(window or '-')


def accuracy_table(results: list) -> str:
    import numpy as np
    lines = ['| task | algorithm | window | seeds | test accuracy % | mean | mean vs BPTT, '
             'points | run s | peak RSS MiB |', '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for task in TASKS:
        runs = sorted((r for r in results if r['task'] == task), key=lambda r: r['seed'])
        bptt = [100 * r['test_accuracy'] for r in runs if r['config'] == 'bptt']
        for config in dict.fromkeys(r['config'] for r in runs):
            got = [r for r in runs if r['config'] == config]
            acc = [100 * r['test_accuracy'] for r in got]
            gap = f'{np.mean(acc) - np.mean(bptt):+.1f}' if bptt and config != 'bptt' else '-'
            lines.append(f"| {task} | {' | '.join(_label(config))} | "
                         f"{', '.join(str(r['seed']) for r in got)} | "
                         f"{' / '.join(f'{a:.1f}' for a in acc)}"
                         f" | {np.mean(acc):.1f} | {gap} | "
                         f"{' / '.join(str(round(r['wall_s'])) for r in got)} | "
                         f"{max(r['peak_rss_mib'] for r in got):.0f} |")
    return '\n'.join(lines)


def cosine_table(results: list) -> str:
    weights = list(dict.fromkeys(w for r in results for w in r['cosine']))
    lines = ['| task | algorithm | window | seed | ' + ' | '.join(weights) + ' | trace MiB |',
             '|---|---|---:|---:|' + '---:|' * (len(weights) + 1)]
    for task in TASKS:
        runs = [r for r in results if r['task'] == task]
        for config in dict.fromkeys(r['config'] for r in runs):
            for r in sorted((r for r in runs if r['config'] == config), key=lambda r: r['seed']):
                cells = [f"{r['cosine'][w]:.2f}" if w in r['cosine'] else '' for w in weights]
                lines.append(f"| {task} | {' | '.join(_label(config))} | {r['seed']} | "
                             + ' | '.join(cells) + f" | {r['trace_mib']:.3f} |")
    return '\n'.join(lines)


def memory_table(results: list) -> str:
    lines = ['| task | algorithm | window | T | XLA MiB | T | XLA MiB |',
             '|---|---|---:|---:|---:|---:|---:|']
    for task in TASKS:
        for config in dict.fromkeys(r['config'] for r in results if r['task'] == task):
            got = sorted((r for r in results if r['task'] == task and r['config'] == config),
                         key=lambda r: r['steps'])
            lines.append(f"| {task} | {' | '.join(_label(config))} | "
                         + ' | '.join(f"{r['steps']:,} | {r['xla_mib']:.1f}" for r in got) + ' |')
    return '\n'.join(lines)


TABLES = {'accuracy': accuracy_table, 'cosine': cosine_table, 'memory': memory_table}


def _identity(result: dict) -> tuple:
    """What a result measures: a new one replaces an earlier one of the same identity."""
    return (result['task'], result['config'], result.get('seed'), result.get('steps'))


def _earlier(path: str, part: str) -> list:
    """The results already in ``path`` of this part (none if the file is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        saved = json.load(f)
    if saved.get('part') != part:
        raise SystemExit(f'{path} holds the {saved.get("part")!r} part, not {part!r}; name '
                         f'another file with --json.')
    return saved['results']


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tasks', nargs='+', choices=TASKS, default=list(TASKS))
    parser.add_argument('--configs', nargs='+', help='algorithm[/option=value...][:window] '
                                                     '(default: every configuration of '
                                                     'CONFIGS)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--part', choices=tuple(TABLES), default='accuracy')
    parser.add_argument('--options', nargs=argparse.REMAINDER, default=[],
                        help='further options of braintrace-conv train (last)')
    parser.add_argument('--json', help='results file (default benchmarks/results/'
                                       'long_memory[_part].json), added to')
    args = parser.parse_args(argv)
    path = args.json or default_path('long_memory' if args.part == 'accuracy'
                                     else f'long_memory_{args.part}')
    results = _earlier(path, args.part)

    def add(new: list) -> None:
        keys = {_identity(r) for r in new}
        results[:] = [r for r in results if _identity(r) not in keys] + new
        write_results(path, part=args.part, results=results, options=args.options)

    for task in args.tasks:
        configs = args.configs or CONFIGS[task]
        if args.part == 'cosine':
            for seed in args.seeds:
                add(cosines(task, configs, seed))
            continue
        for config in configs:
            if args.part == 'memory':
                add([memory(task, config, factor) for factor in (1, 4)])
                continue
            for seed in args.seeds:
                add([train(task, config, seed, args.options)])
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(TABLES[args.part](results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
