"""A NIR graph as a ``brainstate`` module: the node table, the step order and the cycles."""
from __future__ import annotations

import math
import pathlib
from typing import Callable, Optional

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import nn
from ..nn.surrogate import Sigmoid
from . import modules as m

__all__ = ['load', 'Network']


def require_nir():
    """The ``nir`` package, or an ImportError saying how to install it."""
    try:
        import nir
    except ImportError:
        raise ImportError('braintrace_conv.nir needs the nir package: pip install -e ".[nir]" '
                          '(or pip install nir).') from None
    return nir


class NIRLoadError(ValueError):
    """A graph (or node) that cannot be run exactly as NIR describes it."""


def _array(node_name: str, field: str, value) -> np.ndarray:
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise NIRLoadError(f'node {node_name!r}: {field} must be numeric, got {value!r}.') from None
    if not np.all(np.isfinite(array)):
        raise NIRLoadError(f'node {node_name!r}: {field} has non-finite entries.')
    return array


def _positive(node_name: str, field: str, value) -> np.ndarray:
    array = _array(node_name, field, value)
    if not np.all(array > 0):
        raise NIRLoadError(f'node {node_name!r}: {field} must be positive (a time constant in '
                           f'seconds), got minimum {array.min()}.')
    return array


def _pair(value, n: int) -> tuple:
    value = np.asarray(value).reshape(-1)
    return tuple(int(v) for v in (np.repeat(value, n) if value.size == 1 else value))


# --------------------------------------------------------------------------- the node table
def _conv(name, node, shape, opts):
    import nir
    weight = _array(name, 'weight', node.weight)
    n = 1 if isinstance(node, nir.Conv1d) else 2
    if weight.ndim != n + 2:
        raise NIRLoadError(f'node {name!r} ({type(node).__name__}): weight must be (C_out, C_in '
                           f'/ groups, *kernel) with {n} kernel axes, got shape {weight.shape}.')
    if len(shape) != n + 1:
        raise NIRLoadError(f'node {name!r} ({type(node).__name__}): input must be (C, '
                           f'{"W" if n == 1 else "H, W"}) per sample, got {shape}.')
    padding = node.padding
    if isinstance(padding, str):
        padding = padding.upper()
    else:
        padding = tuple((p, p) for p in _pair(padding, n))
    groups = int(node.groups)
    bias = None if node.bias is None else _array(name, 'bias', node.bias)
    cls = nn.Conv1d if n == 1 else nn.Conv2d
    layer = cls(weight.shape[1] * groups, weight.shape[0], weight.shape[2:], stride=_pair(node.stride, n),
                padding=padding, dilation=_pair(node.dilation, n), groups=groups,
                bias=bias is not None,
                layout='channels_first', w_init=m._constant(weight),
                b_init=None if bias is None else m._constant(bias))
    return layer


def _affine(name, node, shape, opts):
    import nir
    weight = _array(name, 'weight', node.weight)
    if weight.ndim != 2:
        raise NIRLoadError(f'node {name!r} ({type(node).__name__}): weight must be 2-D (out, in), '
                           f'got shape {weight.shape}.')
    if shape != (weight.shape[1],):
        raise NIRLoadError(f'node {name!r} ({type(node).__name__}): input must be a vector of '
                           f'{weight.shape[1]} per sample (add a Flatten), got {shape}.')
    bias = None
    if isinstance(node, nir.Affine):   # nir accepts an Affine without bias: a zero bias
        bias = (np.zeros(weight.shape[0]) if node.bias is None
                else _array(name, 'bias', node.bias))
    return nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                     w_init=m._constant(weight.T), b_init=None if bias is None else m._constant(bias))


def _pool(name, node, shape, opts):
    import nir
    if len(shape) != 3:
        raise NIRLoadError(f'node {name!r} ({type(node).__name__}): input must be (C, H, W) per '
                           f'sample, got {shape}.')
    kernel, stride = _pair(node.kernel_size, 2), _pair(node.stride, 2)
    padding = _pair(node.padding, 2)
    if isinstance(node, nir.SumPool2d):
        return m.SumPool2d(kernel, stride, padding)
    # NIR follows PyTorch: padding counts as zeros in the average
    return nn.AvgPool2d(kernel, stride, padding=tuple((p, p) for p in padding),
                        layout='channels_first')


def _flatten(name, node, shape, opts):
    return m.FlattenDims(node.start_dim, node.end_dim)


def _full(name, node, shape, **fields):
    """The node's parameters broadcast to its input's shape (NIR stores them full-shape)."""
    out = {}
    for field, value in fields.items():
        array = _array(name, field, value)
        try:
            out[field] = np.broadcast_to(array, shape).copy()
        except ValueError:
            raise NIRLoadError(f'node {name!r} ({type(node).__name__}): {field} of shape '
                               f'{array.shape} does not fit its input of shape {shape}.') from None
    return out


def _reset(node, opts) -> str:
    """A node whose metadata marks its reset (``{'reset': 'subtract'}``, written by
    :func:`~braintrace_conv.nir.export`) resets so whatever the loader's default."""
    mark = (getattr(node, 'metadata', None) or {}).get('reset')
    mark = mark.decode() if isinstance(mark, bytes) else mark
    return mark if mark in m.RESETS else opts['reset']


def _v_reset(node):
    return 0.0 if getattr(node, 'v_reset', None) is None else node.v_reset


def _lif(name, node, shape, opts):
    p = _full(name, node, shape, tau=_positive(name, 'tau', node.tau), r=node.r,
              v_leak=node.v_leak, v_threshold=node.v_threshold, v_reset=_v_reset(node))
    return m.EulerLIF(**p, dt=opts['dt'], reset=_reset(node, opts), spike_fn=opts['spike_fn'])


def _cuba_lif(name, node, shape, opts):
    p = _full(name, node, shape, tau_syn=_positive(name, 'tau_syn', node.tau_syn),
              tau_mem=_positive(name, 'tau_mem', node.tau_mem), r=node.r, v_leak=node.v_leak,
              v_threshold=node.v_threshold, v_reset=_v_reset(node), w_in=node.w_in)
    return m.EulerCubaLIF(**p, dt=opts['dt'], reset=_reset(node, opts), spike_fn=opts['spike_fn'])


def _if(name, node, shape, opts):
    p = _full(name, node, shape, r=node.r, v_threshold=node.v_threshold, v_reset=_v_reset(node))
    return m.EulerIF(**p, dt=opts['dt'], reset=_reset(node, opts), integrator=opts['integrator'],
                spike_fn=opts['spike_fn'])


def _li(name, node, shape, opts):
    p = _full(name, node, shape, tau=_positive(name, 'tau', node.tau), r=node.r,
              v_leak=node.v_leak)
    return m.EulerLI(**p, dt=opts['dt'])


def _cuba_li(name, node, shape, opts):
    p = _full(name, node, shape, tau_syn=_positive(name, 'tau_syn', node.tau_syn),
              tau_mem=_positive(name, 'tau_mem', node.tau_mem), r=node.r, v_leak=node.v_leak,
              w_in=node.w_in)
    return m.EulerCubaLI(**p, dt=opts['dt'])


def _i(name, node, shape, opts):
    return m.EulerI(**_full(name, node, shape, r=node.r), dt=opts['dt'], integrator=opts['integrator'])


def _threshold(name, node, shape, opts):
    return m.Threshold(**_full(name, node, shape, threshold=node.threshold),
                       spike_fn=opts['spike_fn'])


def _scale(name, node, shape, opts):
    return m.Scale(**_full(name, node, shape, scale=node.scale))


def _delay(name, node, shape, opts):
    delay = _full(name, node, shape, delay=node.delay)['delay']
    steps = np.rint(delay / opts['dt'])
    if np.any(delay < 0) or not np.allclose(steps * opts['dt'], delay, rtol=1e-9, atol=0):
        bad = delay.reshape(-1)[np.argmax(np.abs(steps * opts['dt'] - delay).reshape(-1))]
        raise NIRLoadError(f'node {name!r} (Delay): a delay of {bad} s is not a whole number of '
                           f'steps of dt={opts["dt"]} s, so it cannot be run exactly.')
    return m.Delay(steps.astype(np.int64))


def _node_table():
    import nir
    return {nir.Conv1d: _conv, nir.Conv2d: _conv, nir.Affine: _affine, nir.Linear: _affine,
            nir.SumPool2d: _pool, nir.AvgPool2d: _pool, nir.Flatten: _flatten, nir.LIF: _lif,
            nir.CubaLIF: _cuba_lif, nir.IF: _if, nir.LI: _li, nir.CubaLI: _cuba_li, nir.I: _i,
            nir.Threshold: _threshold, nir.Scale: _scale, nir.Delay: _delay}


# --------------------------------------------------------------------------- graph structure
def _inline(graph, prefix: str = '') -> tuple[dict, list, dict]:
    """Nodes and edges with nested graphs replaced by their contents (names ``outer.inner``);
    a nested graph's Input and Output nodes become pass-throughs. Also returns the nested
    graphs: ``{full name: (its Input node's name, its Output node's name)}``."""
    import nir
    nodes, edges, nested = {}, [], {}
    entry, exit_ = {}, {}
    for name, node in graph.nodes.items():
        full = prefix + name
        if isinstance(node, nir.NIRGraph):
            inner_nodes, inner_edges, inner_nested = _inline(node, full + '.')
            ins = [n for n, v in node.nodes.items() if isinstance(v, nir.Input)]
            outs = [n for n, v in node.nodes.items() if isinstance(v, nir.Output)]
            if len(ins) != 1 or len(outs) != 1:
                raise NIRLoadError(f'nested graph {full!r} must have one Input and one Output '
                                   f'node, got {len(ins)} and {len(outs)}.')
            for n in (ins[0], outs[0]):
                inner_nodes[f'{full}.{n}'] = _PASS
            nodes.update(inner_nodes)
            edges += inner_edges
            nested[full] = (ins[0], outs[0])
            nested.update(inner_nested)
            entry[full], exit_[full] = f'{full}.{ins[0]}', f'{full}.{outs[0]}'
        else:
            nodes[full] = node
    for src, dst in graph.edges:
        src, dst = prefix + _text(src), prefix + _text(dst)
        edges.append((exit_.get(src, src), entry.get(dst, dst)))
    return nodes, edges, nested


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


_PASS = object()   # a nested graph's Input / Output: passes its summed input on


def _order(nodes: dict, edges: list, start: str):
    """Depth-first order from ``start`` (successors in edge order) and the back edges: an edge
    into a node still on the walk's path closes a cycle and carries the one-step delay."""
    succ = {n: [] for n in nodes}
    for src, dst in edges:
        succ[src].append(dst)
    state, post, back = {}, [], []
    stack = [(start, iter(succ[start]))]
    state[start] = 'open'
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            stack.pop()
            state[node] = 'done'
            post.append(node)
        elif state.get(nxt) == 'open':
            back.append((node, nxt))
        elif nxt not in state:
            state[nxt] = 'open'
            stack.append((nxt, iter(succ[nxt])))
    unreached = [n for n in nodes if n not in state]
    if unreached:
        raise NIRLoadError(f'node {unreached[0]!r} is not reachable from the Input node, so no '
                           f'input drives it.')
    return post[::-1], back


# --------------------------------------------------------------------------- the network
class Network(brainstate.nn.Module):
    r"""A loaded NIR graph: one step of the graph per ``update(x)``.

    Every node is a module of :attr:`layers` (keyed by its name in the graph; nodes of a
    nested graph as ``outer.inner``): ``Conv1d``/``Conv2d`` and ``Affine``/``Linear`` are
    :mod:`braintrace_conv.nn` layers on the ETP ops (their weights and biases are the
    parameters the executors train), the other nodes are the modules of
    :mod:`braintrace_conv.nir.modules`. Nodes run in a depth-first order from the Input
    node; several inputs into a node are summed. An edge that closes a cycle carries a
    one-step delay: its target reads its source's output of the previous step. That value
    is recomputed from the stored states of the spiking and integrating nodes it depends
    on (so a recurrent conv needs no extra state, and reads zero spikes at the first step);
    where it depends on no such node, the source's output is kept in a ``HiddenState`` of
    :attr:`delayed` (zero at the first step).

    Args:
      layers (dict): Node name -> module.
      inputs (dict): Node name -> ``[(source, delayed)]`` in edge order.
      order (list of str): The step order.
      input_name (str), output_names (list of str): The graph's Input and Output nodes.
      shapes (dict): Node name -> output shape of one sample.
      edges (list of (str, str), optional): The graph's edges in its order (which decides
        the step order and the cycles' delays when the graph is read again); default:
        those of ``inputs``.
      nested (dict, optional): The nested graphs, ``{name: (its Input node, its Output
        node)}``: their nodes are named ``name.node``, their Input and Output nodes pass
        their summed input on. :func:`~braintrace_conv.nir.export` writes them back as
        nested graphs.

    Notes:
      ``update(x)`` takes ``x`` of shape ``(batch, *input_shape)``, channels first as NIR
      (``(batch, C, H, W)`` for a 2-D conv net), and returns the Output node's value of the
      step, or a tuple of them (in graph order) when the graph has several.
    """

    def __init__(self, layers: dict, inputs: dict, order: list, input_name: str,
                 output_names: list, shapes: dict, name: Optional[str] = None, *,
                 edges: Optional[list] = None, nested: Optional[dict] = None):
        super().__init__(name=name)
        self.layers = layers
        self.inputs, self.order = inputs, order
        self.input_name, self.output_names, self.shapes = input_name, output_names, shapes
        self.edges = (list(edges) if edges is not None else
                      [(src, dst) for dst in order for src, _ in inputs.get(dst, ())])
        self.nested = dict(nested or {})
        self.input_shape = shapes[input_name]
        self._plan_delays()

    def _plan_delays(self):
        sources = {s for ins in self.inputs.values() for s, delayed in ins if delayed}
        self.recomputed, self.buffered = {}, []
        for src in sorted(sources):
            chain, boundary, ok, todo = set(), set(), True, [src]
            while todo and ok:
                n = todo.pop()
                layer = self.layers.get(n)
                if isinstance(layer, m.NIRNeuron):
                    boundary.add(n)
                elif n == self.input_name or isinstance(layer, m.Delay) or \
                        any(d for _, d in self.inputs[n]):
                    ok = False
                elif n not in chain:
                    chain.add(n)
                    todo += [s for s, _ in self.inputs[n]]
            if ok:
                self.recomputed[src] = ([n for n in self.order if n in chain], sorted(boundary))
            else:
                self.buffered.append(src)
        self.live = self._live()

    def _live(self) -> set:
        """The nodes a step must evaluate: those the outputs and the kept delays depend on
        (a recomputed delay needs the states of its neurons, not its chain's values)."""
        live, todo = set(), list(self.output_names) + list(self.buffered)
        while todo:
            n = todo.pop()
            if n in live:
                continue
            live.add(n)
            for src, delayed in self.inputs.get(n, ()):
                todo += self.recomputed[src][1] if delayed and src in self.recomputed else [src]
        return live

    def init_state(self, batch_size: Optional[int] = None, **kwargs):
        """Create the delay buffers (zeros) of the cycles that cannot be recomputed."""
        self.delayed = {s: brainstate.HiddenState(jnp.zeros(
            m._batched(self.shapes[s], batch_size), brainstate.environ.dftype()))
            for s in self.buffered}

    def reset_state(self, batch_size: Optional[int] = None, **kwargs):
        """Set the delay buffers back to zero."""
        self.init_state(batch_size)

    def _apply(self, name: str, values: dict, delayed: dict):
        terms = [(delayed if d else values)[s] for s, d in self.inputs[name]]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        layer = self.layers.get(name)
        return total if layer is None else layer(total)

    def _previous(self) -> dict:
        delayed = {s: self.delayed[s].value for s in self.buffered}
        for src, (chain, boundary) in self.recomputed.items():
            values = {n: self.layers[n].previous_output() for n in boundary}
            for n in chain:
                values[n] = self._apply(n, values, {})
            delayed[src] = values[src]
        return delayed

    def update(self, x):
        """One step of the graph; see the class notes for shapes."""
        if jnp.ndim(x) != len(self.input_shape) + 1 or tuple(jnp.shape(x)[1:]) != self.input_shape:
            raise ValueError(f'the loaded NIR graph expects input of shape (batch, '
                             f'{", ".join(map(str, self.input_shape))}) (channels first), got '
                             f'{tuple(jnp.shape(x))}.')
        delayed = self._previous()
        values = {self.input_name: x}
        for name in self.order:
            if name != self.input_name and name in self.live:
                values[name] = self._apply(name, values, delayed)
        for s in self.buffered:
            self.delayed[s].value = values[s]
        outs = tuple(values[n] for n in self.output_names)
        return outs[0] if len(outs) == 1 else outs


def _input_shape(name: str, node, consumers: list) -> tuple:
    shape = node.input_type['input']
    if shape is None:
        raise NIRLoadError(f'Input node {name!r} has no shape.')
    shape = tuple(int(s) for s in np.asarray(shape).reshape(-1))
    import nir
    wants = {nir.Conv1d: 2, nir.Conv2d: 3, nir.SumPool2d: 3, nir.AvgPool2d: 3, nir.Affine: 1,
             nir.Linear: 1}
    ranks = {wants.get(type(c)) for c in consumers} - {None}
    if len(ranks) == 1 and len(shape) == ranks.pop() + 1 and shape[0] == 1:
        shape = shape[1:]   # an exporter wrote the example's shape, batch axis of 1 included
    return shape


def _shape_of(layer, in_shape: tuple) -> tuple:
    if isinstance(layer, m.FlattenDims):
        return layer.output_shape(in_shape)
    if isinstance(layer, (m.NIRNeuron, m.Delay)):
        return layer.out_size
    x = jax.ShapeDtypeStruct((1,) + in_shape, brainstate.environ.dftype())
    return tuple(jax.eval_shape(layer, x).shape[1:])


def load(graph_or_path, dt: Optional[float] = None, *, reset: str = 'value',
         integrator: str = 'charge', spike_fn: Callable = Sigmoid(4.0)) -> Network:
    r"""Build a trainable ``brainstate`` module from a NIR graph.

    The returned :class:`Network` advances one step of ``dt`` seconds per ``update(x)``,
    discretised by forward Euler as the NIR libraries run it
    (:mod:`braintrace_conv.nir.modules` gives the equations). Its conv and affine weights
    are ``brainstate.ParamState`` on the ETP ops, so :class:`~braintrace_conv.BPTT`,
    :class:`~braintrace_conv.D_RTRL` and :class:`~braintrace_conv.ES_D_RTRL` train it like
    any other model.

    Args:
      graph_or_path (nir.NIRGraph, str or path): A graph, or a NIR (HDF5) file to read.
      dt (float, optional): Step in seconds. Default: the ``dt`` in the graph's metadata
        (written by :func:`braintrace_conv.nir.export`); a graph without one needs it
        (snnTorch runs its graphs at 1e-4 s, Norse at 1e-3 s by default).
      reset ({'value', 'subtract', 'subtract_after_leak'}, default 'value'): ``'value'``
        sets ``v`` to ``v_reset`` after a spike, as NIR says. ``'subtract'`` lowers it by
        ``v_threshold - v_reset`` instead, and ``'subtract_after_leak'`` subtracts that after
        the leak of the next step (:mod:`~braintrace_conv.nir.modules`): the resets of
        Sinabs' ``IAF`` and snnTorch's ``Leaky``/``Synaptic`` with ``reset_delay=False``,
        and of snnTorch's default ``reset_delay=True``, which they export as ``v_reset``
        (NIR has no field for a reset by subtraction). A node whose metadata marks its
        reset (``{'reset': 'subtract'}``, by :func:`~braintrace_conv.nir.export`) resets
        so whatever this option says.
      integrator ({'charge', 'euler'}, default 'charge'): How IF and I nodes integrate:
        ``v += r x`` per step (what every NIR library runs) or ``v += r dt x`` (NIR's
        :math:`\dot v = R I` by forward Euler).
      spike_fn (callable, default ``Sigmoid(4.0)``): Surrogate spike function of the
        spiking nodes (:mod:`braintrace_conv.nn.surrogate` or braintools').

    Returns:
      Network: with states to be created by ``brainstate.nn.init_all_states(net, batch)``
      (the executors do it). Inputs ``(batch, *input_shape)``, channels first.

    Raises:
      ValueError: A node that cannot be run exactly (the message names it and says why):
        an unknown node type, a Delay that is not a whole number of steps, weights or
        parameters of shapes that do not fit, non-positive time constants; a graph without
        exactly one Input node; a missing ``dt``; a file that ``nir`` cannot read (one
        sentence naming the file and nir's reason). A file is read without nir's type
        check, which some peers' files fail although they run (nir 1.0 checks nested
        graphs all the same; such a file is read again with them unchecked).
      FileNotFoundError: No file at ``graph_or_path``.

    Examples:
      A graph as another library writes it: an affine map of 4 inputs onto 3 LIF neurons
      (time constants in seconds), run at steps of 1 ms:

      >>> import jax.numpy as jnp, nir, numpy as np
      >>> import braintrace_conv as bc
      >>> from braintrace_conv import nir as bnir
      >>> graph = nir.NIRGraph.from_list(
      ...     nir.Affine(weight=np.ones((3, 4)), bias=np.zeros(3)),
      ...     nir.LIF(tau=np.full(3, 0.01), r=np.ones(3), v_leak=np.zeros(3),
      ...             v_threshold=np.ones(3)))
      >>> net = bnir.load(graph, dt=1e-3)
      >>> spikes = bc.BPTT(net).predict(jnp.ones((5, 2, 4)))     # (T, B, 4) in, (T, B, 3) out
      >>> spikes[:, 0, 0].tolist()          # v = 0.4, 0.76, 1.084 > 1: a spike, reset to 0
      [0.0, 0.0, 1.0, 0.0, 0.0]
    """
    nir = require_nir()
    graph = _read(graph_or_path) if isinstance(graph_or_path, (str, pathlib.Path)) \
        else graph_or_path
    if not isinstance(graph, nir.NIRGraph):
        raise TypeError(f'graph_or_path must be a nir.NIRGraph or a path to a NIR file, got '
                        f'{type(graph).__name__}.')
    meta_dt = (graph.metadata or {}).get('dt')
    if dt is None and meta_dt is None:
        raise ValueError('dt is required: the graph has no "dt" in its metadata and NIR graphs '
                         'carry no step; pass dt in seconds (snnTorch assumes 1e-4).')
    dt = float(meta_dt if dt is None else dt)
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f'dt must be a positive number of seconds, got {dt!r}.')
    for name, value, choices in (('reset', reset, m.RESETS),
                                 ('integrator', integrator, m.INTEGRATORS)):
        if value not in choices:
            raise ValueError(f'{name} must be one of {choices}, got {value!r}.')
    opts = dict(dt=dt, reset=reset, integrator=integrator, spike_fn=spike_fn)
    return _build(graph, opts)


def _read(path):
    """The graph of the NIR file ``path``, read without nir's type check (which the shapes
    some peers declare fail, though the graph runs). nir 1.0 type-checks nested graphs
    all the same, so a file it cannot read is read again with every nested graph
    unchecked. A file nir cannot read either way raises :class:`NIRLoadError`: one
    sentence naming the file and nir's reason."""
    import nir
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f'NIR file {path} does not exist')
    try:
        return nir.read(str(path), type_check=False)
    except Exception:   # nir and h5py raise what they raise; relayed below, if a retry fails
        pass
    try:
        return _read_unchecked(path)
    except Exception as error:
        reason = ' '.join(str(error).split()) or 'no message'
        raise NIRLoadError(f'{path} cannot be read as a NIR graph: nir says '
                           f'{type(error).__name__}: {reason}') from None


def _read_unchecked(path: pathlib.Path):
    """``nir.read(path, type_check=False)`` for nested graphs too."""
    import h5py
    import nir
    from nir.serialization import hdf2dict

    def unchecked(node: dict) -> None:
        if isinstance(node, dict) and _text(node.get('type')) == 'NIRGraph':
            node['type_check'] = False
            for inner in node.get('nodes', {}).values():
                unchecked(inner)

    with h5py.File(path, 'r') as f:
        data = hdf2dict(f['node'])
    unchecked(data)
    return nir.dict2NIRNode(data)


def _build(graph, opts) -> Network:
    import nir
    nodes, edges, nested = _inline(graph)
    ins = [n for n, v in nodes.items() if isinstance(v, nir.Input)]
    outs = [n for n, v in nodes.items() if isinstance(v, nir.Output)]
    if len(ins) != 1:
        raise NIRLoadError(f'the graph must have exactly one Input node, got {len(ins)}: {ins}.')
    if not outs:
        raise NIRLoadError('the graph has no Output node.')
    order, back = _order(nodes, edges, ins[0])
    back = set(back)
    inputs = {n: [] for n in nodes}
    for src, dst in edges:
        inputs[dst].append((src, (src, dst) in back))
    table = _node_table()
    consumers = [nodes[d] for s, d in edges if s == ins[0]]
    shapes = {ins[0]: _input_shape(ins[0], nodes[ins[0]], consumers)}
    layers, in_shapes = {}, {}
    for name in order[1:]:
        node = nodes[name]
        forward = [shapes[s] for s, d in inputs[name] if not d]
        if not forward:
            raise NIRLoadError(f'node {name!r} is driven only through a cycle.')
        try:
            in_shape = tuple(np.broadcast_shapes(*forward))
        except ValueError:
            raise NIRLoadError(f'node {name!r}: its inputs have shapes {forward}, which cannot '
                               f'be summed.') from None
        in_shapes[name] = in_shape
        if node is _PASS or isinstance(node, nir.Output):
            shapes[name] = in_shape
            continue
        if type(node) not in table:
            raise NIRLoadError(f'node {name!r} of type {type(node).__name__} is not a NIR 1.0 '
                               f'node this loader runs.')
        layers[name] = table[type(node)](name, node, in_shape, opts)
        shapes[name] = _shape_of(layers[name], in_shape)
    for src, dst in back:
        target = in_shapes[dst]
        if np.broadcast_shapes(shapes[src], target) != target:
            raise NIRLoadError(f'the cycle edge ({src!r}, {dst!r}) carries shape {shapes[src]} '
                               f'into a node of shape {target}.')
    return Network(layers, inputs, order, ins[0], outs, shapes, edges=edges, nested=nested)
