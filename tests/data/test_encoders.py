"""Spike encoders against plain numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from braintrace_conv.data import encoders


def test_rate_is_bernoulli_with_the_given_probability_and_key():
    x = jnp.asarray([[0.0, 0.25, 0.5, 1.0]])
    s = encoders.rate(x, 4000, jax.random.PRNGKey(0), gain=0.8)
    assert s.shape == (4000, 1, 4) and s.dtype == x.dtype
    assert set(np.unique(np.asarray(s))) <= {0.0, 1.0}
    rates = np.asarray(s).mean(axis=0)[0]
    np.testing.assert_allclose(rates, 0.8 * np.asarray(x[0]), atol=0.03)
    assert rates[0] == 0 and rates[-1] > 0.75
    np.testing.assert_array_equal(s, encoders.rate(x, 4000, jax.random.PRNGKey(0), gain=0.8))
    assert not np.array_equal(s, encoders.rate(x, 4000, jax.random.PRNGKey(1), gain=0.8))
    assert encoders.rate(np.ones((2, 3, 4, 4), np.uint8), 5, jax.random.key(0)).shape == \
        (5, 2, 3, 4, 4)


def _latency_reference(x, T, code, threshold, tau):
    out = np.zeros((T,) + x.shape)
    for idx, v in np.ndenumerate(x):
        if v <= threshold:
            continue
        t = round((1 - v) * (T - 1)) if code == 'linear' else round(tau * np.log(v / (v - threshold)))
        if t < T:
            out[(t,) + idx] = 1
    return out


@pytest.mark.parametrize('code', ['linear', 'log'])
def test_latency_matches_reference(code):
    x = np.random.default_rng(0).random((3, 2, 5))
    x[0, 0, :3] = [0.0, 0.01, 1.0]
    s = encoders.latency(x, 8, code=code, threshold=0.05, tau=2.0)
    np.testing.assert_array_equal(s, _latency_reference(x, 8, code, 0.05, 2.0))
    assert np.asarray(s).sum(axis=0).max() == 1
    if code == 'linear':
        assert s[0, 0, 0, 2] == 1      # x = 1 fires at step 0


def test_delta_on_off_and_initial():
    xs = np.array([[0.0, 0.5], [0.3, 0.5], [0.1, 0.9], [0.1, 0.2]])[:, None, :]   # (T, B=1, 2)
    d = np.diff(xs, axis=0, prepend=np.zeros((1, 1, 2)))
    s = encoders.delta(xs, 0.2)
    assert s.shape == (4, 1, 2, 2)
    np.testing.assert_array_equal(s[:, :, 0], d >= 0.2)
    np.testing.assert_array_equal(s[:, :, 1], d <= -0.2)
    on = encoders.delta(xs, 0.2, off_spikes=False, initial=xs[0])
    np.testing.assert_array_equal(on[0], 0)
    np.testing.assert_array_equal(on, s[:, :, 0] * (np.arange(4) > 0)[:, None, None])


def test_encoder_argument_errors():
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match=r'x must hold intensities in \[0, 1\]'):
        encoders.rate(jnp.asarray([[1.5]]), 3, key)
    with pytest.raises(ValueError, match=r'gain must be a number in \(0, 1\], got 2.0'):
        encoders.rate(jnp.asarray([[0.5]]), 3, key, gain=2.0)
    with pytest.raises(ValueError, match='num_steps must be a positive int'):
        encoders.latency(jnp.asarray([[0.5]]), 0)
    with pytest.raises(ValueError, match="code must be one of"):
        encoders.latency(jnp.asarray([[0.5]]), 4, code='exp')
    with pytest.raises(ValueError, match=r'xs must have at least 2 axes \(T, B, ...\)'):
        encoders.delta(jnp.asarray([0.5, 0.2]))
    with pytest.raises(ValueError, match='threshold must be a positive number'):
        encoders.delta(jnp.zeros((3, 1)), 0.0)


def test_nonfinite_inputs_are_named_never_dropped():
    key, x = jax.random.key(0), np.array([[0.5, np.nan, 0.2]])
    for encode in (lambda: encoders.rate(x, 3, key), lambda: encoders.latency(x, 3)):
        with pytest.raises(ValueError, match=r'^x must be finite, got nan at b=0, axis 1=1 \(1 '
                                             r'non-finite value\(s\) in all\)\.$'):
            encode()
    xs = np.zeros((4, 1, 2))
    xs[2, 0, 1] = -np.inf
    with pytest.raises(ValueError, match=r'^xs must be finite, got -inf at t=2, b=0, axis 2=1'):
        encoders.delta(xs)
    with pytest.raises(ValueError, match='^initial must be finite, got nan at '):
        encoders.delta(np.zeros((4, 1, 2)), initial=[0.0, np.nan])
    with pytest.raises(ValueError, match=r'^x must hold intensities in \[0, 1\], got values in '
                                         r'\[-0.5, 0.5\]; scale the data first\.$'):
        encoders.rate(np.array([[-0.5, 0.5]]), 3, key)
    with pytest.raises(ValueError, match=r'^threshold must be a number in \[0, 1\), got nan\.$'):
        encoders.latency(np.array([[0.5]]), 3, threshold=np.nan)


def test_a_log_code_under_which_nothing_could_spike_is_refused():
    x = np.array([[1.0, 0.5]])
    # the earliest spike (x = 1) is at round(tau ln(1 / (1 - threshold))): 99.5 * 0.01005 = 1
    assert encoders.latency(x, 2, code='log', tau=99.5).sum() == 1
    for tau in (150.0, 1e300):
        with pytest.raises(ValueError, match=r"^tau must be below 149.2 for code='log', "
                                             r'threshold 0.01 and num_steps 2, got'):
            encoders.latency(x, 2, code='log', tau=tau)
    with pytest.raises(ValueError, match=r'^tau must be a positive number, got inf\.$'):
        encoders.latency(x, 2, code='log', tau=np.inf)
    assert encoders.latency(x, 2, code='linear', tau=1e300).sum() == 2     # tau: log code only
