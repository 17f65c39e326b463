"""``braintrace-conv evaluate``: the test accuracy of a saved run, on the data it was
evaluated on."""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from ..training import checkpoint, run_dir
from ..training.fingerprint import data_change
from .build import setup
from .options import EVALUATE_OPTIONS, TRAIN_OPTIONS, flag, given
from .parser import PROG, UsageError, build_parser
from .resolve import check_values, devices, resolve

__all__ = ['evaluate']

#: Largest ``metrics.json`` that ``evaluate`` reads to confirm a run's data directory.
MAX_METRICS_BYTES = 64 * 2**20


def evaluate(args, usage: str) -> int:
    """Run ``braintrace-conv evaluate`` with the parsed command line ``args``."""
    options = argparse.Namespace(**check_values(EVALUATE_OPTIONS, vars(args), usage))
    try:
        path = run_dir.checkpoint_file(options.run, options.checkpoint)
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except (FileNotFoundError, checkpoint.CheckpointError) as error:
        raise UsageError(f'--run: {error}', usage) from None
    missing = [k for k in ('task', 'algorithm') if k not in stored]
    if missing:
        raise UsageError(f'--run: {path} was not written by "{PROG} train" (its run options '
                         f'lack {", ".join(missing)})', usage)
    run = _stored_run(dict(stored, data=_evaluation_data(options, stored, path, usage)), path,
                      devices(options.devices, usage), usage)
    try:
        trainer, _, test = setup(run, usage, train=False)
    except UsageError as error:
        raise UsageError(f'--run: the data or model of the run in {path} cannot be rebuilt: '
                         f'{error}', usage) from None
    _check_test_data(test, meta, path, options.allow_data_change, usage)
    try:
        meta = trainer.load_params(path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--run: {error}', usage) from None
    result = trainer.evaluate(test, options.batch_size)
    rates = ', '.join(f'{name} {rate:.3f}' for name, rate in result['spike_rates'].items())
    print(f'{path.name} (epoch {meta["epoch"]}) of {options.run}: {run.task}, {len(test)} test '
          f'samples: test accuracy {result["accuracy"]:.1%}, test loss {result["loss"]:.4f}, '
          f'spike rates [{rates}]')
    return 0


def _recorded_run_option(metrics: Path, key: str):
    """The run option ``key`` in the run options of the file ``metrics`` (``metrics.json``),
    or ``None`` if it has none: missing, a link (a run never writes through one), not a
    regular file, larger than :data:`MAX_METRICS_BYTES`, or not JSON."""
    if metrics.is_symlink() or not metrics.is_file():
        return None
    try:
        with open(metrics, 'rb') as f:
            text = f.read(MAX_METRICS_BYTES + 1)
        recorded = json.loads(text) if len(text) <= MAX_METRICS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    options = recorded.get('run_config') if isinstance(recorded, dict) else None
    return options.get(key) if isinstance(options, dict) else None


def _evaluation_data(options, stored: dict, path: Path, usage: str):
    """The data directory to rebuild the test set of the run stored in the checkpoint
    ``path`` from: ``--data``, or (a run of --task events) the one the run recorded both in
    that checkpoint and in the ``metrics.json`` beside it. No directory a crafted
    checkpoint names alone is ever read or listed."""
    if stored.get('task') != 'events':
        if options.data is not None:
            raise UsageError(f'--data applies only to runs of --task events; the run in {path} '
                             f'is of --task {stored.get("task")}', usage)
        return stored.get('data')
    if options.data is not None:
        if not options.data.is_dir():
            raise UsageError(f'--data {options.data} is not a directory', usage)
        return str(options.data)
    named, metrics = stored.get('data'), path.parent / run_dir.METRICS_NAME
    recorded = _recorded_run_option(metrics, 'data')
    if named is None or recorded != named:
        raise UsageError(f'--run: the data directory named in {path} ({named}) is not the one '
                         f'recorded in {metrics} ({"none" if recorded is None else recorded}); '
                         f'evaluate reads only the data directory its run recorded in both, or '
                         f'the one --data DIR names', usage)
    if not Path(named).is_dir():
        raise UsageError(f'--run: the data directory of the run in {path}, {named}, is not a '
                         f'directory here; pass --data DIR to name where its data are', usage)
    return named


def _argv(stored: dict, devices: int) -> list:
    """The ``train`` command line of the run options ``stored`` with a run, on ``devices``
    devices. An option without effect is left out (e.g. ``final_steps``, stored by every
    run, unless ``--loss final``); options an earlier version did not store take their
    defaults."""
    argv = ['train', f'--devices={devices}']
    for option in TRAIN_OPTIONS:
        value = stored.get(option.name)
        if option.stored == 'never' or not given(value) or not all(
                r.met(stored) for r in option.requires):
            continue
        if value is True:
            argv.append(flag(option.name))
        elif option.nargs is not None and isinstance(value, list):
            argv += [flag(option.name), *map(str, value)]
        else:
            shown = ','.join(map(str, value)) if isinstance(value, list) else value
            argv.append(f'{flag(option.name)}={shown}')
    return argv


def _stored_run(stored: dict, path, devices: int, usage: str) -> argparse.Namespace:
    """The run options stored with a run, parsed and checked as the command line's are."""
    try:
        return resolve(build_parser().parse_args(_argv(stored, devices)), usage)
    except UsageError as error:
        raise UsageError(f'--run: the run options stored in {path} are not valid: {error}',
                         usage) from None


def _check_test_data(test, meta: dict, path, allow: bool, usage: str) -> None:
    """Refuse (or, with ``allow``, warn about) a rebuilt test set other than the one the
    run was evaluated on, by the fingerprint stored with it."""
    stored = meta.get('fit', {}).get('eval_data')
    if not isinstance(stored, dict):
        return
    change, note = data_change(stored, test)
    if note is not None:
        warnings.warn(f'{path}, test set: {note}', RuntimeWarning)
    if change is None:
        return
    message = (f'the test set rebuilt for the run in {path} differs from the one it was '
               f'evaluated on: {change}')
    if not allow:
        raise UsageError(f'--run: {message}; pass --allow-data-change to evaluate anyway', usage)
    warnings.warn(f'{message}; evaluating anyway (--allow-data-change)', RuntimeWarning)

