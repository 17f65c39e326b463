"""Spiking-network building blocks: surrogate spikes, neurons, ETP layers, recurrent conv cell.

All trainable parameters are :class:`brainstate.ParamState`: the weights of the layers
used only through the ETP ops (:func:`braintrace_conv.conv.conv`,
:func:`braintrace_conv.dense.dense`), and the neuron constants named in a neuron's
``trainable=`` used elementwise in its dynamics; all recurrent states are
:class:`brainstate.HiddenState` of the neurons.
"""
from . import surrogate
from .layers import (DEFAULT_W_INIT, AvgPool, AvgPool1d, AvgPool2d, AvgPool3d, Conv1d, Conv2d,
                     Conv3d, FanInNormal, Flatten, Linear)
from .neurons import ALIF, DEFAULT_DT, IF, LI, LIF, CubaLIF, Neuron
from .recurrent import DEFAULT_REC_W_INIT, RecurrentConvCell

__all__ = [
    'surrogate',
    'Neuron', 'LIF', 'ALIF', 'CubaLIF', 'IF', 'LI', 'DEFAULT_DT',
    'Conv1d', 'Conv2d', 'Conv3d', 'Linear', 'Flatten',
    'AvgPool', 'AvgPool1d', 'AvgPool2d', 'AvgPool3d', 'FanInNormal', 'DEFAULT_W_INIT',
    'RecurrentConvCell', 'DEFAULT_REC_W_INIT',
]
