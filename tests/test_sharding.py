"""Data parallelism: batch-sharded gradients equal single-device ones, and XLA partitions them,
for every executor, with and without windows.

The multi-device checks run in a subprocess because the number of virtual
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``) is
fixed when JAX starts.
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from braintrace_conv.sharding import BATCH_AXIS_NAME, data_mesh, shard_batch

N_DEVICES = 4
T, B = 6, 8
ALGORITHMS = ["BPTT", "D_RTRL", "ES_D_RTRL", "D_RTRL_window", "ES_D_RTRL_window"]

WORKER = textwrap.dedent(f"""
    import json, math, re
    import brainstate, jax, jax.numpy as jnp, numpy as np
    import braintrace_conv as bc
    from braintrace_conv import nn
    from braintrace_conv.sharding import data_mesh, shard_batch
    brainstate.environ.set(precision=64)
    jax.config.update('jax_enable_x64', True)

    class Net(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(2, 4, 3, layout='channels_first')
            self.lif1 = nn.LIF((4, 8, 8), tau=5.0)
            self.conv2 = nn.Conv2d(4, 4, 3, stride=2, layout='channels_first')
            self.lif2 = nn.LIF((4, 4, 4), tau=5.0)
            self.flat = nn.Flatten()
            self.fc = nn.Linear(64, 3)

        def update(self, x):
            return self.fc(self.flat(self.lif2(self.conv2(self.lif1(self.conv1(x))))))

    def loss_fn(scores, labels):
        return -jnp.mean(jax.nn.log_softmax(scores)[jnp.arange(scores.shape[0]), labels])

    rng = np.random.default_rng(0)
    xs = rng.random(({T}, {B}, 2, 8, 8)) * 2
    labels = rng.integers(0, 3, ({T}, {B}))
    xs_sharded, labels_sharded = shard_batch((xs, labels), data_mesh())
    brainstate.random.seed(0)
    net = Net()
    result = {{'devices': len(jax.devices())}}
    for name, make in [('BPTT', bc.BPTT), ('D_RTRL', bc.D_RTRL),
                       ('ES_D_RTRL', lambda m: bc.ES_D_RTRL(m, decay=math.exp(-1 / 5))),
                       # windows of 4 steps: one whole window and a shorter last one
                       ('D_RTRL_window', lambda m: bc.D_RTRL(m, window=4)),
                       ('ES_D_RTRL_window',
                        lambda m: bc.ES_D_RTRL(m, decay=math.exp(-1 / 5), window=4))]:
        learner = make(net)
        loss_one, grads_one = learner.value_and_grad(loss_fn, jnp.asarray(xs), jnp.asarray(labels))
        loss_all, grads_all = learner.value_and_grad(loss_fn, xs_sharded, labels_sharded)
        hlo = learner.lower(loss_fn, xs_sharded, labels_sharded).compile().as_text()
        result[name] = dict(
            loss_rel=abs(float(loss_all - loss_one)) / abs(float(loss_one)),
            grad_rel={{str(k): float(np.abs(np.asarray(grads_all[k]) - np.asarray(grads_one[k])).max()
                                    / np.abs(np.asarray(grads_one[k])).max()) for k in grads_one}},
            grad_devices=sorted({{len(g.sharding.device_set) for g in grads_all.values()}}),
            all_reduces=len(re.findall(r'all-reduce\\(', hlo)),
            # batch sizes of the first conv's output (B, 4, 8, 8) inside the compiled module
            conv1_batches=sorted({{int(b) for b in re.findall(r'f64\\[(\\d+),4,8,8\\]', hlo)}}),
        )
    try:
        shard_batch(np.ones((3, 6, 2)), data_mesh())
        result['indivisible'] = None
    except ValueError as error:
        result['indivisible'] = str(error)
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def sharded_run():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                         f"--xla_force_host_platform_device_count={N_DEVICES}")
    proc = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sharded_gradients_equal_single_device(sharded_run, algorithm):
    assert sharded_run["devices"] == N_DEVICES
    run = sharded_run[algorithm]
    assert run["loss_rel"] < 1e-12
    assert len(run["grad_rel"]) == 6  # conv1, conv2 (kernel, bias), fc (weight, bias)
    assert max(run["grad_rel"].values()) < 1e-9, run["grad_rel"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_compiled_computation_is_partitioned(sharded_run, algorithm):
    run = sharded_run[algorithm]
    # Gradients are batch sums: partial sums per device, combined by all-reduce ...
    assert run["all_reduces"] > 0
    assert run["grad_devices"] == [N_DEVICES]
    # ... and every device convolves only its B / 4 samples.
    assert run["conv1_batches"] == [B // N_DEVICES]


def test_shard_batch_places_the_batch_axis():
    mesh = data_mesh(jax.devices()[:1])
    assert mesh.axis_names == (BATCH_AXIS_NAME,) and mesh.size == 1
    xs = shard_batch(np.ones((3, 4, 2)), mesh)
    labels = shard_batch(np.arange(4), mesh, batch_axis=0)
    assert xs.sharding.spec == jax.sharding.PartitionSpec(None, BATCH_AXIS_NAME, None)
    assert labels.sharding.spec == jax.sharding.PartitionSpec(BATCH_AXIS_NAME)
    np.testing.assert_array_equal(labels, np.arange(4))


def test_shard_batch_validation():
    mesh = data_mesh(jax.devices()[:1])
    with pytest.raises(ValueError, match="batch_axis=1 does not exist in an array of shape"):
        shard_batch(np.arange(4), mesh)
    with pytest.raises(ValueError, match="must have an axis named 'batch'"):
        shard_batch(np.ones((2, 4)), jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)))
    with pytest.raises(TypeError, match="non-empty sequence of jax.Device"):
        data_mesh([])


def test_indivisible_batch_is_rejected_with_the_device_count(sharded_run):
    assert sharded_run["indivisible"] == (
        "batch size 6 (axis 1 of shape (3, 6, 2)) is not divisible by the 4 devices of the "
        "mesh; use a batch size that is a multiple of 4 (e.g. batches(..., drop_last=True))")
