"""export -> load round trips (outputs, parameters, report rows) and what export refuses."""
import re
from collections import Counter

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv import nir as bnir

nir = pytest.importorskip('nir')
pytestmark = pytest.mark.usefixtures('float64')

T, B = 12, 2


# --------------------------------------------------------------------------- the models
class Chain(brainstate.nn.Module):
    """Layers called one after the other; ``taps`` names layers whose outputs are also
    returned (as a tuple, before the last layer's)."""

    def __init__(self, layers: dict, taps=()):
        super().__init__()
        for name, layer in layers.items():
            setattr(self, name, layer)
        self.names, self.taps = tuple(layers), taps

    def update(self, x):
        outs = []
        for name in self.names:
            x = getattr(self, name)(x)
            if name in self.taps:
                outs.append(x)
        return tuple(outs) + (x,) if outs else x


def conv_lif_pool_cuba_li():
    return Chain({'conv1': nn.Conv2d(2, 4, 3, b_init=jnp.full(4, 0.2)),
                  'lif1': nn.LIF((8, 8, 4), tau=5.0, V_reset=0.1, reset='zero'),
                  'pool': nn.AvgPool2d(2),
                  'conv2': nn.Conv2d(4, 6, 3, stride=2, padding=1),
                  'lif2': nn.CubaLIF((2, 2, 6), tau=8.0, tau_syn=3.0, V_rest=0.05, reset='zero'),
                  'flat': nn.Flatten(), 'fc': nn.Linear(24, 5), 'out': nn.LI(5, tau=20.0)},
                 taps=('lif2',))


def channels_first_if():
    return Chain({'conv1': nn.Conv2d(2, 4, 3, padding='VALID', layout='channels_first'),
                  'if1': nn.IF((4, 6, 6), reset='zero'),
                  'conv2': nn.Conv2d(4, 4, 3, padding=2, dilation=2, layout='channels_first'),
                  'if2': nn.IF((4, 6, 6), V_th=0.5, reset='zero')})


def recurrent_conv():
    return Chain({'cell': nn.RecurrentConvCell(
        (8, 8, 2), 4, 3, neuron=lambda s: nn.LIF(s, tau=4.0, reset='zero'),
        rec_w_init=nn.FanInNormal(4.0)),
        'flat': nn.Flatten(), 'fc': nn.Linear(256, 3),
        'lif': nn.LIF(3, reset='zero')}, taps=('cell',))


def brainstate_layers():
    return Chain({'conv': brainstate.nn.Conv2d((8, 8, 2), 4, 3, padding='SAME',
                                               b_init=jnp.full(4, 0.1)),
                  'lif': nn.LIF((8, 8, 4), tau=3.0, reset='zero'),
                  'pool': brainstate.nn.AvgPool2d(2, 2),
                  'flat': brainstate.nn.Flatten(start_axis=1),
                  'fc': brainstate.nn.Linear(64, 4, w_init=nn.FanInNormal(8.0)),
                  'if': nn.IF(4, reset='zero')}, taps=('lif',))


def conv1d_cuba():
    return Chain({'conv': nn.Conv1d(2, 3, 3, stride=2, padding=1),
                  'cuba': nn.CubaLIF((4, 3), reset='zero'),
                  'flat': nn.Flatten(), 'fc': nn.Linear(12, 3), 'lif': nn.LIF(3, reset='zero')})


def units_and_trainable_tau():
    return Chain({'conv': nn.Conv2d(2, 4, 3, w_init=nn.FanInNormal(4.0, unit=u.mV)),
                  'plif': nn.LIF((8, 8, 4), tau=jnp.linspace(4.0, 12.0, 4) * u.ms, V_th=1 * u.mV,
                                 reset='zero', trainable='tau'),
                  'flat': nn.Flatten(), 'fc': nn.Linear(256, 3, w_init=nn.FanInNormal(4.0, unit=u.mV)),
                  'lif': nn.LIF(3, tau=10 * u.ms, V_th=1 * u.mV, reset='zero')})


def brainpy_lif():
    bps = pytest.importorskip('brainpy.state')
    braintools = pytest.importorskip('braintools')
    return Chain({'conv': nn.Conv2d(2, 4, 3, w_init=nn.FanInNormal(30.0, unit=u.mA)),
                  'lif': bps.LIF((8, 8, 4), tau=5 * u.ms, V_reset=0.1 * u.mV, spk_reset='hard',
                                 spk_fun=braintools.surrogate.Sigmoid()),
                  'flat': nn.Flatten(), 'fc': nn.Linear(256, 3, w_init=nn.FanInNormal(30.0, unit=u.mA)),
                  'if': bps.IF(3, tau=10 * u.ms, spk_reset='hard')}, taps=('lif',))


def every_node_graph():
    """A NIR graph with the nodes the models above do not produce (loaded, then exported)."""
    rng = np.random.default_rng(3)
    full = lambda v, s=(3, 4, 4): np.full(s, v)
    nodes = {
        'input': nir.Input(np.array([2, 4, 4])),
        'conv': nir.Conv2d(input_shape=(4, 4), weight=rng.normal(size=(3, 2, 3, 3)), stride=1,
                           padding=1, dilation=1, groups=1, bias=rng.normal(size=3) * 0.1),
        'scale': nir.Scale(scale=full(1.5)),
        'cuba_li': nir.CubaLI(tau_syn=full(2e-3), tau_mem=full(5e-3), r=full(2.0),
                              v_leak=full(0.0), w_in=full(1.5)),
        'threshold': nir.Threshold(threshold=full(0.2)),
        'integrator': nir.I(r=full(0.5)),
        'sum_pool': nir.SumPool2d(kernel_size=np.array([2, 2]), stride=np.array([2, 2]),
                                  padding=np.array([0, 0])),
        'flat': nir.Flatten(input_type={'input': np.array([3, 2, 2])}, start_dim=0),
        'linear': nir.Linear(weight=rng.normal(size=(4, 12))),
        'lif': nir.LIF(tau=np.full(4, 4e-3), r=np.full(4, 3.0), v_leak=np.full(4, 0.1),
                       v_threshold=np.full(4, 0.5), v_reset=np.full(4, -0.1)),
        'output': nir.Output(np.array([4]))}
    edges = [('input', 'conv'), ('conv', 'scale'), ('scale', 'cuba_li'), ('cuba_li', 'threshold'),
             ('threshold', 'integrator'), ('integrator', 'sum_pool'), ('sum_pool', 'flat'),
             ('flat', 'linear'), ('linear', 'lif'), ('lif', 'output')]
    return nir.NIRGraph(nodes, edges, type_check=False)


MODELS = {'conv-LIF-pool-CubaLIF-LI': (conv_lif_pool_cuba_li, (8, 8, 2), 'channels_last'),
          'channels-first IF': (channels_first_if, (2, 8, 8), 'channels_first'),
          'recurrent conv': (recurrent_conv, (8, 8, 2), 'channels_last'),
          'brainstate.nn layers': (brainstate_layers, (8, 8, 2), 'channels_last'),
          'Conv1d CubaLIF': (conv1d_cuba, (8, 2), 'channels_last'),
          'units, trainable tau': (units_and_trainable_tau, (8, 8, 2), 'channels_last'),
          'brainpy.state LIF/IF': (brainpy_lif, (8, 8, 2), 'channels_last')}


def make(name):
    build, shape, layout = MODELS[name]
    brainstate.random.seed(1)
    return build(), shape, layout


def inputs(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).random((T, B) + shape) < 0.4,
                       brainstate.environ.dftype())


def to_nir_layout(a, layout):
    """(T, B, *spatial, C) -> (T, B, C, *spatial) when channels last."""
    return jnp.moveaxis(a, -1, 2) if layout == 'channels_last' and a.ndim > 3 else a


def run(model, xs, dt_ms=1.0):
    with brainstate.environ.context(dt=dt_ms * u.ms if _has_units(model) else dt_ms):
        outs = bc.BPTT(model).predict(xs)
    return [u.get_mantissa(o) for o in (outs if isinstance(outs, tuple) else (outs,))]


def _has_units(model):
    return any(isinstance(getattr(mod, 'tau', None), (u.Quantity, brainstate.State))
               and isinstance(u.math.asarray(getattr(mod.tau, 'value', mod.tau)), u.Quantity)
               for mod in model.nodes().values())


def round_trip(name, tmp_path=None):
    model, shape, layout = make(name)
    xs = inputs(shape)
    path = None if tmp_path is None else tmp_path / 'model.nir'
    graph = bnir.export(model, xs[0], dt=1e-3, path=path)
    loaded = bnir.load(graph if path is None else path)
    return model, loaded, xs, layout


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize('name', list(MODELS))
def test_round_trip_reproduces_the_outputs_bitwise(name, tmp_path):
    model, loaded, xs, layout = round_trip(name, tmp_path)
    ours = run(model, xs)
    theirs = run(loaded, to_nir_layout(xs, layout))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        a = to_nir_layout(a, layout)
        assert a.shape == b.shape
        if name == 'conv-LIF-pool-CubaLIF-LI' and a is ours[-1]:
            # a membrane read out after a channels-last flatten: NIR's channels-first order
            # permutes the affine map's terms, so its sums round differently (a few ulp)
            assert float(jnp.abs(a - b).max()) < 1e-13 * float(jnp.abs(a).max())
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(float(jnp.mean(o)) > 0.01 for o in ours[:-1] + [ours[-1]] if o.max() <= 1), \
        'the test needs spikes'


def test_round_trip_of_a_loaded_graph_with_every_other_node_type():
    first = bnir.load(every_node_graph(), dt=1e-3)
    second = bnir.load(bnir.export(first, jnp.zeros((B, 2, 4, 4)), dt=1e-3))
    xs = jax.random.normal(jax.random.PRNGKey(0), (T, B, 2, 4, 4))
    a, b = run(first, xs)[0], run(second, xs)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert 0 < float(a.mean()) < 1


def loaded_graph_with_cycles_and_sums():
    """Summed inputs into a nested graph holding a recurrent affine map without bias (a cycle
    through a neuron), then a cycle through no neuron, read out by an LI."""
    rng = np.random.default_rng(5)
    full = lambda v, n=6: np.full(n, v)
    inner = nir.NIRGraph({
        'in': nir.Input(np.array([6])),
        'lif': nir.LIF(tau=full(5e-3), r=full(2.0), v_leak=full(0.0), v_threshold=full(0.5),
                       v_reset=full(0.0)),
        'rec': nir.Affine(weight=rng.normal(size=(6, 6)) * 0.5, bias=None),
        'out': nir.Output(np.array([6]))},
        [('in', 'lif'), ('lif', 'rec'), ('rec', 'lif'), ('lif', 'out')], type_check=False)
    return nir.NIRGraph({
        'input': nir.Input(np.array([4])),
        'fc': nir.Affine(weight=rng.normal(size=(6, 4)), bias=rng.normal(size=6) * 0.1),
        'skip': nir.Linear(weight=rng.normal(size=(6, 4))),
        'rnn': inner,
        'mix': nir.Linear(weight=rng.normal(size=(6, 6)) * 0.3),
        'li': nir.LI(tau=full(4e-3), r=full(1.0), v_leak=full(0.0)),
        'output': nir.Output(np.array([6]))},
        [('input', 'fc'), ('input', 'skip'), ('fc', 'rnn'), ('skip', 'rnn'), ('rnn', 'mix'),
         ('mix', 'mix'), ('mix', 'li'), ('li', 'output')], type_check=False)


def _fields(graph, prefix='') -> dict:
    """Every array field of every node of a graph (nested ones by ``outer.inner``)."""
    fields = {}
    for name, node in graph.nodes.items():
        if isinstance(node, nir.NIRGraph):
            fields.update(_fields(node, f'{prefix}{name}.'))
            continue
        for key, value in vars(node).items():
            if isinstance(value, np.ndarray):
                fields[f'{prefix}{name}.{key}'] = value
    return fields


def test_a_loaded_graph_exports_back_with_its_cycles_and_sums_bitwise(tmp_path):
    original = loaded_graph_with_cycles_and_sums()
    first = bnir.load(original, dt=1e-3)
    assert first.buffered == ['mix'] and 'rnn.rec' in first.recomputed
    graph = bnir.export(first, jnp.zeros((B, 4)), dt=1e-3, path=tmp_path / 'loaded.nir')
    assert graph.edges == original.edges
    assert graph.nodes['rnn'].edges == original.nodes['rnn'].edges
    second = bnir.load(tmp_path / 'loaded.nir')
    assert (second.order, second.edges, second.nested, second.buffered) == \
        (first.order, first.edges, first.nested, first.buffered)
    xs = jax.random.normal(jax.random.PRNGKey(1), (T, B, 4)) + 0.5
    a, b = run(first, xs)[0], run(second, xs)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(jnp.abs(a).max()) > 0
    # the weights as they were read (a missing bias written as zeros), and a fixed point
    written, again = _fields(graph), _fields(bnir.export(second, jnp.zeros((B, 4)), dt=1e-3))
    assert written.keys() == again.keys()
    for name, value in written.items():
        np.testing.assert_array_equal(value, again[name], err_msg=name)
    for name in ('fc.weight', 'fc.bias', 'skip.weight', 'rnn.rec.weight', 'mix.weight'):
        np.testing.assert_array_equal(written[name], _fields(original)[name], err_msg=name)
    np.testing.assert_array_equal(written['rnn.rec.bias'], np.zeros(6))


def test_a_loaded_graph_inside_a_model_is_written_as_a_nested_graph():
    loaded = bnir.load(loaded_graph_with_cycles_and_sums(), dt=1e-3)
    brainstate.random.seed(2)
    model = Chain({'net': loaded, 'fc': nn.Linear(6, 3), 'lif': nn.LIF(3, reset='zero')})
    graph = bnir.export(model, jnp.zeros((B, 4)), dt=1e-3)
    assert isinstance(graph.nodes['net'], nir.NIRGraph) and ('net', 'fc') in graph.edges
    xs = jax.random.normal(jax.random.PRNGKey(2), (T, B, 4)) + 0.5
    spikes = np.asarray(run(model, xs)[0])
    np.testing.assert_array_equal(spikes, np.asarray(run(bnir.load(graph), xs)[0]))
    assert spikes.any()


def test_a_cycle_is_written_as_a_cycle_and_read_back_as_one():
    graph = bnir.export(*[f(s) for f, s in ((make, 'recurrent conv'),)][0][:1],
                        jnp.zeros((B, 8, 8, 2)), dt=1e-3)
    assert ('cell_rec', 'cell_neuron') in graph.edges and ('cell_neuron', 'cell_rec') in graph.edges
    loaded = bnir.load(graph)
    brainstate.nn.init_all_states(loaded, B)
    assert not loaded.states(brainstate.HiddenState).filter(lambda p, s: 'delayed' in p)


def _sorted_leaves(model):
    return [np.sort(np.ravel(u.get_mantissa(leaf))) for st in model.states(brainstate.ParamState).values()
            for leaf in jax.tree.leaves(st.value, is_leaf=lambda a: isinstance(a, u.Quantity))]


def _rows(learner, loss, xs):
    learner.value_and_grad(loss, xs, jnp.zeros((T, B)))
    strip = lambda text: re.sub(r'#\d+', '#', text)
    return sorted((r['shape'] if len(r['shape']) < 2 else tuple(sorted(r['shape'])),
                   strip(r['method'])) for r in learner.report().rows)


@pytest.mark.parametrize('name', [pytest.param('conv-LIF-pool-CubaLIF-LI', marks=pytest.mark.slow),
                                  'recurrent conv'])
def test_parameters_gradients_and_report_rows_survive(name):
    model, loaded, xs, layout = round_trip(name)
    originals, copies = _sorted_leaves(model), _sorted_leaves(loaded)
    for leaf in originals:   # every weight and bias, whatever its layout, is in the loaded model
        assert any(c.shape == leaf.shape and np.array_equal(c, leaf) for c in copies)
    # NIR's convs always have a bias: a conv without one comes back with a zero bias
    assert len(copies) - sum(not c.any() for c in copies) <= len(originals)

    def loss(out, target):
        return jnp.sum(out[-1] ** 2) if isinstance(out, tuple) else jnp.sum(out ** 2)

    _, g_ours = bc.BPTT(model).value_and_grad(loss, xs, jnp.zeros((T, B)))
    _, g_loaded = bc.BPTT(loaded).value_and_grad(loss, to_nir_layout(xs, layout), jnp.zeros((T, B)))
    ours = [np.sort(np.ravel(g)) for g in jax.tree.leaves(g_ours)]
    theirs = [np.sort(np.ravel(g)) for g in jax.tree.leaves(g_loaded)]
    for a in ours:    # the same gradients, up to the layout of each parameter
        assert any(b.shape == a.shape and np.allclose(a, b, rtol=1e-9, atol=1e-12) for b in theirs)
    ours = Counter(_rows(bc.D_RTRL(model), loss, xs))
    theirs = Counter(_rows(bc.D_RTRL(loaded), loss, to_nir_layout(xs, layout)))
    assert not ours - theirs     # every row, with the same method, up to op numbers
    assert sum((theirs - ours).values()) == sum(not c.any() for c in copies) - \
        sum(not c.any() for c in originals)


def test_graph_fields_follow_nir_conventions():
    model, shape, layout = make('conv-LIF-pool-CubaLIF-LI')
    graph = bnir.export(model, inputs(shape)[0], dt=1e-3)
    conv, lif = graph.nodes['conv1'], graph.nodes['lif1']
    kernel = np.asarray(model.conv1.weight.value)            # HWIO
    np.testing.assert_array_equal(conv.weight, np.transpose(kernel, (3, 2, 0, 1)))   # OIHW
    assert lif.tau.shape == (4, 8, 8)                                    # full shape, C first
    np.testing.assert_array_equal(1 - 1e-3 / lif.tau, np.exp(-1 / 5.0))  # seconds; Euler decay
    np.testing.assert_array_equal(lif.r * (1e-3 / lif.tau), 1.0)       # input gain 1
    assert np.all(lif.v_threshold < 1.0) and np.all(np.nextafter(lif.v_threshold, 2.0) == 1.0)
    assert graph.metadata['dt'] == 1e-3 and graph.metadata['input_layout'] == 'channels_last'
    assert graph.nodes['input'].input_type['input'].tolist() == [2, 8, 8]


def test_subtract_reset_is_written_only_when_asked_and_then_read_back():
    model = Chain({'conv': nn.Conv2d(2, 4, 3), 'lif': nn.LIF((8, 8, 4), tau=5.0)})
    xs = inputs((8, 8, 2))
    with pytest.raises(ValueError, match=r"layer 'lif' \(LIF\) resets by subtraction"):
        bnir.export(model, xs[0], dt=1e-3)
    graph = bnir.export(model, xs[0], dt=1e-3, subtract_reset=True)
    assert graph.nodes['lif'].metadata == {'reset': 'subtract'}
    a, b = run(model, xs)[0], run(bnir.load(graph), to_nir_layout(xs, 'channels_last'))[0]
    np.testing.assert_array_equal(np.asarray(to_nir_layout(a, 'channels_last')), np.asarray(b))


def test_float32_models_round_trip_in_float32():
    brainstate.environ.set(precision=32)
    try:
        model, loaded, xs, layout = round_trip('channels-first IF')
        a, b = run(model, xs)[0], run(loaded, xs)[0]
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    finally:
        brainstate.environ.set(precision=64)


# --------------------------------------------------------------------------- refusals
def _refused(layers, shape, match, **kwargs):
    model = Chain(layers)
    with pytest.raises(ValueError, match=match):
        bnir.export(model, jnp.zeros((B,) + shape), dt=1e-3, **kwargs)


def test_refuses_adaptation_max_pooling_3d_and_unequal_padding():
    _refused({'conv': nn.Conv2d(2, 4, 3), 'alif': nn.ALIF((8, 8, 4), reset='zero')}, (8, 8, 2),
             r"'alif' \(ALIF\): NIR has no neuron with threshold adaptation")
    _refused({'pool': brainstate.nn.MaxPool2d(2, 2)}, (8, 8, 2), r'no max pooling')
    _refused({'conv': nn.Conv3d(2, 4, 3)}, (4, 4, 4, 2), r'1-D and 2-D convolutions only')
    _refused({'conv': nn.Conv2d(2, 4, 2, padding='SAME')}, (8, 8, 2),
             r"padding 'SAME' pads \[\(0, 1\), \(0, 1\)\] \(low, high\) here, unequal")


def test_refuses_code_between_layers_naming_the_layer():
    class Reshaped(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.lif = nn.LIF(8, reset='zero')
            self.fc = nn.Linear(16, 2)

        def update(self, x):
            s = self.lif(x)
            return self.fc(jnp.concatenate([s, s], axis=-1))

    with pytest.raises(ValueError, match=r"the input of layer 'fc' \(Linear\) is computed by code "
                                         r"between layers"):
        bnir.export(Reshaped(), jnp.zeros((B, 8)), dt=1e-3)


def test_refuses_a_bad_dt_and_an_unbatched_example():
    model = Chain({'lif': nn.LIF(3, reset='zero')})
    with pytest.raises(ValueError, match='dt must be the step in seconds'):
        bnir.export(model, jnp.zeros((B, 3)), dt=0)
    with pytest.raises(ValueError, match='example_input must be one step with a batch axis'):
        bnir.export(model, jnp.zeros(3), dt=1e-3)
