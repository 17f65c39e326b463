"""What multi-decay ES-D-RTRL costs: time per sequence against one-decay ES-D-RTRL.

Workloads: the standard workload's shapes (batch 8, input 2x32x32 Bernoulli(0.1) spikes,
conv3x3 2->8, conv3x3 stride 2 8->16, dense readout to 10, cross-entropy at every step)
with neurons of two timescales, this library's ``ALIF`` (``tau = 10``, ``tau_adapt =
200``) and ``CubaLIF`` (``tau = 10``, ``tau_syn = 5``), and with the standard LIF neurons
in both styles (``workloads.py``). Per workload, in one process: ES-D-RTRL with its
decays inferred (two per neuron for ALIF and CubaLIF: two input traces and two
weight-gradient contractions per op and step) and with one decay given, the membrane's
(one input trace; on LIF neurons that is the decay the inference finds), interleaved
rounds, the median per sequence and its ratio. For LIF the lowered programs are also
compared, their floating-point constants aside: inference must give the program of the
one decay it finds (``same program``).

    python benchmarks/multi_decay.py                        # T = 100, every workload
    python benchmarks/multi_decay.py --lengths 100 400 --repeats 9

Prints a Markdown table and writes JSON (default benchmarks/results/multi_decay.json).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from timing import interleaved  # noqa: E402

WORKLOADS = ('alif', 'cubalif', 'ours', 'reset-after-spike')
MEMBRANE = math.exp(-1 / 10)


def make(workload: str):
    """``(model, xs, labels)`` of a workload, T steps set by the caller's data."""
    import brainstate

    from braintrace_conv import nn
    from braintrace_conv.models import ConvLIF, RecurrentConvSNN, recurrent_conv_snn
    from workloads import make_model
    brainstate.random.seed(0)
    if workload == 'alif':
        return recurrent_conv_snn((2, 32, 32), 10, channels=(8, 16), kernel_size=3,
                                  recurrent=False, readout='linear', tau=10.0, tau_adapt=200.0)
    if workload == 'cubalif':
        neuron = functools.partial(nn.CubaLIF, tau=10.0, tau_syn=5.0)
        blocks = [ConvLIF((2, 32, 32), 8, 3, stride=1, neuron=neuron)]
        blocks.append(ConvLIF(blocks[0].out_size, 16, 3, stride=2, neuron=neuron))
        return RecurrentConvSNN((2, 32, 32), 10, blocks, 10.0, 'linear')
    return make_model(workload)


def _lowered(learner, loss, xs, labels) -> str:
    """The lowered program without source locations and with its floating-point constants
    blanked: the inferred decays of two groups of the same neurons may differ in the last
    bit (a mean over a different number of neurons)."""
    text = learner.lower(loss, xs, labels).as_text()
    text = '\n'.join(line.split(' loc(')[0] for line in text.splitlines()
                     if not line.startswith('#loc'))
    return re.sub(r'\d+\.\d+(e[-+]?\d+)?', 'C', text)


def measure(workload: str, T: int, repeats: int) -> dict:
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy, make_data

    model = make(workload)
    xs, labels = make_data('reset-after-spike' if workload == 'reset-after-spike' else 'ours', T)
    inferred = bc.ES_D_RTRL(model)
    inferred.value_and_grad(cross_entropy, xs, labels)
    decays = sorted({mode.decay.real for modes in inferred._plan(inferred.analysis()).modes.values()
                     for mode in modes})
    single = max(decays) - min(decays) < 1e-12      # LIF: one decay, up to the last bit
    one = decays[0] if single else MEMBRANE
    given = bc.ES_D_RTRL(model, one)
    learners = {'inferred': inferred, 'one decay': given}
    for learner in learners.values():      # compile and warm up
        jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels))
    same = (_lowered(inferred, cross_entropy, xs, labels)
            == _lowered(given, cross_entropy, xs, labels)) if single else None
    load = [os.getloadavg()]
    times = interleaved({name: (lambda l=learner: jax.block_until_ready(
        l.value_and_grad(cross_entropy, xs, labels))) for name, learner in learners.items()},
        repeats)
    load.append(os.getloadavg())
    median = {name: float(np.median(t)) for name, t in times.items()}
    return dict(workload=workload, T=T, decays=decays, one_decay=one, times_s=times,
                median_s=median, ratio=median['inferred'] / median['one decay'],
                same_program=same, load_average=[[round(v, 2) for v in avg] for avg in load])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workloads', nargs='+', default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument('--lengths', type=int, nargs='+', default=[100])
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--out', default=default_path('multi_decay'))
    args = parser.parse_args(argv)
    rows = []
    for workload in args.workloads:
        for T in args.lengths:
            rows.append(measure(workload, T, args.repeats))
            r = rows[-1]
            print(f"  {workload:>17} T={T:<4} inferred {r['median_s']['inferred']:.3f} s, one "
                  f"decay {r['median_s']['one decay']:.3f} s: {r['ratio']:.2f}x", file=sys.stderr,
                  flush=True)
    print('| workload | T | decays inferred | s / sequence, inferred | s / sequence, one decay '
          '| ratio | same program | load average |')
    print('|---|---:|---|---:|---:|---:|---|---|')
    for r in rows:
        same = {None: '-', True: 'yes', False: 'no'}[r['same_program']]
        print(f"| {r['workload']} | {r['T']} | {' / '.join(f'{d:.4g}' for d in r['decays'])} | "
              f"{r['median_s']['inferred']:.3f} | {r['median_s']['one decay']:.3f} | "
              f"{r['ratio']:.2f}x | {same} | {r['load_average'][0][0]:.1f}-"
              f"{r['load_average'][1][0]:.1f} |")
    write_results(args.out, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
