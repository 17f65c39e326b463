"""The peers' half of ``nir_peers.py``: runs inside a peer's Python (torch + snnTorch / Norse /
Sinabs), never imports braintrace_conv.

    <peer python> benchmarks/nir_peer_side.py JOB.json

A job (JSON) says ``peer``, ``task`` and ``case``. ``write``: build the case's network in the
peer (seeded), export it to the NIR file ``nir``, run it on the inputs ``inputs`` (``.npy``,
``(T, B, C, H, W)``, channels first) and save every spiking layer's output per step to
``spikes`` (``.npz``, one ``(T, B, ...)`` array per NIR node name). ``read``: load the NIR file
``nir`` with the peer's importer and do the same. Norse runs in float64 (its importer casts
the graph's values to float32 first); snnTorch and Sinabs in float32, since their spike
functions return float32 whatever their input. The outcome (nodes recorded, or the peer's
error, quoted) goes to ``result`` (JSON).
"""
from __future__ import annotations

import json
import sys
import traceback

import numpy as np


def _full(value, shape):
    import torch
    return torch.full(shape, float(value))


# --------------------------------------------------------------------------- snnTorch
def snntorch_network(case: str):
    import snntorch as snn
    from torch import nn

    def leaky(beta, shape, reset='zero', reset_delay=True):
        return snn.Leaky(beta=_full(beta, shape), threshold=_full(1.0, shape),
                         reset_mechanism=reset, init_hidden=True, reset_delay=reset_delay)

    def synaptic(alpha, beta, shape, reset):
        return snn.Synaptic(alpha=_full(alpha, shape), beta=_full(beta, shape),
                            threshold=_full(1.0, shape), reset_mechanism=reset, init_hidden=True)

    if case == 'conv-Leaky-avgpool (reset to zero)':
        return nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), leaky(0.9, (8, 8, 8)), nn.AvgPool2d(2),
                             nn.Conv2d(8, 8, 3, padding=1), leaky(0.8, (8, 4, 4)), nn.Flatten(),
                             nn.Linear(128, 10), leaky(0.85, (10,)))
    if case == 'conv-Synaptic (reset by subtraction)':
        return nn.Sequential(nn.Conv2d(2, 8, 5, stride=2, padding=2), synaptic(0.6, 0.9, (8, 4, 4), 'subtract'),
                             nn.Conv2d(8, 8, 3, padding=1), synaptic(0.5, 0.8, (8, 4, 4), 'subtract'),
                             nn.Flatten(), nn.Linear(128, 10), synaptic(0.7, 0.9, (10,), 'subtract'))
    if case == 'conv-Leaky (reset by subtraction, reset_delay=False)':
        return nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), leaky(0.9, (8, 8, 8), 'subtract', False),
                             nn.Conv2d(8, 8, 3, stride=2, padding=1),
                             leaky(0.8, (8, 4, 4), 'subtract', False), nn.Flatten(),
                             nn.Linear(128, 10), leaky(0.85, (10,), 'subtract', False))
    if case == 'conv-Leaky-RLeaky (a cycle)':
        return nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), leaky(0.9, (8, 8, 8)), nn.Flatten(),
                             nn.Linear(512, 16),
                             snn.RLeaky(beta=_full(0.9, (16,)), threshold=_full(1.0, (16,)),
                                        linear_features=16, reset_mechanism='zero', init_hidden=True,
                                        reset_delay=False),
                             nn.Linear(16, 10), leaky(0.8, (10,)))
    if case == 'recurrent conv (RLeaky with a conv)':
        return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1),
                             snn.RLeaky(beta=_full(0.9, (4, 8, 8)), threshold=_full(1.0, (4, 8, 8)),
                                        conv2d_channels=4, kernel_size=3, reset_mechanism='zero',
                                        init_hidden=True))
    raise KeyError(case)


def _neurons_of(net, types):
    return {name: mod for name, mod in net.named_modules() if isinstance(mod, types)}


def _recorder(modules: dict, pick=lambda out: out):
    """Forward hooks appending each named module's output (as NumPy) per call."""
    records = {name: [] for name in modules}
    for name, mod in modules.items():
        mod.register_forward_hook(
            lambda m, i, out, name=name: records[name].append(pick(out).detach().numpy().copy()))
    return records


def _writable(graph):
    """Sinabs 3.1 leaves Conv2d.input_shape unset, which nir.write cannot store ("One of data,
    shape or dtype must be specified"): NIR's own type inference fills it. (Norse 1.1 leaves
    it unset too, and its graphs fail type inference: see norse_write.)"""
    graph.infer_types()
    return graph


def _unbatched(job, dtype):
    """Inputs per sample: snnTorch 1.0 and Norse 1.1 read NIR's Flatten dims as counting the
    batch axis (NIR's exclude it), so a batch would be flattened into the features."""
    xs = _inputs(job, dtype)
    return [xs[:, b] for b in range(xs.shape[1])]


def _stack_samples(per_sample: list) -> dict:
    return {name: np.stack([s[name] for s in per_sample], axis=1) for name in per_sample[0]}


def snntorch_write(job):
    import snntorch as snn
    from snntorch import utils
    import torch
    from snntorch.export_nir import export_to_nir
    import nir
    torch.manual_seed(job['seed'])
    net = snntorch_network(job['case'])
    xs = _inputs(job, torch.float32)
    graph = export_to_nir(net, xs[0, :1], ignore_dims=[0])
    nir.write(job['nir'], graph)
    neurons = _neurons_of(net, (snn.Leaky, snn.Synaptic, snn.RLeaky))
    records = _recorder(neurons)
    utils.reset(net)
    with torch.no_grad():
        for x in xs:
            net(x)
    return {name.replace('.', '_'): np.stack(r) for name, r in records.items()}


def snntorch_read(job):
    import snntorch as snn
    import torch
    from snntorch.import_nir import import_from_nir
    import nir
    per_sample = []
    for xs in _unbatched(job, torch.float32):
        graph = nir.read(job['nir'])
        for node in graph.nodes.values():   # nir.read gives NumPy ints, which torch's conv2d rejects
            if isinstance(node, nir.Conv2d):
                node.groups = int(node.groups)
        net = import_from_nir(graph)
        neurons = _neurons_of(net, (snn.Leaky, snn.Synaptic, snn.RLeaky))
        records = _recorder(neurons, pick=lambda out: out[0] if isinstance(out, tuple) else out)
        state = None
        with torch.no_grad():
            for x in xs:
                _, state = net(x, state)
        per_sample.append({name: np.stack(r) for name, r in records.items()})
    return _stack_samples(per_sample)


# --------------------------------------------------------------------------- Norse
def norse_write(job):
    """Norse 1.1.0 exports conv layers without input_shape and no Flatten: nir.write fails."""
    import nir
    import norse.torch as norse
    import torch
    from norse.torch.utils.export_nir import to_nir
    torch.manual_seed(job['seed'])
    shape = (8, 8, 8)
    p = norse.LIFBoxParameters(tau_mem_inv=torch.full(shape, 100.0), v_th=torch.ones(shape),
                               v_leak=torch.zeros(shape), v_reset=torch.zeros(shape))
    net = norse.SequentialState(torch.nn.Conv2d(2, 8, 3, padding=1), norse.LIFBoxCell(p),
                                torch.nn.Conv2d(8, 8, 3, padding=1),
                                norse.IAFCell(norse.IAFParameters(v_th=torch.ones(shape))))
    graph = to_nir(net, torch.zeros(1, 2, 8, 8))   # its Input keeps the batch axis: no
    nir.write(job['nir'], graph)                   # type inference can fill input_shape
    return {}


NORSE_READS = ('Input', 'Output', 'Affine', 'Linear', 'Conv2d', 'Flatten', 'IF', 'LIF', 'CubaLIF',
               'SumPool2d')


def norse_read(job):
    import nir
    import norse.torch as norse
    import torch
    torch.set_default_dtype(torch.float64)
    missing = {type(n).__name__ for n in nir.read(job['nir']).nodes.values()} - set(NORSE_READS)
    if missing:
        raise NotImplementedError(f'norse.torch.from_nir (1.1.0) maps no {sorted(missing)} node '
                                  f'(it builds nothing for it)')
    per_sample = []
    for xs in _unbatched(job, torch.float64):
        net = norse.from_nir(nir.read(job['nir']), dt=job['dt']).double()
        neurons = {name: mod for name, mod in net.named_children()
                   if type(mod).__name__ in ('LIFBoxCell', 'IAFCell', 'CubaLIF', 'LIBoxCell')}
        records = _recorder(neurons, pick=lambda out: out[0])
        state = None
        with torch.no_grad():
            for x in xs:
                _, state = net(x, state)
        per_sample.append({name: np.stack(r) for name, r in records.items()})
    return _stack_samples(per_sample)


# --------------------------------------------------------------------------- Sinabs
def sinabs_network(case: str, batch: int):
    import sinabs.layers as sl
    from sinabs.activation import MembraneSubtract, SingleSpike
    from torch import nn

    def iaf():
        return sl.IAFSqueeze(batch_size=batch, spike_fn=SingleSpike, reset_fn=MembraneSubtract(),
                             min_v_mem=None)

    if case == 'conv-IAF-sumpool':
        return nn.Sequential(nn.Conv2d(2, 8, 5, stride=2, padding=1), iaf(),
                             nn.Conv2d(8, 8, 3, padding=1), iaf(), sl.SumPool2d(2), nn.Flatten(),
                             nn.Linear(8 * 4 * 4, 10), iaf())
    if case == 'paper CNN at 18x18':
        return nn.Sequential(nn.Conv2d(2, 16, 5, stride=2, padding=1), iaf(),
                             nn.Conv2d(16, 16, 3, padding=1), iaf(), sl.SumPool2d(2),
                             nn.Conv2d(16, 8, 3, padding=1), iaf(), sl.SumPool2d(2), nn.Flatten(),
                             nn.Linear(8 * 2 * 2, 32), iaf(), nn.Linear(32, 10), iaf())
    if case == 'grouped conv, no bias':
        return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, bias=False), iaf(),
                             nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2), iaf(), nn.Flatten(),
                             nn.Linear(8 * 4 * 4, 10), iaf())
    raise KeyError(case)


def sinabs_write(job):
    import nir
    import sinabs.layers as sl
    import torch
    from sinabs.nir import to_nir
    torch.manual_seed(job['seed'])
    xs = _inputs(job, torch.float32)                           # (T, B, C, H, W)
    t, b = xs.shape[:2]
    net = sinabs_network(job['case'], b)
    with torch.no_grad():
        for mod in net.modules():          # weights large enough to make the layers fire
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                mod.weight.mul_(3.0)
    graph = _writable(to_nir(net, torch.zeros((b,) + tuple(xs.shape[2:]))))
    nir.write(job['nir'], graph)
    for mod in net.modules():
        if isinstance(mod, sl.IAFSqueeze):
            mod.reset_states()
    records = _recorder(_neurons_of(net, (sl.IAFSqueeze,)))
    with torch.no_grad():
        net(xs.transpose(0, 1).reshape((b * t,) + tuple(xs.shape[2:])))
    return {name: np.swapaxes(np.concatenate(r).reshape((b, t) + r[0].shape[1:]), 0, 1)
            for name, r in records.items()}


TASKS = {('snntorch', 'write'): snntorch_write, ('snntorch', 'read'): snntorch_read,
         ('norse', 'write'): norse_write, ('norse', 'read'): norse_read,
         ('sinabs', 'write'): sinabs_write}


def _inputs(job, dtype):
    import torch
    return torch.from_numpy(np.load(job['inputs'])).to(dtype)


def main(job_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    try:
        spikes = TASKS[job['peer'], job['task']](job)
        np.savez(job['spikes'], **spikes)
        result = {'ok': True, 'nodes': sorted(spikes)}
    except Exception as error:     # the peer's own error is the result: quoted in the table
        result = {'ok': False, 'error': f'{type(error).__name__}: {error}'.splitlines()[0][:300],
                  'traceback': traceback.format_exc()[-2000:]}
    with open(job['result'], 'w') as f:
        json.dump(result, f)


if __name__ == '__main__':
    main(sys.argv[1])
