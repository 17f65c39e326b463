"""A group's timescales (``spectrum.py``): the modes of a mean state Jacobian and the input
filters that rebuild its powers, ``Dbar^n = sum_c C_c h_c(n)``, for diagonal, coupled,
complex, defective and merged cases; and ``Dbar`` of a model at rest (float64)."""
import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

from braintrace_conv.executors._analysis import spectrum
from braintrace_conv.executors._analysis.graph import analyse
from braintrace_conv.executors._analysis.step import capture_step
from user_models import OneLayer

pytestmark = pytest.mark.usefixtures('float64')


def impulse_responses(filters, steps):
    """``sum_c C_c u_c^t`` for an input 1 at step 0, from the filters' own recursions."""
    u = {f.key: 0.0 for f, _ in filters}
    out = []
    for t in range(steps):
        u = {f.key: sum(c * u[key] for c, key in f.reads())
             + (float(t == 0) if f.takes_input else 0.0) for f, _ in filters}
        out.append(sum(C * u[f.key] for f, C in filters))
    return out


CASES = {   # name: (Dbar, decays as a report prints them)
    'diagonal (ALIF at rest)': (np.diag([0.95, 0.9995]), ['0.95', '0.9995']),
    'coupled (CubaLIF)': (np.array([[0.8, 0.0], [0.8, 0.9]]), ['0.9', '0.8']),
    'complex pair': (np.array([[0.9, -0.2], [0.3, 0.85]]), ['0.875±0.2437i']),
    'Jordan chain': (np.array([[0.9, 0.0], [0.9, 0.9]]),
                     ['0.9 (a Jordan chain of 2: 2 cascaded traces)']),
    'chain of three': (np.array([[0.7, 0, 0], [1, 0.7, 0], [0, 1, 0.7]]),
                       ['0.7 (a Jordan chain of 3: 3 cascaded traces)']),
    'three coupled': (np.array([[0.5, 0.1, 0.0], [0.2, 0.7, 0.1], [0.0, 0.3, 0.6]]),
                      ['0.8669', '0.5476', '0.3855']),
    'one decay': (0.9 * np.eye(2), ['0.9']),
    'running mean (IF)': (np.eye(1), ['1']),
}


@pytest.mark.parametrize('name', CASES)
def test_the_filters_rebuild_every_power_of_the_mean_jacobian(name):
    Dbar, described = CASES[name]
    found = spectrum.modes(Dbar)
    assert [mode.describe() for mode in found] == described
    for n, got in enumerate(impulse_responses(spectrum.filters(found), 15)):
        np.testing.assert_allclose(got, np.linalg.matrix_power(Dbar, n), atol=1e-12, rtol=0)


def test_decays_within_the_tolerance_are_one():
    found = spectrum.modes(np.diag([0.9, 0.9 + 1e-8, 0.5]))
    assert len(found) == 2 and found[0].decay.real == pytest.approx(0.9 + 5e-9, abs=1e-15)
    np.testing.assert_array_equal(found[0].projector, np.diag([1.0, 1.0, 0.0]))
    assert len(spectrum.modes(np.diag([0.9, 0.9 + 1e-4]))) == 2


def test_a_diagonal_matrix_gives_its_entries_and_coordinate_selectors_exactly():
    decays = [np.exp(-1 / 20), np.exp(-1 / 2000)]
    found = spectrum.modes(np.diag(decays))
    assert [mode.decay.real for mode in found] == decays
    assert [mode.order for mode in found] == [1, 1]
    np.testing.assert_array_equal(found[1].projector, np.diag([0.0, 1.0]))


def test_one_decay_with_the_whole_state_is_single():
    assert spectrum.is_single(spectrum.modes(np.eye(1) * 0.9), 1)
    assert spectrum.is_single(spectrum.single_decay(0.8, 2), 2)
    assert not spectrum.is_single(spectrum.modes(np.diag([0.9, 0.5])), 2)
    assert not spectrum.is_single(spectrum.modes(CASES['Jordan chain'][0]), 2)


def test_the_mean_jacobian_of_an_adaptive_neuron_at_rest():
    """Reset-after-spike ALIF of the user models, ``v = 0.9 h + y - 0.5 a``, ``a' = 0.8 a +
    s``: cut at ``(a', v)``, the spike held, so the adaptation pulls on the membrane and
    not back."""
    model = OneLayer('alif-reset')
    brainstate.nn.init_all_states(model, 2)
    graph = analyse(capture_step(model, jnp.zeros((2, 6, 6, 2))))
    assert graph.groups[0].names == ['a', 'h']
    (Dbar,) = spectrum.mean_state_jacobians(graph)
    np.testing.assert_allclose(Dbar, [[0.8, 0.0], [-0.5, 0.9]], rtol=0, atol=1e-15)
    assert [mode.describe() for mode in spectrum.modes(Dbar)] == ['0.9', '0.8']
