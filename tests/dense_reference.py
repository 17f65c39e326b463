r"""Brute-force references of the online executors' gradients, from dense Jacobians.

Each approximation the executors document is rebuilt here from its definition
(``docs/theory.md``), sharing no code with ``braintrace_conv.executors``: the model is
read through brainstate, one step is evaluated by a jaxpr interpreter of this file,
and every Jacobian is a dense matrix from ``jax.jacrev`` (float64, small sizes), so an
executor that agrees to round-off computes the approximation its report names.

Notation (one step, all floating hidden values flattened into ``H``):

* *ops*: the trainable operations, ETP primitives and plain ``conv_general_dilated`` /
  ``dot_general`` equations with one operand free of data (computed from parameters
  or constants) and the other carrying data; ``W_k`` is op ``k``'s weight operands,
  ``y_k`` its output, ``x_k`` its input. ``theta`` are the parameters where used
  outside weight operands.
* ``M^t = dH^t/dH^{t-1}`` with every op output held at its value (paths through
  ops cut); its non-zero pattern between hidden leaves defines the *groups*, and op
  ``k`` *feeds* group ``a`` when ``dH_a^t/dy_k`` is not zero.
* ``P^t = dH^t/d(theta, W)`` at fixed ``H^{t-1}`` with every op input held, and
  ``P_beta^t = dH^t/dy`` (a per-element bias on each op output, the output trace).
* ``w^t = dL^t/d(theta, W)`` and ``w_beta^t = dL^t/dy`` at fixed ``H^{t-1}``, every
  path within the step.
* ``c^t = dL^t/dH^{t-1}`` with, for the entries of group ``a``, the inputs of the ops
  that feed ``a`` and read the old state (not an op's output of the step) held: the
  recurrent or delayed synapse onto a group is cut.

D-RTRL: ``S^t = M^t S^{t-1} + P^t`` and ``grad = sum_t w^t + c^t S^{t-1}``.
ES-D-RTRL: the same, except for the weight operands of ops that feed a group, whose
gradient is ``sum_t vjp_W op_k(ex_k^t / Z_k^t)(q_k^t)`` with ``q^t = w_beta^t +
c^t S_beta^{t-1}``, ``ex^t = alpha ex^{t-1} + x^t`` and ``Z^t = alpha Z^{t-1} + 1``.
Multi-decay ES-D-RTRL (:func:`es_multi_decay`) works on each group's *state cut* ``z``,
found here by brute force (:func:`state_cut`): ``ef^t = dz^t/dz^{t-1} ef^{t-1} + dz^t/dy^t``
and ``g^t = dL^t/dz^t`` holding the other cut values. With ``Dbar`` the group's mean
``m x m`` block of ``dz/dz_prev`` two steps from the initial state with zero input, taken
by central finite differences of the step's values (so a spike, constant there whatever
its lowering, adds nothing, and no derivative rule is trusted), and ``W^t = sum_{n=0..t} Dbar^n``, the factorised operands get
``sum_t sum_{r<=t} vjp_W op_k(x^r)(g^t . Dbar^{t-r} (W^t)^{-1} ef^t)``: the exact trace of
a layer whose Jacobians stay ``Dbar`` and ``ef^t = W^t d``, written with matrix powers
over the whole input history, not with the executor's filters.
Windows of ``k`` steps: per block from ``t0``, the block's loss differentiated exactly
at fixed ``H^{t0}``, plus ``dL_block/dH^{t0}`` contracted with the trace at ``t0``
(``S^{t0}``, or for ES's factorised operands ``vjp_W op_k(ex^{t0}/Z^{t0})(hbar
S_beta^{t0})``).
"""
from __future__ import annotations

import dataclasses
import itertools

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from braintrace_conv.primitive import ETPPrimitive

_PLAIN_OPS = ('conv_general_dilated', 'dot_general')


def _bind(eqn, invals):
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)   # JAX < 0.10: a pair
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


@dataclasses.dataclass
class _Op:
    eqn: int
    x_slot: int
    weight_slots: tuple
    delayed: bool = False   # its input is computed from the old state, not from op outputs


class DenseStep:
    """One step of a brainstate model as a function of flat leaves, with hooks on its ops."""

    def __init__(self, model, x_example):
        self.model = model
        self.hidden_states = list(model.states(brainstate.HiddenState).values())
        self.param_map = model.states(brainstate.ParamState)
        self.param_states = list(self.param_map.values())
        every = self.hidden_states + self.param_states
        self.treedefs = [jax.tree.structure(st.value) for st in every]
        self.n_h = sum(td.num_leaves for td in self.treedefs[:len(self.hidden_states)])
        x_leaves, self.x_tree = jax.tree.flatten(x_example)

        def f(leaves, xs):
            saved = [st.value for st in every]
            try:
                with brainstate.StateTraceStack():
                    it = iter(leaves)
                    for st, td in zip(every, self.treedefs):
                        st.value = jax.tree.unflatten(td, [next(it) for _ in range(td.num_leaves)])
                    out = self.model.update(jax.tree.unflatten(self.x_tree, xs))
                    new_h = [l for st in self.hidden_states for l in jax.tree.leaves(st.value)]
            finally:
                for st, v in zip(every, saved):
                    st.restore_value(v)
            out_leaves, self.out_tree = jax.tree.flatten(out)
            return new_h + out_leaves

        leaves = [l for st in every for l in jax.tree.leaves(st.value)]
        spec = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))
        with jax.disable_jit():
            self.closed = jax.make_jaxpr(f)([spec(a) for a in leaves], [spec(a) for a in x_leaves])
        self.n_p = len(leaves) - self.n_h
        self.ops = self._find_ops()

    def _find_ops(self):
        jaxpr = self.closed.jaxpr
        data = set(jaxpr.invars[:self.n_h]) | set(jaxpr.invars[self.n_h + self.n_p:])
        state = set(jaxpr.invars[:self.n_h])      # computed from the old state...
        after_op = set()                           # ... or from an op's output
        reads = lambda v, vs: not isinstance(v, jax.extend.core.Literal) and v in vs
        ops = []
        for i, eqn in enumerate(jaxpr.eqns):
            op = None
            if isinstance(eqn.primitive, ETPPrimitive):
                slots = tuple(eqn.primitive.trainable_invars(eqn.params).values())
                op = _Op(i, eqn.primitive.x_invar_index, slots)
            elif eqn.primitive.name in _PLAIN_OPS:
                free = [s for s, v in enumerate(eqn.invars) if not reads(v, data)]
                if len(free) == 1 and len(eqn.invars) == 2:
                    op = _Op(i, 1 - free[0], (free[0],))
            if op is not None:
                x = eqn.invars[op.x_slot]
                op.delayed = reads(x, state) and not reads(x, after_op)
                ops.append(op)
                after_op |= set(eqn.outvars)
            if any(reads(v, data) for v in eqn.invars):
                data |= set(eqn.outvars)
            if op is None and any(reads(v, state) for v in eqn.invars):
                state |= set(eqn.outvars)
            if any(reads(v, after_op) for v in eqn.invars):
                after_op |= set(eqn.outvars)
        return ops

    def hidden_leaves(self):
        return [l for st in self.hidden_states for l in jax.tree.leaves(st.value)]

    def param_leaves(self):
        return [l for st in self.param_states for l in jax.tree.leaves(st.value)]

    def run(self, h, p, x, *, W=None, y_fixed=None, x_fixed=None, dy=None, override=None,
            watch=()):
        """``(new hidden leaves, outputs, record)``; ``W`` replaces op weight operands,
        ``y_fixed`` op outputs, ``x_fixed`` op inputs, ``dy`` is added to op outputs,
        ``override`` (``{jaxpr var: value}``) replaces values where they are computed;
        ``record`` holds each op's ``x``, ``y`` and weight operands, and the values of the
        variables in ``watch``."""
        jaxpr = self.closed.jaxpr
        override = override or {}
        env = dict(zip(jaxpr.constvars, self.closed.consts))
        env.update(zip(jaxpr.invars, [*h, *p, *x]))
        env.update({v: val for v, val in override.items() if v in env})
        read = lambda v: v.val if isinstance(v, jax.extend.core.Literal) else env[v]
        op_at = {op.eqn: k for k, op in enumerate(self.ops)}
        rec = dict(x={}, y={}, W={})
        for i, eqn in enumerate(jaxpr.eqns):
            invals = [read(v) for v in eqn.invars]
            k = op_at.get(i)
            if k is not None:
                op = self.ops[k]
                if W is not None:
                    for j, slot in enumerate(op.weight_slots):
                        invals[slot] = W[k][j]
                if x_fixed is not None and k in x_fixed:
                    invals[op.x_slot] = x_fixed[k]
                rec['x'][k] = invals[op.x_slot]
                rec['W'][k] = [invals[s] for s in op.weight_slots]
            outs = _bind(eqn, invals)
            if k is not None:
                if y_fixed is not None:
                    outs = [y_fixed[k]]
                if dy is not None and k in dy:
                    outs = [outs[0] + dy[k]]
                rec['y'][k] = outs[0]
            env.update({v: override.get(v, o) for v, o in zip(eqn.outvars, outs)})
        res = [read(v) for v in jaxpr.outvars]
        rec['watch'] = [read(v) for v in watch]
        return res[:self.n_h], res[self.n_h:], rec

    def apply_op(self, k, x, W):
        """Op ``k`` evaluated at input ``x`` with weight operands ``W`` (other operands as
        in the jaxpr must be literals or constants here)."""
        op = self.ops[k]
        eqn = self.closed.jaxpr.eqns[op.eqn]
        invals = [None] * len(eqn.invars)
        invals[op.x_slot] = x
        for j, slot in enumerate(op.weight_slots):
            invals[slot] = W[j]
        return _bind(eqn, invals)[0]


class Packing:
    """Floating leaves <-> one flat vector (other leaves are held as given)."""

    def __init__(self, leaves):
        self.float = [i for i, a in enumerate(leaves) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
        self.shapes = [jnp.shape(leaves[i]) for i in self.float]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.cumsum([0] + self.sizes)
        self.size = int(self.offsets[-1])

    def pack(self, leaves):
        if not self.float:
            return jnp.zeros((0,))
        return jnp.concatenate([jnp.ravel(leaves[i]) for i in self.float])

    def unpack(self, vec, like):
        out = list(like)
        for n, i in enumerate(self.float):
            out[i] = vec[self.offsets[n]:self.offsets[n + 1]].reshape(self.shapes[n])
        return out

    def leaf_of(self, i_flat):
        return self.float[int(np.searchsorted(self.offsets, i_flat, side='right')) - 1]


@dataclasses.dataclass
class Jacobians:
    """The per-step dense quantities of the module docstring along one trajectory."""
    M: list
    P: list
    P_beta: list
    w: list
    w_beta: list
    c: list
    op_x: list          # per step: {op: x_k}
    W0: dict            # op -> weight operands at the parameters
    grouped: list       # ops that feed a group
    beta: dict          # op -> slice of its output's columns in P_beta / w_beta
    groups: list        # lists of hidden leaf indices
    theta: Packing      # parameter leaves <-> the theta part of the columns
    wp: Packing         # weight operands <-> the W part of the columns
    unW: object         # flat W -> {op: weight operands}
    p: list             # parameter leaves
    traj: list          # per step: (hidden leaves, packed, inputs, target, record)
    loss_fn: object
    feeds: np.ndarray   # (ops, hidden leaves): op k's output reaches leaf j within a step


def dense_jacobians(step: DenseStep, loss_fn, xs, targets) -> Jacobians:
    """Every per-step quantity of the module docstring along the model's trajectory from
    its current hidden state."""
    p = step.param_leaves()
    h = step.hidden_leaves()
    T = jax.tree.leaves(xs)[0].shape[0]
    hp = Packing(h)
    _, _, rec0 = step.run(h, p, jax.tree.leaves(jax.tree.map(lambda a: a[0], xs)))
    W0 = rec0['W']
    ops = range(len(step.ops))
    theta = Packing(p)
    Wflat = [w for k in ops for w in W0[k]]
    wp = Packing(Wflat)

    def unW(vec):
        leaves, out, i = wp.unpack(vec, Wflat), {}, 0
        for k in ops:
            out[k] = leaves[i:i + len(W0[k])]
            i += len(W0[k])
        return out

    y_shapes = {k: rec0['y'][k].shape for k in ops}
    y_off = dict(zip(ops, np.cumsum([0] + [int(np.prod(y_shapes[k])) for k in ops])[:-1]))
    n_y = sum(int(np.prod(s)) for s in y_shapes.values())
    un_dy = lambda vec: {k: vec[y_off[k]:y_off[k] + int(np.prod(y_shapes[k]))].reshape(y_shapes[k])
                         for k in ops}
    theta0, wvec0, dy0 = theta.pack(p), wp.pack(Wflat), jnp.zeros(n_y)

    def new_H(Hv, tv, Wv, dyv, hh, x, **hold):
        new, _, _ = step.run(hp.unpack(Hv, hh), theta.unpack(tv, p), x, W=unW(Wv), dy=un_dy(dyv),
                             **hold)
        return hp.pack(new)

    def loss(Hv, tv, Wv, dyv, hh, x, target, **hold):
        _, out, _ = step.run(hp.unpack(Hv, hh), theta.unpack(tv, p), x, W=unW(Wv), dy=un_dy(dyv),
                             **hold)
        return loss_fn(jax.tree.unflatten(step.out_tree, out), target)

    # one compiled function per quantity, evaluated at every step
    jac_M = jax.jit(lambda Hv, hh, x, y: jax.jacrev(new_H)(Hv, theta0, wvec0, dy0, hh, x,
                                                           y_fixed=y))
    jac_P = jax.jit(lambda Hv, hh, x, xk: jax.jacrev(new_H, argnums=(1, 2, 3))(
        Hv, theta0, wvec0, dy0, hh, x, x_fixed=xk))
    grad_w = jax.jit(lambda Hv, hh, x, target: jax.grad(loss, argnums=(1, 2, 3))(
        Hv, theta0, wvec0, dy0, hh, x, target))
    grad_c = jax.jit(lambda Hv, hh, x, target, held: jax.grad(loss)(
        Hv, theta0, wvec0, dy0, hh, x, target, x_fixed=held))
    evaluate = jax.jit(lambda hh, x: step.run(hh, p, x))

    traj, M, P, Pb, w, wb, op_x = [], [], [], [], [], [], []
    for t in range(T):
        x = jax.tree.leaves(jax.tree.map(lambda a: a[t], xs))
        target = jax.tree.map(lambda a: a[t], targets)
        Hv = hp.pack(h)
        new, _, rec = evaluate(h, x)
        traj.append((h, Hv, x, target, rec))
        M.append(jac_M(Hv, h, x, rec['y']))
        jt, jW, jb = jac_P(Hv, h, x, rec['x'])
        P.append(jnp.concatenate([jt, jW], axis=1))
        Pb.append(jb)
        gt, gW, gb = grad_w(Hv, h, x, target)
        w.append(jnp.concatenate([gt, gW]))
        wb.append(gb)
        op_x.append(rec['x'])
        h = new

    # structure: hidden leaves connected by M, ops feeding them through P_beta
    n_leaves = len(h)
    link = np.zeros((n_leaves, n_leaves), bool)
    feeds = np.zeros((len(step.ops), n_leaves), bool)
    rows = [hp.leaf_of(i) for i in range(hp.size)]
    for Mt, Pbt in zip(M, Pb):
        nz = np.abs(np.asarray(Mt)) > 0
        for i, j in zip(*np.nonzero(nz)):
            link[rows[i], rows[j]] = True
        for k in ops:
            cols = np.abs(np.asarray(Pbt[:, y_off[k]:y_off[k] + int(np.prod(y_shapes[k]))])) > 0
            for i in np.nonzero(cols.any(axis=1))[0]:
                feeds[k, rows[i]] = True
    groups = _components(link | link.T, [i for i in range(n_leaves) if i in hp.float])
    c = []
    for (hh, Hv, x, target, rec) in traj:
        ct = np.zeros(hp.size)
        for grp in groups:
            held = {k: rec['x'][k] for k in ops if feeds[k, grp].any() and step.ops[k].delayed}
            g = np.asarray(grad_c(Hv, hh, x, target, held))
            for n, leaf in enumerate(hp.float):
                if leaf in grp:
                    ct[hp.offsets[n]:hp.offsets[n + 1]] = g[hp.offsets[n]:hp.offsets[n + 1]]
        c.append(ct)
    grouped = [k for k in ops if feeds[k].any()]
    as_np = lambda seq: [np.asarray(a) for a in seq]
    beta = {k: slice(y_off[k], y_off[k] + int(np.prod(y_shapes[k]))) for k in ops}
    return Jacobians(as_np(M), as_np(P), as_np(Pb), as_np(w), as_np(wb), c, op_x, W0, grouped,
                     beta, groups, theta, wp, unW, p, traj, loss_fn, feeds)


def _components(adj, nodes):
    seen, comps = set(), []
    for n in nodes:
        if n in seen:
            continue
        stack, comp = [n], []
        seen.add(n)
        while stack:
            a = stack.pop()
            comp.append(a)
            for b in np.nonzero(adj[a])[0]:
                if b not in seen and b in nodes:
                    seen.add(int(b))
                    stack.append(int(b))
        comps.append(sorted(comp))
    return comps


# ----------------------------------------------------------------------------- references
def _grads_tree(step: DenseStep, jac: Jacobians, g_theta, g_W):
    """Gradients on the parameter leaves: direct uses plus the weight operands pulled back,
    keyed like ``model.states(ParamState)``."""
    h0, _, x0, _, _ = jac.traj[0]
    W_of = lambda p: jac.wp.pack([w for k in range(len(step.ops))
                                  for w in step.run(h0, p, x0)[2]['W'][k]])
    _, pull = jax.vjp(W_of, jac.p)
    (from_W,) = pull(jnp.asarray(g_W))
    leaves = jac.theta.unpack(jnp.asarray(g_theta), [jnp.zeros_like(a) for a in jac.p])
    leaves = [a + b for a, b in zip(leaves, from_W)]
    out, it = {}, iter(leaves)
    for key, st in step.param_map.items():
        td = jax.tree.structure(st.value)
        out[key] = jax.tree.unflatten(td, [next(it) for _ in range(td.num_leaves)])
    return out


def _column_mask(jac: Jacobians, untraced):
    """Columns of ``P`` kept: a parameter whose label says it has no trace keeps none."""
    keep = np.ones(jac.P[0].shape[1], bool)
    for n, leaf in enumerate(jac.theta.float):
        if leaf in untraced:
            keep[jac.theta.offsets[n]:jac.theta.offsets[n + 1]] = False
    return keep


def _traces(jac: Jacobians, untraced):
    """``S^{t-1}`` and ``S_beta^{t-1}`` before each step (D-RTRL recursion)."""
    keep = _column_mask(jac, untraced)
    S = np.zeros_like(jac.P[0])
    Sb = np.zeros_like(jac.P_beta[0])
    before = []
    for M, P, Pb in zip(jac.M, jac.P, jac.P_beta):
        before.append((S, Sb))
        S, Sb = M @ S + P * keep, M @ Sb + Pb
    before.append((S, Sb))
    return before


def _input_traces(jac: Jacobians, decays):
    """ES-D-RTRL's ``(ex^t, Z^t)`` per grouped op after each step."""
    out, ex, Z = [], {k: 0.0 for k in jac.grouped}, {k: 0.0 for k in jac.grouped}
    for x in jac.op_x:
        ex = {k: decays[k] * ex[k] + np.asarray(x[k]) for k in jac.grouped}
        Z = {k: decays[k] * Z[k] + 1.0 for k in jac.grouped}
        out.append((ex, Z))
    return out


def _factorised(step: DenseStep, jac: Jacobians, k, x_hat, q):
    """``vjp_W op_k(x_hat)(q)`` as a ``(theta, W)`` column vector (zeros elsewhere)."""
    y, pull = jax.vjp(lambda *W: step.apply_op(k, jnp.asarray(x_hat), list(W)), *jac.W0[k])
    dW = pull(jnp.asarray(q).reshape(y.shape))
    flat = {j: [jnp.zeros_like(w) for w in jac.W0[j]] for j in range(len(step.ops))}
    flat[k] = list(dW)
    return np.concatenate([np.zeros(jac.theta.size),
                           np.asarray(jac.wp.pack([w for j in range(len(step.ops)) for w in flat[j]]))])


def _factorised_columns(jac: Jacobians, step):
    """The columns of ``(theta, W)`` that ES-D-RTRL factorises: grouped ops' operands."""
    cols = np.zeros(jac.P[0].shape[1], bool)
    n_theta = jac.theta.size
    i = 0
    for k in range(len(step.ops)):
        for w in jac.W0[k]:
            size = int(np.prod(jnp.shape(w)))
            if k in jac.grouped:
                cols[n_theta + i:n_theta + i + size] = True
            i += size
    return cols


def drtrl(step: DenseStep, jac: Jacobians, *, untraced=frozenset(), window=None):
    """D-RTRL's gradient (module docstring); ``untraced``: parameter leaves with no trace."""
    return _reference(step, jac, untraced, window, decays=None)


def es_drtrl(step: DenseStep, jac: Jacobians, decays, *, untraced=frozenset(), window=None):
    """ES-D-RTRL's gradient with input-trace decay ``decays[k]`` per grouped op."""
    return _reference(step, jac, untraced, window, decays=decays)


def _reference(step, jac, untraced, window, decays):
    T = len(jac.M)
    before = _traces(jac, untraced)
    ex = _input_traces(jac, decays) if decays is not None else None
    fact = _factorised_columns(jac, step) if decays is not None else np.zeros(jac.P[0].shape[1], bool)
    total = np.zeros(jac.P[0].shape[1])

    def contract(cot, t):
        """``cot . S^{t-1}`` (the trace before step ``t``), factorised where ES says so."""
        S, Sb = before[t]
        out = np.where(fact, 0.0, cot @ S)
        if decays is not None and t > 0:
            exs, Z = ex[t - 1]
            for k in jac.grouped:
                out = out + _factorised(step, jac, k, exs[k] / Z[k], cot @ Sb[:, jac.beta[k]])
        return out

    if window is None:
        for t in range(T):
            S, Sb = before[t]
            total += np.where(fact, 0.0, jac.w[t] + jac.c[t] @ S)
            if decays is not None:   # the trace at t: ef^t = Sb^{t-1} advanced by the step
                exs, Z = ex[t]
                for k in jac.grouped:
                    q = jac.w_beta[t][jac.beta[k]] + jac.c[t] @ Sb[:, jac.beta[k]]
                    total += _factorised(step, jac, k, exs[k] / Z[k], q)
    else:
        for t0 in range(0, T, window):
            g_block, hbar = _block_gradient(step, jac, t0, min(t0 + window, T))
            total += g_block + contract(hbar, t0)
    n_theta = jac.theta.size
    return _grads_tree(step, jac, total[:n_theta], total[n_theta:])


def _block_gradient(step, jac, t0, t1):
    """The exact gradient of the loss of steps ``[t0, t1)`` with respect to ``(theta, W)``
    at fixed ``H^{t0}``, and with respect to ``H^{t0}``."""
    h0, Hv, _, _, _ = jac.traj[t0]
    hp = Packing(h0)
    xs = [jac.traj[t][2] for t in range(t0, t1)]
    targets = [jac.traj[t][3] for t in range(t0, t1)]

    def block_loss(Hv, tv, Wv, xs, targets):
        h, total = hp.unpack(Hv, h0), 0.0
        for x, target in zip(xs, targets):
            h, out, _ = step.run(h, jac.theta.unpack(tv, jac.p), x, W=jac.unW(Wv))
            total = total + jac.loss_fn(jax.tree.unflatten(step.out_tree, out), target)
        return total

    Wv = jac.wp.pack([w for k in range(len(step.ops)) for w in jac.W0[k]])
    gH, gt, gW = jax.jit(jax.grad(block_loss, argnums=(0, 1, 2)))(
        Hv, jac.theta.pack(jac.p), Wv, xs, targets)
    return np.concatenate([np.asarray(gt), np.asarray(gW)]), np.asarray(gH)


# ----------------------------------------------------------------------------- multi-decay ES
def _forward_edges(step: DenseStep) -> dict:
    """``{var: vars computed from it by one equation}``, ops excluded (their outputs are
    sources of their own: paths through an op are cut)."""
    jaxpr = step.closed.jaxpr
    op_eqns = {op.eqn for op in step.ops}
    edges = {}
    for i, eqn in enumerate(jaxpr.eqns):
        if i in op_eqns:
            continue
        for v in eqn.invars:
            if not isinstance(v, jax.extend.core.Literal):
                edges.setdefault(v, []).extend(eqn.outvars)
    return edges


def _reach(edges, sources, blocked) -> set:
    seen = {v for v in sources if v not in blocked}
    stack = list(seen)
    while stack:
        for b in edges.get(stack.pop(), ()):
            if b not in blocked and b not in seen:
                seen.add(b)
                stack.append(b)
    return seen


def state_cut(step: DenseStep, jac: Jacobians, group: list) -> list:
    """The step's values at which the state of ``group`` (hidden leaf indices) is cut, by
    brute force over sets of values with one entry per neuron: a smallest set through
    which every path from the group's old states and its ops' outputs to anything else
    passes (new states, step outputs, op inputs), the one nearest the new states (the
    most values on the old states' side). An op input computed from the group's old
    states alone and read only by ops feeding the group is a recurrent synapse's, given."""
    jaxpr = step.closed.jaxpr
    size = int(np.prod(jaxpr.invars[group[0]].aval.shape))
    old = [jaxpr.invars[leaf] for leaf in group]
    feeding = [k for k in range(len(step.ops)) if jac.feeds[k, group].any()]
    ys = [jaxpr.eqns[step.ops[k].eqn].outvars[0] for k in feeding]
    edges = _forward_edges(step)
    region, from_y = _reach(edges, old + ys, set()), _reach(edges, ys, set())
    x_var = lambda op: jaxpr.eqns[op.eqn].invars[op.x_slot]
    sinks = {v for v in jaxpr.outvars if not isinstance(v, jax.extend.core.Literal)} & region
    for op in step.ops:
        readers = [k for k, other in enumerate(step.ops) if x_var(other) is x_var(op)]
        if x_var(op) in region and (x_var(op) in from_y or set(readers) - set(feeding)):
            sinks.add(x_var(op))
    order = {v: n for n, v in enumerate(jaxpr.invars)}
    order.update({v: len(order) + n for n, e in enumerate(jaxpr.eqns) for v in e.outvars})
    candidates = sorted((v for v in region if int(np.prod(v.aval.shape)) == size),
                        key=order.get)
    for count in range(1, len(group) + 3):
        best = None
        for combo in itertools.combinations(candidates, count):
            side = _reach(edges, old + ys, set(combo))
            if not side & sinks and (best is None or len(side) > best[0]):
                best = (len(side), list(combo))
        if best is not None:
            return best[1]
    raise ValueError(f'no state cut found for hidden leaves {group}')


@dataclasses.dataclass
class CutJacobians:
    """Per step, on the cut values of every group flattened into ``Z``: ``A = dZ^t/dH^{t-1}``
    and ``Df = dZ^t/dy^t`` (op outputs held), ``R = dH^t/dZ^t`` (the cut values replaced
    where computed), ``g = dL^t/dZ^t`` (every path of the step, with the group's own cut
    values replaced where computed, so that each holds the others fixed); ``index[a]``
    (``(m, neurons)``) the positions of group ``a``'s cut values in ``Z``; ``D_rest`` the
    ``dZ/dZ_prev`` of the second step from the initial state with zero input and custom
    derivatives held."""
    A: list
    Df: list
    R: list
    g: list
    index: list
    D_rest: np.ndarray


def cut_jacobians(step: DenseStep, jac: Jacobians) -> CutJacobians:
    cuts = [state_cut(step, jac, grp) for grp in jac.groups]
    flat = [v for cut in cuts for v in cut]
    sizes = [int(np.prod(v.aval.shape)) for v in flat]
    offsets = np.cumsum([0] + sizes)
    index, n = [], 0
    for cut in cuts:
        index.append(np.stack([offsets[n + j] + np.arange(sizes[n + j]) for j in range(len(cut))]))
        n += len(cut)
    pack = lambda values: jnp.concatenate([jnp.ravel(a) for a in values])
    unpack = lambda vec: {v: vec[offsets[j]:offsets[j + 1]].reshape(v.aval.shape)
                          for j, v in enumerate(flat)}
    h0, _, x0, _, rec0 = jac.traj[0]
    hp = Packing(h0)
    ops = range(len(step.ops))
    y_shapes = {k: rec0['y'][k].shape for k in ops}
    un_dy = lambda vec: {k: vec[jac.beta[k]].reshape(y_shapes[k]) for k in ops}
    n_y = max(jac.beta[k].stop for k in ops)

    def z_of(Hv, dyv, hh, x, y):
        return pack(step.run(hp.unpack(Hv, hh), jac.p, x, y_fixed=y, dy=un_dy(dyv),
                             watch=flat)[2]['watch'])

    def h_of(Zv, hh, x, y):
        return hp.pack(step.run(hh, jac.p, x, y_fixed=y, override=unpack(Zv))[0])

    def loss_of(Zv, hh, x, target, group):
        held = {v: val for v, val in unpack(Zv).items() if v in cuts[group]}
        _, out, _ = step.run(hh, jac.p, x, override=held)
        return jac.loss_fn(jax.tree.unflatten(step.out_tree, out), target)

    jac_A = jax.jit(jax.jacrev(z_of, 0))
    jac_Df = jax.jit(jax.jacrev(z_of, 1))
    jac_R = jax.jit(jax.jacrev(h_of))
    grad_g = jax.jit(jax.grad(loss_of), static_argnums=4)
    values = jax.jit(lambda hh, x: step.run(hh, jac.p, x, watch=flat)[2]['watch'])
    dy0 = jnp.zeros(n_y)
    A, Df, R, g = [], [], [], []
    for hh, Hv, x, target, rec in jac.traj:
        Z = pack(values(hh, x))
        A.append(np.asarray(jac_A(Hv, dy0, hh, x, rec['y'])))
        Df.append(np.asarray(jac_Df(Hv, dy0, hh, x, rec['y'])))
        R.append(np.asarray(jac_R(Z, hh, x, rec['y'])))
        # each group's learning signal holds its own other cut values, not other groups'
        g.append(sum(np.asarray(grad_g(Z, hh, x, target, a)) for a in range(len(cuts))))
    zero_x = [jnp.zeros_like(a) for a in x0]
    first, _, at0 = step.run(h0, jac.p, zero_x, watch=flat)
    _, _, at1 = step.run(first, jac.p, zero_x)
    R0 = _finite_differences(lambda Zv: h_of(Zv, h0, zero_x, at0['y']), pack(at0['watch']))
    A1 = _finite_differences(lambda Hv: z_of(Hv, dy0, first, zero_x, at1['y']), hp.pack(first))
    return CutJacobians(A, Df, R, g, index, A1 @ R0)


def _finite_differences(f, v, step=1e-4):
    """``df/dv`` (``(len(f(v)), len(v))``) by central differences of ``f``'s values,
    extrapolated from steps ``step`` and ``step / 2`` (Richardson: error of order
    ``step^4``, about 1e-13 here, where one difference alone leaves 1e-9)."""
    moves = step * jnp.eye(v.size, dtype=v.dtype)
    moved = jax.jit(jax.vmap(lambda e: f(v + e)))
    central = lambda m, h: (moved(m) - moved(-m)) / (2 * h)
    return np.asarray((4 * central(moves / 2, step / 2) - central(moves, step)) / 3).T


def es_multi_decay(step: DenseStep, jac: Jacobians, *, untraced=frozenset(), window=None):
    """Multi-decay ES-D-RTRL's gradient (module docstring), decays inferred from the model;
    ``untraced``: parameter leaves with no trace."""
    cj = cut_jacobians(step, jac)
    T = len(jac.M)
    before = _traces(jac, untraced)
    fact = _factorised_columns(jac, step)
    ef, EF = np.zeros_like(cj.Df[0]), []
    for t in range(T):
        D = cj.A[t] @ cj.R[t - 1] if t > 0 else np.zeros((len(cj.A[t]),) * 2)
        ef = D @ ef + cj.Df[t]
        EF.append(ef)
    group_of = {k: a for k in jac.grouped for a, grp in enumerate(jac.groups)
                if jac.feeds[k, grp].any()}
    mean = [np.array([[np.mean(cj.D_rest[idx[i], idx[j]]) for j in range(len(idx))]
                      for i in range(len(idx))]) for idx in cj.index]

    def factorised(cot, t):
        """``sum_k sum_{r<=t} vjp_W op_k(x^r)(cot . Dbar^{t-r} (W^t)^{-1} ef^t)`` with ``cot``
        a cotangent on ``Z``."""
        out = 0.0
        for k in jac.grouped:
            idx, Dbar = cj.index[group_of[k]], mean[group_of[k]]
            neurons = np.arange(idx.shape[1])
            assert EF[t][:, jac.beta[k]].shape[1] == idx.shape[1], 'op output is not one per neuron'
            ef_k = EF[t][:, jac.beta[k]][idx, neurons[None, :]]         # (m, neurons)
            powers = [np.linalg.matrix_power(Dbar, n) for n in range(t + 1)]
            W_inv = np.linalg.inv(sum(powers))
            for r in range(t + 1):
                q = np.einsum('an,ab,bn->n', cot[idx], powers[t - r] @ W_inv, ef_k)
                out = out + _factorised(step, jac, k, jac.op_x[r][k], q)
        return out

    total = np.zeros(jac.P[0].shape[1])
    if window is None:
        for t in range(T):
            S, _ = before[t]
            total += np.where(fact, 0.0, jac.w[t] + jac.c[t] @ S) + factorised(cj.g[t], t)
    else:
        for t0 in range(0, T, window):
            g_block, hbar = _block_gradient(step, jac, t0, min(t0 + window, T))
            total += g_block + np.where(fact, 0.0, hbar @ before[t0][0])
            if t0 > 0:
                total += factorised(cj.R[t0 - 1].T @ hbar, t0 - 1)
    n_theta = jac.theta.size
    return _grads_tree(step, jac, total[:n_theta], total[n_theta:])


# ----------------------------------------------------------------------------- one hop
def _reader_boundary(step: DenseStep, jac: Jacobians, cj: CutJacobians, l, m_op, flat, unpack):
    """For group ``l`` read by op ``m_op``: ``(Q, J)`` per step with ``dy_m/dZ = J Q``, ``Q =
    dv/dZ`` and ``J = dy_m/dv`` the same at every step, for the first value ``v`` of the
    step (one per neuron of ``l``) that factorises the read so; by brute force over the
    step's values."""
    jaxpr = step.closed.jaxpr
    neurons = cj.index[l].shape[1]
    pack = lambda values: jnp.concatenate([jnp.ravel(a) for a in values])
    full = jax.jit(jax.jacrev(
        lambda Zv, hh, x: step.run(hh, jac.p, x, override=unpack(Zv))[2]['y'][m_op]))
    cut_values = jax.jit(lambda hh, x: pack(step.run(hh, jac.p, x, watch=flat)[2]['watch']))
    per_step = []
    for hh, _, x, _, _ in jac.traj:
        Z = cut_values(hh, x)
        per_step.append((hh, x, Z, np.asarray(full(Z, hh, x)).reshape(-1, len(Z))))
    # the values between the group's cut and the op's input, nearest the op first
    edges = _forward_edges(step)
    cut = [flat[j] for j in sorted(_cut_entries(cj, l, flat))]
    after_cut = _reach(edges, cut, set())
    x_m = jaxpr.eqns[step.ops[m_op].eqn].invars[step.ops[m_op].x_slot]
    between = [v for e in jaxpr.eqns for v in e.outvars
               if v in after_cut and int(np.prod(v.aval.shape)) == neurons
               and x_m in _reach(edges, [v], set())]
    for v in reversed(between):
        dv = jax.jit(jax.jacrev(lambda Zv, hh, x: step.run(hh, jac.p, x, override=unpack(Zv),
                                                           watch=[v])[2]['watch'][0]))
        dy = jax.jit(jax.jacrev(
            lambda val, hh, x: step.run(hh, jac.p, x, override={v: val})[2]['y'][m_op]))
        value = jax.jit(lambda hh, x: step.run(hh, jac.p, x, watch=[v])[2]['watch'][0])
        Qs, Js = [], []
        for hh, x, Z, F in per_step:
            val = value(hh, x)
            Qs.append(np.asarray(dv(Z, hh, x)).reshape(neurons, -1))
            Js.append(np.asarray(dy(val, hh, x)).reshape(F.shape[0], neurons))
            if not np.allclose(Js[-1] @ Qs[-1], F, rtol=0, atol=1e-12) \
                    or not np.allclose(Js[-1], Js[0], rtol=0, atol=1e-12):
                break
        else:
            return Qs, Js[0]
    raise ValueError(f'no value factorises the read of group {l} by op {m_op}')


def _cut_entries(cj: CutJacobians, l, flat) -> set:
    """Indices into ``flat`` (the cut variables of every group) of group ``l``'s."""
    first = 0
    for a in range(l):
        first += len(cj.index[a])
    return set(range(first, first + len(cj.index[l])))


def es_cross_layer(step: DenseStep, jac: Jacobians, decay=None, *, untraced=frozenset()):
    """ES-D-RTRL's gradient with one hop across layers (``cross_layer=1``, no window):
    ES's (one decay per group: ``decay`` if given, else each group's inferred one, see
    :func:`es_multi_decay`) plus, per op ``k`` of group ``l`` read by op ``m`` of group
    ``g``, at every step ``t`` the one-hop term written as sums over the history::

        sigma = sum_{r<t} D^{t-1} ... D^{r+1} Df_m^r Z^r        on g's cut values
        u[n]  = sum_{r<t} a^{t-1-r} sum_c (Q^{rT} J^T c)[c, n] ef_k^r[c, n]
        hop   = vjp_W op_k(xx / Zlm)(u / Zlm),  c[n] = sum_a (D^{tT} g^t)[a, n] sigma[a, n]

    with ``Q``, ``J`` from :func:`_reader_boundary`, ``Z^r = sum_{q<=r} alpha^(r-q)``,
    ``Zlm = sum_{r<t} a^(t-1-r) Z^r`` and ``xx = sum_{r<t} a^(t-1-r) sum_{q<=r}
    alpha^(r-q) x^q`` (``alpha``: ``l``'s decay, ``a``: ``g``'s)."""
    cj = cut_jacobians(step, jac)
    T = len(jac.M)
    cuts = [state_cut(step, jac, grp) for grp in jac.groups]
    flat = [v for cut in cuts for v in cut]
    sizes = [int(np.prod(v.aval.shape)) for v in flat]
    offsets = np.cumsum([0] + sizes)
    unpack = lambda vec: {v: vec[offsets[j]:offsets[j + 1]].reshape(v.aval.shape)
                          for j, v in enumerate(flat)}
    group_of = {k: a for k in jac.grouped for a, grp in enumerate(jac.groups)
                if jac.feeds[k, grp].any()}
    if decay is None:
        decays = []
        for idx in cj.index:
            Dbar = np.array([[np.mean(cj.D_rest[idx[i], idx[j]]) for j in range(len(idx))]
                             for i in range(len(idx))])
            lam = np.linalg.eigvals(Dbar)
            assert np.allclose(lam, lam[0]), 'one decay per group here'
            decays.append(float(lam[0].real))
    else:
        decays = [decay] * len(cj.index)
    base = (es_drtrl(step, jac, {k: decays[group_of[k]] for k in jac.grouped}, untraced=untraced)
            if decay is not None else es_multi_decay(step, jac, untraced=untraced))
    D = [cj.A[t] @ cj.R[t - 1] if t > 0 else np.zeros((len(cj.A[t]),) * 2) for t in range(T)]
    ef, EF = np.zeros_like(cj.Df[0]), []
    for t in range(T):
        ef = D[t] @ ef + cj.Df[t]
        EF.append(ef)
    total = np.zeros(jac.P[0].shape[1])
    for m_op in jac.grouped:
        g = group_of[m_op]
        for l in range(len(jac.groups)):
            if l == g or not _reads_group(step, cj, l, m_op, flat):
                continue
            Qs, J = _reader_boundary(step, jac, cj, l, m_op, flat, unpack)
            idx_g, idx_l = cj.index[g], cj.index[l]
            a, alpha = decays[g], decays[l]
            n_g = np.arange(idx_g.shape[1])
            Z = [sum(alpha ** (r - q) for q in range(r + 1)) for r in range(T)]
            for k in [k for k in jac.grouped if group_of[k] == l]:
                n_l = np.arange(idx_l.shape[1])
                for t in range(1, T):
                    sigma = np.zeros(len(cj.Df[0]))
                    for r in range(t):
                        df = np.zeros(len(cj.Df[0]))
                        df[idx_g] = cj.Df[r][:, jac.beta[m_op]][idx_g, n_g[None, :]] * Z[r]
                        for q in range(r + 1, t):
                            df = D[q] @ df
                        sigma += df
                    c = (D[t].T @ cj.g[t])[idx_g] * sigma[idx_g]           # (m_g, neurons)
                    c = c.sum(axis=0)
                    pulled = J.T @ c                                        # v-space
                    u = np.zeros(idx_l.shape[1])
                    for r in range(t):
                        back = Qs[r].T @ pulled                             # on Z
                        ef_k = EF[r][:, jac.beta[k]][idx_l, n_l[None, :]]   # (m_l, neurons)
                        u += a ** (t - 1 - r) * np.sum(back[idx_l] * ef_k, axis=0)
                    Zlm = sum(a ** (t - 1 - r) * Z[r] for r in range(t))
                    xx = sum(a ** (t - 1 - r) * sum(alpha ** (r - q) * np.asarray(jac.op_x[q][k])
                                                    for q in range(r + 1)) for r in range(t))
                    total += _factorised(step, jac, k, xx / Zlm, u / Zlm)
    n_theta = jac.theta.size
    extra = _grads_tree(step, jac, total[:n_theta], total[n_theta:])
    return jax.tree.map(lambda x, y: x + y, base, extra)


def _reads_group(step, cj, l, m_op, flat) -> bool:
    """Whether op ``m_op``'s input is computed from group ``l``'s cut values within a step,
    other ops' outputs not followed."""
    jaxpr = step.closed.jaxpr
    cut = [flat[j] for j in sorted(_cut_entries(cj, l, flat))]
    x_m = jaxpr.eqns[step.ops[m_op].eqn].invars[step.ops[m_op].x_slot]
    return x_m in _reach(_forward_edges(step), cut, set())
