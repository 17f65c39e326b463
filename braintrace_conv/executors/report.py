"""What :meth:`Learner.report` returns: how each parameter gets its gradient, in words.

Every phrase a report prints is here: the executors say which case a parameter falls
into (:func:`online_rows`, :func:`bptt_rows`), this module says it.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

__all__ = ['Report', 'EXACT_READOUT', 'APPROX_READOUT', 'EXACT_OUTPUT_PARAM', 'MIXING_PARAM',
           'UNUSED']

#: A readout whose output reaches no hidden state: the loss at t depends on it only at t.
EXACT_READOUT = 'exact (instantaneous: output reaches no hidden state)'
#: An op that feeds neurons only through other ETP ops (e.g. conv -> conv -> neuron).
APPROX_READOUT = ('approximate (instantaneous only: its output reaches hidden states through '
                  'other ETP ops)')
#: A parameter used only on the path from the states to the output.
EXACT_OUTPUT_PARAM = 'exact (instantaneous: used only on the path to the output)'
#: A parameter that reaches hidden states, but not element by element.
MIXING_PARAM = ('approximate (instantaneous only: reaches hidden states through an op that mixes '
                'positions, or only through other layers)')
UNUSED = 'unused (the loss does not depend on it)'
#: Every parameter under BPTT.
BPTT_METHOD = 'exact (BPTT; memory grows with T)'
#: Every parameter under BPTT driven by ``advance()``: the state carries across calls, the
#: gradient does not.
TRUNCATED_BPTT_METHOD = ('truncated BPTT (exact within each advance() chunk; the state '
                         'carries across chunks, the gradient is cut at their boundaries)')
#: D-RTRL's position-resolved trace of an op's operand.
DRTRL_TRACE = 'exact trace (D-RTRL)'
#: ES-D-RTRL's operands whose weight gradient does not involve the op's input (a bias).
ES_OUTPUT_TRACE = 'exact trace (ES-D-RTRL output trace; does not involve x)'


def es_factorised_trace(decays: list, given: bool) -> str:
    """ES-D-RTRL's input traces (x) output trace of an op's operand, with its decays (as
    texts: ``'0.9512'``, ``'0.9±0.1i'``, ...), one input trace per decay."""
    how = 'given' if given else 'inferred from the model'
    if len(decays) == 1:
        return f'approximate trace (ES-D-RTRL, decay {decays[0]}, {how})'
    return (f'approximate trace (ES-D-RTRL, decays {" / ".join(decays)}, one input trace '
            f'each, {how})')


@dataclasses.dataclass
class Report:
    """How each parameter gets its gradient, and what the traces cost.

    ``rows``: one dict per parameter leaf with ``parameter`` (its name: the key of its
    state in ``model.states()`` joined by dots, then the leaf's path inside the state's
    value, e.g. ``conv.weight['bias']``), ``path`` (the same as a tuple, ``(state key,
    *jax key entries)``), ``shape``, ``method`` (one or more ``'; '``-separated
    descriptions, one per use) and ``trace_bytes`` (memory of the traces attributed to
    it). :meth:`gradient` finds a row's leaf in the ``grads`` a learner returns.

    Method phrases:

    * ``exact trace`` — equals BPTT for this parameter;
    * ``exact within its layer, truncated across layers`` — the recursion is
      exact for the layer the parameter acts in, but the loss also depends on
      the parameter through the dynamics of other layers (or of recurrent
      synapses onto its own layer), and those paths through time are cut;
    * ``approximate trace`` — ES-D-RTRL's factorised kernel trace, with the decays of
      its input traces (exact on a layer whose state and input Jacobians are constant
      in time, when the decays shown are its own);
    * ``truncated BPTT`` — BPTT driven by ``advance()`` (a stream): exact within each
      chunk, the gradient cut at chunk boundaries although the state carries across them;
    * ``exact (instantaneous ...)`` — the parameter acts within one step only;
    * ``approximate (instantaneous only ...)`` — only the within-step
      gradient is computed;
    * ``exact within windows of k steps; across windows: ...`` — an online
      executor with ``window=k``: BPTT inside each window, and the phrase
      after ``across windows`` says how the paths that cross a window
      boundary are covered (by the traces, or not at all for an
      ``instantaneous only`` parameter).
    """
    algorithm: str
    rows: list

    def gradient(self, grads: dict, parameter: str):
        """The leaf of ``grads`` (keyed like ``model.states(ParamState)``, as learners return
        them) that the row named ``parameter`` describes, e.g.
        ``report.gradient(grads, "conv.weight['bias']")`` is ``grads[('conv', 'weight')]['bias']``."""
        rows = [r for r in self.rows if r['parameter'] == parameter]
        if not rows:
            raise KeyError(f'no report row is named {parameter!r}; the rows are '
                           f'{[r["parameter"] for r in self.rows]}.')
        key, *inner = rows[0]['path']
        value = grads[key]
        for entry in inner:
            value = _step_into(value, entry)
        return value

    @property
    def trace_bytes(self) -> int:
        return sum(r['trace_bytes'] for r in self.rows)

    def __str__(self) -> str:
        head = f'{self.algorithm}: total trace memory {self.trace_bytes / 2**20:.2f} MiB\n'
        width = max([len(r['parameter']) for r in self.rows] + [9])
        lines = [f"{'parameter':<{width}}  {'shape':<16} {'trace MiB':>9}  method"]
        for r in self.rows:
            lines.append(f"{r['parameter']:<{width}}  {str(r['shape']):<16} "
                         f"{r['trace_bytes'] / 2**20:>9.3f}  {r['method']}")
        return head + '\n'.join(lines)


def _step_into(value, entry):
    """``value`` indexed by one ``jax.tree_util`` key entry."""
    if isinstance(entry, jax.tree_util.DictKey):
        return value[entry.key]
    if isinstance(entry, jax.tree_util.SequenceKey):
        return value[entry.idx]
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return getattr(value, entry.name)
    return jax.tree.leaves(value)[entry.key]       # FlattenedIndexKey of a custom node


# ----------------------------------------------------------------------------- rows
def bptt_rows(step, truncated: bool = False) -> list:
    """One row per parameter leaf of a captured step, for BPTT (``truncated``: driven by
    ``advance()``)."""
    method = TRUNCATED_BPTT_METHOD if truncated else BPTT_METHOD
    return [dict(parameter=name, path=path, shape=tuple(np.shape(v)), trace_bytes=0,
                 method=method)
            for name, path, v in zip(step.param_names, step.param_paths, step.param_leaves())]


def online_rows(learner, step, graph, state_shapes) -> list:
    """One row per parameter leaf for an online learner: how each use of the parameter
    gets its gradient (``learner._trace_method`` for a traced op operand) and the bytes
    of the traces it needs (``state_shapes``: ``eval_shape`` of the learner's state)."""
    methods = {leaf: [] for leaf in range(step.n_params)}
    bytes_of = {leaf: 0 for leaf in range(step.n_params)}
    _op_methods(learner, graph, state_shapes, methods, bytes_of)
    traced = set()
    for dp, trace in zip(graph.dynamic_params, state_shapes['dyn']):
        methods[dp.leaf].append(_dynamic_method(graph, dp.group))
        bytes_of[dp.leaf] += math.prod(trace.shape) * trace.dtype.itemsize
        traced.add(dp.leaf)
    for leaf, kind in graph.direct_params.items():
        if leaf not in traced:
            methods[leaf].append(EXACT_OUTPUT_PARAM if kind == 'output' else MIXING_PARAM)
    if learner.window is not None:   # what is not exact already is exact within a window
        methods = {leaf: [_windowed(method, learner.window) for method in listed]
                   for leaf, listed in methods.items()}
    values = step.param_leaves()
    return [dict(parameter=step.param_names[leaf], path=step.param_paths[leaf],
                 shape=tuple(np.shape(values[leaf])), method='; '.join(methods[leaf]) or UNUSED,
                 trace_bytes=bytes_of[leaf])
            for leaf in range(step.n_params)]


def _op_methods(learner, graph, state_shapes, methods, bytes_of):
    """The methods and trace bytes of every op operand, added per parameter leaf."""
    op_bytes = learner._op_trace_bytes(graph, state_shapes['ops'])
    for k, op in enumerate(graph.ops):
        for slot, slot_leaves in op.slot_params.items():
            if op.group is not None:
                method = learner._trace_method(graph, k, slot)
                grp = graph.groups[op.group]
                across = learner._across_layers(graph, k) or _across(grp, op.group)
                if grp.feeds and method.startswith('exact'):
                    # a trace other than the learner's own (ES-D-RTRL's exact= ops) is named
                    kind = ' (D-RTRL trace)' if (method == DRTRL_TRACE and
                                                 learner.algorithm != 'D-RTRL') else ''
                    method = f'exact within its layer{kind}, truncated across layers ({across})'
                elif grp.feeds:
                    method = f'{method}; truncated across layers ({across})'
            else:
                method = EXACT_READOUT if op.exact_readout else APPROX_READOUT
            for leaf in slot_leaves:
                methods[leaf].append(f'{method} via {op.primitive.name} #{k}')
                bytes_of[leaf] += op_bytes.get(k, {}).get(slot, 0) // len(slot_leaves)


def _dynamic_method(graph, group_index) -> str:
    """A parameter inside the dynamics of group ``group_index``."""
    grp = graph.groups[group_index]
    names = '/'.join(grp.names)
    if grp.feeds:
        return (f'exact within its layer, truncated across layers '
                f'({_across(grp, group_index)}): elementwise in the dynamics of {names}')
    return f'exact trace (elementwise in the dynamics of {names}, summed over positions)'


def _windowed(method: str, window: int) -> str:
    if method.startswith('exact (instantaneous'):
        return method
    return f'exact within windows of {window} steps; across windows: {method}'


def _across(group, index) -> str:
    kinds = []
    if index in group.feeds:
        kinds.append('recurrent synapses onto the same neurons are cut from the trace')
    if group.feeds - {index}:
        kinds.append('its effect through the dynamics of later layers is cut')
    return '; '.join(kinds)
