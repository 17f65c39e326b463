"""Correctness of the dense ETP primitive.

Forward, gradients, ``jit``/``vmap``/``scan`` against ``x @ W + b``; every ETP rule
against ``jax.jacobian`` / ``jax.vjp``; units; input validation.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from jax import lax

from braintrace_conv import conv, dense, etp_conv_p, etp_dense_p

TOL = dict(rtol=1e-10, atol=1e-10)
RULES = etp_dense_p.etp_rules
B, IN, OUT = 3, 4, 5


@pytest.fixture(autouse=True, scope='module')
def float64():
    """Run in float64 even if an import (brainstate sets its own precision) reset it."""
    with jax.enable_x64(True):
        yield


# The kernel trace, as for conv with a channels-last output: ``(B, OUT, n, IN)``, per
# output element and state one entry per input feature; the bias trace is that of one
# more input feature, always 1: ``(B, OUT, n, 1)``. Keep in step with conv.py.
def trace_shape(n, entries=IN):
    return (B, OUT, n, entries)


def trace_index(b, o, i, m):
    """Index of the trace entry of output (b, o), input feature i, state m (slices allowed)."""
    return (b, o, m, i)


def position_block(trace, b, o):
    """The ``(IN, n)`` trace entries of output element ``(b, o)``."""
    return trace[trace_index(b, o, slice(None), slice(None))].T


def arrays(seed=0, bias=True, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, IN)), dtype)
    w = jnp.asarray(rng.standard_normal((IN, OUT)), dtype)
    b = jnp.asarray(rng.standard_normal((OUT,)), dtype) if bias else None
    return x, w, b


def reference(x, w, b):
    y = jnp.einsum('bi,io->bo', x, w, precision=lax.Precision.HIGHEST)
    return y if b is None else y + b


def value_and_grads(fn, x, w, b, ct):
    args = (x, w) if b is None else (x, w, b)
    extra = [None] if b is None else []
    loss = lambda *a: jnp.sum(fn(*a, *extra) * ct)
    return fn(x, w, b), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


def assert_tree_close(actual, expected, tol=TOL):
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_e, tree_e = jax.tree.flatten(expected)
    assert tree_a == tree_e
    for a, e in zip(leaves_a, leaves_e):
        assert np.shape(a) == np.shape(e)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), **tol)


# =========================================================================== forward / grads
@pytest.mark.parametrize('bias', [True, False])
def test_forward_grads_jit_and_vmap(bias):
    x, w, b = arrays(1, bias)
    rng = np.random.default_rng(2)
    x2 = jnp.asarray(rng.standard_normal(x.shape))
    w2 = jnp.asarray(rng.standard_normal(w.shape))
    ct = jnp.asarray(rng.standard_normal((B, OUT)))

    @jax.jit
    def ours(x, x_pair, w, w_pair, b):
        plain = value_and_grads(dense, x, w, b, ct)
        over_x = jax.vmap(lambda xx: value_and_grads(dense, xx, w, b, ct))(x_pair)
        over_w = jax.vmap(lambda ww: value_and_grads(dense, x, ww, b, ct))(w_pair)
        return plain, over_x, over_w

    plain, over_x, over_w = ours(x, jnp.stack([x, x2]), w, jnp.stack([w, w2]), b)
    expected = value_and_grads(reference, x, w, b, ct)
    assert_tree_close(plain, expected)
    stack = lambda *t: jax.tree.map(lambda *a: jnp.stack(a), *t)
    assert_tree_close(over_x, stack(expected, value_and_grads(reference, x2, w, b, ct)))
    assert_tree_close(over_w, stack(expected, value_and_grads(reference, x, w2, b, ct)))
    assert_tree_close(dense(x, w, b), expected[0])   # eager


def test_scan_and_dtype_promotion():
    x, w, b = arrays(3)
    xs = jnp.stack([x, -x, 0.5 * x])

    def total(fn, ww):
        return lax.scan(lambda c, xt: (c + jnp.sum(jnp.tanh(fn(xt, ww, b))), None), 0.0, xs)[0]

    assert_tree_close(jax.jit(jax.value_and_grad(lambda ww: total(dense, ww)))(w),
                      jax.value_and_grad(lambda ww: total(reference, ww))(w))
    y = dense(x.astype(jnp.float32), w)
    assert y.dtype == jnp.float64
    assert dense(x.astype(jnp.float32), w.astype(jnp.float32)).dtype == jnp.float32


def test_linear_transpose():
    x, w, _ = arrays(4, bias=False)
    ct = jnp.asarray(np.random.default_rng(5).standard_normal((B, OUT)))
    (tx,) = jax.linear_transpose(lambda xx: dense(xx, w), x)(ct)
    (tw,) = jax.linear_transpose(lambda ww: dense(x, ww), w)(ct)
    np.testing.assert_allclose(tx, ct @ w.T, **TOL)
    np.testing.assert_allclose(tw, x.T @ ct, **TOL)


def test_dense_is_a_one_by_one_conv():
    """The dense rules are the conv rules at rank 0: compare with a 1-position conv."""
    x, w, b = arrays(5)
    conv_kw = dict(strides=1, dimension_numbers=('NWC', 'WIO', 'NWC'))
    np.testing.assert_allclose(conv(x[:, None], w[None], b, **conv_kw)[:, 0], dense(x, w, b),
                               **TOL)
    conv_params = jax.make_jaxpr(lambda *a: conv(*a, **conv_kw))(
        x[:, None], w[None], b).jaxpr.eqns[-1].params
    df = jnp.asarray(np.random.default_rng(6).standard_normal((B, OUT, 2)))
    weights = {'weight': w, 'bias': b}
    ours = RULES['xdf_to_trace'](x, df, weights, has_bias=True)
    via_conv = etp_conv_p.rule('xdf_to_trace')(x[:, None], df[:, None], {'weight': w[None],
                                                                          'bias': b},
                                               **conv_params)
    # a conv with positions keeps them minor, (K m, P, N): here N = B (one position per
    # sample); split the rows and move the batch to the front, it is the dense trace
    # (B, K, m, P)
    in_dense_layout = lambda t: jnp.moveaxis(t.reshape(OUT, 2, *t.shape[1:]), -1, 0)
    np.testing.assert_allclose(ours['weight'], in_dense_layout(via_conv['weight']), **TOL)
    np.testing.assert_allclose(ours['bias'], in_dense_layout(via_conv['bias']), **TOL)


# =========================================================================== ETP rules
@functools.lru_cache(maxsize=None)
def rule_case(bias):
    x, w, b = arrays(7, bias)
    eqn = jax.make_jaxpr(lambda *a: dense(*a))(*((x, w) if b is None else (x, w, b))).jaxpr.eqns[-1]
    assert eqn.primitive is etp_dense_p
    params = eqn.params
    jac_w = np.asarray(jax.jacobian(lambda ww: dense(x, ww, b))(w))        # (B, OUT, IN, OUT)
    jac_b = np.asarray(jax.jacobian(lambda bb: dense(x, w, bb))(b)) if bias else None
    weights = {'weight': w} if b is None else {'weight': w, 'bias': b}
    return x, w, b, params, weights, jac_w, jac_b


@pytest.mark.parametrize('bias', [True, False])
def test_xdf_to_trace_is_the_jacobian(bias):
    x, w, b, params, weights, jac_w, _ = rule_case(bias)
    rng = np.random.default_rng(11)
    for df in (jnp.ones((B, OUT, 1)), jnp.asarray(rng.standard_normal((B, OUT, 2)))):
        n = df.shape[-1]
        trace = RULES['xdf_to_trace'](x, df, weights, **params)
        assert set(trace) == set(weights)
        assert trace['weight'].shape == trace_shape(n)
        for m in range(n):
            rebuilt = np.zeros_like(jac_w)
            for bb, o, i in np.ndindex(B, OUT, IN):
                rebuilt[bb, o, i, o] = trace['weight'][trace_index(bb, o, i, m)]
            np.testing.assert_allclose(rebuilt, jac_w * np.asarray(df)[:, :, m, None, None],
                                       **TOL)
        if bias:
            np.testing.assert_array_equal(trace['bias'], np.asarray(df)[..., None])


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('n', [1, 2])
def test_trace_to_dw_of_xdf_equals_xy_to_dw_and_jacobian(bias, n):
    x, w, b, params, weights, jac_w, jac_b = rule_case(bias)
    rng = np.random.default_rng(13 + n)
    df = jnp.asarray(rng.standard_normal((B, OUT, n)))
    g = jnp.asarray(rng.standard_normal((B, OUT, n)))
    trace = RULES['xdf_to_trace'](x, df, weights, **params)
    signal = jnp.sum(g * df, axis=-1)
    expected = {'weight': np.tensordot(np.asarray(signal), jac_w, axes=2)}
    if bias:
        expected['bias'] = np.tensordot(np.asarray(signal), jac_b, axes=2)
    assert_tree_close(RULES['trace_to_dw'](trace, g, weights, **params), expected)
    assert_tree_close(RULES['xy_to_dw'](x, signal, weights, **params), expected)


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('n', [1, 2])
def test_yw_to_w_keeps_positions(bias, n):
    x, w, b, params, weights, _, _ = rule_case(bias)
    rng = np.random.default_rng(17 + n)
    trace = {'weight': jnp.asarray(rng.standard_normal(trace_shape(n)))}
    if bias:
        trace['bias'] = jnp.asarray(rng.standard_normal(trace_shape(n, 1)))
    d = jnp.asarray(rng.standard_normal((B, OUT, n, n)))
    g = jnp.asarray(rng.standard_normal((B, OUT, n)))
    out = RULES['yw_to_w'](d, trace, **params)
    assert jax.tree.map(jnp.shape, out) == jax.tree.map(jnp.shape, trace)
    assert_tree_close(RULES['trace_to_dw'](out, g, weights, **params),
                      RULES['trace_to_dw'](trace, jnp.einsum('...m,...mk->...k', g, d), weights,
                                           **params))
    for bb, o in [(0, 0), (B - 1, 2), (1, OUT - 1)]:
        block = rng.standard_normal((n, n))
        d_one = np.zeros((B, OUT, n, n))
        d_one[bb, o] = block
        out = RULES['yw_to_w'](jnp.asarray(d_one), trace, **params)
        weight = np.array(out['weight'])
        np.testing.assert_allclose(position_block(weight, bb, o),
                                   position_block(np.asarray(trace['weight']), bb, o) @ block.T,
                                   **TOL)
        weight[trace_index(bb, o, slice(None), slice(None))] = 0
        assert not weight.any()
        if bias:
            bias_out = np.array(out['bias'])
            np.testing.assert_allclose(bias_out[bb, o], block @ np.asarray(trace['bias'])[bb, o],
                                       **TOL)   # (n, 1) entries of one output element
            bias_out[bb, o] = 0
            assert not bias_out.any()


@pytest.mark.parametrize('bias', [True, False])
def test_xy_to_dw_is_the_weight_vjp(bias):
    x, w, b, params, weights, _, _ = rule_case(bias)
    ct = jnp.asarray(np.random.default_rng(19).standard_normal((B, OUT)))
    _, vjp = jax.vjp(lambda *ws: dense(x, *ws), *weights.values())
    assert_tree_close(RULES['xy_to_dw'](x, ct, weights, **params),
                      dict(zip(weights, vjp(ct))))


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('dtype', [jnp.float64, jnp.float32])
@pytest.mark.parametrize('n', [1, 2])
def test_init_rules_allocate_zeros(bias, dtype, n):
    x, w, b, params, weights, _, _ = rule_case(bias)
    x_aval = jax.ShapeDtypeStruct((B, IN), dtype)
    y_aval = jax.ShapeDtypeStruct((B, OUT), dtype)
    weight_avals = {k: jax.ShapeDtypeStruct(v.shape, dtype) for k, v in weights.items()}
    drtrl = RULES['init_drtrl'](x_aval, y_aval, weight_avals, n, **params)
    assert set(drtrl) == set(weights)
    assert drtrl['weight'].shape == trace_shape(n)
    if bias:
        assert drtrl['bias'].shape == trace_shape(n, 1)
    pp = RULES['init_pp'](x_aval, y_aval, weight_avals, n, **params)
    assert pp.shape == (B, OUT, n)
    for arr in [*drtrl.values(), pp]:
        assert arr.dtype == dtype
        assert not np.asarray(arr).any()


def test_rule_table_is_complete():
    from braintrace_conv.primitive import DRTRL_RULES, ES_DRTRL_RULES, STANDARD_RULES
    assert etp_dense_p.missing_rules(STANDARD_RULES + DRTRL_RULES + ES_DRTRL_RULES) == []
    assert etp_dense_p.trainable_invars({'has_bias': True}) == {'weight': 1, 'bias': 2}
    assert etp_dense_p.trainable_invars({'has_bias': False}) == {'weight': 1}
    assert etp_dense_p.x_invar_index == 0


# =========================================================================== units
def test_units():
    x, w, b = arrays(23)
    plain = reference(x, w, None)
    y = dense(x * u.mV, w * u.siemens)
    assert isinstance(y, u.Quantity) and y.unit.has_same_dim(u.amp)
    np.testing.assert_allclose(y.to_decimal(u.mA), plain, **TOL)
    np.testing.assert_allclose(dense(x * u.mV, w * u.siemens, b * u.uA).to_decimal(u.mA),
                               plain + 1e-3 * b, **TOL)
    np.testing.assert_allclose(dense(x * u.mV, w * u.siemens, b * u.amp).to_decimal(u.mA),
                               plain + 1e3 * b, **TOL)
    out = dense(x, w, b)
    assert not isinstance(out, u.Quantity) and isinstance(out, jax.Array)
    for bad_bias in (b * u.volt, b):
        with pytest.raises(ValueError, match='bias'):
            dense(x * u.mV, w * u.siemens, bad_bias)
    with pytest.raises(ValueError, match='bias'):
        dense(x, w, b * u.mA)


def test_grads_through_unit_dense():
    x, w, b = arrays(29)
    ct = jnp.asarray(np.random.default_rng(30).standard_normal((B, OUT)))
    loss = lambda ww, bb: jnp.sum(dense(x * u.mV, ww * u.siemens, bb * u.uA).to_decimal(u.mA) * ct)
    loss_ref = lambda ww, bb: jnp.sum(reference(x, ww, 1e-3 * bb) * ct)
    expected = jax.grad(loss_ref, argnums=(0, 1))(w, b)
    assert_tree_close(jax.jit(jax.grad(loss, argnums=(0, 1)))(w, b), expected)
    grad_w = u.autograd.grad(lambda wq: jnp.sum(
        dense(x * u.mV, wq, b * u.uA).to_decimal(u.mA) * ct))(w * u.siemens)
    np.testing.assert_allclose(u.get_mantissa(grad_w), expected[0], **TOL)


# =========================================================================== bad input
BAD_INPUTS = [
    ('x-rank-1', jnp.ones(IN), jnp.ones((IN, OUT)), None, ValueError, 'x must have shape'),
    ('x-rank-3', jnp.ones((B, 2, IN)), jnp.ones((IN, OUT)), None, ValueError, 'x must have shape'),
    ('weight-rank-1', jnp.ones((B, IN)), jnp.ones(IN), None, ValueError,
     'weight must have shape'),
    ('weight-rank-3', jnp.ones((B, IN)), jnp.ones((IN, OUT, 1)), None, ValueError,
     'weight must have shape'),
    ('feature-mismatch', jnp.ones((B, IN)), jnp.ones((IN + 1, OUT)), None, ValueError,
     rf'x has {IN} features but weight expects {IN + 1}'),
    ('bias-wrong-length', jnp.ones((B, IN)), jnp.ones((IN, OUT)), jnp.ones(OUT + 1), ValueError,
     rf'bias must have shape \({OUT},\)'),
    ('bias-wrong-rank', jnp.ones((B, IN)), jnp.ones((IN, OUT)), jnp.ones((1, OUT)), ValueError,
     'bias must have shape'),
    ('x-not-array', 'x', jnp.ones((IN, OUT)), None, TypeError, 'x must be an array'),
    ('weight-not-array', jnp.ones((B, IN)), 'w', None, TypeError, 'weight must be an array'),
]


@pytest.mark.parametrize('x, weight, bias, error, message',
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS])
def test_bad_input_raises_naming_the_argument(x, weight, bias, error, message):
    with pytest.raises(error, match=message):
        dense(x, weight, bias)
    with pytest.raises(error, match=message):
        jax.eval_shape(lambda: dense(x, weight, bias))
