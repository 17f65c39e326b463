"""The brain ecosystem's neurons and spike functions, through every executor, in float64.

A standing matrix: neurons (``brainpy.state``'s LIF with soft and hard reset, ALIF,
CubaLIF with ``tau != tau_syn`` and ``tau == tau_syn``, AdExIF, Izhikevich, and this
library's LIF, ALIF and CubaLIF) x spike functions (this library's, braintools'
Sigmoid, Arctan, GaussianGrad and ReluGrad, a ``jax.custom_jvp``, a ``jax.custom_vjp``,
a straight-through form) x executors (D-RTRL, ES-D-RTRL with its decays inferred, with
a window, with ``exact=``, through ``advance``, with one hop across layers), plus time
constants that train. Each gradient equals the brute-force reference of what its report
names (``dense_reference``: dense Jacobians, its decays taken by finite differences of
the step's values), the exact ones BPTT's; ES-D-RTRL's inferred decays are the model's,
``exp(-dt/tau)`` per time constant where it has a closed form, and the eigenvalues of
the reference's rest Jacobian always.

The default suite runs a slice (every spike function once, every neuron once); the whole
matrix runs with ``python3 -m pytest -m ecosystem tests/executors/test_ecosystem_models.py``.
"""
import math
import re

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import saiunit as u
from jax import lax

import braintrace_conv as bc
import dense_reference as dense
from snn_reference import EXACT, rel_err, xent

bps = pytest.importorskip('brainpy.state')
braintools = pytest.importorskip('braintools')

pytestmark = pytest.mark.usefixtures('float64')
T, BATCH, SHAPE, CHANNELS = 6, 2, (4, 4, 2), 3
#: Agreement with the brute-force reference of the same approximation.
SAME = 1e-9


def _leaves(grads):
    return [np.asarray(u.get_mantissa(a)) for key in grads for a in jax.tree.leaves(grads[key])]


def _exact(method: str) -> bool:
    return (method.startswith('exact') and 'truncated' not in method
            and 'approximate' not in method)


# ----------------------------------------------------------------------------- spike functions
@jax.custom_jvp
def custom_jvp_spike(x):
    return (x > 0).astype(x.dtype)


@custom_jvp_spike.defjvp
def _custom_jvp_spike_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return custom_jvp_spike(x), dx / (1 + (3 * x) ** 2)


@jax.custom_vjp
def custom_vjp_spike(x):
    return (x > 0).astype(x.dtype)


def _custom_vjp_fwd(x):
    return custom_vjp_spike(x), x


def _custom_vjp_bwd(x, g):
    s = jax.nn.sigmoid(4 * x)
    return (g * 4 * s * (1 - s),)


custom_vjp_spike.defvjp(_custom_vjp_fwd, _custom_vjp_bwd)


def straight_through_spike(x):
    """The value of a Heaviside step, the derivative of a sigmoid."""
    smooth = jax.nn.sigmoid(4 * x)
    return smooth + lax.stop_gradient((x > 0).astype(x.dtype) - smooth)


SPIKES = {
    'bc-sigmoid': lambda: bc.nn.surrogate.Sigmoid(4.0),
    'bt-sigmoid': lambda: braintools.surrogate.Sigmoid(),
    'bt-arctan': lambda: braintools.surrogate.Arctan(),
    'bt-gaussian': lambda: braintools.surrogate.GaussianGrad(),
    'bt-relu': lambda: braintools.surrogate.ReluGrad(),
    'custom-jvp': lambda: custom_jvp_spike,
    'custom-vjp': lambda: custom_vjp_spike,
    'straight-through': lambda: straight_through_spike,
}


# ----------------------------------------------------------------------------- neurons
class TrainableTauLIF(bps.LIF):
    """``brainpy.state.LIF`` whose time constant is a ``ParamState``, as a user makes one
    train (the class reads ``self.tau``)."""

    def __init__(self, *args, tau, **kwargs):
        super().__init__(*args, tau=tau, **kwargs)
        self.tau_state = brainstate.ParamState(tau)

    @property
    def tau(self):
        return self.tau_state.value

    @tau.setter
    def tau(self, value):      # brainpy's constructor assigns it; the state holds it
        pass


MS = 1.0 * u.ms
# name -> (make(shape, spike), input scale, dt, analytic decays per step (None: none known))
NEURONS = {
    'bc-LIF': (lambda s, f: bc.nn.LIF(s, tau=10.0, spike_fn=f), 2.0, 1.0, [math.exp(-0.1)]),
    'bc-ALIF': (lambda s, f: bc.nn.ALIF(s, tau=10.0, tau_a=50.0, spike_fn=f), 2.0, 1.0,
                [math.exp(-0.1), math.exp(-0.02)]),
    'bc-CubaLIF': (lambda s, f: bc.nn.CubaLIF(s, tau=10.0, tau_syn=5.0, spike_fn=f), 2.0, 1.0,
                   [math.exp(-0.1), math.exp(-0.2)]),
    'bc-LIF-trained-tau': (lambda s, f: bc.nn.LIF(s, tau=10.0, spike_fn=f, trainable=('tau',)),
                           2.0, 1.0, [math.exp(-0.1)]),
    'bps-LIF-soft': (lambda s, f: bps.LIF(s, tau=5 * u.ms, spk_reset='soft', spk_fun=f),
                     4.0 * u.mA, MS, [math.exp(-0.2)]),
    'bps-LIF-hard': (lambda s, f: bps.LIF(s, tau=5 * u.ms, spk_reset='hard', spk_fun=f),
                     4.0 * u.mA, MS, [math.exp(-0.2)]),
    'bps-LIF-trained-tau': (lambda s, f: TrainableTauLIF(s, tau=5.0 * u.ms, spk_fun=f),
                            4.0 * u.mA, MS, [math.exp(-0.2)]),
    'bps-ALIF': (lambda s, f: bps.ALIF(s, tau=10 * u.ms, tau_a=200 * u.ms, spk_fun=f),
                 4.0 * u.mA, 0.5 * u.ms, [math.exp(-0.05), math.exp(-0.0025)]),
    'bps-CubaLIF': (lambda s, f: bps.CubaLIF(s, tau=10 * u.ms, tau_syn=5 * u.ms, spk_fun=f),
                    4.0 * u.mA, MS, [math.exp(-0.1), math.exp(-0.2)]),
    # tau == tau_syn: one decay, a Jordan chain of two
    'bps-CubaLIF-equal': (lambda s, f: bps.CubaLIF(s, spk_fun=f), 4.0 * u.mA, 0.5 * u.ms,
                          [math.exp(-0.1)]),
    'bps-AdExIF': (lambda s, f: bps.AdExIF(s, spk_fun=f), 60.0 * u.mA, MS, None),
    'bps-Izhikevich': (lambda s, f: bps.Izhikevich(s, spk_fun=f), 50.0 * u.mV / u.ms, MS, None),
}


class Net(brainstate.nn.Module):
    """brainstate conv (with bias) -> the neuron -> a brainstate readout; with ``layers=2``
    a second conv and neuron between (for one hop across layers)."""

    def __init__(self, neuron, spike, layers=1):
        super().__init__()
        brainstate.random.seed(0)
        make, self.scale, _, _ = NEURONS[neuron]
        shape = (*SHAPE[:2], CHANNELS)
        self.conv = brainstate.nn.Conv2d(SHAPE, CHANNELS, 3, padding='SAME',
                                         b_init=braintools.init.Constant(0.1))
        self.neu = make(shape, SPIKES[spike]())
        if layers == 2:
            self.conv2 = brainstate.nn.Conv2d(shape, CHANNELS, 3, padding='SAME')
            self.neu2 = make(shape, SPIKES[spike]())
        self.layers = layers
        self.readout = brainstate.nn.Linear(math.prod(shape), 3)

    def update(self, x):
        spikes = self.neu(self.conv(x) * self.scale)
        if self.layers == 2:
            spikes = self.neu2(self.conv2(spikes) * self.scale)
        return self.readout(spikes.reshape(spikes.shape[0], -1))


def dt_of(neuron):
    return NEURONS[neuron][2]


_REFERENCES = {}


def reference(neuron, spike, layers=1):
    """``(model, xs, labels, BPTT gradients, step, Jacobians)``, built once per model."""
    key = (neuron, spike, layers)
    if key not in _REFERENCES:
        rng = np.random.default_rng(0)
        xs = jnp.asarray(rng.random((T, BATCH, *SHAPE)) < 0.5, jnp.float64)
        labels = jnp.asarray(rng.integers(0, 3, (T, BATCH)))
        model = Net(neuron, spike, layers)
        _, exact = bc.BPTT(model).value_and_grad(xent, xs, labels)
        brainstate.nn.init_all_states(model, BATCH)
        step = dense.DenseStep(model, xs[0])
        _REFERENCES.clear()         # one model's Jacobians at a time
        _REFERENCES[key] = (model, xs, labels, exact, step,
                            dense.dense_jacobians(step, xent, xs, labels))
    return _REFERENCES[key]


_DECAY = r'[0-9.]+(?:±[0-9.]+i)?'


def reported_decays(report, parameter="conv.weight['weight']"):
    """The decays the report prints on ``parameter``'s row (a pair ``a±bi`` as ``a+bi``),
    sorted."""
    row = next(r for r in report.rows if r['parameter'] == parameter)
    found = re.search(rf'decays? ({_DECAY}(?: / {_DECAY})*)', row['method'])
    assert found, f'no decay on the row: {row["method"]}'
    values = [complex(*map(float, v.rstrip('i').split('±'))) if '±' in v else complex(float(v))
              for v in found.group(1).split(' / ')]
    return sorted(values, key=lambda z: (z.real, z.imag))


def rest_decays(step, jac):
    """The distinct eigenvalues (one of each conjugate pair) of the reference's mean rest
    Jacobian of the first group (finite differences of the step's values), sorted."""
    cj = dense.cut_jacobians(step, jac)
    idx = cj.index[0]
    Dbar = np.array([[np.mean(cj.D_rest[idx[i], idx[j]]) for j in range(len(idx))]
                     for i in range(len(idx))])
    found = []
    for lam in np.linalg.eigvals(Dbar):
        if lam.imag >= -1e-9 and all(abs(lam - f) > 1e-5 for f in found):
            found.append(complex(lam.real, max(lam.imag, 0.0)))
    return sorted(found, key=lambda z: (z.real, z.imag))


def assert_equals_reference(learner, xs, labels, exact, ref_of, *, grads=None):
    """Every gradient equals ``ref_of(untraced)``, the exact ones BPTT's, none all zero
    where BPTT's is not; returns the report."""
    if grads is None:
        _, grads = learner.value_and_grad(xent, xs, labels)
    report = learner.report()
    methods = [row['method'] for row in report.rows]
    untraced = {i for i, m in enumerate(methods) if 'instantaneous only' in m and 'trace' not in m}
    ref = ref_of(untraced)
    for row, g, r, e in zip(report.rows, _leaves(grads), _leaves(ref), _leaves(exact)):
        where = f"{row['parameter']} ({row['method']})"
        assert rel_err(g, r) < SAME, f'{where}: {rel_err(g, r):.2e} from its reference'
        if _exact(row['method']):
            assert rel_err(g, e) < EXACT, f'{where}: {rel_err(g, e):.2e} from BPTT'
        assert np.any(g) or not np.any(e), f'{where}: all zero, BPTT is not'
    return report


# ----------------------------------------------------------------------------- the matrix
EXECUTORS = ('d-rtrl', 'es', 'es-window', 'es-exact', 'es-advance')
# the default suite: each spike function and each neuron at least once, each executor
DEFAULT = {('bps-LIF-soft', 'bt-sigmoid', 'es'), ('bps-LIF-soft', 'bt-sigmoid', 'd-rtrl'),
           ('bc-LIF', 'bt-arctan', 'es'), ('bc-LIF', 'bt-gaussian', 'es'),
           ('bps-ALIF', 'bt-sigmoid', 'es'), ('bps-ALIF', 'bt-sigmoid', 'es-window'),
           ('bps-CubaLIF', 'bt-sigmoid', 'es'), ('bps-CubaLIF-equal', 'bt-sigmoid', 'es'),
           ('bps-LIF-hard', 'bt-relu', 'es-advance'), ('bc-ALIF', 'custom-jvp', 'es'),
           ('bc-CubaLIF', 'custom-vjp', 'es-exact'), ('bc-LIF', 'straight-through', 'es'),
           ('bps-AdExIF', 'bc-sigmoid', 'es'), ('bps-Izhikevich', 'bt-sigmoid', 'es'),
           ('bc-LIF-trained-tau', 'bt-sigmoid', 'es'),
           ('bps-LIF-trained-tau', 'bt-sigmoid', 'es')}


def _cases():
    return [pytest.param(n, s, e, id=f'{n}-{s}-{e}',
                         marks=() if (n, s, e) in DEFAULT else (pytest.mark.ecosystem,))
            for n in NEURONS for s in SPIKES for e in EXECUTORS]


@pytest.mark.parametrize('neuron, spike, executor', _cases())
def test_gradients_and_decays_are_the_models(neuron, spike, executor):
    with brainstate.environ.context(dt=dt_of(neuron)):
        model, xs, labels, exact, step, jac = reference(neuron, spike)
        if executor == 'd-rtrl':
            assert_equals_reference(bc.D_RTRL(model), xs, labels, exact,
                                    lambda untraced: dense.drtrl(step, jac, untraced=untraced))
            return
        if executor == 'es-exact':
            report = assert_equals_reference(
                bc.ES_D_RTRL(model, exact=['conv']), xs, labels, exact,
                lambda untraced: dense.drtrl(step, jac, untraced=untraced))
            assert 'exact' in next(r['method'] for r in report.rows
                                   if r['parameter'] == "conv.weight['weight']")
            return
        window = 3 if executor == 'es-window' else None
        learner = bc.ES_D_RTRL(model, window=window)
        grads = None
        if executor == 'es-advance':     # two chunks of one run add up to the whole sequence
            learner.reset(BATCH)
            half = T // 2
            _, first = learner.advance(xent, xs[:half], labels[:half])
            _, second = learner.advance(xent, xs[half:], labels[half:])
            grads = jax.tree.map(jnp.add, first, second)
        report = assert_equals_reference(
            learner, xs, labels, exact,
            lambda untraced: dense.es_multi_decay(step, jac, untraced=untraced, window=window),
            grads=grads)
        decays = reported_decays(report)
        np.testing.assert_allclose(decays, rest_decays(step, jac), atol=5e-4)
        analytic = NEURONS[neuron][3]
        if analytic is not None:
            np.testing.assert_allclose(decays, sorted(analytic), atol=5e-4)


SINGLE_DECAY = ('bc-LIF', 'bps-LIF-soft', 'bps-LIF-hard')


def _hop_cases():
    return [pytest.param(n, s, id=f'{n}-{s}',
                         marks=() if (n, s) == ('bps-LIF-soft', 'bt-sigmoid')
                         else (pytest.mark.ecosystem,))
            for n in SINGLE_DECAY for s in SPIKES]


@pytest.mark.parametrize('neuron, spike', _hop_cases())
def test_one_hop_across_layers_is_its_reference(neuron, spike):
    with brainstate.environ.context(dt=dt_of(neuron)):
        model, xs, labels, exact, step, jac = reference(neuron, spike, layers=2)
        report = assert_equals_reference(
            bc.ES_D_RTRL(model, cross_layer=1), xs, labels, exact,
            lambda untraced: dense.es_cross_layer(step, jac, None, untraced=untraced))
        assert any('followed one hop' in row['method'] for row in report.rows)
        np.testing.assert_allclose(reported_decays(report), NEURONS[neuron][3], atol=5e-4)


# ----------------------------------------------------------------------------- trained decays
class LeakyConv(brainstate.nn.Module):
    """A linear leaky layer ``v = exp(-1/tau) v + conv(x)`` whose ``tau`` is a parameter."""

    def __init__(self, tau=8.0):
        super().__init__()
        brainstate.random.seed(0)
        self.conv = brainstate.nn.Conv2d(SHAPE, CHANNELS, 3, padding='SAME')
        self.tau = brainstate.ParamState(jnp.asarray(tau))

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, *SHAPE[:2], CHANNELS)))

    def update(self, x):
        self.v.value = jnp.exp(-1 / self.tau.value) * self.v.value + self.conv(x)
        return self.v.value


def _leaky_data():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(T, BATCH, *SHAPE))),
            jnp.asarray(rng.normal(size=(T, BATCH, *SHAPE[:2], CHANNELS))))


def _square(out, target):
    return jnp.sum((out - target) ** 2)


def test_decays_follow_a_time_constant_that_changes_between_calls():
    model = LeakyConv(8.0)
    xs, ts = _leaky_data()
    es, bptt = bc.ES_D_RTRL(model), bc.BPTT(model)
    for tau in (8.0, 3.0, 20.0):
        model.tau.value = jnp.asarray(tau)
        _, grads = es.value_and_grad(_square, xs, ts)
        _, exact = bptt.value_and_grad(_square, xs, ts)
        for g, e in zip(_leaves(grads), _leaves(exact)):
            assert rel_err(g, e) < EXACT, f'tau {tau}: {rel_err(g, e):.2e} from BPTT'
        assert reported_decays(es.report()) == [pytest.approx(math.exp(-1 / tau), abs=5e-5)]


def test_decays_follow_the_time_constant_in_an_advance_run():
    """Each chunk's input traces decay with the decay of its own parameters: a run whose
    tau changes between chunks equals the same steps unrolled with those decays."""
    model = LeakyConv(8.0)
    xs, ts = _leaky_data()
    es = bc.ES_D_RTRL(model)
    es.reset(BATCH)
    es.advance(_square, xs[:3], ts[:3])
    model.tau.value = jnp.asarray(3.0)
    es.advance(_square, xs[3:], ts[3:])
    assert reported_decays(es.report()) == [pytest.approx(math.exp(-1 / 3), abs=5e-5)]


def test_a_trainer_reports_the_decay_of_the_trained_time_constant():
    class Net(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            brainstate.random.seed(0)
            self.conv = bc.nn.Conv2d(2, 3, 3, layout='channels_last')
            self.lif = bc.nn.LIF((4, 4, 3), tau=10.0, trainable=('tau',))
            self.readout = bc.nn.Linear(48, 3)

        def update(self, x):
            return self.readout(self.lif(self.conv(x)).reshape(x.shape[0], -1))

    net = Net()
    learner = bc.ES_D_RTRL(net)
    trainer = bc.Trainer(learner, optax.adam(0.1))
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.random((T, 8, *SHAPE)) < 0.5, jnp.float64)
    labels = jnp.asarray(rng.integers(0, 3, (8,)))
    for _ in range(3):
        trainer.train_batch(xs, labels)
    tau = float(net.lif.tau.value)
    assert abs(tau - 10.0) > 1e-3, tau      # it trained
    trainer.value_and_grad(xs, labels)      # a call with the trained parameters
    assert reported_decays(learner.report(), 'conv.weight') == [
        pytest.approx(math.exp(-1 / tau), abs=5e-5)]
