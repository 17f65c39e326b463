"""Correctness of the conv ETP primitive.

* forward, gradients, ``jit`` and ``vmap`` against ``jax.lax.conv_general_dilated``
  over a combined grid of ranks, layouts, strides, paddings, dilations and groups;
* property-based checks over random configurations;
* an independent plain-loop reference written from the XLA convolution semantics;
* every ETP rule against ``jax.jacobian`` / ``jax.vjp`` of the forward;
* units and input validation.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax import lax

from braintrace_conv import conv, etp_conv_p

TOL = dict(rtol=1e-10, atol=1e-10)
SPATIAL_CHARS = {1: 'W', 2: 'HW', 3: 'DHW'}


# =========================================================================== helpers
@pytest.fixture(autouse=True, scope='module')
def float64():
    """Run in float64 even if an import (brainstate sets its own precision) reset it."""
    with jax.enable_x64(True):
        yield


def layout(n_spatial: int, kind: str):
    """User-facing ``dimension_numbers`` of one of three layout families."""
    s = SPATIAL_CHARS[n_spatial]
    return {'default': None,
            'channel_last': ('N' + s + 'C', s + 'IO', 'N' + s + 'C'),
            'mixed': ('N' + s + 'C', 'OI' + s, 'NC' + s)}[kind]


def place(spec, sizes):
    """Shape with ``sizes[j]`` on axis ``spec[j]`` (sizes given in canonical order)."""
    shape = [None] * len(spec)
    for axis, size in zip(spec, sizes):
        shape[axis] = size
    return tuple(shape)


def per_dim(value, n):
    """Broadcast an int, or truncate a per-dimension tuple, to ``n`` entries."""
    if isinstance(value, int):
        return (value,) * n
    return tuple(value[:n])


def explicit_padding(size, ksize, strides, padding, rhs_dilation):
    """``(low, high)`` pairs for a padding string, written from its definition."""
    if not isinstance(padding, str):
        return [tuple(p) for p in padding]
    pads = []
    for n, k, s, d in zip(size, ksize, strides, rhs_dilation):
        if padding == 'VALID':
            pads.append((0, 0))
            continue
        window = (k - 1) * d + 1
        out = -(-n // s)
        total = max((out - 1) * s + window - n, 0)
        low = total // 2 if padding == 'SAME' else total - total // 2
        pads.append((low, total - low))
    return pads


@dataclasses.dataclass(frozen=True)
class Cfg:
    """A convolution configuration; sizes are in canonical (``NC...``/``OI...``) order."""
    n_spatial: int
    dimension_numbers: Any = None
    batch: int = 2
    in_ch: int = 4
    out_ch: int = 4
    size: tuple = ()
    ksize: tuple = ()
    strides: tuple = ()
    padding: Any = 'VALID'
    lhs_dilation: tuple = ()
    rhs_dilation: tuple = ()
    feature_group_count: int = 1
    batch_group_count: int = 1
    bias: bool = True

    @property
    def dn(self) -> lax.ConvDimensionNumbers:
        nd = self.n_spatial + 2
        return lax.conv_dimension_numbers((1,) * nd, (1,) * nd, self.dimension_numbers)

    @property
    def x_shape(self):
        return place(self.dn.lhs_spec, (self.batch, self.in_ch, *self.size))

    @property
    def k_shape(self):
        return place(self.dn.rhs_spec,
                     (self.out_ch, self.in_ch // self.feature_group_count, *self.ksize))

    @property
    def groups(self):
        return self.feature_group_count * self.batch_group_count

    @property
    def pads(self):
        return explicit_padding(self.size, self.ksize, self.strides, self.padding,
                                self.rhs_dilation)

    @property
    def out_size(self):
        out = []
        for n, k, s, ld, rd, (lo, hi) in zip(self.size, self.ksize, self.strides,
                                              self.lhs_dilation, self.rhs_dilation, self.pads):
            base = (n - 1) * ld + 1 + lo + hi
            window = (k - 1) * rd + 1
            out.append((base - window) // s + 1 if base >= window else 0)
        return tuple(out)

    @property
    def y_shape(self):
        return place(self.dn.out_spec,
                     (self.batch // self.batch_group_count, self.out_ch, *self.out_size))

    def kwargs(self):
        return dict(strides=self.strides, padding=self.padding, lhs_dilation=self.lhs_dilation,
                    rhs_dilation=self.rhs_dilation, feature_group_count=self.feature_group_count,
                    batch_group_count=self.batch_group_count,
                    dimension_numbers=self.dimension_numbers)

    def arrays(self, seed=0, dtype=jnp.float64):
        rng = np.random.default_rng(seed)
        x = jnp.asarray(rng.standard_normal(self.x_shape), dtype)
        k = jnp.asarray(rng.standard_normal(self.k_shape), dtype)
        b = jnp.asarray(rng.standard_normal((self.out_ch,)), dtype) if self.bias else None
        return x, k, b


def make_cfg(n_spatial, kind='default', *, size=(6, 5, 4), ksize=(3, 2, 2), strides=1,
             padding='VALID', lhs_dilation=1, rhs_dilation=1, **kw):
    """A :class:`Cfg` from rank-generic (broadcast or truncated) per-dimension values."""
    if not isinstance(padding, str):
        padding = tuple(tuple(p) for p in padding[:n_spatial])
    dims = layout(n_spatial, kind) if isinstance(kind, str) else kind
    return Cfg(n_spatial, dims, size=per_dim(size, n_spatial), ksize=per_dim(ksize, n_spatial),
               strides=per_dim(strides, n_spatial), padding=padding,
               lhs_dilation=per_dim(lhs_dilation, n_spatial),
               rhs_dilation=per_dim(rhs_dilation, n_spatial), **kw)


def lax_conv(cfg: Cfg, x, k, b):
    y = lax.conv_general_dilated(
        x, k, window_strides=cfg.strides, padding=cfg.padding, lhs_dilation=cfg.lhs_dilation,
        rhs_dilation=cfg.rhs_dilation, dimension_numbers=cfg.dimension_numbers,
        feature_group_count=cfg.feature_group_count, batch_group_count=cfg.batch_group_count,
        precision=lax.Precision.HIGHEST)
    if b is not None:
        shape = [1] * y.ndim
        shape[cfg.dn.out_spec[1]] = -1
        y = y + b.reshape(shape)
    return y


def our_conv(cfg: Cfg, x, k, b):
    return conv(x, k, b, **cfg.kwargs())


def value_and_grads(fn, cfg, x, k, b, ct):
    """Forward value and the gradients of ``sum(fn * ct)`` w.r.t. x, kernel (and bias)."""
    args = (x, k) if b is None else (x, k, b)

    def loss(*a):
        return jnp.sum(fn(cfg, *a, *([None] if b is None else [])) * ct)

    return fn(cfg, x, k, b), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


def assert_tree_close(actual, expected, tol=TOL):
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_e, tree_e = jax.tree.flatten(expected)
    assert tree_a == tree_e
    for a, e in zip(leaves_a, leaves_e):
        assert np.shape(a) == np.shape(e)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), **tol)


def bind_params(cfg: Cfg, x, k, b):
    """The params ``etp_conv_p`` is bound with for this configuration."""
    args = (x, k) if b is None else (x, k, b)
    eqn = jax.make_jaxpr(lambda *a: conv(*a, **cfg.kwargs()))(*args).jaxpr.eqns[-1]
    assert eqn.primitive is etp_conv_p
    return eqn.params


# =========================================================================== 1. grid vs lax
# Each variant fixes strides, padding, dilations and groups (per-dimension values are
# truncated to the rank). Every variant runs at two ranks, and the layout rotates with the
# variant so that every (rank, layout) pair meets two different variants. The first run of
# each variant also checks jit(vmap(...)) over x and over the kernel; those runs alone
# cover every variant and every (rank, layout) pair.
VARIANTS = {
    'valid': dict(),
    'same-s2-rdil-fgroups': dict(strides=2, padding='SAME', rhs_dilation=2,
                                 feature_group_count=2),
    'samelower-mixedstride-bgroups': dict(strides=(2, 1, 2), padding='SAME_LOWER',
                                          batch_group_count=2),
    'explicit-ldil-fgroups': dict(padding=((1, 2), (2, 0), (0, 1)), lhs_dilation=2,
                                  feature_group_count=2),
    'negative-s2-rdil-bgroups': dict(strides=2, padding=((-1, 1), (1, -1), (-1, 0)),
                                     rhs_dilation=2, batch_group_count=2),
    'depthwise-same-mixedrdil': dict(padding='SAME', rhs_dilation=(1, 2, 1),
                                     feature_group_count=4),
    'explicit-mixed-dilations': dict(strides=(1, 2, 1), padding=((2, -1), (0, 2), (1, 1)),
                                     lhs_dilation=(2, 1, 3), rhs_dilation=(1, 2, 2)),
    'negative-ldil-s3-bgroups': dict(strides=(3, 1, 2), padding=((-2, -1), (-1, 0), (0, -1)),
                                     lhs_dilation=2, batch_group_count=2),
    'samelower-s2-rdil-nobias': dict(strides=2, padding='SAME_LOWER', rhs_dilation=(2, 1, 1),
                                     feature_group_count=2, bias=False),
}
LAYOUT_KINDS = ('default', 'channel_last', 'mixed')
GRID = [pytest.param(make_cfg(rank, LAYOUT_KINDS[(v // 3 + slot) % 3], **opts), slot == 0,
                     id=f'{rank}d-{LAYOUT_KINDS[(v // 3 + slot) % 3]}-{name}'
                        + ('-vmap' if slot == 0 else ''))
        for v, (name, opts) in enumerate(VARIANTS.items())
        for slot, rank in enumerate(((v % 3) + 1, (v + 1) % 3 + 1))]


@pytest.mark.parametrize('cfg, with_vmap', GRID)
def test_grid_against_lax(cfg, with_vmap):
    assert all(o > 0 for o in cfg.out_size)
    x, k, b = cfg.arrays(seed=1)
    rng = np.random.default_rng(2)
    x2 = jnp.asarray(rng.standard_normal(x.shape))
    k2 = jnp.asarray(rng.standard_normal(k.shape))
    ct = jnp.asarray(rng.standard_normal(cfg.y_shape))

    @jax.jit
    def ours(x, x_pair, k, k_pair, b):
        plain = value_and_grads(our_conv, cfg, x, k, b, ct)
        if not with_vmap:
            return plain, None, None
        over_x = jax.vmap(lambda xx: value_and_grads(our_conv, cfg, xx, k, b, ct))(x_pair)
        over_k = jax.vmap(lambda kk: value_and_grads(our_conv, cfg, x, kk, b, ct))(k_pair)
        return plain, over_x, over_k

    plain, over_x, over_k = ours(x, jnp.stack([x, x2]), k, jnp.stack([k, k2]), b)
    reference = jax.jit(lambda x, k, b: value_and_grads(lax_conv, cfg, x, k, b, ct))
    expected = reference(x, k, b)
    assert plain[0].shape == cfg.y_shape
    assert_tree_close(plain, expected)
    if with_vmap:
        stack = lambda *t: jax.tree.map(lambda *a: jnp.stack(a), *t)
        assert_tree_close(over_x, stack(expected, reference(x2, k, b)))
        assert_tree_close(over_k, stack(expected, reference(x, k2, b)))


def test_grid_covers_every_value():
    seen = {'rank-layout': set(), 'padding': set(), 'strides': set(), 'lhs': set(),
            'rhs': set(), 'fgc': set(), 'bgc': set(), 'bias': set()}
    vmap_seen = set()
    for param in GRID:
        cfg, with_vmap = param.values
        kind = next(k for k in LAYOUT_KINDS if layout(cfg.n_spatial, k) == cfg.dimension_numbers)
        seen['rank-layout'].add((cfg.n_spatial, kind))
        if with_vmap:
            vmap_seen.add((cfg.n_spatial, kind))
        pad = cfg.padding
        seen['padding'].add(pad if isinstance(pad, str) else
                            'negative' if any(v < 0 for p in pad for v in p) else 'explicit')
        seen['strides'].update(cfg.strides)
        seen['lhs'].update(cfg.lhs_dilation)
        seen['rhs'].update(cfg.rhs_dilation)
        seen['fgc'].add(cfg.feature_group_count)
        seen['bgc'].add(cfg.batch_group_count)
        seen['bias'].add(cfg.bias)
    assert len(seen['rank-layout']) == 9
    assert vmap_seen == seen['rank-layout']
    assert seen['padding'] == {'SAME', 'VALID', 'SAME_LOWER', 'explicit', 'negative'}
    assert seen['strides'] == {1, 2, 3}
    assert seen['lhs'] >= {1, 2} and seen['rhs'] >= {1, 2}
    assert seen['fgc'] >= {1, 2, 4} and seen['bgc'] == {1, 2} and seen['bias'] == {True, False}


def test_accepts_lists_numpy_ints_and_lowercase_padding():
    cfg = make_cfg(2, 'channel_last', strides=(2, 1), padding='SAME')
    x, k, b = cfg.arrays()
    y = conv(x, k, b, strides=[np.int64(2), 1], padding='same', lhs_dilation=[1, 1],
             rhs_dilation=np.array([1, 1]), dimension_numbers=list(cfg.dimension_numbers))
    assert_tree_close(y, lax_conv(cfg, x, k, b))
    pads = [[1, 0], [np.int32(-1), 2]]
    cfg = make_cfg(2, strides=1, padding=pads)
    assert_tree_close(conv(x.transpose(0, 3, 1, 2), k.transpose(3, 2, 0, 1), b, strides=1,
                           padding=pads),
                      lax_conv(cfg, x.transpose(0, 3, 1, 2), k.transpose(3, 2, 0, 1), b))


def test_int_strides_broadcast_and_scan():
    cfg = make_cfg(2, 'mixed', size=(5, 4), ksize=(2, 2), strides=2, padding='SAME')
    x, k, b = cfg.arrays()
    xs = jnp.stack([x, -x, 2 * x])

    def total(fn, kk):
        def step(carry, xt):
            y = fn(cfg, xt, kk, b)
            return carry + jnp.sum(jnp.sin(y)), y
        return lax.scan(step, 0.0, xs)

    ours = jax.jit(jax.value_and_grad(lambda kk: total(our_conv, kk), has_aux=True))(k)
    expected = jax.jit(jax.value_and_grad(lambda kk: total(lax_conv, kk), has_aux=True))(k)
    assert_tree_close(ours, expected)
    # an int stride is broadcast to every spatial dimension
    assert_tree_close(conv(x, k, b, strides=2, padding='SAME',
                           dimension_numbers=cfg.dimension_numbers), expected[0][1][0])


def test_linear_transpose_in_x_and_in_kernel():
    cfg = make_cfg(2, 'mixed', size=(5, 4), ksize=(2, 2), strides=(2, 1), padding=((1, -1), (0, 1)),
                   batch=4, batch_group_count=2, bias=False)
    x, k, _ = cfg.arrays(seed=31)
    ct = jnp.asarray(np.random.default_rng(32).standard_normal(cfg.y_shape))

    @jax.jit
    def transposes(x, k, ct):
        (tx,) = jax.linear_transpose(lambda xx: our_conv(cfg, xx, k, None), x)(ct)
        (tk,) = jax.linear_transpose(lambda kk: our_conv(cfg, x, kk, None), k)(ct)
        return tx, tk

    @jax.jit
    def vjps(x, k, ct):
        return jax.vjp(lambda xx, kk: lax_conv(cfg, xx, kk, None), x, k)[1](ct)

    assert_tree_close(transposes(x, k, ct), vjps(x, k, ct))


def test_precision_and_preferred_element_type_pass_through():
    cfg = make_cfg(1, strides=1, padding='SAME', bias=True)
    x, k, b = cfg.arrays(dtype=jnp.float32)
    y = conv(x, k, b, strides=1, padding='SAME', precision='highest',
             preferred_element_type=jnp.float64)
    ref = lax.conv_general_dilated(x, k, (1,), 'SAME', precision=lax.Precision.HIGHEST,
                                   preferred_element_type=jnp.float64) + b[:, None]
    assert y.dtype == jnp.float64
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    y32 = conv(x, k, b, strides=1, padding='SAME')
    assert y32.dtype == jnp.float32


# =========================================================================== 2. property-based
SPATIAL_POOL = 'DHWXYZ'


@st.composite
def random_cfgs(draw):
    n_sp = draw(st.integers(1, 3))
    group_kind = draw(st.sampled_from(['none', 'feature', 'batch']))
    count = 1 if group_kind == 'none' else draw(st.integers(2, 3))
    fgc = count if group_kind == 'feature' else 1
    bgc = count if group_kind == 'batch' else 1
    max_size = (7, 5, 4)[n_sp - 1]
    ints = lambda lo, hi: tuple(draw(st.integers(lo, hi)) for _ in range(n_sp))
    size, ksize, strides, rhs_dil = ints(1, max_size), ints(1, 3), ints(1, 3), ints(1, 3)
    pad_kind = draw(st.sampled_from(['SAME', 'VALID', 'SAME_LOWER', 'explicit']))
    if pad_kind == 'explicit':
        padding = tuple((draw(st.integers(-2, 3)), draw(st.integers(-2, 3)))
                        for _ in range(n_sp))
        lhs_dil = ints(1, 3)
    else:  # lax defines string padding only without lhs dilation
        padding, lhs_dil = pad_kind, (1,) * n_sp
    layout_kind = draw(st.sampled_from(['none', 'strings', 'numbers']))
    if layout_kind == 'none':
        dims = None
    elif layout_kind == 'strings':
        sp = ''.join(draw(st.permutations(SPATIAL_POOL))[:n_sp])
        dims = tuple(''.join(draw(st.permutations(chars)))
                     for chars in ('NC' + sp, 'OI' + sp, 'NC' + sp))
    else:
        dims = lax.ConvDimensionNumbers(*(tuple(draw(st.permutations(range(n_sp + 2))))
                                          for _ in range(3)))
    return Cfg(n_sp, dims, batch=bgc * draw(st.integers(1, 2)),
               in_ch=fgc * draw(st.integers(1, 2)),
               out_ch=fgc * bgc * draw(st.integers(1, 2)), size=size, ksize=ksize,
               strides=strides, padding=padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
               feature_group_count=fgc, batch_group_count=bgc, bias=draw(st.booleans()))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(cfg=random_cfgs(), seed=st.integers(0, 2 ** 16))
def test_random_configs_against_lax(cfg, seed):
    assume(all(o > 0 for o in cfg.out_size))
    x, k, b = cfg.arrays(seed)
    ct = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(cfg.y_shape))
    got = jax.jit(lambda x, k, b: value_and_grads(our_conv, cfg, x, k, b, ct))(x, k, b)
    expected = jax.jit(lambda x, k, b: value_and_grads(lax_conv, cfg, x, k, b, ct))(x, k, b)
    assert got[0].shape == cfg.y_shape
    assert_tree_close(got, expected)


# =========================================================================== 3. plain loops
def loop_conv(x, k, strides, pads, lhs_dilation, rhs_dilation, fgc, bgc):
    """Direct loops over output and kernel coordinates, ``NC...`` / ``OI...`` layout.

    An output element reads the (implicitly lhs-dilated, zero-padded) base area at
    ``q = out * stride + tap * rhs_dilation - pad_low``; ``q`` hits a real input
    element only if it is a multiple of the lhs dilation inside the input.
    Feature group ``f`` of the output channels reads input channels
    ``f * I .. (f + 1) * I - 1``; batch group ``g`` reads input batch block ``g``.
    """
    x, k = np.asarray(x), np.asarray(k)
    n_in, _, *size = x.shape
    n_out_ch, n_k_in, *ksize = k.shape
    n_out = n_in // bgc
    out_size = []
    for n, kk, s, ld, rd, (lo, hi) in zip(size, ksize, strides, lhs_dilation, rhs_dilation,
                                          pads):
        base = (n - 1) * ld + 1 + lo + hi
        window = (kk - 1) * rd + 1
        out_size.append(max((base - window) // s + 1, 0) if base >= window else 0)
    y = np.zeros((n_out, n_out_ch, *out_size))
    per_fg, per_bg = n_out_ch // fgc, n_out_ch // bgc
    for b, o, *pos in itertools.product(range(n_out), range(n_out_ch), *map(range, out_size)):
        src_batch = (o // per_bg) * n_out + b
        acc = 0.0
        for i, *tap in itertools.product(range(n_k_in), *map(range, ksize)):
            channel = (o // per_fg) * n_k_in + i
            index = []
            for d in range(len(size)):
                q = pos[d] * strides[d] + tap[d] * rhs_dilation[d] - pads[d][0]
                if q < 0 or q % lhs_dilation[d] or q // lhs_dilation[d] >= size[d]:
                    break
                index.append(q // lhs_dilation[d])
            else:
                acc += x[(src_batch, channel, *index)] * k[(o, i, *tap)]
        y[(b, o, *pos)] = acc
    return y


def loop_conv_cfg(cfg: Cfg, x, k, b):
    dn = cfg.dn
    y = loop_conv(np.transpose(x, dn.lhs_spec), np.transpose(k, dn.rhs_spec), cfg.strides,
                  cfg.pads, cfg.lhs_dilation, cfg.rhs_dilation, cfg.feature_group_count,
                  cfg.batch_group_count)
    if b is not None:
        y = y + np.asarray(b).reshape((1, -1) + (1,) * cfg.n_spatial)
    return np.transpose(y, np.argsort(dn.out_spec))


LOOP_CASES = [
    make_cfg(1, size=7, ksize=3, strides=2, padding='SAME'),
    make_cfg(1, 'channel_last', size=6, ksize=2, padding=((-2, 3),), lhs_dilation=3,
             rhs_dilation=2, feature_group_count=2),
    make_cfg(1, 'mixed', size=5, ksize=3, strides=2, padding='SAME_LOWER', batch_group_count=2),
    make_cfg(2, size=(5, 4), ksize=(3, 2), strides=(1, 2), padding=((1, -1), (2, 0)),
             rhs_dilation=(1, 2), feature_group_count=4),
    make_cfg(2, 'mixed', size=(4, 5), ksize=(2, 3), strides=(2, 1), padding=((0, 2), (-1, 1)),
             lhs_dilation=(2, 1), batch_group_count=2),
    make_cfg(2, lax.ConvDimensionNumbers((2, 0, 3, 1), (1, 3, 0, 2), (3, 1, 0, 2)),
             size=(5, 5), ksize=(2, 2), strides=(2, 3), padding='VALID', rhs_dilation=(2, 1),
             feature_group_count=2),
    make_cfg(3, size=(4, 3, 4), ksize=(2, 2, 2), strides=(1, 2, 1),
             padding=((1, 0), (0, 1), (-1, 1)), lhs_dilation=(1, 2, 1), rhs_dilation=(2, 1, 1),
             in_ch=2, out_ch=2, feature_group_count=2),
    make_cfg(3, 'channel_last', size=(3, 4, 3), ksize=(2, 1, 2), padding='SAME',
             in_ch=2, out_ch=4, batch_group_count=2),
]


@pytest.mark.parametrize('cfg', LOOP_CASES)
def test_against_plain_loops(cfg):
    x, k, b = cfg.arrays(seed=3)
    expected = loop_conv_cfg(cfg, x, k, b)
    assert expected.shape == cfg.y_shape
    np.testing.assert_allclose(our_conv(cfg, x, k, b), expected, **TOL)
    # The reference and lax agree too, so a disagreement above points at conv.
    np.testing.assert_allclose(lax_conv(cfg, x, k, b), expected, **TOL)


# =========================================================================== 4. ETP rules
RULE_CFGS = {
    '1d-fgroups-same': make_cfg(1, size=7, ksize=3, strides=2, padding='SAME',
                                feature_group_count=2),
    '2d-mixed-bgroups-neg': make_cfg(2, 'mixed', size=(5, 4), ksize=(2, 2), strides=(1, 2),
                                     padding=((1, -1), (0, 1)), rhs_dilation=(2, 1),
                                     batch=4, in_ch=3, batch_group_count=2),
    '2d-chlast-fgroups-ldil': make_cfg(2, 'channel_last', size=(4, 4), ksize=(3, 2),
                                       padding=((0, 1), (1, 1)), lhs_dilation=(2, 1),
                                       out_ch=6, feature_group_count=2),
    '1d-chlast-stride-same': make_cfg(1, 'channel_last', size=6, ksize=3, strides=2,
                                      padding='SAME'),
    '2d-numbers-bgroups3': make_cfg(2, lax.ConvDimensionNumbers((1, 3, 0, 2), (2, 0, 3, 1),
                                                                (3, 0, 2, 1)),
                                    size=(4, 3), ksize=(2, 2), batch=3, in_ch=2, out_ch=3,
                                    strides=(2, 1), padding='SAME_LOWER', batch_group_count=3),
    '3d-nobias-fgroups': make_cfg(3, size=(3, 4, 3), ksize=(2, 2, 2), strides=(1, 2, 1),
                                  in_ch=2, out_ch=4, feature_group_count=2, bias=False),
}
RULES = etp_conv_p.etp_rules


@functools.lru_cache(maxsize=None)
def rule_case(name):
    """Arrays, params and jacobians (w.r.t. kernel and bias) of one configuration."""
    cfg = RULE_CFGS[name]
    x, k, b = cfg.arrays(seed=7)
    params = bind_params(cfg, x, k, b)
    jac_k = np.asarray(jax.jit(jax.jacobian(lambda kk: our_conv(cfg, x, kk, b)))(k))
    jac_b = (np.asarray(jax.jit(jax.jacobian(lambda bb: our_conv(cfg, x, k, bb)))(b))
             if b is not None else None)
    weights = {'weight': k} if b is None else {'weight': k, 'bias': b}
    return cfg, x, k, b, params, weights, jac_k, jac_b


# Layout of the position-resolved kernel trace (conv.py, ``_merged``): per output
# element and state variable ``m``, one entry per kernel entry ``p`` (``(I, *kernel
# spatial)`` flattened, channel-major), as ``(K n, P, N)``: row ``k n + m``, ``N`` the
# output's axes other than the channel, flattened in order.
def _other_axes(cfg: Cfg):
    c = cfg.dn.out_spec[1]
    return [i for i in range(len(cfg.y_shape)) if i != c]


def trace_shape(cfg: Cfg, n, taps=None):
    """Shape of the kernel trace (of the bias trace, one kernel entry: ``taps=1``)."""
    taps = cfg.in_ch // cfg.feature_group_count * math.prod(cfg.ksize) if taps is None else taps
    y = cfg.y_shape
    return (y[cfg.dn.out_spec[1]] * n, taps, math.prod(y[i] for i in _other_axes(cfg)))


def trace_index(cfg: Cfg, y_index, p, m, n):
    """Index of the trace entry of output element ``y_index`` (user layout), kernel entry
    ``p`` and state ``m`` of ``n``; ``p`` may be a slice, ``m`` an int or ``slice(None)``."""
    axes = _other_axes(cfg)
    flat = int(np.ravel_multi_index([y_index[i] for i in axes],
                                    [cfg.y_shape[i] for i in axes]))
    k = y_index[cfg.dn.out_spec[1]]
    rows = slice(k * n, (k + 1) * n) if isinstance(m, slice) else k * n + m
    return (rows, p, flat)


def position_block(trace, cfg: Cfg, y_index):
    """The ``(P, n)`` trace entries of one output element."""
    n = trace.shape[0] // cfg.y_shape[cfg.dn.out_spec[1]]
    return trace[trace_index(cfg, y_index, slice(None), slice(None), n)].T


def bias_trace_in_y_layout(trace, cfg: Cfg, n):
    """A bias trace (the trace of one kernel entry) as ``(*y.shape, n)``."""
    trace, out = np.asarray(trace), np.zeros(cfg.y_shape + (n,))
    for y_index in y_entries(cfg):
        out[y_index] = trace[trace_index(cfg, y_index, 0, slice(None), n)]
    return out


def canonical_entries(cfg: Cfg):
    """Yield ``(p, y_index, kernel_index)`` for every kernel-trace entry of state 0.

    ``y_index`` and ``kernel_index`` are the matching indices in the user's output and
    kernel layouts: output channel ``k = g * (K/G) + k'``, kernel ``(k, c, *tap)`` with
    ``(c, *tap)`` the channel-major unravelling of ``p``.
    """
    dn = cfg.dn
    tap_shape = (cfg.in_ch // cfg.feature_group_count, *cfg.ksize)
    for b, k, *rest in np.ndindex(cfg.batch // cfg.batch_group_count, cfg.out_ch,
                                  *cfg.out_size, math.prod(tap_shape)):
        s, p = tuple(rest[:-1]), rest[-1]
        c, *tap = np.unravel_index(p, tap_shape)
        yield p, place(dn.out_spec, (b, k, *s)), place(dn.rhs_spec, (k, c, *tap))


def y_entries(cfg: Cfg):
    """Yield the index of every output element in the user's layout."""
    for b, k, *s in np.ndindex(cfg.batch // cfg.batch_group_count, cfg.out_ch, *cfg.out_size):
        yield place(cfg.dn.out_spec, (b, k, *s))


@functools.lru_cache(maxsize=None)
def jitted_rule(rule, case):
    """``RULES[rule]`` bound to the params of configuration ``case``, jitted once."""
    params = rule_case(case)[4]
    return jax.jit(lambda *a: RULES[rule](*a, **params))


@pytest.mark.parametrize('name', list(RULE_CFGS))
def test_xdf_to_trace_is_the_jacobian(name):
    cfg, x, k, b, params, weights, jac_k, jac_b = rule_case(name)
    y_shape = cfg.y_shape
    rng = np.random.default_rng(11)
    for df in (jnp.ones(y_shape + (1,)), jnp.asarray(rng.standard_normal(y_shape + (2,)))):
        n = df.shape[-1]
        trace = jitted_rule('xdf_to_trace', name)(x, df, weights)
        assert set(trace) == set(weights)
        assert trace['weight'].shape == trace_shape(cfg, n)
        trace_k = np.asarray(trace['weight'])
        df_np = np.asarray(df)
        for m in range(n):
            # Scatter the trace back into a (y, kernel) Jacobian; every entry that no
            # trace entry maps to (a cross-channel term) must be zero in the real one.
            rebuilt = np.zeros_like(jac_k)
            for p, y_index, k_index in canonical_entries(cfg):
                assert rebuilt[y_index + k_index] == 0
                rebuilt[y_index + k_index] = trace_k[trace_index(cfg, y_index, p, m, n)]
            scaled = jac_k * df_np[..., m].reshape(y_shape + (1,) * k.ndim)
            np.testing.assert_allclose(rebuilt, scaled, **TOL)
        if b is not None:
            assert trace['bias'].shape == trace_shape(cfg, n, taps=1)
            np.testing.assert_array_equal(bias_trace_in_y_layout(trace['bias'], cfg, n), df)


@pytest.mark.parametrize('name', list(RULE_CFGS))
@pytest.mark.parametrize('n', [1, 2])
def test_trace_to_dw_of_xdf_equals_xy_to_dw_and_jacobian(name, n):
    cfg, x, k, b, params, weights, jac_k, jac_b = rule_case(name)
    rng = np.random.default_rng(13 + n)
    df = jnp.asarray(rng.standard_normal(cfg.y_shape + (n,)))
    g = jnp.asarray(rng.standard_normal(cfg.y_shape + (n,)))
    trace = jitted_rule('xdf_to_trace', name)(x, df, weights)
    via_trace = jitted_rule('trace_to_dw', name)(trace, g, weights)
    signal = jnp.sum(g * df, axis=-1)
    via_vjp = jitted_rule('xy_to_dw', name)(x, signal, weights)
    expected = {'weight': np.tensordot(np.asarray(signal), jac_k, axes=signal.ndim)}
    if b is not None:
        expected['bias'] = np.tensordot(np.asarray(signal), jac_b, axes=signal.ndim)
    assert_tree_close(via_trace, expected)
    assert_tree_close(via_vjp, expected)


@pytest.mark.parametrize('name', list(RULE_CFGS))
@pytest.mark.parametrize('n', [1, 2])
def test_yw_to_w_keeps_positions(name, n):
    cfg, x, k, b, params, weights, jac_k, jac_b = rule_case(name)
    rng = np.random.default_rng(17 + n)
    y_shape = cfg.y_shape
    trace = {'weight': jnp.asarray(rng.standard_normal(trace_shape(cfg, n)))}
    if b is not None:
        trace['bias'] = jnp.asarray(rng.standard_normal(trace_shape(cfg, n, taps=1)))
    d = jnp.asarray(rng.standard_normal(y_shape + (n, n)))
    g = jnp.asarray(rng.standard_normal(y_shape + (n,)))
    yw_to_w = jitted_rule('yw_to_w', name)
    trace_to_dw = jitted_rule('trace_to_dw', name)

    out = yw_to_w(d, trace)
    assert jax.tree.map(jnp.shape, out) == jax.tree.map(jnp.shape, trace)
    # Contracting D E with g is contracting E with g^T D.
    assert_tree_close(trace_to_dw(out, g, weights),
                      trace_to_dw(trace, jnp.einsum('...m,...mk->...k', g, d), weights))
    if b is not None:
        np.testing.assert_allclose(
            bias_trace_in_y_layout(out['bias'], cfg, n),
            jnp.einsum('...mk,...k->...m', d, bias_trace_in_y_layout(trace['bias'], cfg, n)), **TOL)

    # A D that is non-zero at one output element only touches that element's entries.
    entries = list(y_entries(cfg))
    for pick in rng.choice(len(entries), size=min(3, len(entries)), replace=False):
        y_index = entries[pick]
        block = rng.standard_normal((n, n))
        d_one = np.zeros(y_shape + (n, n))
        d_one[y_index] = block
        out = yw_to_w(jnp.asarray(d_one), trace)
        weight = np.array(out['weight'])
        before = position_block(np.asarray(trace['weight']), cfg, y_index)   # (P, n)
        np.testing.assert_allclose(position_block(weight, cfg, y_index), before @ block.T, **TOL)
        weight[trace_index(cfg, y_index, slice(None), slice(None), n)] = 0
        assert not weight.any()
        if b is not None:
            bias = np.array(out['bias'])
            before = position_block(np.asarray(trace['bias']), cfg, y_index)      # (1, n)
            np.testing.assert_allclose(position_block(bias, cfg, y_index), before @ block.T,
                                       **TOL)
            bias[trace_index(cfg, y_index, slice(None), slice(None), n)] = 0
            assert not bias.any()


@pytest.mark.parametrize('name', list(RULE_CFGS))
def test_xy_to_dw_is_the_weight_vjp(name):
    cfg, x, k, b, params, weights, jac_k, jac_b = rule_case(name)
    ct = jnp.asarray(np.random.default_rng(19).standard_normal(cfg.y_shape))

    @jax.jit
    def expected(ct):
        names = list(weights)
        _, vjp = jax.vjp(lambda *w: our_conv(cfg, x, *w, *([None] * (2 - len(w)))),
                         *weights.values())
        return dict(zip(names, vjp(ct)))

    assert_tree_close(jitted_rule('xy_to_dw', name)(x, ct, weights), expected(ct))


@pytest.mark.parametrize('name', list(RULE_CFGS))
@pytest.mark.parametrize('dtype', [jnp.float64, jnp.float32])
@pytest.mark.parametrize('n', [1, 3])
def test_init_rules_allocate_zeros(name, dtype, n):
    cfg, x, k, b, params, weights, _, _ = rule_case(name)
    x_aval = jax.ShapeDtypeStruct(x.shape, dtype)
    y_aval = jax.ShapeDtypeStruct(cfg.y_shape, dtype)
    weight_avals = {key: jax.ShapeDtypeStruct(w.shape, dtype) for key, w in weights.items()}
    drtrl = RULES['init_drtrl'](x_aval, y_aval, weight_avals, n, **params)
    assert set(drtrl) == set(weights)
    assert drtrl['weight'].shape == trace_shape(cfg, n)
    if b is not None:
        assert drtrl['bias'].shape == trace_shape(cfg, n, taps=1)
    pp = RULES['init_pp'](x_aval, y_aval, weight_avals, n, **params)
    assert pp.shape == cfg.y_shape + (n,)
    for arr in [*drtrl.values(), pp]:
        assert arr.dtype == dtype
        assert not np.asarray(arr).any()


def test_trace_patches_are_exact_copies_of_x():
    """Trace patches are copies of x: they are extracted by padding and slicing, never by a
    convolution (which rounds float32 inputs by default on some accelerators), and equal
    lax's own patch extraction bit for bit."""
    cfg = make_cfg(2, 'channel_last', size=(5, 4), ksize=(2, 3), feature_group_count=2,
                   padding=((1, -1), (2, 0)), lhs_dilation=(2, 1), rhs_dilation=(1, 2))
    x, k, b = cfg.arrays(dtype=jnp.float32)
    eqn = jax.make_jaxpr(lambda *a: conv(*a, **cfg.kwargs(), precision='default'))(
        x, k, b).jaxpr.eqns[-1]
    params = eqn.params
    df = jnp.ones(cfg.y_shape + (1,), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, df: RULES['xdf_to_trace'](x, df, {'weight': k, 'bias': b},
                                                                **params))(x, df)
    assert not [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'conv_general_dilated']
    from braintrace_conv.conv import _window_copies
    dn = params['dimension_numbers']
    x_c = jnp.transpose(x, dn.lhs_spec)
    window = tuple(k.shape[i] for i in dn.rhs_spec[2:])
    ref = lax.conv_general_dilated_patches(
        x_c, window, params['strides'], params['padding'], lhs_dilation=params['lhs_dilation'],
        rhs_dilation=params['rhs_dilation'], precision=lax.Precision.HIGHEST)
    ours = _window_copies(x, window, params, dn.lhs_spec)     # in x's own layout
    np.testing.assert_array_equal(jnp.transpose(ours, dn.lhs_spec), ref)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float64])
def test_channel_axis_moved_by_the_identity_is_an_exact_transpose(dtype):
    """Factors whose channel axis is not first reach the trace update through a product
    with the identity (``conv._transposed``); it must equal the transpose bit for bit on
    finite values."""
    from braintrace_conv.conv import _transposed
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 5, 4, 7, 2)) * 10.0 ** rng.integers(-30, 30, size=(3, 5, 4, 7, 2))
    a = jnp.asarray(a, dtype)
    order = (3, 4, 0, 1, 2)                                   # channel, state, positions
    np.testing.assert_array_equal(np.asarray(jax.jit(_transposed, static_argnums=1)(a, order)),
                                  np.asarray(jnp.transpose(a, order)))


def test_rule_table_is_complete():
    from braintrace_conv.primitive import DRTRL_RULES, ES_DRTRL_RULES, STANDARD_RULES
    assert etp_conv_p.missing_rules(STANDARD_RULES + DRTRL_RULES + ES_DRTRL_RULES) == []
    assert etp_conv_p.trainable_invars({'has_bias': True}) == {'weight': 1, 'bias': 2}
    assert etp_conv_p.trainable_invars({'has_bias': False}) == {'weight': 1}
    assert etp_conv_p.x_invar_index == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(cfg=random_cfgs(), seed=st.integers(0, 2 ** 16), n=st.integers(1, 2))
def test_random_configs_rules_compose_to_the_vjp(cfg, seed, n):
    """``trace_to_dw(yw_to_w(D, xdf_to_trace(x, Df)), g)`` is the VJP with cotangent
    ``sum_m (g^T D)_m Df_m``, for random configurations."""
    assume(all(o > 0 for o in cfg.out_size))
    x, k, b = cfg.arrays(seed)
    params = bind_params(cfg, x, k, b)
    weights = {'weight': k} if b is None else {'weight': k, 'bias': b}
    rng = np.random.default_rng(seed + 2)
    df, g = (jnp.asarray(rng.standard_normal(cfg.y_shape + (n,))) for _ in range(2))
    d = jnp.asarray(rng.standard_normal(cfg.y_shape + (n, n)))

    @jax.jit
    def compose(x, df, g, d, weights):
        trace = RULES['xdf_to_trace'](x, df, weights, **params)
        decayed = RULES['yw_to_w'](d, trace, **params)
        signal = jnp.sum(jnp.einsum('...m,...mk->...k', g, d) * df, axis=-1)
        names = [name for name in ('weight', 'bias') if name in weights]
        _, vjp = jax.vjp(lambda *w: conv(x, *w, **cfg.kwargs()), *(weights[m] for m in names))
        return (trace['weight'].shape, RULES['trace_to_dw'](decayed, g, weights, **params),
                RULES['xy_to_dw'](x, signal, weights, **params), dict(zip(names, vjp(signal))))

    shape, via_trace, via_rule, expected = compose(x, df, g, d, weights)
    assert shape == trace_shape(cfg, n)
    assert_tree_close(via_trace, expected)
    assert_tree_close(via_rule, expected)


# =========================================================================== 6. units
def unit_case():
    cfg = make_cfg(2, 'channel_last', size=(5, 4), ksize=(2, 2), padding='SAME')
    x, k, b = cfg.arrays(seed=23)
    return cfg, x, k, b


def test_units_product_and_bias_conversion():
    cfg, x, k, b = unit_case()
    plain = lax_conv(cfg, x, k, None)
    y = conv(x * u.mV, k * u.siemens, **cfg.kwargs())
    assert isinstance(y, u.Quantity)
    assert y.unit.has_same_dim(u.amp)
    np.testing.assert_allclose(y.to_decimal(u.mA), plain, **TOL)
    bias_axis = [1] * 4
    bias_axis[cfg.dn.out_spec[1]] = -1
    y = conv(x * u.mV, k * u.siemens, b * u.mA, **cfg.kwargs())
    np.testing.assert_allclose(y.to_decimal(u.mA), plain + b.reshape(bias_axis), **TOL)
    y = conv(x * u.mV, k * u.siemens, b * u.uA, **cfg.kwargs())
    np.testing.assert_allclose(y.to_decimal(u.mA), plain + 1e-3 * b.reshape(bias_axis), **TOL)
    # only x carries a unit
    y = conv(x * u.mV, k, b * u.volt, **cfg.kwargs())
    np.testing.assert_allclose(y.to_decimal(u.mV), plain + 1e3 * b.reshape(bias_axis), **TOL)
    # a dimensionless but scaled product unit (mV / V) with a plain bias
    y = conv(x * u.mV, k / u.volt, b, **cfg.kwargs())
    np.testing.assert_allclose(jnp.asarray(y), 1e-3 * plain + b.reshape(bias_axis), **TOL)


def test_plain_arrays_stay_plain():
    cfg, x, k, b = unit_case()
    y = conv(x, k, b, **cfg.kwargs())
    assert not isinstance(y, u.Quantity)
    assert isinstance(y, jax.Array)


@pytest.mark.parametrize('bias', [lambda b: b * u.volt, lambda b: b, lambda b: b * u.siemens])
def test_bias_of_wrong_dimension_raises(bias):
    cfg, x, k, b = unit_case()
    with pytest.raises(ValueError, match='bias'):
        conv(x * u.mV, k * u.siemens, bias(b), **cfg.kwargs())


def test_unit_bias_on_plain_output_raises():
    cfg, x, k, b = unit_case()
    with pytest.raises(ValueError, match='bias'):
        conv(x, k, b * u.mA, **cfg.kwargs())


def test_grads_through_unit_conv():
    cfg, x, k, b = unit_case()
    ct = jnp.asarray(np.random.default_rng(29).standard_normal(cfg.y_shape))

    def loss(kk, bb):
        y = conv(x * u.mV, kk * u.siemens, bb * u.uA, **cfg.kwargs())
        return jnp.sum(y.to_decimal(u.mA) * ct)

    def loss_ref(kk, bb):
        return jnp.sum(lax_conv(cfg, x, kk, 1e-3 * bb) * ct)

    expected = jax.grad(loss_ref, argnums=(0, 1))(k, b)
    assert_tree_close(jax.jit(jax.grad(loss, argnums=(0, 1)))(k, b), expected)
    # saiunit's own autograd, differentiating w.r.t. a kernel that carries its unit
    grad_k = u.autograd.grad(lambda kq: jnp.sum(
        conv(x * u.mV, kq, b * u.uA, **cfg.kwargs()).to_decimal(u.mA) * ct))(k * u.siemens)
    np.testing.assert_allclose(u.get_mantissa(grad_k), expected[0], **TOL)


# =========================================================================== 7. bad input
X2 = jnp.ones((2, 4, 5, 5))   # NCHW
K2 = jnp.ones((6, 4, 3, 3))   # OIHW
BAD_INPUTS = [
    # (x, kernel, bias, kwargs, error, message)
    ('x-rank-2', jnp.ones((2, 4)), jnp.ones((6, 4)), None, {}, ValueError, 'x must have rank'),
    ('kernel-rank', X2, jnp.ones((6, 4, 3)), None, {}, ValueError,
     'kernel must have the same rank'),
    ('x-not-array', 'abc', K2, None, {}, TypeError, 'x must be an array'),
    ('spec-repeated-char', X2, K2, None, dict(dimension_numbers=('NHHC', 'OIHW', 'NCHW')),
     ValueError, 'dimension_numbers lhs spec'),
    ('spec-missing-N', X2, K2, None, dict(dimension_numbers=('XCHW', 'OIHW', 'NCHW')),
     ValueError, 'dimension_numbers lhs spec'),
    ('spec-missing-O', X2, K2, None, dict(dimension_numbers=('NCHW', 'XIHW', 'NCHW')),
     ValueError, 'dimension_numbers rhs spec'),
    ('spec-missing-I', X2, K2, None, dict(dimension_numbers=('NCHW', 'OXHW', 'NCHW')),
     ValueError, 'dimension_numbers rhs spec'),
    ('spec-missing-C', X2, K2, None, dict(dimension_numbers=('NCHW', 'OIHW', 'NXHW')),
     ValueError, 'dimension_numbers out spec'),
    ('spec-wrong-length', X2, K2, None, dict(dimension_numbers=('NCH', 'OIHW', 'NCHW')),
     ValueError, 'dimension_numbers lhs spec'),
    ('spec-spatial-mismatch', X2, K2, None, dict(dimension_numbers=('NCHW', 'OIHX', 'NCHX')),
     ValueError, 'same spatial characters'),
    ('spec-not-string', X2, K2, None, dict(dimension_numbers=('NCHW', 3, 'NCHW')),
     TypeError, 'dimension_numbers rhs spec'),
    ('dims-wrong-type', X2, K2, None, dict(dimension_numbers='NCHW'),
     TypeError, 'dimension_numbers must be'),
    ('numbers-not-permutation', X2, K2, None,
     dict(dimension_numbers=lax.ConvDimensionNumbers((0, 1, 2, 2), (0, 1, 2, 3), (0, 1, 2, 3))),
     ValueError, r'dimension_numbers\.lhs_spec'),
    ('numbers-out-of-range', X2, K2, None,
     dict(dimension_numbers=lax.ConvDimensionNumbers((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 4))),
     ValueError, r'dimension_numbers\.out_spec'),
    ('numbers-wrong-length', X2, K2, None,
     dict(dimension_numbers=lax.ConvDimensionNumbers((0, 1, 2, 3), (0, 1, 2), (0, 1, 2, 3))),
     ValueError, r'dimension_numbers\.rhs_spec'),
    ('fgc-not-dividing-channels', X2, jnp.ones((6, 1, 3, 3)), None,
     dict(feature_group_count=3), ValueError, r'feature_group_count \(3\) must divide the input'),
    ('kernel-in-channels', X2, jnp.ones((6, 3, 3, 3)), None, {}, ValueError,
     'kernel input-channel size'),
    ('kernel-in-channels-groups', X2, K2, None, dict(feature_group_count=2), ValueError,
     'kernel input-channel size'),
    ('fgc-not-dividing-out', X2, jnp.ones((3, 2, 3, 3)), None, dict(feature_group_count=2),
     ValueError, r'feature_group_count \(2\) must divide the kernel output'),
    ('both-groups', X2, jnp.ones((6, 2, 3, 3)), None,
     dict(feature_group_count=2, batch_group_count=2), ValueError, 'cannot both be > 1'),
    ('bgc-not-dividing-batch', jnp.ones((3, 4, 5, 5)), K2, None, dict(batch_group_count=2),
     ValueError, r'batch_group_count \(2\) must divide the batch'),
    ('bgc-not-dividing-out', X2, jnp.ones((5, 4, 3, 3)), None, dict(batch_group_count=2),
     ValueError, r'batch_group_count \(2\) must divide the kernel output'),
    ('fgc-zero', X2, K2, None, dict(feature_group_count=0), ValueError,
     'feature_group_count must be a positive int'),
    ('fgc-float', X2, K2, None, dict(feature_group_count=1.0), ValueError,
     'feature_group_count must be a positive int'),
    ('bgc-bool', X2, K2, None, dict(batch_group_count=True), ValueError,
     'batch_group_count must be a positive int'),
    ('strides-zero', X2, K2, None, dict(strides=(1, 0)), ValueError, 'strides must be positive'),
    ('strides-negative-int', X2, K2, None, dict(strides=-1), ValueError,
     'strides must be positive'),
    ('strides-wrong-length', X2, K2, None, dict(strides=(1, 1, 1)), ValueError,
     'strides must have 2 entries'),
    ('strides-float', X2, K2, None, dict(strides=(1.5, 1)), TypeError, 'strides must be'),
    ('strides-missing', X2, K2, None, dict(strides=None), ValueError, 'strides is required'),
    ('lhs-dilation-zero', X2, K2, None, dict(lhs_dilation=(0, 1)), ValueError,
     'lhs_dilation must be positive'),
    ('rhs-dilation-negative', X2, K2, None, dict(rhs_dilation=(1, -2)), ValueError,
     'rhs_dilation must be positive'),
    ('rhs-dilation-wrong-length', X2, K2, None, dict(rhs_dilation=(1,)), ValueError,
     'rhs_dilation must have 2 entries'),
    ('padding-unknown', X2, K2, None, dict(padding='FULL'), ValueError, 'padding must be one of'),
    ('padding-triples', X2, K2, None, dict(padding=((1, 2, 3), (0, 0))), TypeError,
     'padding must be a string or a sequence'),
    ('padding-floats', X2, K2, None, dict(padding=((1.5, 0), (0, 0))), TypeError,
     'padding must be a string or a sequence'),
    ('padding-int', X2, K2, None, dict(padding=1), TypeError,
     'padding must be a string or a sequence'),
    ('padding-wrong-length', X2, K2, None, dict(padding=((1, 1),)), ValueError,
     'padding must have 2'),
    ('padding-string-with-lhs-dilation', X2, K2, None, dict(padding='SAME', lhs_dilation=(2, 1)),
     ValueError, "padding 'SAME' .*lhs_dilation"),
    ('bias-wrong-length', X2, K2, jnp.ones(4), {}, ValueError, r'bias must have shape \(6,\)'),
    ('bias-wrong-rank', X2, K2, jnp.ones((6, 1)), {}, ValueError, 'bias must have shape'),
    ('bias-not-array', X2, K2, 'b', {}, TypeError, 'bias must be an array'),
]


@pytest.mark.parametrize('x, kernel, bias, kwargs, error, message',
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS])
def test_bad_input_raises_naming_the_argument(x, kernel, bias, kwargs, error, message):
    kwargs = {'strides': 1, **kwargs}
    with pytest.raises(error, match=message):
        conv(x, kernel, bias, **kwargs)
    # Validation happens while tracing, before any compute.
    with pytest.raises(error, match=message):
        jax.eval_shape(lambda: conv(x, kernel, bias, **kwargs))
