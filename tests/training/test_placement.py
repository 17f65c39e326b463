"""The Trainer on several devices and on event data of any rank.

Data parallelism is checked on 4 virtual CPU devices in subprocesses (the device
count is fixed when JAX starts), in float64: a short ``fit`` of a 1-D conv net on
SHD-like data gives, on 4 devices, the parameters of 1 device for ES-D-RTRL, BPTT and
online chunks, the compiled step is partitioned, a run resumes on another device
count, and two processes on this machine (``jax.distributed`` with CPU collectives)
train as one process with the same 4 devices. In-process tests cover the ``devices``
argument and streamed datasets.
"""
import functools
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import brainstate
import jax
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import (EventDataset, StreamingEventDataset, events_to_frames,
                                  synthetic_shd)
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import Trainer

N_DEVICES = 4
# Shared by the workers and the in-process tests: SHD-like data over 48 channels.
SETUP = textwrap.dedent("""
    import json, re, sys, warnings
    import brainstate, jax, numpy as np, optax
    import braintrace_conv as bc
    from braintrace_conv.data import synthetic_shd
    from braintrace_conv.models import recurrent_conv_snn
    from braintrace_conv.training import Trainer, weighted_cross_entropy
    from braintrace_conv.training.placement import DataParallel
    brainstate.environ.set(precision=64)
    jax.config.update('jax_enable_x64', True)

    data, _ = synthetic_shd(36, T=6, n_channels=48, num_classes=3, duration_ms=60.0,
                            band_rate_hz=400.0, seed=0)
    train, test = data.split(1 / 3, seed=0)               # 24 and 12 samples

    def trainer(algorithm, devices, **kwargs):
        brainstate.random.seed(0)
        model = recurrent_conv_snn(train.frame_shape, 3, channels=(2, 4), kernel_size=5, pool=2)
        learner = bc.BPTT(model) if algorithm == 'BPTT' else bc.ES_D_RTRL(model)
        return Trainer(learner, optax.adam(1e-2), devices=devices, **kwargs)

    def fit(tr, **kwargs):   # eval batches of 5: never a multiple of 4 devices
        kwargs = dict(dict(epochs=1, batch_size=8, eval_dataset=test, eval_batch_size=5,
                           progress=False), **kwargs)
        tr.fit(train, **kwargs)
        return tr

    def params(tr):
        return tr.params()
""")

LOCAL = SETUP + textwrap.dedent("""
    out = sys.argv[1]

    def compare(a, b):
        pa, pb = params(a), params(b)
        rel = lambda x, y: float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-300))
        return dict(params=max(rel(pa[k], pb[k]) for k in pa),
                    train_loss=max(abs(x['train_loss'] - y['train_loss']) / x['train_loss']
                                   for x, y in zip(a.history, b.history)),
                    test_loss=max(abs(x['test_loss'] - y['test_loss']) / x['test_loss']
                                  for x, y in zip(a.history, b.history)),
                    test_accuracy=[(x['test_accuracy'], y['test_accuracy'])
                                   for x, y in zip(a.history, b.history)])

    result = {'devices': len(jax.devices())}
    # ES-D-RTRL: two epochs on 1 device against epoch 1 on 4 devices resumed on 2 for epoch 2
    one = fit(trainer('ES_D_RTRL', 1), epochs=2)
    fit(trainer('ES_D_RTRL', 4), out_dir=out + '/run')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        resumed = fit(trainer('ES_D_RTRL', 2), epochs=2, out_dir=out + '/run', resume=True)
    result['ES_D_RTRL'] = compare(one, resumed)
    result['resume_warnings'] = [str(w.message) for w in caught]
    # on the same 4 devices, an interrupted run resumes bitwise
    straight = fit(trainer('ES_D_RTRL', 4), epochs=2)
    fit(trainer('ES_D_RTRL', 4), out_dir=out + '/run4')
    again = fit(trainer('ES_D_RTRL', 4), epochs=2, out_dir=out + '/run4', resume=True)
    result['resume_bitwise'] = all(np.array_equal(v, params(again)[k])
                                   for k, v in params(straight).items())
    for name, algorithm, kwargs in [('BPTT', 'BPTT', {}),
                                    ('online', 'ES_D_RTRL', dict(update_every=4))]:
        one, four = fit(trainer(algorithm, 1, **kwargs)), fit(trainer(algorithm, 4, **kwargs))
        result[name] = compare(one, four)
        if name == 'online':
            np.savez(out + '/online.npz', **params(four))
        hidden = four.model.blocks[0].neuron.V.value          # left by the last evaluation
        result[name]['hidden_shards'] = sorted({s.data.shape for s in hidden.addressable_shards})
        # the compiled whole-sequence step: every device runs B / 4 samples, one all-reduce
        xs, labels = next(train.batches(8, shuffle=False))
        parallel = DataParallel(four.devices)          # the trainer's placement, rebuilt
        xs, step_labels = parallel.shard((xs, np.broadcast_to(labels, (train.num_steps,) + labels.shape)))
        step_weights = parallel.replicate(np.full(train.num_steps, 1 / train.num_steps))
        hlo = four.learner.lower(weighted_cross_entropy, xs,
                                 (step_labels, step_weights)).compile().as_text()
        result[name].update(
            all_reduces=len(re.findall(r'all-reduce\\(', hlo)),
            conv1_batches=sorted({int(b) for b in re.findall(r'f64\\[(\\d+),2,48\\]', hlo)}),
            param_devices=sorted({len(st.value.sharding.device_set) for st in
                                  four.model.states(brainstate.ParamState).values()}))
    errors = []
    for call in (lambda: fit(trainer('BPTT', 4), batch_size=6),
                 lambda: trainer('BPTT', 4).train_batch(*next(train.batches(6)))):
        try:
            call()
        except ValueError as error:
            errors.append(str(error))
    result['errors'] = errors

    from braintrace_conv.cli import main
    shd = ['train', '--task', 'shd', '--samples', '24', '--steps', '6', '--epochs', '1',
           '--batch-size', '8', '--channels', '2,4', '--quiet']
    result['cli'] = main([*shd, '--devices', '4', '--out', out + '/cli'])
    result['cli_devices'] = json.load(open(out + '/cli/metrics.json'))['devices']
    result['cli_indivisible'] = main([*shd, '--devices', '3', '--out', out + '/cli3'])
    print(json.dumps(result))
""")

# jax.distributed.initialize must come before anything starts JAX's backend
DISTRIBUTED = textwrap.dedent("""
    import sys
    import jax
    process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=f'localhost:{port}', num_processes=2,
                               process_id=process, initialization_timeout=120,
                               shutdown_timeout_seconds=30)
""") + SETUP + textwrap.dedent("""
    tr = fit(trainer('ES_D_RTRL', None, update_every=4), out_dir=out + '/distributed')
    if process == 0:
        np.savez(out + '/distributed.npz', **params(tr))
    print(json.dumps(dict(process=process, devices=len(tr.devices),
                          local=len(jax.local_devices()), history=tr.history)))
""")


def _env(devices):
    return dict(os.environ, JAX_PLATFORMS='cpu',
                XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                          f'--xla_force_host_platform_device_count={devices}')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """The 4-device worker and the two processes of the distributed one, run concurrently
    (their output goes to files: a full pipe would stall a process its peer waits for)."""
    out = tmp_path_factory.mktemp('devices')
    port = str(_free_port())
    commands = [([LOCAL, str(out)], N_DEVICES)] + [
        ([DISTRIBUTED, str(i), port, str(out)], N_DEVICES // 2) for i in range(2)]
    procs = []
    for i, (args, devices) in enumerate(commands):
        with open(out / f'{i}.out', 'w') as stdout, open(out / f'{i}.err', 'w') as stderr:
            procs.append(subprocess.Popen([sys.executable, '-c', *args], env=_env(devices),
                                          stdout=stdout, stderr=stderr))
    deadline = time.monotonic() + 600
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() for p in procs):      # one failed: its peer would wait for it
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    results = []
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, (out / f'{i}.err').read_text()[-3000:]
        results.append(json.loads((out / f'{i}.out').read_text().strip().splitlines()[-1]))
    return out, results[0], results[1:]


@pytest.mark.parametrize('name', ['ES_D_RTRL', 'BPTT', 'online'])
def test_four_devices_train_as_one(runs, name):
    _, local, _ = runs
    assert local['devices'] == N_DEVICES
    run = local[name]
    assert run['params'] < 1e-9 and run['train_loss'] < 1e-9 and run['test_loss'] < 1e-9, run
    assert all(a == b for a, b in run['test_accuracy'])


@pytest.mark.parametrize('name', ['BPTT', 'online'])
def test_the_compiled_step_is_partitioned(runs, name):
    run = runs[1][name]
    assert run['all_reduces'] > 0                        # gradients: partial sums combined
    assert run['conv1_batches'] == [8 // N_DEVICES]      # each device convolves 2 of 8 samples
    assert run['hidden_shards'] == [[8 // N_DEVICES, 2, 48]]    # padded eval batch 5 -> 8
    assert run['param_devices'] == [N_DEVICES]           # parameters replicated


def test_resume_on_the_same_devices_is_bitwise_on_others_warns(runs):
    assert runs[1]['resume_bitwise']                 # the same 4 devices: bitwise
    warnings = runs[1]['resume_warnings']
    assert len(warnings) == 1 and 'was trained on 4 device(s), this Trainer has 2' in warnings[0]
    assert 'up to the rounding of the gradient' in warnings[0]


def test_batch_size_not_a_multiple_of_the_devices(runs):
    fit_error, batch_error = runs[1]['errors']
    assert fit_error == ('batch_size must be a multiple of the number of devices (4), got 6; each '
                         'device takes an equal share of the batch: use a multiple of 4 such as '
                         '4, or other devices (Trainer(..., devices=...)).')
    assert batch_error.startswith('the batch size B of xs (T, B, ...) must be a multiple of the '
                                  'number of devices (4)')


def test_command_line_on_four_devices(runs):
    local = runs[1]
    assert local['cli'] == 0 and local['cli_devices'] == N_DEVICES
    assert local['cli_indivisible'] == 2


def test_two_processes_train_as_one_process(runs):
    out, _, processes = runs
    assert [(p['process'], p['devices'], p['local']) for p in processes] == [(0, 4, 2), (1, 4, 2)]
    for record in (p['history'][0] for p in processes):       # metrics gathered to both
        record.pop('epoch_time_s')
    assert processes[0]['history'] == processes[1]['history']
    a, b = np.load(out / 'online.npz'), np.load(out / 'distributed.npz')
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-9, atol=1e-12 * np.abs(a[k]).max())
    assert (out / 'distributed' / 'checkpoint-last.npz').is_file()   # written by process 0


# ----------------------------------------------------------------------------- one device
def shd(n=24):
    data, recordings = synthetic_shd(n, T=6, n_channels=48, num_classes=3, duration_ms=60.0,
                                     band_rate_hz=400.0, seed=0)
    return data, recordings


def conv1d_trainer(devices=None, **kwargs):
    brainstate.random.seed(0)
    model = recurrent_conv_snn((1, 48), 3, channels=(2, 4), kernel_size=5, pool=2)
    return Trainer(bc.ES_D_RTRL(model), optax.adam(1e-2), devices=devices, **kwargs)


@pytest.mark.parametrize('devices, error, match', [
    (0, ValueError, r'devices must be between 1 and the 1 available device\(s\) \(cpu\), got 0'),
    (2, ValueError, 'XLA_FLAGS=--xla_force_host_platform_device_count=2 set before JAX'),
    ('cpu', TypeError, 'devices must be None .*, got \'cpu\''),
    ([], TypeError, 'non-empty sequence of jax.Device'),
    (lambda: jax.devices() * 2, ValueError, 'devices must be distinct'),
])
def test_devices_argument(devices, error, match):
    with pytest.raises(error, match=match):
        conv1d_trainer(devices() if callable(devices) else devices)


def test_one_device_is_the_default():
    for devices in (None, 1, jax.devices()):
        tr = conv1d_trainer(devices)
        assert tr.devices == tuple(jax.devices()) and tr.mesh.axis_names == ('batch',)


def test_a_streamed_dataset_trains_as_the_same_data_in_memory():
    data, recordings = shd()
    to_frames = functools.partial(events_to_frames, sensor_size=(48, 1, 1), time_window_us=1e4,
                                  n_time_bins=6, t_start_us=0)
    streamed = StreamingEventDataset(range(len(recordings)), data.labels,
                                     read=recordings.__getitem__, to_frames=to_frames,
                                     num_classes=3, cache_size=4)
    np.testing.assert_array_equal(streamed.to_memory().events, data.events)
    a, b = conv1d_trainer(), conv1d_trainer()
    a.fit(data, epochs=1, batch_size=8, eval_dataset=data, progress=False)
    b.fit(streamed, epochs=1, batch_size=8, eval_dataset=streamed, progress=False)
    assert a.history[0]['train_loss'] == b.history[0]['train_loss']
    assert a.history[0]['test_accuracy'] == b.history[0]['test_accuracy']
    for name, value in a.params().items():
        np.testing.assert_array_equal(value, b.params()[name])


def test_streamed_frames_are_checked_batch_by_batch():
    data, recordings = shd(8)

    def to_frames(events):     # a user's binning that goes wrong
        frames = events_to_frames(events, sensor_size=(48, 1, 1), n_time_bins=6)
        frames[2, 0, 7] = np.nan
        return frames

    streamed = StreamingEventDataset(range(8), data.labels, read=recordings.__getitem__,
                                     to_frames=to_frames, num_classes=3)
    tr = conv1d_trainer()
    before = tr.params()
    with pytest.raises(ValueError, match=r'train_dataset events \(batch 0\) must be finite, got '
                                         r'nan at t=2, b=0, channel=0, position=7'):
        tr.fit(streamed, epochs=1, batch_size=8, progress=False, seed=0)
    assert tr.updates == 0 and all(np.array_equal(value, tr.params()[name])
                                   for name, value in before.items())


def test_in_memory_events_of_any_rank_name_the_bad_position():
    data, _ = shd(8)
    events = np.array(data.events)
    events[3, 1, 0, 40] = np.inf
    tr = conv1d_trainer()
    with pytest.raises(ValueError, match='train_dataset events must be finite, got inf at '
                                         'sample=3, t=1, channel=0, position=40'):
        tr.fit(EventDataset(events, data.labels, 3), epochs=1, batch_size=8, progress=False)
