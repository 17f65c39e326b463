"""The standard workload written in two neuron styles, shared by the benchmarks.

Both: batch 8, input 2x32x32 Bernoulli(0.1) spikes, 3x3 conv 2 -> 8 + LIF,
3x3 conv stride 2, 8 -> 16 + LIF, dense readout 4096 -> 10, cross-entropy at
every step, LIF decay ``exp(-1/10)``, threshold 1, sigmoid surrogate (slope 4).

* ``ours``: :func:`braintrace_conv.models.standard_benchmark_snn`, whose
  neurons store the pre-reset potential (channels first).
* ``reset-after-spike``: how brainpy, snnTorch and braintrace users write it:
  ``brainstate.nn.Conv2d`` / ``brainstate.nn.Linear`` layers (plain ``lax``
  ops, channels last) and a LIF that stores the post-reset potential and
  outputs the spike of the pre-reset one: ``v = a h + I; s = spike(v - 1);
  h = v - s; return s``.
"""
from __future__ import annotations

import math

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from braintrace_conv.models import standard_benchmark_snn
from braintrace_conv.nn import FanInNormal
from braintrace_conv.nn.surrogate import Sigmoid

__all__ = ['STYLES', 'DECAY', 'make_model', 'make_data', 'cross_entropy']

STYLES = ('ours', 'reset-after-spike')
DECAY = math.exp(-1 / 10)


class ResetLIF(brainstate.nn.Module):
    """``v = a h + I; s = spike(v - 1); h = v - s``; returns ``s`` (post-reset state)."""

    def __init__(self, shape, decay=DECAY):
        super().__init__()
        self.shape, self.decay, self.spike = tuple(shape), decay, Sigmoid(4.0)

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape), brainstate.environ.dftype()))

    def update(self, current):
        v = self.decay * self.h.value + current
        s = self.spike(v - 1.0)
        self.h.value = v - s
        return s


class ResetAfterSpikeNet(brainstate.nn.Module):
    """The standard workload in the reset-after-spike style (module docstring)."""

    def __init__(self):
        super().__init__()
        self.conv1 = brainstate.nn.Conv2d((32, 32, 2), 8, 3, padding='SAME',
                                          w_init=FanInNormal(4.0)((3, 3, 2, 8)))
        self.lif1 = ResetLIF((32, 32, 8))
        self.conv2 = brainstate.nn.Conv2d((32, 32, 8), 16, 3, stride=2, padding='SAME',
                                          w_init=FanInNormal(4.0)((3, 3, 8, 16)))
        self.lif2 = ResetLIF((16, 16, 16))
        self.readout = brainstate.nn.Linear(16 * 16 * 16, 10)

    def update(self, x):                     # x: (B, 32, 32, 2)
        s1 = self.lif1(self.conv1(x))
        s2 = self.lif2(self.conv2(s1))
        return self.readout(s2.reshape(s2.shape[0], -1))


def make_model(style: str):
    brainstate.random.seed(0)
    if style == 'ours':
        return standard_benchmark_snn()
    if style == 'reset-after-spike':
        return ResetAfterSpikeNet()
    raise ValueError(f'style must be one of {STYLES}, got {style!r}.')


def make_data(style: str, T: int, batch: int = 8, seed: int = 0):
    """``(xs (T, B, ...), labels (T, B))`` in the style's input layout."""
    rng = np.random.default_rng(seed)
    xs = rng.random((T, batch, 2, 32, 32)) < 0.1
    if style == 'reset-after-spike':
        xs = xs.transpose(0, 1, 3, 4, 2)
    return jnp.asarray(xs, jnp.float32), jnp.asarray(rng.integers(0, 10, (T, batch)))


def cross_entropy(logits, label):
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(logits.shape[0]), label])
