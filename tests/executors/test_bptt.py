"""BPTT (``executors/bptt.py``): driven by ``advance`` it is truncated BPTT, and says so."""
import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from braintrace_conv.executors.report import BPTT_METHOD, TRUNCATED_BPTT_METHOD
from snn_reference import xent

pytestmark = pytest.mark.usefixtures('float64')


class Tiny(brainstate.nn.Module):
    """A leaky dense layer with a tanh output."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(np.random.default_rng(0).normal(size=(4, 3))))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 3)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + bc.dense(x, self.W.value)
        return jnp.tanh(self.h.value)


def data(T=5, B=2):
    rng = np.random.default_rng(1)
    return jnp.asarray(rng.normal(size=(T, B, 4))), jnp.asarray(rng.integers(0, 3, (T, B)))


def test_advance_carries_the_state_and_cuts_the_gradient_at_the_chunk_boundary():
    xs, ys = data(T=6)
    online = bc.BPTT(Tiny())
    online.reset(2)
    online.advance(xent, xs[:3], ys[:3])
    _, truncated = online.advance(xent, xs[3:], ys[3:])
    # the same chunk from the carried state, the state held fixed: truncated BPTT
    reference = bc.BPTT(Tiny())
    reference.value_and_grad(xent, xs[:3], ys[:3])
    _, expected = reference.value_and_grad(xent, xs[3:], ys[3:], reset=False)
    np.testing.assert_allclose(truncated[('W',)], expected[('W',)], rtol=1e-12)
    # ... which is not the gradient of those steps' loss through the whole sequence
    whole = bc.BPTT(Tiny())
    mask = np.arange(6) >= 3
    _, full = whole.value_and_grad(lambda o, t: xent(o, t[0]) * t[1], xs,
                                   (ys, jnp.asarray(mask, float)))
    assert not np.allclose(full[('W',)], truncated[('W',)], rtol=1e-3)


def test_report_says_truncated_after_advance_and_exact_after_a_whole_sequence():
    xs, ys = data()
    learner = bc.BPTT(Tiny())
    learner.value_and_grad(xent, xs, ys)
    assert {r['method'] for r in learner.report().rows} == {BPTT_METHOD}
    learner.reset(2)
    learner.advance(xent, xs, ys)
    assert {r['method'] for r in learner.report().rows} == {TRUNCATED_BPTT_METHOD}
    assert 'gradient is cut at their boundaries' in str(learner.report())
