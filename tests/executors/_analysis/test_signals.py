"""Per-step signals (``signals.py``), each against its closed form on a small
hand-written step (float64): ``g`` and ``gamma``, the state, output and parameter
Jacobians, the release and the transition, and the chained learning signal."""
import jax.numpy as jnp
import numpy as np
import pytest

from braintrace_conv.executors._analysis.signals import (
    chained_learning_signal, dynamic_trace_inputs, init_release, learning_signals,
    output_jacobian, parameter_jacobians, release_jacobians, state_jacobian, step_point,
    transition)
from user_models import B, K, Chained, ResetNeuron, analysed

pytestmark = pytest.mark.usefixtures('float64')


def _point(model, outputs=2):
    graph, hidden, params, weights, inputs = analysed(model)
    target = jnp.asarray(np.random.default_rng(4).normal(size=(B, outputs)))
    loss_fn = lambda out, tgt: jnp.sum(out * tgt)
    eps0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in graph.cut_vars]
    signals = learning_signals(graph, hidden, params, weights, inputs, target, loss_fn, eps0)
    record = signals[3]
    at = step_point(graph, hidden, params, weights, inputs, record['op_outputs'])
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
