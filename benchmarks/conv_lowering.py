"""Convolutions inside a loop body: ``lax.conv_general_dilated`` against the conv primitive.

Every executor runs its step inside a ``lax.scan``, so what matters is the time of a
convolution *in a loop body*, where XLA's CPU backend behaves differently from a
single call. For each layer shape, in both layouts, this times one step's

* forward ``y = conv(x, K)``,
* input gradient ``dL/dx`` for a cotangent of ``y``,
* kernel gradient ``dL/dK`` for the same cotangent,

computed with plain ``lax`` (and ``jax.vjp`` of it) and with
:func:`braintrace_conv.conv` (the ``etp_conv`` primitive, whose lowering on CPU is
channels-last and whose gradients are convolutions of its own). Each is a
``lax.scan`` over ``T`` steps with fresh data per step; the median over repeats,
divided by ``T``, is reported with the ratio lax / ours and the largest difference of
the results.

Shapes: the standard workload's two layers (batch 8, 32x32, 2->8 and 8->16 stride
2), the DVS network's layers (batch 16: 5x5 stride 2 on 2x64x64, then 16->32,
32->64, 64->64 at 32, 16, 8 pixels) and a deep 128->128 layer at 16x16.

    python benchmarks/conv_lowering.py
    python benchmarks/conv_lowering.py --shapes l1 l2 --repeats 3

Prints a Markdown table and writes JSON (default benchmarks/results/conv_lowering.json).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import default_path, write_results  # noqa: E402

# name: (batch, in channels, out channels, image size, kernel size, stride, steps timed)
SHAPES = {
    'l1': (8, 2, 8, 32, 3, 1, 50),
    'l2': (8, 8, 16, 32, 3, 2, 50),
    'dvs1': (16, 2, 16, 64, 5, 2, 10),
    'dvs2': (16, 16, 32, 32, 3, 1, 10),
    'dvs3': (16, 32, 64, 16, 3, 1, 10),
    'dvs4': (16, 64, 64, 8, 3, 1, 10),
    'deep': (16, 128, 128, 16, 3, 1, 4),
}
LAYOUTS = {'NCHW': ('NCHW', 'OIHW', 'NCHW'), 'NHWC': ('NHWC', 'HWIO', 'NHWC')}


def measure(name: str, layout: str, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    import braintrace_conv as bc

    batch, c_in, c_out, size, k, stride, T = SHAPES[name]
    dn = LAYOUTS[layout]
    x_shape = (batch, c_in, size, size) if layout == 'NCHW' else (batch, size, size, c_in)
    k_shape = (c_out, c_in, k, k) if layout == 'NCHW' else (k, k, c_in, c_out)
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.random((T, *x_shape)) < 0.1, jnp.float32)
    kernel = jnp.asarray(rng.standard_normal(k_shape), jnp.float32)
    options = dict(strides=(stride, stride), padding='SAME', dimension_numbers=dn)
    implementations = {
        'lax': lambda x, w: lax.conv_general_dilated(x, w, options['strides'], 'SAME',
                                                     dimension_numbers=dn),
        'ours': lambda x, w: bc.conv(x, w, **options),
    }
    y_shape = jax.eval_shape(implementations['lax'], xs[0], kernel).shape
    cts = jnp.asarray(rng.standard_normal((T, *y_shape)), jnp.float32)

    def programs(f):
        def forward(xs, w):
            return lax.scan(lambda c, x: (c, f(x, w)), 0, xs)[1]

        def input_grad(cts, w):
            return lax.scan(lambda c, ct: (c, jax.vjp(lambda x: f(x, w), xs[0])[1](ct)[0]),
                            0, cts)[1]

        def kernel_grad(xs, cts):
            def body(acc, pair):
                x, ct = pair
                return acc + jax.vjp(lambda w: f(x, w), kernel)[1](ct)[0], None
            return lax.scan(body, jnp.zeros_like(kernel), (xs, cts))[0]

        return {'forward': (jax.jit(forward), (xs, kernel)),
                'input gradient': (jax.jit(input_grad), (cts, kernel)),
                'kernel gradient': (jax.jit(kernel_grad), (xs, cts))}

    progs = {impl: programs(f) for impl, f in implementations.items()}
    row = dict(shape=name, layout=layout, batch=batch, in_channels=c_in, out_channels=c_out,
               size=size, kernel=k, stride=stride, steps=T)
    for part in ('forward', 'input gradient', 'kernel gradient'):
        results, times = {}, {impl: [] for impl in progs}
        for impl in progs:
            fn, args = progs[impl][part]
            results[impl] = np.asarray(jax.block_until_ready(fn(*args)))   # compile + warm-up
        for r in range(repeats):
            for impl in (list(progs) if r % 2 == 0 else list(progs)[::-1]):
                fn, args = progs[impl][part]
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[impl].append(time.perf_counter() - start)
        scale = float(np.max(np.abs(results['lax']))) or 1.0
        row[part] = dict(lax_ms=1e3 * float(np.median(times['lax'])) / T,
                         ours_ms=1e3 * float(np.median(times['ours'])) / T,
                         max_rel_diff=float(np.max(np.abs(results['ours'] - results['lax'])))
                         / scale)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--shapes', nargs='+', default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument('--layouts', nargs='+', default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', default=default_path('conv_lowering'))
    args = parser.parse_args(argv)
    import jax
    rows = []
    for name in args.shapes:
        for layout in args.layouts:
            rows.append(measure(name, layout, args.repeats))
            print(f'  {name} {layout} done', file=sys.stderr, flush=True)
    parts = ('forward', 'input gradient', 'kernel gradient')
    print(f'ms per step inside a scan, {jax.devices()[0].device_kind}; lax / ours')
    print('| shape | layout | ' + ' | '.join(f'{p} lax | {p} ours' for p in parts) + ' |')
    print('|---|---|' + '---:|---:|' * len(parts))
    for r in rows:
        cells = ' | '.join(f"{r[p]['lax_ms']:.3f} | {r[p]['ours_ms']:.3f} "
                           f"({r[p]['lax_ms'] / r[p]['ours_ms']:.1f}x)" for p in parts)
        print(f"| {r['shape']} | {r['layout']} | {cells} |")
    worst = max(r[p]['max_rel_diff'] for r in rows for p in parts)
    print(f'largest difference to lax, relative to the largest |value|: {worst:.1e}')
    write_results(args.out, device=jax.devices()[0].device_kind, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
