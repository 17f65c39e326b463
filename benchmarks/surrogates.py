"""Our sigmoid surrogate against braintools' on the standard workload.

The reset-after-spike workload (``workloads.py``) runs with its spike function
set to ``braintrace_conv.nn.surrogate.Sigmoid(4.0)`` or to
``braintools.surrogate.Sigmoid(alpha=4.0)`` (the same function and derivative),
under BPTT, ES-D-RTRL and D-RTRL. Each pair is compiled once and timed in
interleaved rounds; the table gives the medians, their ratio and the cosine
between the two gradients. A second table gives each derivative's relative error
to float64 in float32 at a few distances from threshold (where ``s (1 - s)``
cancels, the derivative of ``exp(-|x|)`` form keeps its digits).

    python benchmarks/surrogates.py                 # T = 100, 5 rounds
    python benchmarks/surrogates.py --T 400 --repeats 7

Needs braintools (``pip install -e ".[brainpy]"``). Prints Markdown tables and writes
JSON (default benchmarks/results/surrogates.json).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402
from timing import interleaved  # noqa: E402


def surrogates():
    import braintools

    from braintrace_conv.nn.surrogate import Sigmoid
    return {'ours': Sigmoid(4.0), 'braintools': braintools.surrogate.Sigmoid(alpha=4.0)}


def timings(T: int, repeats: int) -> list[dict]:
    import jax

    import braintrace_conv as bc
    from workloads import cross_entropy, make_data, make_model

    xs, labels = make_data('reset-after-spike', T)
    learners, grads = {}, {}
    for name, spike in surrogates().items():
        model = make_model('reset-after-spike')
        model.lif1.spike = model.lif2.spike = spike
        for algorithm, make in (('bptt', bc.BPTT), ('es-d-rtrl', bc.ES_D_RTRL),
                                ('d-rtrl', bc.D_RTRL)):
            learner = make(model)
            _, grads[name, algorithm] = learner.value_and_grad(cross_entropy, xs, labels)
            jax.block_until_ready(grads[name, algorithm])
            learners[name, algorithm] = learner
    times = interleaved({key: (lambda l=learner: jax.block_until_ready(
        l.value_and_grad(cross_entropy, xs, labels))) for key, learner in learners.items()},
        repeats)
    flat = lambda g: np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(g)])
    rows = []
    for algorithm in ('bptt', 'es-d-rtrl', 'd-rtrl'):
        a, b = flat(grads['ours', algorithm]), flat(grads['braintools', algorithm])
        ours = float(np.median(times['ours', algorithm]))
        theirs = float(np.median(times['braintools', algorithm]))
        rows.append(dict(algorithm=algorithm, T=T, ours_s=ours, braintools_s=theirs,
                         ratio=ours / theirs,
                         gradient_cosine=float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))))
    return rows


def accuracy() -> list[dict]:
    import jax
    import jax.numpy as jnp

    rows = []
    xs = np.array([-20.0, -5.0, -1.0, 0.0, 1.0, 5.0, 20.0])
    exact = 4.0 * np.exp(-4.0 * np.abs(xs)) / (1.0 + np.exp(-4.0 * np.abs(xs))) ** 2
    for name, spike in surrogates().items():
        grad = jax.vmap(jax.grad(lambda x: spike(x)))(jnp.asarray(xs, jnp.float32))
        rel = np.abs(np.asarray(grad, np.float64) - exact) / exact
        rows.append(dict(surrogate=name, x=xs.tolist(), relative_error=rel.tolist()))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--T', type=int, default=100)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', default=default_path('surrogates'))
    args = parser.parse_args(argv)
    rows, errors = timings(args.T, args.repeats), accuracy()
    print('| algorithm | T | ours s | braintools s | ours / braintools | gradient cosine |')
    print('|---|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['algorithm']} | {r['T']} | {r['ours_s']:.3f} | {r['braintools_s']:.3f} | "
              f"{r['ratio']:.2f} | {r['gradient_cosine']:.6f} |")
    print()
    print('| surrogate | ' + ' | '.join(f'x = {x:g}' for x in errors[0]['x']) + ' |')
    print('|---|' + '---:|' * len(errors[0]['x']))
    for r in errors:
        print(f"| {r['surrogate']} | " + ' | '.join(f'{e:.1e}' for e in r['relative_error']) + ' |')
    write_results(args.out, timings=rows, float32_derivative=errors)
    return 0


if __name__ == '__main__':
    sys.exit(main())
