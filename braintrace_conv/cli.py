"""The ``braintrace-conv`` command: train a recurrent spiking conv net on event streams.

``braintrace-conv train`` generates a dataset (no downloads), builds
:func:`~braintrace_conv.models.recurrent_conv_snn`, trains it with the chosen
executor through :class:`~braintrace_conv.training.Trainer` and writes
``metrics.json``, ``learning_curve.png`` and ``checkpoint.pkl`` into ``--out``.
It ends with the test accuracy, the wall time and the peak resident memory.

Exit codes: 0 on success, 2 for invalid arguments (one line on stderr).
"""
from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import brainstate
import optax

from . import BPTT, D_RTRL, ES_D_RTRL
from .data import digits_saccades, moving_bars
from .models import recurrent_conv_snn
from .training import Trainer

__all__ = ['main', 'build_parser', 'TASK_DEFAULTS']

PROG = 'braintrace-conv'

#: Per-task defaults: samples, frame size (pixels), time steps, epochs.
TASK_DEFAULTS = {
    'moving-bars': dict(samples=2048, size=16, steps=20, epochs=6),
    'digits': dict(samples=1797, size=16, steps=24, epochs=6),
}
ALGORITHMS = ('es-d-rtrl', 'd-rtrl', 'bptt')


class UsageError(Exception):
    """An invalid command line; the message is shown as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _channels(text: str) -> tuple:
    try:
        channels = tuple(int(c) for c in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'expected comma-separated ints such as 8,16, got {text!r}') from None
    if not channels or min(channels) <= 0:
        raise argparse.ArgumentTypeError(f'channels must be positive, got {text!r}')
    return channels


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``braintrace-conv`` (errors raise :class:`UsageError`)."""
    parser = _Parser(prog=PROG, description='Online training of recurrent spiking conv nets.')
    commands = parser.add_subparsers(dest='command', required=True, parser_class=_Parser)
    train = commands.add_parser(
        'train', help='train a recurrent spiking conv net on a synthetic event dataset',
        description='Train a recurrent spiking conv net. Task defaults: ' + '; '.join(
            f'{task}: ' + ', '.join(f'{k}={v}' for k, v in defaults.items())
            for task, defaults in TASK_DEFAULTS.items()) + '.')
    train.add_argument('--task', choices=tuple(TASK_DEFAULTS), default='moving-bars')
    train.add_argument('--algorithm', choices=ALGORITHMS, default='es-d-rtrl')
    train.add_argument('--epochs', type=int, help='training epochs (task default)')
    train.add_argument('--batch-size', type=int, default=32)
    train.add_argument('--seed', type=int, default=0,
                       help='seeds the data, the initial weights and the shuffling')
    train.add_argument('--out', type=Path,
                       help='output directory (default runs/<task>-<algorithm>)')
    train.add_argument('--lr', type=float, default=5e-3,
                       help='peak Adam learning rate (cosine decay to 10%% of it)')
    train.add_argument('--samples', type=int, help='dataset size, train + test (task default)')
    train.add_argument('--size', type=int, help='frame height = width in pixels (task default)')
    train.add_argument('--steps', type=int, help='time steps T per sample (task default)')
    train.add_argument('--test-fraction', type=float, default=0.25)
    train.add_argument('--channels', type=_channels, default=(8, 16),
                       help='channels of the spiking blocks, e.g. 8,16')
    train.add_argument('--tau', type=float, default=10.0, help='membrane time constant, ms')
    train.add_argument('--decay', type=float,
                       help='ES-D-RTRL trace decay (default exp(-dt/tau), dt = 1 ms)')
    train.add_argument('--update-every', type=int,
                       help='truly online: optimiser step every K time steps '
                            '(default: once per batch of sequences)')
    train.add_argument('--loss', choices=('every-step', 'final'), default='every-step')
    train.add_argument('--final-steps', type=int, default=1,
                       help='with --loss final: number of last steps in the loss')
    train.add_argument('--resume', action='store_true',
                       help='continue from OUT/checkpoint.pkl if it exists')
    train.add_argument('--quiet', action='store_true', help='no progress bar or epoch lines')
    return parser


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill task defaults and check ranges; raises :class:`UsageError`."""
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ('epochs', 'batch_size', 'samples', 'size', 'steps', 'final_steps'):
        if getattr(args, name) <= 0:
            raise UsageError(f'--{name.replace("_", "-")} must be positive, got '
                             f'{getattr(args, name)}')
    if args.update_every is not None and args.update_every <= 0:
        raise UsageError(f'--update-every must be positive, got {args.update_every}')
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f'--lr must be a positive number, got {args.lr}')
    if not args.tau > 0:
        raise UsageError(f'--tau must be positive, got {args.tau}')
    if not 0 < args.test_fraction < 1:
        raise UsageError(f'--test-fraction must lie in (0, 1), got {args.test_fraction}')
    if args.decay is not None and not 0 < args.decay <= 1:
        raise UsageError(f'--decay must lie in (0, 1], got {args.decay}')
    if args.decay is not None and args.algorithm != 'es-d-rtrl':
        raise UsageError('--decay applies only to --algorithm es-d-rtrl')
    if args.loss == 'final' and args.final_steps > args.steps:
        raise UsageError(f'--final-steps ({args.final_steps}) exceeds --steps ({args.steps})')
    if args.out is None:
        args.out = Path('runs') / f'{args.task}-{args.algorithm}'
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f'--out {args.out} exists and is not a directory')
    return args


def _dataset(args):
    size = (args.size, args.size)
    if args.task == 'moving-bars':
        return moving_bars(args.samples, T=args.steps, size=size, seed=args.seed)
    return digits_saccades(n_samples=args.samples, T=args.steps, size=size,
                           digit_size=min(12, args.size), seed=args.seed)


def _learner(args, model):
    if args.algorithm == 'bptt':
        return BPTT(model)
    if args.algorithm == 'd-rtrl':
        return D_RTRL(model)
    decay = model.membrane_decay() if args.decay is None else args.decay
    return ES_D_RTRL(model, decay)


def _setup(args):
    """``(trainer, train set, test set)``; bad values raise ValueError/TypeError."""
    data = _dataset(args)
    train, test = data.split(args.test_fraction, seed=args.seed)
    if args.batch_size > len(train):
        raise ValueError(f'--batch-size ({args.batch_size}) exceeds the {len(train)} training '
                         f'samples')
    brainstate.random.seed(args.seed)
    model = recurrent_conv_snn(data.frame_shape, data.num_classes, channels=args.channels,
                               tau=args.tau)
    total_updates = args.epochs * (len(train) // args.batch_size)
    if args.update_every is not None:
        total_updates *= math.ceil(args.steps / args.update_every)
    schedule = optax.cosine_decay_schedule(args.lr, total_updates, alpha=0.1)
    trainer = Trainer(_learner(args, model), optax.adam(schedule),
                      loss=args.loss.replace('-', '_'), final_steps=args.final_steps,
                      update_every=args.update_every)
    return trainer, train, test


def _run(argv: Optional[Sequence[str]], start: float) -> int:
    args = _resolve(build_parser().parse_args(argv))
    try:
        trainer, train, test = _setup(args)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from None
    learner = trainer.learner
    if not args.quiet:
        print(f'{args.task}: {len(train)} train / {len(test)} test samples, '
              f'T={train.num_steps}, frames {train.frame_shape}; {learner.algorithm}'
              + (f' (decay {learner.decay:.4f})' if isinstance(learner, ES_D_RTRL) else '')
              + f'; output {args.out}', flush=True)
    trainer.fit(train, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                eval_dataset=test, out_dir=args.out, progress=not args.quiet,
                resume=args.resume)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    metrics = trainer.write_logs(args.out, task=args.task, wall_time_s=wall,
                                 peak_rss_mb=peak_mb, num_train=len(train),
                                 num_test=len(test), args=config)
    print(f"test accuracy {metrics['test_accuracy']:.1%} | wall time {wall:.1f} s | "
          f"peak RSS {peak_mb:.0f} MB")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    start = time.perf_counter()
    try:
        return _run(argv, start)
    except UsageError as error:
        print(f'{PROG}: error: {" ".join(str(error).split())}', file=sys.stderr)
        return 2
    except SystemExit as exit_:   # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except KeyboardInterrupt:
        print(f'{PROG}: interrupted; rerun with --resume to continue from the last epoch',
              file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(main())
