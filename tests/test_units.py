"""Units around unit-free primitives: split, join, and a bias expressed in the output's unit."""
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

from braintrace_conv.units import bias_in_unit, join_unit, split_unit


def test_split_and_join_are_inverse_and_plain_arrays_stay_plain():
    mantissa, unit = split_unit(jnp.arange(3.0) * u.mV, 'x')
    np.testing.assert_array_equal(mantissa, [0.0, 1.0, 2.0])
    assert unit == u.mV
    back = join_unit(mantissa, unit)
    assert isinstance(back, u.Quantity) and u.get_unit(back) == u.mV
    plain, none = split_unit(jnp.ones(2), 'x')
    assert none.dim.is_dimensionless and not isinstance(join_unit(plain, none), u.Quantity)


def test_a_value_that_is_not_an_array_is_named():
    with pytest.raises(TypeError, match='kernel must be an array or a saiunit quantity, got '
                                        'str'):
        split_unit('weights', 'kernel')


def test_a_bias_is_expressed_in_the_output_unit():
    bias = bias_in_unit(jnp.array([1.0, 2.0]) * u.mV, u.volt, (2,), jnp.float32)
    np.testing.assert_allclose(bias, [1e-3, 2e-3], rtol=1e-6)
    assert bias.dtype == jnp.float32
    assert bias_in_unit(jnp.zeros(3), u.UNITLESS, (3,), jnp.float32).shape == (3,)
    with pytest.raises(ValueError, match=r'bias must have shape \(3,\) \(one value per output '
                                         r'channel\), got \(2,\)'):
        bias_in_unit(jnp.zeros(2), u.UNITLESS, (3,), jnp.float32)
    with pytest.raises(ValueError, match='bias has unit ms but the output has unit V'):
        bias_in_unit(jnp.zeros(2) * u.ms, u.volt, (2,), jnp.float32)
