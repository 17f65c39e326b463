"""Time per training sequence of the standard workload here, in snnTorch and in SpikingJelly.

Workload (``workloads.py``, reset-after-spike style): batch 8, input 2x32x32
Bernoulli(0.1) spikes, conv3x3 2->8 (SAME) + LIF, conv3x3 stride 2 (SAME)
8->16 + LIF, dense 4096->10; cross-entropy averaged over the batch at every
step and summed over steps; LIF ``v = exp(-1/10) h + I``, spike ``v >= 1``,
reset by subtraction (``h = v - s``, inside the graph), sigmoid surrogate of
slope 4. One sequence = the loss and the gradient of every parameter.

Compared, all from the same initial weights (ours, converted to torch
layouts) on the same data, on CPU:

* braintrace_conv (JAX, compiled): ``BPTT``, ``ES_D_RTRL`` (decay inferred),
  ``D_RTRL``;
* snnTorch BPTT: ``snn.Leaky`` stepped in Python, one backward at the end;
  ``snn.Leaky`` with snnTorch's built-in subtract reset is timed as well,
  though it is another model (``peers_models`` says how each is configured);
* SpikingJelly BPTT: multi-step layers and ``neuron.LIFNode`` (step_mode 'm');
* SpikingJelly OTTT: ``neuron.OTTTLIFNode`` in ``layer.OTTTSequential``, a
  forward and backward every step (online, an approximate gradient).

Torch runs eagerly with 2 intra-op threads. Before timing, each method's
forward logits are compared with ours (the exact peers must match at step 0 or
the script stops), and every gradient is compared with our BPTT's (cosine and
relative error). Methods are timed in interleaved rounds (the order rotates
every round, so load drifts alike); the median per sequence is reported with
its ratio to snnTorch BPTT and to our BPTT. Peers that are not installed are
skipped with a line saying so; torch is imported only if present.

    python benchmarks/peers.py                           # T = 100 400, 5 rounds
    python benchmarks/peers.py --lengths 20 --repeats 2

The peers are never dependencies. Install them in a virtual environment that
sees the project's packages, so torch stays out of every other process (with
torch importable, saiunit imports it whenever a model is built):

    python3 -m venv --system-site-packages peers-venv
    peers-venv/bin/pip install "torch==2.13.0+cpu"      # the CPU wheel, not CUDA
    peers-venv/bin/pip install snntorch
    peers-venv/bin/pip install --no-deps spikingjelly   # its declared deps pull CUDA torch
    peers-venv/bin/pip install tqdm scipy matplotlib loguru h5py
    peers-venv/bin/python benchmarks/peers.py

Prints a Markdown table and writes JSON (default benchmarks/results/peers.json).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

TORCH_THREADS = 2
CHECK_STEPS = 20            # forward logits compared over the first steps
DIVERGED = 1e-4             # a logit further than this from ours: the runs diverged
OUR_BPTT = ('braintrace_conv', 'BPTT')
SNNTORCH_BPTT = ('snnTorch', 'BPTT')
EXACT = (SNNTORCH_BPTT, ('SpikingJelly', 'BPTT (multi-step)'))   # same function as ours


def installed() -> dict[str, str | None]:
    """The version of each peer package, ``None`` where it is not installed."""
    return {name: importlib.metadata.version(name) if importlib.util.find_spec(name) else None
            for name in ('torch', 'snntorch', 'spikingjelly')}


def our_methods(model) -> dict:
    """``{(library, algorithm): bind}``, ``bind(xs, labels) -> (run, grads, logits)``."""
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy

    def method(learner):
        def bind(xs, labels):
            last = {}

            def run():
                last['grads'] = jax.block_until_ready(
                    learner.value_and_grad(cross_entropy, xs, labels)[1])
            return run, lambda: last['grads'], lambda: np.asarray(learner.predict(xs))
        return bind
    return {('braintrace_conv', name): method(learner) for name, learner in
            (('BPTT', bc.BPTT(model)), ('ES-D-RTRL', bc.ES_D_RTRL(model)),
             ('D-RTRL', bc.D_RTRL(model)))}


def peer_methods(model, versions) -> dict:
    """The installed peers' methods, from ``model``'s current parameters."""
    if versions['torch'] is None:
        print('torch is not installed: snnTorch and SpikingJelly skipped', file=sys.stderr)
        return {}
    for name in ('snntorch', 'spikingjelly'):
        if versions[name] is None:
            print(f'{name} is not installed: skipped', file=sys.stderr)
    import brainstate
    import torch

    import peers_models

    torch.set_num_threads(TORCH_THREADS)
    params = {path: state.value for path, state in model.states(brainstate.ParamState).items()}
    return peers_models.methods(params, snntorch=versions['snntorch'] is not None,
                                spikingjelly=versions['spikingjelly'] is not None)


def _leaves(grads) -> dict[str, np.ndarray]:
    """``{'conv1.weight': flat float64 array, ...}`` from a gradient pytree."""
    import jax
    return {f'{path[0].key[0]}.{path[-1].key}': np.ravel(np.asarray(g, np.float64))
            for path, g in jax.tree_util.tree_leaves_with_path(grads)}


def _cosine(a, b) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def measure(methods: dict, T: int, repeats: int) -> list[dict]:
    """Equivalence checks and interleaved timing of every method at length ``T``."""
    from workloads import make_data

    xs, labels = make_data('reset-after-spike', T)
    bound = {key: bind(xs, labels) for key, bind in methods.items()}
    ours = bound[OUR_BPTT][2]()
    rows = {}
    for key, (run, _, logits) in bound.items():
        diff = np.abs(logits() - ours).max(axis=(1, 2))
        if key in EXACT and diff[0] > DIVERGED:
            raise RuntimeError(f'{key[0]} {key[1]} does not compute our function: its logits '
                               f'differ from ours by {diff[0]:.3g} at the first step.')
        beyond = np.flatnonzero(diff > DIVERGED)
        run()                                                  # warm-up (JAX compiles)
        rows[key] = dict(library=key[0], algorithm=key[1], T=T, times_s=[],
                         logits_max_abs_diff=float(diff[:CHECK_STEPS].max()),
                         first_diverged_step=int(beyond[0]) if beyond.size else None)
    order = list(bound)
    for r in range(repeats):
        for key in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            bound[key][0]()
            rows[key]['times_s'].append(time.perf_counter() - start)
    reference = _leaves(bound[OUR_BPTT][1]())
    for key, row in rows.items():
        grads = _leaves(bound[key][1]())
        g, ref = (np.concatenate(list(d.values())) for d in (grads, reference))
        row['median_s'] = float(np.median(row['times_s']))
        row['cosine_to_our_bptt'] = _cosine(g, ref)
        row['rel_error_to_our_bptt'] = float(np.linalg.norm(g - ref) / np.linalg.norm(ref))
        row['cosine_per_parameter'] = {name: _cosine(grads[name], reference[name])
                                       for name in reference}
    for row in rows.values():
        row['vs_our_bptt'] = row['median_s'] / rows[OUR_BPTT]['median_s']
        row['vs_snntorch_bptt'] = (row['median_s'] / rows[SNNTORCH_BPTT]['median_s']
                                   if SNNTORCH_BPTT in rows else None)
    return list(rows.values())


def table(rows: list[dict]) -> str:
    ratio = lambda v: '–' if v is None else f'{v:.2f}x'
    lines = [f'| library | algorithm | T | s / sequence | vs snnTorch BPTT | vs our BPTT | '
             f'max abs logit diff, first {CHECK_STEPS} steps | gradient cosine to our BPTT | '
             f'relative error |', '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        lines.append(f"| {r['library']} | {r['algorithm']} | {r['T']} | {r['median_s']:.3f} | "
                     f"{ratio(r['vs_snntorch_bptt'])} | {ratio(r['vs_our_bptt'])} | "
                     f"{r['logits_max_abs_diff']:.1e} | {r['cosine_to_our_bptt']:.6f} | "
                     f"{r['rel_error_to_our_bptt']:.1e} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[100, 400])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', default=default_path('peers'))
    args = parser.parse_args(argv)
    if min(args.lengths) < 1 or args.repeats < 1:
        parser.error('--lengths and --repeats must be positive integers')
    from workloads import make_model

    versions = installed()
    model = make_model('reset-after-spike')
    methods = {**our_methods(model), **peer_methods(model, versions)}
    rows = []
    for T in args.lengths:
        for row in measure(methods, T, args.repeats):
            rows.append(row)
            print(f"  {row['library']:>15} {row['algorithm']:<38} T={T:<4} "
                  f"{row['median_s']:.3f} s  cos {row['cosine_to_our_bptt']:.6f}",
                  file=sys.stderr, flush=True)
    print(table(rows))
    import jax
    versions.update(jax=jax.__version__, brainstate=importlib.metadata.version('brainstate'))
    write_results(args.out, machine=dict(torch_threads=TORCH_THREADS), versions=versions,
                  rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
