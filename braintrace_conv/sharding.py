"""Data-parallel training on :mod:`jax.sharding`: split the batch over devices.

Every executor runs a whole sequence in one jitted computation. Given
inputs whose batch axis is sharded over several devices (and parameters
replicated, the default), XLA partitions that computation: each device
scans its own samples -- hidden states, traces and per-step signals stay
local, since samples never interact -- and the parameter gradients, sums
over the batch, are combined by one all-reduce. The result equals the
single-device gradient up to the order of floating-point summation.

    mesh = data_mesh()                                   # all devices
    xs = shard_batch(xs, mesh)                           # (T, B, ...) split along B
    targets = shard_batch(targets, mesh)                 # (T, B, ...) as well
    loss, grads = learner.value_and_grad(loss_fn, xs, targets)

``B`` must be a multiple of the number of devices (for the last, smaller
batch of an epoch, use ``dataset.batches(B, drop_last=True)``). On a CPU,
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before JAX
starts gives four virtual devices to try it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["BATCH_AXIS_NAME", "data_mesh", "shard_batch"]

#: Name of the mesh axis that the batch is split over.
BATCH_AXIS_NAME = "batch"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh over ``devices`` for splitting the batch.

    Args:
      devices (sequence of jax.Device, optional):
        Devices to use, in order; default all of ``jax.devices()``.

    Returns:
      jax.sharding.Mesh: Mesh with the single axis :data:`BATCH_AXIS_NAME` of size
        ``len(devices)``.
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError(f"devices must be a non-empty sequence of jax.Device, got {devices!r}")
    return Mesh(np.array(devices), (BATCH_AXIS_NAME,))


def shard_batch(tree, mesh: Mesh, *, batch_axis: int = 1):
    """Place every array of ``tree`` with its batch axis split over ``mesh``.

    Args:
      tree (pytree of arrays): Arrays with a batch axis at ``batch_axis``: time-major sequences
        ``(T, B, ...)`` (the default ``batch_axis=1``), or per-sample arrays
        such as labels ``(B,)`` with ``batch_axis=0``.
      mesh (jax.sharding.Mesh): A mesh from :func:`data_mesh` (axis :data:`BATCH_AXIS_NAME`).
      batch_axis (int, optional): Position of the batch axis ``B`` in every array.

    Returns:
      pytree of jax.Array: The same arrays, each sharded with
        ``NamedSharding(mesh, PartitionSpec(None, ..., 'batch'))``, so that device ``i``
        holds samples ``i * B / n`` to ``(i + 1) * B / n - 1`` of ``n`` devices.

    Raises:
      ValueError: ``mesh`` has no :data:`BATCH_AXIS_NAME` axis, an array has no axis
        ``batch_axis``, or ``B`` is not divisible by the number of devices.
    """
    if BATCH_AXIS_NAME not in mesh.shape:
        raise ValueError(
            f"mesh must have an axis named {BATCH_AXIS_NAME!r} (see data_mesh), got axes "
            f"{tuple(mesh.shape)}"
        )
    n_devices = mesh.shape[BATCH_AXIS_NAME]

    def place(array):
        shape = np.shape(array)
        if not -len(shape) <= batch_axis < len(shape):
            raise ValueError(
                f"batch_axis={batch_axis} does not exist in an array of shape {shape}"
            )
        batch = shape[batch_axis]
        if batch % n_devices:
            raise ValueError(
                f"batch size {batch} (axis {batch_axis} of shape {shape}) is not divisible "
                f"by the {n_devices} devices of the mesh; use a batch size that is a "
                f"multiple of {n_devices} (e.g. batches(..., drop_last=True))"
            )
        spec = [None] * len(shape)
        spec[batch_axis] = BATCH_AXIS_NAME
        return jax.device_put(array, NamedSharding(mesh, PartitionSpec(*spec)))

    return jax.tree.map(place, tree)
