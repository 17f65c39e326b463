"""Where the :class:`~braintrace_conv.training.Trainer` puts arrays: data parallelism.

A trainer runs on a one-axis :class:`jax.sharding.Mesh` of devices
(:func:`braintrace_conv.sharding.data_mesh`). Parameters and optimiser state
are *replicated*: every device holds all of them. Each batch ``xs (T, B,
*frame_shape)`` and its labels ``(T, B)`` are *sharded* along ``B``: device
``i`` of ``n`` receives samples ``i B / n`` to ``(i + 1) B / n - 1``, so ``B``
must be a multiple of ``n``. XLA then partitions every jitted step: each
device scans its own samples and the parameter gradients, sums over the
batch, are combined by an all-reduce.

With several processes (``jax.distributed.initialize``), the mesh spans the
devices of every process; each process passes the same global batch and
transfers only the rows its own devices hold, and results are gathered to
every process for metrics.
"""
from __future__ import annotations

import operator
from typing import Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._validation import ArgumentError
from ..sharding import data_mesh, shard_batch

__all__ = ['Devices', 'DataParallel', 'device_mesh', 'to_host', 'sync_processes']

#: What ``Trainer(devices=...)`` accepts.
Devices = Union[None, int, Sequence[jax.Device]]


def device_mesh(devices: Devices = None) -> Mesh:
    """The mesh of ``devices``: ``None`` all of ``jax.devices()``, an int ``n`` the first
    ``n`` of them, or a sequence of distinct ``jax.Device``.

    Raises:
      ValueError: ``n`` is not between 1 and the number of devices, a device repeats, or
        (with several processes) the mesh has no device of this process.
      TypeError: ``devices`` is neither ``None``, an int nor a sequence of devices.
    """
    available = jax.devices()
    if devices is None:
        chosen = list(available)
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(available):
            raise ArgumentError(
                'devices', devices, f'be between 1 and the {len(available)} available '
                                    f'device(s) ({available[0].platform})',
                f'on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count='
                f'{max(int(devices), 1)} set before JAX starts makes that many devices')
        chosen = list(available[:operator.index(devices)])
    else:
        try:
            chosen = list(devices)
        except TypeError:
            chosen = None
        if (isinstance(devices, (str, bool)) or not chosen
                or not all(isinstance(d, jax.Device) for d in chosen)):
            raise TypeError(f'devices must be None (all), a number of devices or a non-empty '
                            f'sequence of jax.Device, got {devices!r}.')
        if len(set(chosen)) != len(chosen):
            raise ValueError(f'devices must be distinct, got {chosen}.')
    if jax.process_count() > 1 and not any(d.process_index == jax.process_index()
                                           for d in chosen):
        raise ValueError(f'devices {chosen} include none of process {jax.process_index()}\'s; '
                         f'with several processes give devices=None (all of them).')
    return data_mesh(chosen)


class DataParallel:
    """Replicate and shard arrays over the mesh of ``devices`` (see :func:`device_mesh`).

    On JAX's default device alone (one process) arrays are left uncommitted,
    exactly as a plain single-device computation leaves them, so jitted steps
    see one placement and compile once.

    Attributes:
      mesh (jax.sharding.Mesh): One-axis mesh (axis ``'batch'``).
      devices (tuple of jax.Device): Its devices, in order.
    """

    def __init__(self, devices: Devices = None):
        self.mesh = device_mesh(devices)
        self.devices = tuple(self.mesh.devices.flat)
        self._place = not (self.devices == (jax.devices()[0],) and jax.process_count() == 1)

    def replicate(self, tree):
        """Every array of ``tree`` whole on every device. Host arrays must be equal on
        every process (e.g. parameters initialised from the same seed)."""
        if not self._place:
            return jax.tree.map(jnp.asarray, tree)
        return jax.device_put(tree, NamedSharding(self.mesh, PartitionSpec()))

    def shard(self, tree):
        """Every array of ``tree``, time-major ``(T, B, ...)``, split along ``B``."""
        if not self._place:
            return jax.tree.map(jnp.asarray, tree)
        return shard_batch(tree, self.mesh)

    def padded_size(self, batch_size: int) -> int:
        """``batch_size`` rounded up to a multiple of the number of devices."""
        return -(-batch_size // len(self.devices)) * len(self.devices)

    def check_batch_size(self, name: str, batch_size: int) -> None:
        """Raise an ``ArgumentError`` naming ``name`` unless ``batch_size`` is a multiple of
        the number of devices."""
        n = len(self.devices)
        if batch_size % n:
            raise ArgumentError(
                name, batch_size, f'be a multiple of the number of devices ({n})',
                f'each device takes an equal share of the batch: use a multiple of {n} such as '
                f'{max(n, batch_size // n * n)}, or other {{devices}}', refs=('devices',),
                names={'devices': 'devices (Trainer(..., devices=...))'})


def to_host(array) -> np.ndarray:
    """A (possibly sharded) array as one NumPy array on this host, gathered from every
    process when other processes hold parts of it."""
    if getattr(array, 'is_fully_addressable', True):
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def sync_processes(name: str) -> None:
    """Wait until every process reaches this point (nothing to wait for with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
