"""What :meth:`Learner.report` returns: how each parameter gets its gradient."""
from __future__ import annotations

import dataclasses

import jax

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
    * ``approximate trace`` — ES-D-RTRL's factorised kernel trace (exact only
      on a linear leaky layer whose decay equals the one shown);
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
