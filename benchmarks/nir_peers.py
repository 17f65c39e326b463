"""NIR parity with snnTorch, Norse and Sinabs: the same spikes at every step, both directions.

*peer -> here*: a conv net built in the peer is exported by the peer to a NIR file, loaded
here with :func:`braintrace_conv.nir.load`, and both run on the same input spikes; every
spiking layer's output is compared at every step. *here -> peer*: a conv net of this library
is exported with :func:`braintrace_conv.nir.export`, loaded by the peer's importer, and
compared the same way. Both sides run in float64 where the peer lets them (Norse's and
Sinabs' importers cast to float32 first). A peer that cannot write or read a case gets a
row with its error, quoted.

The peers run in their own Pythons (``nir_peer_side.py``), so torch never enters this
process. Sinabs 3.1 pins ``nir<=1.0.4`` and so needs its own environment::

    python3 -m venv --system-site-packages peers-venv
    peers-venv/bin/pip install "torch==2.13.0+cpu"
    peers-venv/bin/pip install snntorch norse -c <(echo "torch==2.13.0+cpu")
    python3 -m venv --system-site-packages peers-venv-sinabs
    peers-venv-sinabs/bin/pip install "torch==2.13.0+cpu"
    peers-venv-sinabs/bin/pip install sinabs -c <(echo "torch==2.13.0+cpu")

    python benchmarks/nir_peers.py                 # tables, and benchmarks/results/nir_peers.json
    python benchmarks/nir_peers.py --steps 20      # shorter

``tests/nir/test_peers.py`` (``pytest -m nir_peers``) runs the same cases and asserts them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from results_file import default_path, write_results  # noqa: E402

PYTHONS = {'snntorch': os.path.join(ROOT, 'peers-venv', 'bin', 'python'),
           'norse': os.path.join(ROOT, 'peers-venv', 'bin', 'python'),
           'sinabs': os.path.join(ROOT, 'peers-venv-sinabs', 'bin', 'python')}


@dataclasses.dataclass
class Case:
    direction: str            # 'peer -> here' or 'here -> peer'
    peer: str
    name: str
    input_shape: tuple        # one sample, channels first
    options: dict             # load() options (peer -> here) or export() options (here -> peer)
    note: str = ''            # the convention the options follow


CASES = [
    Case('peer -> here', 'snntorch', 'conv-Leaky-avgpool (reset to zero)', (2, 8, 8), {'dt': 1e-4},
         'snnTorch runs every graph at dt = 1e-4 s'),
    Case('peer -> here', 'snntorch', 'conv-Synaptic (reset by subtraction)', (2, 8, 8),
         {'dt': 1e-4, 'reset': 'subtract_after_leak'},
         'snnTorch writes its subtract reset as v_reset = 0; reset_delay=True subtracts after the leak'),
    Case('peer -> here', 'snntorch', 'conv-Leaky (reset by subtraction, reset_delay=False)', (2, 8, 8),
         {'dt': 1e-4, 'reset': 'subtract'}, 'snnTorch writes its subtract reset as v_reset = 0'),
    Case('peer -> here', 'snntorch', 'conv-Leaky-RLeaky (a cycle)', (2, 8, 8), {'dt': 1e-4},
         'RLeaky with reset_delay=False, as snnTorch\'s importer builds it'),
    Case('peer -> here', 'snntorch', 'recurrent conv (RLeaky with a conv)', (2, 8, 8), {'dt': 1e-4}),
    Case('peer -> here', 'norse', 'conv-LIFBox-IAF', (2, 8, 8), {'dt': 1e-3}),
    Case('peer -> here', 'sinabs', 'conv-IAF-sumpool', (2, 18, 18), {'dt': 1e-3, 'reset': 'subtract'},
         'Sinabs writes its subtract-reset IAF as IF'),
    Case('peer -> here', 'sinabs', 'paper CNN at 18x18', (2, 18, 18), {'dt': 1e-3, 'reset': 'subtract'},
         'Sinabs writes its subtract-reset IAF as IF'),
    Case('peer -> here', 'sinabs', 'grouped conv, no bias', (2, 8, 8), {'dt': 1e-3, 'reset': 'subtract'},
         'Sinabs writes its subtract-reset IAF as IF'),
    Case('here -> peer', 'snntorch', 'conv-LIF-avgpool, channels first', (2, 8, 8), {'dt': 1e-4},
         'export at snnTorch\'s dt = 1e-4 s'),
    Case('here -> peer', 'snntorch', 'conv-CubaLIF, channels last', (2, 8, 8), {'dt': 1e-4},
         'export at snnTorch\'s dt = 1e-4 s'),
    Case('here -> peer', 'snntorch', 'brainstate.nn layers, LIF', (2, 8, 8), {'dt': 1e-4},
         'export at snnTorch\'s dt = 1e-4 s'),
    Case('here -> peer', 'snntorch', 'conv-IF', (2, 8, 8), {'dt': 1e-4}),
    Case('here -> peer', 'norse', 'conv-LIF, channels first', (2, 8, 8), {'dt': 1e-3, 'unit_r': True},
         'Norse runs LIF as if r = 1: export with unit_r=True'),
    Case('here -> peer', 'norse', 'conv-CubaLIF, channels last', (2, 8, 8), {'dt': 1e-3}),
    Case('here -> peer', 'norse', 'conv-IF', (2, 8, 8), {'dt': 1e-3}),
    Case('here -> peer', 'norse', 'conv-LIF-avgpool, channels first', (2, 8, 8),
         {'dt': 1e-3, 'unit_r': True}),
]


# --------------------------------------------------------------------------- our networks
def our_network(name: str, dt: float):
    """The networks of this library written for the peers; time constants in steps of dt."""
    import brainstate
    import jax.numpy as jnp
    from braintrace_conv import nn

    ms = dt * 1e3            # this library's plain time constants are in ms

    class Chain(brainstate.nn.Module):
        def __init__(self, **layers):
            super().__init__()
            for key, layer in layers.items():
                setattr(self, key, layer)
            self.names = tuple(layers)

        def update(self, x):
            for key in self.names:
                x = getattr(self, key)(x)
            return x

    brainstate.random.seed(7)
    if name in ('conv-LIF-avgpool, channels first', 'conv-LIF, channels first'):
        pool = name.startswith('conv-LIF-avgpool')
        side = 4 if pool else 8
        layers = dict(conv1=nn.Conv2d(2, 8, 3, layout='channels_first', b_init=jnp.full(8, 0.05)),
                      lif1=nn.LIF((8, 8, 8), tau=5 * ms, reset='zero'))
        if pool:
            layers['pool'] = nn.AvgPool2d(2, layout='channels_first')
        layers.update(conv2=nn.Conv2d(8, 8, 3, layout='channels_first'),
                      lif2=nn.LIF((8, side, side), tau=8 * ms, reset='zero'),
                      flat=nn.Flatten(), fc=nn.Linear(8 * side * side, 10),
                      lif3=nn.LIF(10, tau=10 * ms, reset='zero'))
        return Chain(**layers)
    if name == 'conv-CubaLIF, channels last':
        return Chain(conv1=nn.Conv2d(2, 8, 3), cuba1=nn.CubaLIF((8, 8, 8), tau=5 * ms, tau_syn=2 * ms,
                                                                reset='zero'),
                     conv2=nn.Conv2d(8, 8, 3, stride=2, padding=1),
                     cuba2=nn.CubaLIF((4, 4, 8), tau=6 * ms, tau_syn=3 * ms, reset='zero'),
                     flat=nn.Flatten(), fc=nn.Linear(128, 10),
                     cuba3=nn.CubaLIF(10, tau=8 * ms, tau_syn=2 * ms, reset='zero'))
    if name == 'brainstate.nn layers, LIF':
        return Chain(conv=brainstate.nn.Conv2d((8, 8, 2), 8, 3, padding='SAME'),
                     lif1=nn.LIF((8, 8, 8), tau=4 * ms, reset='zero'),
                     pool=brainstate.nn.AvgPool2d(2, 2), flat=brainstate.nn.Flatten(start_axis=1),
                     fc=brainstate.nn.Linear(128, 10, w_init=nn.FanInNormal(8.0)),
                     lif2=nn.LIF(10, tau=6 * ms, reset='zero'))
    if name == 'conv-IF':
        return Chain(conv1=nn.Conv2d(2, 8, 5, stride=2, padding=1, layout='channels_first'),
                     if1=nn.IF((8, 3, 3), reset='zero'),
                     conv2=nn.Conv2d(8, 8, 3, layout='channels_first'),
                     if2=nn.IF((8, 3, 3), reset='zero'), flat=nn.Flatten(), fc=nn.Linear(72, 10),
                     if3=nn.IF(10, reset='zero'))
    raise KeyError(name)


def channels_last(name: str) -> bool:
    return 'channels last' in name or 'brainstate' in name


def inputs(case: Case, steps: int, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((steps, batch) + case.input_shape) < 0.3).astype(np.float64)


# --------------------------------------------------------------------------- running here
def run_loaded(net, xs):
    """Spikes of every spiking node of a loaded graph, ``{node: (T, B, ...)}``."""
    import braintrace_conv as bc
    from braintrace_conv.nir import modules
    spiking = [k for k, layer in net.layers.items() if isinstance(layer, modules.SpikingNeuron)]
    _, seen = bc.BPTT(net).predict(xs, observe=lambda n: {k: n.layers[k].spike() for k in spiking})
    return {k: np.asarray(v) for k, v in seen.items()}


def run_ours(model, xs, dt: float):
    """Spikes of every neuron of one of our networks, channels first, ``{name: (T, B, ...)}``."""
    import brainstate
    import braintrace_conv as bc
    from braintrace_conv import nn
    names = [k for k in model.names if isinstance(getattr(model, k), nn.Neuron)]
    with brainstate.environ.context(dt=dt * 1e3):
        _, seen = bc.BPTT(model).predict(xs, observe=lambda m: {k: getattr(m, k).spike() for k in names})
    return {k: np.moveaxis(np.asarray(v), -1, 2) if v.ndim > 3 and channels_last_model(model) else
            np.asarray(v) for k, v in seen.items()}


def channels_last_model(model) -> bool:
    return getattr(model, '_channels_last', False)


def compare(ours: dict, theirs: dict) -> dict:
    """Per matched layer: steps x elements compared, spikes, mismatches, first bad step."""
    rows = {}
    for name, b in theirs.items():
        match = [k for k in ours if k == name or k.startswith(name + '.')]
        if not match:
            continue
        a = ours[match[0]]
        if a.shape != b.shape:
            rows[name] = {'error': f'shapes differ: here {a.shape}, peer {b.shape}'}
            continue
        bad = np.argwhere(a != b)
        rows[name] = {'elements': int(a.size), 'spikes': int(b.sum()), 'mismatches': int(len(bad)),
                      'first_bad_step': int(bad[0][0]) if len(bad) else None}
    return rows


# --------------------------------------------------------------------------- one case
def peer_job(case: Case, task: str, work: str, xs: np.ndarray, nir_path: str, seed: int) -> dict:
    python = PYTHONS[case.peer]
    if not os.path.exists(python):
        return {'ok': False, 'error': f'{case.peer} is not installed ({python} missing)',
                'skipped': True}
    np.save(os.path.join(work, 'inputs.npy'), xs)
    job = dict(peer=case.peer, task=task, case=case.name, nir=nir_path, seed=seed,
               inputs=os.path.join(work, 'inputs.npy'), spikes=os.path.join(work, 'spikes.npz'),
               result=os.path.join(work, 'result.json'), dt=case.options.get('dt', 1e-3))
    with open(os.path.join(work, 'job.json'), 'w') as f:
        json.dump(job, f)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([python, os.path.join(HERE, 'nir_peer_side.py'), os.path.join(work, 'job.json')],
                          capture_output=True, text=True, env=env, timeout=600)
    if not os.path.exists(job['result']):
        return {'ok': False, 'error': f'the {case.peer} process failed: {proc.stderr[-500:]}'}
    with open(job['result']) as f:
        result = json.load(f)
    if result['ok']:
        result['spikes'] = dict(np.load(job['spikes']))
    return result


def run_case(case: Case, steps: int = 50, batch: int = 2, seed: int = 0) -> dict:
    """One case, either direction: the comparison per layer, or the peer's error."""
    from braintrace_conv import nir as bnir
    xs = inputs(case, steps, batch, seed)
    with tempfile.TemporaryDirectory() as work:
        nir_path = os.path.join(work, 'graph.nir')
        if case.direction == 'peer -> here':
            peer = peer_job(case, 'write', work, xs, nir_path, seed)
            if not peer['ok']:
                return {'error': peer['error'], 'skipped': peer.get('skipped', False)}
            ours = run_loaded(bnir.load(nir_path, **case.options), xs)
        else:
            dt = case.options['dt']
            model = our_network(case.name, dt)
            model._channels_last = channels_last(case.name)
            ours_x = np.moveaxis(xs, 2, -1) if model._channels_last else xs
            bnir.export(model, ours_x[0], path=nir_path, **case.options)
            ours = run_ours(model, ours_x, dt)
            peer = peer_job(case, 'read', work, xs, nir_path, seed)
            if not peer['ok']:
                return {'error': peer['error'], 'skipped': peer.get('skipped', False)}
    layers = compare(ours, peer['spikes'])
    return {'layers': layers, 'steps': steps, 'batch': batch,
            'identical': bool(layers) and all(r.get('mismatches') == 0 for r in layers.values())}


# --------------------------------------------------------------------------- main
def table(results: list) -> str:
    lines = ['| direction | peer | network | options | layers | spikes | mismatched steps x elements |'
             ' result |', '| --- | --- | --- | --- | ---: | ---: | ---: | --- |']
    for case, res in results:
        opts = ', '.join(f'{k}={v}' for k, v in case.options.items())
        if 'error' in res:
            lines.append(f'| {case.direction} | {case.peer} | {case.name} | {opts} | | | | '
                         f'{"not installed" if res.get("skipped") else "peer error: " + res["error"]} |')
            continue
        layers = res['layers'].values()
        lines.append(f'| {case.direction} | {case.peer} | {case.name} | {opts} | {len(res["layers"])} | '
                     f'{sum(r.get("spikes", 0) for r in layers)} | '
                     f'{sum(r.get("mismatches", 0) for r in layers)} / '
                     f'{sum(r.get("elements", 0) for r in layers)} | '
                     f'{"identical at every step" if res["identical"] else "DIFFER"} |')
    return '\n'.join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--out', default=default_path('nir_peers'))
    args = parser.parse_args(argv)
    import braintrace_conv as bc
    bc.use_float64()
    results = [(case, run_case(case, args.steps, args.batch)) for case in CASES]
    print(table(results))
    write_results(args.out, steps=args.steps, batch=args.batch, cases=[
        dict(dataclasses.asdict(case), **{k: v for k, v in res.items()}) for case, res in results])


if __name__ == '__main__':
    main()
