"""Every gradient the online executors return is the one their report names.

For each model (delay lines, pipelined layers, feedback through states, user-style
neurons and layers) and executor (D-RTRL, ES-D-RTRL, each with and without a window),
the gradient of every parameter equals a brute-force reference of the documented
approximation built from dense Jacobians (``dense_reference``, float64) to round-off;
a parameter labelled exact also equals BPTT; no gradient is all zero where BPTT's is
not; and every report row finds its gradient by the path it prints. ES-D-RTRL with its
decays inferred (one input trace per timescale) is checked the same way on neurons with
two states: adaptive (ours, the brain ecosystem's, a user's reset-after-spike one) and
current-based; ES-D-RTRL with one hop across layers (``cross_layer=1``) on nets of two
to four spiking layers.
"""
import functools

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import braintrace_conv as bc
import dense_reference as dense
from delay_models import DELAY_MODELS, SHDLike
from snn_reference import EXACT, rel_err, xent
from user_models import (BrainstateLayers, MixedParameter, NeuronLayer, OneLayer, Parametric,
                         PoolBetween, SpikingConvNet, UserConvNet, ours)

pytestmark = pytest.mark.usefixtures('float64')

#: Agreement with the brute-force reference of the same approximation.
SAME = 1e-9
DECAY = 0.9
T, BATCH, WINDOW = 8, 2, 3


MODELS = {**{name: (make, (6, 6, 2)) for name, make in DELAY_MODELS.items()},
          'shd-like': (SHDLike, (3, 20))}
# The user-style models of the exactness tests: name -> (constructor, input shape).
USER_MODELS = {
    **{f'one-layer-{style}': (lambda style=style: OneLayer(style), (6, 6, 2))
       for style in ('subtract', 'old-and-new', 'alif-reset')},
    'brainstate-hidden-linear': (lambda: BrainstateLayers(1, hidden_linear=True), (5, 2)),
    'parameters-in-dynamics': (Parametric, (7, 2)),
    'mixing-parameter': (MixedParameter, (7, 2)),
    'sum-pool-bias-before': (lambda: PoolBetween('sum-same', bias_before_pool=True), (6, 6, 2)),
    'recurrent-conv': (lambda: SpikingConvNet(True), (8, 8, 2)),
    'user-recurrent-brainstate': (lambda: UserConvNet(True), (6, 6, 2)),
    'ours-recurrent-pooled': (lambda: ours(pool=2), (2, 6, 6)),
    # two states per neuron, for multi-decay ES (below)
    'ours-alif': (lambda: ours(tau_adapt=30.0), (2, 6, 6)),
    'ours-cubalif': (lambda: NeuronLayer(functools.partial(bc.nn.CubaLIF, tau=5.0,
                                                           tau_syn=2.0)), (2, 6, 6)),
}
EXECUTORS = {'d-rtrl': lambda m, w: bc.D_RTRL(m, window=w),
             'es-d-rtrl': lambda m, w: bc.ES_D_RTRL(m, DECAY, window=w)}
# The default suite checks each executor and window kind on the models of the reported
# failures; `-m slow` checks every model with every executor, with and without a window.
DEFAULT = {('membrane-delay', 'd-rtrl', None), ('membrane-delay', 'es-d-rtrl', None),
           ('delayed-self-excitation', 'd-rtrl', WINDOW), ('pipelined', 'd-rtrl', None),
           ('pipelined', 'es-d-rtrl', WINDOW), ('delayed-feedback', 'd-rtrl', None),
           ('shd-like', 'd-rtrl', WINDOW)}


def _cases():
    return [pytest.param(name, alg, window,
                         marks=() if (name, alg, window) in DEFAULT else (pytest.mark.slow,),
                         id=f'{name}-{alg}-{f"w{window}" if window else "traces"}')
            for name in [*MODELS, *USER_MODELS] for alg in EXECUTORS for window in (None, WINDOW)]


_REFERENCES = {}


def reference(name):
    """``(model, xs, labels, BPTT gradients, step, Jacobians)`` for model ``name``, built once."""
    if name not in _REFERENCES:
        make, shape = MODELS[name] if name in MODELS else USER_MODELS[name]
        rng = np.random.default_rng(0)
        xs = jnp.asarray(rng.random((T, BATCH, *shape)) < 0.4, jnp.float64)
        labels = jnp.asarray(rng.integers(0, 3, (T, BATCH)))
        model = make()
        _, exact = bc.BPTT(model).value_and_grad(xent, xs, labels)
        brainstate.nn.init_all_states(model, BATCH)
        step = dense.DenseStep(model, xs[0])
        _REFERENCES.clear()        # one model's Jacobians at a time
        _REFERENCES[name] = (model, xs, labels, exact, step,
                             dense.dense_jacobians(step, xent, xs, labels))
    return _REFERENCES[name]


def _leaves(grads):
    return [np.asarray(u.get_mantissa(a)) for key in grads for a in jax.tree.leaves(grads[key])]


def _exact(method: str) -> bool:
    return (method.startswith('exact') and 'truncated' not in method
            and 'approximate' not in method)


def assert_is_its_reference(learner, xs, labels, exact, reference_of):
    """Every gradient of ``learner`` equals ``reference_of(untraced)`` (the brute-force
    reference, given the parameter leaves the report says have no trace), the exact ones
    BPTT's too, none all zero where BPTT's is not, each found by its row's path; returns
    the report."""
    _, grads = learner.value_and_grad(xent, xs, labels)
    report = learner.report()
    methods = [row['method'] for row in report.rows]
    untraced = {i for i, m in enumerate(methods) if 'instantaneous only' in m and 'trace' not in m}
    ref = reference_of(untraced)
    for row, g, r, e in zip(report.rows, _leaves(grads), _leaves(ref), _leaves(exact)):
        where = f"{row['parameter']} ({row['method']})"
        assert rel_err(g, r) < SAME, f'{where}: {rel_err(g, r):.2e} from its reference'
        if _exact(row['method']):
            assert rel_err(g, e) < EXACT, f'{where}: {rel_err(g, e):.2e} from BPTT'
        assert np.any(g) or not np.any(e), f'{where}: all zero, BPTT is not'
        found = report.gradient(grads, row['parameter'])
        np.testing.assert_array_equal(np.asarray(u.get_mantissa(found)), g)
    return report


@pytest.mark.parametrize('name, alg, window', _cases())
def test_gradients_are_the_approximation_the_report_names(name, alg, window):
    model, xs, labels, exact, step, jac = reference(name)
    assert_is_its_reference(
        EXECUTORS[alg](model, window), xs, labels, exact,
        lambda untraced: (dense.drtrl(step, jac, untraced=untraced, window=window)
                          if alg == 'd-rtrl' else
                          dense.es_drtrl(step, jac, {k: DECAY for k in jac.grouped},
                                         untraced=untraced, window=window)))


def test_the_reference_of_a_window_as_long_as_the_sequence_is_bptt():
    """The brute-force reference itself: one block is BPTT for every parameter, whatever the
    approximation outside blocks."""
    _, _, _, exact, step, jac = reference('delayed-feedback')
    for ref in (dense.drtrl(step, jac, window=T),
                dense.es_drtrl(step, jac, {k: DECAY for k in jac.grouped}, window=T)):
        for r, e in zip(_leaves(ref), _leaves(exact)):
            assert rel_err(r, e) < EXACT


# ----------------------------------------------------------------------------- multi-decay ES
MULTI_DECAY = ('one-layer-alif-reset', 'ours-alif', 'ours-cubalif')


def _multi_decay_cases():
    return [pytest.param(name, window, id=f'{name}-{f"w{window}" if window else "traces"}',
                         marks=() if (name, window) == ('one-layer-alif-reset', None)
                         else (pytest.mark.slow,))
            for name in MULTI_DECAY for window in (None, WINDOW)]


def assert_multi_decay_reference(model, xs, labels, exact, step, jac, window):
    report = assert_is_its_reference(
        bc.ES_D_RTRL(model, window=window), xs, labels, exact,
        lambda untraced: dense.es_multi_decay(step, jac, untraced=untraced, window=window))
    assert any('decays' in row['method'] for row in report.rows)   # two timescales found


@pytest.mark.parametrize('name, window', _multi_decay_cases())
def test_multi_decay_es_is_its_reference(name, window):
    model, xs, labels, exact, step, jac = reference(name)
    assert_multi_decay_reference(model, xs, labels, exact, step, jac, window)


@pytest.mark.slow
@pytest.mark.parametrize('window', [None, WINDOW])
def test_multi_decay_es_is_its_reference_on_the_brain_ecosystems_alif(window):
    bps = pytest.importorskip('brainpy.state')
    braintools = pytest.importorskip('braintools')

    class ConvALIF(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            brainstate.random.seed(0)
            self.conv = brainstate.nn.Conv2d((6, 6, 2), 4, 3, padding='SAME',
                                             b_init=braintools.init.Constant(0.1))
            self.neu = bps.ALIF((6, 6, 4), spk_fun=braintools.surrogate.Sigmoid())
            self.readout = brainstate.nn.Linear(6 * 6 * 4, 3)

        def update(self, x):
            spikes = self.neu(self.conv(x) * 4.0 * u.mA)
            return self.readout(spikes.reshape(spikes.shape[0], -1))

    with brainstate.environ.context(dt=1.0 * u.ms):
        rng = np.random.default_rng(0)
        xs = jnp.asarray(rng.random((T, BATCH, 6, 6, 2)) < 0.5, jnp.float64)
        labels = jnp.asarray(rng.integers(0, 3, (T, BATCH)))
        model = ConvALIF()
        _, exact = bc.BPTT(model).value_and_grad(xent, xs, labels)
        brainstate.nn.init_all_states(model, BATCH)
        step = dense.DenseStep(model, xs[0])
        jac = dense.dense_jacobians(step, xent, xs, labels)
        assert_multi_decay_reference(model, xs, labels, exact, step, jac, window)


def test_multi_decay_reference_is_the_single_decay_one_on_one_state_neurons():
    """The reference itself: with one state per neuron its matrix powers are the one decay
    of the single-decay reference (the membrane's, 0.9, inferred)."""
    _, _, _, _, step, jac = reference('one-layer-subtract')
    multi = dense.es_multi_decay(step, jac)
    single = dense.es_drtrl(step, jac, {k: DECAY for k in jac.grouped})
    for m, s_ in zip(_leaves(multi), _leaves(single)):
        assert rel_err(m, s_) < SAME


# ----------------------------------------------------------------------------- one hop
def four_blocks():
    """The library's 4-block net, small: 8x8 frames, 2/3/3/4 channels, no recurrence."""
    brainstate.random.seed(0)
    return bc.models.recurrent_conv_snn((2, 8, 8), 3, channels=(2, 3, 3, 4), recurrent=False,
                                        tau=5.0)


MODELS['four-blocks'] = (four_blocks, (2, 8, 8))
# layers read through a reset-by-subtraction neuron (and a recurrent conv), brainstate.nn
# layers with reset-after-spike neurons, pooling between layers, four blocks and a leaky
# readout
CROSS_LAYER = ('recurrent-conv', 'user-recurrent-brainstate', 'ours-recurrent-pooled',
               'four-blocks')


def _cross_layer_cases():
    # adaptive neurons (two cut values each) with one decay given
    return [pytest.param(name, decay, id=f'{name}-{"inferred" if decay is None else decay}',
                         marks=() if (name, decay) == ('recurrent-conv', DECAY)
                         else (pytest.mark.slow,))
            for name in CROSS_LAYER for decay in (DECAY, None)] + [
        pytest.param('ours-alif', DECAY, id='ours-alif-0.9', marks=pytest.mark.slow)]


@pytest.mark.parametrize('name, decay', _cross_layer_cases())
def test_one_hop_es_is_its_reference(name, decay):
    model, xs, labels, exact, step, jac = reference(name)
    report = assert_is_its_reference(
        bc.ES_D_RTRL(model, decay, cross_layer=1), xs, labels, exact,
        lambda untraced: dense.es_cross_layer(step, jac, decay, untraced=untraced))
    assert any('followed one hop' in row['method'] for row in report.rows)
