r"""Trainable layers on the ETP ops, and parameter-free reshaping / pooling.

Every trainable weight and bias is a :class:`brainstate.ParamState` that enters
the computation only through :func:`braintrace_conv.conv.conv` or
:func:`braintrace_conv.dense.dense`, which is how the online executors find
them.

Layouts
-------
``layout='channels_last'`` (default): inputs ``(N, *spatial, C)`` (``NWC``,
``NHWC``, ``NDHWC``), kernels ``(*kernel_size, C_in / groups, C_out)``
(``WIO``, ``HWIO``, ``DHWIO``). ``layout='channels_first'``: inputs
``(N, C, *spatial)`` (``NCW``, ``NCHW``, ``NCDHW``), kernels
``(C_out, C_in / groups, *kernel_size)`` (``OIW``, ``OIHW``, ``OIDHW``).
Every layer also accepts a single sample without the batch axis (as seen under
``vmap``) and then returns an unbatched output.

Units
-----
Outputs carry ``unit(x) * unit(weight)``. Weights are unitless unless the
initialiser returns a quantity (e.g. ``FanInNormal(4.0, unit=u.mV)`` to drive
a neuron whose voltage is in mV); default biases are zeros in the unit of the
weight, which matches unitless (spike) inputs.

Default initialisation
----------------------
Weights are drawn from :data:`DEFAULT_W_INIT` ``= FanInNormal(4.0)``, a normal
with variance ``4 / fan_in`` (twice the Kaiming variance), where ``fan_in =
C_in / groups * prod(kernel_size)`` (``in_features`` for :class:`Linear`). The
extra factor compensates for the half of the neurons whose mean drive is
negative and which stay silent. With unit-free
:class:`~braintrace_conv.nn.neurons.LIF` defaults (``tau = 10``, ``V_th = 1``,
``dt = 1``, all ms) and Bernoulli(0.1) spikes on ``32 x 32 x 2`` inputs, the
stack ``Conv2d(2, 16, 3) -> LIF -> Conv2d(16, 32, 3) -> LIF -> Conv2d(32, 32, 3)
-> LIF`` fires at 0.07-0.11, 0.07-0.10 and 0.09-0.15 spikes per neuron and
step in steady state (three seeds); the Kaiming variance ``2 / fan_in`` gives
only 0.04-0.07 and 0.02-0.04 in the first two layers.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import saiunit as u
from jax import lax

from .._validation import (ArgumentError, WrongTypeError, integer, one_of, positive,
                           positive_ints)
from ..conv import conv
from ..conv_args import dilated_extent, normalise_padding
from ..dense import dense

__all__ = [
    'FanInNormal', 'DEFAULT_W_INIT',
    'Conv1d', 'Conv2d', 'Conv3d',
    'Linear', 'Flatten',
    'AvgPool', 'AvgPool1d', 'AvgPool2d', 'AvgPool3d',
]

_LAYOUTS = ('channels_last', 'channels_first')
_SPATIAL = {1: 'W', 2: 'HW', 3: 'DHW'}


# --------------------------------------------------------------------------- initialisation
class FanInNormal:
    r"""Weight initialiser: normal samples with variance ``scale / fan_in``.

    ``fan_in = prod(shape[:-1])``, i.e. all axes but the last (output) one; this
    is the fan-in of a ``(in_features, out_features)`` matrix and of a
    channels-last kernel ``(*kernel_size, C_in / groups, C_out)``.

    Args:
      scale (float): Variance times fan-in (``2.0`` is the Kaiming/He scale).
      unit (saiunit.Unit, optional):
        Unit attached to the weights (e.g. ``u.mV`` for weights that drive a
        neuron whose voltage is in mV); default unitless.

    Notes:
      ``init(shape)`` draws on the host with a NumPy generator seeded by a key
      split off ``brainstate.random`` (so ``brainstate.random.seed`` makes the
      weights reproducible), which avoids compiling a sampler for every new
      weight shape. It must therefore be called eagerly, not under ``jit``.
    """

    def __init__(self, scale: float, unit: Optional[u.Unit] = None):
        self.scale = positive('scale', scale, float)
        self.unit = unit

    def __call__(self, shape: Sequence[int]):
        shape = tuple(shape)
        std = math.sqrt(self.scale / math.prod(shape[:-1]))
        seed = np.asarray(jax.random.key_data(brainstate.random.split_key())).tolist()
        w = np.random.default_rng(seed).standard_normal(shape) * std
        w = jnp.asarray(w, brainstate.environ.dftype())
        return w if self.unit is None else u.Quantity(w, unit=self.unit)

    def __repr__(self):
        return f'FanInNormal(scale={self.scale}, unit={self.unit})'


#: Default weight initialiser: normal with variance 4 / fan_in.
DEFAULT_W_INIT = FanInNormal(4.0)


# --------------------------------------------------------------------------- argument checks
def checked_layout(value) -> str:
    """``value`` if it is one of the two layouts (module docstring); raises otherwise."""
    return one_of('layout', value, _LAYOUTS)


def _init_param(name: str, init, shape: tuple, transpose: Optional[tuple] = None):
    """Parameter from an initialiser ``init(shape)`` or an array of exactly ``shape``.

    A callable is called with ``shape``; its result is then permuted by
    ``transpose`` (when given). An array must already have the permuted shape.
    """
    target = shape if transpose is None else tuple(shape[i] for i in transpose)
    if callable(init):
        value = init(shape)
        if transpose is not None:
            value = u.math.transpose(value, transpose)
    else:
        value = init if isinstance(init, u.Quantity) else jnp.asarray(init)
    if tuple(jnp.shape(value)) != target:
        raise ArgumentError(name, value, f'have shape {target}',
                            shown=str(tuple(jnp.shape(value))))
    return value


def _bias_param(bias: bool, b_init, weight, n_out: int) -> Optional[brainstate.ParamState]:
    """The ``(n_out,)`` bias state (``None`` without bias); default zeros in the weight's unit."""
    if not bias:
        return None
    if b_init is None:
        zeros = jnp.zeros((n_out,), jnp.result_type(u.get_mantissa(weight)))
        return brainstate.ParamState(u.maybe_decimal(u.Quantity(zeros, unit=u.get_unit(weight))))
    return brainstate.ParamState(_init_param('b_init', b_init, (n_out,)))


def _with_batch(layer_name: str, x, unbatched_ndim: int):
    """``(x with a batch axis, whether one was added)``; rejects other ranks."""
    ndim = jnp.ndim(x)
    if ndim == unbatched_ndim + 1:
        return x, False
    if ndim == unbatched_ndim:
        return x[None], True
    raise ValueError(f'{layer_name} expects an input of rank {unbatched_ndim + 1} (batched) or '
                     f'{unbatched_ndim} (one sample), got shape {jnp.shape(x)}.')


# --------------------------------------------------------------------------- convolution
class _ConvNd(brainstate.nn.Module):
    r"""Rank-generic convolution on :func:`~braintrace_conv.conv.conv`.

    Subclasses fix ``num_spatial_dims``. See :class:`Conv2d` for the parameters.
    """
    num_spatial_dims: int

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, Sequence[int]],
        *,
        stride: Union[int, Sequence[int]] = 1,
        padding: Union[str, int, Sequence] = 'SAME',
        dilation: Union[int, Sequence[int]] = 1,
        groups: int = 1,
        bias: bool = True,
        layout: str = 'channels_last',
        w_init: Union[Callable, jax.Array, u.Quantity] = DEFAULT_W_INIT,
        b_init: Union[Callable, jax.Array, u.Quantity, None] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        n = self.num_spatial_dims
        self.in_channels = positive('in_channels', in_channels)
        self.out_channels = positive('out_channels', out_channels)
        self.kernel_size = positive_ints('kernel_size', kernel_size, n)
        self.stride = positive_ints('stride', stride, n)
        self.padding = normalise_padding(padding, n, shorthand=True, crop=False)
        self.dilation = positive_ints('dilation', dilation, n)
        self.groups = positive('groups', groups)
        if in_channels % groups or out_channels % groups:
            raise ArgumentError('groups', groups, f'divide in_channels ({in_channels}) and '
                                                  f'out_channels ({out_channels})')
        self.layout = checked_layout(layout)
        spatial = _SPATIAL[n]
        if layout == 'channels_last':
            self.dimension_numbers = ('N' + spatial + 'C', spatial + 'IO', 'N' + spatial + 'C')
            transpose = None
        else:
            self.dimension_numbers = ('NC' + spatial, 'OI' + spatial, 'NC' + spatial)
            transpose = (n + 1, n) + tuple(range(n))
        kernel_shape = self.kernel_size + (in_channels // groups, out_channels)
        self.weight = brainstate.ParamState(_init_param('w_init', w_init, kernel_shape, transpose))
        self.bias = _bias_param(bias, b_init, self.weight.value, out_channels)

    def output_spatial_shape(self, in_spatial: Sequence[int]) -> tuple:
        """Spatial output shape for spatial input shape ``in_spatial`` (``num_spatial_dims`` ints)."""
        in_spatial = positive_ints('in_spatial', in_spatial, self.num_spatial_dims)
        dilated = tuple(map(dilated_extent, self.kernel_size, self.dilation))
        pads = (lax.padtype_to_pads(in_spatial, dilated, self.stride, self.padding)
                if isinstance(self.padding, str) else self.padding)
        out = tuple((n + lo + hi - k) // s + 1
                    for n, (lo, hi), k, s in zip(in_spatial, pads, dilated, self.stride))
        if min(out) <= 0:
            raise ValueError(f'input spatial shape {in_spatial} is smaller than the dilated '
                             f'kernel {dilated} with padding {self.padding}.')
        return out

    def update(self, x):
        """Convolve ``x``; see the class docstring for shapes and units."""
        x, added = _with_batch(type(self).__name__, x, self.num_spatial_dims + 1)
        channels = jnp.shape(x)[-1 if self.layout == 'channels_last' else 1]
        if channels != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects {self.in_channels} input channels '
                             f'({self.layout}), got input shape {jnp.shape(x)}.')
        y = conv(x, self.weight.value, None if self.bias is None else self.bias.value,
                 strides=self.stride, padding=self.padding, rhs_dilation=self.dilation,
                 feature_group_count=self.groups, dimension_numbers=self.dimension_numbers)
        return y[0] if added else y


_CONV_DOC = r"""{n}-D convolution layer (trainable kernel and bias via the ETP ``conv``).

    Args:
      in_channels, out_channels (int): Channel counts; both must be divisible by ``groups``.
      kernel_size (int or tuple of {n} ints): Spatial kernel extent.
      stride (int or tuple of {n} ints, default 1): Window strides.
      padding (str, int or tuple, default 'SAME'): Zero padding: ``'SAME'``,
        ``'SAME_LOWER'``, ``'VALID'``, an int (both sides of every spatial dimension),
        {n} ints or {n} non-negative (low, high) pairs.
      dilation (int or tuple of {n} ints, default 1): Kernel (``rhs``) dilation.
      groups (int, default 1): Feature groups (``feature_group_count``).
      bias (bool, default True): Whether to add a trainable per-output-channel bias.
      layout ({{'channels_last', 'channels_first'}}, default 'channels_last'):
        ``channels_last``: input/output ``{cl}``, kernel ``{cl_k}``;
        ``channels_first``: input/output ``{cf}``, kernel ``{cf_k}``.
      w_init (callable or array, default :data:`DEFAULT_W_INIT`):
        A callable is called with the channels-last kernel shape
        ``(*kernel_size, in_channels // groups, out_channels)`` (so fan-in based
        initialisers see the right axes) and transposed for ``channels_first``;
        an array must have the kernel shape of the layout.
      b_init (callable or array, optional):
        Bias initialiser (shape ``(out_channels,)``); default zeros in the unit of
        the weight.
      name (str, optional): Module name.

    Attributes:
      weight (brainstate.ParamState): Kernel in the layout's kernel format.
      bias (brainstate.ParamState or None): Shape ``(out_channels,)``.

    Notes:
      ``update(x)`` takes ``x`` of shape ``{cl}`` / ``{cf}`` or one sample without
      the batch axis; the output unit is ``unit(x) * unit(weight)``.

    Raises:
      ValueError: Wrong ``kernel_size``/``stride``/``dilation``/``padding`` length or sign,
        ``groups`` not dividing the channels, unknown ``layout``, an initial
        array of the wrong shape, or an input with the wrong rank or channel count.
      TypeError: Non-integer sizes.
    """


def _conv_doc(n: int) -> str:
    s = _SPATIAL[n]
    return _CONV_DOC.format(n=n, cl=f'(N, {", ".join(s)}, C)', cl_k=f'{s}IO',
                            cf=f'(N, C, {", ".join(s)})', cf_k=f'OI{s}')


class Conv1d(_ConvNd):
    __doc__ = _conv_doc(1)
    num_spatial_dims = 1


class Conv2d(_ConvNd):
    __doc__ = _conv_doc(2)
    num_spatial_dims = 2


class Conv3d(_ConvNd):
    __doc__ = _conv_doc(3)
    num_spatial_dims = 3


#: The convolution layer of each number of spatial dimensions.
CONV_BY_RANK = {1: Conv1d, 2: Conv2d, 3: Conv3d}


# --------------------------------------------------------------------------- dense
class Linear(brainstate.nn.Module):
    r"""Fully connected layer ``y = x @ weight + bias`` via the ETP ``dense``.

    Args:
      in_features, out_features (int): Input and output sizes.
      bias (bool, default True): Whether to add a trainable bias.
      w_init (callable or array, default :data:`DEFAULT_W_INIT`):
        Called with ``(in_features, out_features)``, or an array of that shape.
      b_init (callable or array, optional):
        Bias initialiser (shape ``(out_features,)``); default zeros in the unit
        of the weight.
      name (str, optional): Module name.

    Attributes:
      weight (brainstate.ParamState): Shape ``(in_features, out_features)``.
      bias (brainstate.ParamState or None): Shape ``(out_features,)``.

    Notes:
      ``update(x)``: ``x`` of shape ``(batch, in_features)`` or ``(in_features,)``
      gives ``(batch, out_features)`` or ``(out_features,)``, with unit
      ``unit(x) * unit(weight)``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 w_init: Union[Callable, jax.Array, u.Quantity] = DEFAULT_W_INIT,
                 b_init: Union[Callable, jax.Array, u.Quantity, None] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        self.in_features = positive('in_features', in_features)
        self.out_features = positive('out_features', out_features)
        self.in_size = (self.in_features,)
        self.out_size = (self.out_features,)
        self.weight = brainstate.ParamState(
            _init_param('w_init', w_init, (self.in_features, self.out_features)))
        self.bias = _bias_param(bias, b_init, self.weight.value, self.out_features)

    def update(self, x):
        """Apply the affine map; ``x`` is ``(batch, in_features)`` or ``(in_features,)``."""
        x, added = _with_batch('Linear', x, 1)
        if jnp.shape(x)[-1] != self.in_features:
            raise ValueError(f'Linear expects {self.in_features} input features, got input '
                             f'shape {jnp.shape(x)}.')
        y = dense(x, self.weight.value, None if self.bias is None else self.bias.value)
        return y[0] if added else y


# --------------------------------------------------------------------------- reshaping
class Flatten(brainstate.nn.Module):
    r"""Flatten the axes from ``start_axis`` on into one (no parameters).

    Args:
      start_axis (int, default 1): First axis to flatten. The default keeps a leading batch axis:
        ``(N, *dims) -> (N, prod(dims))``. Use a negative value counted from the
        end (e.g. ``-3`` for ``(..., H, W, C)``) for models that also run on
        single samples without the batch axis (e.g. under ``vmap``).
      name (str, optional): Module name.

    Notes:
      Units are preserved.
    """

    def __init__(self, start_axis: int = 1, name: Optional[str] = None):
        super().__init__(name=name)
        self.start_axis = integer('start_axis', start_axis)

    def update(self, x):
        """Return ``x`` reshaped to ``x.shape[:start_axis] + (-1,)``."""
        shape = jnp.shape(x)
        if not -len(shape) <= self.start_axis < len(shape):
            raise ValueError(f'Flatten start_axis={self.start_axis} is out of range for an '
                             f'input of shape {shape}.')
        start = self.start_axis % len(shape)
        return u.math.reshape(x, shape[:start] + (math.prod(shape[start:]),))


# --------------------------------------------------------------------------- pooling
class AvgPool(brainstate.nn.Module):
    r"""Average pooling over the spatial axes (a fixed linear map, no parameters).

    The rank is ``len(kernel_size)``. Windows are summed with zero padding and
    divided by ``prod(kernel_size)`` (padding counts as zeros).

    Pooling mixes positions, so it must not sit between a convolution and the
    neuron it drives (the online executors expect elementwise maps there);
    place it after a neuron, before the next convolution.

    Args:
      kernel_size (tuple of int): Window extent per spatial dimension.
      stride (int or tuple of int, optional):
        Window strides; default ``kernel_size`` (non-overlapping windows).
      padding (str, int or tuple, default 'VALID'): Spatial zero padding, in the forms
        :class:`Conv2d` takes.
      layout ({'channels_last', 'channels_first'}, default 'channels_last'):
        Input ``(N, *spatial, C)`` or ``(N, C, *spatial)``; the batch axis may
        be absent.
      name (str, optional): Module name.

    Notes:
      Units are preserved.
    """
    num_spatial_dims: Optional[int] = None

    def __init__(self, kernel_size: Union[int, Sequence[int]], stride=None,
                 padding: Union[str, int, Sequence] = 'VALID', layout: str = 'channels_last',
                 name: Optional[str] = None):
        super().__init__(name=name)
        n = self.num_spatial_dims
        if n is None:
            if isinstance(kernel_size, (int, np.integer)):
                raise WrongTypeError('kernel_size', kernel_size, 'be a tuple for AvgPool (its '
                                     'length sets the number of spatial dims)',
                                     'use AvgPool1d/2d/3d for an int')
            n = len(kernel_size)
        self.kernel_size = positive_ints('kernel_size', kernel_size, n)
        self.stride = self.kernel_size if stride is None else positive_ints('stride', stride, n)
        self.padding = normalise_padding(padding, n, shorthand=True, crop=False)
        self.layout = checked_layout(layout)

    def update(self, x):
        """Average-pool ``x`` over its spatial axes."""
        n, ndim = len(self.kernel_size), jnp.ndim(x)
        if ndim not in (n + 1, n + 2):
            raise ValueError(f'{type(self).__name__} expects an input of rank {n + 2} (batched) '
                             f'or {n + 1} (one sample), got shape {jnp.shape(x)}.')
        lead = ndim - n - 1 if self.layout == 'channels_last' else ndim - n
        trail = ndim - n - lead

        def full(spatial, fill):
            return (fill,) * lead + tuple(spatial) + (fill,) * trail

        padding = (self.padding if isinstance(self.padding, str)
                   else full(self.padding, (0, 0)))
        mantissa, unit = u.split_mantissa_unit(x)
        summed = lax.reduce_window(jnp.asarray(mantissa), np.zeros((), jnp.result_type(mantissa)),
                                   lax.add, full(self.kernel_size, 1), full(self.stride, 1),
                                   padding)
        return u.maybe_decimal(u.Quantity(summed / math.prod(self.kernel_size), unit=unit))


_POOL_DOC = ('{n}-D average pooling; as :class:`AvgPool`, with ``kernel_size`` and ``stride`` '
             'given as an int or {n} ints.')


class AvgPool1d(AvgPool):
    __doc__ = _POOL_DOC.format(n=1)
    num_spatial_dims = 1


class AvgPool2d(AvgPool):
    __doc__ = _POOL_DOC.format(n=2)
    num_spatial_dims = 2


class AvgPool3d(AvgPool):
    __doc__ = _POOL_DOC.format(n=3)
    num_spatial_dims = 3
