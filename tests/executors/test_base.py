"""The learner interface (``executors/base.py``): how calls are compiled and cached."""
import warnings

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from snn_reference import xent

pytestmark = pytest.mark.usefixtures('float64')

TRACED = []     # one entry per trace of traced_xent, i.e. per compiled program
SCALE = 1.0     # a global a loss function reads


def traced_xent(out, label):
    TRACED.append(1)
    return xent(out, label)


class Tiny(brainstate.nn.Module):
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


@pytest.mark.parametrize('make', [bc.BPTT, bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_a_loss_function_written_again_at_every_call_compiles_once(make):
    learner, (xs, ys) = make(Tiny()), data()
    call = lambda: learner.value_and_grad(lambda o, t: traced_xent(o, t), xs, ys)[0]
    TRACED.clear()
    losses = [call()]
    first = len(TRACED)
    losses += [call() for _ in range(4)]
    assert first > 0 and len(TRACED) == first
    np.testing.assert_allclose(losses, losses[0])


def test_a_changed_captured_value_is_a_new_program():
    global SCALE
    learner, (xs, ys) = bc.D_RTRL(Tiny()), data()
    scaled = lambda factor: learner.value_and_grad(lambda o, t: factor * xent(o, t), xs, ys)[0]
    reads_global = lambda: learner.value_and_grad(lambda o, t: SCALE * xent(o, t), xs, ys)[0]
    with pytest.warns(UserWarning, match='compiles again'):    # the value changed: said once
        np.testing.assert_allclose(scaled(2.0), 2 * scaled(1.0))
    one = reads_global()
    SCALE = 3.0
    try:
        np.testing.assert_allclose(reads_global(), 3 * one)
    finally:
        SCALE = 1.0


def test_a_loss_capturing_an_array_compiles_per_object_and_warns_once():
    learner, (xs, ys) = bc.ES_D_RTRL(Tiny(), 0.9), data()
    weight = jnp.ones(())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(3):
            learner.value_and_grad(lambda o, t: weight * xent(o, t), xs, ys)
    messages = [str(w.message) for w in caught if 'compiles again' in str(w.message)]
    assert len(messages) == 1 and 'test_base.py' in messages[0]
    assert 'Define the function once' in messages[0]


@pytest.mark.parametrize('make', [bc.BPTT, bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_a_nan_input_is_refused_naming_its_time_step(make):
    xs, ys = data(T=6)
    xs = xs.at[3, 1, 2].set(jnp.nan)
    with pytest.raises(ValueError, match=r'xs must be finite, got nan at t=3, b=1'):
        make(Tiny()).value_and_grad(xent, xs, ys)
    learner = make(Tiny())
    learner.reset(2)
    with pytest.raises(ValueError, match=r'got nan at t=3.*check_finite=False'):
        learner.advance(xent, xs, ys)
    loss, _ = learner.advance(xent, xs, ys, check_finite=False)     # this chunk only
    assert not np.isfinite(loss) and learner.check_finite


def test_non_finite_targets_are_refused_and_the_check_can_be_turned_off():
    xs, ys = data(T=4)
    regression = jnp.zeros((4, 2, 3)).at[2, 0, 0].set(jnp.inf)
    squared = lambda out, target: jnp.sum((out - target) ** 2)
    with pytest.raises(ValueError, match='targets must be finite, got inf at t=2, b=0'):
        bc.D_RTRL(Tiny()).value_and_grad(squared, xs, regression)
    loss, _ = bc.D_RTRL(Tiny(), check_finite=False).value_and_grad(squared, xs, regression)
    assert not np.isfinite(loss)
    with pytest.raises(TypeError, match='check_finite must be True or False, got .yes.'):
        bc.BPTT(Tiny(), check_finite='yes')


@pytest.mark.parametrize('make', [lambda m: bc.D_RTRL(m, window=2), lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_an_online_run_saved_and_restored_elsewhere_continues_bit_for_bit(make):
    xs, ys = data(T=9)
    chunks = [(xs[i:i + 3], ys[i:i + 3]) for i in range(0, 9, 3)]
    whole = make(Tiny())
    whole.reset(2)
    expected = [whole.advance(xent, *chunk) for chunk in chunks]

    first = make(Tiny())
    first.reset(2)
    assert first.online_state() is None
    first.advance(xent, *chunks[0])
    saved = first.online_state()
    second = make(Tiny())                       # a new learner and model, as after a restart
    second.restore_online_state(saved)
    got = [second.advance(xent, *chunk) for chunk in chunks[1:]]
    for (loss, grads), (ref_loss, ref_grads) in zip(got, expected[1:]):
        assert float(loss) == float(ref_loss)
        for key in ref_grads:
            np.testing.assert_array_equal(grads[key], ref_grads[key])


def test_a_saved_run_of_another_shape_is_refused_naming_both():
    xs, ys = data(T=3)
    learner = bc.D_RTRL(Tiny())
    learner.reset(2)
    learner.advance(xent, xs, ys)
    saved = learner.online_state()
    saved['leaves'][0] = saved['leaves'][0][:, :2]
    other = bc.D_RTRL(Tiny())
    other.restore_online_state(saved)
    with pytest.raises(ValueError, match='restore_online_state: the saved run holds'):
        other.advance(xent, xs, ys)
