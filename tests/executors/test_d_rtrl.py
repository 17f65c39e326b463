"""D-RTRL against BPTT: exact on one layer of diagonal dynamics, whatever sits between.

Every model here is built from ``brainstate`` states and the ``conv`` / ``dense``
ops only (no project layers), so the executors see them as unseen models: every
conv layout and argument, a flatten or transpose between op and neuron, an op
output that also bypasses the neuron, two-variable neurons, parameters inside the
dynamics and a user-registered primitive (float64).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from braintrace_conv.conv import etp_conv_p
from braintrace_conv.primitive import register_primitive
from snn_reference import EXACT, rel_err
from user_models import (CONV_CASES, ConvTanh, LinearLeaky, TwoVariable, assert_matches_bptt,
                         conv_data, sin_loss, sq_loss)

pytestmark = pytest.mark.usefixtures('float64')


@pytest.mark.parametrize('case', sorted(CONV_CASES))
@pytest.mark.parametrize('bias', [True, False])
def test_drtrl_equals_bptt_single_conv_layer(case, bias):
    x_shape, k_shape, kw, ch = CONV_CASES[case]
    model = ConvTanh(x_shape, k_shape, kw, ch, bias=bias)
    xs, _ = conv_data(x_shape)
    batch_out = x_shape[0] // kw.get('batch_group_count', 1)
    targets = jnp.asarray(np.random.default_rng(2).normal(size=(6, batch_out, 3)))
    assert_matches_bptt(model, bc.D_RTRL(model), xs, targets, sq_loss)


def test_drtrl_equals_bptt_with_flatten_between_conv_and_neuron():
    x_shape, k_shape, kw, ch = CONV_CASES['2d-nhwc-groups-negative-pad']
    model = ConvTanh(x_shape, k_shape, kw, ch, flatten=True)
    xs, targets = conv_data(x_shape)
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sq_loss)
    assert learner.analysis().ops[0].h_to_y is None   # a reshape keeps row-major order


class TransposedNeuron(ConvTanh):
    """The neuron state is stored channel-first while the conv output is channel-last."""

    def init_state(self, batch_size=None, **kw):
        height, width, channels = self.out_shape
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, channels, height, width)))

    def update(self, x):
        y = jnp.transpose(bc.conv(x, self.K.value, self.b.value, **self.kw), (0, 3, 1, 2))
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        return bc.dense(jnp.tanh(h.mean(axis=(2, 3))), self.W.value)


def test_drtrl_equals_bptt_with_transpose_between_conv_and_neuron():
    x_shape, k_shape, kw, ch = CONV_CASES['2d-nhwc-groups-negative-pad']
    model = TransposedNeuron(x_shape, k_shape, kw, ch)
    xs, targets = conv_data(x_shape)
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sq_loss)
    assert learner.analysis().ops[0].h_to_y is not None


class InputGated(ConvTanh):
    """The leak depends on the step's input: ``h = 0.7 tanh(h) sigmoid(y) + y``."""

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, **self.kw)
        h = 0.7 * jnp.tanh(self.h.value) * jax.nn.sigmoid(y) + y
        self.h.value = h
        return bc.dense(jnp.tanh(h.mean(axis=2)), self.W.value)


@pytest.mark.parametrize('model_class, early', [(ConvTanh, True), (InputGated, False)])
def test_state_jacobian_is_evaluated_a_step_early_only_when_it_reads_only_the_state(
        model_class, early):
    # dz/dh_prev of ConvTanh depends on h alone, so each step evaluates the next step's;
    # InputGated's also reads the input, so it stays in its own step. Exact either way.
    from braintrace_conv.executors._analysis.signals import jacobian_reads_only_state
    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = model_class(x_shape, k_shape, kw, ch)
    xs, targets = conv_data(x_shape)
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sq_loss)
    assert jacobian_reads_only_state(learner.analysis()) is early
    # a constant leak depends on neither and stays in its step too (XLA folds it)
    leaky = LinearLeaky(0.8)
    learner = bc.D_RTRL(leaky)
    learner.value_and_grad(sin_loss, jnp.ones((2, 2, 8, 8, 2)), jnp.ones((2, 2, 4, 4, 5)))
    assert jacobian_reads_only_state(learner.analysis()) is False


class Bypass(ConvTanh):
    """The conv output reaches the loss both through the neuron and around it."""

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, **self.kw)
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        feat = jnp.tanh(h.mean(axis=2)) + 0.5 * jnp.sin(y).mean(axis=2)
        return bc.dense(feat, self.W.value)


def test_drtrl_equals_bptt_when_the_op_output_also_bypasses_the_neuron():
    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = Bypass(x_shape, k_shape, kw, ch)
    xs, targets = conv_data(x_shape)
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sq_loss)
    (group,) = learner.analysis().groups
    assert group.m == 2 and not group.identity_release   # the cut holds y as well as h


@pytest.mark.parametrize('chained', [False, True])
def test_drtrl_equals_bptt_two_variable_neuron(chained):
    model = TwoVariable(chained)
    rng = np.random.default_rng(3)
    xs = jnp.asarray(rng.normal(size=(8, 2, 3, 8)))
    targets = jnp.asarray(rng.normal(size=(8, 2, 2)))
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sin_loss)
    (group,) = learner.analysis().groups
    assert group.n == 2 and group.chained == chained


class Thresholded(brainstate.nn.Module):
    """A trainable threshold used outside any ETP op."""

    def __init__(self):
        super().__init__()
        self.K = brainstate.ParamState(jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, 3))))
        self.theta = brainstate.ParamState(jnp.full((3, 1), 0.3))
        self.W = brainstate.ParamState(jnp.asarray(np.random.default_rng(1).normal(size=(18, 2))))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 3, 6)))

    def update(self, x):
        h = 0.5 * self.h.value + bc.conv(x, self.K.value, strides=1, padding='SAME') - self.theta.value
        self.h.value = h
        return bc.dense(jnp.tanh(h).reshape(h.shape[0], -1), self.W.value)


def test_parameter_broadcast_into_the_dynamics_gets_an_exact_trace_and_is_reported():
    model = Thresholded()
    rng = np.random.default_rng(10)
    xs = jnp.asarray(rng.normal(size=(5, 2, 2, 6)))
    targets = jnp.asarray(rng.normal(size=(5, 2, 2)))
    learner = bc.D_RTRL(model)
    _, grads = learner.value_and_grad(sq_loss, xs, targets)
    _, ref = bc.BPTT(model).value_and_grad(sq_loss, xs, targets)
    assert rel_err(grads['K',], ref['K',]) < EXACT
    assert rel_err(grads['theta',], ref['theta',]) < EXACT   # (3, 1), broadcast over positions
    rows = {r['parameter']: r['method'] for r in learner.report().rows}
    assert rows['theta'].startswith('exact trace (elementwise')


def test_user_registered_primitive_with_the_same_rules_is_used_unchanged():
    my_conv = register_primitive('user_conv', etp_conv_p.impl_fn,
                                 trainable_invars_fn=etp_conv_p.trainable_invars,
                                 x_invar_index=0)
    my_conv.register_etp_rules(**etp_conv_p.etp_rules)

    class UserModel(ConvTanh):
        def update(self, x):
            _, eqn_params = _conv_params(x, self.K.value, self.b.value, self.kw)
            y = my_conv.bind(x, self.K.value, self.b.value, **eqn_params)
            h = 0.7 * jnp.tanh(self.h.value) + y
            self.h.value = h
            return bc.dense(jnp.tanh(h.mean(axis=2)), self.W.value)

    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = UserModel(x_shape, k_shape, kw, ch)
    xs, targets = conv_data(x_shape)
    learner = bc.D_RTRL(model)
    assert_matches_bptt(model, learner, xs, targets, sq_loss)
    assert learner.analysis().ops[0].primitive is my_conv


def _conv_params(x, K, b, kw):
    eqn = jax.make_jaxpr(lambda x, K, b: bc.conv(x, K, b, **kw))(x, K, b).jaxpr.eqns[-1]
    return eqn.primitive, eqn.params
