r"""Standard recurrent spiking convolutional networks for event streams of any rank.

Layout and units
----------------
Models take one time step of an event stream per ``update`` call, shaped
``(B, C, *spatial)`` (channels first, the layout of
:mod:`braintrace_conv.data`): ``(B, P, X)`` for audio-like sensors such as
SHD's 700 cochlear channels, ``(B, 2, H, W)`` for DVS cameras, ``(B, P, D, H,
W)`` for volumes. They return the class scores ``(B, num_classes)`` of that
step. The number of spatial axes (1 to 3) selects ``Conv1d``, ``Conv2d`` or
``Conv3d``. Everything is unitless: inputs are event counts, voltages are in
units of the firing threshold (``V_th = 1``), time constants and ``dt`` are
plain numbers in ms (``dt`` from ``brainstate.environ``, default
:data:`braintrace_conv.nn.DEFAULT_DT` = 1 ms).

Architecture
------------
``block 0``: convolution (stride 1) into a LIF population. ``block i > 0``:
convolution with stride 2 into a LIF population, with a recurrent
convolution of the population's own spikes when ``recurrent=True``
(:class:`~braintrace_conv.nn.RecurrentConvCell`). With ``pool=p``, each
block's spikes are averaged over windows of ``p`` positions per spatial axis
(:class:`~braintrace_conv.nn.AvgPool`, after the neuron, where online
executors allow it). The last block's output is flattened into a dense
readout, optionally integrated by a leaky readout neuron
(:class:`~braintrace_conv.nn.LI`). Every trainable parameter lives in a
:mod:`braintrace_conv.nn` layer, so every online executor can train these
models.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Sequence

import brainstate
import numpy as np

from . import nn
from ._validation import positive

__all__ = ['ConvLIF', 'RecurrentConvSNN', 'recurrent_conv_snn', 'standard_benchmark_snn',
           'BENCHMARK_IN_SHAPE', 'BENCHMARK_NUM_CLASSES']

#: Input shape ``(C, H, W)`` of the standard benchmark workload.
BENCHMARK_IN_SHAPE = (2, 32, 32)
#: Number of classes of the standard benchmark workload.
BENCHMARK_NUM_CLASSES = 10

_READOUTS = ('li', 'linear')
_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


class ConvLIF(brainstate.nn.Module):
    """Feed-forward convolution into a LIF population (channels first, any rank).

    Args:
      in_size (tuple of 2 to 4 ints):
        ``(C_in, *spatial)`` of one input sample; ``len(spatial)`` (1 to 3)
        selects ``Conv1d``, ``Conv2d`` or ``Conv3d``.
      out_channels, kernel_size, stride: Of the convolution (``'SAME'`` padding).
      neuron (callable): ``neuron(size) -> LIF-like module`` for the output map ``size =
        (out_channels, *out_spatial)``.

    Attributes:
      ff (Conv1d, Conv2d or Conv3d): The convolution.
      neuron (Module): The neuron population.
      out_size (tuple of ints): ``(out_channels, *out_spatial)``.

    Notes:
      ``update(x)`` maps ``(B, *in_size)`` to spikes ``(B, *out_size)``.
    """

    def __init__(self, in_size: Sequence[int], out_channels: int, kernel_size: int, *,
                 stride: int, neuron: Callable):
        super().__init__()
        conv = _CONVS[len(in_size) - 1]
        self.ff = conv(in_size[0], out_channels, kernel_size, stride=stride,
                       layout='channels_first')
        self.out_size = (out_channels,) + self.ff.output_spatial_shape(in_size[1:])
        self.neuron = neuron(self.out_size)

    def update(self, x):
        """One step: spikes of ``neuron(ff(x))``, shape ``(B, *out_size)``."""
        return self.neuron(self.ff(x))


class RecurrentConvSNN(brainstate.nn.Module):
    """Stack of spiking conv blocks with a dense (optionally leaky) readout.

    Build it with :func:`recurrent_conv_snn` or :func:`standard_benchmark_snn`
    (see the module docstring for the architecture, layout and units).

    Attributes:
      in_shape (tuple of ints): ``(C, *spatial)`` of one input step.
      num_classes (int): Number of outputs.
      tau (float): Membrane time constant of every LIF and of the LI readout, ms.
      blocks (list of ConvLIF or RecurrentConvCell): The spiking layers, in order.
      pools (list of AvgPool): Average pooling after each block's neurons (empty without pooling).
      flatten (Flatten): ``(B, C, *spatial) -> (B, C * prod(spatial))``.
      fc (Linear): Dense readout, the flattened output of the last block to ``num_classes``.
      out (LI or None): Leaky readout integrator (``readout='li'``), else None.
      return_spikes (bool):
        Whether a step also returns the spikes of every block (see :meth:`update`).
    """

    def __init__(self, in_shape: tuple, num_classes: int, blocks: list, tau: float,
                 readout: str, pools: Sequence = (), return_spikes: bool = False):
        super().__init__()
        self.return_spikes = bool(return_spikes)
        self.in_shape = in_shape
        self.num_classes = num_classes
        self.tau = tau
        self.blocks = blocks
        self.pools = list(pools)
        self.flatten = nn.Flatten()
        channels, *spatial = blocks[-1].out_size
        if self.pools:    # non-overlapping VALID windows: floor(n / k) positions per axis
            spatial = [n // k for n, k in zip(spatial, self.pools[-1].kernel_size)]
        self.fc = nn.Linear(channels * math.prod(spatial), num_classes)
        self.out = nn.LI(num_classes, tau=tau) if readout == 'li' else None

    def membrane_decay(self, dt: Optional[float] = None) -> float:
        """``exp(-dt / tau)``, the per-step membrane decay of the neurons.

        :class:`~braintrace_conv.ES_D_RTRL` infers it for LIF neurons (with the adaptation's
        for ALIF ones); ``ES_D_RTRL(model, model.membrane_decay())`` gives every layer this
        one decay instead.
        ``dt`` (ms) defaults to ``brainstate.environ``'s ``dt``, else
        :data:`~braintrace_conv.nn.DEFAULT_DT`.
        """
        if dt is None:
            dt = brainstate.environ.get('dt', default=nn.DEFAULT_DT)
        return math.exp(-float(dt) / self.tau)

    def update(self, x):
        """One time step.

        Args:
          x (array): Events of this step, ``(B, *in_shape)`` = ``(B, C, *spatial)``.

        Returns:
          array or tuple: ``(B, num_classes)``: the readout membrane potential (``'li'``)
            or the dense readout current (``'linear'``). With
            ``return_spikes``, the pair ``(scores, {'blocks.i.neuron': spikes
            (B, *block.out_size)})``, the form
            :class:`~braintrace_conv.Trainer` reads spikes from (firing-rate
            regulariser).
        """
        if tuple(np.shape(x)[1:]) != self.in_shape:
            raise ValueError(f'{type(self).__name__} expects inputs (B, *in_shape) = '
                             f'(B, {", ".join(map(str, self.in_shape))}) per step, got shape '
                             f'{np.shape(x)}.')
        spikes = {}
        for i, block in enumerate(self.blocks):
            x = spikes[f'blocks.{i}.neuron'] = block(x)
            if self.pools:
                x = self.pools[i](x)
        y = self.fc(self.flatten(x))
        y = y if self.out is None else self.out(y)
        return (y, spikes) if self.return_spikes else y


def _in_shape(value) -> tuple:
    try:
        shape = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f'in_shape must be a (C, *spatial) tuple of ints, got {value!r}.') \
            from None
    if not 2 <= len(shape) <= 4 or min(shape) <= 0:
        raise ValueError(f'in_shape must be (C, *spatial) with 1 to 3 spatial axes, all '
                         f'positive, e.g. (1, 700) or (2, 16, 16), got {value!r}.')
    return shape


def recurrent_conv_snn(
    in_shape: Sequence[int] = (2, 16, 16),
    num_classes: int = 8,
    *,
    channels: Sequence[int] = (8, 16),
    kernel_size: int = 3,
    recurrent: bool = True,
    readout: str = 'li',
    tau: float = 10.0,
    pool: int = 1,
    spike_fn: Optional[Callable] = None,
    return_spikes: bool = False,
    tau_adapt: Optional[float] = None,
) -> RecurrentConvSNN:
    """Build a recurrent spiking conv net for event streams of any rank.

    Args:
      in_shape (tuple of int, default (2, 16, 16)):
        One input step ``(C, *spatial)``, channels first, with 1 to 3 spatial axes: e.g.
        ``(1, 700)`` for SHD-like audio (1-D convolutions over channels),
        ``(2, H, W)`` for DVS frames.
      num_classes (int, default 8): Number of class scores per step.
      channels (sequence of int, default (8, 16)):
        Output channels of the spiking blocks. Block 0 keeps the resolution;
        every further block halves it (stride 2, ``'SAME'`` padding).
      kernel_size (int, default 3):
        Extent along every spatial axis of every (feed-forward and recurrent)
        kernel.
      recurrent (bool, default True):
        Give blocks 1, 2, ... a recurrent convolution of their own spikes.
      readout ({'li', 'linear'}, default 'li'):
        ``'li'``: the scores are the potential of leaky integrators driven by
        the dense readout; ``'linear'``: the dense readout itself.
      tau (float, default 10.0): Membrane time constant of all neurons, ms.
      pool (int, default 1): Average the spikes of every block over non-overlapping windows of
        ``pool`` positions per spatial axis (1: no pooling). Shrinks long 1-D
        inputs (700 channels) before the next block and the readout.
      spike_fn (callable, optional): Surrogate spike function of the LIF neurons (default: the LIF
        default, :class:`~braintrace_conv.nn.surrogate.Sigmoid` ``(4.0)``).
      return_spikes (bool, default False):
        A step returns ``(scores, {'blocks.i.neuron': spikes})`` instead of the
        scores alone (:meth:`RecurrentConvSNN.update`).
      tau_adapt (float, optional): Adaptive neurons (:class:`~braintrace_conv.nn.ALIF`,
        whose threshold rises with every spike and decays back with this time constant,
        ms) instead of LIF neurons in every block: a memory of seconds, as e-prop's
        long-memory tasks need (Bellec et al. 2020).

    Returns:
      RecurrentConvSNN: Parameters are drawn from ``brainstate.random`` (seed it for
        reproducibility). Hidden states are created by
        ``brainstate.nn.init_all_states(model, batch_size)`` (the executors do
        this).

    Raises:
      ValueError: Non-positive sizes, an unknown ``readout``, or a ``pool`` window larger
        than a block's output along some axis.
    """
    in_shape = _in_shape(in_shape)
    num_classes = positive('num_classes', num_classes)
    channels = tuple(channels) if not isinstance(channels, (int, np.integer)) else (channels,)
    if not channels:
        raise ValueError('channels must name at least one block.')
    channels = tuple(positive(f'channels[{i}]', c) for i, c in enumerate(channels))
    kernel_size = positive('kernel_size', kernel_size)
    tau = positive('tau', tau, float)
    pool = positive('pool', pool)
    if readout not in _READOUTS:
        raise ValueError(f'readout must be one of {_READOUTS}, got {readout!r}.')
    lif_kwargs = dict(tau=tau) if spike_fn is None else dict(tau=tau, spike_fn=spike_fn)
    neuron = functools.partial(nn.LIF, **lif_kwargs)
    if tau_adapt is not None:
        neuron = functools.partial(nn.ALIF, tau_a=positive('tau_adapt', tau_adapt, float),
                                   **lif_kwargs)

    blocks, pools, size = [], [], in_shape
    for i, c in enumerate(channels):
        stride = 1 if i == 0 else 2
        if recurrent and i > 0:
            block = nn.RecurrentConvCell(size, c, kernel_size, rec_kernel_size=kernel_size,
                                         stride=stride, layout='channels_first', neuron=neuron)
        else:
            block = ConvLIF(size, c, kernel_size, stride=stride, neuron=neuron)
        blocks.append(block)
        size = tuple(block.out_size)
        if pool > 1:
            if min(size[1:]) < pool:
                raise ValueError(f'pool={pool} is larger than the output of block {i}, of '
                                 f'shape (C, *spatial) = {size}; lower pool or kernel strides.')
            pools.append(nn.AvgPool((pool,) * (len(size) - 1), layout='channels_first'))
            size = (c,) + tuple(n // pool for n in size[1:])
    return RecurrentConvSNN(in_shape, num_classes, blocks, tau, readout, pools, return_spikes)


def standard_benchmark_snn() -> RecurrentConvSNN:
    """The standard benchmark workload, shared by the benchmarks and the CLI.

    Input ``(B, 2, 32, 32)`` per step; 3x3 conv 2 -> 8 + LIF; 3x3 conv
    stride 2, 8 -> 16 + LIF (16 x 16 map); dense readout 4096 -> 10 returning
    the readout current. LIF ``tau = 10`` ms (decay ``exp(-1/10)`` at
    ``dt = 1`` ms).
    """
    return recurrent_conv_snn(BENCHMARK_IN_SHAPE, BENCHMARK_NUM_CLASSES, channels=(8, 16),
                              kernel_size=3, recurrent=False, readout='linear', tau=10.0)
