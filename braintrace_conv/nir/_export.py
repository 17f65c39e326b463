"""A model as a NIR graph: the data flow of one step, one table of layer mappings, layouts."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import pathlib
from typing import Callable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import saiunit as u

from .. import nn
from ..nn import neurons as nn_neurons
from . import modules as m
from ._load import Network, require_nir

__all__ = ['export']


class NIRExportError(ValueError):
    """A layer (or connection) that NIR cannot express exactly."""


@dataclasses.dataclass
class Emitted:
    """What one layer becomes: NIR nodes, internal edges, where its input enters and its
    output leaves, and the layout of its output (``index``: NIR position -> flat position of
    this library's sample, shape = NIR shape)."""
    nodes: dict
    edges: list
    entry: list
    exit: str
    index: np.ndarray


@dataclasses.dataclass
class Call:
    name: str
    module: object
    arg: object
    out: object


# --------------------------------------------------------------------------- layouts
def _canonical(shape: tuple, channels_last: bool) -> np.ndarray:
    """NIR (channels-first) index of a sample of ``shape`` stored in this layout."""
    flat = np.arange(math.prod(shape)).reshape(shape)
    return np.moveaxis(flat, -1, 0) if channels_last else flat


def _sample(array) -> tuple:
    """Shape of one sample (without the batch axis) of a recorded array."""
    return tuple(np.shape(array))[1:]


def _to_nir(value, index: np.ndarray, our_shape: tuple, dtype=np.float64) -> np.ndarray:
    """A per-sample quantity of our layout (broadcastable to ``our_shape``) in NIR layout."""
    full = np.broadcast_to(np.asarray(value, dtype), our_shape)
    return full.reshape(-1)[index].astype(np.float64)


def _require_layout(call: Call, index: np.ndarray, channels_last: bool, what: str):
    want = _canonical(_sample(call.arg), channels_last)
    if index.shape != want.shape or not np.array_equal(index, want):
        raise NIRExportError(f'layer {call.name!r} ({type(call.module).__name__}) reads its input '
                             f'{what}, but that input is laid out differently (a flatten or '
                             f'transpose before it cannot be written in NIR).')


def _plain(value) -> np.ndarray:
    """A parameter's (or constant's) values without unit."""
    value = value.value if isinstance(value, brainstate.State) else value
    return np.asarray(u.get_mantissa(value))


# --------------------------------------------------------------------------- exact coefficients
def _nudge(target: np.ndarray, start: np.ndarray, f: Callable, what: str, layer: str) -> np.ndarray:
    """``x`` near ``start`` with ``f(x) == target`` exactly in float64 (``f`` increasing),
    found by stepping ``x`` one float at a time."""
    x = start.astype(np.float64).copy()
    for _ in range(64):
        y = f(x)
        if np.array_equal(y, target):
            return x
        x = np.where(y < target, np.nextafter(x, np.inf), np.where(y > target, np.nextafter(x, -np.inf), x))
    raise NIRExportError(f'layer {layer!r}: no float64 {what} reproduces this step exactly.')


def _time_constant(decay: np.ndarray, dt: float, layer: str) -> np.ndarray:
    """``tau`` in seconds with ``1 - dt / tau == decay`` (the loader's Euler decay)."""
    decay = decay.astype(np.float64)
    if not np.all((decay >= 0) & (decay < 1)):
        raise NIRExportError(f'layer {layer!r}: its decay per step must be in [0, 1) for a NIR '
                             f'time constant, got {decay.min()} to {decay.max()} (a time '
                             f'constant too long for this dt rounds the decay to 1).')
    return _nudge(decay, dt / (1.0 - decay), lambda tau: 1.0 - dt / tau, 'time constant', layer)


def _gain_factor(gain: np.ndarray, tau: np.ndarray, dt: float, layer: str) -> np.ndarray:
    """``r`` (or ``w_in``) with ``r * (dt / tau) == gain`` (the loader's input gain)."""
    q = dt / tau
    gain = np.broadcast_to(gain.astype(np.float64), q.shape)
    return _nudge(gain, gain / q, lambda r: r * q, 'resistance', layer)


def _strict_threshold(threshold: np.ndarray, spike_fn: Callable, dtype, layer: str) -> np.ndarray:
    """NIR fires above ``v_threshold``. A spike function that fires at ``x >= 0`` fires at
    ``v >= V_th``: the same test as ``v > (the float below V_th)`` in the model's dtype."""
    tiny = np.finfo(dtype).tiny
    probe = np.asarray(spike_fn(jnp.asarray([-tiny, 0.0, tiny], dtype)))
    if probe[0] != 0 or probe[2] != 1:
        raise NIRExportError(f'layer {layer!r}: its spike function is not a step at the '
                             f'threshold (it gives {probe} just below, at and above it).')
    threshold = threshold.astype(dtype)
    return (np.nextafter(threshold, np.asarray(-np.inf, dtype)) if probe[1] == 1 else threshold)


# --------------------------------------------------------------------------- the layer table
def _conv(call: Call, index, ctx) -> Emitted:
    import nir
    layer = call.module
    ours = isinstance(layer, nn.layers._ConvNd)
    n = layer.num_spatial_dims if ours else len(layer.kernel_size)
    if n not in (1, 2):
        raise NIRExportError(f'layer {call.name!r} ({type(layer).__name__}): NIR has 1-D and 2-D '
                             f'convolutions only.')
    channels_last = layer.layout == 'channels_last' if ours else layer.channels_last
    _require_layout(call, index, channels_last, 'channels ' + ('last' if channels_last else 'first'))
    if ours:
        weight, bias = _plain(layer.weight), layer.bias
        bias = None if bias is None else _plain(bias)
        padding, dilation = layer.padding, layer.dilation
    else:
        params = layer.weight.value
        weight, bias = _plain(params['weight']), params.get('bias')
        bias = None if bias is None else _plain(bias)
        padding, dilation = layer.padding, layer.rhs_dilation
        if getattr(layer, 'w_mask', None) is not None or tuple(layer.lhs_dilation) != (1,) * n:
            raise NIRExportError(f'layer {call.name!r}: a weight mask or input dilation has no '
                                 f'field in NIR.')
    if channels_last:    # (*kernel, I, O) -> (O, I, *kernel)
        weight = np.moveaxis(np.moveaxis(weight, -1, 0), -1, 1)
    if bias is None:
        bias = np.zeros(weight.shape[0])
    bias = np.asarray(bias).reshape(-1)
    stride, groups = tuple(int(s) for s in layer.stride), int(layer.groups)
    in_spatial = tuple(index.shape[1:])
    nir_padding = _conv_padding(call, padding, weight.shape[2:], tuple(dilation), stride, in_spatial)
    cls = nir.Conv1d if n == 1 else nir.Conv2d
    node = cls(input_shape=in_spatial[0] if n == 1 else in_spatial,
               weight=weight.astype(np.float64), stride=stride[0] if n == 1 else stride,
               padding=nir_padding[0] if n == 1 else nir_padding,
               dilation=tuple(dilation)[0] if n == 1 else tuple(dilation),
               groups=groups, bias=bias.astype(np.float64))
    out_shape = tuple(np.shape(call.out))[1:]
    return _single(call, node, _canonical(out_shape, channels_last))


def _conv_padding(call, padding, kernel, dilation, stride, in_spatial):
    """NIR padding (an int per spatial axis, both sides): what the layer pads, if symmetric."""
    from jax import lax
    effective = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if isinstance(padding, str):
        pads = lax.padtype_to_pads(in_spatial, effective, stride, padding.upper())
    else:
        pads = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in
                (padding if isinstance(padding, (tuple, list)) else [padding] * len(kernel))]
    if any(lo != hi or lo < 0 for lo, hi in pads):
        raise NIRExportError(f'layer {call.name!r}: padding {padding!r} pads {list(map(tuple, pads))} '
                             f'(low, high) here, unequal on the two sides (or cropping), which NIR '
                             f'cannot express.')
    return tuple(int(lo) for lo, _ in pads)


def _single(call, node, index) -> Emitted:
    return Emitted({call.name: node}, [], [call.name], call.name, index)


def _linear(call: Call, index, ctx) -> Emitted:
    import nir
    layer = call.module
    if isinstance(layer, nn.Linear):
        weight = _plain(layer.weight)
        bias = None if layer.bias is None else _plain(layer.bias)
    else:
        if getattr(layer, 'w_mask', None) is not None:
            raise NIRExportError(f'layer {call.name!r}: a weight mask has no field in NIR.')
        params = layer.weight.value
        weight = _plain(params['weight'])
        bias = None if 'bias' not in params else _plain(params['bias'])
    if index.ndim != 1:
        raise NIRExportError(f'layer {call.name!r} ({type(layer).__name__}) acts on the last axis of '
                             f'a {index.ndim}-D sample; NIR affine maps take vectors (flatten first).')
    weight = weight[np.asarray(index).reshape(-1)].T.astype(np.float64)
    node = (nir.Linear(weight=weight) if bias is None else
            nir.Affine(weight=weight, bias=np.asarray(bias, np.float64).reshape(-1)))
    return _single(call, node, np.arange(weight.shape[0]))


def _flatten(call: Call, index, ctx) -> Emitted:
    import nir
    in_shape, out_shape = tuple(np.shape(call.arg))[1:], tuple(np.shape(call.out))[1:]
    if np.shape(call.out)[:1] != np.shape(call.arg)[:1]:
        raise NIRExportError(f'layer {call.name!r} ({type(call.module).__name__}) flattens the batch '
                             f'axis too; NIR flattens within a sample (flatten from axis 1).')
    if len(out_shape) == 1:
        start, end = 0, -1
    elif np.array_equal(index, np.arange(index.size).reshape(index.shape)):
        start = next(i for i, (a, b) in enumerate(zip(in_shape, out_shape)) if a != b)
        end = start + len(in_shape) - len(out_shape)
    else:
        raise NIRExportError(f'layer {call.name!r}: a partial flatten of a channels-last sample '
                             f'cannot be written in NIR (flatten the whole sample).')
    node = nir.Flatten(input_type={'input': np.array(index.shape)}, start_dim=start, end_dim=end)
    nir_out = node.output_type['output']
    return _single(call, node, np.asarray(index).reshape(tuple(int(s) for s in nir_out)))


def _pool(call: Call, index, ctx) -> Emitted:
    import nir
    layer = call.module
    if isinstance(layer, nn.AvgPool):
        if len(layer.kernel_size) != 2:
            raise NIRExportError(f'layer {call.name!r}: NIR has 2-D pooling only.')
        channels_last = layer.layout == 'channels_last'
        padding = layer.padding
    else:
        if layer.pool_dim != 2 or layer.channel_axis not in (-1, None):
            raise NIRExportError(f'layer {call.name!r}: NIR has 2-D pooling only, channels first '
                                 f'or last.')
        channels_last, padding = layer.channel_axis == -1, layer.padding
        if padding not in ('VALID', (0, 0), ((0, 0), (0, 0))):
            raise NIRExportError(f'layer {call.name!r} ({type(layer).__name__}): its padded windows '
                                 f'average over the valid entries only; NIR AvgPool2d counts padding '
                                 f'as zeros (use padding="VALID").')
    _require_layout(call, index, channels_last, 'channels ' + ('last' if channels_last else 'first'))
    if isinstance(padding, str):
        if padding.upper() != 'VALID':
            raise NIRExportError(f'layer {call.name!r}: padding {padding!r} has no NIR form for pooling.')
        pads = (0, 0)
    else:
        pairs = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in padding]
        if any(lo != hi for lo, hi in pairs):
            raise NIRExportError(f'layer {call.name!r}: unequal padding has no NIR form.')
        pads = tuple(lo for lo, _ in pairs)
    node = nir.AvgPool2d(kernel_size=np.array(layer.kernel_size), stride=np.array(layer.stride),
                         padding=np.array(pads))
    out_shape = tuple(np.shape(call.out))[1:]
    return _single(call, node, _canonical(out_shape, channels_last))


def _sum_pool(call: Call, index, ctx) -> Emitted:
    import nir
    layer = call.module
    _require_layout(call, index, False, 'channels first')
    node = nir.SumPool2d(kernel_size=np.array(layer.kernel_size), stride=np.array(layer.stride),
                         padding=np.array(layer.padding))
    return _single(call, node, _canonical(_sample(call.out), False))


def _delay(call: Call, index, ctx) -> Emitted:
    import nir
    steps = _to_nir(call.module.steps, index, _sample(call.arg))
    return _single(call, nir.Delay(delay=steps * ctx.dt), index)


# --------------------------------------------------------------------------- neurons
def _reset(call, neuron_reset: str, ctx) -> dict:
    """Node metadata for a reset by subtraction, which NIR has no field for (this library's
    'subtract', brainpy's 'soft', or a loaded node's 'subtract' / 'subtract_after_leak')."""
    if neuron_reset in ('zero', 'hard', 'value'):
        return {}
    if not ctx.subtract_reset:
        raise NIRExportError(
            f'layer {call.name!r} ({type(call.module).__name__}) resets by subtraction, which NIR '
            f'cannot express (its reset sets v to v_reset); pass subtract_reset=True to write it '
            f'anyway, marked in the node\'s metadata (read by braintrace_conv.nir.load, ignored by '
            f'other libraries).')
    return {'reset': 'subtract_after_leak' if neuron_reset == 'subtract_after_leak' else 'subtract'}


def _our_neuron(call: Call, index, ctx) -> Emitted:
    import nir
    n = call.module
    if isinstance(n, nn.ALIF):
        raise NIRExportError(f'layer {call.name!r} (ALIF): NIR has no neuron with threshold '
                             f'adaptation.')
    shape, dtype = _sample(call.arg), ctx.dtype
    nir_ = lambda v: _to_nir(v, index, shape)
    meta = {} if isinstance(n, nn.LI) else _reset(call, n.reset, ctx)
    if not isinstance(n, nn.LI):
        v_th = _strict_threshold(np.broadcast_to(_plain(n.V_th), shape), n.spike_fn,
                                 dtype, call.name)
        v_reset = nir_(_plain(n.V_reset))
    if isinstance(n, nn.IF):
        if np.any(_plain(n.V_rest) != 0):
            raise NIRExportError(f'layer {call.name!r} (IF): V_rest (its initial potential) is not '
                                 f'0, and NIR\'s IF has no field for it.')
        node = nir.IF(r=nir_(1.0), v_threshold=nir_(v_th), v_reset=v_reset, metadata=meta)
        return _single(call, node, index)
    decay = lambda tau: _to_nir(np.asarray(nn_neurons._decay(tau)), index, shape, dtype)
    tau = _time_constant(decay(n.tau), ctx.dt, call.name)
    r = _gain_factor(np.ones(()), tau, ctx.dt, call.name)
    v_leak = nir_(_plain(n.V_rest))
    if ctx.unit_r and not isinstance(n, nn.CubaLIF):   # v scaled by q: r q = 1 becomes r = 1
        q = ctx.dt / tau
        r, v_leak = np.ones_like(tau), v_leak * q
        if not isinstance(n, nn.LI):
            v_th, v_reset = nir_(v_th) * q, v_reset * q
            nir_ = lambda v: v
    if isinstance(n, nn.LI):
        node = nir.LI(tau=tau, r=r, v_leak=v_leak)
    elif isinstance(n, nn.CubaLIF):
        tau_syn = _time_constant(decay(n.tau_syn), ctx.dt, call.name)
        node = nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau, r=r, v_leak=v_leak,
                           v_threshold=nir_(v_th), v_reset=v_reset,
                           w_in=_gain_factor(np.ones(()), tau_syn, ctx.dt, call.name), metadata=meta)
    else:
        node = nir.LIF(tau=tau, r=r, v_leak=v_leak, v_threshold=nir_(v_th), v_reset=v_reset,
                       metadata=meta)
    return _single(call, node, index)


def _nir_neuron(call: Call, index, ctx) -> Emitted:
    """A module of :mod:`braintrace_conv.nir.modules` (a graph loaded here) written back."""
    import nir
    n = call.module
    q = lambda a: _to_nir(np.asarray(a), index, _sample(call.arg))
    meta = _reset(call, n.reset, ctx) if isinstance(n, m.SpikingNeuron) else {}
    if isinstance(n, (m.EulerIF, m.EulerI)):
        gain = q(n.gain)
        if isinstance(n, m.EulerI):
            return _single(call, nir.I(r=gain), index)
        return _single(call, nir.IF(r=gain, v_threshold=q(n.v_threshold), v_reset=q(n.v_reset),
                                    metadata=meta), index)
    tau = _time_constant(q(n.decay), ctx.dt, call.name)
    r = _gain_factor(q(n.gain), tau, ctx.dt, call.name)
    if isinstance(n, (m.EulerCubaLIF, m.EulerCubaLI)):
        tau_syn = _time_constant(q(n.syn_decay), ctx.dt, call.name)
        w_in = _gain_factor(q(n.syn_gain), tau_syn, ctx.dt, call.name)
        if isinstance(n, m.EulerCubaLI):
            node = nir.CubaLI(tau_syn=tau_syn, tau_mem=tau, r=r, v_leak=q(n.v_leak), w_in=w_in)
        else:
            node = nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau, r=r, v_leak=q(n.v_leak),
                               v_threshold=q(n.v_threshold), v_reset=q(n.v_reset), w_in=w_in,
                               metadata=meta)
    elif isinstance(n, m.EulerLI):
        node = nir.LI(tau=tau, r=r, v_leak=q(n.v_leak))
    else:
        node = nir.LIF(tau=tau, r=r, v_leak=q(n.v_leak), v_threshold=q(n.v_threshold),
                       v_reset=q(n.v_reset), metadata=meta)
    return _single(call, node, index)


def _brainpy_neuron(call: Call, index, ctx) -> Emitted:
    """brainpy.state's LIF, IF (which leaks to 0) and CubaLIF driven through ``update(x)``
    (the current goes to the membrane; CubaLIF's synaptic ``g`` is driven only by delta
    inputs, so it stays 0 and the neuron is a LIF)."""
    import nir
    n, name = call.module, call.name
    if getattr(n, 'current_inputs', None) or getattr(n, 'delta_inputs', None):
        raise NIRExportError(f'layer {name!r} ({type(n).__name__}) has inputs registered by '
                             f'projections, which are not layers NIR can see.')
    v_unit = u.get_unit(n.V_th)
    mant = lambda q_: np.asarray(u.get_mantissa(u.Quantity(q_).to(v_unit)))
    v_rest = mant(getattr(n, 'V_rest', 0 * v_unit))
    v_reset = mant(getattr(n, 'V_reset', 0 * v_unit))
    v0, g0 = ctx.initial[id(n.V)], ctx.initial.get(id(getattr(n, 'g', None)), 0)
    if np.any(mant(v0) != np.broadcast_to(v_rest, np.shape(v0))) or \
            np.any(np.asarray(u.get_mantissa(g0)) != 0):
        raise NIRExportError(f'layer {name!r} ({type(n).__name__}): its initial state is not at '
                             f'rest, and NIR has no field for an initial state.')
    meta = _reset(call, n.spk_reset, ctx)
    decay = np.exp(-np.asarray(u.maybe_decimal(ctx.dt * u.second / n.tau), np.float64))
    shape = _sample(call.arg)
    decay = _to_nir(decay, index, shape)
    tau = _time_constant(decay, ctx.dt, name)
    resistance = u.Quantity(n.R * (1 * u.get_unit(call.arg))).to(v_unit)
    gain = (1.0 - decay) * _to_nir(np.asarray(u.get_mantissa(resistance)), index, shape)
    v_th = _strict_threshold(np.broadcast_to(mant(n.V_th), shape), n.spk_fun, ctx.dtype, name)
    node = nir.LIF(tau=tau, r=_gain_factor(gain, tau, ctx.dt, name),
                   v_leak=_to_nir(v_rest, index, shape), v_threshold=_to_nir(v_th, index, shape),
                   v_reset=_to_nir(v_reset, index, shape), metadata=meta)
    return _single(call, node, index)


def _recurrent_cell(call: Call, index, ctx) -> Emitted:
    cell = call.module
    parts = {}
    for part, arg, out in (('ff', call.arg, None), ('neuron', None, call.out), ('rec', call.out, None)):
        parts[part] = Call(f'{call.name}_{part}', getattr(cell, part), arg, out)
    ff_out = np.zeros(np.shape(call.out))
    parts['ff'].out, parts['rec'].out = ff_out, ff_out
    parts['neuron'].arg = ff_out
    ff = _emit(parts['ff'], index, ctx)
    neuron = _emit(parts['neuron'], ff.index, ctx)
    rec = _emit(parts['rec'], neuron.index, ctx)
    nodes = {**ff.nodes, **neuron.nodes, **rec.nodes}
    edges = ff.edges + neuron.edges + rec.edges + [
        (ff.exit, e) for e in neuron.entry] + [(neuron.exit, e) for e in rec.entry] + [
        (rec.exit, e) for e in neuron.entry]
    return Emitted(nodes, edges, ff.entry, neuron.exit, neuron.index)


# --------------------------------------------------------------------------- loaded graphs
def _level(name: str, nested: dict) -> str:
    """The nested graph that holds the node ``name`` (the innermost), ``''`` for the top."""
    return max((g for g in nested if name.startswith(g + '.')), key=len, default='')


def _within(name: str, graph: str) -> bool:
    return graph == '' or name.startswith(graph + '.')


def _network_graph(net: Network, ctx, metadata=None):
    """The NIR graph of a loaded :class:`~braintrace_conv.nir.Network`, as it was read:
    its nodes (each layer written by the table, its input channels first), its edges in
    their order (so the graph read again steps in the same order, with the same delayed
    cycle edges) and its nested graphs; ``metadata`` for the top graph."""
    import nir
    written = {}
    for name in net.order:
        forward = [net.shapes[s] for s, delayed in net.inputs[name] if not delayed]
        in_shape = tuple(np.broadcast_shapes(*forward)) if forward else net.input_shape
        if name == net.input_name:
            written[name] = nir.Input(input_type=np.array(net.input_shape))
        elif name not in net.layers:        # an Output node, or a nested graph's Input/Output
            graph, shape = _level(name, net.nested), np.array(net.shapes[name])
            entry = graph and name == f'{graph}.{net.nested[graph][0]}'
            written[name] = (nir.Input(input_type=shape) if entry
                             else nir.Output(output_type=shape))
        else:
            call = Call(name, net.layers[name], np.zeros((1, *in_shape)),
                        np.zeros((1, *net.shapes[name])))
            written.update(_emit(call, _canonical(in_shape, False), ctx).nodes)
    return _nested_graph('', written, net.edges, net.nested, metadata)


def _nested_graph(graph: str, written: dict, edges: list, nested: dict, metadata=None):
    """The NIR graph ``graph`` (``''``: the top) of the loaded nodes ``written`` (by their
    full names) and ``edges``: its own nodes and nested graphs, and the edges that lie
    within it and in no graph nested in it (an edge into a nested graph's Input node, or
    out of its Output node, names that graph)."""
    import nir
    prefix = graph + '.' if graph else ''
    children = [g for g in nested if g != graph and _within(g, graph) and
                _level(g, nested) == graph]
    nodes = {}
    for name in written:
        level = _level(name, nested)
        if level == graph:
            nodes[name[len(prefix):]] = written[name]
        else:
            child = next((c for c in children if _within(name, c)), None)
            if child is not None and child[len(prefix):] not in nodes:
                nodes[child[len(prefix):]] = _nested_graph(child, written, edges, nested)
    own = []
    for src, dst in edges:
        common = max((g for g in [*nested, ''] if _within(src, g) and _within(dst, g)),
                     key=len)
        if common != graph:
            continue
        ends = []
        for end, which in ((src, 1), (dst, 0)):
            child = next((c for c in children if end == f'{c}.{nested[c][which]}'), None)
            ends.append((child if child is not None else end)[len(prefix):])
        own.append(tuple(ends))
    return nir.NIRGraph(nodes=nodes, edges=own, type_check=False,
                        **({} if metadata is None else {'metadata': metadata}))


def _loaded(call: Call, index, ctx) -> Emitted:
    """A loaded graph used as a layer of a model: a nested NIR graph."""
    net = call.module
    if len(net.output_names) != 1:
        raise NIRExportError(f'layer {call.name!r} (a loaded graph) has {len(net.output_names)} '
                             f'Output nodes; a graph nested in another has one.')
    _require_layout(call, index, False, 'channels first')
    return _single(call, _network_graph(net, ctx), _canonical(_sample(call.out), False))


def _refuse(reason: str):
    def refuse(call, index, ctx):
        raise NIRExportError(f'layer {call.name!r} ({type(call.module).__name__}): {reason}')
    return refuse


def _table() -> list:
    """(class, how to write it), most specific first; an instance uses the first match."""
    rows = [(nn.RecurrentConvCell, _recurrent_cell),
            ((nn.layers._ConvNd, brainstate.nn.Conv1d, brainstate.nn.Conv2d), _conv),
            ((brainstate.nn.Conv3d,), _refuse('NIR has 1-D and 2-D convolutions only.')),
            ((nn.Linear, brainstate.nn.Linear), _linear),
            ((nn.Flatten, brainstate.nn.Flatten, m.FlattenDims), _flatten),
            ((nn.AvgPool, brainstate.nn.AvgPool2d), _pool),
            ((m.SumPool2d,), _sum_pool),
            ((m.Delay,), _delay),
            ((brainstate.nn.MaxPool1d, brainstate.nn.MaxPool2d, brainstate.nn.MaxPool3d),
             _refuse('NIR 1.0 has sum and average pooling only, no max pooling.')),
            ((nn.Neuron,), _our_neuron),
            ((m.NIRNeuron,), _nir_neuron),
            ((Network,), _loaded)]
    stateless = [(m.Threshold, lambda c, i, x: _single(c, _nir_stateless(c, i), i)),
                 (m.Scale, lambda c, i, x: _single(c, _nir_stateless(c, i), i))]
    try:
        import brainpy.state as bps
        rows.append(((bps.LIF, bps.IF, bps.CubaLIF), _brainpy_neuron))
        rows.append(((bps.ALIF,), _refuse('NIR has no neuron with threshold adaptation.')))
    except ImportError:
        pass
    return rows + stateless


def _nir_stateless(call, index):
    import nir
    layer = call.module
    if isinstance(layer, m.Threshold):
        return nir.Threshold(threshold=_to_nir(np.asarray(layer.threshold), index, _sample(call.arg)))
    return nir.Scale(scale=_to_nir(np.asarray(layer.scale), index, _sample(call.arg)))


def _emit(call: Call, index, ctx) -> Emitted:
    for cls, fn in ctx.table:
        if isinstance(call.module, cls):
            return fn(call, index, ctx)
    raise NIRExportError(f'layer {call.name!r} ({type(call.module).__name__}) has no NIR node.')


# --------------------------------------------------------------------------- one traced step
@contextlib.contextmanager
def _recording(work, table):
    """Record the calls of the layers of ``work`` that the table knows (outermost only)."""
    names = {id(mod): '_'.join(map(str, path)) for path, mod in work.nodes().items() if path}
    known = lambda mod: any(isinstance(mod, cls) for cls, _ in table)
    calls, others, depth = [], {}, [0]
    missing = object()
    saved = []

    def wrap(orig):
        def update(self, *args, **kwargs):
            if id(self) not in names or depth[0] > 0:
                return orig(self, *args, **kwargs)
            if not known(self):           # a container (its layers are recorded) or unknown
                out = orig(self, *args, **kwargs)
                others.setdefault(id(out), self)
                return out
            if len(args) != 1 or kwargs:
                raise NIRExportError(f'layer {names[id(self)]!r} ({type(self).__name__}) is called '
                                     f'with {len(args)} arguments; NIR nodes take one input.')
            depth[0] += 1
            try:
                out = orig(self, *args)
            finally:
                depth[0] -= 1
            calls.append(Call(names[id(self)], self, args[0], out))
            return out
        return update

    for cls in {type(mod) for path, mod in work.nodes().items() if path}:
        saved.append((cls, cls.__dict__.get('update', missing)))
        setattr(cls, 'update', wrap(getattr(cls, 'update')))
    try:
        yield calls, others
    finally:
        for cls, orig in reversed(saved):
            if orig is missing:
                delattr(cls, 'update')
            else:
                setattr(cls, 'update', orig)


def _environment_dt(work, dt: float):
    """``dt`` as the model's neurons read it: a time quantity when their time constants
    are quantities, else plain milliseconds (this library's convention)."""
    for mod in work.nodes().values():
        tau = getattr(mod, 'tau', None)
        tau = tau.value if isinstance(tau, brainstate.State) else tau
        if isinstance(tau, u.Quantity):
            return dt * u.second
    return dt * 1e3


def _input_index(calls, x) -> np.ndarray:
    sample = _sample(x)
    for call in calls:
        if call.arg is x:
            layer = call.module
            layout = getattr(layer, 'layout', None)
            if layout is None and isinstance(layer, nn.RecurrentConvCell):
                layout = layer.ff.layout
            if layout is None and hasattr(layer, 'channels_last'):
                layout = 'channels_last' if layer.channels_last else 'channels_first'
            if layout is None and hasattr(layer, 'channel_axis'):
                layout = 'channels_last' if layer.channel_axis == -1 else 'channels_first'
            if layout is not None:
                return _canonical(sample, layout == 'channels_last')
    return np.arange(math.prod(sample)).reshape(sample)


@dataclasses.dataclass
class _Context:
    dt: float
    dtype: object
    subtract_reset: bool
    unit_r: bool
    table: list
    initial: dict     # id(HiddenState) -> its value before the step


def _graph(calls, others, x, outputs, ctx):
    import nir
    index = _input_index(calls, x)
    nodes = {'input': nir.Input(input_type=np.array(index.shape))}
    edges, producer, layout = [], {id(x): 'input'}, {id(x): index}
    for call in calls:
        src = producer.get(id(call.arg))
        if src is None:
            culprit = others.get(id(call.arg))
            why = (f'comes from {type(culprit).__name__}, which has no NIR node' if culprit is not None
                   else 'is computed by code between layers (a reshape, a sum, a product, ...), '
                        'which NIR cannot express; write it with layers (nn.Flatten, ...)')
            raise NIRExportError(f'the input of layer {call.name!r} ({type(call.module).__name__}) '
                                 f'{why}.')
        emitted = _emit(call, layout[id(call.arg)], ctx)
        nodes.update(emitted.nodes)
        edges += emitted.edges + [(src, e) for e in emitted.entry]
        producer[id(call.out)], layout[id(call.out)] = emitted.exit, emitted.index
    for k, out in enumerate(outputs):
        if id(out) not in producer:
            raise NIRExportError('the model\'s output is computed by code after its last layer, '
                                 'which NIR cannot express; return a layer\'s output.')
        name = 'output' if len(outputs) == 1 else f'output_{k}'
        nodes[name] = nir.Output(output_type=np.array(layout[id(out)].shape))
        edges.append((producer[id(out)], name))
    return nodes, edges, index


def _context(model, dt: float, subtract_reset: bool, unit_r: bool) -> _Context:
    """What the layer table needs to write the layers of ``model``."""
    dtypes = [np.asarray(u.get_mantissa(leaf)).dtype for st in
              model.states(brainstate.ParamState).values()
              for leaf in jax.tree.leaves(st.value, is_leaf=lambda a: isinstance(a, u.Quantity))]
    initial = {id(st): st.value for st in model.states(brainstate.HiddenState).values()}
    return _Context(dt, dtypes[0] if dtypes else np.dtype(brainstate.environ.dftype()),
                    subtract_reset, unit_r, _table(), initial)


def _trace(model, x, dt: float, subtract_reset: bool, unit_r: bool):
    """Nodes, edges and the input's layout index of one step of a copy of ``model``."""
    work = copy.deepcopy(model)
    brainstate.nn.init_all_states(work, x.shape[0])
    ctx = _context(work, dt, subtract_reset, unit_r)
    table = ctx.table
    with brainstate.environ.context(dt=_environment_dt(work, dt)):
        with _recording(work, table) as (calls, others):
            out = work.update(x)
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        return _graph(calls, others, x, outputs, ctx)


def export(model: brainstate.nn.Module, example_input, dt: float, *, path=None,
           subtract_reset: bool = False, unit_r: bool = False):
    r"""Write a model as a NIR graph (and to a file), or refuse what NIR cannot express.

    One step of ``model.update(example_input)`` is run (on a copy: the model's states are
    untouched) and the calls of its layers give the graph: a layer's input must be the
    model's input or another layer's output (several layers may read one), so code between
    layers (a reshape, a sum) is refused; use :class:`~braintrace_conv.nn.Flatten`.
    :class:`~braintrace_conv.nn.RecurrentConvCell` becomes a cycle
    ``ff -> neuron -> rec -> neuron``. A graph loaded by :func:`~braintrace_conv.nir.load`
    (a :class:`~braintrace_conv.nir.Network`) is written as it was read, with its current
    parameters: its nodes, its edges in their order (cycles and summed inputs included, so
    that it is read back into the same network) and its nested graphs; used as a layer of a
    model, it becomes a nested graph.

    What is written, so that :func:`braintrace_conv.nir.load` (forward Euler, spike above
    threshold) reproduces the model's step exactly in its float dtype:

    * conv kernels ``OIHW`` and channels-first shapes: a channels-last model's kernels are
      transposed, and the weights of an affine map after a channels-last flatten are
      permuted to read the channels-first order;
    * time constants in seconds with ``1 - dt / tau`` equal to the neuron's decay per
      step, ``r`` (and ``w_in``) with ``r dt / tau`` equal to its input gain (1 for this
      library's neurons, whose input is the voltage increment of the step), each the float
      closest to that for which the equality holds exactly;
    * ``v_threshold`` the largest float (of the model's dtype) below ``V_th`` when the spike
      function fires at ``V >= V_th``, since NIR fires at ``v > v_threshold``;
    * ``dt`` in the graph's metadata.

    Args:
      model (brainstate.nn.Module): Made of :mod:`braintrace_conv.nn` layers and neurons
        (LIF, IF, CubaLIF, LI; reset ``'zero'``), ``brainstate.nn`` ``Conv1d``/``Conv2d``,
        ``Linear``, ``AvgPool2d`` and ``Flatten``, ``brainpy.state`` ``LIF``, ``IF``,
        ``CubaLIF`` (``spk_reset='hard'``), and graphs loaded by
        :func:`~braintrace_conv.nir.load` (as the model, or as a layer of it).
      example_input (array): One step of input with a batch axis, in the model's layout.
      dt (float): The step in seconds (e.g. ``1e-3`` for this library's default 1 ms).
      path (str or path, optional): Also write the graph to this NIR (HDF5) file.
      subtract_reset (bool, default False): Write neurons that reset by subtraction
        anyway, marked ``{'reset': 'subtract'}`` in the node's metadata. Only
        :func:`~braintrace_conv.nir.load` reads that mark; other libraries reset to
        ``v_reset``.

    Returns:
      nir.NIRGraph: Input node ``input``, Output node ``output`` (``output_k`` for several
      outputs), one node per layer named by its path in the model (``_``-joined).

    Raises:
      ValueError: A layer NIR cannot express, named with the reason: a reset by
        subtraction (unless ``subtract_reset``), threshold adaptation (ALIF), max pooling,
        3-D convolutions, padding that differs between the two sides, a brainpy neuron fed
        by projections, code between layers; or a ``dt`` that is not a positive number.

    Examples:
      >>> import brainstate, jax.numpy as jnp
      >>> import braintrace_conv as bc
      >>> from braintrace_conv import nn, nir as bnir
      >>> net = brainstate.nn.Sequential(nn.Linear(4, 3), nn.LIF(3, tau=5.0, reset='zero'))
      >>> graph = bnir.export(net, jnp.zeros((1, 4)), dt=1e-3)   # one step of input, batch 1
      >>> {name: type(node).__name__ for name, node in graph.nodes.items()}
      {'input': 'Input', 'layers_0': 'Affine', 'layers_1': 'LIF', 'output': 'Output'}
      >>> xs = (brainstate.random.rand(20, 2, 4) < 0.5).astype(float)      # (T, B, 4)
      >>> loaded = bnir.load(graph)                                       # dt from the graph
      >>> bool(jnp.array_equal(bc.BPTT(loaded).predict(xs), bc.BPTT(net).predict(xs)))
      True
    """
    nir = require_nir()
    if isinstance(dt, u.Quantity):
        dt = float(u.get_mantissa(dt.to(u.second)))
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not (math.isfinite(dt) and dt > 0):
        raise ValueError(f'dt must be the step in seconds (a positive number), got {dt!r}.')
    if not isinstance(model, brainstate.nn.Module):
        raise TypeError(f'model must be a brainstate.nn.Module, got {type(model).__name__}.')
    x = jnp.asarray(example_input)
    if x.ndim < 2:
        raise ValueError(f'example_input must be one step with a batch axis, got shape {x.shape}.')
    metadata = {'dt': float(dt), 'exported_by': 'braintrace_conv'}
    if isinstance(model, Network):      # a loaded graph: written as it was read
        if tuple(x.shape[1:]) != model.input_shape:
            raise ValueError(f'example_input must be one step of the loaded graph\'s input, '
                             f'(batch, {", ".join(map(str, model.input_shape))}) channels '
                             f'first, got shape {x.shape}.')
        ctx = _context(model, float(dt), bool(subtract_reset), bool(unit_r))
        graph = _network_graph(model, ctx, dict(metadata, input_layout='channels_first'))
        if path is not None:
            nir.write(str(pathlib.Path(path)), graph)
        return graph
    nodes, edges, index = _trace(model, x, float(dt), bool(subtract_reset), bool(unit_r))
    layout = 'channels_last' if not np.array_equal(index, np.arange(index.size).reshape(index.shape)) \
        else 'channels_first'
    graph = nir.NIRGraph(nodes=nodes, edges=edges, type_check=False,
                         metadata=dict(metadata, input_layout=layout))
    if path is not None:
        nir.write(str(pathlib.Path(path)), graph)
    return graph
