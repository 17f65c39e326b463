r"""Recurrent spiking convolutional layer.

.. math::

    I_t = \mathrm{conv}_{ff}(x_t) + \mathrm{conv}_{rec}(s_{t-1}), \qquad
    s_t = \mathrm{neuron}(I_t)

where :math:`s_{t-1}` is the layer's own spike recomputed from the neuron's
stored hidden state (``neuron.spike()``), not a separately stored spike
state, so the only recurrent states are the neuron's hidden states.

With the default initialisers (feed-forward ``FanInNormal(4.0)``, recurrent
``FanInNormal(0.5)``) and default LIF neurons, three stacked cells
``(32, 32, 2) -> 16 -> 32 -> 32`` channels (3 x 3 kernels) driven by
Bernoulli(0.1) spikes fire at 0.08-0.10, 0.12-0.13 and 0.12-0.22 spikes per
neuron and step in steady state (three seeds).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import brainstate
import jax
import saiunit as u

from .._validation import ArgumentError, WrongTypeError, positive_ints
from .layers import CONV_BY_RANK, DEFAULT_W_INIT, FanInNormal, checked_layout
from .neurons import LIF

__all__ = ['DEFAULT_REC_W_INIT', 'RecurrentConvCell']

#: Default recurrent-kernel initialiser: normal with variance 0.5 / fan_in.
DEFAULT_REC_W_INIT = FanInNormal(0.5)


class RecurrentConvCell(brainstate.nn.Module):
    r"""Recurrent spiking convolution: feed-forward conv + recurrent conv -> neuron.

    Args:
      in_size (tuple of int): Shape of one input sample without the batch axis, in the layer's
        layout: ``(*spatial, C_in)`` for ``channels_last``, ``(C_in, *spatial)``
        for ``channels_first``. Its length minus one sets the rank (1, 2 or 3).
      out_channels (int): Number of output channels (feature maps of the neuron population).
      kernel_size (int or tuple of int): Feed-forward kernel size.
      rec_kernel_size (int or tuple of int, default 3):
        Recurrent kernel size; the recurrent convolution uses stride 1 and
        ``'SAME'`` padding so it maps the output map onto itself.
      stride, padding, dilation, groups, bias: Of the feed-forward convolution, as in
        :class:`~braintrace_conv.nn.layers.Conv2d`. The recurrent convolution
        has no bias.
      layout ({'channels_last', 'channels_first'}, default 'channels_last'):
        Layout of inputs, outputs and kernels of both convolutions.
      w_init (callable or array, default :data:`~braintrace_conv.nn.layers.DEFAULT_W_INIT`):
        Feed-forward kernel initialiser.
      rec_w_init (callable or array, default :data:`DEFAULT_REC_W_INIT`):
        Recurrent kernel initialiser (called with the channels-last shape
        ``(*rec_kernel_size, out_channels, out_channels)``).
      neuron (callable, optional): ``neuron(size) -> module`` building the neuron population for the
        output map of shape ``size`` (``(*out_spatial, out_channels)`` or
        ``(out_channels, *out_spatial)``), e.g. ``functools.partial(ALIF,
        tau=20.)``. The module must have ``spike()`` (the spike of its stored
        state) and ``update(current)``. Default: :class:`~braintrace_conv.nn.neurons.LIF`
        with default parameters.
      name (str, optional): Module name.

    Attributes:
      ff (Conv1d, Conv2d or Conv3d): Feed-forward convolution.
      rec (Conv1d, Conv2d or Conv3d): Recurrent convolution (``out_channels -> out_channels``).
      neuron (Module): The neuron population; its hidden states are created by
        ``brainstate.nn.init_all_states(cell, batch_size)``.
      out_size (tuple of int): Shape of one output sample (the neuron's ``in_size``).

    Notes:
      ``update(x)`` takes ``x`` of shape ``(N, *in_size)`` (or ``in_size`` for
      states created without a batch size) and returns the spikes, shape
      ``(N, *out_size)``. Units: ``unit(x) * unit(w_ff)`` and ``unit(w_rec)`` must
      both be the neuron's voltage unit.

    Raises:
      ValueError: Bad ``in_size`` (rank not 1-3 or non-positive entries) or any invalid
        convolution argument.
      TypeError: ``neuron`` does not build a module with ``spike`` and ``update``.
    """

    def __init__(
        self,
        in_size: Sequence[int],
        out_channels: int,
        kernel_size: Union[int, Sequence[int]],
        *,
        rec_kernel_size: Union[int, Sequence[int]] = 3,
        stride: Union[int, Sequence[int]] = 1,
        padding: Union[str, int, Sequence] = 'SAME',
        dilation: Union[int, Sequence[int]] = 1,
        groups: int = 1,
        bias: bool = True,
        layout: str = 'channels_last',
        w_init: Union[Callable, jax.Array, u.Quantity] = DEFAULT_W_INIT,
        rec_w_init: Union[Callable, jax.Array, u.Quantity] = DEFAULT_REC_W_INIT,
        neuron: Optional[Callable] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        in_size = tuple(in_size) if isinstance(in_size, (tuple, list)) else (in_size,)
        if len(in_size) - 1 not in CONV_BY_RANK:
            raise ArgumentError('in_size', in_size, 'be (*spatial, channels) or (channels, '
                                                    '*spatial) with 1 to 3 spatial dims')
        in_size = positive_ints('in_size', in_size, len(in_size))
        layout = checked_layout(layout)
        conv_cls = CONV_BY_RANK[len(in_size) - 1]
        if layout == 'channels_last':
            in_channels, in_spatial = in_size[-1], in_size[:-1]
        else:
            in_channels, in_spatial = in_size[0], in_size[1:]
        self.ff = conv_cls(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                           dilation=dilation, groups=groups, bias=bias, layout=layout,
                           w_init=w_init)
        self.rec = conv_cls(out_channels, out_channels, rec_kernel_size, padding='SAME',
                            bias=False, layout=layout, w_init=rec_w_init)
        out_spatial = self.ff.output_spatial_shape(in_spatial)
        out_size = (out_spatial + (out_channels,) if layout == 'channels_last'
                    else (out_channels,) + out_spatial)
        self.neuron = LIF(out_size) if neuron is None else neuron(out_size)
        if not (callable(getattr(self.neuron, 'spike', None)) and callable(self.neuron)):
            raise WrongTypeError('neuron', neuron, 'build a module with spike() and update()',
                                 shown=type(self.neuron).__name__)
        self.in_size = in_size
        self.out_size = out_size

    def update(self, x):
        """One step: ``neuron(ff(x) + rec(neuron.spike()))``; returns the new spikes."""
        return self.neuron(self.ff(x) + self.rec(self.neuron.spike()))
