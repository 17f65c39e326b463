"""Executors on models written the way users write them (float64, against BPTT).

Reset-after-spike neurons (state stored after the reset, output the spike of
the pre-reset potential), outputs that read the old state, ``brainstate.nn``
layers (plain ``lax`` convolutions and matrix products), parameters inside the
neuron dynamics (bias after the op, per-channel time constant, threshold,
reset value); whole models compared across both online executors (a multilayer
net's cosine to BPTT, the library's own models).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from jax import lax

import braintrace_conv as bc
from braintrace_conv import nn
from snn_reference import EXACT, cosine, rel_err, spike, spike_vjp, xent


pytestmark = pytest.mark.usefixtures('float64')


def spikes_and_labels(shape, T=10, seed=0, p=0.4):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.random((T, *shape)) < p, jnp.float64),
            jnp.asarray(rng.integers(0, 3, (T, shape[0]))))


def compare(model, learner, xs, targets, loss_fn=xent):
    """Gradients of ``learner`` and BPTT, keyed by parameter name."""
    _, ref = bc.BPTT(model).value_and_grad(loss_fn, xs, targets)
    _, grads = learner.value_and_grad(loss_fn, xs, targets)
    errors = {}
    for key in ref:     # one entry per leaf, named like report() rows
        leaves = jax.tree_util.tree_flatten_with_path(ref[key])[0]
        mine = jax.tree.leaves(grads[key])
        for (path, r), g in zip(leaves, mine):
            name = '.'.join(map(str, key)) + (jax.tree_util.keystr(path) if path else '')
            assert np.abs(np.asarray(r)).max() > 0, f'{name}: vacuous reference'
            errors[name] = rel_err(g, r)
    return errors


def methods(learner):
    return {r['parameter']: r['method'] for r in learner.report().rows}


# ----------------------------------------------------------------------------- neuron styles
class OneLayer(brainstate.nn.Module):
    """conv (+bias) -> a neuron written in one of several user styles -> dense readout."""

    def __init__(self, style, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.style = style
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8))
        self.b = brainstate.ParamState(jnp.full(4, 0.1))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(6 * 6 * 4, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4)))
        if self.style == 'alif-reset':
            self.a = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4)))

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        h_old = self.h.value
        if self.style == 'subtract':          # snnTorch / brainpy default
            v = 0.9 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v - s
            out = s
        elif self.style == 'subtract-vjp':    # the spike's derivative given as a custom_vjp
            v = 0.9 * h_old + y
            s = spike_vjp(v - 1.0)
            self.h.value = v - s
            out = s
        elif self.style == 'zero':            # reset to zero
            v = 0.8 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v * (1.0 - s)
            out = s
        elif self.style == 'old-and-new':     # output reads the old state too
            v = 0.9 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v - s
            out = s + 0.3 * jnp.tanh(h_old)
        elif self.style == 'old-only':        # output from the old state alone
            self.h.value = 0.9 * h_old + y
            out = jax.nn.sigmoid(h_old)
        elif self.style == 'alif-reset':      # two states, both stored after the reset
            a_old = self.a.value
            v = 0.9 * h_old + y - 0.5 * a_old
            s = spike(v - 1.0)
            self.h.value = v - s
            self.a.value = 0.8 * a_old + s
            out = s
        else:
            raise ValueError(self.style)
        return bc.dense(out.reshape(out.shape[0], -1), self.W.value)


STYLES = ['subtract', 'subtract-vjp', 'zero', 'old-and-new', 'old-only', 'alif-reset']


@pytest.mark.parametrize('style', STYLES)
def test_drtrl_is_exact_for_every_neuron_style(style):
    model = OneLayer(style)
    xs, labels = spikes_and_labels((3, 6, 6, 2))
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert max(errors.values()) < EXACT, errors
    rows = methods(learner)
    assert rows['K'].startswith('exact trace (D-RTRL)') and rows['b'].startswith('exact trace')


@pytest.mark.parametrize('style', STYLES)
def test_es_drtrl_bias_and_readout_are_exact_for_every_neuron_style(style):
    model = OneLayer(style)
    xs, labels = spikes_and_labels((3, 6, 6, 2))
    learner = bc.ES_D_RTRL(model, decay=0.9)
    errors = compare(model, learner, xs, labels)
    assert errors['b'] < EXACT and errors['W'] < EXACT, errors
    rows = methods(learner)
    assert rows['b'].startswith('exact trace') and rows['K'].startswith('approximate trace')


def _convolutions(learner, xs, labels):
    """Convolutions in the optimised HLO of the whole-sequence computation."""
    text = learner.lower(xent, xs, labels).compile().as_text()
    return text.count(' convolution(')


def test_reset_after_spike_costs_no_extra_weight_gradient_convolution():
    """ES-D-RTRL compiles to as many convolutions as BPTT, whatever the neuron style."""
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=4)
    counts = {}
    for style in ('subtract', 'old-and-new'):
        model = OneLayer(style)
        counts[style] = {name: _convolutions(make(model), xs, labels) for name, make in
                         [('bptt', bc.BPTT), ('es', lambda m: bc.ES_D_RTRL(m, decay=0.9))]}
    for style, c in counts.items():
        assert c['es'] <= c['bptt'], counts


# ----------------------------------------------------------------------------- brainstate layers
class BrainstateLayers(brainstate.nn.Module):
    """brainstate.nn.ConvNd -> reset-after-spike LIF -> brainstate.nn.Linear readout."""

    def __init__(self, rank, hidden_linear=False, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.rank, self.hidden_linear = rank, hidden_linear
        size = (5,) * rank
        conv = {1: brainstate.nn.Conv1d, 2: brainstate.nn.Conv2d, 3: brainstate.nn.Conv3d}[rank]
        self.conv = conv((*size, 2), 3, 3, padding='SAME',
                         w_init=jnp.asarray(rng.normal(size=(3,) * rank + (2, 3)) * 0.7),
                         b_init=jnp.asarray(rng.normal(size=3) * 0.2))
        self.shape = (*size, 3)
        n = int(np.prod(self.shape))
        if hidden_linear:      # a dense hidden layer with its bias inside the dynamics
            self.fc = brainstate.nn.Linear(n, 7, w_init=jnp.asarray(rng.normal(size=(n, 7))),
                                           b_init=jnp.asarray(rng.normal(size=7) * 0.2))
            n = 7
        self.readout = brainstate.nn.Linear(n, 3, w_init=jnp.asarray(rng.normal(size=(n, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape)))
        if self.hidden_linear:
            self.h2 = brainstate.HiddenState(jnp.zeros((batch_size, 7)))

    def update(self, x):
        v = 0.9 * self.h.value + self.conv(x)
        s = spike(v - 1.0)
        self.h.value = v - s
        s = s.reshape(s.shape[0], -1)
        if self.hidden_linear:
            v2 = 0.8 * self.h2.value + self.fc(s)
            s = spike(v2 - 0.5)
            self.h2.value = v2 - 0.5 * s
        return self.readout(s)


@pytest.mark.parametrize('rank', [1, 2, 3])
def test_brainstate_conv_layers_train_exactly_like_ours(rank):
    model = BrainstateLayers(rank)
    xs, labels = spikes_and_labels((3,) + (5,) * rank + (2,), T=6)
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert max(errors.values()) < EXACT, errors
    rows = methods(learner)
    assert rows["conv.weight['weight']"].startswith('exact trace (D-RTRL) via etp_conv')
    assert rows["conv.weight['bias']"].startswith('exact trace (elementwise')   # added after the op
    assert rows["readout.weight['weight']"].startswith('exact (instantaneous')
    assert rows["readout.weight['bias']"].startswith('exact (instantaneous')


def test_brainstate_linear_hidden_layer_is_exact_within_its_layer():
    model = BrainstateLayers(1, hidden_linear=True)
    xs, labels = spikes_and_labels((3, 5, 2), T=8, p=0.7)
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert errors["fc.weight['weight']"] < EXACT and errors["fc.weight['bias']"] < EXACT, errors
    rows = methods(learner)
    assert rows["fc.weight['weight']"].startswith('exact trace (D-RTRL) via etp_dense')
    assert 'truncated across layers' in rows["conv.weight['weight']"]


@pytest.mark.parametrize('form', ['x@W', 'x@W.T', 'lax.conv'])
def test_plain_jax_ops_are_lifted(form):
    rng = np.random.default_rng(4)

    class Plain(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            shape = (2, 1, 3) if form == 'lax.conv' else ((6, 4) if form == 'x@W' else (4, 6))
            self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=shape) * 0.5))
            self.R = brainstate.ParamState(jnp.asarray(rng.normal(size=(4 if form != 'lax.conv' else 12, 3))))

        def init_state(self, batch_size=None, **kw):
            self.h = brainstate.HiddenState(jnp.zeros((batch_size, 4) if form != 'lax.conv'
                                                      else (batch_size, 2, 6)))

        def update(self, x):
            if form == 'x@W':
                y = x @ self.W.value
            elif form == 'x@W.T':
                y = x @ self.W.value.T
            else:
                y = lax.conv_general_dilated(x, self.W.value, (1,), 'SAME')
            v = 0.7 * self.h.value + y
            s = spike(v - 0.5)
            self.h.value = v - s
            return s.reshape(s.shape[0], -1) @ self.R.value

    model = Plain()
    xs, labels = spikes_and_labels((3, 1, 6) if form == 'lax.conv' else (3, 6), T=6)
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert max(errors.values()) < EXACT, errors
    assert methods(learner)['W'].startswith('exact trace (D-RTRL) via etp_')


# ----------------------------------------------------------------------------- dynamics parameters
class Parametric(brainstate.nn.Module):
    """Bias after the op, per-channel trainable tau, threshold and reset value."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 4)) * 0.8))
        self.bias = brainstate.ParamState(jnp.asarray(rng.normal(size=4) * 0.2))
        self.tau = brainstate.ParamState(jnp.asarray(rng.uniform(3.0, 8.0, size=4)))
        self.theta = brainstate.ParamState(jnp.full((1, 4), 0.8))
        self.v_reset = brainstate.ParamState(jnp.asarray(0.1))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(7 * 4, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 7, 4)))

    def update(self, x):
        y = bc.conv(x, self.K.value, strides=1, padding='SAME',
                    dimension_numbers=('NWC', 'WIO', 'NWC')) + self.bias.value
        v = jnp.exp(-1.0 / self.tau.value) * self.h.value + y
        s = spike(v - self.theta.value)
        self.h.value = v - s * (self.theta.value - self.v_reset.value)
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


@pytest.mark.parametrize('make', [bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, decay=0.8)],
                         ids=['d-rtrl', 'es-d-rtrl'])
def test_parameters_inside_the_dynamics_get_exact_traces(make):
    model = Parametric()
    xs, labels = spikes_and_labels((3, 7, 2), T=12, p=0.5)
    learner = make(model)
    errors = compare(model, learner, xs, labels)
    for name in ('bias', 'tau', 'theta', 'v_reset', 'W'):
        assert errors[name] < EXACT, errors
    rows = methods(learner)
    for name in ('bias', 'tau', 'theta', 'v_reset'):
        assert rows[name].startswith('exact trace (elementwise'), rows[name]
    if learner.algorithm == 'D-RTRL':
        assert errors['K'] < EXACT


class MixedParameter(Parametric):
    """A parameter that mixes positions before reaching the state stays instantaneous."""

    def update(self, x):
        y = bc.conv(x, self.K.value, strides=1, padding='SAME',
                    dimension_numbers=('NWC', 'WIO', 'NWC'))
        v = 0.8 * self.h.value + y + jnp.sum(self.bias.value)     # mixes the 4 entries
        s = spike(v - 0.8)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


def test_a_parameter_that_mixes_positions_is_labelled_instantaneous():
    model = MixedParameter()
    xs, labels = spikes_and_labels((3, 7, 2), T=8, p=0.5)
    learner = bc.D_RTRL(model)
    learner.value_and_grad(xent, xs, labels)
    assert methods(learner)['bias'].startswith('approximate (instantaneous only')


# ----------------------------------------------------------------------------- pooling
class PoolBetween(OneLayer):
    """conv -> linear pooling -> reset-after-spike LIF: average (brainstate.nn or ours), or a
    padded sum pooling written with lax.reduce_window. With ``bias_before_pool`` the conv is
    a plain lax convolution whose bias is added before the pooling, as brainstate.nn.Conv2d,
    snnTorch and SpikingJelly models do."""

    def __init__(self, pool, seed=0, bias_before_pool=False):
        super().__init__('subtract', seed)
        self.pool, self.bias_before_pool = pool, bias_before_pool
        if pool == 'brainstate-avg':
            self.pool_layer = brainstate.nn.AvgPool2d(2, 2)
        elif pool == 'ours-avg':
            self.pool_layer = nn.AvgPool2d(2, stride=2, layout='channels_last')
        self.out = 3 * 3 * 4 if pool != 'sum-same' else 6 * 6 * 4
        rng = np.random.default_rng(seed + 1)
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(self.out, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        side = 6 if self.pool == 'sum-same' else 3
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, side, side, 4)))

    def update(self, x):
        if self.bias_before_pool:
            y = lax.conv_general_dilated(x, self.K.value, (1, 1), 'SAME',
                                         dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + self.b.value
        else:
            y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        if self.pool == 'sum-same':
            y = 0.5 * lax.reduce_window(y, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), 'SAME')
        else:
            y = self.pool_layer(y)
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


@pytest.mark.parametrize('bias_before_pool', [False, True])
@pytest.mark.parametrize('pool', ['brainstate-avg', 'ours-avg', 'sum-same'])
def test_linear_pooling_between_op_and_neuron_is_exact_in_drtrl(pool, bias_before_pool):
    model = PoolBetween(pool, bias_before_pool=bias_before_pool)
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=8, p=0.6)
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert max(errors.values()) < EXACT, errors
    assert methods(learner)['K'].startswith('exact trace (D-RTRL)')
    assert methods(learner)['b'].startswith('exact trace')


class GroupedPoolChannelsFirst(brainstate.nn.Module):
    """Channels-first grouped conv (2 groups, 2 channels each) -> average pooling ->
    reset-after-spike LIF: the trace layout whose positions are minor, with pooled patches
    repeated over the channels of each group."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(4, 1, 3, 3)) * 0.8))
        self.b = brainstate.ParamState(jnp.full(4, 0.1))
        self.pool = nn.AvgPool2d(2, stride=2, layout='channels_first')
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(4 * 3 * 3, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 4, 3, 3)))

    def update(self, x):
        y = self.pool(bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                              feature_group_count=2, dimension_numbers=('NCHW', 'OIHW', 'NCHW')))
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


def test_linear_pooling_after_a_grouped_channels_first_conv_is_exact_in_drtrl():
    model = GroupedPoolChannelsFirst()
    xs, labels = spikes_and_labels((3, 2, 6, 6), T=8, p=0.6)
    learner = bc.D_RTRL(model)
    errors = compare(model, learner, xs, labels)
    assert max(errors.values()) < EXACT, errors
    assert methods(learner)['K'].startswith('exact trace (D-RTRL)')


@pytest.mark.parametrize('bias_before_pool', [False, True])
@pytest.mark.parametrize('pool', ['brainstate-avg', 'sum-same'])
def test_linear_pooling_between_op_and_neuron_in_es_drtrl(pool, bias_before_pool):
    model = PoolBetween(pool, bias_before_pool=bias_before_pool)
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=8, p=0.6)
    learner = bc.ES_D_RTRL(model, decay=0.9)
    errors = compare(model, learner, xs, labels)
    assert errors['b'] < EXACT and errors['W'] < EXACT, errors
    assert errors['K'] < 0.5, errors       # an approximation, but the right one
    assert methods(learner)['K'].startswith('approximate trace (ES-D-RTRL, decay 0.9')


# ----------------------------------------------------------------------------- units
class UnitNet(brainstate.nn.Module):
    """Unit-carrying conv weights (mV) driving a LIF with tau and threshold in physical units."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first',
                              w_init=nn.FanInNormal(4.0, unit=u.mV))
        self.lif = nn.LIF((3, 6, 6), tau=5 * u.ms, V_th=1 * u.mV)
        self.flat, self.readout = nn.Flatten(), nn.Linear(108, 3)

    def update(self, x):
        return self.readout(self.flat(self.lif(self.conv(x))))


@pytest.mark.parametrize('make', [bc.D_RTRL, bc.ES_D_RTRL, bc.BPTT])
def test_gradients_of_quantity_parameters_carry_the_inverse_unit(make):
    brainstate.random.seed(0)
    model = UnitNet()
    xs, labels = spikes_and_labels((2, 2, 6, 6), T=6)
    loss = lambda out, label: xent(u.get_mantissa(out), label)
    _, ref = bc.BPTT(model).value_and_grad(loss, xs, labels)
    _, grads = make(model).value_and_grad(loss, xs, labels)
    is_q = lambda v: isinstance(v, u.Quantity)
    for name in ('weight', 'bias'):
        g = grads['conv', name]
        assert is_q(g) and g.unit == u.mV ** -1, g
        if make is not bc.ES_D_RTRL or name == 'bias':
            assert rel_err(g.mantissa, ref['conv', name].mantissa) < EXACT


# ----------------------------------------------------------------------------- dtypes
class TypedLayer(brainstate.nn.Module):
    """conv + reset-after-spike LIF + dense readout with parameters and state of one dtype."""

    def __init__(self, dtype, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8, dtype))
        self.b = brainstate.ParamState(jnp.full(4, 0.1, dtype))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(6 * 6 * 4, 3)) * 0.3, dtype))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4), self.dtype))

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


def flat(grads):
    return np.concatenate([np.ravel(np.asarray(g, np.float64)) for g in jax.tree.leaves(grads)])


@pytest.mark.parametrize('make', [lambda m: bc.D_RTRL(m, trace_dtype=jnp.float32),
                                  lambda m: bc.ES_D_RTRL(m, decay=0.9, trace_dtype=jnp.float32)],
                         ids=['d-rtrl', 'es-d-rtrl'])
def test_bfloat16_model_with_float32_traces(make):
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=10)
    reference = make(TypedLayer(jnp.float32))
    _, ref = reference.value_and_grad(xent, xs.astype(jnp.float32), labels)
    learner = make(TypedLayer(jnp.bfloat16))
    _, grads = learner.value_and_grad(xent, xs, labels)       # float64 data, cast to bfloat16
    assert all(g.dtype == jnp.bfloat16 for g in jax.tree.leaves(grads))
    state = jax.eval_shape(lambda: learner._init_state(learner._last[1], None))
    traces = jax.tree.leaves((state['ops'], state['dyn']))
    assert {t.dtype for t in traces} == {np.dtype(np.float32)}
    a, b = flat(grads), flat(ref)
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    print(f'bfloat16 compute, float32 traces: cosine to float32 {cos:.4f}')
    assert cos > 0.98


def test_float64_inputs_drive_a_float32_model_like_float32_inputs():
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=6)
    model = TypedLayer(jnp.float32)
    for make in (bc.BPTT, bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, decay=0.9)):
        _, g64 = make(model).value_and_grad(xent, xs, labels)
        _, g32 = make(model).value_and_grad(xent, xs.astype(jnp.float32), labels)
        np.testing.assert_array_equal(flat(g64), flat(g32))


# ----------------------------------------------------------------------------- multi-layer
class SpikingConvNet(brainstate.nn.Module):
    """conv+LIF, (recurrent) conv+LIF with stride 2, dense readout: the standard shape."""

    def __init__(self, recurrent, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.recurrent = recurrent
        self.K1 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8))
        self.b1 = brainstate.ParamState(jnp.full(4, 0.1))
        self.K2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 4, 6)) * 0.6))
        self.b2 = brainstate.ParamState(jnp.full(6, 0.1))
        if recurrent:
            self.R2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 6, 6)) * 0.3))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(4 * 4 * 6, 3)) * 0.2))

    def init_state(self, batch_size=None, **kw):
        self.v1 = brainstate.HiddenState(jnp.zeros((batch_size, 8, 8, 4)))
        self.v2 = brainstate.HiddenState(jnp.zeros((batch_size, 4, 4, 6)))

    @staticmethod
    def lif(v_old, current):
        v = v_old - spike(v_old - 1.0)            # reset by subtraction of the last spike
        return 0.9 * v + current

    def update(self, x):
        dn = ('NHWC', 'HWIO', 'NHWC')
        v1 = self.lif(self.v1.value, bc.conv(x, self.K1.value, self.b1.value, strides=1,
                                             padding='SAME', dimension_numbers=dn))
        s1 = spike(v1 - 1.0)
        i2 = bc.conv(s1, self.K2.value, self.b2.value, strides=2, padding='SAME',
                     dimension_numbers=dn)
        if self.recurrent:
            i2 = i2 + bc.conv(spike(self.v2.value - 1.0), self.R2.value, strides=1,
                              padding='SAME', dimension_numbers=dn)
        v2 = self.lif(self.v2.value, i2)
        self.v1.value, self.v2.value = v1, v2
        return bc.dense(spike(v2 - 1.0).reshape(v2.shape[0], -1), self.W.value)


# Cosine floors. Measured over 8 seeds of model and data (T=20, batch 4): minimum /
# mean cosine to BPTT was 0.921 / 0.977 (D-RTRL) and 0.918 / 0.976 (ES-D-RTRL) for
# the feed-forward net, 0.710 / 0.932 and 0.692 / 0.929 for the recurrent one; the
# floors sit below those minima, so they hold for any seed, not just the one tested.
# Exactness is not expected: the second layer's trace for the first layer's
# parameters omits their effect through the first layer's past, recurrence is cut
# from D, and ES-D-RTRL factorises the kernel trace.
COSINE_FLOOR = {('d-rtrl', False): 0.90, ('es-d-rtrl', False): 0.90,
                ('d-rtrl', True): 0.65, ('es-d-rtrl', True): 0.65}


@pytest.mark.parametrize('recurrent', [False, True], ids=['feedforward', 'recurrent'])
@pytest.mark.parametrize('name', ['d-rtrl', 'es-d-rtrl'])
def test_multilayer_cosine_to_bptt(name, recurrent, capsys):
    model = SpikingConvNet(recurrent)
    rng = np.random.default_rng(9)
    xs = jnp.asarray(rng.random((20, 4, 8, 8, 2)) < 0.3, jnp.float64)
    labels = jnp.asarray(rng.integers(0, 3, (20, 4)))
    _, ref = bc.BPTT(model).value_and_grad(xent, xs, labels)
    learner = bc.D_RTRL(model) if name == 'd-rtrl' else bc.ES_D_RTRL(model, decay=0.9)
    _, grads = learner.value_and_grad(xent, xs, labels)
    sim = cosine(grads, ref)
    per_param = {'.'.join(k): round(cosine(grads[k], ref[k]), 4) for k in ref}
    with capsys.disabled():
        print(f'\n[{name}, recurrent={recurrent}] cosine to BPTT {sim:.4f}  {per_param}')
    for key in ref:   # no silent zeros
        assert np.abs(grads[key]).max() > 0, key
    assert rel_err(grads['W',], ref['W',]) < EXACT          # the readout is exact
    if not recurrent:
        # the last hidden layer's bias trace is exact for both; its kernel trace for D-RTRL
        assert rel_err(grads['b2',], ref['b2',]) < EXACT
        if name == 'd-rtrl':
            assert rel_err(grads['K2',], ref['K2',]) < EXACT
    assert sim > COSINE_FLOOR[name, recurrent]


# ----------------------------------------------------------------------------- library models
class AlifNet(brainstate.nn.Module):
    """Channels-first conv + ALIF (two state variables) twice, dense readout."""

    def __init__(self):
        super().__init__()
        from braintrace_conv import nn
        self.c1, self.n1 = nn.Conv2d(2, 4, 3, layout='channels_first'), nn.ALIF((4, 8, 8), tau=5.0)
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, layout='channels_first')
        self.n2 = nn.ALIF((6, 4, 4), tau=5.0)
        self.flat, self.readout = nn.Flatten(), nn.Linear(96, 3)

    def update(self, x):
        return self.readout(self.flat(self.n2(self.c2(self.n1(self.c1(x))))))


@pytest.mark.parametrize('make', ['recurrent_conv_snn', 'alif'])
def test_online_executors_on_the_library_models(make):
    """The library's own recurrent conv net and a two-state neuron, channels first: the
    recurrent synapse adds no state to the cut, and the last layer is exact."""
    from braintrace_conv.models import recurrent_conv_snn
    brainstate.random.seed(1)
    model = recurrent_conv_snn((2, 8, 8), 3, channels=(4, 6), readout='linear') \
        if make == 'recurrent_conv_snn' else AlifNet()
    rng = np.random.default_rng(5)
    xs = jnp.asarray(rng.random((8, 4, 2, 8, 8)) < 0.5, jnp.float64)
    labels = jnp.asarray(rng.integers(0, 3, (8, 4)))
    _, ref = bc.BPTT(model).value_and_grad(xent, xs, labels)
    learner = bc.D_RTRL(model)
    _, grads = learner.value_and_grad(xent, xs, labels)
    graph = learner._last[1]
    assert [grp.m for grp in graph.groups] == [grp.n for grp in graph.groups]
    for key in ref:
        assert np.all(np.isfinite(grads[key])) and np.abs(grads[key]).max() > 0, key
    readout = [k for k in ref if k[0] in ('readout', 'fc')]
    assert readout and all(rel_err(grads[k], ref[k]) < EXACT for k in readout)
    if make == 'alif':     # the last hidden layer's own parameters
        for k in [k for k in ref if k[0] == 'c2']:
            assert rel_err(grads[k], ref[k]) < EXACT, k
