r"""Figures for event data, spiking activity, training runs and gradient fidelity.

Every function draws with matplotlib and returns what it drew on (a
:class:`~matplotlib.figure.Figure` or :class:`~matplotlib.axes.Axes`), so the
caller can restyle or save it. Nothing needs a display: headless, matplotlib
falls back to its Agg backend. Functions that take ``ax=None`` open a new
figure through :mod:`matplotlib.pyplot` (so notebooks show it); pass an
``Axes`` to draw into an existing figure.

Time axes: ``dt=None`` labels the axis in steps; a number is the step length
in ms; a :mod:`saiunit` time quantity (``1 * u.ms``) sets the unit of the axis.
Voltages may be saiunit quantities: the axis is labelled with their unit.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import jax
import numpy as np
import saiunit as u
from matplotlib.ticker import MaxNLocator

from ._validation import positive

__all__ = ['event_frames', 'spike_raster', 'membrane_trace', 'learning_curve',
           'gradient_fidelity', 'fidelity_bars']


# ----------------------------------------------------------------------------- helpers
def _pyplot():
    import matplotlib.pyplot as plt
    return plt


def _new_axes(ax, figsize):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=figsize, layout='constrained')
    return ax


def _array(name: str, value, ndims: Optional[Sequence[int]] = None) -> np.ndarray:
    """``value`` as a float numpy array whose rank is one of ``ndims`` (any rank when
    None); quantities are rejected (callers that accept units strip them first)."""
    if isinstance(value, u.Quantity):
        raise TypeError(f'{name} must be a plain array, got a quantity in {u.get_unit(value)}.')
    arr = np.asarray(value)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f'{name} must be numeric, got dtype {arr.dtype}.')
    if ndims is not None and arr.ndim not in ndims:
        raise ValueError(f'{name} must have {" or ".join(f"{n}" for n in ndims)} dimensions, '
                         f'got shape {arr.shape}.')
    return arr.astype(float)


def _time_axis(num_steps: int, dt) -> tuple[np.ndarray, Optional[str]]:
    """``(times (num_steps,), time unit or None for steps)`` for a step length ``dt``."""
    if dt is None:
        return np.arange(num_steps, dtype=float), None
    if isinstance(dt, u.Quantity):
        u.fail_for_dimension_mismatch(dt, u.ms, 'dt must be a time (e.g. 1 * u.ms)')
        step, unit = float(u.get_mantissa(dt)), str(u.get_unit(dt))
    else:
        step, unit = float(dt), 'ms'
    positive('dt', step, float)
    return np.arange(num_steps) * step, unit


def _time_label(unit: Optional[str]) -> str:
    return 'time step' if unit is None else f'time ({unit})'


def _param_name(key) -> str:
    return '.'.join(map(str, key)) if isinstance(key, tuple) else str(key)


# ----------------------------------------------------------------------------- events
def event_frames(events, *, steps: Optional[Sequence[int]] = None, ncols: int = 8,
                 dt=None, title: Optional[str] = None, panel_size: float = 1.4):
    """A grid of event frames of one sample, ON minus OFF events per pixel.

    Args:
      events (array, shape ``(T, 2, H, W)``): One sample as produced by
        :mod:`braintrace_conv.data`: time steps, polarity (0 = ON, 1 = OFF), rows, columns.
      steps: Which time steps to draw (default: all ``T``).
      ncols: Frames per row.
      dt (None, float or time quantity): Step length, for the panel titles (see the module
        docstring).
      title: Figure title.
      panel_size: Width and height of one frame, inches.

    Returns:
      One axes per drawn step, each an ``(H, W)`` image of ``ON - OFF``
      on a diverging scale shared by all frames (red: ON, blue: OFF).
    """
    events = _array('events', events, (4,))
    if events.shape[1] != 2:
        raise ValueError(f'events must be (T, 2, H, W) with 2 polarity channels, got shape '
                         f'{events.shape}.')
    T = events.shape[0]
    steps = list(range(T)) if steps is None else [int(s) for s in steps]
    if not steps or any(not 0 <= s < T for s in steps):
        raise ValueError(f'steps must be a non-empty list of time steps in [0, {T}), got {steps}.')
    ncols = positive('ncols', ncols)
    times, unit = _time_axis(T, dt)
    diff = events[:, 0] - events[:, 1]
    vmax = max(float(np.abs(diff[steps]).max()), 1.0)
    ncols = min(ncols, len(steps))
    nrows = math.ceil(len(steps) / ncols)
    fig = _pyplot().figure(figsize=(panel_size * ncols, panel_size * nrows + 0.4),
                           layout='constrained')
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, s in zip(axes, steps):
        ax.imshow(diff[s], cmap='RdBu_r', vmin=-vmax, vmax=vmax, interpolation='nearest')
        ax.set_title(f'step {s}' if unit is None else f't = {times[s]:g} {unit}', fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[len(steps):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title)
    return fig


# ----------------------------------------------------------------------------- spikes
def spike_raster(spikes, *, dt=None, max_neurons: Optional[int] = None, ax=None,
                 title: Optional[str] = None, **scatter_kwargs):
    """Spike raster: one dot per (time step, neuron) with a spike.

    Args:
      spikes (array, shape ``(T, N)`` or ``(T, *neuron_shape)``): Spikes of one sample over
        time; any non-zero entry is a spike. Neurons are numbered in row-major order of
        ``neuron_shape``.
      dt (None, float or time quantity): Step length (see the module docstring).
      max_neurons: Draw only neurons ``0 .. max_neurons - 1``.
      ax (matplotlib Axes): Where to draw (default: a new figure).
      title: Axes title.
      **scatter_kwargs: Passed to :meth:`~matplotlib.axes.Axes.scatter`.

    Returns:
      Its first collection holds the ``(num_spikes, 2)`` offsets
      ``(time, neuron index)``.
    """
    spikes = _array('spikes', spikes)
    if spikes.ndim < 2:
        raise ValueError(f'spikes must be (T, N) or (T, *neuron_shape), got shape {spikes.shape}.')
    spikes = spikes.reshape(spikes.shape[0], -1)
    if max_neurons is not None:
        spikes = spikes[:, :positive('max_neurons', max_neurons)]
    times, unit = _time_axis(spikes.shape[0], dt)
    t_idx, n_idx = np.nonzero(spikes)
    ax = _new_axes(ax, (7, 3))
    kwargs = dict(s=10, marker='|', color='k', linewidths=1)
    kwargs.update(scatter_kwargs)
    ax.scatter(times[t_idx], n_idx, **kwargs)
    half = 0.5 * (times[1] - times[0] if len(times) > 1 else 1.0)
    ax.set(xlim=(times[0] - half, times[-1] + half), ylim=(-0.5, spikes.shape[1] - 0.5),
           xlabel=_time_label(unit), ylabel='neuron')
    if title:
        ax.set_title(title)
    return ax


def membrane_trace(v, *, threshold=None, spikes=None, dt=None, labels=None, ax=None,
                   ylabel: str = 'V', title: Optional[str] = None):
    """Membrane potential (or any state, e.g. a synaptic current) of a few neurons over time.

    Args:
      v (array or quantity, shape ``(T,)`` or ``(T, K)``): Potential of ``K`` neurons (one line
        each). A saiunit quantity sets the unit of the axis.
      threshold (float or quantity): Drawn as a dashed line; must have the unit of ``v`` (a
        plain number when ``v`` is plain).
      spikes (array, shape like ``v``): Non-zero entries are marked on the trace.
      dt (None, float or time quantity): Step length (see the module docstring).
      labels (sequence of ``K`` str): Legend entries.
      ax (matplotlib Axes): Where to draw (default: a new figure).
      ylabel: Name on the vertical axis; the unit of ``v`` is appended.
      title: Axes title.

    Returns:
      Its first ``K`` lines are the traces, each with ``T`` points.

    Raises:
      saiunit.DimensionMismatchError: ``threshold`` and ``v`` have different dimensions.
    """
    unit = u.get_unit(v) if isinstance(v, u.Quantity) else None
    raw = _array('v', u.get_mantissa(v) if unit is not None else v, (1, 2))
    values = raw.reshape(raw.shape[0], -1)
    times, time_unit = _time_axis(values.shape[0], dt)
    if labels is not None and len(labels) != values.shape[1]:
        raise ValueError(f'labels must name the {values.shape[1]} traces, got {len(labels)}.')
    level = None
    if threshold is not None:
        if unit is not None:
            u.fail_for_dimension_mismatch(threshold, v, 'threshold must have the unit of v')
            level = float(u.Quantity(threshold).to_decimal(unit))
        elif isinstance(threshold, u.Quantity):
            raise u.DimensionMismatchError(
                f'threshold has unit {u.get_unit(threshold)} but v is a plain array.')
        else:
            level = float(threshold)
    marks = None
    if spikes is not None:
        marks = _array('spikes', spikes, (1, 2))
        if marks.shape != raw.shape:
            raise ValueError(f'spikes must have the shape of v, {raw.shape}, got {marks.shape}.')
        marks = marks.reshape(values.shape)

    ax = _new_axes(ax, (7, 3))
    lines = ax.plot(times, values, lw=1.2)
    if level is not None:
        ax.axhline(level, color='0.4', ls='--', lw=1, label='threshold')
    if marks is not None:
        for k, line in enumerate(lines):
            hit = marks[:, k] != 0
            ax.plot(times[hit], values[hit, k], 'v', color=line.get_color(), ms=5)
    if labels is not None:
        for line, name in zip(lines, labels):
            line.set_label(name)
        ax.legend(handles=lines, fontsize=8)
    ax.set(xlabel=_time_label(time_unit),
           ylabel=ylabel if unit is None else f'{ylabel} ({unit})')
    if title:
        ax.set_title(title)
    return ax


# ----------------------------------------------------------------------------- training
def learning_curve(history: Sequence[Mapping], *, x: str = 'epoch',
                   panels: Sequence[Sequence[str]] = (('train_loss', 'test_loss'),
                                                      ('train_accuracy', 'test_accuracy')),
                   title: Optional[str] = None):
    """Curves of logged quantities, one panel per group of keys.

    Args:
      history: One record per point, e.g. :attr:`braintrace_conv.Trainer.history`
        (keys ``epoch``, ``train_loss``, ``train_accuracy``, ``test_loss``,
        ``test_accuracy``) or any list of dicts of numbers.
      x: Key of the horizontal axis; every record must have it.
      panels: Keys drawn together in one panel. A key absent from every record is
        skipped; a panel with no key present is an error. A panel whose keys
        contain ``accuracy`` gets the range ``[0, 1]``.
      title: Figure title.

    Returns:
      One axes per panel; each line has one point per record holding its key.
    """
    records = list(history)
    if not records or not all(isinstance(r, Mapping) for r in records):
        raise ValueError('history must be a non-empty sequence of dicts (e.g. Trainer.history).')
    if any(x not in r for r in records):
        raise ValueError(f'every record of history must have the x key {x!r}; keys of the first '
                         f'record: {sorted(records[0])}.')
    present = [[k for k in keys if any(k in r for r in records)] for keys in panels]
    for keys, found in zip(panels, present):
        if not found:
            raise ValueError(f'no record of history has any of the keys {list(keys)}.')
    integer_x = all(isinstance(r[x], (int, np.integer)) for r in records)
    fig = _pyplot().figure(figsize=(4.5 * len(panels), 3.2), layout='constrained')
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)).ravel()
    for ax, keys in zip(axes, present):
        if integer_x:                       # epochs, steps: no ticks between them
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for key in keys:
            pts = [(r[x], r[key]) for r in records if key in r]
            ax.plot(*zip(*pts), 'o-', ms=3, label=key.replace('_', ' '))
        ax.set(xlabel=x.replace('_', ' '))
        if any('accuracy' in k for k in keys):
            ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


# ----------------------------------------------------------------------------- gradients
def gradient_fidelity(grads: Mapping, reference: Mapping) -> dict:
    """Cosine similarity and relative error of each parameter's gradient to a reference.

    Args:
      grads, reference: Gradients keyed like ``model.states(brainstate.ParamState)`` (as
        returned by ``learner.value_and_grad``), the reference usually from
        :class:`~braintrace_conv.BPTT`. Each value may be any pytree of arrays.

    Returns:
      ``{name: {'cosine': c, 'relative_error': e}}`` with ``name`` the
      dotted key, ``c = <g, r> / (|g| |r|)`` and ``e = |g - r| / |r|``
      over all entries of the parameter (``nan`` where ``|r| = 0``).
    """
    if set(grads) != set(reference):
        raise ValueError(f'grads and reference must have the same parameters; only in grads: '
                         f'{sorted(map(_param_name, set(grads) - set(reference)))}, only in '
                         f'reference: {sorted(map(_param_name, set(reference) - set(grads)))}.')
    out = {}
    for key in reference:
        g = np.concatenate([np.ravel(a) for a in jax.tree.leaves(grads[key])]).astype(float)
        r = np.concatenate([np.ravel(a) for a in jax.tree.leaves(reference[key])]).astype(float)
        if g.shape != r.shape:
            raise ValueError(f'gradient of {_param_name(key)} has {g.size} entries, the '
                             f'reference {r.size}.')
        norm_g, norm_r = np.linalg.norm(g), np.linalg.norm(r)
        with np.errstate(divide='ignore', invalid='ignore'):
            cosine = float(g @ r / (norm_g * norm_r)) if norm_g and norm_r else math.nan
            rel = float(np.linalg.norm(g - r) / norm_r) if norm_r else math.nan
        out[_param_name(key)] = dict(cosine=cosine, relative_error=rel)
    return out


def fidelity_bars(fidelity: Mapping[str, Mapping[str, Mapping[str, float]]], *,
                  metric: str = 'relative_error', ax=None, title: Optional[str] = None):
    """Grouped bars of one fidelity measure per parameter, one bar per method.

    Args:
      fidelity: ``{method: gradient_fidelity(...)}``, e.g. ``{'D-RTRL': ..., 'ES-D-RTRL':
        ...}``; every method must list the same parameters.
      metric ({'relative_error', 'cosine'}): The relative error is drawn on a log scale (values
        are clipped below at 1e-17 so exact gradients stay visible).
      ax (matplotlib Axes): Where to draw (default: a new figure).
      title: Axes title.

    Returns:
      Its containers are one bar group per method, each with one bar per
      parameter, in the order of the first method's parameters.
    """
    if metric not in ('relative_error', 'cosine'):
        raise ValueError(f"metric must be 'relative_error' or 'cosine', got {metric!r}.")
    if not fidelity:
        raise ValueError('fidelity is empty: expected {method: gradient_fidelity(...)}.')
    methods = list(fidelity)
    params = list(fidelity[methods[0]])
    for m in methods:
        if list(fidelity[m]) != params:
            raise ValueError(f'method {m!r} lists parameters {list(fidelity[m])}, '
                             f'{methods[0]!r} lists {params}.')
    ax = _new_axes(ax, (max(5.0, 0.9 * len(params) * len(methods) + 2), 3.2))
    width = 0.8 / len(methods)
    pos = np.arange(len(params))
    for i, m in enumerate(methods):
        vals = np.array([fidelity[m][p][metric] for p in params], float)
        if metric == 'relative_error':
            vals = np.maximum(vals, 1e-17)
        ax.bar(pos + (i - (len(methods) - 1) / 2) * width, vals, width, label=m)
    ax.set_xticks(pos, params, rotation=30, ha='right', fontsize=8)
    if metric == 'relative_error':
        ax.set_yscale('log')
        ax.set_ylabel('relative error to reference')
    else:
        ax.set_ylabel('cosine to reference')
        ax.axhline(1.0, color='0.5', lw=0.8, ls=':')
    ax.legend(fontsize=8)
    ax.grid(axis='y', alpha=0.3)
    if title:
        ax.set_title(title)
    return ax
