"""Gradients in bfloat16 with float32 traces against float32, on the standard workload.

For both neuron styles of ``workloads.py`` the model is built in float32 and
again in bfloat16 (brainstate's default float type, so its states too where the
model creates them with it; every parameter cast); D-RTRL and ES-D-RTRL
run the bfloat16 copy with ``trace_dtype=jnp.float32`` (traces and gradient
accumulators in float32) and BPTT runs it as is. Printed per algorithm: the
cosine of the gradient to the float32 model's gradient from the same
algorithm, the largest relative error per parameter, and the time per sequence
of both precisions (median of ``--repeats`` interleaved runs; on CPU bfloat16 is
not expected to be faster — the point is accuracy). A spiking network in bfloat16 does not spike like the
float32 one (thresholds amplify rounding), so BPTT's own row is the yardstick: an
online executor whose cosine matches BPTT's loses nothing to its traces.

    python benchmarks/mixed_precision.py --T 100

Prints a Markdown table and writes JSON (default benchmarks/results/mixed_precision.json).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402


def _bfloat16_model(style):
    """The style's model built with brainstate's default float type set to bfloat16 (its
    parameters and the states it creates), every parameter cast to bfloat16."""
    import brainstate
    import jax
    import jax.numpy as jnp

    from workloads import make_model
    old = brainstate.environ.get_precision()
    brainstate.environ.set(precision='bf16')
    try:
        model = make_model(style)
    finally:
        brainstate.environ.set(precision=old)
    for st in model.states(brainstate.ParamState).values():
        st.value = jax.tree.map(lambda a: a.astype(jnp.bfloat16), st.value)
    return model


def measure(style: str, T: int, repeats: int) -> list[dict]:
    import brainstate
    import jax
    import jax.numpy as jnp

    import braintrace_conv as bc
    from workloads import cross_entropy, make_data, make_model

    xs, labels = make_data(style, T)
    rows = []
    makers = {'bptt': lambda m, td: bc.BPTT(m),
              'es-d-rtrl': lambda m, td: bc.ES_D_RTRL(m, trace_dtype=td),
              'd-rtrl': lambda m, td: bc.D_RTRL(m, trace_dtype=td)}
    for name, make in makers.items():
        full = make(make_model(style), None)
        low = make(_bfloat16_model(style), jnp.float32)
        results, times = {}, {'float32': [], 'bfloat16': []}

        def run(tag, learner):     # hidden states are created (on reset) in the model's type
            with brainstate.environ.context(precision='bf16' if tag == 'bfloat16' else 32):
                return jax.block_until_ready(learner.value_and_grad(cross_entropy, xs, labels))

        for tag, learner in (('float32', full), ('bfloat16', low)):
            results[tag] = run(tag, learner)[1]
        for _ in range(repeats):
            for tag, learner in (('float32', full), ('bfloat16', low)):
                start = time.perf_counter()
                run(tag, learner)
                times[tag].append(time.perf_counter() - start)
        ref = [np.asarray(g, np.float64) for g in jax.tree.leaves(results['float32'])]
        got = [np.asarray(g, np.float64) for g in jax.tree.leaves(results['bfloat16'])]
        a, b = np.concatenate([g.ravel() for g in got]), np.concatenate([g.ravel() for g in ref])
        rows.append(dict(style=style, algorithm=name, T=T,
                         cosine=float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
                         max_rel_err=max(float(np.abs(g - r).max() / np.abs(r).max())
                                         for g, r in zip(got, ref)),
                         float32_s=float(np.median(times['float32'])),
                         bfloat16_s=float(np.median(times['bfloat16']))))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--T', type=int, default=100)
    parser.add_argument('--styles', nargs='+', default=['ours', 'reset-after-spike'],
                        choices=['ours', 'reset-after-spike'])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--out', default=default_path('mixed_precision'))
    args = parser.parse_args(argv)
    rows = [row for style in args.styles for row in measure(style, args.T, args.repeats)]
    print('| style | algorithm | T | cosine to float32 | largest relative error | '
          'float32 s | bfloat16 s |')
    print('|---|---|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['style']} | {r['algorithm']} | {r['T']} | {r['cosine']:.4f} | "
              f"{r['max_rel_err']:.3f} | {r['float32_s']:.3f} | {r['bfloat16_s']:.3f} |")
    write_results(args.out, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
