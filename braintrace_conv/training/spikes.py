"""Spikes of a model: the neuron modules whose spikes are counted, and their rates.

A model step returns class scores ``(B, K)`` or the pair ``(scores, {layer name:
spikes (B, ...)})`` (:func:`split_output`). Spike rates are reported for the spikes
a model returns and for every neuron module with a ``spike()`` method (this package's
neurons) or ``get_spike()`` method (brainpy.state's), read after each step
(:func:`spiking_layers`, :func:`spike_rate_observer`); a spike rate is the fraction of
a layer's neurons spiking per time step.
"""
from __future__ import annotations

from typing import Callable, Optional

import brainstate
import jax.numpy as jnp
import saiunit as u

__all__ = ['split_output', 'spike_method', 'spiking_layers', 'spike_rate_observer',
           'fraction_spiking']


def split_output(out) -> tuple:
    """``(scores, spikes)`` of a model output: ``scores`` alone or the pair ``(scores,
    {layer name: spikes})``; ``spikes`` is ``{}`` for scores alone."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out
    return out, {}


def spike_method(node) -> Optional[Callable]:
    """The method giving the spikes of a neuron module's stored state: ``spike()`` (this
    package's neurons) or ``get_spike()`` (brainpy.state's); None for other nodes."""
    if not isinstance(node, brainstate.nn.Module):
        return None
    for name in ('spike', 'get_spike'):
        if callable(getattr(node, name, None)):
            return getattr(node, name)
    return None


def spiking_layers(model: brainstate.nn.Module) -> dict:
    """``{dotted path in the model: neuron module}`` of the modules with a
    :func:`spike_method`, in the model's order."""
    return {'.'.join(map(str, path)): node for path, node in model.nodes().items()
            if spike_method(node) is not None}


def fraction_spiking(spikes):
    """Spikes ``(T, B, ...)`` -> the fraction of neurons spiking per step and sample ``(T, B)``."""
    s = jnp.asarray(u.get_mantissa(spikes))
    return jnp.mean(jnp.reshape(s, jnp.shape(s)[:2] + (-1,)), axis=-1)


def spike_rate_observer(neurons: list) -> Callable:
    """``observe`` for ``Learner.predict``: per neuron module, the fraction of its neurons
    spiking at this step, ``(B,)``."""
    def observe(model):
        return [jnp.mean(jnp.reshape(s, (jnp.shape(s)[0], -1)), axis=1)
                for s in (spike_method(n)() for n in neurons)]
    return observe
