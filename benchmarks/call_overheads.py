"""What a learner's call costs besides the sequence itself: donated state buffers and the
finiteness check of the inputs.

* ``--part donation``: each online executor with its state (the traces) donated to the
  compiled call, so it is advanced in the buffers of the last call, against allocated
  afresh by every call; on the standard workload in both neuron styles and on the
  DVS-sized net. The executors keep the faster choice (``Learner.donate_state``).
* ``--part finite``: ``check_finite=True`` (the default: xs and targets are checked for
  NaN and infinities before the call) against ``False``, on the standard workload.

Interleaved rounds in one process (``timing.interleaved``), median seconds per sequence.
``python3 benchmarks/call_overheads.py --part donation --json FILE``.
"""
from __future__ import annotations

import argparse
import statistics

import jax

import braintrace_conv as bc
from results_file import default_path, write_results
from timing import interleaved
from workloads import (cross_entropy, make_data, make_dvs_data, make_dvs_model, make_model)

EXECUTORS = {'es-d-rtrl': lambda m: bc.ES_D_RTRL(m), 'd-rtrl': lambda m: bc.D_RTRL(m),
             'bptt': lambda m: bc.BPTT(m)}


def _call(learner, xs, ys):
    def run():
        loss, grads = learner.value_and_grad(cross_entropy, xs, ys)
        jax.block_until_ready((loss, grads))
    run()                                          # compile, and fill the buffers once
    return run


def _workloads(names, T, dvs_T):
    for name in names:
        if name.startswith('dvs-'):
            layout = name[4:]
            yield name, lambda layout=layout: make_dvs_model(layout), make_dvs_data(layout, dvs_T)
        else:
            yield name, lambda name=name: make_model(name), make_data(name, T)


def donation(args):
    rows = []
    for workload, make, (xs, ys) in _workloads(args.workloads, args.T, args.dvs_T):
        calls = {}
        for executor in ('es-d-rtrl', 'd-rtrl'):
            for donate in (True, False):
                learner = EXECUTORS[executor](make())
                learner.donate_state = donate
                calls[executor, donate] = _call(learner, xs, ys)
        times = interleaved(calls, args.rounds)
        for executor in ('es-d-rtrl', 'd-rtrl'):
            on, off = (statistics.median(times[executor, d]) for d in (True, False))
            rows.append(dict(workload=workload, executor=executor, donated_s=on,
                             fresh_s=off, ratio=on / off))
            print(f'{workload:20s} {executor:10s} donated {on:.4f} s  fresh {off:.4f} s  '
                  f'donated/fresh {on / off:.3f}', flush=True)
    return rows


def finite(args):
    rows = []
    for workload, make, (xs, ys) in _workloads(args.workloads, args.T, args.dvs_T):
        calls = {}
        for executor in ('es-d-rtrl', 'bptt'):
            for check in (True, False):
                learner = EXECUTORS[executor](make())
                learner.check_finite = check
                calls[executor, check] = _call(learner, xs, ys)
        times = interleaved(calls, args.rounds)
        for executor in ('es-d-rtrl', 'bptt'):
            on, off = (statistics.median(times[executor, c]) for c in (True, False))
            rows.append(dict(workload=workload, executor=executor, checked_s=on, unchecked_s=off,
                             ratio=on / off))
            print(f'{workload:20s} {executor:10s} checked {on:.4f} s  unchecked {off:.4f} s  '
                  f'checked/unchecked {on / off:.3f}', flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--part', choices=('donation', 'finite'), required=True)
    parser.add_argument('--workloads', nargs='+', default=['ours', 'reset-after-spike'],
                        help='ours, reset-after-spike, dvs-channels-first, dvs-channels-last')
    parser.add_argument('--T', type=int, default=100, help='steps of the standard workload')
    parser.add_argument('--dvs-T', type=int, default=8, help='steps of the DVS-sized net')
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--json', default=None)
    args = parser.parse_args()
    rows = donation(args) if args.part == 'donation' else finite(args)
    write_results(args.json or default_path(f'call_overheads_{args.part}'),
                  part=args.part, T=args.T, dvs_T=args.dvs_T, rounds=args.rounds, rows=rows)


if __name__ == '__main__':
    main()
