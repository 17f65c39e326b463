"""Model discovery (``graph.py``): the vertex cut, ``analyse`` and its refusals.

Small hand-written steps whose ops, groups and cuts are known in closed form
(float64), so a failure names the piece that broke rather than a gradient that no
longer matches BPTT end to end; and the models the analysis refuses, each refusal
naming what it found.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import braintrace_conv as bc
from braintrace_conv.executors._analysis.graph import min_vertex_cut
from snn_reference import spike, xent
from user_models import (CONV_CASES, B, Chained, ConvTanh, K, OneLayer, ResetNeuron, analysed,
                         conv_data, spikes_and_labels, sq_loss)

pytestmark = pytest.mark.usefixtures('float64')


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
def test_analyse_finds_ops_group_cut_and_parameters_inside_the_dynamics():
    graph, *_ = analysed(ResetNeuron())
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
    graph, *_ = analysed(Chained())
    grp, = graph.groups
    assert grp.names == ['h1', 'h2'] and grp.m == 2
    assert grp.identity_release and grp.chained


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
    xs, targets = conv_data(x_shape)
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
    xs, targets = conv_data(x_shape)
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
    xs, targets = conv_data(x_shape)
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
