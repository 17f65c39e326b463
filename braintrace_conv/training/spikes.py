"""Spikes of a model: the neuron modules whose spikes are counted, and their rates."""
from __future__ import annotations

import brainstate
import jax.numpy as jnp
import saiunit as u


def _spike_method(node):
    """The method giving the spikes of a neuron module's stored state: ``spike()`` (this
    package's neurons) or ``get_spike()`` (brainpy.state's); None for other nodes."""
    if not isinstance(node, brainstate.nn.Module):
        return None
    for name in ('spike', 'get_spike'):
        if callable(getattr(node, name, None)):
            return getattr(node, name)
    return None


def _fraction_spiking(spikes):
    """Spikes ``(T, B, ...)`` -> the fraction of neurons spiking per step and sample ``(T, B)``."""
    s = jnp.asarray(u.get_mantissa(spikes))
    return jnp.mean(jnp.reshape(s, jnp.shape(s)[:2] + (-1,)), axis=-1)


def _spike_rates(neurons: list):
    """``observe`` for ``Learner.predict``: per neuron module, the fraction spiking, ``(B,)``."""
    def observe(model):
        return [jnp.mean(jnp.reshape(s, (jnp.shape(s)[0], -1)), axis=1)
                for s in (_spike_method(n)() for n in neurons)]
    return observe


def _split_output(out) -> tuple:
    """``(scores, spikes)`` of a model output: ``scores`` alone or the pair ``(scores,
    {layer name: spikes})``; ``spikes`` is ``{}`` for scores alone."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out
    return out, {}
