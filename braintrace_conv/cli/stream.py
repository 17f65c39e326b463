"""``braintrace-conv stream``: learn online from long labelled recordings played as a stream.

The event files of ``--recordings`` are played in order as one stream (or, with
``--batch-size B``, as one playlist played by ``B`` streams from evenly spaced offsets;
:class:`~braintrace_conv.data.EventStream`), binned into steps of ``--dt-us`` and labelled
by the time segments of a CSV beside each file (``NAME_labels.csv``, DVS Gesture's raw
layout) or named by ``--segments``. ``--denoise-us``, ``--refractory-us``, ``--crop`` and
``--downsample`` transform the events, in this order, before they are binned
(:mod:`~braintrace_conv.data.transforms`), so a large camera is binned at the size the
model takes. The model is
:func:`~braintrace_conv.models.recurrent_conv_snn` for the camera's frames, trained by
:meth:`Trainer.fit_stream <braintrace_conv.training.Trainer.fit_stream>`: one update every
``--update-every`` steps, hidden states and traces carried across chunks, segments and
recordings (with ``--algorithm bptt``: truncated BPTT, the gradient cut at every chunk
boundary), online loss and accuracy per step and per segment, and an evaluation on the
``--held-out`` recordings every ``--eval-every`` chunks and at the end. The run directory
``--out`` holds checkpoints (with the learner's carry, the stream's position and the
metrics' aggregates), ``metrics.json``, ``scalars.csv`` and ``learning_curve.png``;
``--resume`` continues a run stopped at any point (a kill included) from its last
checkpoint, and ends as the uninterrupted run would have, bit for bit.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import brainstate

from .._memory import peak_rss_mib
from ..data import EventReader, EventStream, Recording, read_segments
from ..data.transforms import Crop, Denoise, Downsample, RefractoryPeriod
from ..models import recurrent_conv_snn
from ..training import Trainer, checkpoint, logs, run_dir
from ..training.stream_state import StreamRun, lagging, run_differences
from .build import _learner, optimizer, trace_choice
from .options import STREAM_OPTIONS, flag, given, stored_options
from .parser import PROG, Interrupted, UsageError, usage_error
from .resolve import check_values, devices, option_list, refuse_without_effect
from .train import _out_error, checked_out, holding_out, kept, last_checkpoint, stopped

__all__ = ['stream', 'stream_transforms', 'SUMMARY']

#: What the command adds to ``metrics.json`` when a run is finished, after the run's own
#: last write: the wall time and peak resident memory of the command that finished it. A
#: finished run whose ``metrics.json`` lacks them is repaired on ``--resume``.
SUMMARY = ('wall_time_s', 'peak_rss_mb')


def _labels_beside(files: list, segments, option: str, segments_option: str,
                   usage: str) -> list:
    """The segments file of each event file of ``option``: those ``segments_option`` names
    (one per file) or, by default, ``NAME_labels.csv`` beside each."""
    if segments is None:
        beside = [f.with_name(f.stem + '_labels.csv') for f in files]
        for file, csv in zip(files, beside):
            if not csv.is_file():
                raise UsageError(f'{flag(option)}: {file} has no segments file {csv.name} '
                                 f'beside it; name the segments files with '
                                 f'{flag(segments_option)}', usage)
        return beside
    if len(segments) != len(files):
        raise UsageError(f'{flag(segments_option)} names {len(segments)} file(s) for the '
                         f'{len(files)} of {flag(option)}; give one segments file per event '
                         f'file, in the same order', usage)
    return [Path(s).resolve() for s in segments]


#: The event transforms of the options, in the order they apply.
_TRANSFORMS = (('denoise_us', lambda v: Denoise(window_us=v)),
               ('refractory_us', lambda v: RefractoryPeriod(period_us=v)),
               ('crop', lambda v: Crop(origin=tuple(v[:2]), size=tuple(v[2:]))),
               ('downsample', lambda v: Downsample(factor=v)))


def stream_transforms(run) -> list:
    """The event transforms of the resolved options ``run`` (``--denoise-us``,
    ``--refractory-us``, ``--crop``, ``--downsample``, in this order), for its streams."""
    return [make(getattr(run, name)) for name, make in _TRANSFORMS
            if getattr(run, name, None) is not None]


def _check_transforms(values: dict, usage: str) -> None:
    """Refuse a transform that does not fit the sensor as the ones before leave it (its
    message is the library's, which names the transform's own arguments, not options)."""
    size = tuple(values['sensor_size'])
    for name, make in _TRANSFORMS:
        if values[name] is not None:
            try:
                size = make(values[name]).output_size(size)
            except ValueError as error:
                raise UsageError(f'{flag(name)}: {error}', usage) from None


def _resolve(args: argparse.Namespace, usage: str) -> argparse.Namespace:
    """The options of ``stream`` with their defaults, checked; raises :class:`UsageError`."""
    values = {option.name: getattr(args, option.name) for option in STREAM_OPTIONS}
    given_names = [name for name, value in values.items() if given(value)]
    if len(values['sensor_size']) != 3:
        raise UsageError(f'--sensor-size must be W,H,P for a camera, got '
                         f'{",".join(map(str, values["sensor_size"]))}', usage)
    values = check_values(STREAM_OPTIONS, values, usage)
    _check_transforms(values, usage)
    # with the defaults filled in: --window applies to the default algorithm
    refuse_without_effect(STREAM_OPTIONS, values, given_names, usage)
    for option in STREAM_OPTIONS:      # the frames of a camera have 2 spatial axes
        if values[option.name] is None and option.rank_defaults:
            values[option.name] = option.rank_defaults[2]
    for files, segments in (('recordings', 'segments'), ('held_out', 'held_out_segments')):
        if values[files] is not None:
            paths = [Path(f).resolve() for f in values[files]]
            for path in paths:
                if not path.is_file():
                    raise UsageError(f'{flag(files)}: {path} is not a file', usage)
            values[segments] = [str(p) for p in _labels_beside(paths, values[segments],
                                                               files, segments, usage)]
            values[files] = [str(p) for p in paths]
    if values['num_classes'] is None:
        values['num_classes'] = _classes(values, given_names, usage)
    values['devices'] = devices(values['devices'], usage)
    if values['out'] is None:
        values['out'] = Path('runs') / f'stream-{values["algorithm"]}'
    return argparse.Namespace(**values)


def _classes(values: dict, given_names: list, usage: str) -> int:
    """The number of classes the segments files name: their largest label, plus one."""
    largest, named = -1, []
    for files, segments in (('recordings', 'segments'), ('held_out', 'held_out_segments')):
        # the files the user named, or those found beside the event files
        option = segments if segments in given_names else files
        named += [flag(option)] if values[segments] else []
        for path in values[segments] or ():
            try:
                largest = max(largest, int(read_segments(path).labels.max(initial=-1)))
            except (OSError, ValueError) as error:
                raise UsageError(f'{flag(option)}: {error}', usage) from None
    if largest < 0:
        raise UsageError(f'{" and ".join(named)}: the segments files label no segment, so the '
                         f'number of classes is unknown; give segments files that label the '
                         f'recordings, or --num-classes', usage)
    return largest + 1


def _recordings(files, segments, option: str, usage: str, sensor_size=None) -> list:
    """The :class:`Recording` of each event file of ``option`` with its segments file; with
    ``sensor_size``, every event of each file is read and checked first
    (:meth:`EventReader.check <braintrace_conv.data.EventReader.check>`: memory-mapped
    ``.npy`` and stored ``.npz`` files in place, camera files decoded), so that bad data
    stop a run before it writes anything."""
    try:
        for path in files if sensor_size is not None else ():
            EventReader(path, sensor_size=sensor_size).check()
        return [Recording(f, s) for f, s in zip(files, segments)]
    except (OSError, ValueError, ImportError) as error:
        raise UsageError(f'{flag(option)}: {error}', usage) from None


def _streams(run, usage: str) -> tuple:
    """``(training stream, held-out stream or None)`` of the resolved options ``run``, every
    event of their files checked (:func:`_recordings`)."""
    sensor = tuple(run.sensor_size)
    train = _recordings(run.recordings, run.segments, 'recordings', usage, sensor)
    held = (None if run.held_out is None else
            _recordings(run.held_out, run.held_out_segments, 'held_out', usage, sensor))
    common = dict(sensor_size=tuple(run.sensor_size), dt_us=run.dt_us,
                  chunk_steps=run.update_every, num_classes=run.num_classes,
                  transforms=stream_transforms(run))
    streams = []
    for option, recordings, extra in (
            ('recordings', train, dict(batch_size=run.batch_size, loop=run.loop)),
            ('held_out', held, {})):
        try:
            streams.append(None if recordings is None else
                           EventStream(recordings, **common, **extra))
        except (OSError, ValueError, TypeError) as error:
            raise usage_error(error, usage, prefix=f'{flag(option)}: ') from None
    return tuple(streams)


def _trainer(run, stream: EventStream, usage: str, *, train: bool = True) -> Trainer:
    """The model, learner and trainer of the run; with ``train``, the optimiser, the
    learning rate's decay planned over its updates (the chunks of ``stream`` with a
    labelled step)."""
    try:
        brainstate.random.seed(run.seed)
        model = recurrent_conv_snn(stream.frame_shape, run.num_classes, channels=run.channels,
                                   kernel_size=run.kernel_size, pool=run.pool, tau=run.tau)
        updates = stream.labelled_chunks(run.max_steps) if train else 0
        return Trainer(_learner(run, model),
                       optimizer(run, max(1, updates)) if train else None,
                       nonfinite=run.nonfinite, devices=run.devices)
    except (ValueError, TypeError) as error:
        raise usage_error(error, usage) from None


def _resume(run, usage: str) -> bool:
    """Whether the run to resume is still to be played, checked against the options."""
    path = run.out / run_dir.LAST_CHECKPOINT
    try:
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
        if 'stream' not in meta:
            raise UsageError(f'--resume: the run in {run.out} was written by "{PROG} train"; '
                             f'continue it with "{PROG} train --resume" and its options', usage)
        saved = StreamRun.from_state(meta.get('stream'), path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    differences = run_differences(stored, stored_options(vars(run), STREAM_OPTIONS),
                                  run.max_steps)
    if differences:
        raise UsageError(f'--resume: the run in {run.out} was trained with other options: '
                         f'{option_list(differences)}; give the same options, or another '
                         f'--out', usage)
    if not saved.more_to_play(run.max_steps):
        found = lagging(run.out, saved, SUMMARY)
        if found:
            print(f'the run in {run.out} is finished ({saved.steps:,} steps) but was '
                  f'interrupted while writing its files; repairing {", ".join(found)}')
            return True
        print(f'the run in {run.out} is already finished ({saved.steps:,} steps); nothing to do'
              + ('' if saved.ended else '; a larger --max-steps extends it'))
        return False
    if stored.get('max_steps') != run.max_steps:
        print(f'the run in {run.out} continues to '
              + ('the end of its recordings' if run.max_steps is None else
                 f'{run.max_steps:,} steps') + f' (it was given {stored.get("max_steps")}; '
              f'the learning-rate schedule is stretched from here on)')
    return True


def stream(args, usage: str, start: float) -> int:
    """Run ``braintrace-conv stream`` with the parsed command line ``args``."""
    run = _resolve(args, usage)
    out_existed = checked_out(run, usage)
    if run.resume and not _resume(run, usage):
        return 0
    train, held = _streams(run, usage)
    trainer = _trainer(run, train, usage)
    try:
        trainer.check_fit_stream(train, **_fit_arguments(run, held))
    except (ValueError, TypeError) as error:
        raise usage_error(error, usage) from None
    return holding_out(run, usage, out_existed,
                       lambda: _fit(run, usage, start, trainer, train, held))


def _fit_arguments(run, held) -> dict:
    """The arguments of ``Trainer.fit_stream`` and ``Trainer.check_fit_stream`` of ``run``
    (``held``: the held-out stream)."""
    return dict(eval_stream=held, eval_every=run.eval_every, max_steps=run.max_steps,
                settle_steps=run.settle_steps, out_dir=run.out, resume=run.resume,
                overwrite=run.overwrite, run_config=stored_options(vars(run), STREAM_OPTIONS),
                checkpoint_every=run.checkpoint_every, log_every=run.log_every)


def _fit(run, usage: str, start: float, trainer: Trainer, train, held) -> int:
    """Learn from the stream (holding the run directory), then report."""
    if not run.quiet:
        print(_start_line(run, trainer, train, held), flush=True)
    before = last_checkpoint(run)
    try:
        result = trainer.fit_stream(train, progress=not run.quiet,
                                    **_fit_arguments(run, held))
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    except (run_dir.RunExistsError, run_dir.NothingToResumeError,
            run_dir.RunLockedError) as error:
        raise _out_error(run, error, usage) from None
    except (ValueError, TypeError, OSError, FloatingPointError) as error:
        if isinstance(error, run_dir.RunDirectoryLostError):
            raise
        raise stopped(error, run, before, usage) from None
    except KeyboardInterrupt:
        raise Interrupted(kept(run, before, f'the run is saved in {run.out} up to its last '
                                            f'checkpoint; rerun with --resume and the same '
                                            f'options to continue from there')) from None
    wall = time.perf_counter() - start
    peak_mb = peak_rss_mib()
    with run_dir.locked(run.out):
        logs.write_metrics(run.out, dict(result, **dict(zip(SUMMARY, (wall, peak_mb)))))
    print(_end_line(result, wall, peak_mb))
    return 0


def _seconds(steps: int, dt_us: int) -> str:
    return f'{steps * dt_us / 1e6:,.1f} s'


def _start_line(run, trainer: Trainer, train: EventStream, held) -> str:
    """What is learned, from what, where."""
    learner = trainer.learner
    length = ('endless' if train.num_steps is None else
              f'{train.num_steps:,} steps ({_seconds(train.num_steps, train.dt_us)})')
    text = (f'stream: {len(run.recordings)} recording(s) as {train.batch_size} stream(s) of '
            f'{length}, frames {train.frame_shape}, {run.num_classes} classes, chunks of '
            f'{run.update_every} steps of {run.dt_us} us')
    if held is not None:
        text += (f'; held-out: {len(run.held_out)} recording(s), {held.num_steps:,} steps '
                 f'({_seconds(held.num_steps, held.dt_us)})')
    text += f'; {learner.algorithm}'
    text += trace_choice(learner)
    if learner.algorithm == 'BPTT':
        text += ' (truncated at chunk boundaries)'
    if getattr(learner, 'window', None):
        text += f', exact within windows of {learner.window} steps'
    return text + f'; {run.devices} device(s); run directory {run.out}'


def _end_line(result: dict, wall: float, peak_mb: float) -> str:
    """The accuracies, the amount played and the cost."""
    percent = lambda v: '-' if v is None else f'{v:.1%}'
    test, online = result['test'] or {}, result['online']
    parts = []
    if test:
        parts.append(f"held-out segment accuracy {percent(test['test_accuracy'])} "
                     f"({test['test_segments']} segments), step accuracy "
                     f"{percent(test['test_step_accuracy'])}")
    parts.append(f"online segment accuracy {percent(online['segment_accuracy'])} "
                 f"({online['segments']} segments), step accuracy "
                 f"{percent(online['step_accuracy'])}")
    parts.append(f"{result['steps']:,} steps ({result['stream_time_s']:,.1f} s of stream), "
                 f"{result['events']:,} events | wall time {wall:.1f} s | peak RSS "
                 f"{peak_mb:.0f} MB")
    return ' | '.join(parts)
