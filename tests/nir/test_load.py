"""load(): each NIR node against a NumPy step of its equation, cycles, summed inputs, peers'
conventions, refusals, and online training of loaded graphs against BPTT."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import braintrace_conv as bc
from braintrace_conv import nir as bnir
from snn_reference import EXACT, rel_err

nir = pytest.importorskip('nir')
pytestmark = pytest.mark.usefixtures('float64')

DT, T, B, N = 1e-3, 10, 2, 5
RNG = np.random.default_rng(0)


def graph(*chain, shape=(N,), extra_edges=()):
    """Input -> chain... -> Output, the nodes named n0, n1, ..."""
    nodes = {'input': nir.Input(np.array(shape))}
    nodes.update({f'n{k}': node for k, node in enumerate(chain)})
    nodes['output'] = nir.Output(np.array([1]))
    names = list(nodes)
    return nir.NIRGraph(nodes, list(zip(names[:-1], names[1:])) + list(extra_edges),
                        type_check=False)


def simulate(model, xs):
    return np.asarray(bc.BPTT(model).predict(jnp.asarray(xs)))


def drive(shape=(N,), scale=1.0):
    return RNG.normal(size=(T, B) + shape) * scale + 0.5 * scale


def p(value, shape=(N,)):
    return np.full(shape, value, np.float64)


# --------------------------------------------------------------------------- neurons
def test_lif_is_forward_euler_with_a_strict_threshold_and_reset_to_v_reset():
    tau, r, leak, thr, reset = 4e-3, 2.0, 0.1, 0.6, -0.2
    node = nir.LIF(tau=p(tau), r=p(r), v_leak=p(leak), v_threshold=p(thr), v_reset=p(reset))
    xs = drive()
    got = simulate(bnir.load(graph(node), dt=DT), xs)
    v, want = np.full((B, N), leak), []
    for x in xs:
        v = v + DT / tau * (leak - v + r * x)
        s = (v > thr).astype(float)
        v = np.where(s > 0, reset, v)
        want.append(s)
    np.testing.assert_array_equal(got, np.array(want))
    assert 0 < got.mean() < 1


def test_cuba_lif_updates_the_current_first_and_subtract_reset_is_a_loader_option():
    ts, tm, r, w_in, thr = 2e-3, 5e-3, 3.0, 1.5, 0.4
    node = nir.CubaLIF(tau_syn=p(ts), tau_mem=p(tm), r=p(r), v_leak=p(0.0), v_threshold=p(thr),
                       v_reset=p(0.0), w_in=p(w_in))
    xs = drive()
    got = simulate(bnir.load(graph(node), dt=DT, reset='subtract'), xs)
    i, v, want = np.zeros((B, N)), np.zeros((B, N)), []
    for x in xs:
        i = i + DT / ts * (-i + w_in * x)
        v = v + DT / tm * (-v + r * i)
        s = (v > thr).astype(float)
        v = v - thr * s
        want.append(s)
    np.testing.assert_array_equal(got, np.array(want))
    assert 0 < got.mean() < 1


@pytest.mark.parametrize('integrator', ['charge', 'euler'])
def test_if_and_i_integrate_r_x_per_step_or_r_dt_x(integrator):
    r, thr = 0.7, 1.0
    gain = r if integrator == 'charge' else r * DT
    xs = drive(scale=1.0 if integrator == 'charge' else 1 / DT)
    got_if = simulate(bnir.load(graph(nir.IF(r=p(r), v_threshold=p(thr))), dt=DT,
                                integrator=integrator), xs)
    got_i = simulate(bnir.load(graph(nir.I(r=p(r))), dt=DT, integrator=integrator), xs)
    v, want = np.zeros((B, N)), []
    for x in xs:
        v = v + gain * x
        s = (v > thr).astype(float)
        v = np.where(s > 0, 0.0, v)
        want.append(s)
    np.testing.assert_array_equal(got_if, np.array(want))
    np.testing.assert_allclose(got_i, np.cumsum(gain * xs, axis=0), rtol=1e-12)


def test_li_cuba_li_threshold_and_scale():
    xs = drive()
    li = simulate(bnir.load(graph(nir.LI(tau=p(3e-3), r=p(2.0), v_leak=p(0.1))), dt=DT), xs)
    cuba = simulate(bnir.load(graph(nir.CubaLI(tau_syn=p(2e-3), tau_mem=p(4e-3), r=p(1.0),
                                               v_leak=p(0.0), w_in=p(2.0))), dt=DT), xs)
    scaled = simulate(bnir.load(graph(nir.Scale(scale=p(-2.0)), nir.Threshold(threshold=p(0.3))),
                                dt=DT), xs)
    v, vi, i = np.full((B, N), 0.1), np.zeros((B, N)), np.zeros((B, N))
    for t, x in enumerate(xs):
        v = v + DT / 3e-3 * (0.1 - v + 2.0 * x)
        i = i + DT / 2e-3 * (-i + 2.0 * x)
        vi = vi + DT / 4e-3 * (-vi + i)
        np.testing.assert_allclose(li[t], v, rtol=1e-12)
        np.testing.assert_allclose(cuba[t], vi, rtol=1e-12)
    np.testing.assert_array_equal(scaled, (-2.0 * xs > 0.3).astype(float))


def test_delay_in_whole_steps_and_refused_otherwise():
    steps = np.array([0, 1, 3, 2, 1])
    xs = drive()
    got = simulate(bnir.load(graph(nir.Delay(delay=steps * DT)), dt=DT), xs)
    for k, s in enumerate(steps):
        want = np.concatenate([np.zeros((s, B)), xs[:T - s, :, k]])
        np.testing.assert_array_equal(got[:, :, k], want)
    with pytest.raises(ValueError, match=r"node 'n0' \(Delay\): a delay of 0.0015 s is not a "
                                         r"whole number of steps of dt=0.001 s"):
        bnir.load(graph(nir.Delay(delay=p(1.5e-3))), dt=DT)


# --------------------------------------------------------------------------- graphs
def recurrent_graph(bias):
    w_in, w_rec = RNG.normal(size=(N, 3)), RNG.normal(size=(N, N)) * 0.5
    nodes = {'input': nir.Input(np.array([3])),
             'fc': nir.Linear(weight=w_in),
             'lif': nir.LIF(tau=p(5e-3), r=p(5.0), v_leak=p(0.0), v_threshold=p(1.0)),
             'rec': nir.Affine(weight=w_rec, bias=np.full(N, bias)),
             'output': nir.Output(np.array([N]))}
    edges = [('input', 'fc'), ('fc', 'lif'), ('lif', 'rec'), ('rec', 'lif'), ('lif', 'output')]
    return nir.NIRGraph(nodes, edges, type_check=False), w_in, w_rec


def test_a_cycle_is_a_one_step_delay_and_inputs_are_summed():
    g, w_in, w_rec = recurrent_graph(bias=0.1)
    xs = drive(shape=(3,))
    got = simulate(bnir.load(g, dt=DT), xs)
    v, s, want = np.zeros((B, N)), np.zeros((B, N)), []
    for x in xs:
        current = x @ w_in.T + (s @ w_rec.T + 0.1)   # the recurrent path reads the last spikes
        v = v + 0.2 * (-v + 5.0 * current)
        s = (v > 1.0).astype(float)
        v = np.where(s > 0, 0.0, v)
        want.append(s)
    np.testing.assert_array_equal(got, np.array(want))
    assert 0 < got.mean() < 1


def test_a_cycle_without_a_neuron_keeps_the_delayed_value_in_a_state():
    w = np.array([[0.5, 0.0], [0.2, -0.3]])
    nodes = {'input': nir.Input(np.array([2])), 'a': nir.Linear(weight=w),
             'output': nir.Output(np.array([2]))}
    g = nir.NIRGraph(nodes, [('input', 'a'), ('a', 'a'), ('a', 'output')], type_check=False)
    net = bnir.load(g, dt=DT)
    xs = drive(shape=(2,))
    got = simulate(net, xs)
    y, want = np.zeros((B, 2)), []
    for x in xs:
        y = (x + y) @ w.T
        want.append(y)
    np.testing.assert_allclose(got, np.array(want), rtol=1e-12)
    assert net.buffered == ['a']


def test_nested_graphs_missing_input_shape_and_a_batch_axis_in_the_input_shape():
    rng = np.random.default_rng(1)
    inner = nir.NIRGraph({'input': nir.Input(np.array([4, 6, 6])),
                          'lif': nir.LIF(tau=np.full((4, 6, 6), 2e-3), r=np.ones((4, 6, 6)),
                                         v_leak=np.zeros((4, 6, 6)), v_threshold=np.full((4, 6, 6), 0.1)),
                          'output': nir.Output(np.array([4, 6, 6]))},
                         [('input', 'lif'), ('lif', 'output')], type_check=False)
    conv = nir.Conv2d(input_shape=None, weight=rng.normal(size=(4, 2, 3, 3)), stride=1,
                      padding='valid', dilation=1, groups=1, bias=np.zeros(4))
    outer = nir.NIRGraph({'input': nir.Input(np.array([1, 2, 8, 8])), 'conv': conv, 'sub': inner,
                          'output': nir.Output(np.array([4, 6, 6]))},
                         [('input', 'conv'), ('conv', 'sub'), ('sub', 'output')], type_check=False)
    net = bnir.load(outer, dt=DT)
    assert net.input_shape == (2, 8, 8) and 'sub.lif' in net.layers
    out = simulate(net, drive(shape=(2, 8, 8)))
    assert out.shape == (T, B, 4, 6, 6) and 0 < out.mean() < 1


def test_file_round_trip_and_dt_from_the_metadata(tmp_path):
    g, _, _ = recurrent_graph(bias=0.0)
    g.metadata = {'dt': DT}
    nir.write(tmp_path / 'g.nir', g)
    xs = drive(shape=(3,))
    np.testing.assert_array_equal(simulate(bnir.load(tmp_path / 'g.nir'), xs),
                                  simulate(bnir.load(g, dt=DT), xs))


def test_refusals_name_the_node_and_the_reason():
    g, _, _ = recurrent_graph(bias=0.0)
    with pytest.raises(ValueError, match='dt is required'):
        bnir.load(g)
    with pytest.raises(ValueError, match=r"node 'n0': tau must be positive"):
        bnir.load(graph(nir.LI(tau=p(0.0), r=p(1.0), v_leak=p(0.0))), dt=DT)
    with pytest.raises(ValueError, match=r"node 'n0' \(Affine\): input must be a vector of 4"):
        bnir.load(graph(nir.Affine(weight=np.ones((2, 4)), bias=np.zeros(2))), dt=DT)
    with pytest.raises(ValueError, match=r"node 'n0' \(LIF\): tau of shape \(3,\) does not fit"):
        bnir.load(graph(nir.LIF(tau=p(1e-3, (3,)), r=p(1, (3,)), v_leak=p(0, (3,)),
                                v_threshold=p(1, (3,)))), dt=DT)
    with pytest.raises(ValueError, match='reset must be one of'):
        bnir.load(g, dt=DT, reset='zero')
    with pytest.raises(ValueError, match=r'expects input of shape \(batch, 3\)'):
        bnir.load(g, dt=DT)(jnp.zeros((B, 4)))


def test_an_affine_map_without_bias_has_a_zero_bias():
    g, _, w_rec = recurrent_graph(bias=0.0)
    without = nir.NIRGraph(dict(g.nodes, rec=nir.Affine(weight=w_rec, bias=None)), g.edges,
                           type_check=False)                    # nir accepts it
    net, xs = bnir.load(without, dt=DT), drive(shape=(3,))
    np.testing.assert_array_equal(simulate(net, xs), simulate(bnir.load(g, dt=DT), xs))
    assert np.array_equal(np.asarray(net.layers['rec'].bias.value), np.zeros(N))


def test_a_file_nir_cannot_read_is_named_with_nir_s_reason(tmp_path):
    junk = tmp_path / 'junk.nir'
    junk.write_bytes(b'not a NIR file')
    with pytest.raises(ValueError, match=rf'^{junk} cannot be read as a NIR graph: nir says '
                                         rf'OSError: .*file signature not found.*$'):
        bnir.load(junk, dt=DT)
    with pytest.raises(FileNotFoundError, match=f'NIR file {tmp_path / "absent.nir"} does not '
                                                f'exist'):
        bnir.load(tmp_path / 'absent.nir', dt=DT)


def test_a_peer_s_file_whose_declared_shapes_nir_rejects_loads_and_runs(tmp_path):
    """A nested graph whose Input declares another shape than it is fed (as peers write
    them): nir's type inference fails on it, even with type_check=False."""
    lif = nir.LIF(tau=p(5e-3), r=p(5.0), v_leak=p(0.0), v_threshold=p(1.0))
    inner = nir.NIRGraph({'input': nir.Input(np.array([3])), 'lif': lif,
                          'output': nir.Output(np.array([N]))},
                         [('input', 'lif'), ('lif', 'output')], type_check=False)
    w = RNG.normal(size=(N, 3))
    outer = nir.NIRGraph({'input': nir.Input(np.array([3])), 'fc': nir.Linear(weight=w),
                          'rnn': inner, 'output': nir.Output(np.array([N]))},
                         [('input', 'fc'), ('fc', 'rnn'), ('rnn', 'output')], type_check=False)
    path = tmp_path / 'peer.nir'
    nir.write(path, outer)
    with pytest.raises(ValueError, match='type mismatch'):
        nir.read(path, type_check=False)
    xs = drive(shape=(3,))
    np.testing.assert_array_equal(simulate(bnir.load(path, dt=DT), xs),
                                  simulate(bnir.load(outer, dt=DT), xs))


# --------------------------------------------------------------------------- online training
@pytest.mark.parametrize('neuron', ['LIF', 'CubaLIF', 'IF', 'LI'])
def test_d_rtrl_equals_bptt_on_a_loaded_conv_layer(neuron):
    """One conv layer of each neuron type, loaded: D-RTRL is exact (docs/theory.md), and
    ES-D-RTRL's bias and readout gradients are (its kernel trace is the approximation)."""
    shape = (3, 6, 6)
    full = lambda v: np.full(shape, v)
    neurons = {
        'LIF': nir.LIF(tau=full(4e-3), r=full(4.0), v_leak=full(0.0), v_threshold=full(0.5)),
        'CubaLIF': nir.CubaLIF(tau_syn=full(2e-3), tau_mem=full(4e-3), r=full(4.0),
                               v_leak=full(0.0), v_threshold=full(0.3), w_in=full(2.0)),
        'IF': nir.IF(r=full(1.0), v_threshold=full(0.8)),
        'LI': nir.LI(tau=full(4e-3), r=full(4.0), v_leak=full(0.0))}
    rng = np.random.default_rng(2)
    conv = nir.Conv2d(input_shape=(6, 6), weight=rng.normal(size=(3, 2, 3, 3)) * 0.6, stride=1,
                      padding=1, dilation=1, groups=1, bias=np.full(3, 0.05))
    readout = nir.Affine(weight=rng.normal(size=(2, 108)) * 0.3, bias=np.zeros(2))
    g = graph(conv, neurons[neuron], nir.Flatten(input_type={'input': np.array(shape)}, start_dim=0),
              readout, shape=(2, 6, 6))
    net = bnir.load(g, dt=DT)
    xs = jnp.asarray(rng.random((T, B, 2, 6, 6)) < 0.5, jnp.float64)
    targets = jnp.asarray(rng.normal(size=(T, B, 2)))
    loss = lambda out, target: jnp.sum((out - target) ** 2)
    _, ref = bc.BPTT(net).value_and_grad(loss, xs, targets)
    _, got = bc.D_RTRL(net).value_and_grad(loss, xs, targets)
    _, es = bc.ES_D_RTRL(net).value_and_grad(loss, xs, targets)
    for key in ref:
        assert np.abs(ref[key]).max() > 0, key
        assert rel_err(got[key], ref[key]) < EXACT, key
        if key[-1] == 'bias' or np.ndim(ref[key]) == 2:
            assert rel_err(es[key], ref[key]) < EXACT, key


def test_subtract_after_leak_and_its_mark_survive_export():
    tau, thr = 4e-3, 0.6
    node = nir.LIF(tau=p(tau), r=p(tau / DT), v_leak=p(0.0), v_threshold=p(thr))
    xs = drive(scale=0.5)
    net = bnir.load(graph(node), dt=DT, reset='subtract_after_leak')
    got = simulate(net, xs)
    v, s, want = np.zeros((B, N)), np.zeros((B, N)), []
    for x in xs:                     # snnTorch's Leaky, reset_delay=True: beta v + x - thr s
        v = (1 - DT / tau) * v + x - thr * s
        s = (v > thr).astype(float)
        want.append(s)
    np.testing.assert_array_equal(got, np.array(want))
    assert 0 < got.mean() < 1
    with pytest.raises(ValueError, match='resets by subtraction'):
        bnir.export(net, jnp.zeros((B, N)), dt=DT)
    again = bnir.load(bnir.export(net, jnp.zeros((B, N)), dt=DT, subtract_reset=True))
    np.testing.assert_array_equal(simulate(again, xs), got)


def _two_layers(delay):
    rng = np.random.default_rng(4)
    nodes = {'input': nir.Input(np.array([4])),
             'fc1': nir.Affine(weight=rng.normal(size=(N, 4)), bias=p(0.1)),
             'lif1': nir.LIF(tau=p(4e-3), r=p(4.0), v_leak=p(0.0), v_threshold=p(0.5)),
             'delay': nir.Delay(delay=delay),
             'fc2': nir.Affine(weight=rng.normal(size=(3, N)), bias=np.zeros(3)),
             'li': nir.LI(tau=p(4e-3, (3,)), r=p(4.0, (3,)), v_leak=p(0.0, (3,))),
             'output': nir.Output(np.array([3]))}
    names = list(nodes)
    return nir.NIRGraph(nodes, list(zip(names[:-1], names[1:])), type_check=False)


class WithoutGradientThrough(brainstate.nn.Module):
    """A loaded network whose hidden states named in ``cut`` are read without gradient."""

    def __init__(self, net, cut: str):
        super().__init__()
        self.net, self.cut = net, cut

    def update(self, x):
        for path, state in self.net.states(brainstate.HiddenState).items():
            if self.cut in path:
                state.value = jax.lax.stop_gradient(state.value)
        return self.net(x)


@pytest.mark.parametrize('steps', [[0, 1, 1, 0, 1], [0, 1, 2, 3, 1]],
                         ids=['one-step', 'three-step'])
def test_d_rtrl_through_a_delay_line_is_its_documented_truncation(steps):
    """The delay line is elementwise, part of the first layer's dynamics: D-RTRL is exact on
    the readout and, on the first layer, equals BPTT with the readout's state cut."""
    net = bnir.load(_two_layers(np.array(steps) * DT), dt=DT)
    rng = np.random.default_rng(5)
    xs, targets = jnp.asarray(rng.normal(size=(T, B, 4)) + 0.5), jnp.asarray(rng.normal(size=(T, B, 3)))
    loss = lambda out, target: jnp.sum((out - target) ** 2)
    _, ref = bc.BPTT(net).value_and_grad(loss, xs, targets)
    _, cut = bc.BPTT(WithoutGradientThrough(net, 'li')).value_and_grad(loss, xs, targets)
    _, got = bc.D_RTRL(net).value_and_grad(loss, xs, targets)
    for leaf in ('weight', 'bias'):
        assert rel_err(got['layers', 'fc2', leaf], ref['layers', 'fc2', leaf]) < EXACT
        assert rel_err(got['layers', 'fc1', leaf], cut['net', 'layers', 'fc1', leaf]) < EXACT
        assert np.abs(got['layers', 'fc1', leaf]).max() > 0


def test_d_rtrl_on_a_cycle_through_no_neuron_is_refused_naming_the_op():
    """A cycle through no neuron keeps the node's output in a state that feeds the node
    again, and the same output drives the neuron: one op feeding two populations, which
    the online executors refuse in a sentence; BPTT trains it."""
    w = np.array([[0.5, 0.0], [0.2, -0.3]])
    nodes = {'input': nir.Input(np.array([2])), 'a': nir.Linear(weight=w),
             'lif': nir.LIF(tau=p(4e-3, (2,)), r=p(4.0, (2,)), v_leak=p(0.0, (2,)),
                            v_threshold=p(0.5, (2,))),
             'output': nir.Output(np.array([2]))}
    net = bnir.load(nir.NIRGraph(nodes, [('input', 'a'), ('a', 'a'), ('a', 'lif'), ('lif', 'output')],
                                 type_check=False), dt=DT)
    xs, targets = jnp.asarray(drive(shape=(2,))), jnp.zeros((T, B, 2))
    loss = lambda out, target: jnp.sum((out - target) ** 2)
    _, ref = bc.BPTT(net).value_and_grad(loss, xs, targets)
    assert np.abs(ref['layers', 'a', 'weight']).max() > 0
    with pytest.raises(ValueError, match=r"etp_dense #0 \(layers.a.weight\) reaches several "
                                         r"hidden groups"):
        bc.D_RTRL(net).value_and_grad(loss, xs, targets)