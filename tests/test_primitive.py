"""The ``register_primitive`` machinery, exercised with a user-defined toy primitive."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.interpreters import ad

from braintrace_conv import ETPPrimitive, register_primitive
from braintrace_conv.primitive import apply_state_jacobian, derived_transpose, weight_vjp

TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(autouse=True, scope='module')
def float64():
    """Run in float64 even if an import (brainstate sets its own precision) reset it."""
    with jax.enable_x64(True):
        yield


def _scaled_mul(x, w, *, scale):
    """Toy forward: ``y = scale * x * w`` (elementwise, ``w`` broadcast over the batch)."""
    return scale * x * w


toy_p = register_primitive('toy_scaled_mul', _scaled_mul,
                           trainable_invars_fn=lambda params: {'weight': 1}, x_invar_index=0)


def toy(x, w, scale=2.0):
    return toy_p.bind(x, w, scale=scale)


def data(seed=0, shape=(3, 4)):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(shape)),
            jnp.asarray(rng.standard_normal(shape[1:])))


def close(a, b, tol=TOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)


# =========================================================================== basics
def test_primitive_attributes():
    assert isinstance(toy_p, ETPPrimitive)
    assert toy_p.name == 'toy_scaled_mul'
    assert toy_p.x_invar_index == 0
    assert toy_p.impl_fn is _scaled_mul
    assert toy_p.trainable_invars({'scale': 1.0}) == {'weight': 1}


def test_eager_jit_and_abstract_eval():
    x, w = data()
    close(toy(x, w), 2.0 * x * w)
    close(jax.jit(toy, static_argnums=2)(x, w, 3.0), 3.0 * x * w)
    out = jax.eval_shape(toy, jax.ShapeDtypeStruct((5, 4), jnp.float32),
                         jax.ShapeDtypeStruct((4,), jnp.float32))
    assert out.shape == (5, 4) and out.dtype == jnp.float32
    eqn = jax.make_jaxpr(toy)(x, w).jaxpr.eqns[0]
    assert eqn.primitive is toy_p and eqn.params == {'scale': 2.0}


# =========================================================================== autodiff
def test_grad_jvp_and_symbolic_zero_tangents():
    x, w = data(1)
    ct = jnp.asarray(np.random.default_rng(2).standard_normal(x.shape))
    loss = lambda x, w: jnp.sum(jnp.sin(toy(x, w)) * ct)
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    inner = jnp.cos(2.0 * x * w) * ct
    close(gx, inner * 2.0 * w)
    close(gw, jnp.sum(inner * 2.0 * x, axis=0))
    # Only one operand differentiated: the other tangent is a symbolic zero.
    close(jax.grad(loss, argnums=1)(x, w), gw)
    close(jax.grad(loss, argnums=0)(x, w), gx)
    tx, tw = data(3)
    y, ty = jax.jvp(toy, (x, w), (tx, tw))
    close(y, 2.0 * x * w)
    close(ty, 2.0 * (tx * w + x * tw))


def test_primal_stays_the_primitive_under_differentiation():
    x, w = data()
    jaxpr = jax.make_jaxpr(lambda x, w: jax.jvp(toy, (x, w), (x, w)))(x, w)
    assert any(e.primitive is toy_p for e in jaxpr.jaxpr.eqns)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(toy(x, w) ** 2), argnums=1))(x, w)
    assert any(e.primitive is toy_p for e in jaxpr.jaxpr.eqns)


def test_higher_order_derivatives():
    x, w = data(4)
    hess = jax.jit(jax.hessian(lambda w: jnp.sum(toy(x, w) ** 3)))(w)
    expected = jnp.diag(jnp.sum(6.0 * (2.0 * x) ** 3 * w, axis=0))   # d2/dw2 of (2xw)^3
    close(hess, expected)
    close(jax.jit(jax.jacfwd(lambda x: toy(x, w)))(x), jax.jit(jax.jacrev(lambda x: toy(x, w)))(x))


def test_linear_transpose_uses_the_transpose_rule():
    x, w = data(5)
    ct = jnp.asarray(np.random.default_rng(6).standard_normal(x.shape))
    (tx,) = jax.linear_transpose(lambda x: toy(x, w), x)(ct)
    close(tx, 2.0 * w * ct)
    (tw,) = jax.linear_transpose(lambda w: toy(x, w), w)(ct)
    close(tw, jnp.sum(2.0 * x * ct, axis=0))
    # inside a larger linear map, and under jit
    f = lambda x: toy(3.0 * x, w, 0.5) + x
    (tx,) = jax.jit(jax.linear_transpose(f, x))(ct)
    close(tx, 1.5 * w * ct + ct)
    # the transposed function is the VJP
    _, vjp = jax.vjp(f, x)
    close(vjp(ct)[0], tx)


# =========================================================================== batching
@pytest.mark.parametrize('in_axes, out_axes', [((0, None), 0), ((None, 0), 0), ((0, 0), 0),
                                                ((1, None), 1), ((2, 0), 2)])
def test_vmap(in_axes, out_axes):
    x, w = data(7, shape=(3, 4))
    rng = np.random.default_rng(8)
    xs = jnp.asarray(rng.standard_normal((2, 3, 4)))
    ws = jnp.asarray(rng.standard_normal((2, 4)))
    xb = xs if in_axes[0] is None else jnp.moveaxis(xs, 0, in_axes[0])
    wb = ws if in_axes[1] is None else jnp.moveaxis(ws, 0, in_axes[1])
    xa = x if in_axes[0] is None else xb
    wa = w if in_axes[1] is None else wb
    got = jax.jit(jax.vmap(toy, in_axes=in_axes, out_axes=out_axes))(xa, wa)
    members = [toy(x if in_axes[0] is None else xs[i], w if in_axes[1] is None else ws[i])
               for i in range(2)]
    close(got, jnp.stack(members, axis=out_axes))


def test_vmap_of_grad_and_nested_vmap():
    xs = jnp.asarray(np.random.default_rng(9).standard_normal((2, 3, 4)))
    w = data()[1]
    per_example = jax.jit(jax.vmap(jax.grad(lambda x, w: jnp.sum(toy(x, w) ** 2), argnums=1),
                                   in_axes=(0, None)))(xs, w)
    close(per_example, jnp.stack([jnp.sum(8.0 * x ** 2 * w, axis=0) for x in xs]))
    nested = jax.jit(jax.vmap(jax.vmap(toy, in_axes=(0, None)), in_axes=(0, None)))(xs, w)
    close(nested, 2.0 * xs * w)


def test_scan_forward_and_grad():
    xs = jnp.asarray(np.random.default_rng(10).standard_normal((5, 3, 4)))
    w = data()[1]

    def run(w, prim):
        def step(h, x):
            h = 0.9 * h + prim(x, w)
            return h, jnp.sum(jnp.tanh(h))
        return jnp.sum(lax.scan(step, jnp.zeros((3, 4)), xs)[1])

    reference = lambda x, w: 2.0 * x * w
    close(jax.jit(lambda w: run(w, toy))(w), run(w, reference))
    close(jax.jit(jax.grad(lambda w: run(w, toy)))(w), jax.grad(lambda w: run(w, reference))(w))


# =========================================================================== ETP rule table
def fresh_primitive(name='toy_rules'):
    return register_primitive(name, _scaled_mul,
                              trainable_invars_fn=lambda params: {'weight': 1}, x_invar_index=0)


def test_etp_rules_table_is_read_only():
    prim = fresh_primitive()
    rule = lambda *a, **k: None
    prim.register_etp_rules(yw_to_w=rule)
    with pytest.raises(TypeError):
        prim.etp_rules['yw_to_w'] = rule
    with pytest.raises(TypeError):
        prim.etp_rules['xy_to_dw'] = rule
    with pytest.raises(TypeError):
        del prim.etp_rules['yw_to_w']
    with pytest.raises(AttributeError):
        prim.etp_rules = {}
    assert dict(prim.etp_rules) == {'yw_to_w': rule}


def test_register_etp_rules_installs_and_replaces():
    prim = fresh_primitive()
    first, second = (lambda *a, **k: 1), (lambda *a, **k: 2)
    prim.register_etp_rules(xy_to_dw=first, init_pp=first)
    prim.register_etp_rules(xy_to_dw=second)
    assert prim.rule('xy_to_dw') is second and prim.rule('init_pp') is first
    assert prim.missing_rules(['xy_to_dw', 'init_pp', 'yw_to_w']) == ['yw_to_w']
    with pytest.raises(TypeError, match=r"'init_drtrl'.*'toy_rules'"):
        prim.register_etp_rules(init_drtrl=3)
    assert 'init_drtrl' not in prim.etp_rules


def test_missing_rule_error_names_rule_and_primitive():
    prim = fresh_primitive('toy_missing')
    prim.register_etp_rules(xy_to_dw=lambda *a, **k: None)
    with pytest.raises(NotImplementedError, match=r"'toy_missing'.*'trace_to_dw'"):
        prim.rule('trace_to_dw')


def test_rules_of_a_user_primitive_are_callable_through_the_table():
    """A user primitive with its own rules: its xy_to_dw is the weight VJP of its impl."""
    prim = fresh_primitive('toy_with_rules')

    def xy_to_dw(x, hidden_dim, weights, **params):
        return weight_vjp(prim, [x, weights['weight']], hidden_dim, **params)

    prim.register_etp_rules(xy_to_dw=xy_to_dw)
    x, w = data(11)
    ct = jnp.asarray(np.random.default_rng(12).standard_normal(x.shape))
    dw = prim.etp_rules['xy_to_dw'](x, ct, {'weight': w}, scale=0.5)
    assert set(dw) == {'weight'}
    close(dw['weight'], jnp.sum(0.5 * x * ct, axis=0))


# =========================================================================== helpers
def test_apply_state_jacobian():
    rng = np.random.default_rng(13)
    for n in (1, 3):
        jac = rng.standard_normal((2, 5, n, n))
        trace = rng.standard_normal((2, 5, n))
        close(apply_state_jacobian(jnp.asarray(jac), jnp.asarray(trace)),
              np.einsum('abmk,abk->abm', jac, trace))


def test_weight_vjp_matches_jax_vjp():
    x, w = data(14)
    ct = jnp.asarray(np.random.default_rng(15).standard_normal(x.shape))
    dw = weight_vjp(toy_p, [x, w], ct, scale=2.0)
    _, vjp = jax.vjp(lambda w: toy(x, w), w)
    close(dw['weight'], vjp(ct)[0])


def test_the_removed_batched_argument_warns_and_unknown_arguments_are_refused():
    with pytest.warns(DeprecationWarning, match='no longer takes batched'):
        register_primitive('toy_batched', _scaled_mul, batched=True,
                           trainable_invars_fn=lambda params: {'weight': 1}, x_invar_index=0)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['batch'\]"):
        register_primitive('toy_typo', _scaled_mul, batch=True,
                           trainable_invars_fn=lambda params: {'weight': 1}, x_invar_index=0)


def test_jvp_and_transpose_overrides_replace_the_derived_rules():
    calls = []

    def jvp(primals, tangents, *, scale):
        calls.append('jvp')
        x, w = primals
        x_dot, w_dot = (ad.instantiate_zeros(t) for t in tangents)
        return prim.bind(x, w, scale=scale), prim.bind(x_dot, w, scale=scale) \
            + prim.bind(x, w_dot, scale=scale)

    def transpose(cotangent, x, w, *, scale):
        calls.append('transpose')
        return derived_transpose(prim, cotangent, x, w, scale=scale)

    prim = register_primitive('toy_overridden', _scaled_mul,
                              trainable_invars_fn=lambda params: {'weight': 1}, x_invar_index=0,
                              jvp=jvp, transpose=transpose)
    x, w = data()
    grad = jax.grad(lambda w: jnp.sum(prim.bind(x, w, scale=2.0) ** 2))(w)
    close(grad, jax.grad(lambda w: jnp.sum(_scaled_mul(x, w, scale=2.0) ** 2))(w))
    assert calls == ['jvp', 'transpose']
