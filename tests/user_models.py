"""Models the executors' tests share, and the helpers that run them against BPTT.

Each model is a ``brainstate.nn.Module`` written the way users write theirs: states
and the ``conv`` / ``dense`` ops, ``brainstate.nn`` layers or this library's, neurons
in several reset styles. Test files import them by name
(``from user_models import OneLayer``); a model only one file uses stays in that file.
``delay_models.py`` holds the models that pass values along in states.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import braintrace_conv as bc
from braintrace_conv import nn
from braintrace_conv.executors._analysis.graph import analyse
from braintrace_conv.executors._analysis.step import capture_step
from braintrace_conv.models import ConvLIF, recurrent_conv_snn
from snn_reference import EXACT, rel_err, spike, spike_vjp, xent


# ----------------------------------------------------------------------------- against BPTT
def sq_loss(out, target):
    return jnp.sum((out - target) ** 2)


def sin_loss(out, target):
    return jnp.sum(jnp.sin(out) * target)


def assert_matches_bptt(model, learner, xs, targets, loss_fn, tol=EXACT):
    loss_ref, ref = bc.BPTT(model).value_and_grad(loss_fn, xs, targets)
    loss, grads = learner.value_and_grad(loss_fn, xs, targets)
    assert set(grads) == set(model.states(brainstate.ParamState))
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-12)
    for key in ref:
        assert np.abs(ref[key]).max() > 0, f'{key}: reference gradient is zero, test is vacuous'
        assert np.shape(grads[key]) == np.shape(ref[key])
        assert rel_err(grads[key], ref[key]) < tol, (key, rel_err(grads[key], ref[key]))
    return grads, ref


def spikes_and_labels(shape, T=10, seed=0, p=0.4):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.random((T, *shape)) < p, jnp.float64),
            jnp.asarray(rng.integers(0, 3, (T, shape[0]))))


def compare(model, learner, xs, targets, loss_fn=xent):
    """Gradients of ``learner`` and BPTT, keyed by parameter name."""
    _, ref = bc.BPTT(model).value_and_grad(loss_fn, xs, targets)
    _, grads = learner.value_and_grad(loss_fn, xs, targets)
    errors = {}
    for key in ref:     # one entry per leaf, named like report() rows
        leaves = jax.tree_util.tree_flatten_with_path(ref[key])[0]
        mine = jax.tree.leaves(grads[key])
        for (path, r), g in zip(leaves, mine):
            name = '.'.join(map(str, key)) + (jax.tree_util.keystr(path) if path else '')
            assert np.abs(np.asarray(r)).max() > 0, f'{name}: vacuous reference'
            errors[name] = rel_err(g, r)
    return errors


def methods(learner):
    return {r['parameter']: r['method'] for r in learner.report().rows}


# ----------------------------------------------------------------------------- single layers
class ConvTanh(brainstate.nn.Module):
    """h = a * tanh(h) + conv(x) (+ b); readout dense(tanh(mean over space of h))."""

    def __init__(self, in_shape, kernel_shape, conv_kwargs, channel_axis, bias=True,
                 flatten=False, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.kw = conv_kwargs
        self.channel_axis = channel_axis
        self.flatten = flatten
        y = jax.eval_shape(lambda x, k: bc.conv(x, k, **conv_kwargs),
                           jax.ShapeDtypeStruct(in_shape, jnp.float64),
                           jax.ShapeDtypeStruct(kernel_shape, jnp.float64))
        self.out_shape = y.shape[1:]
        out_ch = self.out_shape[channel_axis - 1]
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=kernel_shape) * 0.4))
        self.b = brainstate.ParamState(jnp.asarray(rng.normal(size=out_ch) * 0.2)) if bias else None
        feat = int(np.prod(self.out_shape)) if flatten else out_ch
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(feat, 3)) * 0.2))

    def init_state(self, batch_size=None, **kw):
        shape = (int(np.prod(self.out_shape)),) if self.flatten else self.out_shape
        batch_out = batch_size // self.kw.get('batch_group_count', 1)
        self.h = brainstate.HiddenState(jnp.zeros((batch_out, *shape)))

    def update(self, x):
        y = bc.conv(x, self.K.value, None if self.b is None else self.b.value, **self.kw)
        if self.flatten:
            y = y.reshape(y.shape[0], -1)
        h = 0.7 * jnp.tanh(self.h.value) + y
        self.h.value = h
        if self.flatten:
            feat = h
        else:
            axes = tuple(i for i in range(h.ndim) if i not in (0, self.channel_axis))
            feat = h.mean(axis=axes)
        return bc.dense(jnp.tanh(feat), self.W.value)


# x shape (layout per dimension_numbers), kernel shape, conv kwargs, output channel axis
CONV_CASES = {
    '1d-default-stride2-same': ((2, 3, 9), (4, 3, 3), dict(strides=2, padding='SAME'), 1),
    '1d-nwc-rhs-dilation': ((2, 9, 3), (3, 3, 4), dict(strides=1, padding='VALID', rhs_dilation=2,
                                                       dimension_numbers=('NWC', 'WIO', 'NWC')), 2),
    '2d-nhwc-groups-negative-pad': ((2, 6, 7, 4), (3, 2, 2, 6),
                                    dict(strides=(1, 2), padding=((1, -1), (0, 1)),
                                         feature_group_count=2,
                                         dimension_numbers=('NHWC', 'HWIO', 'NHWC')), 3),
    '2d-nchw-lhs-dilation': ((2, 2, 5, 5), (3, 2, 3, 3), dict(strides=2, padding=((1, 1), (1, 1)),
                                                              lhs_dilation=(2, 1)), 1),
    '2d-mixed-layout-depthwise': ((2, 6, 6, 3), (3, 1, 3, 3),
                                  dict(strides=1, padding='SAME_LOWER', feature_group_count=3,
                                       dimension_numbers=('NHWC', 'OIHW', 'NCHW')), 1),
    '2d-batch-groups': ((4, 3, 5, 5), (4, 3, 3, 3), dict(strides=1, padding='VALID',
                                                         batch_group_count=2), 1),
    '3d-ndhwc-stride': ((2, 4, 5, 4, 2), (2, 3, 2, 2, 3),
                        dict(strides=(1, 2, 1), padding='SAME',
                             dimension_numbers=('NDHWC', 'DHWIO', 'NDHWC')), 4),
}


def conv_data(x_shape, T=6, seed=1):
    """Inputs ``(T, *x_shape)`` and readout targets ``(T, B, 3)``."""
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(T, *x_shape))),
            jnp.asarray(rng.normal(size=(T, x_shape[0], 3))))


class TwoVariable(brainstate.nn.Module):
    """v and an adaptation a; ``chained``: a is driven by the new v and the output reads a."""

    def __init__(self, chained, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.chained = chained
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(4, 3, 3)) * 0.5))
        self.b = brainstate.ParamState(jnp.asarray(rng.normal(size=4) * 0.5))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(32, 2)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, 4, 8)))
        self.a = brainstate.HiddenState(jnp.zeros((batch_size, 4, 8)))

    def update(self, x):
        v_old, a_old = self.v.value, self.a.value
        v = 0.9 * jnp.tanh(v_old) - 0.2 * a_old + bc.conv(x, self.K.value, self.b.value,
                                                         strides=1, padding='SAME')
        a = 0.8 * a_old + 0.3 * jax.nn.sigmoid(v if self.chained else v_old)
        self.v.value, self.a.value = v, a
        return bc.dense(jax.nn.sigmoid(v - a).reshape(v.shape[0], -1), self.W.value)


class LinearLeaky(brainstate.nn.Module):
    def __init__(self, decay, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.decay = decay
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 5)) * 0.3))
        self.b = brainstate.ParamState(jnp.asarray(rng.normal(size=5) * 0.1))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 4, 4, 5)))

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=2, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        self.h.value = self.decay * self.h.value + y
        return self.h.value


class LinearStack(brainstate.nn.Module):
    """Linear leaky conv layers ``h_n = a_n h_n + gain (conv(h_{n-1}) + b_n)`` on 8x8 maps,
    one per decay in ``decays``, optionally a 2x2 average pooling (``pool='avg'``, linear) or
    max pooling (``'max'``) between the layers; returns the top state."""

    CHANNELS = (2, 3, 4, 3)

    def __init__(self, decays, pool=None, seed=0, gain=1.0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.decays, self.pool, self.gain = tuple(decays), pool, gain
        pairs = list(zip(self.CHANNELS[:-1], self.CHANNELS[1:]))[:len(self.decays)]
        self.K = [brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, a, b)) * 0.4))
                  for a, b in pairs]
        self.b = [brainstate.ParamState(jnp.asarray(rng.normal(size=b) * 0.1)) for _, b in pairs]

    def side(self, n):
        """The map size of layer ``n``."""
        return 8 // 2 ** n if self.pool else 8

    def init_state(self, batch_size=None, **kw):
        self.h = [brainstate.HiddenState(jnp.zeros((batch_size, self.side(n), self.side(n),
                                                    self.CHANNELS[n + 1])))
                  for n in range(len(self.decays))]

    def update(self, x):
        for n, a in enumerate(self.decays):
            if n and self.pool:
                b, h, w, c = x.shape
                x = x.reshape(b, h // 2, 2, w // 2, 2, c)
                x = x.mean((2, 4)) if self.pool == 'avg' else x.max((2, 4))
            y = bc.conv(x, self.K[n].value, self.b[n].value, strides=1, padding='SAME',
                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
            self.h[n].value = a * self.h[n].value + self.gain * y
            x = self.h[n].value
        return x


def linear_stack_data(model, T=6, B=2):
    """Inputs ``(T, B, 8, 8, 2)`` and targets shaped like the top state."""
    rng = np.random.default_rng(3)
    top = len(model.decays) - 1
    return (jnp.asarray(rng.normal(size=(T, B, 8, 8, 2))),
            jnp.asarray(rng.normal(size=(T, B, model.side(top), model.side(top),
                                         model.CHANNELS[top + 1]))))


class LeakyDense(brainstate.nn.Module):
    """A leaky dense layer of 3 units on 4 inputs, with a tanh output."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(np.random.default_rng(0).normal(size=(4, 3))))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 3)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + bc.dense(x, self.W.value)
        return jnp.tanh(self.h.value)


def leaky_dense_data(T=5, B=2):
    """Inputs ``(T, B, 4)`` and labels ``(T, B)`` of 3 classes for :class:`LeakyDense`."""
    rng = np.random.default_rng(1)
    return jnp.asarray(rng.normal(size=(T, B, 4))), jnp.asarray(rng.integers(0, 3, (T, B)))


# ----------------------------------------------------------------------------- user-style layers
class OneLayer(brainstate.nn.Module):
    """conv (+bias) -> a neuron written in one of several user styles -> dense readout."""

    def __init__(self, style, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.style = style
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8))
        self.b = brainstate.ParamState(jnp.full(4, 0.1))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(6 * 6 * 4, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4)))
        if self.style == 'alif-reset':
            self.a = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4)))

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        h_old = self.h.value
        if self.style == 'subtract':          # snnTorch / brainpy default
            v = 0.9 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v - s
            out = s
        elif self.style == 'subtract-vjp':    # the spike's derivative given as a custom_vjp
            v = 0.9 * h_old + y
            s = spike_vjp(v - 1.0)
            self.h.value = v - s
            out = s
        elif self.style == 'zero':            # reset to zero
            v = 0.8 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v * (1.0 - s)
            out = s
        elif self.style == 'old-and-new':     # output reads the old state too
            v = 0.9 * h_old + y
            s = spike(v - 1.0)
            self.h.value = v - s
            out = s + 0.3 * jnp.tanh(h_old)
        elif self.style == 'old-only':        # output from the old state alone
            self.h.value = 0.9 * h_old + y
            out = jax.nn.sigmoid(h_old)
        elif self.style == 'alif-reset':      # two states, both stored after the reset
            a_old = self.a.value
            v = 0.9 * h_old + y - 0.5 * a_old
            s = spike(v - 1.0)
            self.h.value = v - s
            self.a.value = 0.8 * a_old + s
            out = s
        else:
            raise ValueError(self.style)
        return bc.dense(out.reshape(out.shape[0], -1), self.W.value)


class BrainstateLayers(brainstate.nn.Module):
    """brainstate.nn.ConvNd -> reset-after-spike LIF -> brainstate.nn.Linear readout."""

    def __init__(self, rank, hidden_linear=False, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.rank, self.hidden_linear = rank, hidden_linear
        size = (5,) * rank
        conv = {1: brainstate.nn.Conv1d, 2: brainstate.nn.Conv2d, 3: brainstate.nn.Conv3d}[rank]
        self.conv = conv((*size, 2), 3, 3, padding='SAME',
                         w_init=jnp.asarray(rng.normal(size=(3,) * rank + (2, 3)) * 0.7),
                         b_init=jnp.asarray(rng.normal(size=3) * 0.2))
        self.shape = (*size, 3)
        n = int(np.prod(self.shape))
        if hidden_linear:      # a dense hidden layer with its bias inside the dynamics
            self.fc = brainstate.nn.Linear(n, 7, w_init=jnp.asarray(rng.normal(size=(n, 7))),
                                           b_init=jnp.asarray(rng.normal(size=7) * 0.2))
            n = 7
        self.readout = brainstate.nn.Linear(n, 3, w_init=jnp.asarray(rng.normal(size=(n, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape)))
        if self.hidden_linear:
            self.h2 = brainstate.HiddenState(jnp.zeros((batch_size, 7)))

    def update(self, x):
        v = 0.9 * self.h.value + self.conv(x)
        s = spike(v - 1.0)
        self.h.value = v - s
        s = s.reshape(s.shape[0], -1)
        if self.hidden_linear:
            v2 = 0.8 * self.h2.value + self.fc(s)
            s = spike(v2 - 0.5)
            self.h2.value = v2 - 0.5 * s
        return self.readout(s)


class Parametric(brainstate.nn.Module):
    """Bias after the op, per-channel trainable tau, threshold and reset value."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 2, 4)) * 0.8))
        self.bias = brainstate.ParamState(jnp.asarray(rng.normal(size=4) * 0.2))
        self.tau = brainstate.ParamState(jnp.asarray(rng.uniform(3.0, 8.0, size=4)))
        self.theta = brainstate.ParamState(jnp.full((1, 4), 0.8))
        self.v_reset = brainstate.ParamState(jnp.asarray(0.1))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(7 * 4, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 7, 4)))

    def update(self, x):
        y = bc.conv(x, self.K.value, strides=1, padding='SAME',
                    dimension_numbers=('NWC', 'WIO', 'NWC')) + self.bias.value
        v = jnp.exp(-1.0 / self.tau.value) * self.h.value + y
        s = spike(v - self.theta.value)
        self.h.value = v - s * (self.theta.value - self.v_reset.value)
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


class MixedParameter(Parametric):
    """A parameter that mixes positions before reaching the state stays instantaneous."""

    def update(self, x):
        y = bc.conv(x, self.K.value, strides=1, padding='SAME',
                    dimension_numbers=('NWC', 'WIO', 'NWC'))
        v = 0.8 * self.h.value + y + jnp.sum(self.bias.value)     # mixes the 4 entries
        s = spike(v - 0.8)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


class PoolBetween(OneLayer):
    """conv -> linear pooling -> reset-after-spike LIF: average (brainstate.nn or ours), or a
    padded sum pooling written with lax.reduce_window. With ``bias_before_pool`` the conv is
    a plain lax convolution whose bias is added before the pooling, as brainstate.nn.Conv2d,
    snnTorch and SpikingJelly models do."""

    def __init__(self, pool, seed=0, bias_before_pool=False):
        super().__init__('subtract', seed)
        self.pool, self.bias_before_pool = pool, bias_before_pool
        if pool == 'brainstate-avg':
            self.pool_layer = brainstate.nn.AvgPool2d(2, 2)
        elif pool == 'ours-avg':
            self.pool_layer = nn.AvgPool2d(2, stride=2, layout='channels_last')
        self.out = 3 * 3 * 4 if pool != 'sum-same' else 6 * 6 * 4
        rng = np.random.default_rng(seed + 1)
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(self.out, 3)) * 0.3))

    def init_state(self, batch_size=None, **kw):
        side = 6 if self.pool == 'sum-same' else 3
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, side, side, 4)))

    def update(self, x):
        if self.bias_before_pool:
            y = lax.conv_general_dilated(x, self.K.value, (1, 1), 'SAME',
                                         dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + self.b.value
        else:
            y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        if self.pool == 'sum-same':
            y = 0.5 * lax.reduce_window(y, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), 'SAME')
        else:
            y = self.pool_layer(y)
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


class TypedLayer(brainstate.nn.Module):
    """conv + reset-after-spike LIF + dense readout with parameters and state of one dtype."""

    def __init__(self, dtype, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.K = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8, dtype))
        self.b = brainstate.ParamState(jnp.full(4, 0.1, dtype))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(6 * 6 * 4, 3)) * 0.3, dtype))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, 6, 6, 4), self.dtype))

    def update(self, x):
        y = bc.conv(x, self.K.value, self.b.value, strides=1, padding='SAME',
                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        v = 0.9 * self.h.value + y
        s = spike(v - 1.0)
        self.h.value = v - s
        return bc.dense(s.reshape(s.shape[0], -1), self.W.value)


# ----------------------------------------------------------------------------- networks
class SpikingConvNet(brainstate.nn.Module):
    """conv+LIF, (recurrent) conv+LIF with stride 2, dense readout: the standard shape."""

    def __init__(self, recurrent, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.recurrent = recurrent
        self.K1 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 2, 4)) * 0.8))
        self.b1 = brainstate.ParamState(jnp.full(4, 0.1))
        self.K2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 4, 6)) * 0.6))
        self.b2 = brainstate.ParamState(jnp.full(6, 0.1))
        if recurrent:
            self.R2 = brainstate.ParamState(jnp.asarray(rng.normal(size=(3, 3, 6, 6)) * 0.3))
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(4 * 4 * 6, 3)) * 0.2))

    def init_state(self, batch_size=None, **kw):
        self.v1 = brainstate.HiddenState(jnp.zeros((batch_size, 8, 8, 4)))
        self.v2 = brainstate.HiddenState(jnp.zeros((batch_size, 4, 4, 6)))

    @staticmethod
    def lif(v_old, current):
        v = v_old - spike(v_old - 1.0)            # reset by subtraction of the last spike
        return 0.9 * v + current

    def update(self, x):
        dn = ('NHWC', 'HWIO', 'NHWC')
        v1 = self.lif(self.v1.value, bc.conv(x, self.K1.value, self.b1.value, strides=1,
                                             padding='SAME', dimension_numbers=dn))
        s1 = spike(v1 - 1.0)
        i2 = bc.conv(s1, self.K2.value, self.b2.value, strides=2, padding='SAME',
                     dimension_numbers=dn)
        if self.recurrent:
            i2 = i2 + bc.conv(spike(self.v2.value - 1.0), self.R2.value, strides=1,
                              padding='SAME', dimension_numbers=dn)
        v2 = self.lif(self.v2.value, i2)
        self.v1.value, self.v2.value = v1, v2
        return bc.dense(spike(v2 - 1.0).reshape(v2.shape[0], -1), self.W.value)


class ResetLIF(brainstate.nn.Module):
    """``v = a h + I; s = spike(v - 1); h = v - s``; returns ``s`` (post-reset state)."""

    def __init__(self, shape, decay=0.9):
        super().__init__()
        self.shape, self.decay = tuple(shape), decay

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape)))

    def update(self, current):
        v = self.decay * self.h.value + current
        s = spike(v - 1.0)
        self.h.value = v - s
        return s


class UserConvNet(brainstate.nn.Module):
    """brainstate.nn.Conv2d + LIF, Conv2d (stride 2) + LIF, optionally a recurrent Conv2d of
    the second layer's last spikes (kept in a state), brainstate.nn.Linear readout."""

    def __init__(self, recurrent, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        w = lambda *shape, scale: jnp.asarray(rng.normal(size=shape) * scale)
        self.recurrent = recurrent
        self.conv1 = brainstate.nn.Conv2d((6, 6, 2), 3, 3, padding='SAME',
                                          w_init=w(3, 3, 2, 3, scale=0.8), b_init=w(3, scale=0.2))
        self.lif1 = ResetLIF((6, 6, 3))
        self.conv2 = brainstate.nn.Conv2d((6, 6, 3), 4, 3, stride=2, padding='SAME',
                                          w_init=w(3, 3, 3, 4, scale=0.7), b_init=w(4, scale=0.2))
        if recurrent:
            self.rec = brainstate.nn.Conv2d((3, 3, 4), 4, 3, padding='SAME',
                                            w_init=w(3, 3, 4, 4, scale=0.8), b_init=None)
        self.lif2 = ResetLIF((3, 3, 4), decay=0.85)
        self.readout = brainstate.nn.Linear(36, 3, w_init=w(36, 3, scale=0.5))

    def init_state(self, batch_size=None, **kw):
        if self.recurrent:
            self.s2 = brainstate.HiddenState(jnp.zeros((batch_size, 3, 3, 4)))

    def update(self, x):
        current = self.conv2(self.lif1(self.conv1(x)))
        if self.recurrent:
            current = current + self.rec(self.s2.value)
        s = self.lif2(current)
        if self.recurrent:
            self.s2.value = s
        return self.readout(s.reshape(s.shape[0], -1))


def ours(pool=1, tau_adapt=None):
    """This library's recurrent net, small: LIF neurons, or adaptive ones (ALIF, ``tau =
    5``) with ``tau_adapt``."""
    brainstate.random.seed(1)
    if tau_adapt is None:
        return recurrent_conv_snn((2, 6, 6), 3, channels=(3, 4), recurrent=True,
                                  readout='li', pool=pool)
    return recurrent_conv_snn((2, 6, 6), 3, channels=(3, 4), recurrent=True, readout='li',
                              pool=pool, tau=5.0, tau_adapt=tau_adapt)


class NeuronLayer(brainstate.nn.Module):
    """One conv block of this library (``ConvLIF``) with the neuron ``neuron(size)``, and a
    dense readout; inputs ``(B, 2, 6, 6)``, three classes."""

    def __init__(self, neuron, seed=3):
        super().__init__()
        brainstate.random.seed(seed)
        self.block = ConvLIF((2, 6, 6), 4, 3, stride=1, neuron=neuron)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def update(self, x):
        return self.fc(self.flatten(self.block(3.0 * x)))


# ----------------------------------------------------------------------------- closed-form steps
# batch, neurons and inputs of ResetNeuron and Chained
B, K, IN = 2, 3, 4


class ResetNeuron(brainstate.nn.Module):
    """``y = x W``; ``v = a h + c * y``; ``s = tanh(v)``; ``h' = v - beta * s``; output ``s``
    through a dense readout. ``c`` (per channel) and ``beta`` are inside the dynamics."""

    def __init__(self, a=0.8, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.a = a
        self.W = brainstate.ParamState(jnp.asarray(rng.normal(size=(IN, K))))
        self.c = brainstate.ParamState(jnp.asarray(rng.uniform(0.5, 1.5, size=K)))
        self.beta = brainstate.ParamState(jnp.asarray(0.4))
        self.R = brainstate.ParamState(jnp.asarray(rng.normal(size=(K, 2))))

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.asarray(np.random.default_rng(1).normal(
            size=(batch_size, K))))

    def update(self, x):
        v = self.a * self.h.value + self.c.value * bc.dense(x, self.W.value)
        s = jnp.tanh(v)
        self.h.value = v - self.beta.value * s
        return bc.dense(s, self.R.value)


class Chained(brainstate.nn.Module):
    """Two stored states, the second integrating the first's new value: ``v = 0.9 h1 + y``,
    ``u = 0.7 h2 + v``; both are the new states and the output reads both."""

    def __init__(self, seed=0):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(np.random.default_rng(seed).normal(
            size=(IN, K))))

    def init_state(self, batch_size=None, **kw):
        rng = np.random.default_rng(2)
        self.h1 = brainstate.HiddenState(jnp.asarray(rng.normal(size=(batch_size, K))))
        self.h2 = brainstate.HiddenState(jnp.asarray(rng.normal(size=(batch_size, K))))

    def update(self, x):
        v = 0.9 * self.h1.value + bc.dense(x, self.W.value)
        u = 0.7 * self.h2.value + v
        self.h1.value, self.h2.value = v, u
        return jnp.tanh(v) + jnp.sin(u)


def analysed(model):
    """One step of ``model`` (batch ``B``, a random input) as the executors' analysis sees
    it: ``(graph, hidden leaves, parameter leaves, weights, inputs)``."""
    brainstate.nn.init_all_states(model, B)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(B, IN)))
    graph = analyse(capture_step(model, jax.ShapeDtypeStruct(x.shape, x.dtype)))
    step = graph.step
    params = step.param_leaves()
    return graph, step.hidden_leaves(), params, graph.weights(params), [x]
