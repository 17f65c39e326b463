"""Models that pass values along in states, written the way users write them.

Delay lines (a state that takes another state's old value unchanged), pipelined
layers (a layer reading another's spikes of the step before, kept in a state) and
feedback between layers through such states, in several neuron styles, depths and
orders of assignment. Inputs are ``(B, 6, 6, 2)`` spikes (channels last), outputs
``(B, 3)`` class scores.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import braintrace_conv as bc
from snn_reference import spike

DN = ('NHWC', 'HWIO', 'NHWC')
SHAPE = (6, 6, 4)


class _Base(brainstate.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        self.rng = np.random.default_rng(seed)
        self.K = brainstate.ParamState(self.normal(3, 3, 2, 4, scale=0.8))
        self.b = brainstate.ParamState(jnp.full(4, 0.1))
        self.W = brainstate.ParamState(self.normal(int(np.prod(SHAPE)), 3, scale=0.3))

    def normal(self, *shape, scale):
        return jnp.asarray(self.rng.normal(size=shape) * scale)

    def zero_states(self, *names):
        for name in names:
            setattr(self, name, brainstate.HiddenState(jnp.zeros((self.batch, *SHAPE))))

    def init_state(self, batch_size=None, **kw):
        self.batch = batch_size

    def current(self, x):
        return bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                       dimension_numbers=DN)

    def readout(self, s):
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


class MembraneDelay(_Base):
    """The membrane two steps back feeds the neuron again: ``v = 0.85 h + I + 0.1 d2``,
    reset by subtraction, ``d2 = d1`` (assigned first), ``d1 = v``."""

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h', 'd1', 'd2')

    def update(self, x):
        v = 0.85 * self.h.value + self.current(x) + 0.1 * self.d2.value
        s = spike(v - 1.0)
        self.h.value = v - s
        self.d2.value = self.d1.value
        self.d1.value = v
        return self.readout(s)


class DelayedSelfExcitation(_Base):
    """Each neuron receives its own spike of two steps back through a trainable weight,
    with a detached reset (``v - stop_gradient(s)``, SpikingJelly's ``detach_reset``)."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.w_self = brainstate.ParamState(jnp.full(4, 0.6))

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h', 'd1', 'd2')

    def update(self, x):
        v = 0.9 * self.h.value + self.current(x) + self.w_self.value * self.d2.value
        s = spike(v - 1.0)
        self.h.value = v - jax.lax.stop_gradient(s)
        self.d2.value = self.d1.value
        self.d1.value = s
        return self.readout(s)


class SynapticDelay(_Base):
    """The synaptic current reaches the neuron three steps late through a delay line
    assigned front to back (old values read first); reset to zero."""

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h', 'd1', 'd2', 'd3')

    def update(self, x):
        d1, d2, d3 = self.d1.value, self.d2.value, self.d3.value
        self.d1.value = self.current(x)
        self.d2.value = d1
        self.d3.value = d2
        v = 0.8 * self.h.value + d3 + 0.3 * d1
        s = spike(v - 1.0)
        self.h.value = v * (1.0 - s)
        return self.readout(s)


class DelayedParameterPath(_Base):
    """A trainable time constant and bias enter values that wait in a delay line: the
    filtered current ``u = a u + I + bias`` reaches the membrane one and two steps
    late; the spike output and the old membrane both feed the readout."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.tau = brainstate.ParamState(jnp.asarray(self.rng.uniform(2.0, 6.0, size=4)))
        self.bias = brainstate.ParamState(self.normal(4, scale=0.2))

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('u', 'h', 'd1', 'd2')

    def update(self, x):
        u = jnp.exp(-1.0 / self.tau.value) * self.u.value + self.current(x) + self.bias.value
        h_old = self.h.value
        v = 0.9 * h_old + 0.6 * self.d1.value + 0.4 * self.d2.value
        s = spike(v - 1.0)
        self.d2.value = self.d1.value
        self.d1.value, self.u.value, self.h.value = u, u, v - s
        return self.readout(s + 0.2 * jnp.tanh(h_old))


class SharedValues(_Base):
    """Two states take the same new value (``a = v``, ``e = v``), one keeps its own value
    (``c = c``), and the readout reads a one-slot delay of the membrane."""

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h', 'a', 'e', 'c')
        self.c.value = jnp.full((batch_size, *SHAPE), 0.05)

    def update(self, x):
        v = 0.9 * self.h.value + self.current(x) + 0.1 * self.a.value - 0.1 * self.c.value
        s = spike(v - 1.0)
        e_old = self.e.value
        self.h.value = v - s
        self.a.value = v
        self.e.value = v
        self.c.value = self.c.value
        return self.readout(s + 0.1 * e_old)


class Pipelined(_Base):
    """Layer 2 reads layer 1's spikes of the step before, kept in a state (a one-step
    synaptic delay between layers)."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.K2 = brainstate.ParamState(self.normal(3, 3, 4, 4, scale=0.8))

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h1', 'h2', 'buf')

    def update(self, x):
        v1 = 0.9 * self.h1.value + self.current(x)
        s1 = spike(v1 - 1.0)
        self.h1.value = v1 - s1
        y2 = bc.conv(self.buf.value, self.K2.value, strides=1, padding='SAME',
                     dimension_numbers=DN)
        self.buf.value = s1
        v2 = 0.9 * self.h2.value + y2
        s2 = spike(v2 - 1.0)
        self.h2.value = v2 - s2
        return self.readout(s2)


class AxonalDelayBrainstate(brainstate.nn.Module):
    """``brainstate.nn.Conv2d`` layers with a two-step axonal delay between them and an
    adaptive second layer (two states, detached reset); ``brainstate.nn.Linear`` readout."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        w = lambda *shape, scale: jnp.asarray(rng.normal(size=shape) * scale)
        self.conv1 = brainstate.nn.Conv2d((6, 6, 2), 4, 3, padding='SAME',
                                          w_init=w(3, 3, 2, 4, scale=0.8), b_init=w(4, scale=0.2))
        self.conv2 = brainstate.nn.Conv2d((6, 6, 4), 3, 3, stride=2, padding='SAME',
                                          w_init=w(3, 3, 4, 3, scale=0.9), b_init=w(3, scale=0.2))
        self.readout = brainstate.nn.Linear(27, 3, w_init=w(27, 3, scale=0.5))

    def init_state(self, batch_size=None, **kw):
        zeros = lambda *shape: brainstate.HiddenState(jnp.zeros((batch_size, *shape)))
        self.v1, self.ax1, self.ax2 = zeros(6, 6, 4), zeros(6, 6, 4), zeros(6, 6, 4)
        self.v2, self.a2 = zeros(3, 3, 3), zeros(3, 3, 3)

    def update(self, x):
        v1 = 0.9 * self.v1.value + self.conv1(x)
        s1 = spike(v1 - 1.0)
        self.v1.value = v1 - s1
        arriving = self.ax2.value
        self.ax2.value = self.ax1.value
        self.ax1.value = s1
        v2 = 0.85 * self.v2.value + self.conv2(arriving) - 0.3 * self.a2.value
        s2 = spike(v2 - 1.0)
        self.v2.value = v2 - jax.lax.stop_gradient(s2)
        self.a2.value = 0.8 * self.a2.value + s2
        return self.readout(s2.reshape(s2.shape[0], -1))


class DelayedFeedback(_Base):
    """Layer 2 feeds back onto layer 1 through its spikes of the step before (kept in a
    state), and layer 2 has a recurrent synapse onto itself from the same state."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.K2 = brainstate.ParamState(self.normal(3, 3, 4, 4, scale=0.7))
        self.F = brainstate.ParamState(self.normal(1, 1, 4, 4, scale=0.5))
        self.R = brainstate.ParamState(self.normal(3, 3, 4, 4, scale=0.3))

    def init_state(self, batch_size=None, **kw):
        super().init_state(batch_size)
        self.zero_states('h1', 'h2', 's2')

    def update(self, x):
        s2_old = self.s2.value
        fb = bc.conv(s2_old, self.F.value, strides=1, padding='SAME', dimension_numbers=DN)
        v1 = 0.9 * self.h1.value + self.current(x) + fb
        s1 = spike(v1 - 1.0)
        self.h1.value = v1 - s1
        rec = bc.conv(s2_old, self.R.value, strides=1, padding='SAME', dimension_numbers=DN)
        v2 = 0.9 * self.h2.value + bc.conv(s1, self.K2.value, strides=1, padding='SAME',
                                           dimension_numbers=DN) + rec
        s2 = spike(v2 - 1.0)
        self.h2.value = v2 - s2
        self.s2.value = s2
        return self.readout(s2)


DELAY_MODELS = {
    'membrane-delay': MembraneDelay,
    'delayed-self-excitation': DelayedSelfExcitation,
    'synaptic-delay': SynapticDelay,
    'delayed-parameter-path': DelayedParameterPath,
    'shared-values': SharedValues,
    'pipelined': Pipelined,
    'axonal-delay-brainstate': AxonalDelayBrainstate,
    'delayed-feedback': DelayedFeedback,
}


class SHDLike(brainstate.nn.Module):
    """An SHD-style net at small size: ``brainstate.nn.Conv1d`` over ``(B, 3, 20)`` inputs,
    a current-based neuron (current and membrane) with a trainable membrane decay and
    threshold, and a leaky-integrator readout state."""

    def __init__(self, seed=0, c_in=20, c_out=6, length=3):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.length, self.c_out = length, c_out
        self.conv = brainstate.nn.Conv1d(
            (length, c_in), c_out, 3, padding='SAME',
            w_init=jnp.asarray(rng.normal(size=(3, c_in, c_out)) * 3.0 / np.sqrt(3 * c_in)),
            b_init=jnp.asarray(rng.normal(size=c_out) * 0.1))
        self.decay = brainstate.ParamState(jnp.asarray(rng.uniform(1.0, 3.0, size=c_out)))
        self.threshold = brainstate.ParamState(jnp.full(c_out, 1.0))
        self.readout = brainstate.nn.Linear(length * c_out, 3,
                                            w_init=jnp.asarray(rng.normal(size=(length * c_out, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        zeros = lambda *shape: brainstate.HiddenState(jnp.zeros((batch_size, *shape)))
        self.i, self.v, self.out = zeros(self.length, self.c_out), zeros(self.length, self.c_out), zeros(3)

    def update(self, x):
        alpha = jax.nn.sigmoid(self.decay.value)
        i = 0.8 * self.i.value + self.conv(x)
        v = alpha * self.v.value + i
        s = spike(v - self.threshold.value)
        self.i.value = i
        self.v.value = v - s * self.threshold.value
        out = 0.9 * self.out.value + self.readout(s.reshape(s.shape[0], -1))
        self.out.value = out
        return out
