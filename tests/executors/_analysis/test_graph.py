"""The step analysis piece by piece: positions, the vertex cut, analyse and each signal.

Small hand-written steps whose positions, cuts and derivatives are known in closed
form (float64), so a failure names the piece that broke rather than a gradient that
no longer matches BPTT end to end; and the models the analysis refuses, each refusal
naming what it found.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import braintrace_conv as bc
from snn_reference import spike, xent
from executors.test_d_rtrl import CONV_CASES, ConvTanh, _conv_data, sq_loss
from executors.test_user_models import OneLayer, spikes_and_labels
from braintrace_conv.executors._analysis.graph import analyse, min_vertex_cut
from braintrace_conv.executors._analysis.positions import MIXED, propagate
from braintrace_conv.executors._analysis.signals import (
    chained_learning_signal, dynamic_trace_inputs, init_release, learning_signals,
    output_jacobian, parameter_jacobians, release_jacobians, state_jacobian, step_point,
    transition)
from braintrace_conv.executors._analysis.step import capture_step

pytestmark = pytest.mark.usefixtures('float64')

B, K, IN = 2, 3, 4


# ----------------------------------------------------------------------------- positions
def _reach(fn, *args, **kw):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    source = jaxpr.invars[0]
    ident = np.arange(source.aval.size).reshape(source.aval.shape)
    return jaxpr, ident, propagate(jaxpr, {source: ident}, {}, **kw)


def test_positions_follow_elementwise_ops_reshapes_and_transposes():
    x = jnp.ones((2, 3))
    jaxpr, ident, reach = _reach(lambda x: (jnp.tanh(2.0 * x) + 1.0).T.reshape(6), x)
    assert reach.mixing is None
    np.testing.assert_array_equal(reach.index[jaxpr.outvars[0]], ident.T.reshape(6))


def test_a_reduction_mixes_positions_and_is_named():
    jaxpr, _, reach = _reach(lambda x: jnp.sum(x, axis=1) * 2.0, jnp.ones((2, 3)))
    assert reach.mixing == 'reduce_sum'
    assert reach.index[jaxpr.outvars[0]] is MIXED
    assert jaxpr.invars[0] in reach.sinks      # the value the mixing op read


def test_a_broadcast_copies_a_position_only_when_allowed():
    fn = lambda b, x: x + b          # a per-channel bias over (batch, channel)
    b, x = jnp.ones(3), jnp.ones((2, 3))
    jaxpr, _, reach = _reach(fn, b, x, broadcast=True)
    np.testing.assert_array_equal(reach.index[jaxpr.outvars[0]], [[0, 1, 2], [0, 1, 2]])
    _, _, strict = _reach(fn, b, x)
    assert strict.mixing is not None


def test_new_hidden_values_are_recorded_as_finals():
    jaxpr = jax.make_jaxpr(lambda h: (0.5 * h, jnp.flip(h)))(jnp.ones(4)).jaxpr
    ident = np.arange(4)
    final_of = {jaxpr.outvars[0]: 0, jaxpr.outvars[1]: 1}
    reach = propagate(jaxpr, {jaxpr.invars[0]: ident}, final_of)
    np.testing.assert_array_equal(reach.finals[0], ident)
    assert reach.mixing == 'rev'               # flip reorders positions: not followed


# ----------------------------------------------------------------------------- vertex cut
@pytest.mark.parametrize('edges, sources, sinks, cut', [
    ([('a', 'b'), ('b', 'c')], ['a'], ['c'], ['c']),                         # nearest the sink
    ([('s', 'a'), ('s', 'b'), ('a', 't'), ('b', 't')], ['s'], ['t'], ['t']),
    ([('h', 'v'), ('y', 'v'), ('v', 's'), ('v', 'n'), ('s', 'n'), ('s', 'o')],
     ['h', 'y'], ['n', 'o'], ['v']),                                       # reset after spike
    ([('a', 'c'), ('b', 'd')], ['a', 'b'], ['c', 'd'], ['c', 'd']),           # two paths
])
def test_min_vertex_cut(edges, sources, sinks, cut):
    nodes = sorted({v for e in edges for v in e})
    assert sorted(min_vertex_cut(nodes, edges, sources, sinks)) == cut


def test_the_cut_meets_every_path():
    rng = np.random.default_rng(0)
    nodes = list(range(12))
    edges = [(a, b) for a in nodes for b in nodes if a < b and rng.random() < 0.3]
    cut = set(min_vertex_cut(nodes, edges, [0, 1], [10, 11]))
    reached, stack = set(), [n for n in (0, 1) if n not in cut]
    while stack:                                   # walk around the cut
        a = stack.pop()
        reached.add(a)
        stack += [b for x, b in edges if x == a and b not in cut and b not in reached]
    assert not reached & {10, 11}


# ----------------------------------------------------------------------------- analyse
class ResetNeuron(brainstate.nn.Module):
    """``y = x W``; ``v = a h + c * y``; ``s = tanh(v)``; ``h' = v - beta * s``; output ``s``
    through a dense readout. ``c`` (per channel) and ``beta`` are inside the dynamics."""

    def __init__(self, a=0.8, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.a = a
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(IN, K))))
        self.c = brainstate.ParamState(jnp.asarray(rng.uniform(0.5, 1.5, size=K)))
        self.beta = brainstate.ParamState(jnp.asarray(0.4))
        self.R = brainstate.ParamState(jnp.asarray(rng.normal(size=(K, 2))))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.asarray(np.random.default_rng(1).normal(
            size=(batch_size, K))))

    def update(self, x):
        v = self.a * self.h.value + self.c.value * bc.dense(x, self.W.value)
        s = jnp.tanh(v)
        self.h.value = v - self.beta.value * s
        return bc.dense(s, self.R.value)


class Chained(brainstate.nn.Module):
    """Two stored states, the second integrating the first's new value: ``v = 0.9 h1 + y``,
    ``u = 0.7 h2 + v``; both are the new states and the output reads both."""

    def __init__(self, seed=0):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(np.random.default_rng(seed).normal(
            size=(IN, K))))

    def init_state(self, batch_size=None, **kw):
        rng = np.random.default_rng(2)
        self.h1 = brainstate.HiddenState(jnp.asarray(rng.normal(size=(batch_size, K))))
        self.h2 = brainstate.HiddenState(jnp.asarray(rng.normal(size=(batch_size, K))))

    def update(self, x):
        v = 0.9 * self.h1.value + bc.dense(x, self.W.value)
        u = 0.7 * self.h2.value + v
        self.h1.value, self.h2.value = v, u
        return jnp.tanh(v) + jnp.sin(u)


def _analysed(model):
    brainstate.nn.init_all_states(model, B)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(B, IN)))
    graph = analyse(capture_step(model, jax.ShapeDtypeStruct(x.shape, x.dtype)))
    step = graph.step
    params = step.param_leaves()
    return graph, step.hidden_leaves(), params, graph.weights(params), [x]


def test_analyse_finds_ops_group_cut_and_parameters_inside_the_dynamics():
    graph, *_ = _analysed(ResetNeuron())
    names = graph.step.param_names
    first, readout = graph.ops
    assert first.group == 0 and first.h_to_y is None and first.slot_params == {
        'weight': [names.index('W')]}
    assert readout.group is None and readout.exact_readout
    grp, = graph.groups
    assert grp.names == ['h'] and grp.n == 1 and grp.m == 1
    assert not grp.identity_release and not grp.chained and grp.feeds == frozenset()
    v, = grp.cut   # the pre-reset potential: computed from a h and c y, read by tanh and h'
    assert v.aval.shape == (B, K) and v not in graph.step.new_hidden_vars
    assert {names[dp.leaf] for dp in graph.dynamic_params} == {'c', 'beta'}
    c = next(dp for dp in graph.dynamic_params if names[dp.leaf] == 'c')
    np.testing.assert_array_equal(c.index, np.broadcast_to(np.arange(K), (B, K)))
    assert graph.direct_params == {names.index('c'): 'hidden', names.index('beta'): 'hidden'}


def test_analyse_marks_cut_values_computed_from_one_another_as_chained():
    graph, *_ = _analysed(Chained())
    grp, = graph.groups
    assert grp.names == ['h1', 'h2'] and grp.m == 2
    assert grp.identity_release and grp.chained


class DelayLine(brainstate.nn.Module):
    """``v = 0.9 h + W x + 0.1 d2 + 0.1 e``; ``h = v`` and ``e = v`` (two states share a new
    value); ``d2 = d1``; ``d1 = W x`` (the op's output itself); readout from ``v``."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(jnp.ones((IN, K)))

    def init_state(self, batch_size=None, **kw):
        for name in ('h', 'd1', 'd2', 'e'):
            setattr(self, name, brainstate.HiddenState(jnp.zeros((batch_size, K))))

    def update(self, x):
        y = bc.dense(x, self.W.value)
        v = 0.9 * self.h.value + y + 0.1 * self.d2.value + 0.1 * self.e.value
        self.h.value = v
        self.e.value = v
        self.d2.value = self.d1.value
        self.d1.value = y
        return jnp.tanh(v)


def test_states_that_pass_values_along_are_in_their_group():
    """A state whose new value is another state's old value, an op's output, or another
    state's new value still has a new value of its own, in the group it feeds."""
    graph, *_ = _analysed(DelayLine())
    new = graph.step.new_hidden_vars
    assert len(set(new)) == len(new)          # each state's new value is its own variable
    grp, = graph.groups
    assert sorted(grp.names) == ['d1', 'd2', 'e', 'h']
    assert graph.ops[0].group == 0


class Pipeline(brainstate.nn.Module):
    """Layer 2 reads layer 1's value of the step before (``buf``) and layer 2's own old
    value through a recurrent op; the output reads ``buf`` too."""

    def __init__(self):
        super().__init__()
        self.W1 = brainstate.ParamState(jnp.ones((IN, K)))
        self.W2 = brainstate.ParamState(jnp.ones((K, K)))
        self.R = brainstate.ParamState(jnp.ones((K, K)))

    def init_state(self, batch_size=None, **kw):
        for name in ('h1', 'buf', 'h2'):
            setattr(self, name, brainstate.HiddenState(jnp.zeros((batch_size, K))))

    def update(self, x):
        v1 = 0.9 * self.h1.value + bc.dense(x, self.W1.value)
        h2_old = self.h2.value
        v2 = 0.8 * h2_old + bc.dense(self.buf.value, self.W2.value) + bc.dense(h2_old, self.R.value)
        self.h1.value, self.buf.value, self.h2.value = v1, jnp.tanh(v1), v2
        return jnp.tanh(v2) + h2_old


def test_an_old_value_read_by_another_layer_is_cut_and_a_recurrent_one_is_given():
    graph, *_ = _analysed(Pipeline())
    step = graph.step
    first = next(g for g in graph.groups if 'h1' in g.names)
    second = next(g for g in graph.groups if g.names == ['h2'])
    buf_old = step.hidden_vars[step.hidden_names.index('buf')]
    # layer 2's op reads buf's old value: it stays in layer 1's cut, so its learning signal
    # reaches layer 1's trace of the step before
    assert buf_old in first.cut and first.feeds == {graph.groups.index(second)}
    # h2's old value feeds its own recurrent op (given: the recurrent-synapse cut) and the
    # output (a path of the step): the op reads a copy of its own, the output the cut value
    h2_old = step.hidden_vars[step.hidden_names.index('h2')]
    recurrent = next(op for op in graph.ops if op.slot_params['weight'] == [step.param_names.index('R')])
    assert recurrent.x_var is not h2_old and recurrent.x_var not in second.cut


# ----------------------------------------------------------------------------- signals
def _point(model, outputs=2):
    graph, hidden, params, weights, inputs = _analysed(model)
    target = jnp.asarray(np.random.default_rng(4).normal(size=(B, outputs)))
    loss_fn = lambda out, tgt: jnp.sum(out * tgt)
    eps0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in graph.cut_vars]
    signals = learning_signals(graph, hidden, params, weights, inputs, target, loss_fn, None,
                               eps0)
    record = signals[3]
    at = step_point(graph, hidden, params, weights, inputs, record['op_outputs'], False)
    return graph, at, signals, eps0, target


def _values(model, at):
    """``y``, ``v`` and ``s`` of a ResetNeuron step, by hand."""
    h, = at.hidden
    y = at.inputs[0] @ model.W.value
    v = model.a * h + model.c.value * y
    return y, v, jnp.tanh(v)


def test_learning_signal_and_gamma():
    model = ResetNeuron()
    graph, at, (loss, new_h, out, record, g, gamma, direct), _, target = _point(model)
    y, v, s = _values(model, at)
    cotangent = target @ model.R.value.T                  # dL/ds
    np.testing.assert_allclose(g[0][..., 0], cotangent * (1 - s ** 2), rtol=1e-12)
    np.testing.assert_allclose(gamma[1], target, rtol=1e-12)    # the readout's dL/dy
    np.testing.assert_allclose(new_h[0], v - model.beta.value * s, rtol=1e-12)
    np.testing.assert_allclose(loss, jnp.sum((s @ model.R.value) * target), rtol=1e-12)


def test_state_output_and_parameter_jacobians():
    model = ResetNeuron()
    graph, at, *_ = _point(model)
    y, v, s = _values(model, at)
    A, = state_jacobian(graph, at.hidden, at.params, at.weights, at.inputs, at.op_outputs)
    np.testing.assert_allclose(A, jnp.full((B, K, 1, 1), model.a))           # dv/dh
    Df = output_jacobian(at, [v])
    np.testing.assert_allclose(Df[0][..., 0], jnp.broadcast_to(model.c.value, (B, K)))
    G = parameter_jacobians(at)
    names = graph.step.param_names
    np.testing.assert_allclose(G[names.index('c')][0][..., 0], y, rtol=1e-12)  # dv/dc
    np.testing.assert_allclose(G[names.index('beta')][0], 0.0)


def test_release_transition_and_dynamic_trace_inputs():
    model = ResetNeuron()
    graph, at, *_ = _point(model)
    y, v, s = _values(model, at)
    names = graph.step.param_names
    beta = next(j for j, dp in enumerate(graph.dynamic_params) if names[dp.leaf] == 'beta')
    release = release_jacobians(at, [v], init_release(graph, jnp.float64))
    R_expected = 1 - model.beta.value * (1 - s ** 2)                         # dh'/dv
    np.testing.assert_allclose(release['R'][0][..., 0, 0], R_expected, rtol=1e-12)
    np.testing.assert_allclose(release['Rphi'][beta][..., 0], -s, rtol=1e-12)  # dh'/dbeta
    A = [jnp.full((B, K, 1, 1), model.a)]
    D, = transition(graph, A, release)
    np.testing.assert_allclose(D[..., 0, 0], model.a * R_expected, rtol=1e-12)
    G = parameter_jacobians(at)
    inst, trace_in = dynamic_trace_inputs(graph, A, G, release)
    np.testing.assert_allclose(inst[beta], 0.0)
    np.testing.assert_allclose(trace_in[beta][..., 0], model.a * -s, rtol=1e-12)


def test_chained_learning_signal_holds_the_other_cut_value_fixed():
    model = Chained()
    graph, at, (_, _, _, record, g_eps, *_), eps0, target = _point(model, outputs=K)
    h1, h2 = at.hidden
    v = 0.9 * h1 + at.inputs[0] @ model.W.value
    u = 0.7 * h2 + v
    g, = chained_learning_signal(at, eps0, record['cut'], g_eps)
    # dL/dv with u held fixed, and dL/du
    np.testing.assert_allclose(g[..., 0], target * (1 - jnp.tanh(v) ** 2), rtol=1e-12)
    np.testing.assert_allclose(g[..., 1], target * jnp.cos(u), rtol=1e-12)
    # while a perturbation of v where it is produced also moves u
    np.testing.assert_allclose(g_eps[0][..., 0], g[..., 0] + g[..., 1], rtol=1e-12)


# ----------------------------------------------------------------------------- refusals
class NormBetween(ConvTanh):
    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, **self.kw)
        y = (y - y.mean(axis=1, keepdims=True)) / (y.std(axis=1, keepdims=True) + 1e-5)
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        return bc.dense(jnp.tanh(h.mean(axis=2)), self.W.value)


@pytest.mark.parametrize('make', [bc.D_RTRL, lambda m: bc.ES_D_RTRL(m, 0.9)])
def test_norm_between_conv_and_neuron_is_rejected_naming_op_and_parameter(make):
    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = NormBetween(x_shape, k_shape, kw, ch)
    xs, targets = _conv_data(x_shape)
    with pytest.raises(ValueError, match=r'non-elementwise op \(reduce_sum.*etp_conv #0 \(K, b\)'):
        make(model).value_and_grad(sq_loss, xs, targets)
    bc.BPTT(model).value_and_grad(sq_loss, xs, targets)   # BPTT has no such restriction


class StateDependentKernel(ConvTanh):
    def update(self, x):
        kernel = self.K.value * (1 + jnp.mean(self.h.value))
        y = bc.conv(x, kernel, self.b.value, **self.kw)
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        return bc.dense(jnp.tanh(h.mean(axis=2)), self.W.value)


def test_parameter_reaching_the_loss_by_no_supported_path_is_rejected():
    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = StateDependentKernel(x_shape, k_shape, kw, ch)
    xs, targets = _conv_data(x_shape)
    with pytest.raises(ValueError, match="'weight' operand of etp_conv #0 is computed from "
                                         "parameter 'K', hidden state 'h'"):
        bc.D_RTRL(model).value_and_grad(sq_loss, xs, targets)


class StateScaledLaxKernel(ConvTanh):
    """A plain lax convolution whose kernel a state scales cannot become an ETP op."""

    def update(self, x):
        kernel = self.K.value * (1 + jnp.mean(self.h.value))
        y = jax.lax.conv_general_dilated(x, kernel, (2,), 'SAME')
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        return bc.dense(jnp.tanh(h.mean(axis=2)), self.W.value)


def test_a_plain_convolution_whose_kernel_a_state_scales_is_refused_naming_both():
    x_shape, k_shape, kw, ch = CONV_CASES['1d-default-stride2-same']
    model = StateScaledLaxKernel(x_shape, k_shape, kw, ch)
    xs, targets = _conv_data(x_shape)
    with pytest.raises(ValueError, match="weight operand of conv_general_dilated is computed "
                                         "from parameter 'K', hidden state 'h'"):
        bc.ES_D_RTRL(model, 0.9).value_and_grad(sq_loss, xs, targets)


class MaxPoolBetween(OneLayer):
    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), 'SAME')
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


@pytest.mark.parametrize('make, name', [(bc.D_RTRL, 'D-RTRL'), (bc.ES_D_RTRL, 'ES-D-RTRL')])
def test_max_pooling_between_op_and_neuron_is_rejected_naming_it(make, name):
    model = MaxPoolBetween('subtract')
    xs, labels = spikes_and_labels((3, 6, 6, 2), T=2)
    with pytest.raises(ValueError, match=rf'^{name} cannot train this model: .*reduce_window_max'
                                         rf'.*etp_conv #0 \(K, b\)'):
        make(model).value_and_grad(xent, xs, labels)
