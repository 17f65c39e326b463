"""Surrogate spike functions: forward, gradients, defaults and accuracy far from threshold."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

from braintrace_conv.nn import surrogate


@pytest.fixture(autouse=True)
def _seed():
    brainstate.random.seed(0)


# =========================================================================== surrogates
SURROGATES = [
    (surrogate.sigmoid, lambda a, x: a * (1 / (1 + np.exp(-a * x))) * (1 - 1 / (1 + np.exp(-a * x)))),
    (surrogate.arctan, lambda a, x: (a / 2) / (1 + (np.pi / 2 * a * x) ** 2)),
    (surrogate.fast_sigmoid, lambda a, x: 1 / (1 + a * np.abs(x)) ** 2),
]


XS = np.concatenate([np.linspace(-3, 3, 241), [0.0, 1e-6, -1e-6, 10.0, -10.0]]).astype(np.float32)


def test_heaviside_forward():
    np.testing.assert_array_equal(surrogate.heaviside(XS), (XS >= 0).astype(np.float32))
    assert surrogate.heaviside(jnp.array([0, -1, 2])).dtype == jnp.result_type(float)


@pytest.mark.parametrize('factory, formula', SURROGATES)
@pytest.mark.parametrize('alpha', [0.5, 2.0, 4.0, 10.0])
def test_surrogate_forward_and_gradient(factory, formula, alpha):
    fn = factory(alpha)
    np.testing.assert_array_equal(fn(XS), (XS >= 0).astype(np.float32))
    grad = jax.jit(jax.vmap(jax.grad(fn)))(XS)
    np.testing.assert_allclose(grad, formula(alpha, XS.astype(np.float64)), rtol=2e-5, atol=1e-7)
    # forward mode gives the same elementwise derivative, and the Jacobian is diagonal
    _, tangent = jax.jvp(fn, (XS,), (np.ones_like(XS),))
    np.testing.assert_allclose(tangent, grad, rtol=1e-6)
    jac = jax.jacfwd(fn)(XS[:7])
    np.testing.assert_allclose(jac, np.diag(np.diag(jac)))


def test_sigmoid_surrogate_keeps_relative_accuracy_far_from_threshold():
    # tiny but non-zero far from threshold, on both sides (no cancellation in 1 - S(z))
    x = np.array([-20.0, -5.0, 5.0, 20.0], np.float32)
    grad = jax.vmap(jax.grad(surrogate.sigmoid(4.0)))(x)
    z = 4.0 * x.astype(np.float64)
    reference = 4.0 / (1 + np.exp(-z)) / (1 + np.exp(z))
    assert np.all(np.asarray(grad) > 0)
    np.testing.assert_allclose(grad, reference, rtol=1e-5)


def test_surrogate_defaults_peaks_and_validation():
    assert surrogate.sigmoid() == surrogate.Sigmoid(4.0)
    assert hash(surrogate.arctan(3.0)) == hash(surrogate.Arctan(3.0))
    assert surrogate.sigmoid(4.0) != surrogate.arctan(4.0)
    assert float(jax.grad(surrogate.sigmoid(4.0))(0.0)) == pytest.approx(1.0)
    assert float(jax.grad(surrogate.arctan(2.0))(0.0)) == pytest.approx(1.0)
    for bad in (0.0, -1.0, float('nan'), '4', True):
        with pytest.raises(ValueError, match='alpha'):
            surrogate.Sigmoid(bad)
    with pytest.raises(u.DimensionMismatchError, match='dimensionless'):
        surrogate.sigmoid()(1.0 * u.mV)
    ratio = jnp.array([-2.0, 2.0]) * u.mV / (1.0 * u.volt)  # dimensionless quantity
    np.testing.assert_array_equal(surrogate.sigmoid()(ratio), [0.0, 1.0])
