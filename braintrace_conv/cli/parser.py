"""The argument parser of ``braintrace-conv``: its options, their values and the usage errors."""
from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

from ..training import NONFINITE, run_dir
from ..training.loss import DEFAULT_TARGET_RATES, LOSSES
from .options import (ALGORITHMS, DEFAULT_CACHE_SIZE, MODEL_DEFAULTS, OVERRIDABLE_DEFAULTS,
                      TASK_DEFAULTS)

PROG = 'braintrace-conv'


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

