"""BPTT (``executors/bptt.py``), the reference executor: against a hand-written
``lax.scan`` (float64); driven by ``advance`` it is truncated BPTT, and says so."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import braintrace_conv as bc
from braintrace_conv.executors.report import BPTT_METHOD, TRUNCATED_BPTT_METHOD
from snn_reference import rel_err, xent
from user_models import LeakyDense, TwoVariable, leaky_dense_data, sin_loss

pytestmark = pytest.mark.usefixtures('float64')


def test_bptt_executor_equals_hand_written_scan():
    model = TwoVariable(chained=True)
    rng = np.random.default_rng(5)
    xs = jnp.asarray(rng.normal(size=(7, 2, 3, 8)))
    targets = jnp.asarray(rng.normal(size=(7, 2, 2)))
    loss, grads = bc.BPTT(model).value_and_grad(sin_loss, xs, targets)

    def by_hand(K, b, W):
        def body(carry, inp):
            v_old, a_old = carry
            x, t = inp
            v = 0.9 * jnp.tanh(v_old) - 0.2 * a_old + lax.conv_general_dilated(
                x, K, (1,), 'SAME') + b[None, :, None]
            a = 0.8 * a_old + 0.3 * jax.nn.sigmoid(v)
            out = jax.nn.sigmoid(v - a).reshape(2, -1) @ W
            return (v, a), sin_loss(out, t)
        zeros = jnp.zeros((2, 4, 8))
        return jnp.sum(lax.scan(body, (zeros, zeros), (xs, targets))[1])

    params = [model.K.value, model.b.value, model.W.value]
    ref_loss, ref = jax.value_and_grad(by_hand, argnums=(0, 1, 2))(*params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    for key, r in zip([('K',), ('b',), ('W',)], ref):
        assert rel_err(grads[key], r) < 1e-12


def test_advance_carries_the_state_and_cuts_the_gradient_at_the_chunk_boundary():
    xs, ys = leaky_dense_data(T=6)
    online = bc.BPTT(LeakyDense())
    online.reset(2)
    online.advance(xent, xs[:3], ys[:3])
    _, truncated = online.advance(xent, xs[3:], ys[3:])
    # the same chunk from the carried state, the state held fixed: truncated BPTT
    reference = bc.BPTT(LeakyDense())
    reference.value_and_grad(xent, xs[:3], ys[:3])
    _, expected = reference.value_and_grad(xent, xs[3:], ys[3:], reset=False)
    np.testing.assert_allclose(truncated[('W',)], expected[('W',)], rtol=1e-12)
    # ... which is not the gradient of those steps' loss through the whole sequence
    whole = bc.BPTT(LeakyDense())
    mask = np.arange(6) >= 3
    _, full = whole.value_and_grad(lambda o, t: xent(o, t[0]) * t[1], xs,
                                   (ys, jnp.asarray(mask, float)))
    assert not np.allclose(full[('W',)], truncated[('W',)], rtol=1e-3)


def test_report_says_truncated_after_advance_and_exact_after_a_whole_sequence():
    xs, ys = leaky_dense_data()
    learner = bc.BPTT(LeakyDense())
    learner.value_and_grad(xent, xs, ys)
    assert {r['method'] for r in learner.report().rows} == {BPTT_METHOD}
    learner.reset(2)
    learner.advance(xent, xs, ys)
    assert {r['method'] for r in learner.report().rows} == {TRUNCATED_BPTT_METHOD}
    assert 'gradient is cut at their boundaries' in str(learner.report())
