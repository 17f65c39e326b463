"""The ``braintrace-conv`` command: train a recurrent spiking conv net on event streams,
and evaluate a saved run.

``braintrace-conv train`` generates a dataset (no downloads) -- DVS-like moving
bars (also with their direction held across blank frames, ``--task delayed-bars``),
digit saccades, or SHD-like spoken words over 700 channels -- or reads a
directory of recorded event files (``--task events``), builds
:func:`~braintrace_conv.models.recurrent_conv_snn` for the rank of its frames
(1-D convolutions for audio-like sensors, 2-D for cameras), trains it with the
chosen executor through :class:`~braintrace_conv.training.Trainer` on
``--devices`` devices (data parallel) and writes the run
directory ``--out`` (checkpoints, ``metrics.json``, ``scalars.csv``,
``learning_curve.png``; see :mod:`braintrace_conv.training`). It ends with the
test accuracy, the wall time and the peak resident memory. A directory that
already holds a run is continued with ``--resume`` (with the same options) or
replaced with ``--overwrite``, never overwritten silently.

The options that define the result are stored with the run and must be equal
on ``--resume``; ``--devices`` and ``--cache-size`` may change (a different
device count changes only the rounding of the gradient's batch sum, and a
warning says so), and a larger ``--epochs`` continues a finished run. So must
the data, by their fingerprint (:mod:`braintrace_conv.training.fingerprint`):
a file of a ``--stream`` data set whose size or modification time changed is
named and refused (a run written by a version that recorded paths only is
checked by its paths, and a warning says so). A
resumed run first repairs what a run killed after its last checkpoint left
behind (best checkpoint, ``metrics.json``, learning curve, temporary files);
a directory another process is training in is refused with that process's pid.

``braintrace-conv evaluate --run DIR`` rebuilds the data and model of a saved
run from its stored options, loads its best (or ``--checkpoint last``)
parameters and reports the test loss, accuracy and spike rates. Test data
that differ from those the run was evaluated on (files added, removed,
swapped, or changed in size or modification time) are refused unless
``--allow-data-change``. The data of a run of ``--task events`` are read from
the directory the run recorded, if its checkpoint and the ``metrics.json``
beside it agree on it, or from the one ``--data DIR`` names (a moved or copied
data set; its files are compared by their paths relative to it): no
directory that a checkpoint alone names is ever read or listed.

Exit codes: 0 on success (also when ``--resume`` finds the run finished, which
it reports); 2 for a user error (the usage line, then one line on stderr); 1
for an I/O error during the run; 130 when interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

import brainstate
import jax
import optax

from . import BPTT, D_RTRL, ES_D_RTRL
from .data import (delayed_bars, digits_saccades, moving_bars, stream_directory,
                   synthetic_shd)
from ._npy_files import available_memory
from .models import recurrent_conv_snn
from .training import NONFINITE, Trainer, checkpoint, run_dir
from .training.fingerprint import data_change
from .training.loss import DEFAULT_TARGET_RATES, LOSSES

__all__ = ['main', 'build_parser', 'TASK_DEFAULTS', 'MODEL_DEFAULTS', 'RUN_OPTIONS',
           'SHD_CHANNELS', 'DEFAULT_CACHE_SIZE']

PROG = 'braintrace-conv'

#: Per-task defaults: samples, frame size (pixels), time steps, epochs (and for
#: delayed-bars the trials, their blank steps, the membrane time constant and the
#: training: a loss at the last step, whose gradient through the delay needs clipping).
#: A task without ``samples`` or ``size`` takes them from its data (the option is refused).
TASK_DEFAULTS = {
    'moving-bars': dict(samples=2048, size=16, steps=20, epochs=6),
    'delayed-bars': dict(samples=768, size=8, steps=128, cues=4, delay=24, tau=5.0,
                         loss='final', lr=2e-3, clip_norm=1.0, epochs=24),
    'digits': dict(samples=1797, size=16, steps=24, epochs=6),
    'shd': dict(samples=1000, steps=50, epochs=8),
    'events': dict(steps=20, epochs=6),
}
#: Model defaults by the number of spatial axes of the frames: kernel extent and the
#: pooling window after each block (1-D streams over many channels are pooled).
MODEL_DEFAULTS = {1: dict(kernel_size=7, pool=4), 2: dict(kernel_size=3, pool=1),
                  3: dict(kernel_size=3, pool=1)}
#: Channels of the SHD-like task (those of the Spiking Heidelberg Digits).
SHD_CHANNELS = 700
#: Samples whose frames a streamed dataset keeps in memory, unless --cache-size says.
DEFAULT_CACHE_SIZE = 256
#: Smallest frame (pixels per side) of each synthetic task that poses it: moving bars
#: smaller than 4 x 4 give identical recordings for different directions; digits need
#: room for a digit of 8 pixels.
MIN_SIZE = {'moving-bars': 4, 'delayed-bars': 4, 'digits': 8}
#: Defaults of the options that a task may set otherwise (``TASK_DEFAULTS``).
OVERRIDABLE_DEFAULTS = dict(loss='every-step', lr=5e-3, tau=10.0)
#: Largest ``metrics.json`` that ``evaluate`` reads to confirm a run's data directory.
MAX_METRICS_BYTES = 64 * 2**20
#: Largest --seed (the generators take 64-bit seeds).
MAX_SEED = 2**63 - 1
ALGORITHMS = ('es-d-rtrl', 'd-rtrl', 'bptt')
#: The options that define a run: stored with it, and equal on ``--resume``.
RUN_OPTIONS = ('task', 'algorithm', 'epochs', 'batch_size', 'seed', 'lr', 'samples', 'size',
               'steps', 'test_fraction', 'channels', 'kernel_size', 'pool', 'tau', 'decay',
               'update_every', 'loss', 'final_steps', 'target_rates', 'rate_target',
               'rate_strength', 'nonfinite', 'data', 'sensor_size', 'window_us', 'stream',
               'window', 'delay', 'cues', 'clip_norm')
# Run options given as several values (``--target-rates 0.9 0.1``), not comma-separated.
MULTI_VALUE_OPTIONS = ('target_rates', 'rate_target')
# Options that only some tasks take.
_BARS_AND_DIGITS = ('moving-bars', 'delayed-bars', 'digits')
_TASK_OPTIONS = {'size': _BARS_AND_DIGITS, 'samples': (*_BARS_AND_DIGITS, 'shd'),
                 'delay': ('delayed-bars',), 'cues': ('delayed-bars',),
                 'data': ('events',), 'sensor_size': ('events',), 'window_us': ('events',),
                 'stream': ('events',), 'cache_size': ('events',)}


class UsageError(Exception):
    """A user error: shown as the usage line and one line of message, exit code 2."""

    def __init__(self, message: str, usage: str = ''):
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message, self.format_usage())


def _version() -> str:
    try:
        return metadata.version('braintrace_conv')
    except metadata.PackageNotFoundError:
        return 'unknown (not installed)'


def _channels(text: str) -> tuple:
    try:
        channels = tuple(int(c) for c in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'expected comma-separated ints such as 8,16, got {text!r}') from None
    if not channels or min(channels) <= 0:
        raise argparse.ArgumentTypeError(f'channels must be positive, got {text!r}')
    return channels


def _path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError('expected a path, got an empty string')
    return Path(text)


def _sensor_size(text: str) -> tuple:
    try:
        size = tuple(int(c) for c in text.split(','))
    except ValueError:
        size = ()
    if not 2 <= len(size) <= 4 or min(size) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected the sensor size in tonic's order, 2 to 4 comma-separated positive ints "
            f"with the polarities last, such as 700,1,1 or 34,34,2, got {text!r}")
    return size


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``braintrace-conv`` (errors raise :class:`UsageError`)."""
    parser = _Parser(prog=PROG, description='Online training of recurrent spiking conv nets.')
    parser.add_argument('--version', action='version', version=f'{PROG} {_version()}')
    commands = parser.add_subparsers(dest='command', required=True, parser_class=_Parser)
    train = commands.add_parser(
        'train', usage='%(prog)s [options]  (see --help)',
        help='train a recurrent spiking conv net on a synthetic or recorded event dataset',
        description='Train a recurrent spiking conv net. Tasks: moving-bars (DVS-like), '
                    'delayed-bars (--cues trials of a moving bar then --delay blank steps; '
                    'the last bar\'s direction is asked for at the last step), digits '
                    '(digit saccades), shd (SHD-like spoken words, 700 channels, 1-D '
                    'convolutions), events (a directory DATA/<class>/<sample>.npy|.npz of '
                    'tonic-format events). Task defaults: ' + '; '.join(
                        f'{task}: ' + ', '.join(f'{k}={v}' for k, v in defaults.items())
                        for task, defaults in TASK_DEFAULTS.items()) + '. Model defaults by '
                    'frame rank: ' + '; '.join(
                        f'{rank}-D: ' + ', '.join(f'{k}={v}' for k, v in defaults.items())
                        for rank, defaults in MODEL_DEFAULTS.items()) + '.')
    train.add_argument('--task', choices=tuple(TASK_DEFAULTS), default='moving-bars')
    train.add_argument('--data', type=_path, metavar='DIR',
                       help='events: directory with one sub-directory of event files per class')
    train.add_argument('--sensor-size', type=_sensor_size, metavar='X,Y,P',
                       help="events: sensor size in tonic's order, e.g. 700,1,1 (1-D, fields "
                            "t, x, p) or 34,34,2 (2-D, fields t, x, y, p)")
    train.add_argument('--window-us', type=float, metavar='W',
                       help='events: time bins of W microseconds from each recording\'s first '
                            'event, --steps of them (default: --steps equal bins spanning '
                            'each recording)')
    train.add_argument('--stream', action='store_true',
                       help='events: read and bin files per batch instead of loading them all')
    train.add_argument('--cache-size', type=int, metavar='N',
                       help='events with --stream: samples whose frames stay in memory '
                            f'(default {DEFAULT_CACHE_SIZE})')
    train.add_argument('--devices', type=int, metavar='N',
                       help='data-parallel devices (default: all of jax.devices()); the batch '
                            'size must be a multiple of their number')
    train.add_argument('--algorithm', choices=ALGORITHMS, default='es-d-rtrl')
    train.add_argument('--epochs', type=int, help='training epochs (task default)')
    train.add_argument('--batch-size', type=int, default=32)
    train.add_argument('--seed', type=int, default=0,
                       help='seeds the data, the initial weights and the shuffling')
    train.add_argument('--out', type=_path,
                       help='run directory (default runs/<task>-<algorithm>)')
    train.add_argument('--lr', type=float,
                       help='peak Adam learning rate (cosine decay to 10%% of it; default '
                            f'{OVERRIDABLE_DEFAULTS["lr"]:g}, task default if set)')
    train.add_argument('--clip-norm', type=float, metavar='C',
                       help='scale every gradient down to global norm at most C before Adam '
                            '(default: no clipping; 1 for delayed-bars; 0: none)')
    train.add_argument('--samples', type=int,
                       help='dataset size, train + test (moving-bars, delayed-bars, digits, '
                            'shd; task default)')
    train.add_argument('--size', type=int,
                       help='frame height = width in pixels (moving-bars, delayed-bars, digits; '
                            'task default)')
    train.add_argument('--steps', type=int, help='time steps T per sample (task default)')
    train.add_argument('--delay', type=int, metavar='STEPS',
                       help='delayed-bars: blank steps after each moving bar; the bar fills '
                            'the rest of a trial (task default)')
    train.add_argument('--cues', type=int, metavar='N',
                       help='delayed-bars: trials per sample, each --steps / N steps long; the '
                            'label is the last bar\'s direction, the others are distractors '
                            '(task default)')
    train.add_argument('--test-fraction', type=float, default=0.25)
    train.add_argument('--channels', type=_channels, default=(8, 16),
                       help='channels of the spiking blocks, e.g. 8,16')
    train.add_argument('--kernel-size', type=int, metavar='K',
                       help='kernel extent along every spatial axis (default by frame rank)')
    train.add_argument('--pool', type=int, metavar='P',
                       help='average the spikes of each block over windows of this many '
                            'positions per axis; 1: none (default by frame rank)')
    train.add_argument('--tau', type=float,
                       help='membrane time constant, ms (default '
                            f'{OVERRIDABLE_DEFAULTS["tau"]:g}, task default if set)')
    train.add_argument('--decay', type=float,
                       help='ES-D-RTRL trace decay (default exp(-dt/tau), dt = 1 ms)')
    train.add_argument('--update-every', type=int,
                       help='truly online: optimiser step every K time steps '
                            '(default: once per batch of sequences)')
    train.add_argument('--window', type=int, metavar='K',
                       help='d-rtrl / es-d-rtrl: exact BPTT inside windows of K steps, '
                            'eligibility traces across them (memory grows with K, not T; '
                            'default: traces only)')
    train.add_argument('--loss', choices=tuple(n.replace('_', '-') for n in LOSSES),
                       help='cross-entropy at every step (default, unless the task sets it) '
                            'or the final steps; or a loss of the '
                            'whole sequence (not with --update-every): cross-entropy or MSE '
                            'of spike counts, cross-entropy of the maximum or mean over time '
                            'of the readout (braintrace_conv.training.loss)')
    train.add_argument('--final-steps', type=int,
                       help='with --loss final: number of last steps in the loss (default 1)')
    train.add_argument('--target-rates', type=float, nargs=2, default=DEFAULT_TARGET_RATES,
                       metavar=('TRUE', 'OTHER'),
                       help='with --loss count-mse: target output rate per step of the true '
                            'class and of the others (default %(default)s)')
    train.add_argument('--rate-target', type=float, nargs='+', metavar='RATE',
                       help='firing-rate regulariser: target fraction of neurons spiking per '
                            'step, one for every block or one per block')
    train.add_argument('--rate-strength', type=float, default=1.0,
                       help='with --rate-target: weight of the regulariser')
    train.add_argument('--nonfinite', choices=NONFINITE, default='skip',
                       help='an update with a non-finite gradient is never applied: skip it '
                            '(counted, warned) or stop the run')
    train.add_argument('--log-every', type=int, default=1,
                       help='batches between rows of scalars.csv (and TensorBoard)')
    existing = train.add_mutually_exclusive_group()
    existing.add_argument('--resume', action='store_true',
                          help='continue the run in OUT from its last checkpoint (the run '
                               'options must be those of the run; a larger --epochs extends '
                               'a finished run)')
    existing.add_argument('--overwrite', action='store_true',
                          help='replace the run in OUT (otherwise a run there is an error)')
    train.add_argument('--quiet', action='store_true', help='no progress bar or epoch lines')
    train.set_defaults(usage=train.format_usage())

    evaluate = commands.add_parser(
        'evaluate', usage='%(prog)s --run DIR [options]  (see --help)',
        help='evaluate a saved run on its test set',
        description='Rebuild the test set and model of a run written by "train", load its '
                    'parameters and report test loss, accuracy and spike rates.')
    evaluate.add_argument('--run', type=_path, required=True, help='run directory')
    evaluate.add_argument('--checkpoint', choices=tuple(run_dir.CHECKPOINTS),
                          help='which parameters (default: best if the run has it, else last)')
    evaluate.add_argument('--batch-size', type=int, default=64)
    evaluate.add_argument('--devices', type=int, metavar='N',
                          help='data-parallel devices (default: all of jax.devices())')
    evaluate.add_argument('--data', type=_path, metavar='DIR',
                          help='runs of --task events: the directory to rebuild the test set '
                               'from, e.g. a moved or copied data set (default: the one the '
                               'run recorded, if its checkpoint and its metrics.json agree; '
                               'no other directory is read)')
    evaluate.add_argument('--allow-data-change', action='store_true',
                          help='evaluate even if the test data differ from those the run was '
                               'evaluated on (by default an error)')
    evaluate.set_defaults(usage=evaluate.format_usage())
    return parser


def _option(name: str) -> str:
    return '--' + name.replace('_', '-')


def _frame_rank(args) -> int:
    """Number of spatial axes of the task's frames (which convolutions the model uses)."""
    if args.task == 'shd':
        return 1
    if args.task != 'events':
        return 2
    size = args.sensor_size      # tonic's order; (X, P) and (X, 1, P) are 1-D sensors
    return 1 if len(size) == 2 or (len(size) == 3 and size[1] == 1) else len(size) - 1


def _fill_model_defaults(args) -> None:
    for key, value in MODEL_DEFAULTS[_frame_rank(args)].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def _devices(requested: Optional[int], usage: str) -> int:
    """The number of devices to use, checked against those available."""
    available = jax.devices()
    if requested is None:
        return len(available)
    if requested <= 0:
        raise UsageError(f'--devices must be positive, got {requested}', usage)
    if requested > len(available):
        raise UsageError(f'--devices {requested} exceeds the {len(available)} available '
                         f'{available[0].platform} device(s); on a CPU, set XLA_FLAGS='
                         f'--xla_force_host_platform_device_count={requested} before starting',
                         usage)
    return requested


def _resolve(args: argparse.Namespace, usage: str) -> argparse.Namespace:
    """Fill task and model defaults and check ranges; raises :class:`UsageError`."""
    def fail(message):
        raise UsageError(message, usage)

    for name, tasks in _TASK_OPTIONS.items():
        given = getattr(args, name) is not None and getattr(args, name) is not False
        if given and args.task not in tasks:
            fail(f'{_option(name)} applies only to --task {" or ".join(tasks)}')
    if args.task == 'events':
        if args.data is None or args.sensor_size is None:
            fail('--task events needs --data DIR and --sensor-size X,Y,P')
        if not Path(args.data).is_dir():
            fail(f'--data {args.data} is not a directory')
        args.data = str(Path(args.data).resolve())
        if args.cache_size is not None and not args.stream:
            fail('--cache-size applies only with --stream')
        if args.cache_size is not None and args.cache_size < 0:
            fail(f'--cache-size must be non-negative, got {args.cache_size}')
        if args.stream and args.cache_size is None:
            args.cache_size = DEFAULT_CACHE_SIZE
        if args.window_us is not None and not (args.window_us > 0
                                               and math.isfinite(args.window_us)):
            fail(f'--window-us must be a positive number, got {args.window_us}')
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, value in OVERRIDABLE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _fill_model_defaults(args)
    for name in ('epochs', 'batch_size', 'samples', 'size', 'steps', 'delay', 'cues',
                 'final_steps', 'log_every', 'kernel_size', 'pool'):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f'{_option(name)} must be positive, got {getattr(args, name)}')
    if not 0 <= args.seed <= MAX_SEED:
        fail(f'--seed must lie in [0, {MAX_SEED}], got {args.seed}')
    if args.task in MIN_SIZE and args.size < MIN_SIZE[args.task]:
        fail(f'--size must be at least {MIN_SIZE[args.task]} for --task {args.task}, got '
             f'{args.size}')
    if args.task == 'moving-bars' and args.steps < 2:
        fail(f'--steps must be at least 2 for --task moving-bars (a single frame is equally '
             f'consistent with opposite directions), got {args.steps}')
    if args.task == 'delayed-bars':
        if args.steps % args.cues:
            fail(f'--steps ({args.steps}) must be a multiple of --cues ({args.cues}), one trial '
                 f'each')
        if args.steps // args.cues - args.delay < 2:
            fail(f'--delay ({args.delay}) must leave at least 2 of each trial\'s '
                 f'{args.steps // args.cues} steps (--steps / --cues) to the moving bar (a '
                 f'single frame is equally consistent with opposite directions)')
    if args.update_every is not None and args.update_every <= 0:
        fail(f'--update-every must be positive, got {args.update_every}')
    if not (args.lr > 0 and math.isfinite(args.lr)):
        fail(f'--lr must be a positive number, got {args.lr}')
    if args.clip_norm is not None and not (args.clip_norm >= 0
                                           and math.isfinite(args.clip_norm)):
        fail(f'--clip-norm must be a non-negative number, got {args.clip_norm}')
    if not (args.tau > 0 and math.isfinite(args.tau)):
        fail(f'--tau must be a positive number, got {args.tau}')
    if not 0 < args.test_fraction < 1:
        fail(f'--test-fraction must lie in (0, 1), got {args.test_fraction}')
    if args.decay is not None and not 0 < args.decay <= 1:
        fail(f'--decay must lie in (0, 1], got {args.decay}')
    if args.decay is not None and args.algorithm != 'es-d-rtrl':
        fail('--decay applies only to --algorithm es-d-rtrl')
    if args.final_steps is not None and args.loss != 'final':
        fail('--final-steps applies only with --loss final')
    if args.final_steps is None:
        args.final_steps = 1
    if args.window is not None and args.window <= 0:
        fail(f'--window must be positive, got {args.window}')
    if args.window is not None and args.algorithm == 'bptt':
        fail('--window applies only to --algorithm d-rtrl or es-d-rtrl (BPTT is exact already)')
    if args.window is not None and args.update_every is not None \
            and args.window > args.update_every:
        fail(f'--window ({args.window}) exceeds --update-every ({args.update_every}): a window '
             f'never spans two online chunks')
    if args.loss == 'final' and args.final_steps > args.steps:
        fail(f'--final-steps ({args.final_steps}) exceeds --steps ({args.steps})')
    args.devices = _devices(args.devices, usage)
    if args.batch_size % args.devices:
        fail(f'--batch-size ({args.batch_size}) must be a multiple of the number of devices '
             f'({args.devices}; set with --devices): each takes an equal share of the batch')
    if args.out is None:
        args.out = Path('runs') / f'{args.task}-{args.algorithm}'
    return args


# Options stored only when they take effect, so runs made before they existed still resume.
_STORED_WHEN = {'target_rates': lambda args: args.loss == 'count-mse',
                'rate_target': lambda args: bool(args.rate_target),
                'rate_strength': lambda args: bool(args.rate_target),
                'window': lambda args: args.window is not None,
                'delay': lambda args: args.delay is not None,
                'cues': lambda args: args.cues is not None,
                'clip_norm': lambda args: args.clip_norm is not None}


def _run_config(args) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in vars(args).items()
            if k in RUN_OPTIONS and _STORED_WHEN.get(k, lambda args: True)(args)}


def _bytes(n: int) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'):
        if n < 1024 or unit == 'PiB':
            return f'{n:.3g} {unit}'
        n /= 1024


def _check_memory(samples: int, steps: int, frame_shape: tuple, remedy: str,
                  usage: str) -> None:
    """Refuse, before allocating it, a dataset that cannot fit in memory: its float32
    events ``samples x steps x frame``, held twice (the data and its split)."""
    need = 2 * 4 * samples * steps * math.prod(frame_shape)
    available = available_memory()
    if available is not None and need > available:
        frame = ' x '.join(map(str, frame_shape))
        raise UsageError(f'the dataset needs about {_bytes(need)} ({samples} samples x '
                         f'{steps} steps x {frame} float32, with its train/test split) but '
                         f'{_bytes(available)} of memory is available; {remedy}', usage)


def _check_model_memory(args, frame_shape: tuple, num_classes: int, usage: str) -> None:
    """Refuse, before building it, a model whose parameters (with their gradient and two
    Adam moments, in float64 as they are drawn) cannot fit in memory."""
    rank, channels = len(frame_shape) - 1, (frame_shape[0], *args.channels)
    kernel = args.kernel_size ** rank
    weights = sum(kernel * c_in * c_out for c_in, c_out in zip(channels, channels[1:]))
    weights += sum(kernel * c * c for c in args.channels[1:])     # recurrent kernels
    weights += args.channels[-1] * math.prod(frame_shape[1:]) * num_classes   # readout, at most
    need, available = 4 * 8 * weights, available_memory()
    if available is not None and need > available:
        raise UsageError(f'the model needs about {_bytes(need)} for its {weights:.3g} weights '
                         f'(with gradients and optimiser state) but {_bytes(available)} of '
                         f'memory is available; lower --channels or --kernel-size', usage)


def _dataset(args, usage: str):
    """The task's dataset, checked to fit in memory unless streamed."""
    if args.task == 'events':
        # one recording's frames are built before anything else is known
        _check_memory(1, args.steps, args.sensor_size, 'lower --sensor-size or --steps', usage)
        binning = dict(n_time_bins=args.steps)
        if args.window_us is not None:
            binning['time_window_us'] = args.window_us
        data = stream_directory(args.data, sensor_size=tuple(args.sensor_size),
                                cache_size=args.cache_size if args.stream else 1, **binning)
        if args.stream:
            return data
        _check_memory(len(data), args.steps, data.frame_shape, 'lower --steps or pass --stream',
                      usage)
        return data.to_memory()
    if args.task == 'shd':
        _check_memory(args.samples, args.steps, (1, SHD_CHANNELS), 'lower --samples or --steps',
                      usage)
        return synthetic_shd(args.samples, T=args.steps, n_channels=SHD_CHANNELS,
                             seed=args.seed)[0]
    size = (args.size, args.size)
    _check_memory(args.samples, args.steps, (2, *size), 'lower --samples, --size or --steps',
                  usage)
    if args.task == 'moving-bars':
        return moving_bars(args.samples, T=args.steps, size=size, seed=args.seed)
    if args.task == 'delayed-bars':
        return delayed_bars(args.samples, stimulus_steps=args.steps // args.cues - args.delay,
                            delay_steps=args.delay, cues=args.cues, size=size, seed=args.seed)
    return digits_saccades(n_samples=args.samples, T=args.steps, size=size,
                           digit_size=min(12, args.size), seed=args.seed)


def _learner(args, model):
    if args.algorithm == 'bptt':
        return BPTT(model)
    if args.algorithm == 'd-rtrl':
        return D_RTRL(model, window=args.window)
    decay = model.membrane_decay() if args.decay is None else args.decay
    return ES_D_RTRL(model, decay, window=args.window)


def _setup(args, usage: str, *, train: bool = True):
    """``(trainer, train set, test set)`` from the run options; bad values raise
    :class:`UsageError`."""
    try:
        data = _dataset(args, usage)
        _check_model_memory(args, data.frame_shape, data.num_classes, usage)
        train_set, test_set = data.split(args.test_fraction, seed=args.seed)
        if args.batch_size > len(train_set):
            raise ValueError(f'--batch-size ({args.batch_size}) exceeds the {len(train_set)} '
                             f'training samples')
        brainstate.random.seed(args.seed)
        model = recurrent_conv_snn(data.frame_shape, data.num_classes, channels=args.channels,
                                   kernel_size=args.kernel_size, pool=args.pool, tau=args.tau,
                                   return_spikes=bool(args.rate_target))
        optimizer = None
        if train:
            total_updates = args.epochs * (len(train_set) // args.batch_size)
            if args.update_every is not None:
                total_updates *= math.ceil(args.steps / args.update_every)
            optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, total_updates,
                                                               alpha=0.1))
            if args.clip_norm:
                optimizer = optax.chain(optax.clip_by_global_norm(args.clip_norm), optimizer)
        trainer = Trainer(_learner(args, model), optimizer, loss=args.loss.replace('-', '_'),
                          final_steps=args.final_steps, target_rates=args.target_rates,
                          rate_targets=_rate_targets(args.rate_target, len(args.channels)),
                          rate_strength=args.rate_strength, update_every=args.update_every,
                          nonfinite=args.nonfinite, devices=args.devices)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error), usage) from None
    return trainer, train_set, test_set


def _rate_targets(rates, blocks: int) -> Optional[dict]:
    """``--rate-target``: one rate for every block, or one per block, as Trainer's
    ``rate_targets`` (the blocks' neurons, named as the model returns their spikes)."""
    if not rates:
        return None
    if len(rates) not in (1, blocks):
        raise ValueError(f'--rate-target takes one rate or one per block ({blocks}), got '
                         f'{len(rates)}.')
    return {f'blocks.{i}.neuron': r for i, r in enumerate(rates * blocks if len(rates) == 1
                                                          else rates)}


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ','.join(map(str, value))
    return 'unset' if value is None else str(value)


def _check_resume(args, usage: str) -> Optional[dict]:
    """The metadata of the run to resume, checked against the options; ``None`` with a
    message if the run is already finished (and nothing lags behind its last checkpoint)."""
    path = args.out / run_dir.LAST_CHECKPOINT
    try:
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    differences = checkpoint.config_differences(stored, _run_config(args))
    old_epochs = differences.get('epochs', (None,))[0]
    if isinstance(old_epochs, int) and old_epochs <= args.epochs:
        del differences['epochs']    # a longer run continues this one
    if differences:
        listed = ', '.join(f'{_option(k)} {_shown(old)} (now {_shown(new)})'
                           for k, (old, new) in differences.items())
        raise UsageError(f'--resume: the run in {args.out} was trained with other options: '
                         f'{listed}; give the same options, or another --out', usage)
    if meta['epoch'] >= args.epochs:
        lagging = run_dir.lagging(args.out, meta['epoch'], meta.get('best'))
        if lagging:
            print(f'the run in {args.out} is finished ({meta["epoch"]} epochs) but was '
                  f'interrupted while writing its files; repairing {", ".join(lagging)}')
            return meta
        print(f'the run in {args.out} is already finished ({meta["epoch"]}/{args.epochs} '
              f'epochs); nothing to do. Evaluate it with: {PROG} evaluate --run {args.out}, '
              f'or extend it with a larger --epochs')
        return None
    if isinstance(old_epochs, int) and old_epochs < args.epochs:
        print(f'extending the run in {args.out} from {old_epochs} to {args.epochs} epochs (the '
              f'learning-rate schedule is stretched over {args.epochs} epochs from here on)')
    return meta


def _out_error(args, error: Exception, usage: str) -> UsageError:
    """A refused run directory as a user error naming the command-line options."""
    if isinstance(error, FileExistsError):
        found = ', '.join(run_dir.run_files(args.out))
        return UsageError(f'--out {args.out} already holds a run ({found}); pass --resume to '
                          f'continue it or --overwrite to replace it', usage)
    if isinstance(error, FileNotFoundError):
        return UsageError(f'--resume: {args.out} has no checkpoint ({run_dir.LAST_CHECKPOINT}) '
                          f'to resume', usage)
    return UsageError(f'--out: {error}', usage)


def _remove_new_run(args) -> bool:
    """After a new run failed before its first checkpoint: remove the run files it wrote
    (the directory held no run before, or was to be replaced), under the directory's lock.
    Returns whether it did. A directory the run created is removed by :func:`_train` once
    the lock is released, if it is empty then."""
    if args.resume or (args.out / run_dir.LAST_CHECKPOINT).exists():
        return False
    try:
        run_dir.create(args.out, overwrite=True)
    except OSError:
        return False
    args.emptied = True
    return True


def _train(args, usage: str, start: float) -> int:
    args = _resolve(args, usage)
    args.out_existed, args.emptied = os.path.lexists(args.out), False
    try:
        run_dir.check(args.out, resume=args.resume, overwrite=args.overwrite)
    except (OSError, ValueError, run_dir.RunLockedError) as error:
        raise _out_error(args, error, usage) from None
    if args.resume and _check_resume(args, usage) is None:
        return 0
    trainer, train, test = _setup(args, usage)
    try:
        # every write to the run directory, the last metrics.json included, holds its lock
        with contextlib.ExitStack() as lock:
            try:
                lock.enter_context(run_dir.locked(args.out))
                run_dir.create(args.out, overwrite=False)
            except OSError as error:
                raise UsageError(f'--out {args.out} cannot be written: '
                                 f'{error.strerror or error}', usage) from None
            except run_dir.RunLockedError as error:
                raise _out_error(args, error, usage) from None
            return _fit(args, usage, start, trainer, train, test)
    finally:
        if args.emptied and not args.out_existed:
            with contextlib.suppress(OSError):
                args.out.rmdir()    # only if empty


def _fit(args, usage: str, start: float, trainer: Trainer, train, test) -> int:
    """Train (holding the run directory's lock), write the final metrics and report."""
    learner = trainer.learner
    if not args.quiet:
        print(f'{args.task}: {len(train)} train / {len(test)} test samples, '
              f'T={train.num_steps}, frames {train.frame_shape}; {learner.algorithm}'
              + (f' (decay {learner.decay:.4f})' if isinstance(learner, ES_D_RTRL) else '')
              + (f', exact within windows of {learner.window} steps'
                 if getattr(learner, 'window', None) else '')
              + f'; {args.devices} device(s); run directory {args.out}', flush=True)
    try:
        trainer.fit(train, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                    eval_dataset=test, out_dir=args.out, progress=not args.quiet,
                    resume=args.resume, overwrite=args.overwrite, run_config=_run_config(args),
                    log_every=args.log_every)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    except (FileExistsError, FileNotFoundError, run_dir.RunLockedError) as error:
        raise _out_error(args, error, usage) from None   # another process came first
    except (ValueError, TypeError) as error:    # bad data met while training (streamed files)
        _remove_new_run(args)
        raise UsageError(f'--data: {error}' if args.task == 'events' else str(error),
                         usage) from None
    except KeyboardInterrupt:
        if trainer.epoch:
            hint = (f'epochs 1-{trainer.epoch} are saved in {args.out}; rerun with --resume and '
                    f'the same options to continue')
        elif _remove_new_run(args):
            hint = 'no epoch was completed, and nothing was kept'
        else:
            hint = 'no epoch was completed; rerun with --overwrite to start again'
        print(f'{PROG}: interrupted; {hint}', file=sys.stderr)
        raise SystemExit(130)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics = trainer.write_logs(args.out, task=args.task, wall_time_s=wall,
                                 peak_rss_mb=peak_mb, num_train=len(train), num_test=len(test))
    if trainer.step and trainer.skipped_updates == trainer.step:
        warnings.warn(f'all {trainer.step} updates were skipped for non-finite values, so the '
                      f'model did not learn; lower --lr (now {args.lr:g})', RuntimeWarning)
    print(f"test accuracy {metrics['test_accuracy']:.1%} | wall time {wall:.1f} s | "
          f"peak RSS {peak_mb:.0f} MB")
    return 0


def _evaluate(args, usage: str) -> int:
    if args.batch_size <= 0:
        raise UsageError(f'--batch-size must be positive, got {args.batch_size}', usage)
    try:
        path = run_dir.checkpoint_file(args.run, args.checkpoint)
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except (FileNotFoundError, checkpoint.CheckpointError) as error:
        raise UsageError(f'--run: {error}', usage) from None
    missing = [k for k in ('task', 'algorithm') if k not in stored]
    if missing:
        raise UsageError(f'--run: {path} was not written by "{PROG} train" (its run options '
                         f'lack {", ".join(missing)})', usage)
    run = _stored_run(dict(stored, data=_evaluation_data(args, stored, path, usage)), path,
                      usage)
    run.devices = _devices(args.devices, usage)
    try:
        trainer, _, test = _setup(run, usage, train=False)
    except UsageError as error:
        raise UsageError(f'--run: the data or model of the run in {path} cannot be rebuilt: '
                         f'{error}', usage) from None
    _check_test_data(test, meta, path, args.allow_data_change, usage)
    try:
        meta = trainer.load_params(path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--run: {error}', usage) from None
    result = trainer.evaluate(test, args.batch_size)
    rates = ', '.join(f'{k} {v:.3f}' for k, v in result['spike_rates'].items())
    print(f'{path.name} (epoch {meta["epoch"]}) of {args.run}: {run.task}, {len(test)} test '
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


def _evaluation_data(args, stored: dict, path: Path, usage: str):
    """The data directory to rebuild the test set of the run stored in the checkpoint
    ``path`` from: ``--data``, or (a run of --task events) the one the run recorded both in
    that checkpoint and in the ``metrics.json`` beside it. No directory a crafted
    checkpoint names alone is ever read or listed."""
    if stored.get('task') != 'events':
        if args.data is not None:
            raise UsageError(f'--data applies only to runs of --task events; the run in {path} '
                             f'is of --task {stored.get("task")}', usage)
        return stored.get('data')
    if args.data is not None:
        if not args.data.is_dir():
            raise UsageError(f'--data {args.data} is not a directory', usage)
        return str(args.data)
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


def _stored_run(stored: dict, path, usage: str) -> argparse.Namespace:
    """The run options stored with a run, parsed and checked as the command line's are
    (options an earlier version did not store take their defaults)."""
    argv = ['train']
    for key in RUN_OPTIONS:
        value = stored.get(key)
        if key == 'final_steps' and stored.get('loss') != 'final':
            continue        # stored by every run, meaningful only with --loss final
        if value is True:
            argv.append(_option(key))
        elif key in MULTI_VALUE_OPTIONS and isinstance(value, list):
            argv += [_option(key), *map(str, value)]
        elif value is not None and value is not False:
            shown = ','.join(map(str, value)) if isinstance(value, list) else value
            argv.append(f'{_option(key)}={shown}')
    try:
        run = build_parser().parse_args(argv)
        run.devices = 1     # checked against evaluate's own --devices afterwards
        return _resolve(run, usage)
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


def _run(argv: Optional[Sequence[str]], start: float) -> int:
    args = build_parser().parse_args(argv)
    if args.command == 'train':
        return _train(args, args.usage, start)
    return _evaluate(args, args.usage)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f'{PROG}: warning: {" ".join(str(message).split())}', file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code.
    Warnings are shown as one line each on stderr."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _run(argv, start)
    except UsageError as error:
        print(f'{error.usage.strip()}\n{PROG}: error: {" ".join(str(error).split())}',
              file=sys.stderr)
        return 2
    except SystemExit as exit_:   # --help, --version, interruption
        return exit_.code if isinstance(exit_.code, int) else 0
    except KeyboardInterrupt:
        print(f'{PROG}: interrupted', file=sys.stderr)
        return 130
    except OSError as error:
        print(f'{PROG}: error: {error}', file=sys.stderr)
        return 1
    except MemoryError:
        print(f'{PROG}: error: out of memory; lower the sizes of the task or the model '
              f'(--samples, --size, --steps, --channels, --batch-size)', file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
