"""Where one group's neurons are read by another group's op (``hops.py``), on small
hand-written steps (float64): which pairs, the value ``b`` where the read leaves the
neurons, ``psi = db/dz`` and ``J^T`` against their closed forms, and the refusals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from braintrace_conv.executors._analysis.graph import analyse
from braintrace_conv.executors._analysis.hops import (boundary_derivatives, check_linear,
                                                       find_hops, reader_transpose)
from braintrace_conv.executors._analysis.signals import step_point
from braintrace_conv.executors._analysis.step import capture_step
from user_models import LinearStack, UserConvNet, linear_stack_data, spike

pytestmark = pytest.mark.usefixtures('float64')


def _graph(model, x):
    import brainstate
    brainstate.nn.init_all_states(model, x.shape[0])
    return analyse(capture_step(model, jax.ShapeDtypeStruct(x.shape, x.dtype)))


def test_each_layer_is_read_by_the_next_through_its_state_and_an_average_pooling():
    model = LinearStack((0.8, 0.6, 0.7), pool='avg')
    xs, _ = linear_stack_data(model)
    graph = _graph(model, xs[0])
    hops = find_hops(graph)
    assert [(h.source, h.reader) for h in hops] == [(0, 1), (1, 2)]   # not 0 -> 2: two hops
    for h in hops:
        check_linear(graph, h)
        assert h.own and h.to_hidden is None
    # J^T: the transposed average pooling and conv of the reader, by hand
    h = hops[0]
    weights = graph.weights(graph.step.param_leaves())[h.reader]
    c = jnp.asarray(np.random.default_rng(0).normal(size=graph.ops[h.reader].y_aval.shape))

    def by_hand(b):      # b: the state split into 2x2 windows, the last value per neuron
        pooled = b.mean((2, 4))
        return jax.lax.conv_general_dilated(pooled, model.K[1].value, (1, 1), 'SAME',
                                            dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    expected = jax.vjp(by_hand, jnp.zeros(h.boundary.aval.shape))[1](c)[0]
    np.testing.assert_allclose(reader_transpose(graph, h, weights, c), expected, atol=1e-12)


def test_psi_is_the_surrogate_of_a_reset_after_spike_neuron():
    model = UserConvNet(False)
    x = jnp.asarray(np.random.default_rng(1).random((2, 6, 6, 2)) < 0.5, jnp.float64)
    graph = _graph(model, x)
    hops = find_hops(graph)
    assert [(h.source, h.reader) for h in hops] == [(0, 1)]
    step = graph.step
    hidden, params = step.hidden_leaves(), step.param_leaves()
    weights = graph.weights(params)
    _, _, record = graph.run(hidden, params, [x], weights=weights)
    at = step_point(graph, hidden, params, weights, [x], record['op_outputs'])
    (psi,) = boundary_derivatives(graph, at, hops)
    # b = spike(v - 1) of the first layer: psi is the surrogate's derivative there
    v = record['cut'][0]
    surrogate = jax.vmap(jax.grad(lambda u: spike(u - 1.0)))(v.ravel())
    np.testing.assert_allclose(psi[..., 0].ravel(), surrogate, atol=1e-12)


def test_a_max_pooling_between_the_layers_is_refused_by_name():
    model = LinearStack((0.8, 0.6), pool='max')
    xs, _ = linear_stack_data(model)
    graph = _graph(model, xs[0])
    (hop,) = find_hops(graph)
    with pytest.raises(ValueError, match='reduce_max is on the way'):
        check_linear(graph, hop)
