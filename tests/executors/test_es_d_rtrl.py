"""ES-D-RTRL: exact on linear layers, an approximation elsewhere; its decays; exact traces
for the ops a user names or a budget fits.

The decays are given (one for every op) or inferred per op from the dynamics of the
neurons it drives, one input trace per timescale (concrete values only: not inside an
outer ``jax.jit`` before a first call); the time index of its normalisation counts
steps, not calls (float64, against BPTT). Multi-decay ES is checked against its
brute-force reference in ``test_approximations.py``. One hop across layers
(``cross_layer=1``) equals BPTT on the top two layers of linear leaky stacks; what it
refuses, and that ``cross_layer=0`` is ES-D-RTRL to the bit.
"""
import functools

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from snn_reference import EXACT, rel_err, xent
from user_models import (LinearLeaky, LinearStack, NeuronLayer, OneLayer, assert_matches_bptt,
                         compare, linear_stack_data, methods, ours, sin_loss, spikes_and_labels)

pytestmark = pytest.mark.usefixtures('float64')


def test_es_drtrl_equals_bptt_on_linear_leaky_layer():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(9, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 4, 4, 5)))
    assert_matches_bptt(model, bc.ES_D_RTRL(model, decay=0.8), xs, targets, sin_loss)


def test_es_drtrl_decay_mismatch_is_an_approximation():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(9, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 4, 4, 5)))
    _, ref = bc.BPTT(model).value_and_grad(sin_loss, xs, targets)
    _, grads = bc.ES_D_RTRL(model, decay=0.3).value_and_grad(sin_loss, xs, targets)
    assert rel_err(grads['K',], ref['K',]) > 1e-3          # the kernel trace is approximate
    assert rel_err(grads['b',], ref['b',]) < EXACT         # the bias trace is exact


def test_es_decay_inference_inside_jit_is_a_clear_error():
    """Inferred decays need concrete values: inside an outer jax.jit the first call says so;
    once inferred by a call outside, the jitted call gives the same gradients."""
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(7)
    xs = jnp.asarray(rng.normal(size=(4, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(4, 2, 4, 4, 5)))
    learner = bc.ES_D_RTRL(model)
    jitted = jax.jit(lambda a, b: learner.value_and_grad(sin_loss, a, b)[1])
    with pytest.raises(ValueError, match='abstract inside jax.jit.*decay='):
        jitted(xs, targets)
    _, want = learner.value_and_grad(sin_loss, xs, targets)
    got = jitted(xs, targets)
    for key in want:
        assert rel_err(got[key], want[key]) < 1e-12, key


def test_es_time_index_counts_steps_not_calls():
    model = LinearLeaky(0.8)
    rng = np.random.default_rng(7)
    xs = jnp.asarray(rng.normal(size=(6, 2, 8, 8, 2)))
    targets = jnp.asarray(rng.normal(size=(6, 2, 4, 4, 5)))
    learner = bc.ES_D_RTRL(model, decay=0.8)
    _, whole = learner.value_and_grad(sin_loss, xs, targets)
    learner.reset(2)
    parts = [learner.advance(sin_loss, xs[s:s + 2], targets[s:s + 2])[1] for s in (0, 2, 4)]
    summed = jax.tree.map(lambda *g: sum(g), *parts)
    for key in whole:
        assert rel_err(summed[key], whole[key]) < 1e-10


# ----------------------------------------------------------------------------- decays
class TwoLeaky(brainstate.nn.Module):
    """Two parallel linear leaky layers with decays 0.7 and 0.5 and a shared readout."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.K1 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 3))))
        self.K2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 2))))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(3 * 7 + 3 * 7, 2)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h1 = brainstate.HiddenState(jnp.zeros((batch_size, 3, 7)))
        self.h2 = brainstate.HiddenState(jnp.zeros((batch_size, 3, 7)))

    def update(self, x):
        h1 = 0.7 * self.h1.value + bc.conv(x, self.K1.value, strides=1, padding='SAME')
        h2 = 0.5 * self.h2.value + bc.conv(x, self.K2.value, strides=1, padding='SAME')
        self.h1.value, self.h2.value = h1, h2
        feat = jnp.concatenate([h1.reshape(h1.shape[0], -1), h2.reshape(h2.shape[0], -1)], 1)
        return bc.dense(feat, self.W.value)


def test_es_drtrl_infers_one_decay_per_op_and_is_exact_on_linear_layers():
    model = TwoLeaky()
    rng = np.random.default_rng(2)
    xs = jnp.asarray(rng.normal(size=(9, 2, 2, 7)))
    targets = jnp.asarray(rng.normal(size=(9, 2, 2)))
    learner = bc.ES_D_RTRL(model)
    errors = compare(model, learner, xs, targets, lambda o, t: jnp.sum((o - t) ** 2))
    assert max(errors.values()) < EXACT, errors
    rows = methods(learner)
    assert 'decay 0.7, inferred' in rows['K1'] and 'decay 0.5, inferred' in rows['K2']


def test_es_drtrl_infers_the_membrane_decay_of_a_spiking_neuron():
    model = OneLayer('subtract')
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=3)
    learner = bc.ES_D_RTRL(model)
    learner.value_and_grad(xent, xs, labels)
    assert 'decay 0.9, inferred' in methods(learner)['K']


@pytest.mark.parametrize('decay', [0.9, np.float32(0.9), np.float64(0.9), jnp.float32(0.9),
                                   jnp.asarray(0.9), 1])
def test_es_drtrl_accepts_any_real_scalar_decay(decay):
    assert bc.ES_D_RTRL(OneLayer('subtract'), decay=decay).decay == pytest.approx(0.9 if decay != 1 else 1.0, rel=1e-6)


@pytest.mark.parametrize('decay', [0, 1.5, -0.2, True, 'fast', [0.9], np.ones(2), 0.5 + 0.1j])
def test_es_drtrl_rejects_bad_decays(decay):
    with pytest.raises(ValueError, match='decay'):
        bc.ES_D_RTRL(OneLayer('subtract'), decay=decay)


# ----------------------------------------------------------------------------- several decays
class LinearTwoState(brainstate.nn.Module):
    """``v' = A00 v + A01 a + d0 y``, ``a' = A10 v + A11 a + d1 y`` with ``y = dense(x) + b``,
    read out as ``dense(v - 2 a)``: a linear layer with two coupled states."""

    def __init__(self, A, d=(1.0, 0.3), seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.A, self.d = A, d
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(4, 5))))
        self.b = brainstate.ParamState(jnp.asarray(rng.normal(size=(5,))))
        self.R = brainstate.ParamState(jnp.asarray(rng.normal(size=(5, 3))))

    def init_state(self, batch_size=None, **kw):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, 5)))
        self.a = brainstate.HiddenState(jnp.zeros((batch_size, 5)))

    def update(self, x):
        y = bc.dense(x, self.W.value, self.b.value)
        (p, q), (r, s) = self.A
        v = p * self.v.value + q * self.a.value + self.d[0] * y
        a = r * self.v.value + s * self.a.value + self.d[1] * y
        self.v.value, self.a.value = v, a
        return bc.dense(v - 2 * a, self.R.value)


# the layer of the issue: v = 0.9 v + W x, a = 0.995 a + 0.05 v (the new v), read v - 2a
ADAPTIVE = (((0.9, 0.0), (0.045, 0.995)), (1.0, 0.05))
LINEAR_TWO_STATE = {
    'diagonal': (((0.9, 0.0), (0.0, 0.995)), (1.0, 0.3)),
    'coupled (adaptation)': ADAPTIVE,
    'complex pair': (((0.9, -0.2), (0.3, 0.85)), (1.0, 0.3)),
    'equal coupled decays (Jordan chain)': (((0.9, 0.0), (0.2, 0.9)), (1.0, 0.3)),
}


def linear_data(T=30):
    rng = np.random.default_rng(1)
    return jnp.asarray(rng.normal(size=(T, 2, 4))), jnp.asarray(rng.normal(size=(T, 2, 3)))


@pytest.mark.parametrize('name, window', [
    pytest.param(name, window, marks=() if window is None or name == 'coupled (adaptation)'
                 else (pytest.mark.slow,)) for name in LINEAR_TWO_STATE for window in (None, 7)])
def test_inferred_decays_are_exact_on_linear_two_state_layers(name, window):
    model = LinearTwoState(*LINEAR_TWO_STATE[name])
    xs, targets = linear_data()
    assert_matches_bptt(model, bc.ES_D_RTRL(model, window=window), xs, targets, sin_loss,
                        tol=1e-9)


def test_one_decay_is_far_off_on_the_adaptive_linear_layer():
    """The membrane's decay for every state (the former inference) misses the slow one."""
    model = LinearTwoState(*ADAPTIVE)
    xs, targets = linear_data()
    _, ref = bc.BPTT(model).value_and_grad(sin_loss, xs, targets)
    _, grads = bc.ES_D_RTRL(model, decay=0.9).value_and_grad(sin_loss, xs, targets)
    assert rel_err(grads['W',], ref['W',]) > 0.5


def test_the_report_names_every_decay_of_an_op():
    model = LinearTwoState(*ADAPTIVE)
    xs, targets = linear_data(4)
    learner = bc.ES_D_RTRL(model)
    learner.value_and_grad(sin_loss, xs, targets)
    assert 'decays 0.995 / 0.9, one input trace each, inferred' in methods(learner)["W"]
    given = bc.ES_D_RTRL(model, decay=0.9)
    given.value_and_grad(sin_loss, xs, targets)
    assert 'decay 0.9, given' in methods(given)["W"]


def _lowered(learner, xs, labels):
    text = learner.lower(xent, xs, labels).as_text()
    return '\n'.join(line.split(' loc(')[0] for line in text.splitlines()
                     if not line.startswith('#loc'))


@pytest.mark.parametrize('make, shape', [
    pytest.param(lambda: OneLayer('subtract'), (2, 6, 6, 2), id='reset-after-spike'),
    pytest.param(lambda: NeuronLayer(functools.partial(bc.nn.LIF, tau=5.0)), (2, 2, 6, 6),
                 id='ours', marks=pytest.mark.slow)])
def test_one_state_neurons_lower_to_the_program_of_their_one_decay(make, shape):
    """A LIF neuron has one timescale: inferred, it is ES with that one decay, the same
    program and the same gradients bit for bit, with a window too."""
    xs, labels = spikes_and_labels(shape, T=5)
    for window in (None, 2):
        model = make()
        inferred = bc.ES_D_RTRL(model, window=window)
        _, want = inferred.value_and_grad(xent, xs, labels)
        graph = inferred.analysis()
        decays = {mode.decay.real for modes in inferred._plan(graph).modes.values()
                  for mode in modes}
        assert len(decays) == 1 and all('decays' not in m for m in methods(inferred).values())
        given = bc.ES_D_RTRL(model, decay=decays.pop(), window=window)
        _, got = given.value_and_grad(xent, xs, labels)
        for key in want:
            for a, b in zip(jax.tree.leaves(got[key]), jax.tree.leaves(want[key])):
                np.testing.assert_array_equal(a, b)
        assert _lowered(inferred, xs, labels) == _lowered(given, xs, labels)


# ----------------------------------------------------------------------------- exact traces per op
def _ours_data(T=6):
    return spikes_and_labels((2, 2, 6, 6), T=T)


@pytest.mark.parametrize('window', [None, pytest.param(4, marks=pytest.mark.slow)])
def test_exact_traces_on_every_op_are_d_rtrl(window):
    xs, labels = _ours_data()
    model = ours()
    _, want = bc.D_RTRL(model, window=window).value_and_grad(xent, xs, labels)
    learner = bc.ES_D_RTRL(model, exact=['blocks', 'fc'], window=window)
    _, got = learner.value_and_grad(xent, xs, labels)
    for key in want:
        assert rel_err(got[key], want[key]) < 1e-12, key
    assert all('ES-D-RTRL' not in m for m in methods(learner).values())


def test_named_ops_get_exact_traces_and_the_report_says_so():
    xs, labels = _ours_data()
    model = ours()
    learner = bc.ES_D_RTRL(model, exact='blocks.1')
    _, grads = learner.value_and_grad(xent, xs, labels)
    rows = {r['parameter']: r for r in learner.report().rows}
    d_rtrl = bc.D_RTRL(model)
    _, exact = d_rtrl.value_and_grad(xent, xs, labels)
    exact_rows = {r['parameter']: r for r in d_rtrl.report().rows}
    for name in ('blocks.1.ff.weight', 'blocks.1.rec.weight'):
        assert rows[name]['method'].startswith('exact within its layer (D-RTRL trace)')
        assert rows[name]['trace_bytes'] == exact_rows[name]['trace_bytes']
        key = tuple(rows[name]['path'][:1]) + tuple(rows[name]['path'][1:])
        assert rel_err(learner.report().gradient(grads, name),
                       d_rtrl.report().gradient(exact, name)) < 1e-12, key
    assert 'approximate trace (ES-D-RTRL' in rows['blocks.0.ff.weight']['method']
    assert rows['blocks.0.ff.weight']['trace_bytes'] < exact_rows['blocks.0.ff.weight']['trace_bytes']


def test_a_budget_gives_exact_traces_to_the_smallest_ops_that_fit():
    xs, labels = _ours_data(3)
    model = ours()
    d_rtrl = bc.D_RTRL(model)
    d_rtrl.value_and_grad(xent, xs, labels)
    per_op = {}
    for row in d_rtrl.report().rows:     # '... via etp_conv #k': the op of each row
        per_op.setdefault(row['method'].rsplit('#', 1)[1], []).append(row['trace_bytes'])
    sizes = sorted(sum(b) for b in per_op.values())
    learner = bc.ES_D_RTRL(model, exact_budget=sizes[0] + sizes[1])
    learner.value_and_grad(xent, xs, labels)
    is_exact = lambda m: 'D-RTRL trace' in m or m.startswith('exact trace (D-RTRL)')
    exact = [m for m in methods(learner).values() if is_exact(m)]
    assert len({m.rsplit('#', 1)[1] for m in exact}) == 2
    none = bc.ES_D_RTRL(model, exact_budget=sizes[0] - 1)
    none.value_and_grad(xent, xs, labels)
    assert not any(is_exact(m) for m in methods(none).values())


def test_exact_traces_carry_across_advance_calls():
    xs, labels = _ours_data()
    model = ours()
    learner = bc.ES_D_RTRL(model, exact=['blocks.1'])
    _, whole = learner.value_and_grad(xent, xs, labels)
    learner.reset(2)
    parts = [learner.advance(xent, xs[s:s + 2], labels[s:s + 2])[1] for s in (0, 2, 4)]
    summed = jax.tree.map(lambda *g: sum(g), *parts)
    for key in whole:
        assert rel_err(summed[key], whole[key]) < 1e-10, key


@pytest.mark.parametrize('exact, error, match', [
    (['blocks.7'], ValueError, r"exact must name a parameter of an op whose output drives "
                               r"neurons, or a module above one: one of \['blocks.0.ff.bias', "
                               r".*got 'blocks.7'"),
    (['blocks.0.ff.weigh'], ValueError, "got 'blocks.0.ff.weigh'"),
    ([3], TypeError, 'exact must hold parameter paths'),
    (5, TypeError, 'exact must be a parameter path or a sequence of them'),
])
def test_exact_paths_that_name_no_op_are_refused(exact, error, match):
    xs, labels = _ours_data(2)
    with pytest.raises(error, match=match):
        bc.ES_D_RTRL(ours(), exact=exact).value_and_grad(xent, xs, labels)


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match='exact_budget must be None .* or a non-negative '
                                         'integer, got -1'):
        bc.ES_D_RTRL(ours(), exact_budget=-1)


# ----------------------------------------------------------------------------- one hop
def _errors(model, learner, xs, targets):
    """``{parameter: relative error to BPTT}``."""
    _, ref = bc.BPTT(model).value_and_grad(sin_loss, xs, targets)
    _, grads = learner.value_and_grad(sin_loss, xs, targets)
    return {f'{key[0]}.{key[1]}': rel_err(grads[key], ref[key]) for key in ref}


@pytest.mark.parametrize('pool, window, gain', [(None, None, 1.0), ('avg', None, 1.0),
                                                (None, 2, 1.0), (None, None, 0.3)])
def test_one_hop_is_exact_on_two_linear_leaky_layers(pool, window, gain):
    """Every layer of a stack of two, whatever their decays: the one path ES cuts (the
    first layer's effect through the second's state) is the hop. With a gain on the input
    (``Df = 0.3``) the reader's trace must take ``Df Z`` as its input, not ``Z``."""
    model = LinearStack((0.8, 0.6), pool=pool, gain=gain)
    xs, targets = linear_stack_data(model)
    errors = _errors(model, bc.ES_D_RTRL(model, cross_layer=1, window=window), xs, targets)
    assert max(errors.values()) < 1e-12, errors
    assert _errors(model, bc.ES_D_RTRL(model, window=window), xs, targets)['K.0'] > 0.1


def test_one_hop_is_exact_on_the_top_two_of_three_linear_layers():
    model = LinearStack((0.9, 0.5, 0.7))
    xs, targets = linear_stack_data(model)
    errors = _errors(model, bc.ES_D_RTRL(model, cross_layer=1), xs, targets)
    assert max(errors[p] for p in ('K.1', 'b.1', 'K.2', 'b.2')) < 1e-12, errors
    assert errors['K.0'] > 0.1      # two hops away from the top state: still cut


def test_one_hop_carries_across_advance_calls():
    model = LinearStack((0.8, 0.6), pool='avg')
    xs, targets = linear_stack_data(model, T=8)
    learner = bc.ES_D_RTRL(model, cross_layer=1)
    _, whole = learner.value_and_grad(sin_loss, xs, targets)
    learner.reset(2)
    _, first = learner.advance(sin_loss, xs[:3], targets[:3])
    _, second = learner.advance(sin_loss, xs[3:], targets[3:])
    for key in whole:
        assert rel_err(first[key] + second[key], whole[key]) < 1e-12


def test_cross_layer_zero_and_a_model_without_hops_are_es_to_the_bit():
    xs, labels = _ours_data()
    model = ours()
    _, plain = bc.ES_D_RTRL(model).value_and_grad(xent, xs, labels)
    _, zero = bc.ES_D_RTRL(model, cross_layer=0).value_and_grad(xent, xs, labels)
    one_layer = OneLayer('subtract')
    x1, l1 = spikes_and_labels((2, 6, 6, 2))
    _, a = bc.ES_D_RTRL(one_layer).value_and_grad(xent, x1, l1)
    _, b = bc.ES_D_RTRL(one_layer, cross_layer=1).value_and_grad(xent, x1, l1)
    for x, y in [(plain, zero), (a, b)]:
        for key in x:
            for u_, v_ in zip(jax.tree.leaves(x[key]), jax.tree.leaves(y[key])):
                np.testing.assert_array_equal(np.asarray(u_), np.asarray(v_))


def test_the_report_names_the_hop_and_its_bytes():
    xs, labels = _ours_data()
    model = ours()
    rows = {}
    for cross_layer in (0, 1):
        learner = bc.ES_D_RTRL(model, cross_layer=cross_layer)
        learner.value_and_grad(xent, xs, labels)
        rows[cross_layer] = {r['parameter']: r for r in learner.report().rows}
    first = rows[1]['blocks.0.ff.weight']
    assert 'followed one hop (cross_layer=1' in first['method'], first['method']
    extra = first['trace_bytes'] - rows[0]['blocks.0.ff.weight']['trace_bytes']
    assert extra > 0 and f'{extra} bytes' in first['method']
    # the last block is read by the leaky readout: one hop too
    assert 'one hop' in rows[1]['blocks.1.ff.weight']['method']


@pytest.mark.parametrize('cross_layer, error', [(2, ValueError), (-1, ValueError),
                                                (1.0, TypeError), (True, TypeError)])
def test_bad_cross_layer_values_are_refused(cross_layer, error):
    with pytest.raises(error, match='cross_layer'):
        bc.ES_D_RTRL(ours(), cross_layer=cross_layer)


def test_one_hop_refuses_a_max_pooling_between_the_layers():
    model = LinearStack((0.8, 0.6), pool='max')
    xs, targets = linear_stack_data(model)
    with pytest.raises(ValueError, match='not a linear map'):
        bc.ES_D_RTRL(model, cross_layer=1).value_and_grad(sin_loss, xs, targets)


def test_one_hop_needs_one_decay_in_the_reader_or_a_given_decay():
    xs, labels = _ours_data()
    model = ours(tau_adapt=30.0)
    with pytest.raises(ValueError, match='several decays.*decay='):
        bc.ES_D_RTRL(model, cross_layer=1).value_and_grad(xent, xs, labels)
    _, grads = bc.ES_D_RTRL(model, 0.8, cross_layer=1).value_and_grad(xent, xs, labels)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(grads))
