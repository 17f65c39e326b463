"""Parameters with saiunit units through the Trainer: gradients in 1/unit, updates on mantissas.

Reference: a unit-carrying conv (weights in mV) -> LIF (V_th = 1 mV, tau = 10 ms) ->
readout model and its unitless twin (same numbers, V_th = 1, tau = 10) have the same
dynamics, so every gradient mantissa and every update must agree to rounding.
"""
import brainstate
import numpy as np
import optax
import pytest
import saiunit as u

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.data import moving_bars
from braintrace_conv.training import CheckpointError, Trainer

T, SIZE = 6, (8, 8)


class ConvLIFReadout(brainstate.nn.Module):
    def __init__(self, unit):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, layout='channels_first',
                              w_init=nn.FanInNormal(4.0, unit=unit))
        with_unit = (lambda v: v * unit) if unit is not None else (lambda v: v)
        tau = 10 * u.ms if unit is not None else 10.0
        self.lif = nn.LIF((3,) + SIZE, tau=tau, V_th=with_unit(1.0))
        self.flat = nn.Flatten()
        self.readout = nn.Linear(3 * SIZE[0] * SIZE[1], 8)

    def update(self, x):
        return self.readout(self.flat(self.lif(self.conv(x))))


def build(unit, optimizer, **kwargs):
    brainstate.random.seed(0)
    return Trainer(bc.ES_D_RTRL(ConvLIFReadout(unit), float(np.exp(-0.1))), optimizer, **kwargs)


def pair(optimizer, **kwargs):
    """(unit trainer, unitless twin trainer) with identical numbers."""
    return build(u.mV, optimizer, **kwargs), build(None, optimizer, **kwargs)


def values(trainer):
    return {k: st.value for k, st in trainer.model.states(brainstate.ParamState).items()}


@pytest.fixture(scope='module')
def data():
    return moving_bars(24, T=T, size=SIZE, seed=1)


def test_gradients_are_in_inverse_parameter_units_and_match_the_unitless_twin(data):
    with_units, plain = pair(optax.sgd(0.1))
    xs, labels = next(data.batches(8, shuffle=False))
    loss_u, grads_u = with_units.value_and_grad(xs, labels)
    loss_p, grads_p = plain.value_and_grad(xs, labels)
    assert loss_u == pytest.approx(loss_p, rel=1e-12)
    for key in (('conv', 'weight'), ('conv', 'bias')):
        assert u.get_unit(grads_u[key]) == u.mV ** -1
        assert u.get_unit(values(with_units)[key]) == u.mV
    for key, g in grads_p.items():
        assert not isinstance(g, u.Quantity)
        np.testing.assert_allclose(u.get_mantissa(grads_u[key]), g, rtol=1e-10, atol=1e-14)
    # the same gradient in 1/V is the per-mV value divided by 1000
    per_volt = grads_u['conv', 'weight'].in_unit(u.volt ** -1)
    np.testing.assert_allclose(u.get_mantissa(per_volt),
                               1e3 * u.get_mantissa(grads_u['conv', 'weight']), rtol=1e-12)


@pytest.mark.parametrize('update_every', [None, 3])
def test_units_train_through_fit_like_the_unitless_twin(data, update_every):
    # SGD is not scale-free: equal updates show it acts on mantissas in each parameter's unit
    with_units, plain = pair(optax.sgd(0.5), update_every=update_every)
    for trainer in (with_units, plain):
        trainer.fit(data, epochs=1, batch_size=8, progress=False)
    assert with_units.updates == plain.updates == (3 if update_every is None else 6)
    assert with_units.history[0]['train_loss'] == pytest.approx(
        plain.history[0]['train_loss'], rel=1e-10)
    after_u, after_p = values(with_units), values(plain)
    assert u.get_unit(after_u['conv', 'weight']) == u.mV
    for key, v in after_p.items():
        np.testing.assert_allclose(u.get_mantissa(after_u[key]), v, rtol=1e-10, atol=1e-14)
    brainstate.random.seed(0)
    initial = ConvLIFReadout(u.mV).conv.weight.value
    assert not np.allclose(u.get_mantissa(initial), u.get_mantissa(after_u['conv', 'weight']))


def test_apply_gradients_accepts_any_unit_of_the_inverse_dimension(data):
    xs, labels = next(data.batches(8, shuffle=False))
    reference, per_volt, plain = (build(u.mV, optax.sgd(0.5)) for _ in range(3))
    _, grads = reference.value_and_grad(xs, labels)
    g = grads['conv', 'weight']
    as_per_volt = dict(grads)
    as_per_volt['conv', 'weight'] = g.in_unit(u.volt ** -1)
    as_plain = {k: u.get_mantissa(v) for k, v in grads.items()}     # dL/dw on the mantissas
    assert reference.apply_gradients(grads)
    assert per_volt.apply_gradients(as_per_volt)
    assert plain.apply_gradients(as_plain)
    want = values(reference)
    for trainer in (per_volt, plain):
        for key, v in values(trainer).items():
            assert u.get_unit(v) == u.get_unit(want[key])
            np.testing.assert_allclose(u.get_mantissa(v), u.get_mantissa(want[key]), rtol=1e-12)


@pytest.mark.parametrize('unit', [u.ms, u.mV, u.UNITLESS])
def test_gradient_in_a_wrong_unit_is_refused_and_changes_nothing(data, unit):
    trainer = build(u.mV, optax.sgd(0.5))
    before = trainer.params()
    xs, labels = next(data.batches(8, shuffle=False))
    _, grads = trainer.value_and_grad(xs, labels)
    grads['conv', 'weight'] = u.Quantity(u.get_mantissa(grads['conv', 'weight']), unit=unit)
    with pytest.raises(ValueError, match=r'gradient of conv.weight must be in 1 / mV \(dL/dconv'
                                         r'.weight of a dimensionless loss\), got unit'):
        trainer.apply_gradients(grads)
    after = trainer.params()
    assert all(np.array_equal(before[k], after[k]) for k in before) and trainer.updates == 0


def test_unit_checkpoint_loads_with_units_and_refuses_a_unitless_model(data, tmp_path):
    trainer, twin = pair(optax.adam(1e-2))
    trainer.fit(data, epochs=1, batch_size=8, progress=False)
    trainer.save_checkpoint(tmp_path / 'u.npz')
    brainstate.random.seed(3)
    fresh = Trainer(bc.BPTT(ConvLIFReadout(u.mV)))          # inference only: no optimiser
    fresh.load_params(tmp_path / 'u.npz')
    for key, v in values(trainer).items():
        got = values(fresh)[key]
        assert u.get_unit(got) == u.get_unit(v)
        np.testing.assert_array_equal(u.get_mantissa(got), u.get_mantissa(v))
    before = {k: np.asarray(v) for k, v in values(twin).items()}
    with pytest.raises(CheckpointError, match="conv.bias .* is in unit 'mV', the model has '1'"):
        twin.load_params(tmp_path / 'u.npz')
    assert all(np.array_equal(before[k], np.asarray(v)) for k, v in values(twin).items())


def test_scores_with_a_unit_are_refused_before_training(data):
    class MilliVoltScores(ConvLIFReadout):
        def update(self, x):
            return super().update(x) * u.mV

    brainstate.random.seed(0)
    trainer = Trainer(bc.BPTT(MilliVoltScores(u.mV)), optax.adam(1e-2))
    with pytest.raises(ValueError, match='dimensionless class scores, got unit mV'):
        trainer.fit(data, epochs=1, batch_size=8, progress=False)
    assert trainer.updates == 0 and trainer.epoch == 0
