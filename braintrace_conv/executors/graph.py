"""Model discovery: what an online executor learns from one traced step.

:func:`trace_step` traces ``model.update(x)`` once into a flat jaxpr whose
inputs are ``(hidden leaves, parameter leaves, input leaves)`` and whose
outputs are ``(new hidden leaves, output leaves)``. :func:`analyse` then finds,
with no per-model code:

* the ETP operations (any :class:`~braintrace_conv.ETPPrimitive`), their input
  ``x`` and which parameters their trainable operands are computed from;
* the hidden *groups*: hidden states that reach each other's new values
  through non-ETP paths share a group (e.g. V and an adaptation current), and
  must do so element by element, so ``D^t`` is ``n x n`` per element;
* for each op, the group its output reaches through non-ETP paths, and the
  position map between output and hidden layouts (flatten, transpose and
  other position-preserving reshapes are allowed); an op whose output reaches
  no hidden state is a readout;
* ops whose output also reaches the step's output around the hidden states
  (a *bypass*), and parameters used outside ETP weight slots.

A non-elementwise op (a reduction, a norm, a matmul...) between an op and its
hidden state, or between hidden states, is rejected with an error naming it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from ..primitive import ETPPrimitive

__all__ = ['TracedStep', 'trace_step', 'StepGraph', 'analyse', 'register_elementwise']

# Primitives that act element by element (operands of equal shape, or scalars).
_ELEMENTWISE = {
    'abs', 'acos', 'acosh', 'add', 'add_any', 'and', 'asin', 'asinh', 'atan', 'atan2', 'atanh',
    'cbrt', 'ceil', 'clamp', 'conj', 'convert_element_type', 'copy', 'copy_p', 'cos', 'cosh',
    'digamma', 'div', 'eq', 'erf', 'erf_inv', 'erfc', 'exp', 'exp2', 'expm1', 'floor', 'ge',
    'gt', 'imag', 'integer_pow', 'is_finite', 'le', 'lgamma', 'log', 'log1p', 'logistic', 'lt',
    'max', 'min', 'mul', 'ne', 'neg', 'nextafter', 'not', 'or', 'pow', 'real',
    'reduce_precision', 'rem', 'round', 'rsqrt', 'select_n', 'sign', 'sin', 'sinh', 'sqrt',
    'square', 'stop_gradient', 'sub', 'tan', 'tanh', 'xor',
}


def register_elementwise(name: str) -> None:
    """Declare primitive ``name`` elementwise, so it may sit between an op and its neuron."""
    _ELEMENTWISE.add(name)


# ----------------------------------------------------------------------------- tracing
@dataclasses.dataclass
class TracedStep:
    """One step of a model as a closed jaxpr over flat leaves.

    ``closed_jaxpr`` maps ``(*hidden, *params, *inputs)`` leaves to
    ``(*new_hidden, *outputs)`` leaves. ``hidden_names`` / ``param_names``
    name every leaf; ``out_tree`` rebuilds the model output.
    """
    closed_jaxpr: Any
    model: Any
    hidden_keys: list
    param_keys: list
    hidden_names: list[str]
    param_names: list[str]
    hidden_treedefs: list
    param_treedefs: list
    out_tree: Any
    n_inputs: int

    @property
    def n_hidden(self) -> int:
        return len(self.hidden_names)

    @property
    def n_params(self) -> int:
        return len(self.param_names)

    # States are looked up on every use: re-initialising a model replaces its state objects.
    def _states(self, kind, keys):
        found = self.model.states(kind)
        return [found[k] for k in keys]

    def hidden_leaves(self):
        return [leaf for st in self._states(brainstate.HiddenState, self.hidden_keys)
                for leaf in jax.tree.leaves(st.value)]

    def param_leaves(self):
        return [leaf for st in self._states(brainstate.ParamState, self.param_keys)
                for leaf in jax.tree.leaves(st.value)]

    def write_hidden(self, leaves) -> None:
        it = iter(leaves)
        for st, tdef in zip(self._states(brainstate.HiddenState, self.hidden_keys),
                            self.hidden_treedefs):
            st.value = jax.tree.unflatten(tdef, [next(it) for _ in range(tdef.num_leaves)])

    def params_tree(self, leaves) -> dict:
        """Parameter-leaf list -> dict keyed like ``model.states(ParamState)``."""
        it = iter(leaves)
        return {key: jax.tree.unflatten(tdef, [next(it) for _ in range(tdef.num_leaves)])
                for key, tdef in zip(self.param_keys, self.param_treedefs)}

    def observe(self, fn, hidden, params):
        """``fn(model)`` with the model's states set to ``hidden`` / ``params`` leaves
        (restored afterwards)."""
        states = (self._states(brainstate.HiddenState, self.hidden_keys)
                  + self._states(brainstate.ParamState, self.param_keys))
        treedefs = self.hidden_treedefs + self.param_treedefs
        saved = [st.value for st in states]
        try:
            with brainstate.StateTraceStack():
                it = iter([*hidden, *params])
                for st, tdef in zip(states, treedefs):
                    st.value = jax.tree.unflatten(tdef, [next(it) for _ in range(tdef.num_leaves)])
                return fn(self.model)
        finally:
            for st, v in zip(states, saved):
                st.restore_value(v)

    def evaluate(self, hidden, params, inputs):
        """Plain evaluation: ``(new hidden leaves, output leaves)``."""
        flat = jax.core.eval_jaxpr(self.closed_jaxpr.jaxpr, self.closed_jaxpr.consts,
                                   *hidden, *params, *inputs)
        return flat[:self.n_hidden], flat[self.n_hidden:]


def _leaf_names(key, value):
    base = '.'.join(str(k) for k in key) if isinstance(key, tuple) else str(key)
    paths = jax.tree_util.tree_flatten_with_path(value)[0]
    if len(paths) == 1:
        return [base]
    return [base + jax.tree_util.keystr(p) for p, _ in paths]


def trace_step(model: brainstate.nn.Module, x_example) -> TracedStep:
    """Trace ``model.update(x)`` for the current hidden-state shapes.

    Args:
      model: a ``brainstate.nn.Module`` whose hidden states are initialised.
      x_example: one step of input (a pytree of arrays with batch axes), or
        ``ShapeDtypeStruct``s of it.

    Raises:
      ValueError: if the step writes a state that is neither a ``HiddenState``
        nor left unchanged, or writes a ``ParamState``.
    """
    hidden_map = model.states(brainstate.HiddenState)
    param_map = model.states(brainstate.ParamState)
    hidden_states = list(hidden_map.values())
    hidden_names = [n for k, st in hidden_map.items() for n in _leaf_names(k, st.value)]
    param_names = [n for k, st in param_map.items() for n in _leaf_names(k, st.value)]
    hidden_treedefs = [jax.tree.structure(st.value) for st in hidden_states]
    param_treedefs = [jax.tree.structure(st.value) for st in param_map.values()]
    every = hidden_states + list(param_map.values())
    treedefs = hidden_treedefs + param_treedefs
    x_leaves, x_tree = jax.tree.flatten(x_example)
    out_tree_box = []
    known = set(map(id, every))

    def step(hidden_and_params, xs):
        saved = [st.value for st in every]
        try:
            with brainstate.StateTraceStack():
                it = iter(hidden_and_params)
                for st, tdef in zip(every, treedefs):
                    st.value = jax.tree.unflatten(tdef, [next(it) for _ in range(tdef.num_leaves)])
                with brainstate.StateTraceStack() as stack:   # records the model's own writes
                    out = model.update(jax.tree.unflatten(x_tree, xs))
                new_hidden = [leaf for st in hidden_states for leaf in jax.tree.leaves(st.value)]
                written = [st for st, w in zip(stack.states, stack.been_writen) if w]
        finally:
            for st, v in zip(every, saved):
                st.restore_value(v)
        for st in written:
            if id(st) not in known:
                raise ValueError(f'model.update writes state {st!r} which is neither a '
                                 f'brainstate.HiddenState nor a ParamState; online executors '
                                 f'carry only HiddenStates across steps.')
            if isinstance(st, brainstate.ParamState):
                raise ValueError(f'model.update writes the ParamState {st!r}; parameters must '
                                 f'stay fixed within a sequence.')
        out_leaves, out_tree = jax.tree.flatten(out)
        out_tree_box.append(out_tree)
        return new_hidden + out_leaves

    leaves = [leaf for st in every for leaf in jax.tree.leaves(st.value)]
    specs = [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in leaves]
    x_specs = [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in x_leaves]
    with jax.disable_jit():   # inline every jitted helper so ETP ops sit at top level
        closed = jax.make_jaxpr(lambda a, b: step(a, b))(specs, x_specs)
    return TracedStep(closed, model, list(hidden_map.keys()), list(param_map.keys()),
                      hidden_names, param_names, hidden_treedefs, param_treedefs,
                      out_tree_box[-1], len(x_leaves))


def _bind(eqn, invals) -> list:
    """Re-bind one jaxpr equation to new operands; always returns a list of outputs."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)  # older JAX: a pair
    outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


# ----------------------------------------------------------------------------- analysis
_MIXED = 'mixed'   # marker: a value in which positions of the source are combined


class _Mixing(Exception):
    pass


def _sub_jaxpr(eqn):
    for key in ('call_jaxpr', 'jaxpr', 'fun_jaxpr'):
        sub = eqn.params.get(key)
        if isinstance(sub, jex_core.ClosedJaxpr):
            return sub.jaxpr
        if isinstance(sub, jex_core.Jaxpr):
            return sub
    return None


def _positions_through(eqn, index_in: dict[int, Any]):
    """Index arrays of ``eqn``'s outputs given those of its dependent operands.

    ``index_in`` maps operand position -> integer array (the source position
    of every element) or ``_MIXED``. Returns a list (one per output) of
    arrays, ``_MIXED`` or ``None`` (independent). Raises ``_Mixing`` with the
    primitive name when positions get combined.
    """
    name = eqn.primitive.name
    out_avals = [v.aval for v in eqn.outvars]
    if any(v is _MIXED for v in index_in.values()):
        raise _Mixing(name)
    if name in _ELEMENTWISE:
        shape = out_avals[0].shape
        result = None
        for pos, idx in index_in.items():
            if idx.shape != shape:
                raise _Mixing(f'{name} (broadcasting a {idx.shape} operand to {shape})')
            if result is not None and not np.array_equal(result, idx):
                raise _Mixing(f'{name} (combining different positions)')
            result = idx
        return [result] * len(out_avals)
    if len(index_in) != 1:
        raise _Mixing(name)
    (pos, idx), = index_in.items()
    if name == 'reshape' and pos == 0:
        return [np.reshape(idx, eqn.params['new_sizes'])]
    if name == 'transpose':
        return [np.transpose(idx, eqn.params['permutation'])]
    if name == 'squeeze':
        return [np.squeeze(idx, tuple(eqn.params['dimensions']))]
    if name == 'broadcast_in_dim' and pos == 0:
        shape = eqn.params['shape']
        if int(np.prod(shape)) != idx.size:
            raise _Mixing('broadcast_in_dim (copies one position to many)')
        expanded = np.reshape(idx, [shape[d] if d in eqn.params['broadcast_dimensions'] else 1
                                    for d in range(len(shape))])
        return [np.broadcast_to(expanded, shape)]
    raise _Mixing(name)


@dataclasses.dataclass
class _Reach:
    finals: dict          # hidden leaf -> index array or _MIXED
    outputs: bool         # reaches an output leaf
    etp_inputs: set       # eqn indices of ETP ops whose x it reaches
    etp_weights: set      # eqn indices of ETP ops whose weights it reaches
    mixing: str | None    # first mixing primitive met (if any)


def _propagate(jaxpr, etp_eqns: set, source_vars: dict, final_of: dict, out_vars: set,
               stop_at_finals: bool = False) -> _Reach:
    """Follow the positions of ``source_vars`` forward through ``jaxpr``, cutting at
    ETP ops (recording whose input or weights are reached) and, optionally, at the
    new hidden values (the paths beyond them belong to the learning signal)."""
    index = dict(source_vars)
    reach = _Reach({}, False, set(), set(), None)

    def visit(eqns, index):
        for i, eqn in enumerate(eqns):
            deps = {p: index[v] for p, v in enumerate(eqn.invars)
                    if not isinstance(v, jex_core.Literal) and v in index}
            if not deps:
                continue
            if eqns is jaxpr.eqns and i in etp_eqns:
                prim = eqn.primitive
                slots = prim.trainable_invars(eqn.params)
                if prim.x_invar_index in deps:
                    reach.etp_inputs.add(i)
                if set(slots.values()) & set(deps):
                    reach.etp_weights.add(i)
                continue
            sub = _sub_jaxpr(eqn)
            try:
                if sub is not None and len(sub.invars) == len(eqn.invars):
                    inner = {sub.invars[p]: idx for p, idx in deps.items()}
                    visit(sub.eqns, inner)
                    outs = [inner.get(v) if not isinstance(v, jex_core.Literal) else None
                            for v in sub.outvars]
                else:
                    outs = _positions_through(eqn, deps)
            except _Mixing as err:
                reach.mixing = reach.mixing or str(err)
                outs = [_MIXED] * len(eqn.outvars)
            for v, idx in zip(eqn.outvars, outs):
                if idx is None:
                    continue
                if v in final_of:
                    reach.finals[final_of[v]] = idx
                    if stop_at_finals:
                        continue
                index[v] = idx

    visit(jaxpr.eqns, index)
    reach.outputs = any(v in index for v in out_vars)
    return reach


@dataclasses.dataclass
class Group:
    """Hidden leaves that evolve together, element by element (``n = len(leaves)``).

    ``chained``: some new value of the group is computed from another new value
    of the group within the step (e.g. an adaptation driven by the new spike).
    """
    leaves: list[int]
    shape: tuple
    names: list[str]
    chained: bool = False

    @property
    def n(self) -> int:
        return len(self.leaves)


@dataclasses.dataclass
class EtpOp:
    """One ETP operation in the step.

    Attributes:
      eqn: index of its equation in the step jaxpr.
      group: index of the hidden group its output reaches, or None (readout).
      h_to_y: for a grouped op, ``None`` when the hidden layout equals the
        output layout, else the permutation taking the flat hidden elements
        to flat output positions.
      bypass: its output also reaches the step output or another op's input
        without passing through a hidden state.
      exact_readout: a readout whose output reaches no hidden state at all.
      param_leaves: parameter leaves its trainable operands are computed from.
    """
    eqn: int
    primitive: ETPPrimitive
    params: dict
    weight_slots: dict
    weight_avals: dict
    y_aval: Any
    x_aval: Any
    group: int | None
    h_to_y: np.ndarray | None
    bypass: bool
    exact_readout: bool
    param_leaves: list[int]
    slot_params: dict        # trainable operand name -> parameter leaves it is computed from
    label: str


@dataclasses.dataclass
class StepGraph:
    """The result of :func:`analyse`."""
    step: TracedStep
    ops: list[EtpOp]
    groups: list[Group]
    group_of_leaf: dict
    final_of: dict             # jaxpr var -> hidden leaf index
    direct_params: dict        # param leaf -> 'hidden' | 'output': used outside ETP weight slots

    # ---------------------------------------------------------------- evaluation
    def run(self, hidden, params, inputs, *, weights=None, eps=None, delta=None,
            cut_etp=None, record=False):
        """Evaluate the step with hooks.

        Args:
          hidden, params, inputs: flat leaves.
          weights: ``{op_index: {slot_name: value}}`` overriding the ETP
            weight operands (their gradients are then taken separately).
          eps: per-hidden-leaf perturbation added to each new hidden value
            where it is produced, so later uses in the step see it.
          delta: ``{op_index: perturbation}`` added to ETP op outputs.
          cut_etp: ``{op_index: y}``, the ETP op outputs of this step: they
            replace the ops (no recomputation), which cuts every path
            through them.
          record: also return ``{op_index: x}`` and ``{op_index: y}``.

        Returns:
          ``(new_hidden, outputs)`` or ``(new_hidden, outputs, xs, ys)``.
        """
        closed = self.step.closed_jaxpr
        jaxpr = closed.jaxpr
        env = {}
        read = lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]
        for v, val in zip(jaxpr.constvars, closed.consts):
            env[v] = val
        for v, val in zip(jaxpr.invars, [*hidden, *params, *inputs]):
            env[v] = val
        op_at = {op.eqn: k for k, op in enumerate(self.ops)}
        xs, ys = {}, {}
        for i, eqn in enumerate(jaxpr.eqns):
            invals = [read(v) for v in eqn.invars]
            k = op_at.get(i)
            if k is not None:
                op = self.ops[k]
                if weights is not None:
                    for name, slot in op.weight_slots.items():
                        invals[slot] = weights[k][name]
                if record:
                    xs[k] = invals[op.primitive.x_invar_index]
                if cut_etp is not None:
                    outs = [lax.stop_gradient(cut_etp[k])]
                else:
                    outs = [eqn.primitive.bind(*invals, **eqn.params)]
                if record:
                    ys[k] = outs[0]
                if delta is not None and k in delta:
                    outs = [outs[0] + delta[k]]
            else:
                outs = _bind(eqn, invals)
            for v, val in zip(eqn.outvars, outs):
                if eps is not None and v in self.final_of:
                    val = val + eps[self.final_of[v]]
                env[v] = val
        flat = [read(v) for v in jaxpr.outvars]
        n = self.step.n_hidden
        return (flat[:n], flat[n:], xs, ys) if record else (flat[:n], flat[n:])

    def weights(self, params):
        """``{op_index: {slot: value}}``: the ETP weight operands as functions of params."""
        closed = self.step.closed_jaxpr
        jaxpr = closed.jaxpr
        env = {}
        read = lambda v: v.val if isinstance(v, jex_core.Literal) else env.get(v)
        for v, val in zip(jaxpr.constvars, closed.consts):
            env[v] = val
        first = self.step.n_hidden
        for v, val in zip(jaxpr.invars[first:first + len(params)], params):
            env[v] = val
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if any(val is None for val in invals) or isinstance(eqn.primitive, ETPPrimitive):
                continue
            for v, val in zip(eqn.outvars, _bind(eqn, invals)):
                env[v] = val
        return [{name: read(jaxpr.eqns[op.eqn].invars[slot])
                 for name, slot in op.weight_slots.items()} for op in self.ops]

    def y_layout(self, op: EtpOp, hidden_array, n_extra: int):
        """Move a hidden-layout array (``(*h.shape, *extra)``) to ``op``'s output layout."""
        extra = hidden_array.shape[hidden_array.ndim - n_extra:]
        flat = hidden_array.reshape(-1, *extra)
        if op.h_to_y is not None:
            flat = flat[np.argsort(op.h_to_y)]
        return flat.reshape(*op.y_aval.shape, *extra)


def _dependency_sets(jaxpr, n_hidden, n_params):
    """For every var, the set of source kinds it depends on: 'h', 'p<i>', 'x', 'y'."""
    deps = {}
    for i, v in enumerate(jaxpr.invars):
        if i < n_hidden:
            deps[v] = frozenset({'h'})
        elif i < n_hidden + n_params:
            deps[v] = frozenset({('p', i - n_hidden)})
        else:
            deps[v] = frozenset({'x'})
    for eqn in jaxpr.eqns:
        d = frozenset().union(*[deps.get(v, frozenset()) for v in eqn.invars
                                if not isinstance(v, jex_core.Literal)])
        if isinstance(eqn.primitive, ETPPrimitive):
            d = d | {'y'}
        for v in eqn.outvars:
            deps[v] = d
    return deps


def analyse(step: TracedStep) -> StepGraph:
    """Discover ops, groups and paths of a traced step (see module docstring).

    Raises:
      ValueError: naming the op, parameter or hidden state, when the step
        cannot be learned online exactly as described.
    """
    jaxpr = step.closed_jaxpr.jaxpr
    nh, np_ = step.n_hidden, step.n_params
    etp_eqns = {i for i, e in enumerate(jaxpr.eqns) if isinstance(e.primitive, ETPPrimitive)}
    for i, eqn in enumerate(jaxpr.eqns):
        if i not in etp_eqns and _sub_jaxpr(eqn) is not None and _contains_etp(_sub_jaxpr(eqn)):
            raise ValueError(f'an ETP op is used inside {eqn.primitive.name!r} (control flow '
                             f'or a non-inlined call); online executors need ETP ops at the top '
                             f'level of one step.')
    produced = {v for e in jaxpr.eqns for v in e.outvars}
    final_of = {}
    for leaf, v in enumerate(jaxpr.outvars[:nh]):
        if not isinstance(v, jex_core.Literal) and v in produced and v not in final_of:
            final_of[v] = leaf
    out_vars = {v for v in jaxpr.outvars[nh:] if not isinstance(v, jex_core.Literal)}
    deps = _dependency_sets(jaxpr, nh, np_)

    def describe_params(leaves):
        return ', '.join(step.param_names[p] for p in sorted(leaves)) or 'no parameter'

    # -- groups: hidden leaves reaching each other's new values element by element
    parent = list(range(nh))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    hidden_in = jaxpr.invars[:nh]
    for leaf, var in enumerate(hidden_in):
        if not jnp.issubdtype(var.aval.dtype, jnp.inexact):
            continue
        ident = np.arange(int(np.prod(var.aval.shape))).reshape(var.aval.shape)
        reach = _propagate(jaxpr, etp_eqns, {var: ident}, final_of, out_vars)
        for other, idx in reach.finals.items():
            if idx is _MIXED or idx.shape != ident.shape or not np.array_equal(idx, ident):
                raise ValueError(
                    f'hidden state {step.hidden_names[leaf]!r} reaches the new value of '
                    f'{step.hidden_names[other]!r} through a non-elementwise op '
                    f'({reach.mixing or "a position-changing reshape"}); online executors need '
                    f'diagonal (element-by-element) neuron dynamics.')
            parent[find(other)] = find(leaf)
    dynamic = sorted(final_of.values())
    by_root: dict[int, list[int]] = {}
    for leaf in dynamic:
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
        finals = {v for v, l in final_of.items() if l in leaves}
        chained = any(depends_on(jaxpr, v, finals - {v}) for v in finals)
        groups.append(Group(leaves, shapes.pop(), [step.hidden_names[l] for l in leaves], chained))

    # -- ETP ops
    ops = []
    for i in sorted(etp_eqns):
        eqn = jaxpr.eqns[i]
        prim = eqn.primitive
        slots = prim.trainable_invars(eqn.params)
        p_leaves, slot_params = set(), {}
        for name, slot in slots.items():
            v = eqn.invars[slot]
            d = deps.get(v, frozenset()) if not isinstance(v, jex_core.Literal) else frozenset()
            if d - {('p', k) for k in range(np_)}:
                raise ValueError(f'the {name!r} operand of {prim.name} #{len(ops)} depends on '
                                 f'hidden states or inputs; trainable operands of ETP ops must '
                                 f'be computed from parameters only.')
            slot_params[name] = sorted(k for _, k in d)
            p_leaves |= set(slot_params[name])
        x_var = eqn.invars[prim.x_invar_index]
        label = f'{prim.name} #{len(ops)} ({describe_params(p_leaves)})'
        y_var = eqn.outvars[0]
        size = int(np.prod(y_var.aval.shape))
        reach = _propagate(jaxpr, etp_eqns, {y_var: np.arange(size).reshape(y_var.aval.shape)},
                           final_of, out_vars, stop_at_finals=True)
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
            if any(m is _MIXED for m in maps):
                raise ValueError(f'a non-elementwise op ({reach.mixing}) lies between {label} and '
                                 f'hidden state(s) {groups[group].names}; D-RTRL needs the op '
                                 f'output to reach its neurons element by element (move norms, '
                                 f'pooling or reductions after the neuron).')
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
            y_aval=y_var.aval, x_aval=getattr(x_var, 'aval', None), group=group, h_to_y=h_to_y,
            bypass=group is not None and (reach.outputs or bool(reach.etp_inputs)),
            exact_readout=group is None and not full, param_leaves=sorted(p_leaves),
            slot_params=slot_params, label=label))

    # -- parameters used outside ETP weight slots
    direct_params = {}
    for p in range(np_):
        src = {jaxpr.invars[nh + p]}
        # everything computed from the parameter outside ETP ops
        for eqn in jaxpr.eqns:
            if any(v in src for v in eqn.invars if not isinstance(v, jex_core.Literal)):
                if not isinstance(eqn.primitive, ETPPrimitive):
                    src |= set(eqn.outvars)
        direct_uses = set()
        for i, eqn in enumerate(jaxpr.eqns):
            for slot, v in enumerate(eqn.invars):
                if isinstance(v, jex_core.Literal) or v not in src:
                    continue
                if i in etp_eqns:
                    if slot in eqn.primitive.trainable_invars(eqn.params).values():
                        continue
                else:
                    d = deps.get(eqn.outvars[0], frozenset())
                    if not ({'h', 'x', 'y'} & d):
                        continue     # still a parameter-only computation
                direct_uses.add(i)
        if any(v in src for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)) or direct_uses:
            reaches_hidden = any(v in src or depends_on(jaxpr, v, src)
                                 for v in final_of)
            direct_params[p] = 'hidden' if reaches_hidden else 'output'
    return StepGraph(step, ops, groups, group_of_leaf, final_of, direct_params)


def _contains_etp(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if isinstance(eqn.primitive, ETPPrimitive):
            return True
        sub = _sub_jaxpr(eqn)
        if sub is not None and _contains_etp(sub):
            return True
    return False


def depends_on(jaxpr, target, sources: set) -> bool:
    """Whether jaxpr variable ``target`` is computed from any of ``sources``."""
    reached = set(sources)
    for eqn in jaxpr.eqns:
        if any(v in reached for v in eqn.invars if not isinstance(v, jex_core.Literal)):
            reached |= set(eqn.outvars)
    return target in reached
