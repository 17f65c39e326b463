"""The learner interface (``executors/base.py``): how calls are compiled and cached, online
runs in chunks, trace buffers reused from call to call, outputs and resets, and the
sentence each misuse gets."""
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.primitive import register_primitive
from snn_reference import rel_err, xent
from user_models import (LeakyDense, TwoVariable, TypedLayer, assert_matches_bptt,
                         leaky_dense_data, sin_loss)

pytestmark = pytest.mark.usefixtures('float64')

TRACED = []     # one entry per trace of traced_xent, i.e. per compiled program
SCALE = 1.0     # a global a loss function reads


def traced_xent(out, label):
    TRACED.append(1)
    return xent(out, label)


@pytest.mark.parametrize('make', [bc.BPTT, bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_a_loss_function_written_again_at_every_call_compiles_once(make):
    learner, (xs, ys) = make(LeakyDense()), leaky_dense_data()
    call = lambda: learner.value_and_grad(lambda o, t: traced_xent(o, t), xs, ys)[0]
    TRACED.clear()
    losses = [call()]
    first = len(TRACED)
    losses += [call() for _ in range(4)]
    assert first > 0 and len(TRACED) == first
    np.testing.assert_allclose(losses, losses[0])


def test_a_changed_captured_value_is_a_new_program():
    global SCALE
    learner, (xs, ys) = bc.D_RTRL(LeakyDense()), leaky_dense_data()
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
    learner, (xs, ys) = bc.ES_D_RTRL(LeakyDense(), 0.9), leaky_dense_data()
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
    xs, ys = leaky_dense_data(T=6)
    xs = xs.at[3, 1, 2].set(jnp.nan)
    with pytest.raises(ValueError, match=r'xs must be finite, got nan at t=3, b=1'):
        make(LeakyDense()).value_and_grad(xent, xs, ys)
    learner = make(LeakyDense())
    learner.reset(2)
    with pytest.raises(ValueError, match=r'got nan at t=3.*check_finite=False'):
        learner.advance(xent, xs, ys)
    loss, _ = learner.advance(xent, xs, ys, check_finite=False)     # this chunk only
    assert not np.isfinite(loss) and learner.check_finite


def test_non_finite_targets_are_refused_and_the_check_can_be_turned_off():
    xs, ys = leaky_dense_data(T=4)
    regression = jnp.zeros((4, 2, 3)).at[2, 0, 0].set(jnp.inf)
    squared = lambda out, target: jnp.sum((out - target) ** 2)
    with pytest.raises(ValueError, match='targets must be finite, got inf at t=2, b=0'):
        bc.D_RTRL(LeakyDense()).value_and_grad(squared, xs, regression)
    loss, _ = bc.D_RTRL(LeakyDense(), check_finite=False).value_and_grad(squared, xs, regression)
    assert not np.isfinite(loss)
    with pytest.raises(TypeError, match='check_finite must be True or False, got .yes.'):
        bc.BPTT(LeakyDense(), check_finite='yes')


@pytest.mark.parametrize('make', [lambda m: bc.D_RTRL(m, window=2), lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_an_online_run_saved_and_restored_elsewhere_continues_bit_for_bit(make):
    xs, ys = leaky_dense_data(T=9)
    chunks = [(xs[i:i + 3], ys[i:i + 3]) for i in range(0, 9, 3)]
    whole = make(LeakyDense())
    whole.reset(2)
    expected = [whole.advance(xent, *chunk) for chunk in chunks]

    first = make(LeakyDense())
    first.reset(2)
    assert first.online_state() is None
    first.advance(xent, *chunks[0])
    saved = first.online_state()
    second = make(LeakyDense())                 # a new learner and model, as after a restart
    second.restore_online_state(saved)
    got = [second.advance(xent, *chunk) for chunk in chunks[1:]]
    for (loss, grads), (ref_loss, ref_grads) in zip(got, expected[1:]):
        assert float(loss) == float(ref_loss)
        for key in ref_grads:
            np.testing.assert_array_equal(grads[key], ref_grads[key])


def test_a_saved_run_of_another_shape_is_refused_naming_both():
    xs, ys = leaky_dense_data(T=3)
    learner = bc.D_RTRL(LeakyDense())
    learner.reset(2)
    learner.advance(xent, xs, ys)
    saved = learner.online_state()
    saved['leaves'][0] = saved['leaves'][0][:, :2]
    other = bc.D_RTRL(LeakyDense())
    other.restore_online_state(saved)
    with pytest.raises(ValueError, match='restore_online_state: the saved run holds'):
        other.advance(xent, xs, ys)


# ----------------------------------------------------------------------------- online API
@pytest.mark.parametrize('make', [bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9), bc.BPTT],
                         ids=['d-rtrl', 'es-d-rtrl', 'bptt'])
def test_advance_in_chunks_equals_one_call(make):
    """Stepping 3 steps at a time with traces carried equals one call over 9 steps
    (for BPTT, stepping is truncated BPTT, so only the loss is compared)."""
    model = TwoVariable(chained=True)
    rng = np.random.default_rng(6)
    xs = jnp.asarray(rng.normal(size=(9, 2, 3, 8)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 2)))
    learner = make(model)
    loss_all, grads_all = learner.value_and_grad(sin_loss, xs, targets)
    learner.reset(2)
    total, acc = 0.0, None
    for s in range(0, 9, 3):
        loss, grads = learner.advance(sin_loss, xs[s:s + 3], targets[s:s + 3])
        total += loss
        acc = grads if acc is None else jax.tree.map(jnp.add, acc, grads)
    np.testing.assert_allclose(total, loss_all, rtol=1e-12)
    if isinstance(learner, bc.BPTT):
        return
    for key in grads_all:
        assert rel_err(acc[key], grads_all[key]) < 1e-10


@pytest.mark.parametrize('make', [bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9)],
                         ids=['d-rtrl', 'es-d-rtrl'])
def test_a_call_from_zero_traces_reuses_the_last_calls_buffers(make):
    """A call that starts from zero traces is given the last call's trace buffers (donated
    where the executor donates, so that no call writes fresh memory): after a
    whole-sequence call, after advance() chunks, under an outer jax.jit and after a
    batch-size change, its gradients are those of a fresh learner."""
    model = TwoVariable(chained=True)
    rng = np.random.default_rng(6)
    xs = jnp.asarray(rng.normal(size=(6, 2, 3, 8)))
    targets = jnp.asarray(rng.normal(size=(6, 2, 2)))
    learner = make(model)
    _, want = make(TwoVariable(chained=True)).value_and_grad(sin_loss, xs, targets)

    def check(grads):
        for key in want:
            assert rel_err(grads[key], want[key]) < 1e-12, key

    alive = jax.live_arrays()       # kept referenced, so that no id below is reused
    known = {id(a) for a in alive}
    check(learner.value_and_grad(sin_loss, xs, targets)[1])
    held = [a for a in jax.live_arrays() if id(a) not in known]    # what the learner keeps
    check(learner.value_and_grad(sin_loss, xs, targets)[1])
    # a donated buffer is deleted; the arrays the second call consumed hold every trace
    donated = sum(a.nbytes for a in held if a.is_deleted())
    if learner.donate_state:
        assert donated >= learner.report().trace_bytes > 0, 'the buffers were not reused'
    else:                                      # passed in, not consumed: nothing is deleted
        assert donated == 0 and learner.report().trace_bytes > 0
    learner.reset(2)
    learner.advance(sin_loss, xs[:3], targets[:3])
    learner.advance(sin_loss, xs[3:], targets[3:])
    check(learner.value_and_grad(sin_loss, xs, targets)[1])
    check(jax.jit(lambda a, b: learner.value_and_grad(sin_loss, a, b)[1])(xs, targets))
    check(learner.value_and_grad(sin_loss, xs, targets)[1])     # the carry held tracers
    learner.value_and_grad(sin_loss, jnp.concatenate([xs, xs], 1),
                           jnp.concatenate([targets, targets], 1))
    check(learner.value_and_grad(sin_loss, xs, targets)[1])


def test_rules_that_return_shared_or_kept_arrays_for_zero_traces():
    """Trace buffers are donated to each call, so they are the learner's own: an init rule
    may return one array for two traces, or an array it keeps between calls."""
    kept = jnp.zeros((2, 3, 4, 1))

    def init_drtrl(x_aval, y_aval, weight_avals, m):
        zeros = jnp.zeros(y_aval.shape + (m,), y_aval.dtype)
        return {'weight': zeros, 'bias': zeros}

    def init_pp(x_aval, y_aval, weight_avals, m):
        return kept

    gain_p = register_primitive('shared_zeros_gain', lambda x, w, b: x * w + b,
                                trainable_invars_fn=lambda params: {'weight': 1, 'bias': 2},
                                x_invar_index=0)
    gain_p.register_etp_rules(
        init_drtrl=init_drtrl, init_pp=init_pp,
        yw_to_w=lambda D, tr: {k: bc.extend.apply_state_jacobian(D, e) for k, e in tr.items()},
        xdf_to_trace=lambda x, Df, w: {'weight': Df * x[..., None], 'bias': Df},
        trace_to_dw=lambda tr, g, w: {k: jnp.sum(g * e, axis=(0, -1)) for k, e in tr.items()},
        xy_to_dw=lambda x, ct, w: bc.extend.weight_vjp(gain_p, [x, w['weight'], w['bias']], ct))

    class Gain(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(3)
            self.w = brainstate.ParamState(jnp.asarray(1 + 0.3 * rng.normal(size=(3, 4))))
            self.b = brainstate.ParamState(jnp.asarray(0.1 * rng.normal(size=(3, 4))))

        def init_state(self, batch_size=None, **kw):
            self.h = brainstate.HiddenState(jnp.zeros((batch_size, 3, 4)))

        def update(self, x):
            self.h.value = 0.7 * jnp.tanh(self.h.value) + gain_p.bind(x, self.w.value,
                                                                       self.b.value)
            return self.h.value

    model = Gain()
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(5, 2, 3, 4)))
    targets = jnp.asarray(rng.normal(size=(5, 2, 3, 4)))
    for learner in (bc.D_RTRL(model), bc.ES_D_RTRL(model, 0.7)):
        if learner.algorithm == 'D-RTRL':
            first = assert_matches_bptt(model, learner, xs, targets, sin_loss)[0]
        else:
            first = learner.value_and_grad(sin_loss, xs, targets)[1]
        again = learner.value_and_grad(sin_loss, xs, targets)[1]
        learner.reset(2)
        chunk = learner.advance(sin_loss, xs, targets)[1]
        for key in first:
            assert rel_err(again[key], first[key]) < 1e-12, key
            assert rel_err(chunk[key], first[key]) < 1e-12, key
    assert not kept.is_deleted()


def test_outputs_predict_and_reset_false():
    model = TwoVariable(chained=False)
    rng = np.random.default_rng(8)
    xs = jnp.asarray(rng.normal(size=(5, 2, 3, 8)))
    targets = jnp.asarray(rng.normal(size=(5, 2, 2)))
    learner = bc.ES_D_RTRL(model, 0.9)
    loss, _, outs = learner.value_and_grad(sin_loss, xs, targets, return_outputs=True)
    assert outs.shape == (5, 2, 2)
    np.testing.assert_allclose(bc.BPTT(model).predict(xs), outs, rtol=1e-12)
    # reset=False continues from the current hidden state
    v_end = np.asarray(model.v.value)
    assert np.abs(v_end).max() > 0
    learner.value_and_grad(sin_loss, xs, targets, reset=False)
    assert not np.allclose(model.v.value, v_end)


def test_sequence_errors():
    model = TwoVariable(chained=False)
    learner = bc.ES_D_RTRL(model, 0.9)
    xs = jnp.zeros((5, 2, 3, 8))
    with pytest.raises(ValueError, match='same number of time steps'):
        learner.value_and_grad(sin_loss, xs, jnp.zeros((4, 2, 2)))
    with pytest.raises(ValueError, match='batch axis'):
        learner.value_and_grad(sin_loss, jnp.zeros((5,)), jnp.zeros((5, 2)))
    with pytest.raises(ValueError, match='scalar'):
        learner.value_and_grad(lambda o, t: o - t, xs, jnp.zeros((5, 2, 2)))
    with pytest.raises(ValueError, match='decay'):
        bc.ES_D_RTRL(model, 1.5)
    with pytest.raises(TypeError, match='brainstate.nn.Module'):
        bc.D_RTRL(object())
    with pytest.raises(RuntimeError, match='report'):
        bc.D_RTRL(model).report()


# ----------------------------------------------------------------------------- executor misuse
MISUSE_SIZE = (8, 8)


def _label_loss(output, label):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(output, label))


@pytest.mark.parametrize('call, error, match', [
    (lambda l, xs, ys: l.advance(_label_loss, xs, ys), RuntimeError,
     r'advance\(\) continues an online run: call reset\(batch_size\) first'),
    (lambda l, xs, ys: (l.reset(2), l.advance(_label_loss, xs[:, :1], ys[:, :1])), ValueError,
     r'advance\(\) got xs with batch size 1, but the run was started for 2 sequences; call '
     r'reset\(1\)'),
    (lambda l, xs, ys: l.value_and_grad(_label_loss, xs, np.zeros((3, 3), np.int32)),
     ValueError, r"loss_fn\(output_t, target_t\) fails for one step's model output \(\(2, 8\), "
                 r"'float64'\) and target \(\(3,\), 'int32'\)"),
    (lambda l, xs, ys: l.reset(1.5), ValueError, r'reset\(batch_size\) takes a positive int'),
])
def test_executor_misuse_gets_a_sentence(call, error, match):
    brainstate.random.seed(0)
    m = recurrent_conv_snn((2,) + MISUSE_SIZE, 8, channels=(2, 4))
    learner = bc.ES_D_RTRL(m, m.membrane_decay())
    xs = (np.random.default_rng(0).random((3, 2, 2) + MISUSE_SIZE) < 0.3).astype(np.float64)
    ys = np.zeros((3, 2), np.int32)
    with pytest.raises(error, match=match):
        call(learner, xs, ys)


@pytest.mark.parametrize('bad', [jnp.int32, 'int8', 'fast', bool])
def test_trace_dtype_must_be_floating(bad):
    with pytest.raises(ValueError, match='trace_dtype'):
        bc.D_RTRL(TypedLayer(jnp.float32), trace_dtype=bad)
