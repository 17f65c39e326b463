"""``braintrace-conv evaluate``: the test accuracy of a saved run, on the data it was
evaluated on: the test set of a run of ``train``, rebuilt; the held-out recordings of a run
of ``stream`` (or others, with their segments), played through its model."""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from ..data import EventStream
from ..training import checkpoint, run_dir
from ..training.fingerprint import data_change
from ..training.stream_state import stream_config
from .build import setup
from .options import EVALUATE_OPTIONS, STREAM_OPTIONS, TRAIN_OPTIONS, flag, given
from .parser import PROG, UsageError, build_parser, usage_error
from .resolve import check_values, devices, refuse_without_effect, resolve
from .stream import _labels_beside, _recordings, _trainer, stream_transforms

__all__ = ['evaluate']

#: Largest ``metrics.json`` that ``evaluate`` reads to confirm a run's data directory.
MAX_METRICS_BYTES = 64 * 2**20


def evaluate(args, usage: str) -> int:
    """Run ``braintrace-conv evaluate`` with the parsed command line ``args``."""
    given_names = [o.name for o in EVALUATE_OPTIONS if given(getattr(args, o.name))]
    refuse_without_effect(EVALUATE_OPTIONS, vars(args), given_names, usage)
    options = argparse.Namespace(**check_values(EVALUATE_OPTIONS, vars(args), usage))
    try:
        path = run_dir.checkpoint_file(options.run, options.checkpoint)
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except (FileNotFoundError, checkpoint.CheckpointError) as error:
        raise UsageError(f'--run: {error}', usage) from None
    command = 'stream' if 'stream' in meta else 'train'
    other = ('batch_size', 'data') if command == 'stream' else ('recordings', 'segments')
    for name in other:
        if name in given_names:
            raise UsageError(f'{flag(name)} applies only to runs of "{PROG} '
                             f'{"train" if command == "stream" else "stream"}"; the run in '
                             f'{path} was written by "{PROG} {command}"', usage)
    missing = [k for k in (('recordings', 'sensor_size', 'algorithm') if command == 'stream'
                           else ('task', 'algorithm')) if k not in stored]
    if missing:
        raise UsageError(f'--run: {path} was not written by "{PROG} {command}" (its run '
                         f'options lack {", ".join(missing)})', usage)
    if command == 'stream':
        return _evaluate_stream(options, path, meta, stored, usage)
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
    scored = _scored(path, f'epoch {meta["epoch"]}')
    print(f'{scored}: {run.task}, {len(test)} test samples: test accuracy '
          f'{result["accuracy"]:.1%}, test loss {result["loss"]:.4f}, spike rates [{rates}]')
    return 0


def _scored(path: Path, when: str) -> str:
    """Which checkpoint was scored: ``the best checkpoint (checkpoint-best.npz, epoch 3) of
    runs/x``, or the file named by ``--run``."""
    which = {name: kind for kind, name in run_dir.CHECKPOINTS.items()}.get(path.name)
    if which is None:
        return f'the checkpoint {path} ({when})'
    return f'the {which} checkpoint ({path.name}, {when}) of {path.parent}'


def _evaluate_stream(options, path: Path, meta: dict, stored: dict, usage: str) -> int:
    """Score the stream run saved in the checkpoint ``path`` on held-out recordings
    (``--recordings``, else the run's own ``--held-out``), as the run scored its held-out
    evaluations (:meth:`Trainer.evaluate_stream
    <braintrace_conv.training.Trainer.evaluate_stream>`)."""
    run = _stored_stream_run(stored, path, devices(options.devices, usage), usage)
    held = _held_out(options, run, path, usage)
    if options.recordings is None:
        _check_held_out(held, meta, path, options.allow_data_change, usage)
    trainer = _trainer(run, held, usage, train=False)
    try:
        trainer.load_params(path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--run: {error}', usage) from None
    try:
        result = trainer.evaluate_stream(held, settle_steps=run.settle_steps)
    except (ValueError, TypeError) as error:
        raise usage_error(error, usage, prefix=f'{_held_out_source(options)}: ') from None
    percent = lambda v: '-' if v is None else f'{v:.1%}'
    played = meta['stream'].get('steps') if isinstance(meta.get('stream'), dict) else None
    scored = _scored(path, f'step {played:,}' if isinstance(played, int) else 'stream run')
    loss = '-' if result['loss'] is None else f'{result["loss"]:.4f}'
    print(f'{scored}: {held.batch_size} held-out recording(s), {held.num_steps:,} steps '
          f'({held.num_steps * held.dt_us / 1e6:,.1f} s): held-out segment accuracy '
          f'{percent(result["segment_accuracy"])} ({result["segments"]} segments), step '
          f'accuracy {percent(result["step_accuracy"])}, loss {loss}')
    return 0


def _held_out_source(options) -> str:
    """What names the held-out recordings in a message."""
    return '--recordings' if options.recordings is not None else \
        '--run: the held-out recordings of the run'


def _held_out(options, run, path: Path, usage: str) -> EventStream:
    """The stream of the held-out recordings to evaluate on, as the run played its own."""
    if options.recordings is not None:
        files = [Path(f).resolve() for f in options.recordings]
        for file in files:
            if not file.is_file():
                raise UsageError(f'--recordings: {file} is not a file', usage)
        segments = _labels_beside(files, options.segments, 'recordings', 'segments', usage)
        recordings = _recordings(files, segments, 'recordings', usage)
    else:
        if not run.held_out:
            raise UsageError(f'--run: the run in {path} has no held-out recordings (--held-out); '
                             f'name the recordings to evaluate on with --recordings FILE ...',
                             usage)
        for file in [*run.held_out, *(run.held_out_segments or ())]:
            if not Path(file).is_file():
                raise UsageError(f'--run: {file}, held out by the run in {path}, is not a file '
                                 f'here; name the recordings to evaluate on with --recordings '
                                 f'FILE ...', usage)
        recordings = _recordings(run.held_out, run.held_out_segments, 'held_out', usage)
    try:
        return EventStream(recordings, sensor_size=tuple(run.sensor_size), dt_us=run.dt_us,
                           chunk_steps=run.update_every, num_classes=run.num_classes,
                           transforms=stream_transforms(run))
    except (OSError, ValueError, TypeError) as error:
        raise usage_error(error, usage, prefix=f'{_held_out_source(options)}: ') from None


def _check_held_out(held: EventStream, meta: dict, path: Path, allow: bool, usage: str) -> None:
    """Refuse (or, with ``allow``, warn about) held-out recordings other than those the run
    was evaluated on (their names, sizes and lengths, as the run stored them)."""
    stored = meta.get('fit', {}).get('eval_stream')
    if not isinstance(stored, dict):
        return
    changed = checkpoint.config_differences(stored, stream_config(held))
    if not changed:
        return
    _data_changed(f'the held-out recordings of the run in {path} differ from those it was '
                  f'evaluated on (in {", ".join(changed)})', allow, usage)


def _data_changed(message: str, allow: bool, usage: str) -> None:
    """Refuse to evaluate on data that changed since the run (``message`` says how), or,
    with ``allow`` (``--allow-data-change``), say so and go on."""
    if not allow:
        raise UsageError(f'--run: {message}; pass --allow-data-change to evaluate anyway', usage)
    warnings.warn(f'{message}; evaluating anyway (--allow-data-change)', RuntimeWarning)

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


def _argv(stored: dict, devices: int, command: str = 'train') -> list:
    """The command line of ``command`` (``train`` or ``stream``) of the run options
    ``stored`` with a run, on ``devices`` devices. An option without effect is left out
    (e.g. ``final_steps``, stored by every run of ``train``, unless ``--loss final``);
    options an earlier version did not store take their defaults."""
    argv = [command, f'--devices={devices}']
    for option in (TRAIN_OPTIONS if command == 'train' else STREAM_OPTIONS):
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


def _stored_stream_run(stored: dict, path, devices: int, usage: str) -> argparse.Namespace:
    """The run options stored with a run of ``stream``, parsed and checked as the command
    line's are (its recordings need not be there any more)."""
    try:
        args = build_parser().parse_args(_argv(stored, devices, 'stream'))
        values = check_values(STREAM_OPTIONS, vars(args), usage)
    except UsageError as error:
        raise UsageError(f'--run: the run options stored in {path} are not valid: {error}',
                         usage) from None
    for option in STREAM_OPTIONS:      # the frames of a camera have 2 spatial axes
        if values[option.name] is None and option.rank_defaults:
            values[option.name] = option.rank_defaults[2]
    return argparse.Namespace(**values)


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
    _data_changed(f'the test set rebuilt for the run in {path} differs from the one it was '
                  f'evaluated on: {change}', allow, usage)

