"""Saving and restoring the state of a :class:`~braintrace_conv.training.Trainer`
(the checkpoint files themselves are :mod:`braintrace_conv.training.checkpoint`)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Optional, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from . import checkpoint, run_dir
from .fingerprint import data_change


def payload(trainer) -> tuple:
    arrays = {f'param/{n}': np.asarray(v)
              for n, v in trainer._view.named(trainer._view.mantissas()).items()}
    opt_arrays, opt_paths = checkpoint.tree_arrays('opt', trainer.opt_state)
    arrays.update(opt_arrays)
    arrays['rng/brainstate_key'] = np.asarray(
        jax.random.key_data(brainstate.random.get_key()))
    meta = dict(epoch=trainer.epoch, step=trainer.step, skipped_updates=trainer.skipped_updates,
                history=trainer.history, best=trainer.best, trainer=trainer.config(),
                run=trainer.run_config, fit=trainer._fit_config, devices=len(trainer.devices),
                units={n: str(unit) for n, unit in zip(trainer._view.names, trainer._view.units)},
                opt_paths=opt_paths,
                rng=None if trainer._rng is None else trainer._rng.bit_generator.state)
    return arrays, meta


def restore(trainer, path: Path, expected: dict, epochs: Optional[int] = None,
             datasets: Optional[dict] = None) -> None:
    arrays, meta = checkpoint.read(path)
    stored_epochs = meta.get('run', {}).get('epochs')
    if (epochs is not None and expected.get('run', {}).get('epochs') == epochs
            and isinstance(stored_epochs, int) and stored_epochs <= epochs):
        # a run's length is fit's ``epochs``: a longer one continues a finished run
        expected = dict(expected, run=dict(expected['run'], epochs=stored_epochs))
    notes = []
    for key, given in expected.items():
        if key == 'fit' and datasets:
            notes = _check_fit(meta, given, datasets, path)
        else:
            checkpoint.check_config(meta, key, given, path)
    params = checkpoint.params_from(arrays, meta, trainer._view, path, cast=False)
    opt_state = checkpoint.tree_from('opt', arrays,
                                     checkpoint.field(meta, 'opt_paths', list, path),
                                     trainer.opt_state, path, 'optimiser state')
    counts = {k: checkpoint.field(meta, k, int, path)
              for k in ('epoch', 'step', 'skipped_updates')}
    history = checkpoint.field(meta, 'history', list, path)
    best = meta.get('best')
    rng, key = _generators(meta.get('rng'), arrays.get('rng/brainstate_key'), path)
    # everything is valid: only now change the trainer
    trainer._set_params(params)
    trainer.opt_state = trainer._parallel.replicate(opt_state)
    trainer.epoch, trainer.step, trainer.skipped_updates = (counts['epoch'], counts['step'],
                                                   counts['skipped_updates'])
    trainer.history = history
    trainer.best = best
    trainer.run_config = meta.get('run', {})
    trainer._fit_config = meta.get('fit', {})
    trainer._rng = rng
    brainstate.random.set_key(key)
    for note in notes:
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    trained_on = meta.get('devices', len(trainer.devices))
    if trained_on != len(trainer.devices):
        warnings.warn(f'{path} was trained on {trained_on} device(s), this Trainer has '
                      f'{len(trainer.devices)}: the continued run equals an uninterrupted one '
                      f'up to the rounding of the gradient\'s batch sum, not bitwise.',
                      RuntimeWarning, stacklevel=3)


def load_params(trainer, path: Union[str, os.PathLike], which: Optional[str] = None) -> dict:
    """:meth:`Trainer.load_params <braintrace_conv.training.Trainer.load_params>` of ``trainer``."""
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
        change, note = data_change(stored.get(key), dataset)
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
