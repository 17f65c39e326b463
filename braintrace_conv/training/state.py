"""The state of a :class:`~braintrace_conv.training.Trainer` in a checkpoint: what is saved,
and a restore that checks everything before it changes anything.

A checkpoint (:mod:`braintrace_conv.training.checkpoint` is the file format) holds the
parameters' mantissas (``param/<name>``) with their units, the optimiser state
(``opt/<i>``), ``brainstate.random``'s key, and as metadata the epoch, the number of
updates (``step``, the name the format keeps), the skipped updates, the history, the best
epoch, the trainer's settings (``trainer``), the caller's run options (``run``), the
settings and data fingerprints of :meth:`~braintrace_conv.training.Trainer.fit`
(``fit``), the number of devices and the shuffling generator's state.

A run is continued only with the settings it was written with; the one exception is its
length: a larger ``epochs`` continues a finished run (:func:`run_differences`; a stream
run's ``max_steps`` likewise: :func:`~.stream_state.run_differences`).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from . import checkpoint, run_dir
from .fingerprint import data_change

__all__ = ['snapshot', 'restore', 'load_params', 'run_differences']


def snapshot(trainer) -> tuple[dict, dict]:
    """``(arrays, metadata)`` of ``trainer``'s state now: what
    :meth:`~braintrace_conv.training.Trainer.save_checkpoint` writes."""
    view = trainer._view
    arrays = {f'param/{name}': np.asarray(v) for name, v in view.named(view.mantissas()).items()}
    opt_arrays, opt_paths = checkpoint.tree_arrays('opt', trainer.opt_state)
    arrays.update(opt_arrays)
    arrays['rng/brainstate_key'] = np.asarray(jax.random.key_data(brainstate.random.get_key()))
    meta = dict(epoch=trainer.epoch, step=trainer.updates, skipped_updates=trainer.skipped_updates,
                history=trainer.history, best=trainer.best, trainer=trainer.config(),
                run=trainer.run_config, fit=trainer._fit_config, devices=len(trainer.devices),
                units={name: str(unit) for name, unit in zip(view.names, view.units)},
                opt_paths=opt_paths,
                rng=None if trainer._rng is None else trainer._rng.bit_generator.state)
    return arrays, meta


def run_differences(stored: dict, given: dict, epochs: int) -> dict:
    """``{option: (stored, given)}`` of the run options ``given`` that differ from those a
    run ``stored``, except a larger ``epochs``: when ``given['epochs']`` is ``epochs``, the
    length of the run being fitted, a run stored with fewer epochs is continued."""
    differences = checkpoint.config_differences(stored, given)
    old = stored.get('epochs')
    if given.get('epochs') == epochs and isinstance(old, int) and old <= epochs:
        differences.pop('epochs', None)
    return differences


class _Restored(NamedTuple):
    """A checkpoint's state, checked against the trainer it is restored into."""
    params: dict
    opt_state: object
    counts: dict
    meta: dict
    rng: Optional[np.random.Generator]
    key: jax.Array
    notes: list


def _read(trainer, path: Path, expected: dict, compare_run: Optional[Callable],
          datasets: Optional[dict]) -> _Restored:
    """The state in the checkpoint ``path``, every part checked; changes nothing."""
    arrays, meta = checkpoint.read(path)
    notes = []
    for key, given in expected.items():
        if key == 'fit' and datasets:
            notes = _check_fit(meta, given, datasets, path)
        elif key == 'run' and compare_run is not None:
            differences = compare_run(checkpoint.field(meta, 'run', dict, path), given)
            if differences:
                raise checkpoint.ConfigMismatchError(path, differences)
        else:
            checkpoint.check_config(meta, key, given, path)
    params = checkpoint.params_from(arrays, meta, trainer._view, path, cast=False)
    opt_state = checkpoint.tree_from('opt', arrays,
                                     checkpoint.field(meta, 'opt_paths', list, path),
                                     trainer.opt_state, path, 'optimiser state')
    counts = {key: checkpoint.field(meta, key, int, path)
              for key in ('epoch', 'step', 'skipped_updates')}
    checkpoint.field(meta, 'history', list, path)
    rng, key = _generators(meta.get('rng'), arrays.get('rng/brainstate_key'), path)
    return _Restored(params, opt_state, counts, meta, rng, key, notes)


def restore(trainer, path: Path, expected: dict, compare_run: Optional[Callable] = None,
            datasets: Optional[dict] = None) -> None:
    """Restore ``trainer`` from the checkpoint ``path`` if its metadata equal ``expected``
    (``{'trainer': ..., 'run': ..., 'fit': ...}``; with ``compare_run(stored, given)``, the
    run options differ where it returns differences, e.g. :func:`run_differences`, which
    lets a run be extended) and its data fingerprints fit
    ``datasets`` (keyed like them in ``expected['fit']``). Everything is checked before
    anything changes.

    Raises:
      FileNotFoundError: No file at ``path``.
      CheckpointError: The file is not a valid checkpoint or does not fit ``trainer``.
    """
    state = _read(trainer, path, expected, compare_run, datasets)
    trainer._set_params(state.params)
    trainer.opt_state = trainer._parallel.replicate(state.opt_state)
    trainer.epoch, trainer.updates, trainer.skipped_updates = (
        state.counts['epoch'], state.counts['step'], state.counts['skipped_updates'])
    trainer.history, trainer.best = state.meta['history'], state.meta.get('best')
    trainer.run_config, trainer._fit_config = state.meta.get('run', {}), state.meta.get('fit', {})
    trainer._rng = state.rng
    brainstate.random.set_key(state.key)
    for note in state.notes:
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    trained_on = state.meta.get('devices', len(trainer.devices))
    if trained_on != len(trainer.devices):
        warnings.warn(f'{path} was trained on {trained_on} device(s), this Trainer has '
                      f'{len(trainer.devices)}: the continued run equals an uninterrupted one '
                      f'up to the rounding of the gradient\'s batch sum, not bitwise.',
                      RuntimeWarning, stacklevel=3)


def load_params(trainer, path: Union[str, os.PathLike], which: Optional[str] = None) -> dict:
    """Set ``trainer``'s parameters from a checkpoint file or run directory ``path``
    (``which`` checkpoint of a run directory: :func:`~.run_dir.checkpoint_file`),
    floating values cast to the model's dtype; returns the checkpoint's metadata."""
    file = run_dir.checkpoint_file(path, which)
    arrays, meta = checkpoint.read(file)
    trainer._set_params(checkpoint.params_from(arrays, meta, trainer._view, file, cast=True))
    return meta


def _check_fit(meta: dict, given: dict, datasets: dict, path) -> list:
    """Check a checkpoint's ``fit`` settings against ``given``, and its data fingerprints
    (``datasets``' keys) against the data sets at the version it stored
    (:func:`~braintrace_conv.training.fingerprint.data_change`); raises
    ``ConfigMismatchError``, else returns the warnings to give."""
    stored = checkpoint.field(meta, 'fit', dict, path)
    differences = checkpoint.config_differences(
        {k: v for k, v in stored.items() if k not in datasets},
        {k: v for k, v in given.items() if k not in datasets})
    described, notes = {}, []
    for key, dataset in datasets.items():
        change, note = data_change(stored.get(key), dataset, now=given.get(key))
        if change is not None:
            differences[key] = (stored.get(key), given.get(key))
            described[key] = change
        if note is not None:
            notes.append(f'{path}, {key}: {note}.')
    if differences:
        raise checkpoint.ConfigMismatchError(path, differences, described)
    return notes


def _generators(state, key_data, path) -> tuple:
    """The shuffling generator and ``brainstate.random`` key of a checkpoint, checked."""
    try:
        rng = None
        if state is not None:
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = state
        key = jax.random.wrap_key_data(jnp.asarray(key_data, jnp.uint32))
    except (TypeError, ValueError, KeyError) as err:
        raise checkpoint.CheckpointError(f'{path} has invalid generator states: {err}') from None
    return rng, key
