r"""What an online executor learns from one traced step: ops, groups, cuts.

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
from .jaxpr import (bind_eqn, contains_etp, depends_on, interpret, is_literal, read,
                    sub_jaxpr)
from .positions import MIXED, propagate
from .step import StepJaxpr


@dataclasses.dataclass
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
    feeds: set = dataclasses.field(default_factory=set)

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


@dataclasses.dataclass
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


@dataclasses.dataclass
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


@dataclasses.dataclass
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
            delta=None, op_outputs=None, hold_custom=False):
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
          hold_custom: treat functions with a custom derivative (surrogate
            spikes) as constants, leaving the leak of the dynamics.

        Returns:
          ``(new_hidden, outputs, record)`` with ``record = dict(op_inputs=,
          op_outputs=, cut=)``: op inputs and outputs by op index, and the values of
          ``cut_vars``.
        """
        eps, override = eps or {}, override or {}
        op_at = {op.eqn: k for k, op in enumerate(self.ops)}
        op_inputs, outputs = {}, {}

        def write(v, val):
            if v in override:
                val = override[v]
            return val + eps[v] if v in eps else val

        def bind(i, eqn, invals):
            k = op_at.get(i)
            if k is None:
                if hold_custom and eqn.primitive.name.startswith(('custom_jvp', 'custom_vjp')):
                    return [lax.stop_gradient(o) for o in bind_eqn(eqn, invals)]
                return None
            op = self.ops[k]
            if weights is not None:
                for name, slot in op.weight_slots.items():
                    invals[slot] = weights[k][name]
            op_inputs[k] = invals[op.primitive.x_invar_index]
            if op_outputs is not None:
                outputs[k] = lax.stop_gradient(op_outputs[k])
            else:
                outputs[k] = eqn.primitive.bind(*invals, **eqn.params)
            return [outputs[k] + delta[k] if delta is not None and k in delta else outputs[k]]

        step = self.step
        env = interpret(step.closed_jaxpr, dict(zip(step.closed_jaxpr.jaxpr.invars,
                                                   [*hidden, *params, *inputs])),
                       bind=bind, write=write)
        record = dict(op_inputs=op_inputs, op_outputs=outputs,
                      cut=[env[v] for v in self.cut_vars])
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
def analyse(step: StepJaxpr) -> StepGraph:
    """Discover ops, groups, cuts and parameter paths of a traced step (module docstring).

    Raises:
      ValueError: naming the op, parameter or hidden state, when the step
        cannot be learned online exactly as described.
    """
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
    out_vars = {v for v in step.output_vars if not is_literal(v)}
    deps = step.dependencies()
    groups, group_of_leaf = _groups(step, jaxpr, final_of)
    ops = _ops(step, jaxpr, etp_eqns, deps, final_of, out_vars, groups, group_of_leaf)
    for g, grp in enumerate(groups):
        _cut(step, jaxpr, g, grp, ops, final_of, out_vars)
    direct_params, dynamic_params = _parameter_paths(step, jaxpr, etp_eqns, deps, final_of,
                                                     out_vars, groups)
    return StepGraph(step, ops, groups, group_of_leaf, direct_params, dynamic_params)


def _identity(shape):
    return np.arange(int(np.prod(shape))).reshape(shape)


def _ops_at(ops, eqn_indices):
    return [k for k, op in enumerate(ops) if op.eqn in eqn_indices]


def _groups(step, jaxpr, final_of):
    """Hidden leaves reaching each other's new values element by element -> groups."""
    nh = step.n_hidden
    parent = list(range(nh))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    hidden_in = step.hidden_vars
    for leaf, var in enumerate(hidden_in):
        if not jnp.issubdtype(var.aval.dtype, jnp.inexact):
            continue
        ident = _identity(var.aval.shape)
        reach = propagate(jaxpr, {var: ident}, final_of)
        for other, idx in reach.finals.items():
            if idx is MIXED or idx.shape != ident.shape or not np.array_equal(idx, ident):
                raise ValueError(
                    f'hidden state {step.hidden_names[leaf]!r} reaches the new value of '
                    f'{step.hidden_names[other]!r} through a non-elementwise op '
                    f'({reach.mixing or "a position-changing reshape"}); online executors need '
                    f'diagonal (element-by-element) neuron dynamics.')
            parent[find(other)] = find(leaf)
    by_root: dict[int, list[int]] = {}
    for leaf in sorted(final_of.values()):
        by_root.setdefault(find(leaf), []).append(leaf)
    groups, group_of_leaf = [], {}
    for leaves in by_root.values():
        shapes = {tuple(hidden_in[l].aval.shape) for l in leaves}
        if len(shapes) != 1:
            raise ValueError(f'hidden states {[step.hidden_names[l] for l in leaves]} interact '
                             f'but have different shapes {sorted(shapes)}; states of one neuron '
                             f'group must share a shape.')
        for l in leaves:
            group_of_leaf[l] = len(groups)
        groups.append(Group(leaves, shapes.pop(), [step.hidden_names[l] for l in leaves]))
    return groups, group_of_leaf


def _ops(step, jaxpr, etp_eqns, deps, final_of, out_vars, groups, group_of_leaf):
    np_ = step.n_params
    describe = lambda leaves: ', '.join(step.param_names[p] for p in sorted(leaves)) or 'no parameter'
    ops = []
    for i in sorted(etp_eqns):
        eqn = jaxpr.eqns[i]
        prim = eqn.primitive
        slots = prim.trainable_invars(eqn.params)
        p_leaves, slot_params = set(), {}
        for name, slot in slots.items():
            v = eqn.invars[slot]
            d = deps.get(v, frozenset()) if not is_literal(v) else frozenset()
            if d - {('p', k) for k in range(np_)}:
                raise ValueError(f'the {name!r} operand of {prim.name} #{len(ops)} depends on '
                                 f'hidden states or inputs; trainable operands of ETP ops must '
                                 f'be computed from parameters only.')
            slot_params[name] = sorted(k for _, k in d)
            p_leaves |= set(slot_params[name])
        x_var = eqn.invars[prim.x_invar_index]
        label = f'{prim.name} #{len(ops)} ({describe(p_leaves)})'
        y_var = eqn.outvars[0]
        size = int(np.prod(y_var.aval.shape))
        reach = propagate(jaxpr, {y_var: _identity(y_var.aval.shape)}, final_of,
                          stop_at_finals=True)
        if reach.etp_weights:
            raise ValueError(f'the output of {label} feeds the trainable operand of another '
                             f'ETP op; that is not supported.')
        reached_groups = {group_of_leaf[l] for l in reach.finals}
        if len(reached_groups) > 1:
            raise ValueError(f'the output of {label} reaches several hidden groups '
                             f'{[groups[g].names for g in sorted(reached_groups)]}; an ETP op '
                             f'must feed one neuron population.')
        group, h_to_y = None, None
        if reached_groups:
            group = reached_groups.pop()
            maps = list(reach.finals.values())
            if any(m is MIXED for m in maps):
                raise ValueError(f'a non-elementwise op ({reach.mixing}) lies between {label} and '
                                 f'hidden state(s) {groups[group].names}; online training needs the op '
                                 f'output to reach its neurons element by element (move norms, '
                                 f'max pooling or reductions after the neuron).')
            if any(not np.array_equal(m, maps[0]) for m in maps[1:]):
                raise ValueError(f'{label} reaches the states of {groups[group].names} at '
                                 f'different positions.')
            flat = maps[0].ravel()
            if flat.size != size or not np.array_equal(np.sort(flat), np.arange(size)):
                raise ValueError(f'{label} output of shape {y_var.aval.shape} does not map one '
                                 f'to one onto hidden states of shape {groups[group].shape}.')
            h_to_y = None if np.array_equal(flat, np.arange(size)) else flat
        full = any(depends_on(jaxpr, v, {y_var}) for v in final_of)
        ops.append(EtpOp(
            eqn=i, primitive=prim, params=dict(eqn.params), weight_slots=slots,
            weight_avals={name: eqn.invars[slot].aval for name, slot in slots.items()},
            y_aval=y_var.aval, x_aval=getattr(x_var, 'aval', None), x_var=x_var, group=group,
            h_to_y=h_to_y, exact_readout=group is None and not full,
            slot_params=slot_params, label=label))
    return ops


def _cut(step, jaxpr, g, grp, ops, final_of, out_vars):
    """Find group ``g``'s state cut: a minimum vertex separator between its sources
    (old states, its ops' outputs) and everything that leaves the group's elementwise
    region, the one nearest the new states; fill ``grp`` in place."""
    hidden_size = int(np.prod(grp.shape))
    hidden_in = {step.hidden_vars[l] for l in grp.leaves}
    sources = {v: _identity(grp.shape) for v in hidden_in}
    for op in ops:
        if op.group == g:
            to_h = np.arange(hidden_size) if op.h_to_y is None else np.argsort(op.h_to_y)
            y_var = jaxpr.eqns[op.eqn].outvars[0]
            sources[y_var] = to_h.reshape(op.y_aval.shape)   # y position -> hidden position
    reach = propagate(jaxpr, sources, final_of)
    index = {v: idx for v, idx in reach.index.items() if idx is not MIXED}
    finals = [v for v, l in final_of.items() if l in grp.leaves]
    # The input of a synapse onto neurons, computed from the old state alone (a recurrent or
    # delayed synapse), is given to D-RTRL: its path through time is the truncated one, and
    # cutting the state there as well would only add a value whose learning signal is zero.
    from_y = set(propagate(jaxpr, {v: i for v, i in sources.items() if v not in hidden_in},
                           final_of).index)
    given = {v for v, eqns in reach.etp_x_sinks.items() if v not in from_y
             and all(ops[k].group is not None for k in _ops_at(ops, eqns))}
    sinks = (set(reach.sinks) - given) | set(finals) | (set(index) & out_vars)
    # other groups' new values are reached only through ETP ops; the edges stay inside
    edges = [(a, b) for a, b in reach.edges if a in index and b in index]
    cut = _min_vertex_cut(list(index), edges, list(sources), [v for v in sinks if v in index])
    by_leaf = {v: l for v, l in final_of.items()}
    order = {v: p for p, v in enumerate(jaxpr.invars)}
    order.update({v: len(order) + p for p, e in enumerate(jaxpr.eqns) for v in e.outvars})
    cut.sort(key=lambda v: (grp.leaves.index(by_leaf[v]) if v in by_leaf and by_leaf[v] in grp.leaves
                            else len(grp.leaves), order[v]))
    to_hidden = []
    for v in cut:
        flat = index[v].ravel()
        if flat.size != hidden_size or not np.array_equal(np.sort(flat), np.arange(hidden_size)):
            raise ValueError(f'the state of {grp.names} is cut at a value of shape {v.aval.shape} '
                             f'that does not map one to one onto the hidden shape {grp.shape}.')
        to_hidden.append(None if np.array_equal(flat, np.arange(hidden_size)) else flat)
    grp.cut, grp.cut_to_hidden = cut, to_hidden
    grp.identity_release = (len(cut) == grp.n and all(p is None for p in to_hidden)
                            and [by_leaf.get(v) for v in cut] == grp.leaves)
    grp.chained = any(depends_on(jaxpr, v, set(cut) - {v}) for v in cut)
    for k in _ops_at(ops, reach.etp_inputs):
        if ops[k].group is not None:
            grp.feeds.add(ops[k].group)


def _min_vertex_cut(nodes, edges, sources, sinks) -> list:
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


def _parameter_paths(step, jaxpr, etp_eqns, deps, final_of, out_vars, groups):
    """Parameters used outside ETP weight slots, and which of them enter a group's
    dynamics element by element (:class:`DynamicParam`)."""
    direct_params, dynamic = {}, []
    for p, var in enumerate(step.param_vars):
        src = {var}
        for eqn in jaxpr.eqns:   # everything computed from the parameter outside ETP ops
            if any(v in src for v in eqn.invars if not is_literal(v)):
                if not isinstance(eqn.primitive, ETPPrimitive):
                    src |= set(eqn.outvars)
        direct_uses = set()
        for i, eqn in enumerate(jaxpr.eqns):
            for slot, v in enumerate(eqn.invars):
                if is_literal(v) or v not in src:
                    continue
                if i in etp_eqns:
                    if slot in eqn.primitive.trainable_invars(eqn.params).values():
                        continue
                elif not ({'h', 'x', 'y'} & deps.get(eqn.outvars[0], frozenset())):
                    continue     # still a parameter-only computation
                direct_uses.add(i)
        if not (any(v in src for v in out_vars) or direct_uses):
            continue
        reaches_hidden = any(v in src or depends_on(jaxpr, v, src) for v in final_of)
        direct_params[p] = 'hidden' if reaches_hidden else 'output'
        if not reaches_hidden:
            continue
        reach = propagate(jaxpr, {var: _identity(var.aval.shape)}, final_of, broadcast=True)
        for g, grp in enumerate(groups):
            touched = [v for v in grp.cut + [f for f, l in final_of.items() if l in grp.leaves]
                       if v in reach.index]
            if not touched:
                continue
            maps = []
            for v in touched:
                idx = reach.index[v]
                if idx is MIXED or np.size(idx) != int(np.prod(grp.shape)):
                    maps = None
                    break
                perm = (grp.cut_to_hidden[grp.cut.index(v)] if v in grp.cut else None)
                flat = np.ravel(idx)
                maps.append(flat if perm is None else flat[np.argsort(perm)])
            if maps and all(np.array_equal(m, maps[0]) for m in maps[1:]):
                dynamic.append(DynamicParam(p, g, maps[0].reshape(grp.shape),
                                            int(np.prod(var.aval.shape))))
    return direct_params, dynamic
