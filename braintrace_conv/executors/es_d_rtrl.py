r"""ES-D-RTRL: linear-memory traces, input traces ⊗ output trace (``docs/theory.md``).

Per grouped op, one output trace carries the dynamics of the neurons the op drives,
and one input trace per timescale of those neurons filters the op's input::

    ef^t   = D^t ef^{t-1} + Df^t                    per op, (*y.shape, m)
    ex_j^t = lambda_j ex_j^{t-1} + x^t              per distinct (op input, lambda_j)
    Z_j^t  = lambda_j Z_j^{t-1} + 1
    dW    += sum_j xy_to_dw(ex_j^t / Z_j^t, sum_m g^t * (P_j ef^t))

with ``Dbar = sum_j lambda_j P_j`` the spectral decomposition of the group's mean
``m x m`` state Jacobian (:mod:`._analysis.spectrum`): a LIF neuron has one decay, its
membrane's, and this is one weight-gradient convolution per op and step, the work BPTT
does per step; an adaptive neuron (ALIF) or a current-based one (CubaLIF) has two: two
input traces and two contractions per op and step. A complex pair of decays takes the
real and imaginary parts of one complex input trace, a Jordan chain (equal coupled
decays) a cascade of input traces, and the normalisation is then the matrix ``W^t`` of
:mod:`._analysis.spectrum` rather than one ``Z_j`` per trace. ``D``, ``Df`` and ``g``
are those of the group's state cut, so a reset-after-spike neuron costs no more than
any other. Operands whose weight gradient does not involve ``x`` (a bias) only need
``ef``, and are exact. On a layer whose state Jacobian and input Jacobian do not change
in time (a linear layer with any number of coupled states) this equals D-RTRL, and so
BPTT on one such layer; on spiking layers it is an approximation.

``Dbar`` is taken after two steps from the model's initial state with zero input, every
function differentiated as its value changes, so that spikes are constant whatever their
lowering (:mod:`._analysis.held`): for a LIF neuron in any style ``exp(-dt/tau)``, for
an ALIF neuron at rest ``exp(-dt/tau)`` and ``exp(-dt/tau_a)``. When ``Dbar`` depends on
parameters (a trainable time constant), the decays are inferred again at every call from
the parameters of that call and passed to the compiled program as arguments, so they
follow training without a new compilation; a change in their number or kind (two decays
merging, a pair appearing) starts new traces in :meth:`value_and_grad` and is refused in
the middle of an :meth:`advance` run. With ``decay`` given, every op has that one decay
instead, paired with its whole output trace. :meth:`report` shows each op's decays, those
of the last call.

``cross_layer=1`` follows each factorised trace one hop further, through the dynamics of
the neurons of the op that reads its neurons (the next layer, a leaky readout): per such
pair, three more traces (the input trace filtered again by the reader's decay, the gated
output trace ``post``, and ``sig`` on the reader's neurons) and per step one transposed
reader and one more ``xy_to_dw``::

    dW += xy_to_dw(x_lm / Z_lm, post * J^T(sum_m g_m * D_m sig) / Z_lm)

(``docs/theory.md``, "One hop across layers"; exact on the top two layers of a stack of
linear leaky layers).

``exact=`` and ``exact_budget=`` give some ops D-RTRL's exact traces instead
(``D_RTRL``'s recursion, position-resolved, memory ``B * S_out * |K| * m``): where a
model's long memory lives in a few small layers, those get exact traces and the large
ones keep linear memory.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import ArgumentError, WrongTypeError, integer, interval, optional
from ..primitive import DRTRL_RULES, ES_DRTRL_RULES, apply_state_jacobian
from . import _scan
from .base import OnlineLearner
from .d_rtrl import advance_exact_trace, contract_exact_trace, exact_trace_bytes
from .report import DRTRL_TRACE, ES_OUTPUT_TRACE, es_factorised_trace
from ._analysis import hops as hop_paths, spectrum
from ._analysis.jaxpr import depends_on, is_literal

__all__ = ['ES_D_RTRL']


def _decay_value(decay):
    return optional(interval, 'decay', decay, 0.0, 1.0, '(]', means='inferred from the model',
                    fix="a membrane's decay per step is exp(-dt/tau)")


def _cross_layer_value(cross_layer) -> int:
    cross_layer = integer('cross_layer', cross_layer, sign='non-negative')
    if cross_layer > 1:
        raise ArgumentError('cross_layer', cross_layer, "be 0 (each layer's own traces) or 1 "
                            "(one hop through the neurons of the op that reads the layer)")
    return cross_layer


def _exact_paths(exact) -> tuple:
    if exact is None:
        return ()
    paths = (exact,) if isinstance(exact, str) else exact
    try:
        paths = tuple(paths)
    except TypeError:
        raise WrongTypeError('exact', exact, 'be a parameter path or a sequence of them',
                             shown=type(exact).__name__) from None
    if not all(isinstance(p, str) and p for p in paths):
        raise WrongTypeError('exact', exact, 'hold parameter paths (non-empty strings), as '
                             'report() prints them')
    return paths


def _matches(path: str, name: str) -> bool:
    """Whether ``path`` names the parameter ``name`` or a module or state above it."""
    return name == path or (name.startswith(path) and name[len(path)] in '.[')


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """How one analysed step's grouped ops are traced.

    Attributes:
      exact: ops with D-RTRL's exact traces.
      modes: per other grouped op, its group's :class:`~._analysis.spectrum.Mode` list.
      given: whether those are one decay given for every op.
      filters: per input trace, ``(first op reading it, its Filter)``.
      reads: per input trace, ``[(coefficient, input trace)]`` of its update (see
        :meth:`~._analysis.spectrum.Filter.reads`).
      pairs: per ES op, ``[(input trace, C)]``: its input traces and their ``m x m``
        matrices; ``C`` is None for an op traced with one decay (``single``).
      single: ES ops with one input trace paired with the whole output trace.
      hops: with ``cross_layer=1``, every :class:`~._analysis.hops.Hop` of the step.
      hop_traces: per one-hop trace, a :class:`_HopTrace`.
      keys: per input trace, what identifies it (the input, then its decay, or with
        decays that follow the parameters its group and mode).
    """
    exact: frozenset
    modes: dict
    given: bool
    filters: list
    reads: list
    pairs: dict
    single: frozenset
    hops: list = ()
    hop_traces: list = ()
    keys: tuple = ()

    @property
    def structure(self) -> tuple:
        """What the traces' shapes and wiring depend on, the decays' values left out."""
        return (self.keys, tuple((k, tuple(s for s, _ in p)) for k, p in self.pairs.items()),
                self.single, tuple((ht.op, ht.hop) for ht in self.hop_traces))

    @property
    def values(self) -> dict:
        """The numbers the traced program reads: per input trace the coefficients of its
        update (``reads``), per factorised op its stacked ``C`` matrices, per one-hop
        trace the reader's decay; Python floats and numpy arrays."""
        return dict(reads=[[c for c, _ in r] for r in self.reads],
                    C={k: np.stack([c for _, c in p]) for k, p in self.pairs.items()
                       if k not in self.single},
                    hop=[ht.decay for ht in self.hop_traces])


@dataclasses.dataclass(frozen=True, eq=False)
class _HopTrace:
    """The one-hop trace of ES op ``op`` through ``plan.hops[hop]``: the reader's decay
    ``decay``, and per mode of ``op``'s factorised trace ``(input trace, projector)``
    (``None``: the whole output trace)."""
    op: int
    hop: int
    decay: float
    modes: tuple


class ES_D_RTRL(OnlineLearner):
    """ES-D-RTRL: online gradients from traces linear in the layer size.

    Every conv or dense op keeps a trace of how the state it drives responds to its output
    and one decaying trace of its input per timescale of those neurons (one for a LIF
    neuron, two for an ALIF or CubaLIF neuron); each step adds their products to the weight
    gradient (per timescale one weight-gradient convolution, the work BPTT does per step),
    so memory does not grow with the sequence. Biases, neuron parameters and readouts get
    exact gradients, kernels an approximation that is exact on a layer whose state and
    input Jacobians do not change in time (a linear layer, with any number of coupled
    states). Unless ``decay`` is given, the decays are inferred from the model (a LIF
    neuron's ``exp(-dt/tau)``); ``exact`` and ``exact_budget`` give chosen ops D-RTRL's
    exact traces instead. The recursions and how the decays are inferred:
    :mod:`braintrace_conv.executors.es_d_rtrl` and ``docs/theory.md``;
    :meth:`~braintrace_conv.executors.Learner.report` says how each gradient was computed.

    Args:
      model: a ``brainstate.nn.Module``.
      decay: ``None`` (default): each op gets the decays of the neurons it drives,
        inferred from the model, one input trace per decay; or one input-trace decay in
        ``(0, 1]`` (a Python, numpy or jax real scalar) for every op, paired with its
        whole output trace.
      exact: parameter paths as :meth:`report` prints them (``"blocks.1.rec.weight"``,
        ``"fc.weight['weight']"``), or a module path above them (``"blocks.1"``): the ops
        that use those parameters get D-RTRL's exact traces. A path that names no op
        traced by its neurons' dynamics is an error.
      exact_budget: bytes: further ops get exact traces, smallest trace first, as long
        as all the exact traces together (those of ``exact`` included) take at most
        this many bytes at the call's shapes. ``None`` (default): only ``exact``.
      trace_dtype: ``None`` (traces in the model's dtype) or a floating dtype for
        the traces and gradient accumulators, e.g. ``jnp.float32`` for a bfloat16
        model (mixed precision).
      window: ``None`` (traces only) or a number of steps ``k``: exact BPTT inside
        windows of ``k`` steps, these traces across windows (see
        :class:`~braintrace_conv.executors.OnlineLearner`); ``k >= T`` is BPTT.
      check_finite: refuse inputs and targets holding a NaN or an infinity, naming the
        first such time step (default); ``False`` skips this one pass over the data.
      cross_layer: ``0`` (default): each layer's traces follow its own neurons only, and
        a layer's effect through the dynamics of the layers above is cut. ``1``: the
        factorised trace of every op whose neurons are read by the op of another group
        (the next layer, a leaky readout) also follows them one hop, through the
        dynamics of that op's neurons (``docs/theory.md``, "One hop across layers"):
        per such pair one more weight-gradient call and one transposed op per step, and
        traces of the shapes of the op's input, its output and the reader's output. The
        reader's neurons must have one decay (given or inferred) and the ops traced with
        several decays real ones; the read must be a linear map (average or sum pooling,
        reshapes) of one value per neuron.

    Examples:
      A conv block of LIF neurons and a dense readout, 10 steps of 2 samples:

      >>> import brainstate, jax.numpy as jnp, optax
      >>> import braintrace_conv as bc
      >>> from braintrace_conv.models import recurrent_conv_snn
      >>> brainstate.random.seed(0)
      >>> model = recurrent_conv_snn((2, 8, 8), 3, channels=(4,), readout='linear')
      >>> xs = (brainstate.random.rand(10, 2, 2, 8, 8) < 0.2).astype(float)   # (T, B, C, H, W)
      >>> labels = jnp.zeros((10, 2), int)                                    # (T, B)
      >>> def loss_fn(scores, label):                   # one step: scores (B, 3), labels (B,)
      ...     return optax.softmax_cross_entropy_with_integer_labels(scores, label).mean()
      >>> learner = bc.ES_D_RTRL(model)
      >>> loss, grads = learner.value_and_grad(loss_fn, xs, labels)   # loss summed over T
      >>> grads[('blocks', 0, 'ff', 'weight')].shape                    # like the kernel
      (4, 2, 3, 3)
      >>> for row in learner.report().rows:     # print(learner.report()): the whole table
      ...     print(f"{row['parameter']:<19}{row['method'].split(' via ')[0]}")
      blocks.0.ff.bias   exact trace (ES-D-RTRL output trace; does not involve x)
      blocks.0.ff.weight approximate trace (ES-D-RTRL, decay 0.9048, inferred from the model)
      fc.bias            exact (instantaneous: output reaches no hidden state)
      fc.weight          exact (instantaneous: output reaches no hidden state)
    """

    algorithm = 'ES-D-RTRL'
    required_rules = ES_DRTRL_RULES
    # Its traces are small: on the DVS-sized net a call with them donated took 1.14-1.18x
    # the time of one with fresh buffers (equal on the standard workload), while D-RTRL's
    # large traces gain from donation (0.87x); benchmarks/call_overheads.py.
    donate_state = False

    def __init__(self, model, decay=None, *, exact: Sequence[str] | str | None = None,
                 exact_budget: int | None = None, trace_dtype=None, window=None,
                 check_finite=True, cross_layer: int = 0):
        super().__init__(model, trace_dtype=trace_dtype, window=window, check_finite=check_finite)
        self.decay = _decay_value(decay)
        self.cross_layer = _cross_layer_value(cross_layer)
        self.exact = _exact_paths(exact)
        self.exact_budget = optional(integer, 'exact_budget', exact_budget, sign='non-negative',
                                     means='only the ops named by exact')
        self._exact_ops = {}    # graph id -> ops with exact traces
        self._plans = {}        # graph id -> _Plan (of the last call)
        self._rest = {}         # graph id -> RestJacobians, where decays are inferred
        self._values_in_call = None   # while a call is traced: its plan values, traced

    # ------------------------------------------------------------------ which ops, which decays
    def _prepare(self, step):
        graph = super()._prepare(step)
        exact = self._choose_exact(graph)
        for k in sorted(exact):
            missing = graph.ops[k].primitive.missing_rules(DRTRL_RULES)
            if missing:
                raise NotImplementedError(f'{graph.ops[k].label} lacks the ETP rules {missing} '
                                          f'that its exact trace (exact=) needs.')
        self._exact_ops[id(graph)] = exact
        return graph

    def _choose_exact(self, graph) -> frozenset:
        """The ops named by ``exact``, then those that fit ``exact_budget``."""
        traced = [k for k, op in enumerate(graph.ops) if op.group is not None]
        names = {k: [graph.step.param_names[leaf] for leaves in graph.ops[k].slot_params.values()
                     for leaf in leaves] for k in traced}
        chosen = set()
        for path in self.exact:
            hits = [k for k in traced if any(_matches(path, n) for n in names[k])]
            if not hits:
                listed = sorted({n for k in traced for n in names[k]})
                raise ArgumentError('exact', path, f'name a parameter of an op whose output '
                                    f'drives neurons, or a module above one: one of {listed}',
                                    shown=repr(path))
            chosen.update(hits)
        if self.exact_budget is not None:
            sizes = {k: sum(exact_trace_bytes(jax.eval_shape(
                lambda k=k: self.op_trace_zeros(graph, k, 'init_drtrl'))).values()) for k in traced}
            total = sum(sizes[k] for k in chosen)
            for k in sorted(set(traced) - chosen, key=lambda k: (sizes[k], k)):
                if total + sizes[k] <= self.exact_budget:
                    chosen.add(k)
                    total += sizes[k]
        return frozenset(chosen)

    def _plan(self, graph) -> _Plan:
        """The tracing of each grouped op, with the decays of the last call."""
        if id(graph) not in self._plans:
            self._plans[id(graph)] = self._make_plan(graph)
        return self._plans[id(graph)]

    def _values(self, graph) -> dict:
        """The plan's numbers as the traced program reads them: arguments of the call when
        the decays follow the parameters (:meth:`_call_values`), else constants."""
        if self._values_in_call is not None:
            return self._values_in_call
        return self._plan(graph).values

    def _follows_parameters(self, graph) -> bool:
        rest = self._rest.get(id(graph))
        return rest is not None and rest.depends_on_params

    def _follow_parameters(self, graph, continuing: bool) -> None:
        """Infer the decays again from the model's parameters, where they depend on them."""
        if not self._follows_parameters(graph):
            return
        old = self._plan(graph)
        new = self._make_plan(graph, self._rest[id(graph)](graph.step.param_leaves()))
        if new.structure != old.structure:
            describe = lambda plan: '; '.join(
                f'{graph.ops[k].label}: {", ".join(m.describe() for m in found)}'
                for k, found in plan.modes.items())
            if continuing:
                raise ValueError(f'ES_D_RTRL: the decays inferred from the parameters changed '
                                 f'in number or kind during an advance() run ({describe(old)} '
                                 f'became {describe(new)}), so the traces of the run no '
                                 f'longer fit them; call reset(batch_size) to start new '
                                 f'traces, or pass ES_D_RTRL(model, decay=...).')
            self._compiled.clear()
            self._state_specs.pop(id(graph), None)
            self._carry = None
        self._plans[id(graph)] = new

    def _call_values(self, graph):
        if not self._follows_parameters(graph):
            return ()
        dtype = self.dtype(graph)
        return jax.tree.map(lambda v: jnp.asarray(v, dtype), self._plan(graph).values)

    def _traced_call(self, values, sequence):
        self._values_in_call = values if values != () else None
        try:
            return sequence()
        finally:
            self._values_in_call = None

    def _make_plan(self, graph, mean_jacobians=None) -> _Plan:
        """The plan for the decays of ``mean_jacobians`` (``Dbar`` per group; inferred
        from the model's current parameters when None)."""
        exact = self._exact_ops[id(graph)]
        es_ops = [k for k, op in enumerate(graph.ops) if op.group is not None and k not in exact]
        if self.decay is not None:
            group_modes = {gi: spectrum.single_decay(self.decay, grp.m)
                           for gi, grp in enumerate(graph.groups)}
        elif es_ops:
            if mean_jacobians is None:
                rest = self._rest[id(graph)] = spectrum.RestJacobians(graph)
                mean_jacobians = rest(graph.step.param_leaves())
            group_modes = {gi: spectrum.modes(d) for gi, d in enumerate(mean_jacobians)}
        else:
            group_modes = {}
        # decays that follow the parameters are keyed by group and mode, not by value, so
        # that two groups whose decays happen to agree do not share traces that must part
        following = self._follows_parameters(graph)
        keys, filters, pairs, single = [], [], {}, set()
        for k in es_ops:
            op = graph.ops[k]
            found = group_modes[op.group]
            largest = spectrum.largest_modulus(found)
            if largest > 1 + spectrum.MERGE_TOLERANCE:
                raise ValueError(f'the dynamics of the neurons {op.label} drives grow at the '
                                 f'initial state (a decay of modulus {largest:.4g} > 1 per '
                                 f'step); pass ES_D_RTRL(model, decay=...) explicitly.')
            is_single = spectrum.is_single(found, graph.groups[op.group].m)
            if is_single:
                single.add(k)
            x_key = op.x_var if not is_literal(op.x_var) else ('literal', k)
            if following:
                mode_of = {(m.decay.real, m.decay.imag): j for j, m in enumerate(found)}
                trace_key = lambda fk, g=op.group, mode_of=mode_of: (g, mode_of[fk[:2]], *fk[2:])
            else:
                trace_key = lambda fk: fk
            pairs[k] = []
            for filt, C in spectrum.filters(found):
                key = (x_key, trace_key(filt.key))
                if key not in keys:
                    keys.append(key)
                    filters.append((k, filt, trace_key))
                pairs[k].append((keys.index(key), None if is_single else C))
        reads = [[(c, keys.index((keys[s][0], trace_key(key)))) for c, key in filt.reads()]
                 for s, (_, filt, trace_key) in enumerate(filters)]
        filters = [(k, filt) for k, filt, _ in filters]
        found_hops = hop_paths.find_hops(graph) if self.cross_layer and es_ops else []
        hop_traces = [_HopTrace(k, j, *self._hop_modes(graph, hop, k, group_modes, pairs))
                      for j, hop in enumerate(found_hops) for k in es_ops
                      if graph.ops[k].group == hop.source]
        for j in sorted({ht.hop for ht in hop_traces}):
            hop_paths.check_linear(graph, found_hops[j])
        return _Plan(exact, {k: group_modes[graph.ops[k].group] for k in es_ops},
                     self.decay is not None, filters, reads, pairs, frozenset(single),
                     found_hops, hop_traces, tuple(keys))

    def _hop_modes(self, graph, hop, k, group_modes, pairs):
        """``(decay of the reader's neurons, modes of op k)`` for a one-hop trace; refuses
        what one hop is not defined for."""
        reader, op = graph.ops[hop.reader], graph.ops[k]
        found = group_modes[reader.group]
        if not spectrum.is_single(found, graph.groups[reader.group].m):
            raise ValueError(f'cross_layer=1 follows {op.label} through the neurons '
                             f'{graph.groups[reader.group].names} that {reader.label} drives, '
                             f'which have several decays '
                             f'({", ".join(mode.describe() for mode in found)}); one hop is '
                             f'defined for one decay: pass ES_D_RTRL(model, decay=...) or '
                             f'cross_layer=0.')
        mine = group_modes[op.group]
        if any(mode.is_pair or mode.order > 1 for mode in mine):
            raise ValueError(f'cross_layer=1: the neurons {graph.groups[op.group].names} that '
                             f'{op.label} drives have a complex pair or a Jordan chain of '
                             f'decays ({", ".join(mode.describe() for mode in mine)}); one hop '
                             f'is defined for real decays: pass ES_D_RTRL(model, decay=...) '
                             f'or cross_layer=0.')
        return found[0].decay.real, tuple(pairs[k])

    # ------------------------------------------------------------------ traces
    def _init_traces(self, graph, hidden):
        plan = self._plan(graph)
        dtype = self.dtype(graph)
        x_traces = [jnp.zeros(graph.ops[k].x_aval.shape, dtype) for k, _ in plan.filters]
        out_traces = {k: self.op_trace_zeros(graph, k, 'init_pp') for k in plan.pairs}
        norms = [jnp.zeros((), dtype) for _ in plan.filters]
        exact = {k: self.op_trace_zeros(graph, k, 'init_drtrl') for k in plan.exact}
        hop = [self._hop_zeros(graph, plan, ht) for ht in plan.hop_traces]
        hop_dw = {ht.op: {name: jnp.zeros(a.shape, dtype)
                          for name, a in graph.ops[ht.op].weight_avals.items()}
                  for ht in plan.hop_traces}
        return dict(x=x_traces, f=out_traces, norm=norms, exact=exact, hop=hop, hop_dw=hop_dw)

    def _hop_zeros(self, graph, plan, ht):
        """Zeros of one one-hop trace, per mode: the input trace filtered again ``x``
        (the op's input shape), its norm, ``post`` (the op's output shape) and ``sig``
        (the reader's output shape, its cut size wide)."""
        dtype, op = self.dtype(graph), graph.ops[ht.op]
        reader = graph.ops[plan.hops[ht.hop].reader]
        width = graph.groups[reader.group].m
        per_mode = lambda shape: [jnp.zeros(shape, dtype) for _ in ht.modes]
        return dict(x=per_mode(op.x_aval.shape), norm=per_mode(()), post=per_mode(op.y_aval.shape),
                    sig=per_mode((*reader.y_aval.shape, width)))

    def _hops(self, graph):
        return self._plan(graph).hops

    def _advance_ops(self, graph, state, sig, weights):
        plan, values = self._plan(graph), self._values(graph)
        ones = [1.0] * len(plan.filters)
        inputs = [sig.op_inputs[k] for k, _ in plan.filters]
        norms = _filtered(plan, values, state['norm'], ones)
        x_traces = _filtered(plan, values, state['x'], [x.astype(t.dtype) for x, t in
                                                        zip(inputs, state['x'])])
        out_traces = {}
        for k in plan.pairs:
            d, df = self.signals_in_y_layout(graph, k, sig)
            out_traces[k] = apply_state_jacobian(d, state['f'][k]) + df
        exact = {k: advance_exact_trace(self, graph, k, state['exact'][k], sig, weights)
                 for k in plan.exact}
        new = dict(x=x_traces, f=out_traces, norm=norms, exact=exact)
        hop_dw = {k: jax.tree.map(jnp.zeros_like, dw) for k, dw in state['hop_dw'].items()}
        hop = []
        for j, (ht, old) in enumerate(zip(plan.hop_traces, state['hop'])):
            # this step's one-hop term reads the traces of the step before: the reader's
            # neurons carry them on by D^t, and g^t reads the result
            reader = graph.ops[plan.hops[ht.hop].reader]
            d, df = self.signals_in_y_layout(graph, plan.hops[ht.hop].reader, sig)
            if self.window is None:     # inside windows BPTT has the steps' terms
                g = graph.y_layout(reader, sig.g[reader.group], 1).astype(d.dtype)
                dw = self._hop_dw(graph, ht, old, jnp.einsum('...a,...ab->...b', g, d), weights)
                hop_dw[ht.op] = jax.tree.map(jnp.add, hop_dw[ht.op], dw)
            hop.append(self._advance_hop(graph, ht, values['hop'][j], values['C'].get(ht.op),
                                         old, new, sig, d, df))
        return dict(new, hop=hop, hop_dw=hop_dw)

    def _advance_hop(self, graph, ht, a, C_op, old, new, sig, d, df):
        """One one-hop trace advanced by one step, from the op's new traces ``new``, with
        ``a`` the reader's decay and ``C_op`` the op's stacked ``C`` (None: one decay)::

            x_lm = a_m x_lm + ex_c          norm_lm = a_m norm_lm + Z_c
            post = a_m post + psi . (P_c ef)   sig = D_m sig + Df_m Z_c
        """
        op = graph.ops[ht.op]
        psi = graph.y_layout(op, sig.psi[ht.hop], 1).astype(d.dtype)
        out = dict(x=[], norm=[], post=[], sig=[])
        for c, (s, _) in enumerate(ht.modes):
            ef = new['f'][ht.op]
            if C_op is not None:
                ef = jnp.einsum('ab,...b->...a', jnp.asarray(C_op[c], ef.dtype), ef)
            z = new['norm'][s].astype(d.dtype)
            out['x'].append(a * old['x'][c] + new['x'][s])
            out['norm'].append(a * old['norm'][c] + z)
            out['post'].append(a * old['post'][c] + jnp.sum(psi * ef, axis=-1))
            out['sig'].append(apply_state_jacobian(d, old['sig'][c]) + df * z)
        return out

    def _hop_dw(self, graph, ht, hop_state, cotangent, weights):
        """Op ``ht.op``'s weight gradients from its one-hop trace and a cotangent on the
        reader's cut at the trace's step (reader output layout, cut size wide)::

            sum_c xy_to_dw(x_lm / norm_lm, post * J^T(sum_m cotangent * sig) / norm_lm)
        """
        plan = self._plan(graph)
        hop, op = plan.hops[ht.hop], graph.ops[ht.op]
        reader_w = self.op_weights(graph, hop.reader, weights)
        w = self.op_weights(graph, ht.op, weights)
        rule = op.primitive.rule('xy_to_dw')
        dw = None
        for c in range(len(ht.modes)):
            pulled = hop_paths.reader_transpose(graph, hop, reader_w,
                                                jnp.sum(cotangent * hop_state['sig'][c], axis=-1))
            u = graph.y_layout(op, hop.hidden_of(graph, pulled), 0)
            norm = hop_state['norm'][c]
            norm = jnp.where(norm > 0, norm, jnp.ones_like(norm))   # traces still zero
            term = rule(hop_state['x'][c] / norm, hop_state['post'][c] * u / norm, w, **op.params)
            dw = term if dw is None else jax.tree.map(jnp.add, dw, term)
        return dw

    def _contract(self, graph, k, state, g, weights):
        dw = self._contract_own(graph, k, state, g, weights)
        if k in state['hop_dw']:
            dw = jax.tree.map(lambda a, b: a + b.astype(a.dtype), dw, state['hop_dw'][k])
        return dw

    def _contract_own(self, graph, k, state, g, weights):
        """Op ``k``'s weight gradients from its own traces."""
        plan = self._plan(graph)
        if k in plan.exact:
            return contract_exact_trace(self, graph, k, state['exact'][k], g, weights)
        op, w = graph.ops[k], self.op_weights(graph, k, weights)
        rule = op.primitive.rule('xy_to_dw')
        if k in plan.single:
            s = plan.pairs[k][0][0]
            x_hat = state['x'][s] / state['norm'][s].astype(state['x'][s].dtype)
            return rule(x_hat, jnp.sum(g * state['f'][k], axis=-1), w, **op.params)
        return self._contract_modes(graph, k, state, g, w)

    def _contract_modes(self, graph, k, state, g, w):
        """``sum_c xy_to_dw(u_c, sum_m g * (C_c W^{-1} ef))`` over the op's input traces
        ``u_c``; the operands whose gradient does not involve ``x`` (a bias) from
        ``sum_m g * ef``, exactly. One call of the rule per trace: on the CPU the calls
        cost less than one call on the traces stacked along the batch axis, and a third
        of one under ``jax.vmap`` (``docs/benchmarks.md``)."""
        op, pairs, ef = graph.ops[k], self._plan(graph).pairs[k], state['f'][k]
        rule = lambda x, cotangent: op.primitive.rule('xy_to_dw')(x, cotangent, w, **op.params)
        z = jnp.stack([state['norm'][s] for s, _ in pairs]).astype(ef.dtype)
        C = jnp.asarray(self._values(graph)['C'][k], ef.dtype)
        # W = sum_c C_c z_c, the output trace of a constant input; M_c = C_c W^{-1}
        M = jnp.einsum('kab,bc->kac', C, jnp.linalg.inv(jnp.einsum('k,kab->ab', z, C)))
        cotangents = jnp.einsum('...a,kab,...b->k...', g, M, ef)
        dw = jax.tree.map(lambda *terms: sum(terms[1:], terms[0]),
                          *[rule(state['x'][s], cotangents[c]) for c, (s, _) in enumerate(pairs)])
        free = self._input_free_slots(op)
        if free:    # its x-dependent operands are not used, and not computed
            whole = rule(state['x'][pairs[0][0]], jnp.sum(g * ef, axis=-1))
            dw = {slot: whole[slot] if slot in free else v for slot, v in dw.items()}
        return dw

    def _boundary(self, graph, state, g_hidden, weights):
        # A window may start before the first step, where every norm is 0 like the input
        # traces: the norms after one step (1 for a trace that reads x, else 0) then give
        # W = I and the right x_hat = 0. A real decay's norm is >= 1 from the first step
        # on, and the real part of a pair is 0 there only together with its imaginary
        # part; the other norms are 0 after one step too.
        plan = self._plan(graph)
        norms = list(state['ops']['norm'])
        for s, (_, filt) in enumerate(plan.filters):
            if filt.part == '' and filt.order == 0:
                norms[s] = jnp.maximum(norms[s], 1.0)
            elif filt.part == 're' and filt.order == 0:
                partner = next(r for c, r in plan.reads[s] if r != s)
                fresh = (norms[s] == 0) & (norms[partner] == 0)
                norms[s] = jnp.where(fresh, jnp.ones_like(norms[s]), norms[s])
        # the one-hop term of each step is in hop_dw; at a window's start the whole trace
        # at t0 is contracted with the cotangent of the reader's cut
        ops = dict(state['ops'], norm=norms,
                   hop_dw={k: jax.tree.map(jnp.zeros_like, dw)
                           for k, dw in state['ops']['hop_dw'].items()})
        dw, d_dyn = super()._boundary(graph, dict(state, ops=ops), g_hidden, weights)
        cut = _scan.cut_cotangents(self, graph, state, g_hidden) if plan.hop_traces else []
        for ht, hop_state in zip(plan.hop_traces, state['ops']['hop']):
            reader = graph.ops[plan.hops[ht.hop].reader]
            extra = self._hop_dw(graph, ht, hop_state, graph.y_layout(reader, cut[reader.group], 1),
                                 weights)
            dw[ht.op] = jax.tree.map(jnp.add, dw[ht.op], extra)
        return dw, d_dyn

    # ------------------------------------------------------------------ report
    def _trace_method(self, graph, k, slot):
        plan = self._plan(graph)
        if k in plan.exact:
            return DRTRL_TRACE
        if slot in self._input_free_slots(graph.ops[k]):
            return ES_OUTPUT_TRACE
        return es_factorised_trace([mode.describe() for mode in plan.modes[k]],
                                   given=plan.given)

    def _op_trace_bytes(self, graph, op_state):
        plan = self._plan(graph)
        nbytes = lambda a: math.prod(a.shape) * a.dtype.itemsize
        readers = {}
        for k, listed in plan.pairs.items():
            for s, _ in listed:
                readers.setdefault(s, set()).add(k)
        # the output trace serves every operand of an op; it is counted with the first,
        # an input trace shared by several ops in equal parts
        out = {k: {next(iter(graph.ops[k].weight_slots)):
                   nbytes(op_state['f'][k]) + sum(nbytes(op_state['x'][s]) // len(readers[s])
                                                  for s in {s for s, _ in listed})}
               for k, listed in plan.pairs.items()}
        out.update({k: exact_trace_bytes(op_state['exact'][k]) for k in plan.exact})
        for k, extra in self._hop_bytes(graph, op_state).items():
            first = next(iter(out[k]))
            out[k][first] += extra
        return out

    def _hop_bytes(self, graph, op_state) -> dict:
        """``{op: bytes}`` of the one-hop traces of each op (and their gradient term)."""
        plan = self._plan(graph)
        nbytes = lambda tree: sum(math.prod(a.shape) * a.dtype.itemsize
                                  for a in jax.tree.leaves(tree))
        out = {k: nbytes(dw) for k, dw in op_state['hop_dw'].items()}
        for ht, traces in zip(plan.hop_traces, op_state['hop']):
            out[ht.op] += nbytes(traces)
        return out

    def _across_layers(self, graph, k):
        plan = self._plan(graph)
        readers = [graph.ops[plan.hops[ht.hop].reader].label for ht in plan.hop_traces
                   if ht.op == k]
        if not readers:
            return None
        state = jax.eval_shape(lambda: self._init_traces(graph, None))
        grp = graph.groups[graph.ops[k].group]
        parts = (['recurrent synapses onto the same neurons are cut from the trace']
                 if graph.ops[k].group in grp.feeds else [])
        parts.append(f'its effect through the dynamics of the neurons driven by '
                     f'{", ".join(readers)} is followed one hop (cross_layer=1, '
                     f'{self._hop_bytes(graph, state)[k]} bytes of the trace memory), through '
                     f'later layers cut')
        return '; '.join(parts)

    @staticmethod
    def _input_free_slots(op):
        """Operands whose weight VJP does not depend on ``x`` (e.g. a bias): for them the
        output trace alone is the exact D-RTRL trace."""
        weights = {n: jnp.zeros(a.shape, a.dtype) for n, a in op.weight_avals.items()}
        cot = jnp.zeros(op.y_aval.shape, op.y_aval.dtype)
        jaxpr = jax.make_jaxpr(lambda x: op.primitive.rule('xy_to_dw')(x, cot, weights, **op.params))(
            jnp.zeros(op.x_aval.shape, op.x_aval.dtype))
        return [n for n, v in zip(sorted(weights), jaxpr.jaxpr.outvars)   # dicts flatten sorted
                if not depends_on(jaxpr.jaxpr, v, set(jaxpr.jaxpr.invars))]


def _filtered(plan: _Plan, values: dict, old: list, inputs: list) -> list:
    """Every input trace (or norm) advanced by one step: ``sum_c coefficient * old[c]``
    over what it reads (the coefficients from ``values['reads']``), plus its input where
    it takes one (``decay * old + x`` for a trace of one real decay)."""
    new = []
    for s, (_, filt) in enumerate(plan.filters):
        terms = [c * old[r] for c, (_, r) in zip(values['reads'][s], plan.reads[s])]
        value = terms[0]
        for term in terms[1:]:
            value = value + term
        new.append(value + inputs[s] if filt.takes_input else value)
    return new
