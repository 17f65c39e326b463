"""The plotting helpers draw exactly the data they are given and reject bad input by name."""
import math

import matplotlib

matplotlib.use('Agg')

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import saiunit as u  # noqa: E402

from braintrace_conv import plot  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close('all')


def _events(T=5, H=4, W=6, seed=0):
    return np.random.default_rng(seed).integers(0, 2, (T, 2, H, W)).astype(np.float32)


# ----------------------------------------------------------------------------- event frames
def test_event_frames_draws_on_minus_off_per_requested_step():
    events = _events()
    fig = plot.event_frames(events, steps=[0, 3, 4], ncols=2)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3 and len(fig.axes) == 4            # 2 x 2 grid, one left empty
    for img, s in zip(images, [0, 3, 4]):
        np.testing.assert_array_equal(img.get_array(), events[s, 0] - events[s, 1])
    assert [ax.get_title() for ax in fig.axes[:3]] == ['step 0', 'step 3', 'step 4']


def test_event_frames_titles_carry_the_time_unit():
    fig = plot.event_frames(_events(T=3), dt=2 * u.ms)
    assert [ax.get_title() for ax in fig.axes] == ['t = 0 ms', 't = 2 ms', 't = 4 ms']


@pytest.mark.parametrize('events, kwargs, match', [
    (np.zeros((5, 3, 4, 4)), {}, r'\(T, 2, H, W\)'),
    (np.zeros((5, 4, 4)), {}, 'events must have 4 dimensions'),
    (np.zeros((5, 2, 4, 4)), dict(steps=[5]), r'steps .* \[0, 5\)'),
    (np.zeros((5, 2, 4, 4)), dict(ncols=0), 'ncols must be a positive int'),
    (np.zeros((5, 2, 4, 4)), dict(dt=-1.0), 'dt must be a positive number'),
])
def test_event_frames_rejects_bad_input(events, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot.event_frames(events, **kwargs)
    assert not plt.get_fignums()                     # nothing drawn for bad input


# ----------------------------------------------------------------------------- raster
def test_spike_raster_places_one_dot_per_spike():
    spikes = np.zeros((6, 2, 3))
    spikes[1, 0, 2] = spikes[4, 1, 0] = spikes[4, 1, 2] = 1
    ax = plot.spike_raster(spikes, dt=0.5)
    np.testing.assert_array_equal(ax.collections[0].get_offsets(),
                                  [[0.5, 2], [2.0, 3], [2.0, 5]])
    assert ax.get_xlabel() == 'time (ms)' and ax.get_ylim() == (-0.5, 5.5)


def test_spike_raster_keeps_only_the_first_neurons():
    spikes = np.ones((3, 10))
    ax = plot.spike_raster(spikes, max_neurons=4)
    assert len(ax.collections[0].get_offsets()) == 12 and ax.get_xlabel() == 'time step'


@pytest.mark.parametrize('spikes, kwargs, err, match', [
    (np.zeros(5), {}, ValueError, r'spikes must be \(T, N\) or \(T, \*neuron_shape\)'),
    (np.zeros((5, 3)), dict(max_neurons=0), ValueError, 'max_neurons'),
    (np.array([['a']]), {}, TypeError, 'numeric'),
    (np.zeros((5, 3)), dict(dt=1 * u.mV), u.DimensionMismatchError, 'dt must be a time'),
])
def test_spike_raster_rejects_bad_input(spikes, kwargs, err, match):
    with pytest.raises(err, match=match):
        plot.spike_raster(spikes, **kwargs)
    assert not plt.get_fignums()                     # nothing drawn for bad input


# ----------------------------------------------------------------------------- membrane
def test_membrane_trace_draws_each_neuron_in_the_unit_of_v():
    v = np.linspace(0, 2, 8).reshape(4, 2) * u.mV
    spikes = np.array([[0, 0], [0, 1], [1, 0], [0, 0]])
    ax = plot.membrane_trace(v, threshold=1000 * u.uvolt, spikes=spikes, dt=1 * u.ms,
                             labels=['a', 'b'])
    traces = ax.lines[:2]
    for k, line in enumerate(traces):
        np.testing.assert_allclose(line.get_ydata(), u.get_mantissa(v)[:, k])
        np.testing.assert_array_equal(line.get_xdata(), [0, 1, 2, 3])
    threshold = ax.lines[2]
    np.testing.assert_allclose(threshold.get_ydata(), [1.0, 1.0])      # 1000 uV in mV
    marks = [line.get_ydata() for line in ax.lines[3:]]
    np.testing.assert_allclose(np.concatenate(marks), u.get_mantissa(v)[[2, 1], [0, 1]])
    assert ax.get_ylabel() == 'V (mV)' and ax.get_xlabel() == 'time (ms)'


def test_membrane_trace_of_one_plain_neuron():
    ax = plot.membrane_trace(np.arange(5.0), threshold=2.0)
    assert len(ax.lines[0].get_ydata()) == 5 and ax.get_ylabel() == 'V'


def test_membrane_trace_names_other_states_with_their_unit():
    ax = plot.membrane_trace(np.ones((3, 2)) * u.nA, ylabel='I')
    assert ax.get_ylabel() == 'I (nA)'


@pytest.mark.parametrize('v, kwargs, err, match', [
    (np.zeros((4, 2)) * u.mV, dict(threshold=1 * u.ms), u.DimensionMismatchError,
     'threshold must have the unit of v'),
    (np.zeros((4, 2)), dict(threshold=1 * u.mV), u.DimensionMismatchError, 'plain array'),
    (np.zeros((4, 2)), dict(spikes=np.zeros((4, 3))), ValueError, 'spikes must have the shape'),
    (np.zeros((4, 2)), dict(labels=['a']), ValueError, 'labels must name the 2 traces'),
    (np.zeros((4, 2, 2)), {}, ValueError, 'v must have 1 or 2 dimensions'),
])
def test_membrane_trace_rejects_bad_input(v, kwargs, err, match):
    with pytest.raises(err, match=match):
        plot.membrane_trace(v, **kwargs)
    assert not plt.get_fignums()                     # nothing drawn for bad input


# ----------------------------------------------------------------------------- curves
def test_learning_curve_plots_the_keys_present():
    history = [dict(epoch=1, train_loss=2.0, train_accuracy=0.3),
               dict(epoch=2, train_loss=1.5, train_accuracy=0.5, test_accuracy=0.4)]
    fig = plot.learning_curve(history)
    loss_ax, acc_ax = fig.axes
    assert len(loss_ax.lines) == 1                                  # no test_loss anywhere
    np.testing.assert_array_equal(loss_ax.lines[0].get_ydata(), [2.0, 1.5])
    train_acc, test_acc = acc_ax.lines
    np.testing.assert_array_equal(test_acc.get_xdata(), [2])
    assert acc_ax.get_ylim() == (0, 1.02)
    assert all(float(t).is_integer() for t in loss_ax.get_xticks())   # epochs are whole


def test_learning_curve_with_custom_keys():
    history = [dict(update=k, loss=1 / (k + 1)) for k in range(4)]
    fig = plot.learning_curve(history, x='update', panels=[['loss']])
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [1, 1 / 2, 1 / 3, 1 / 4])


@pytest.mark.parametrize('history, kwargs, match', [
    ([], {}, 'non-empty sequence of dicts'),
    ([dict(train_loss=1.0)], {}, "x key 'epoch'"),
    ([dict(epoch=1, loss=1.0)], {}, 'no record of history has any of the keys'),
])
def test_learning_curve_rejects_bad_input(history, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot.learning_curve(history, **kwargs)
    assert not plt.get_fignums()                     # nothing drawn for bad input


# ----------------------------------------------------------------------------- fidelity
def test_gradient_fidelity_measures_each_parameter():
    ref = {('conv', 'weight'): np.array([[1.0, 0.0], [0.0, 1.0]]), ('fc', 'bias'): np.ones(3)}
    grads = {('conv', 'weight'): np.array([[1.0, 1.0], [0.0, 1.0]]), ('fc', 'bias'): np.ones(3)}
    fid = plot.gradient_fidelity(grads, ref)
    assert fid['fc.bias'] == dict(cosine=pytest.approx(1.0), relative_error=0.0)
    assert fid['conv.weight']['cosine'] == pytest.approx(2 / (math.sqrt(3) * math.sqrt(2)))
    assert fid['conv.weight']['relative_error'] == pytest.approx(1 / math.sqrt(2))


def test_gradient_fidelity_of_a_zero_reference_is_nan():
    fid = plot.gradient_fidelity({'w': np.ones(2)}, {'w': np.zeros(2)})
    assert math.isnan(fid['w']['cosine']) and math.isnan(fid['w']['relative_error'])


@pytest.mark.parametrize('grads, ref, match', [
    ({'a': np.ones(2)}, {'b': np.ones(2)}, 'same parameters; only in grads'),
    ({'a': np.ones(2)}, {'a': np.ones(3)}, 'a has 2 entries, the reference 3'),
])
def test_gradient_fidelity_rejects_mismatched_gradients(grads, ref, match):
    with pytest.raises(ValueError, match=match):
        plot.gradient_fidelity(grads, ref)


def test_fidelity_bars_one_group_per_method():
    fid = {'exact': {'w': dict(cosine=1.0, relative_error=0.0),
                     'b': dict(cosine=1.0, relative_error=1e-9)},
           'approx': {'w': dict(cosine=0.9, relative_error=0.3),
                      'b': dict(cosine=0.99, relative_error=0.05)}}
    ax = plot.fidelity_bars(fid)
    exact, approx = ax.containers
    np.testing.assert_allclose([b.get_height() for b in exact], [1e-17, 1e-9])  # 0 clipped
    np.testing.assert_allclose([b.get_height() for b in approx], [0.3, 0.05])
    assert ax.get_yscale() == 'log'
    ax = plot.fidelity_bars(fid, metric='cosine')
    np.testing.assert_allclose([b.get_height() for b in ax.containers[1]], [0.9, 0.99])


@pytest.mark.parametrize('fid, kwargs, match', [
    ({}, {}, 'fidelity is empty'),
    ({'a': {'w': dict(cosine=1.0, relative_error=0.0)}}, dict(metric='l2'), 'metric must be'),
    ({'a': {'w': dict(cosine=1, relative_error=0)}, 'b': {'v': dict(cosine=1, relative_error=0)}},
     {}, "method 'b' lists parameters"),
])
def test_fidelity_bars_rejects_bad_input(fid, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot.fidelity_bars(fid, **kwargs)
    assert not plt.get_fignums()                     # nothing drawn for bad input
