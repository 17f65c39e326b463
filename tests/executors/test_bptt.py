"""BPTT, the reference executor, against a hand-written ``lax.scan`` (float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import braintrace_conv as bc
from snn_reference import rel_err
from user_models import TwoVariable, sin_loss

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
