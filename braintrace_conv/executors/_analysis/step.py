"""The brainstate boundary: one step of a model as a jaxpr over flat leaves.

:func:`capture_step` traces ``model.update(x)`` once into a closed jaxpr whose
inputs are ``(hidden leaves, parameter leaves, input leaves)`` and whose
outputs are ``(new hidden leaves, output leaves)``, with every jitted helper
inlined, then rewritten for the analysis (:mod:`.lift`: plain ``lax``
convolutions / matrix products whose weights are computed from parameters
rebound as ETP ops, poolings folded into them). :class:`StepJaxpr` names the
jaxpr's variables and reads and writes the model's state values in that order.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import saiunit as u
from jax import lax

from ...primitive import ETPPrimitive
from .jaxpr import bind_eqn, dependency_sets, interpret, is_literal, read
from .lift import rewrite_step


@dataclasses.dataclass
class StepJaxpr:
    """One step of a model as a closed jaxpr over flat leaves.

    ``closed_jaxpr`` maps ``(*hidden, *params, *inputs)`` leaves to
    ``(*new_hidden, *outputs)`` leaves; its variables for each group are
    :attr:`hidden_vars`, :attr:`param_vars`, :attr:`input_vars`,
    :attr:`new_hidden_vars` and :attr:`output_vars`. ``hidden_names`` /
    ``param_names`` name every leaf (:func:`leaf_name`), ``param_paths`` give each
    parameter leaf's place in a dict keyed like ``model.states()``; ``out_tree``
    rebuilds the model output.
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
    param_paths: list    # per parameter leaf: (state key, *key entries inside its value)

    @property
    def n_hidden(self) -> int:
        return len(self.hidden_names)

    @property
    def n_params(self) -> int:
        return len(self.param_names)

    @property
    def hidden_vars(self) -> list:
        """The jaxpr's input variables of the hidden leaves ``h^{t-1}``."""
        return self.closed_jaxpr.jaxpr.invars[:self.n_hidden]

    @property
    def param_vars(self) -> list:
        """The jaxpr's input variables of the parameter leaves."""
        return self.closed_jaxpr.jaxpr.invars[self.n_hidden:self.n_hidden + self.n_params]

    @property
    def input_vars(self) -> list:
        """The jaxpr's input variables of the step's input leaves ``x^t``."""
        return self.closed_jaxpr.jaxpr.invars[self.n_hidden + self.n_params:]

    @property
    def new_hidden_vars(self) -> list:
        """The jaxpr's output variables (or literals) of the new hidden leaves ``h^t``."""
        return self.closed_jaxpr.jaxpr.outvars[:self.n_hidden]

    @property
    def output_vars(self) -> list:
        """The jaxpr's output variables (or literals) of the model output leaves."""
        return self.closed_jaxpr.jaxpr.outvars[self.n_hidden:]

    def dependencies(self) -> dict:
        """For every variable, the kinds of source it is computed from (see
        :func:`~.jaxpr.dependency_sets`): ``'h'`` (hidden leaves), ``('p', i)``
        (parameter leaf ``i``), ``'x'`` (input leaves) and ``'y'`` (ETP op outputs)."""
        sources = {v: {'h'} for v in self.hidden_vars}
        sources.update({v: {('p', i)} for i, v in enumerate(self.param_vars)})
        sources.update({v: {'x'} for v in self.input_vars})
        return dependency_sets(self.closed_jaxpr.jaxpr, sources)

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

    def grads_tree(self, leaves) -> dict:
        """Gradient leaves -> dict keyed like ``model.states(ParamState)``.

        A leaf is ``dL/d(mantissa)``; for a ``saiunit`` quantity parameter the
        gradient is returned as a quantity in the inverse of its unit (the loss
        being unitless), i.e. ``dL/dtheta`` with the same mantissa.
        """
        is_q = lambda v: isinstance(v, u.Quantity)
        values = dict(zip(self.param_keys,
                          [st.value for st in self._states(brainstate.ParamState, self.param_keys)]))
        return {key: jax.tree.map(lambda v, g: u.Quantity(u.get_mantissa(g), unit=v.unit ** -1)
                                  if is_q(v) else g, values[key], grad, is_leaf=is_q)
                for key, grad in self.params_tree(leaves).items()}

    def observe(self, fn, hidden, params):
        """``fn(model)`` with the model's states set to ``hidden`` / ``params`` leaves
        (restored afterwards)."""
        states = (self._states(brainstate.HiddenState, self.hidden_keys)
                  + self._states(brainstate.ParamState, self.param_keys))
        with _values_set(states, self.hidden_treedefs + self.param_treedefs, [*hidden, *params]):
            return fn(self.model)

    def evaluate(self, hidden, params, inputs):
        """Plain evaluation: ``(new hidden leaves, output leaves)``."""
        env = interpret(self.closed_jaxpr, dict(zip(self.closed_jaxpr.jaxpr.invars,
                                                    [*hidden, *params, *inputs])))
        return ([read(env, v) for v in self.new_hidden_vars],
                [read(env, v) for v in self.output_vars])


def _leaf_paths(key, value) -> list[tuple]:
    """Per leaf of a state's ``value``: ``(key, *path)``, the path that indexes the leaf in a
    dict keyed like ``model.states()`` (a ``saiunit`` quantity is one leaf)."""
    paths = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda v: isinstance(v, u.Quantity))[0]
    return [(key, *path) for path, _ in paths]


def leaf_name(path: tuple) -> str:
    """``conv.weight['bias']`` for the path ``(('conv', 'weight'), DictKey('bias'))``: the state's
    key joined by dots, then the leaf's path inside its value, if it has one."""
    key, *inner = path
    base = '.'.join(str(k) for k in key) if isinstance(key, tuple) else str(key)
    return base + jax.tree_util.keystr(tuple(inner))


@contextlib.contextmanager
def _values_set(states, treedefs, leaves):
    """Give ``states`` the values rebuilt from flat ``leaves`` inside the block (under a
    trace stack of their own), and restore their values afterwards."""
    saved = [st.value for st in states]
    try:
        with brainstate.StateTraceStack():
            it = iter(leaves)
            for st, tdef in zip(states, treedefs):
                st.value = jax.tree.unflatten(tdef, [next(it) for _ in range(tdef.num_leaves)])
            yield
    finally:
        for st, v in zip(states, saved):
            st.restore_value(v)


def capture_step(model: brainstate.nn.Module, x_example) -> StepJaxpr:
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
    hidden_names = [leaf_name(p) for k, st in hidden_map.items() for p in _leaf_paths(k, st.value)]
    param_paths = [p for k, st in param_map.items() for p in _leaf_paths(k, st.value)]
    param_names = [leaf_name(p) for p in param_paths]
    hidden_treedefs = [jax.tree.structure(st.value) for st in hidden_states]
    param_treedefs = [jax.tree.structure(st.value) for st in param_map.values()]
    every = hidden_states + list(param_map.values())
    treedefs = hidden_treedefs + param_treedefs
    x_leaves, x_tree = jax.tree.flatten(x_example)
    out_tree_box = []
    known = set(map(id, every))

    def flat_update(hidden_and_params, xs):
        with _values_set(every, treedefs, hidden_and_params):
            with brainstate.StateTraceStack() as stack:   # records the model's own writes
                out = model.update(jax.tree.unflatten(x_tree, xs))
            new_hidden = [leaf for st in hidden_states for leaf in jax.tree.leaves(st.value)]
            written = [st for st, w in zip(stack.states, stack.been_writen) if w]
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
        closed = jax.make_jaxpr(flat_update)(specs, x_specs)
    step = StepJaxpr(closed, model, list(hidden_map.keys()), list(param_map.keys()),
                      hidden_names, param_names, hidden_treedefs, param_treedefs,
                      out_tree_box[-1], param_paths)
    step = dataclasses.replace(step, closed_jaxpr=rewrite_step(step))
    return dataclasses.replace(step, closed_jaxpr=_values_of_their_own(step))


def _values_of_their_own(step: StepJaxpr):
    """The step's jaxpr with a ``copy`` inserted where a value plays two roles, so that the
    analysis, which identifies values by their variables, sees each role.

    * **New hidden values.** Each is a variable of its own, produced by an equation that
      is not an ETP op. A state that takes another state's old value unchanged (a delay
      line: ``d2 = d1``), keeps its own (``h = h``), takes an input, a parameter or an
      op's output (``d1 = conv(x)``), or shares its new value with another state
      (``a = v; b = v``) would otherwise be lost from its group, and its gradient path
      with it.
    * **Inputs of ops computed from the old state alone** (a recurrent or delayed
      synapse) that something else reads too: each such op reads a copy of its own, so
      the recurrent-synapse cut of D-RTRL applies to that op alone, while another
      layer's op or the output reading the same old value keeps its path.

    The program computes the same thing, and XLA removes the copies.
    """
    jaxpr = step.closed_jaxpr.jaxpr
    produced = {v for eqn in jaxpr.eqns if not isinstance(eqn.primitive, ETPPrimitive)
                for v in eqn.outvars}
    copied_outputs, seen = set(), set()
    for leaf, v in enumerate(step.new_hidden_vars):
        if not is_literal(v) and (v not in produced or v in seen):
            copied_outputs.add(leaf)
        seen.add(v)
    readers = collections.Counter(v for eqn in jaxpr.eqns
                                  for v in {v for v in eqn.invars if not is_literal(v)})
    readers.update(v for v in jaxpr.outvars if not is_literal(v))
    deps = step.dependencies()
    copied_inputs = set()
    for i, eqn in enumerate(jaxpr.eqns):
        if isinstance(eqn.primitive, ETPPrimitive):
            x = eqn.invars[eqn.primitive.x_invar_index]
            kinds = deps.get(x, frozenset()) if not is_literal(x) else frozenset()
            if 'h' in kinds and not kinds & {'x', 'y'} and readers[x] > 1:
                copied_inputs.add(i)
    if not copied_outputs and not copied_inputs:
        return step.closed_jaxpr

    def bind(i, eqn, invals):
        if i not in copied_inputs:
            return None
        slot = eqn.primitive.x_invar_index
        invals = [lax.copy_p.bind(v) if j == slot else v for j, v in enumerate(invals)]
        return bind_eqn(eqn, invals)

    def run(*args):
        env = interpret(step.closed_jaxpr, dict(zip(jaxpr.invars, args)), bind=bind)
        out = [read(env, v) for v in jaxpr.outvars]
        return [lax.copy_p.bind(val) if i in copied_outputs else val for i, val in enumerate(out)]

    return jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
                                 for v in jaxpr.invars])
