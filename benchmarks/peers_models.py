"""The standard workload in snnTorch and SpikingJelly, with the initial weights of ours.

Imports torch: :mod:`peers` loads this module only when torch is installed.

Every model computes the function of ``workloads.ResetAfterSpikeNet``:
``v = a h + I; s = H(v - 1); h = v - s`` with ``a = exp(-1/10)``, the reset
inside the graph (not detached) and the sigmoid surrogate of slope 4, on the
layout torch expects (channels first). How each library is configured to that:

* snnTorch ``snn.Leaky(beta=a, reset_mechanism='none')`` integrates and fires;
  the net subtracts the spike itself (``h = v - s``), one line.  snnTorch's
  built-in ``'subtract'`` reset is another model: with its default
  ``reset_delay=True`` the state is the pre-reset potential and the threshold
  is subtracted, undecayed and detached, one step later
  (``v = a v + I - H(v_prev - 1)``); with ``reset_delay=False`` a neuron whose
  post-reset potential is still above threshold has its next spike tested on
  ``v - 1`` (a guard against a double reset).  :class:`SnnTorchNet` builds
  either; the defaults are timed too, as users write them.  (snnTorch fires
  on ``v > 1``, ours on ``v >= 1``: they differ only on exact ties.)
* SpikingJelly ``neuron.LIFNode`` charges ``v + (x - (v - v_reset)) / tau``;
  ``decay_input=False`` makes it ``v - v / tau + x``, ``tau = 1 / (1 - a)``
  gives ``a v + x``, ``v_reset=None`` resets by subtracting the threshold and
  ``detach_reset=False`` keeps the reset in the graph.
* SpikingJelly OTTT: the same neuron as ``neuron.OTTTLIFNode`` (single step,
  membrane detached between steps, presynaptic trace ``t = (1 - 1/tau) t + s``
  = ``a t + s``) inside ``layer.OTTTSequential``, which computes the weight
  gradient of each layer after a neuron from that trace.

JAX ``'SAME'`` padding of the stride-2 conv on 32x32 pads 0 rows before and 1
after; torch's symmetric ``padding=1`` would shift the sampling grid, so the
torch models pad explicitly with ``ZeroPad2d((0, 1, 0, 1))``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workloads import DECAY

SJ_TAU = 1.0 / (1.0 - DECAY)    # SpikingJelly: v - v / tau + x == DECAY * v + x
READOUT_HWC = (16, 16, 16)      # the grid and channels before the readout


def torch_weights(params) -> dict[str, torch.Tensor]:
    """Our parameters (``value_and_grad`` gradient structure) in torch layout.

    Conv kernels HWIO -> OIHW. Our readout reads a channels-last flatten
    ``(H, W, C)`` with a ``(in, out)`` matrix; torch flattens ``(C, H, W)``
    and stores ``(out, in)``, so its rows are permuted to match.
    """
    h, w, c = READOUT_HWC
    readout = np.asarray(params[('readout', 'weight')]['weight'])      # (H*W*C, 10)
    readout = readout.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(h * w * c, -1)
    conv = lambda name: np.asarray(params[(name, 'weight')]['weight']).transpose(3, 2, 0, 1)
    arrays = {'conv1.weight': conv('conv1'), 'conv2.weight': conv('conv2'),
              'readout.weight': readout.T,
              'readout.bias': np.asarray(params[('readout', 'weight')]['bias'])}
    return {k: torch.tensor(np.ascontiguousarray(v), dtype=torch.float32)
            for k, v in arrays.items()}


def our_layout(weights: dict[str, np.ndarray]) -> dict:
    """Inverse of :func:`torch_weights` (for gradients): torch layout -> ours."""
    h, w, c = READOUT_HWC
    readout = np.asarray(weights['readout.weight']).T                    # (C*H*W, 10)
    readout = readout.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    conv = lambda name: np.asarray(weights[name]).transpose(2, 3, 1, 0)
    return {('conv1', 'weight'): {'weight': conv('conv1.weight')},
            ('conv2', 'weight'): {'weight': conv('conv2.weight')},
            ('readout', 'weight'): {'bias': np.asarray(weights['readout.bias']),
                                    'weight': readout}}


def torch_data(xs, labels) -> tuple[torch.Tensor, torch.Tensor]:
    """Channels-last ``(T, B, H, W, C)`` spikes and ``(T, B)`` labels as torch tensors."""
    xs = np.ascontiguousarray(np.asarray(xs).transpose(0, 1, 4, 2, 3))
    return torch.from_numpy(xs), torch.from_numpy(np.asarray(labels).astype(np.int64))


def _layers(conv, linear, pad):
    """``conv1, pad, conv2, readout`` built with the given layer factories."""
    return (conv(2, 8, 3, padding=1, bias=False), pad(nn.ZeroPad2d((0, 1, 0, 1))),
            conv(8, 16, 3, stride=2, bias=False), linear(int(np.prod(READOUT_HWC)), 10))


def _load(layers: dict[str, nn.Module], weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, value in weights.items():
            name, kind = key.split('.')
            getattr(layers[name], kind).copy_(value)


class SnnTorchNet(nn.Module):
    """snnTorch, stepping in Python: ``forward(xs (T, B, 2, 32, 32)) -> logits (T, B, 10)``.

    ``builtin_reset=False``: ``snn.Leaky(reset_mechanism='none')`` and ``h = v - s``
    in the net, the function of ours. ``True``: ``snn.Leaky``'s defaults
    (``'subtract'``, ``reset_delay=True``), another model (module docstring).
    """

    def __init__(self, weights, builtin_reset: bool = False):
        super().__init__()
        import snntorch as snn
        from snntorch import surrogate

        self.conv1, self.pad, self.conv2, self.readout = _layers(nn.Conv2d, nn.Linear,
                                                                 lambda m: m)
        self.builtin_reset = builtin_reset
        reset = 'subtract' if builtin_reset else 'none'
        lif = lambda: snn.Leaky(beta=DECAY, threshold=1.0, reset_mechanism=reset,
                                spike_grad=surrogate.sigmoid(slope=4))
        self.lif1, self.lif2 = lif(), lif()
        _load(dict(self.named_children()), weights)

    def _neuron(self, lif, current, state):
        spike, v = lif(current, state)
        return spike, (v if self.builtin_reset else v - spike)

    def forward(self, xs):
        batch = xs.shape[1]
        h1, h2 = xs.new_zeros(batch, 8, 32, 32), xs.new_zeros(batch, 16, 16, 16)
        logits = []
        for x in xs:
            s1, h1 = self._neuron(self.lif1, self.conv1(x), h1)
            s2, h2 = self._neuron(self.lif2, self.conv2(self.pad(s1)), h2)
            logits.append(self.readout(s2.flatten(1)))
        return torch.stack(logits)


def _sj_lif(step_mode: str, online: bool = False):
    from spikingjelly.activation_based import neuron, surrogate

    cls = neuron.OTTTLIFNode if online else neuron.LIFNode
    extra = {} if online else dict(detach_reset=False)
    return cls(tau=SJ_TAU, decay_input=False, v_threshold=1.0, v_reset=None,
               surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode=step_mode, **extra)


def spikingjelly_bptt_net(weights) -> nn.Module:
    """SpikingJelly multi-step: ``net(xs (T, B, 2, 32, 32)) -> logits (T, B, 10)``."""
    from spikingjelly.activation_based import layer

    conv1, pad, conv2, readout = _layers(
        lambda *a, **k: layer.Conv2d(*a, step_mode='m', **k),
        lambda *a: layer.Linear(*a, step_mode='m'), layer.SeqToANNContainer)
    _load(dict(conv1=conv1, conv2=conv2, readout=readout), weights)
    return nn.Sequential(conv1, _sj_lif('m'), pad, conv2, _sj_lif('m'),
                         layer.Flatten(step_mode='m'), readout)


def spikingjelly_ottt_net(weights) -> nn.Module:
    """SpikingJelly OTTT, single step: ``net(x (B, 2, 32, 32)) -> logits (B, 10)``."""
    from spikingjelly.activation_based import layer

    conv1, pad, conv2, readout = _layers(layer.Conv2d, layer.Linear, lambda m: m)
    _load(dict(conv1=conv1, conv2=conv2, readout=readout), weights)
    return layer.OTTTSequential(conv1, _sj_lif('s', online=True), pad, conv2,
                                _sj_lif('s', online=True), layer.Flatten(), readout)


def _reset(net):
    from spikingjelly.activation_based import functional
    functional.reset_net(net)


def _sequence_loss(logits, labels):
    """Cross-entropy averaged over the batch, summed over steps: ``(T, B, 10), (T, B)``."""
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction='sum')
    return loss / labels.shape[1]


def _unrolled(net, reset_states: bool):
    """``xs (T, B, ...) -> logits (T, B, 10)`` for a net that takes the whole sequence."""
    def forward(xs):
        if reset_states:
            _reset(net)
        return net(xs)
    return forward


def _stepwise(net):
    """``xs (T, B, ...) -> logits (T, B, 10)`` for a single-step SpikingJelly net."""
    def forward(xs):
        _reset(net)
        return torch.stack([net(x) for x in xs])
    return forward


def _bptt(net, forward):
    """One forward over the sequence, one backward of the summed loss."""
    def run(xs, labels):
        net.zero_grad(set_to_none=True)
        loss = _sequence_loss(forward(xs), labels)
        loss.backward()
        return loss.detach()
    return run


def _ottt(net):
    """A forward and a backward at every step, gradients accumulated in ``.grad``."""
    def run(xs, labels):
        net.zero_grad(set_to_none=True)
        _reset(net)
        total = xs.new_zeros(())
        for x, label in zip(xs, labels):
            loss = F.cross_entropy(net(x), label)
            loss.backward()
            total += loss.detach()
        return total
    return run


def _method(net, forward, step, names: dict[str, str]):
    """``bind(xs, labels) -> (run, grads, logits)`` for one torch model.

    ``xs (T, B, 32, 32, 2)`` and ``labels (T, B)`` come in our layout.
    ``run()`` computes the loss and leaves the gradients in ``.grad``;
    ``grads()`` returns them in our layout; ``logits()`` is the forward pass
    ``(T, B, 10)`` alone.  ``names`` maps our parameter names
    (``'conv1.weight'``, ...) to the net's.
    """
    def bind(xs, labels):
        txs, tls = torch_data(xs, labels)

        def grads():
            params = dict(net.named_parameters())
            return our_layout({ours: params[theirs].grad.numpy()
                               for ours, theirs in names.items()})

        def logits():
            with torch.no_grad():
                return forward(txs).numpy()
        return (lambda: step(txs, tls)), grads, logits
    return bind


_OURS = ('conv1.weight', 'conv2.weight', 'readout.weight', 'readout.bias')
_SEQUENTIAL = dict(zip(_OURS, ('0.weight', '3.weight', '6.weight', '6.bias')))


def methods(params, snntorch: bool = True, spikingjelly: bool = True) -> dict:
    """``{(library, algorithm): bind}`` (see :func:`_method`) for the installed peers,
    all starting from our parameters ``params`` (``value_and_grad`` structure)."""
    weights = torch_weights(params)
    found = {}
    if snntorch:
        for builtin, name in ((False, 'BPTT'), (True, 'BPTT, built-in reset (another model)')):
            net = SnnTorchNet(weights, builtin_reset=builtin)
            forward = _unrolled(net, reset_states=False)
            found['snnTorch', name] = _method(net, forward, _bptt(net, forward),
                                              {k: k for k in _OURS})
    if spikingjelly:
        net = spikingjelly_bptt_net(weights)
        forward = _unrolled(net, reset_states=True)
        found['SpikingJelly', 'BPTT (multi-step)'] = _method(net, forward, _bptt(net, forward),
                                                             _SEQUENTIAL)
        net = spikingjelly_ottt_net(weights).train()       # traces are kept in training mode
        found['SpikingJelly', 'OTTT'] = _method(net, _stepwise(net), _ottt(net), _SEQUENTIAL)
    return found
