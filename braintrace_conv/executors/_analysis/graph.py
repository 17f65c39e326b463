r"""What an online executor learns from one captured step: ops, groups, cuts.

:func:`analyse` reads a :class:`~.step.StepJaxpr` and finds, with no
per-model code (``docs/theory.md`` gives the math):

* the ETP operations, their input ``x`` and the parameters their trainable
  operands are computed from;
* the hidden *groups*: hidden states that reach each other's new values
  through non-ETP paths, element by element (V and an adaptation current form
  one group of ``n = 2``);
* for each group, the **state cut** ``z``: the smallest set of values of the
  step through which every path from the group's old state and its ops'
  outputs to anything else (new states, step outputs, other ops' inputs,
  reductions) passes. ``z^t = G(h^{t-1}, y^t)`` and ``h^t = R(z^t)``
  elementwise, so a learning signal on ``z`` sees every path of the step. For
  a neuron that stores the value it integrates the cut is the new state
  itself (``R`` is the identity); for a reset-after-spike neuron (``v = a h +
  y; s = spike(v); h = v - s``) it is ``v``. Among minimum cuts the one
  nearest the new states is taken;
* for each op, the group its output reaches and the position map between the
  output and hidden layouts (flatten, transpose and other position-preserving
  reshapes are allowed); an op whose output reaches no hidden state is a
  readout;
* parameters used outside ETP weight slots. One that reaches a group's cut
  or new state element by element, or broadcast over positions (a bias added
  after the op, a per-channel decay or threshold) is a
  :class:`DynamicParam` with a position map and gets a trace; one that mixes
  positions on the way gets its instantaneous gradient only.

A non-elementwise op (a reduction, a norm, a matmul...) between an op and its
hidden state, or between hidden states, is rejected with an error naming it.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...primitive import ETPPrimitive
from .lift import lift_rule
from .jaxpr import (bind_eqn, contains_etp, depends_on, interpret, is_literal, read,
                    sub_jaxpr)
from .positions import MIXED, propagate
from .step import StepJaxpr


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """Hidden leaves that evolve together, element by element.

    Attributes:
      leaves: hidden leaf indices (``n = len(leaves)``).
      shape: the common shape of those leaves (the *hidden layout*).
      names: their names.
      cut: jaxpr variables of the state cut ``z`` (``m = len(cut)``).
      cut_to_hidden: per cut variable, ``None`` when it is in hidden layout,
        else the hidden flat position of each of its flat elements.
      identity_release: the cut is the new state itself (``R = I``).
      chained: a cut value is computed from another cut value within the step.
      feeds: other groups (or this one) whose ops read this group's values: a
        gradient through them is truncated by the online executors.
    """
    leaves: list[int]
    shape: tuple
    names: list[str]
    cut: list = dataclasses.field(default_factory=list)
    cut_to_hidden: list = dataclasses.field(default_factory=list)
    identity_release: bool = True
    chained: bool = False
    feeds: frozenset = frozenset()

    @property
    def n(self) -> int:
        return len(self.leaves)

    @property
    def m(self) -> int:
        return len(self.cut)

    def to_hidden(self, values: list, n_extra: int = 0):
        """Cut values (each in its own layout, ``n_extra`` trailing axes) stacked to
        ``(*shape, m, *extra)``."""
        out = []
        for val, perm in zip(values, self.cut_to_hidden):
            extra = val.shape[val.ndim - n_extra:]
            flat = val.reshape(-1, *extra)
            if perm is not None:
                flat = flat[np.argsort(perm)]
            out.append(flat.reshape(*self.shape, *extra))
        return jnp.stack(out, axis=len(self.shape))


@dataclasses.dataclass(frozen=True, eq=False)
class EtpOp:
    """One ETP operation in the step.

    Attributes:
      eqn: index of its equation in the step jaxpr.
      group: index of the hidden group its output reaches, or None (readout).
      h_to_y: for a grouped op, ``None`` when the hidden layout equals the
        output layout, else the permutation taking the flat hidden elements
        to flat output positions.
      exact_readout: a readout whose output reaches no hidden state at all.
      slot_params: trainable operand name -> parameter leaves it is computed from.
    """
    eqn: int
    primitive: ETPPrimitive
    params: dict
    weight_slots: dict
    weight_avals: dict
    y_aval: Any
    x_aval: Any
    x_var: Any
    group: int | None
    h_to_y: np.ndarray | None
    exact_readout: bool
    slot_params: dict
    label: str


@dataclasses.dataclass(frozen=True, eq=False)
class DynamicParam:
    """A parameter leaf inside a group's dynamics, element by element.

    ``index`` (hidden-shaped, int) gives, for every hidden element, the flat
    position of the parameter element it uses: the trace is hidden-shaped and
    the gradient is summed over the elements that share a parameter element.
    """
    leaf: int
    group: int
    index: np.ndarray
    size: int

    def contract(self, per_element):
        """``grad[k] = sum_{i: index[i] = k} per_element[i]``, flat -> parameter size."""
        flat = jnp.reshape(per_element, (-1,))
        if self.size == 1:
            return jnp.sum(flat)[None]
        return jax.ops.segment_sum(flat, self.index.ravel(), num_segments=self.size)


@dataclasses.dataclass(frozen=True, eq=False)
class StepGraph:
    """The result of :func:`analyse`."""
    step: StepJaxpr
    ops: list[EtpOp]
    groups: list[Group]
    group_of_leaf: dict
    direct_params: dict        # param leaf -> 'hidden' | 'output': used outside ETP weight slots
    dynamic_params: list       # DynamicParam entries (a leaf may feed several groups)

    @property
    def cut_vars(self) -> list:
        return [v for grp in self.groups for v in grp.cut]

    # ---------------------------------------------------------------- evaluation
    def run(self, hidden, params, inputs, *, weights=None, eps=None, override=None,
            delta=None, op_outputs=None, rest=None, watch=()):
        """Evaluate the step with hooks.

        Args:
          hidden, params, inputs: flat leaves.
          weights: ``{op_index: {slot_name: value}}`` overriding the ETP
            weight operands (their gradients are then taken separately).
          eps: ``{var: perturbation}`` added to cut values where produced, so
            every later use within the step sees it.
          override: ``{var: value}`` replacing cut values (paths into them are cut).
          delta: ``{op_index: perturbation}`` added to ETP op outputs.
          op_outputs: ``{op_index: y}``, the ETP op outputs of this step: they
            replace the ops (no recomputation), which cuts every path
            through them.
          rest: a :class:`~.held.Rest`, for the dynamics at rest: every function
            differentiated as its value changes, so spikes are constant and the
            leak and couplings of the dynamics are left (:mod:`.held`).
          watch: further variables whose values are recorded.

        Returns:
          ``(new_hidden, outputs, record)`` with ``record = dict(op_inputs=,
          op_outputs=, cut=, watch=)``: op inputs and outputs by op index, the values of
          ``cut_vars`` and of ``watch``.
        """
        eps, override = eps or {}, override or {}
        op_at = {op.eqn: k for k, op in enumerate(self.ops)}
        x_of, y_of = {}, {}     # op index -> its input and output in this evaluation

        def write(v, val):
            if v in override:
                val = override[v]
            return val + eps[v] if v in eps else val

        def bind(i, eqn, invals):
            k = op_at.get(i)
            if k is None:
                return None if rest is None else rest.bind(eqn, invals)
            op = self.ops[k]
            if weights is not None:
                for name, slot in op.weight_slots.items():
                    invals[slot] = weights[k][name]
            x_of[k] = invals[op.primitive.x_invar_index]
            if op_outputs is not None:
                y_of[k] = lax.stop_gradient(op_outputs[k])
            else:
                y_of[k] = eqn.primitive.bind(*invals, **eqn.params)
            return [y_of[k] + delta[k] if delta is not None and k in delta else y_of[k]]

        step = self.step
        env = interpret(step.closed_jaxpr, dict(zip(step.closed_jaxpr.jaxpr.invars,
                                                   [*hidden, *params, *inputs])),
                       bind=bind, write=write)
        record = dict(op_inputs=x_of, op_outputs=y_of, cut=[env[v] for v in self.cut_vars],
                      watch=[read(env, v) for v in watch])
        return ([read(env, v) for v in step.new_hidden_vars],
                [read(env, v) for v in step.output_vars], record)

    def weights(self, params):
        """``{op_index: {slot: value}}``: the ETP weight operands as functions of params."""
        def bind(i, eqn, invals):   # only what the parameters determine, ops excluded
            if any(val is None for val in invals) or isinstance(eqn.primitive, ETPPrimitive):
                return [None] * len(eqn.outvars)
            return None

        closed = self.step.closed_jaxpr
        env = interpret(closed, dict(zip(self.step.param_vars, params)), bind=bind)
        return [{name: read(env, closed.jaxpr.eqns[op.eqn].invars[slot])
                 for name, slot in op.weight_slots.items()} for op in self.ops]

    def y_layout(self, op: EtpOp, hidden_array, n_extra: int):
        """Move a hidden-layout array (``(*h.shape, *extra)``) to ``op``'s output layout."""
        extra = hidden_array.shape[hidden_array.ndim - n_extra:]
        flat = hidden_array.reshape(-1, *extra)
        if op.h_to_y is not None:
            flat = flat[np.argsort(op.h_to_y)]
        return flat.reshape(*op.y_aval.shape, *extra)


# ----------------------------------------------------------------------------- analysis
@dataclasses.dataclass(frozen=True, eq=False)
class _Context:
    """What every part of :func:`analyse` reads about the step."""
    step: StepJaxpr
    jaxpr: Any
    etp_eqns: frozenset   # equation indices of the ETP ops
    deps: dict            # var -> kinds of source it is computed from (StepJaxpr.dependencies)
    final_of: dict        # var holding a new hidden value -> its hidden leaf
    out_vars: frozenset   # the variables of the step's outputs


def analyse(step: StepJaxpr) -> StepGraph:
    """Discover ops, groups, cuts and parameter paths of a captured step (module docstring).

    Raises:
      ValueError: naming the op, parameter or hidden state, when the step
        cannot be learned online exactly as described.
    """
    ctx = _context(step)
    _check_unlifted_weights(ctx)
    groups, group_of_leaf = _groups(ctx)
    ops = [_op(ctx, k, i, groups, group_of_leaf) for k, i in enumerate(sorted(ctx.etp_eqns))]
    groups = [_cut(ctx, gi, grp, ops) for gi, grp in enumerate(groups)]
    direct_params, dynamic_params = _parameter_paths(ctx, groups)
    return StepGraph(step, ops, groups, group_of_leaf, direct_params, dynamic_params)


def _context(step: StepJaxpr) -> _Context:
    jaxpr = step.closed_jaxpr.jaxpr
    etp_eqns = {i for i, e in enumerate(jaxpr.eqns) if isinstance(e.primitive, ETPPrimitive)}
    for i, eqn in enumerate(jaxpr.eqns):
        if i not in etp_eqns and sub_jaxpr(eqn) is not None and contains_etp(sub_jaxpr(eqn)):
            raise ValueError(f'an ETP op is used inside {eqn.primitive.name!r} (control flow '
                             f'or a non-inlined call); online executors need ETP ops at the top '
                             f'level of one step.')
    produced = {v for e in jaxpr.eqns for v in e.outvars}
    final_of = {}
    for leaf, v in enumerate(step.new_hidden_vars):
        if not is_literal(v) and v in produced and v not in final_of:
            final_of[v] = leaf
    return _Context(step, jaxpr, frozenset(etp_eqns), step.dependencies(), final_of,
                    frozenset(v for v in step.output_vars if not is_literal(v)))


def _check_unlifted_weights(ctx: _Context) -> None:
    """A convolution or matrix product whose weight operand reads parameters and also
    hidden states or inputs (a kernel scaled by a state) cannot be an ETP op; refuse it
    naming what the weight is computed from, before the analysis meets it as an op that
    mixes positions."""
    for eqn in ctx.jaxpr.eqns:
        found = lift_rule(eqn.primitive.name)
        if found is None or is_literal(eqn.invars[found[1]]):
            continue
        kinds = ctx.deps.get(eqn.invars[found[1]], frozenset())
        if any(isinstance(kind, tuple) for kind in kinds) and kinds & {'h', 'x', 'y'}:
            raise ValueError(f'the weight operand of {eqn.primitive.name} is computed from '
                             f'{_sources(ctx, eqn.invars[found[1]])}; the weights of a '
                             f'convolution or matrix product must be computed from parameters '
                             f'only to be trained online.')


def _identity(shape):
    return np.arange(int(np.prod(shape))).reshape(shape)


def _ops_at(ops, eqn_indices):
    return [k for k, op in enumerate(ops) if op.eqn in eqn_indices]


def _groups(ctx: _Context):
    """Hidden leaves reaching each other's new values element by element -> groups
    (without cuts yet), and ``{hidden leaf: group index}``."""
    step = ctx.step
    parent = list(range(step.n_hidden))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for leaf, var in enumerate(step.hidden_vars):
        if not jnp.issubdtype(var.aval.dtype, jnp.inexact):
            continue
        ident = _identity(var.aval.shape)
        reach = propagate(ctx.jaxpr, {var: ident}, ctx.final_of)
        for other, idx in reach.finals.items():
            if idx is MIXED or idx.shape != ident.shape or not np.array_equal(idx, ident):
                raise ValueError(
                    f'hidden state {step.hidden_names[leaf]!r} reaches the new value of '
                    f'{step.hidden_names[other]!r} through a non-elementwise op '
                    f'({reach.mixing or "a position-changing reshape"}); online executors '
                    f'need diagonal (element-by-element) neuron dynamics.')
            parent[find(other)] = find(leaf)
    by_root: dict[int, list[int]] = {}
    for leaf in sorted(ctx.final_of.values()):
        by_root.setdefault(find(leaf), []).append(leaf)
    groups, group_of_leaf = [], {}
    for leaves in by_root.values():
        shapes = {tuple(step.hidden_vars[leaf].aval.shape) for leaf in leaves}
        if len(shapes) != 1:
            raise ValueError(f'hidden states {[step.hidden_names[leaf] for leaf in leaves]} '
                             f'interact but have different shapes {sorted(shapes)}; states of '
                             f'one neuron group must share a shape.')
        for leaf in leaves:
            group_of_leaf[leaf] = len(groups)
        groups.append(Group(leaves, shapes.pop(), [step.hidden_names[leaf] for leaf in leaves]))
    return groups, group_of_leaf


def _op(ctx: _Context, k: int, i: int, groups, group_of_leaf) -> EtpOp:
    """ETP op ``k``, equation ``i``: the parameters of its trainable operands, and the
    group its output reaches."""
    eqn = ctx.jaxpr.eqns[i]
    prim = eqn.primitive
    slots = prim.trainable_invars(eqn.params)
    params_of = {('p', leaf) for leaf in range(ctx.step.n_params)}
    slot_params = {}
    for name, slot in slots.items():
        v = eqn.invars[slot]
        kinds = ctx.deps.get(v, frozenset()) if not is_literal(v) else frozenset()
        if kinds - params_of:
            raise ValueError(f'the {name!r} operand of {prim.name} #{k} is computed from '
                             f'{_sources(ctx, v)}; trainable operands of ETP ops must be '
                             f'computed from parameters only.')
        slot_params[name] = sorted(leaf for _, leaf in kinds)
    leaves = sorted(set().union(*slot_params.values()))
    label = (f'{prim.name} #{k} '
             f'({", ".join(ctx.step.param_names[leaf] for leaf in leaves) or "no parameter"})')
    y_var, x_var = eqn.outvars[0], eqn.invars[prim.x_invar_index]
    group, h_to_y = _op_group(ctx, label, y_var, groups, group_of_leaf)
    reaches_state = any(depends_on(ctx.jaxpr, v, {y_var}) for v in ctx.final_of)
    return EtpOp(
        eqn=i, primitive=prim, params=dict(eqn.params), weight_slots=slots,
        weight_avals={name: eqn.invars[slot].aval for name, slot in slots.items()},
        y_aval=y_var.aval, x_aval=getattr(x_var, 'aval', None), x_var=x_var, group=group,
        h_to_y=h_to_y, exact_readout=group is None and not reaches_state,
        slot_params=slot_params, label=label)


def _sources(ctx: _Context, var) -> str:
    """The parameters, hidden states and inputs ``var`` is computed from, in words."""
    step = ctx.step
    named = lambda names, variables: [n for n, v in zip(names, variables)
                                      if depends_on(ctx.jaxpr, var, {v})]
    parts = [f'parameter {n!r}' for n in named(step.param_names, step.param_vars)]
    parts += [f'hidden state {n!r}' for n in named(step.hidden_names, step.hidden_vars)]
    if any(depends_on(ctx.jaxpr, var, {v}) for v in step.input_vars):
        parts.append('the step input')
    return ', '.join(parts) or 'constants'


def _op_group(ctx: _Context, label: str, y_var, groups, group_of_leaf):
    """``(group index, h_to_y)`` of the op whose output is ``y_var`` (``(None, None)`` for a
    readout): the one group it reaches, one to one and element by element."""
    size = int(np.prod(y_var.aval.shape))
    reach = propagate(ctx.jaxpr, {y_var: _identity(y_var.aval.shape)}, ctx.final_of,
                      stop_at_finals=True)
    if reach.etp_weights:
        raise ValueError(f'the output of {label} feeds the trainable operand of another '
                         f'ETP op; that is not supported.')
    reached = {group_of_leaf[leaf] for leaf in reach.finals}
    if len(reached) > 1:
        raise ValueError(f'the output of {label} reaches several hidden groups '
                         f'{[groups[gi].names for gi in sorted(reached)]}; an ETP op '
                         f'must feed one neuron population (its trace follows that '
                         f'population\'s dynamics): compute the op once per population, '
                         f'with the same parameters if they are shared.')
    if not reached:
        return None, None
    gi = reached.pop()
    maps = list(reach.finals.values())
    if any(m is MIXED for m in maps):
        raise ValueError(f'a non-elementwise op ({reach.mixing}) lies between {label} and '
                         f'hidden state(s) {groups[gi].names}; online training needs the op '
                         f'output to reach its neurons element by element (move norms, '
                         f'max pooling or reductions after the neuron).')
    if any(not np.array_equal(m, maps[0]) for m in maps[1:]):
        raise ValueError(f'{label} reaches the states of {groups[gi].names} at '
                         f'different positions.')
    flat = maps[0].ravel()
    if flat.size != size or not np.array_equal(np.sort(flat), np.arange(size)):
        raise ValueError(f'{label} output of shape {y_var.aval.shape} does not map one '
                         f'to one onto hidden states of shape {groups[gi].shape}.')
    return gi, None if np.array_equal(flat, np.arange(size)) else flat


def _cut(ctx: _Context, gi: int, grp: Group, ops) -> Group:
    """Group ``gi`` with its state cut: a minimum vertex separator between its sources
    (old states, its ops' outputs) and everything that leaves the group's elementwise
    region, the one nearest the new states."""
    hidden_size = int(np.prod(grp.shape))
    reach, sources, sinks = _cut_region(ctx, gi, grp, ops)
    index = {v: idx for v, idx in reach.index.items() if idx is not MIXED}
    # other groups' new values are reached only through ETP ops; the edges stay inside
    edges = [(a, b) for a, b in reach.edges if a in index and b in index]
    cut = min_vertex_cut(list(index), edges, list(sources), [v for v in sinks if v in index])
    order = {v: n for n, v in enumerate(ctx.jaxpr.invars)}
    order.update({v: len(order) + n for n, e in enumerate(ctx.jaxpr.eqns) for v in e.outvars})
    position = lambda v: (grp.leaves.index(ctx.final_of[v]) if ctx.final_of.get(v) in grp.leaves
                          else len(grp.leaves))
    cut.sort(key=lambda v: (position(v), order[v]))
    to_hidden = []
    for v in cut:
        flat = index[v].ravel()
        if flat.size != hidden_size or not np.array_equal(np.sort(flat), np.arange(hidden_size)):
            raise ValueError(f'the state of {grp.names} is cut at a value of shape {v.aval.shape} '
                             f'that does not map one to one onto the hidden shape {grp.shape}.')
        to_hidden.append(None if np.array_equal(flat, np.arange(hidden_size)) else flat)
    return dataclasses.replace(
        grp, cut=cut, cut_to_hidden=to_hidden,
        identity_release=(len(cut) == grp.n and all(perm is None for perm in to_hidden)
                          and [ctx.final_of.get(v) for v in cut] == grp.leaves),
        chained=any(depends_on(ctx.jaxpr, v, set(cut) - {v}) for v in cut),
        feeds=frozenset(ops[k].group for k in _ops_at(ops, reach.etp_inputs)
                        if ops[k].group is not None))


def _cut_region(ctx: _Context, gi: int, grp: Group, ops):
    """``(reach, sources, sinks)`` of group ``gi``: the positions reached from its old
    states and its ops' outputs (``sources``, each mapped to hidden positions), and the
    values where the group's elementwise region is left."""
    hidden_size = int(np.prod(grp.shape))
    hidden_in = {ctx.step.hidden_vars[leaf] for leaf in grp.leaves}
    sources = {v: _identity(grp.shape) for v in hidden_in}
    for op in ops:
        if op.group == gi:
            to_h = np.arange(hidden_size) if op.h_to_y is None else np.argsort(op.h_to_y)
            y_var = ctx.jaxpr.eqns[op.eqn].outvars[0]
            sources[y_var] = to_h.reshape(op.y_aval.shape)   # y position -> hidden position
    reach = propagate(ctx.jaxpr, sources, ctx.final_of)
    index = {v for v, idx in reach.index.items() if idx is not MIXED}
    finals = {v for v, leaf in ctx.final_of.items() if leaf in grp.leaves}
    # The input of a recurrent synapse onto the group's own neurons, computed from the old
    # state alone, is given: that path through time is the recurrent-synapse cut of D-RTRL.
    # An old value read by another group's op (a pipelined layer, a delayed synapse between
    # layers) stays a sink, so the cut holds it and its learning signal reaches the trace
    # of the step before, like any cross-layer path within a step.
    from_y = set(propagate(ctx.jaxpr, {v: i for v, i in sources.items() if v not in hidden_in},
                           ctx.final_of).index)
    given = {v for v, eqns in reach.etp_x_sinks.items() if v not in from_y
             and all(ops[k].group == gi for k in _ops_at(ops, eqns))}
    return reach, sources, (set(reach.sinks) - given) | finals | (index & ctx.out_vars)


def min_vertex_cut(nodes, edges, sources, sinks) -> list:
    """Minimum set of ``nodes`` meeting every ``sources`` -> ``sinks`` path (unit vertex
    capacities, max-flow with split vertices); the one nearest the sinks."""
    INF = len(nodes) + 1
    cap = collections.defaultdict(int)
    adj = collections.defaultdict(set)

    def add(a, b, c):
        cap[a, b] += c
        adj[a].add(b)
        adj[b].add(a)

    for v in nodes:
        add(('in', v), ('out', v), 1)
    for a, b in edges:
        add(('out', a), ('in', b), INF)
    for s in sources:
        add('S', ('in', s), INF)
    for t in sinks:
        add(('out', t), 'T', INF)
    while True:   # augmenting paths (Edmonds-Karp); the flow is at most len(sources)
        parent = {'S': None}
        queue = collections.deque(['S'])
        while queue and 'T' not in parent:
            a = queue.popleft()
            for b in adj[a]:
                if b not in parent and cap[a, b] > 0:
                    parent[b] = a
                    queue.append(b)
        if 'T' not in parent:
            break
        b = 'T'
        while parent[b] is not None:
            a = parent[b]
            cap[a, b] -= 1
            cap[b, a] += 1
            b = a
    # nodes that still reach T in the residual graph: the cut is where they begin
    to_sink, queue = {'T'}, collections.deque(['T'])
    while queue:
        b = queue.popleft()
        for a in adj[b]:
            if a not in to_sink and cap[a, b] > 0:
                to_sink.add(a)
                queue.append(a)
    return [v for v in nodes if ('out', v) in to_sink and ('in', v) not in to_sink]


def _parameter_paths(ctx: _Context, groups):
    """Parameters used outside ETP weight slots (``{leaf: 'hidden' | 'output'}``), and
    which of them enter a group's dynamics element by element (:class:`DynamicParam`)."""
    direct_params, dynamic = {}, []
    for leaf, var in enumerate(ctx.step.param_vars):
        src = _computed_outside_ops(ctx, var)
        if not (src & ctx.out_vars or _used_with_data(ctx, src)):
            continue
        reaches_hidden = any(v in src or depends_on(ctx.jaxpr, v, src) for v in ctx.final_of)
        direct_params[leaf] = 'hidden' if reaches_hidden else 'output'
        if reaches_hidden:
            dynamic += _dynamic_params(ctx, leaf, var, groups)
    return direct_params, dynamic


def _computed_outside_ops(ctx: _Context, var) -> set:
    """``var`` and everything computed from it outside ETP ops."""
    src = {var}
    for eqn in ctx.jaxpr.eqns:
        if any(v in src for v in eqn.invars if not is_literal(v)):
            if not isinstance(eqn.primitive, ETPPrimitive):
                src |= set(eqn.outvars)
    return src


def _used_with_data(ctx: _Context, src: set) -> bool:
    """Whether a value of ``src`` is used other than in an ETP weight slot or in a
    computation from parameters only."""
    for i, eqn in enumerate(ctx.jaxpr.eqns):
        for slot, v in enumerate(eqn.invars):
            if is_literal(v) or v not in src:
                continue
            if i in ctx.etp_eqns:
                if slot in eqn.primitive.trainable_invars(eqn.params).values():
                    continue
            elif not ({'h', 'x', 'y'} & ctx.deps.get(eqn.outvars[0], frozenset())):
                continue     # still a parameter-only computation
            return True
    return False


def _dynamic_params(ctx: _Context, leaf: int, var, groups) -> list:
    """A :class:`DynamicParam` for each group whose cut or new state parameter ``leaf``
    reaches at the same positions, element by element or broadcast."""
    reach = propagate(ctx.jaxpr, {var: _identity(var.aval.shape)}, ctx.final_of, broadcast=True)
    found = []
    for gi, grp in enumerate(groups):
        finals = [v for v, l in ctx.final_of.items() if l in grp.leaves]
        touched = [v for v in grp.cut + finals if v in reach.index]
        maps = []
        for v in touched:
            idx = reach.index[v]
            if idx is MIXED or np.size(idx) != int(np.prod(grp.shape)):
                maps = None
                break
            perm = grp.cut_to_hidden[grp.cut.index(v)] if v in grp.cut else None
            flat = np.ravel(idx)
            maps.append(flat if perm is None else flat[np.argsort(perm)])
        if maps and all(np.array_equal(m, maps[0]) for m in maps[1:]):
            found.append(DynamicParam(leaf, gi, maps[0].reshape(grp.shape),
                                      int(np.prod(var.aval.shape))))
    return found
