"""The brainstate boundary: one step of a model as a jaxpr over flat leaves.

:func:`trace_step` traces ``model.update(x)`` once into a closed jaxpr whose
inputs are ``(hidden leaves, parameter leaves, input leaves)`` and whose
outputs are ``(new hidden leaves, output leaves)``, with every jitted helper
inlined and plain ``lax`` convolutions / matrix products whose weights are
computed from parameters rebound as ETP ops (:mod:`braintrace_conv.lift`).
:class:`TracedStep` reads and writes the model's state values in that order.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import saiunit as u

import numpy as np

from ...conv import etp_conv_p
from ...primitive import ETPPrimitive
from .jaxpr import bind_eqn, dependency_sets, interpret, is_literal, read
from .lift import lift_rule


@dataclasses.dataclass
class TracedStep:
    """One step of a model as a closed jaxpr over flat leaves.

    ``closed_jaxpr`` maps ``(*hidden, *params, *inputs)`` leaves to
    ``(*new_hidden, *outputs)`` leaves; its variables for each group are
    :attr:`hidden_vars`, :attr:`param_vars`, :attr:`input_vars`,
    :attr:`new_hidden_vars` and :attr:`output_vars`. ``hidden_names`` /
    ``param_names`` name every leaf; ``out_tree`` rebuilds the model output.
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


def _leaf_names(key, value):
    base = '.'.join(str(k) for k in key) if isinstance(key, tuple) else str(key)
    paths = jax.tree_util.tree_flatten_with_path(value)[0]
    if len(paths) == 1:
        return [base]
    return [base + jax.tree_util.keystr(p) for p, _ in paths]


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
        closed = jax.make_jaxpr(lambda a, b: step(a, b))(specs, x_specs)
    step = TracedStep(closed, model, list(hidden_map.keys()), list(param_map.keys()),
                      hidden_names, param_names, hidden_treedefs, param_treedefs,
                      out_tree_box[-1])
    return dataclasses.replace(step, closed_jaxpr=_lift_plain_ops(step))


def _lift_plain_ops(step: TracedStep):
    """Re-trace ``closed`` with plain ops rebound as ETP ops where a lift rule applies
    (weight operand from parameters only, data operand from states or inputs),
    sum/average pooling right after a convolution folded into it, and ``custom_vjp``
    functions given a forward-mode rule (:func:`_forward_mode`)."""
    closed = step.closed_jaxpr
    jaxpr = closed.jaxpr
    deps = step.dependencies()
    params_only = lambda v: is_literal(v) or not (deps.get(v, frozenset()) & {'h', 'x', 'y'})
    lifts = {}
    for i, eqn in enumerate(jaxpr.eqns):
        found = lift_rule(eqn.primitive.name)
        if found is None:
            continue
        rule, w = found
        others = [v for p, v in enumerate(eqn.invars) if p != w]
        if params_only(eqn.invars[w]) and not all(params_only(v) for v in others):
            lifts[i] = rule
    convs = {i for i, e in enumerate(jaxpr.eqns)
             if e.primitive is etp_conv_p or (i in lifts and e.primitive.name == 'conv_general_dilated')}
    folds = _pool_folds(jaxpr, convs, params_only)
    vjp_calls = {i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == 'custom_vjp_call'}
    if not lifts and not folds and not vjp_calls:
        return closed

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        read = lambda v: v.val if is_literal(v) else env[v]
        pending, skip = {}, set()
        for i, eqn in enumerate(jaxpr.eqns):
            if i in skip:
                continue
            if i in pending:                   # the pooling of a folded convolution
                (prim, operands, params), fold = pending.pop(i)
                out = prim.bind(*operands, **params, pool=fold.pool)
                if fold.bias is not None:      # pool(y + c) = pool(y) + pool(c)
                    shape = jaxpr.eqns[fold.bias_eqn].outvars[0].aval.shape
                    c = jnp.broadcast_to(read(fold.bias), shape)
                    scale = jnp.asarray(fold.pool[3], c.dtype)
                    out = out + eqn.primitive.bind(c, **eqn.params) * scale
                last = jaxpr.eqns[fold.scale_eqn] if fold.scale_eqn is not None else eqn
                skip.add(fold.scale_eqn)
                env[last.outvars[0]] = out
                continue
            invals = [read(v) for v in eqn.invars]
            bound = lifts[i](invals, eqn.params) if i in lifts else None
            if bound is None and isinstance(eqn.primitive, ETPPrimitive):
                bound = eqn.primitive, invals, dict(eqn.params)
            if i in folds:                     # bind later, with the pooling
                pending[folds[i].reduce_eqn] = (bound, folds[i])
                skip.add(folds[i].bias_eqn)
                continue
            if bound is not None:
                outs = [bound[0].bind(*bound[1], **bound[2])]
            elif i in vjp_calls:
                outs = _forward_mode(eqn)(*invals)
            else:
                outs = bind_eqn(eqn, invals)
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    return jax.make_jaxpr(run)(*specs)


def _forward_mode(eqn):
    """A ``custom_vjp`` call as a ``custom_jvp`` function with the same value, whose JVP
    is the transpose of the user's VJP.

    The online executors differentiate a step forward in time, which JAX refuses
    through ``custom_vjp``. A VJP rule is linear in the cotangent, so its transpose is
    the JVP that BPTT implicitly uses: D-RTRL stays exact, whatever the function (a
    spike with a surrogate derivative, typically). Reverse mode through the new
    function transposes that JVP back to the user's VJP.
    """
    @jax.custom_jvp
    def call(*args):
        return bind_eqn(eqn, list(args))

    @call.defjvp
    def jvp(primals, tangents):
        outs, vjp = jax.vjp(call.fun, *primals)
        out_tangents, = jax.linear_transpose(vjp, outs)(tuple(tangents))
        return outs, out_tangents

    return call


@dataclasses.dataclass(frozen=True)
class _PoolFold:
    """A sum/average pooling read from a convolution's output, to fold into the op:
    ``scale * reduce_window_sum(y [+ c])``, with ``c`` (a bias) computed from
    parameters only. Fields are equation indices, the bias variable and the op's
    ``pool`` parameter ``(window, strides, padding, scale)``."""
    reduce_eqn: int
    scale_eqn: int | None
    bias_eqn: int | None
    bias: Any
    pool: tuple


def _pool_folds(jaxpr, convs, params_only) -> dict:
    """``{conv eqn: _PoolFold}`` for a convolution whose only reader is a
    ``reduce_window_sum`` over spatial axes -- directly, or through the addition of a
    parameter-only bias -- optionally followed by a multiplication or division by a
    constant scalar (average pooling)."""
    readers = {}
    for j, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not is_literal(v):
                readers.setdefault(v, []).append(j)
    outs = {v for v in jaxpr.outvars if not is_literal(v)}
    only_reader = lambda v: readers.get(v, [None])[0] if len(readers.get(v, [])) == 1 \
        and v not in outs else None
    folds = {}
    for i in sorted(convs):
        eqn = jaxpr.eqns[i]
        if eqn.params.get('pool') is not None:
            continue
        y, bias_eqn, bias = eqn.outvars[0], None, None
        j = only_reader(y)
        if j is not None and jaxpr.eqns[j].primitive.name == 'add':
            a, b = jaxpr.eqns[j].invars
            c = b if a is y else a
            if c is y or not params_only(c):
                continue
            bias_eqn, bias, y = j, c, jaxpr.eqns[j].outvars[0]
            j = only_reader(y)
        if j is None or jaxpr.eqns[j].primitive.name != 'reduce_window_sum':
            continue
        rw = jaxpr.eqns[j].params
        spec = eqn.params['dimension_numbers'].out_spec
        window, strides = tuple(rw['window_dimensions']), tuple(rw['window_strides'])
        padding = tuple(tuple(p) for p in rw['padding'])
        if any(d != 1 for d in (*rw['base_dilation'], *rw['window_dilation'])) or \
                any(window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0) for a in spec[:2]):
            continue
        scale, k = 1.0, only_reader(jaxpr.eqns[j].outvars[0])
        if k is not None and jaxpr.eqns[k].primitive.name in ('mul', 'div'):
            a, b = jaxpr.eqns[k].invars
            c = b if a is jaxpr.eqns[j].outvars[0] else a
            if is_literal(c) and np.ndim(c.val) == 0 and \
                    (jaxpr.eqns[k].primitive.name == 'mul' or b is c):
                scale = float(c.val) if jaxpr.eqns[k].primitive.name == 'mul' else 1.0 / float(c.val)
            else:
                k = None
        else:
            k = None
        folds[i] = _PoolFold(j, k, bias_eqn, bias, (window, strides, padding, scale))
    return folds
