r"""The timescales of a neuron group: its mean state Jacobian, decomposed into input filters.

Multi-decay ES-D-RTRL (``docs/theory.md``) pairs each op's output trace with one input
trace per timescale of the neurons the op drives. The timescales are those of ``Dbar``,
the group's ``m x m`` state Jacobian averaged over its elements at the point where the
decays are inferred (:func:`mean_state_jacobians`). Over its distinct eigenvalues
(merged within :data:`MERGE_TOLERANCE`), with spectral projectors ``P_j`` onto the
generalised eigenspaces and nilpotent parts ``N_j = (Dbar - lambda_j) P_j``
(:func:`modes`),

    Dbar^n = sum_j sum_{i < s_j} C(n, i) lambda_j^(n-i) N_j^i P_j.

:func:`filters` writes this with real arrays: a set of input traces ``u_c`` that filter
the op input ``x`` linearly (:class:`Filter`; a real decay is one trace, a complex pair
two, the real and imaginary parts of one complex trace, a Jordan chain of length ``s``
a cascade of ``s``), and one real ``m x m`` matrix ``C_c`` per trace, such that the
impulse responses ``h_c(n)`` of the traces give ``Dbar^n = sum_c C_c h_c(n)``. Then on a
layer with ``D^t = Dbar`` and ``Df^t = d`` the exact trace ``sum_r Dbar^(t-r) d x^r``
is ``sum_c C_c d u_c^t``, and ``d = W^{-1} ef^t`` with ``W^t = sum_c C_c z_c^t`` (the
traces' response to an input of ones) and ``ef`` the output trace.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from . import held
from .graph import StepGraph
from .jaxpr import is_literal, reached_from
from .signals import init_release, step_signals

#: Eigenvalues of a mean state Jacobian closer than this are one decay: the eigenvalues of
#: a defective matrix are found only to about the square root of the rounding error (1e-8
#: in float64), and two input traces with decays this close differ by less than 1e-6 of
#: their value per step.
MERGE_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True, eq=False)
class Mode:
    """One distinct eigenvalue of ``Dbar`` (a complex one stands for its conjugate pair).

    Attributes:
      decay: the eigenvalue ``lambda`` (a complex number; imaginary part 0 if real,
        positive for a pair).
      order: the length of its longest Jordan chain (1: ``Dbar`` is diagonalisable there).
      projector: ``P``, the spectral projector onto its generalised eigenspace (complex
        for a pair).
      nilpotent: ``N = (Dbar - lambda) P``.
    """
    decay: complex
    order: int
    projector: np.ndarray
    nilpotent: np.ndarray

    @property
    def is_pair(self) -> bool:
        return self.decay.imag != 0

    def describe(self) -> str:
        """The decay as a report prints it: ``0.9512``, ``0.9±0.1i``, with a chain's order."""
        text = (f'{self.decay.real:.4g}±{self.decay.imag:.4g}i' if self.is_pair
                else f'{self.decay.real:.4g}')
        return text if self.order == 1 else f'{text} (a Jordan chain of {self.order}: ' \
                                            f'{self.order} cascaded traces)'


@dataclasses.dataclass(frozen=True)
class Filter:
    """One real input trace of multi-decay ES: ``u^t = decay * u^{t-1} + (input)``, complex
    ``decay`` for the two parts of a pair, where the input is ``x^t`` for order 0 and the
    same mode's trace of order ``order - 1`` at step ``t-1`` otherwise.

    ``key`` identifies the trace: two ops that read the same value share the traces with
    equal keys. ``part`` is ``'re'`` or ``'im'`` for a pair, ``''`` for a real decay.
    """
    decay: complex
    order: int
    part: str

    @property
    def key(self) -> tuple:
        return (self.decay.real, self.decay.imag, self.order, self.part)

    def reads(self) -> list:
        """The keys of the traces whose previous values enter this one's update, with
        their coefficients: ``[(coefficient, key)]`` (the input ``x`` not included)."""
        a, b = self.decay.real, self.decay.imag
        same = lambda part: (self.decay.real, self.decay.imag, self.order, part)
        lower = lambda part: (self.decay.real, self.decay.imag, self.order - 1, part)
        if self.part == '':
            own = [(a, same(''))]
        elif self.part == 're':     # Re(lambda u) = a Re u - b Im u
            own = [(a, same('re')), (-b, same('im'))]
        else:                       # Im(lambda u) = b Re u + a Im u
            own = [(b, same('re')), (a, same('im'))]
        return own + ([(1.0, lower(self.part))] if self.order > 0 else [])

    @property
    def takes_input(self) -> bool:
        """Whether ``x^t`` is added (order 0, the real part of a pair)."""
        return self.order == 0 and self.part in ('', 're')


class RestJacobians:
    """``Dbar`` per group of one analysed step, for the parameters of each call.

    ``Dbar`` is the group's state Jacobian ``D`` averaged over its elements (an ``m x m``
    float64 array), two steps from the model's initial state with zero input, every
    function differentiated as its value changes (:mod:`.held`: spikes are constant), so
    that it describes the leak and the couplings of the dynamics at rest. The primitives
    from outside JAX are probed once, at construction.

    Attributes:
      depends_on_params: whether ``Dbar`` changes with the parameters (a trainable time
        constant, say): then the decays must be inferred again when they change.

    Raises:
      ValueError: when the parameters or the initial state are abstract (inside
        ``jax.jit``), or the step holds a primitive whose derivative at rest the probe
        cannot tell (:func:`.held.probe`).
    """

    def __init__(self, graph: StepGraph):
        step = graph.step
        params, hidden = step.param_leaves(), step.hidden_leaves()
        if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves((params, hidden))):
            raise ValueError('ES_D_RTRL(model) infers its decays from the model\'s parameters '
                             'and initial state, which are abstract inside jax.jit: call the '
                             'learner outside jax.jit (it compiles its own calls), make its '
                             'first call outside, or pass ES_D_RTRL(model, decay=...).')
        inputs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in step.input_vars]
        no_loss = lambda out, target: jnp.zeros(())

        def run_steps(recorder):
            h = hidden
            for _ in range(2):
                h = graph.run(h, params, inputs, rest=recorder)[0]

        held_eqns, unclear = held.probe(run_steps)
        if unclear:
            raise ValueError(f'ES_D_RTRL(model) infers its decays with every spike held '
                             f'constant, but cannot tell what {", ".join(unclear)} computes '
                             f'at the neurons\' rest: its value changes there, yet not as '
                             f'its derivative says; pass ES_D_RTRL(model, decay=...) with the '
                             f'decay per step of the neurons it is part of.')
        rest = held.Rest(held_eqns)

        def two_steps(params, hidden):
            weights = graph.weights(params)
            release = init_release(graph, jnp.result_type(float))
            s0 = step_signals(graph, hidden, params, weights, inputs, None, no_loss, release,
                              rest=rest)
            s1 = step_signals(graph, s0.new_hidden, params, weights, inputs, None, no_loss,
                              s0.release, rest=rest)
            return s1.D

        jaxpr = jax.make_jaxpr(two_steps)(params, hidden).jaxpr
        from_params = reached_from(jaxpr, set(jaxpr.invars[:len(params)]))
        self.depends_on_params = any(not is_literal(v) and v in from_params
                                     for v in jaxpr.outvars)
        self._hidden = hidden
        self._two_steps = jax.jit(two_steps)

    def __call__(self, params) -> list:
        """``Dbar`` per group for the parameter leaves ``params`` (concrete)."""
        D = self._two_steps(params, self._hidden)
        # entry by entry, so that a one-state group's decay is the mean of its D as it was
        return [np.array([[float(np.mean(np.asarray(d)[..., r, c])) for c in range(d.shape[-1])]
                          for r in range(d.shape[-1])]) for d in D]


def mean_state_jacobians(graph: StepGraph) -> list:
    """``Dbar`` per group at the model's current parameters (:class:`RestJacobians`)."""
    return RestJacobians(graph)(graph.step.param_leaves())


def single_decay(decay: float, m: int) -> list:
    """The one :class:`Mode` of a group whose every state variable shares ``decay`` (a
    decay given for every op): ``Dbar = decay * I``."""
    return [Mode(complex(decay), 1, np.eye(m), np.zeros((m, m)))]


def modes(mean_jacobian: np.ndarray, tolerance: float = MERGE_TOLERANCE) -> list:
    """The :class:`Mode` of each distinct eigenvalue of ``mean_jacobian`` (``m x m``),
    eigenvalues within ``tolerance`` merged; a diagonal matrix gives coordinate
    selectors, its diagonal entries the decays exactly."""
    D = np.asarray(mean_jacobian, np.float64)
    m = D.shape[0]
    if not np.any(D - np.diag(np.diag(D))):
        return _diagonal_modes(D, tolerance)
    clusters = _clusters(np.linalg.eigvals(D), tolerance)
    bases = []
    for lam, count in clusters:     # the generalised eigenspace: null space of (D - lam)^count
        power = np.linalg.matrix_power(D - lam * np.eye(m), count)
        bases.append(np.linalg.svd(power)[2].conj().T[:, m - count:])
    basis = np.concatenate(bases, axis=1)
    inverse = np.linalg.inv(basis)
    found, start = [], 0
    scale = max(1.0, float(np.abs(D).max()))
    for (lam, count), b in zip(clusters, bases):
        P = b @ inverse[start:start + count]
        start += count
        N = (D - lam * np.eye(m)) @ P
        order, power = 1, N
        while order < count and np.abs(power).max() > tolerance * scale:
            order, power = order + 1, power @ N
        if lam.imag < 0:
            continue            # the conjugate of a pair kept with positive imaginary part
        if lam.imag == 0:
            P, N = P.real, N.real
        found.append(Mode(complex(lam), order, P, N))
    return found


def _diagonal_modes(D, tolerance):
    diag = np.diag(D)
    found, used = [], np.zeros(len(diag), bool)
    for i, lam in enumerate(diag):
        if used[i]:
            continue
        members = (np.abs(diag - lam) <= tolerance) & ~used
        used |= members
        decay = float(np.mean(diag[members])) if members.sum() > 1 else float(lam)
        P = np.diag(members.astype(np.float64))
        found.append(Mode(complex(decay), 1, P, (D - decay * np.eye(len(diag))) @ P))
    return found


def _clusters(eigenvalues, tolerance):
    """``[(eigenvalue, multiplicity)]``: eigenvalues within ``tolerance`` of one another
    (single linkage) merged into their mean; real where the imaginary part is within
    ``tolerance`` of 0, in conjugate pairs otherwise."""
    values = [complex(v.real, 0.0) if abs(v.imag) <= tolerance else complex(v)
              for v in eigenvalues]
    groups = []
    for v in values:
        near = [g for g in groups if any(abs(v - w) <= tolerance for w in g)]
        merged = [v] + [w for g in near for w in g]
        groups = [g for g in groups if g not in near] + [merged]
    out = []
    for g in groups:
        mean = complex(np.mean(g))
        out.append((complex(mean.real, 0.0) if all(w.imag == 0 for w in g) else mean, len(g)))
    # conjugate clusters get conjugate means (the kept one fixes its partner)
    return sorted(out, key=lambda c: (-abs(c[0]), -c[0].imag))


def filters(found: list) -> list:
    """``[(Filter, C)]``: the real input traces of the modes ``found`` and the ``m x m``
    matrix of each, ``Dbar^n = sum C h(n)`` with ``h`` the trace's impulse response
    (module docstring): for a real decay ``C_i = N^i P``, for a pair ``2 Re(N^i P)`` with
    the real part and ``-2 Im(N^i P)`` with the imaginary part."""
    out = []
    for mode in found:
        power = mode.projector
        for i in range(mode.order):
            if mode.is_pair:
                out.append((Filter(mode.decay, i, 're'), 2 * power.real))
                out.append((Filter(mode.decay, i, 'im'), -2 * power.imag))
            else:
                out.append((Filter(mode.decay, i, ''), np.real(power)))
            power = mode.nilpotent @ power
    return out


def largest_modulus(found: list) -> float:
    """The largest ``|lambda|`` among the modes (above 1: the dynamics grow at rest)."""
    return max(abs(mode.decay) for mode in found)


def is_single(found: list, m: int) -> bool:
    """Whether the modes are one real decay with the whole state as its eigenspace: then
    multi-decay ES is the one-decay ES of ``docs/theory.md``, computed the same way."""
    return (len(found) == 1 and not found[0].is_pair and found[0].order == 1
            and np.array_equal(found[0].projector, np.eye(m)))

