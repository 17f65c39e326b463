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

The DVS-Gesture-sized net (:func:`make_dvs_model`): batch 16 of 2x64x64 Bernoulli(0.05)
frames, 11 classes, cross-entropy at every step::

    conv 5x5 stride 2,  2 -> 16, LIF                 16 x 32 x 32
    conv 3x3,          16 -> 32, LIF, avg-pool 2     32 x 16 x 16
    conv 3x3,          32 -> 64, LIF, avg-pool 2     64 x  8 x  8
    conv 3x3,          64 -> 64, LIF, avg-pool 2     64 x  4 x  4
    dense 1024 -> 11

in two layouts: ``channels-first`` with this library's layers and neurons
(``tau = 20`` steps), and ``channels-last`` with ``brainstate.nn`` layers and the
reset-after-spike LIF above (decay ``exp(-1/20)``), as brainstate users write it.
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

__all__ = ['STYLES', 'DECAY', 'make_model', 'make_data', 'cross_entropy', 'fan_in_conv2d',
           'DVS_LAYOUTS', 'DVS_BATCH', 'DVS_IN_SHAPE', 'DVS_CLASSES', 'DVS_TAU',
           'make_dvs_model', 'make_dvs_data']

STYLES = ('ours', 'reset-after-spike')
DECAY = math.exp(-1 / 10)


def fan_in_conv2d(in_size, out_channels, k, *, stride=1, gain=4.0, **kwargs):
    """``brainstate.nn.Conv2d`` (channels last, SAME padding, k x k) with a kernel drawn
    from ``FanInNormal(gain)``, the initialisation every brainstate-style workload uses."""
    return brainstate.nn.Conv2d(in_size, out_channels, k, stride=stride, padding='SAME',
                                w_init=FanInNormal(gain)((k, k, in_size[-1], out_channels)),
                                **kwargs)


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
        self.conv1 = fan_in_conv2d((32, 32, 2), 8, 3)
        self.lif1 = ResetLIF((32, 32, 8))
        self.conv2 = fan_in_conv2d((32, 32, 8), 16, 3, stride=2)
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


DVS_LAYOUTS = ('channels-first', 'channels-last')
DVS_BATCH, DVS_IN_SHAPE, DVS_CLASSES, DVS_TAU = 16, (2, 64, 64), 11, 20.0


class DvsChannelsFirst(brainstate.nn.Module):
    """The DVS-sized net with this library's layers and neurons, channels first, for
    frames of ``in_hw`` = ``(H, W)`` pixels (``(64, 64)``; the camera benchmark gives
    ``(90, 160)``: maps of 45x80, 22x40, 11x20 and 5x10, a dense layer 3200 -> 11)."""

    def __init__(self, in_hw=(64, 64)):
        super().__init__()
        from braintrace_conv import nn
        cf = dict(layout='channels_first')
        h, w = -(-in_hw[0] // 2), -(-in_hw[1] // 2)         # conv1: stride 2, SAME
        self.conv1 = nn.Conv2d(2, 16, 5, stride=2, **cf)
        self.lif1 = nn.LIF((16, h, w), tau=DVS_TAU)
        self.conv2 = nn.Conv2d(16, 32, 3, **cf)
        self.lif2 = nn.LIF((32, h, w), tau=DVS_TAU)
        self.conv3 = nn.Conv2d(32, 64, 3, **cf)
        self.lif3 = nn.LIF((64, h // 2, w // 2), tau=DVS_TAU)
        self.conv4 = nn.Conv2d(64, 64, 3, **cf)
        self.lif4 = nn.LIF((64, h // 4, w // 4), tau=DVS_TAU)
        self.pool = nn.AvgPool2d(2, **cf)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64 * (h // 8) * (w // 8), DVS_CLASSES)

    def update(self, x):                                    # (B, 2, 64, 64)
        h = self.lif1(self.conv1(x))                        # (B, 16, 32, 32)
        h = self.pool(self.lif2(self.conv2(h)))             # (B, 32, 16, 16)
        h = self.pool(self.lif3(self.conv3(h)))             # (B, 64, 8, 8)
        h = self.pool(self.lif4(self.conv4(h)))             # (B, 64, 4, 4)
        return self.fc(self.flatten(h))                     # (B, 11)


class DvsChannelsLast(brainstate.nn.Module):
    """The DVS-sized net with ``brainstate.nn`` layers and reset-after-spike LIFs."""

    def __init__(self):
        super().__init__()
        decay = math.exp(-1 / DVS_TAU)
        self.conv1 = fan_in_conv2d((64, 64, 2), 16, 5, stride=2)
        self.lif1 = ResetLIF((32, 32, 16), decay)
        self.conv2 = fan_in_conv2d((32, 32, 16), 32, 3)
        self.lif2 = ResetLIF((32, 32, 32), decay)
        self.conv3 = fan_in_conv2d((16, 16, 32), 64, 3)
        self.lif3 = ResetLIF((16, 16, 64), decay)
        self.conv4 = fan_in_conv2d((8, 8, 64), 64, 3)
        self.lif4 = ResetLIF((8, 8, 64), decay)
        self.pool = brainstate.nn.AvgPool2d(2, 2)
        self.fc = brainstate.nn.Linear(4 * 4 * 64, DVS_CLASSES)

    def update(self, x):                                    # (B, 64, 64, 2)
        h = self.lif1(self.conv1(x))                        # (B, 32, 32, 16)
        h = self.pool(self.lif2(self.conv2(h)))             # (B, 16, 16, 32)
        h = self.pool(self.lif3(self.conv3(h)))             # (B, 8, 8, 64)
        h = self.pool(self.lif4(self.conv4(h)))             # (B, 4, 4, 64)
        return self.fc(h.reshape(h.shape[0], -1))           # (B, 11)


def make_dvs_model(layout: str = 'channels-first', in_hw=(64, 64)):
    brainstate.random.seed(0)
    if layout == 'channels-first':
        return DvsChannelsFirst(in_hw)
    if layout == 'channels-last':
        return DvsChannelsLast()
    raise ValueError(f'layout must be one of {DVS_LAYOUTS}, got {layout!r}.')


def make_dvs_data(layout: str, T: int, seed: int = 0):
    """``(xs (T, 16, ...), labels (T, 16))``: one label per sequence, in the layout's order."""
    rng = np.random.default_rng(seed)
    xs = rng.random((T, DVS_BATCH) + DVS_IN_SHAPE) < 0.05
    if layout == 'channels-last':
        xs = xs.transpose(0, 1, 3, 4, 2)
    labels = np.broadcast_to(rng.integers(0, DVS_CLASSES, DVS_BATCH), (T, DVS_BATCH))
    return jnp.asarray(xs, jnp.float32), jnp.asarray(labels)
