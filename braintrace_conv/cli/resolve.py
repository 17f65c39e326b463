"""Resolved run options: task and model defaults filled in and every value checked."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Optional

import jax

from .options import (_TASK_OPTIONS, DEFAULT_CACHE_SIZE, MAX_SEED, MIN_SIZE, MODEL_DEFAULTS,
                      OVERRIDABLE_DEFAULTS, RUN_OPTIONS, TASK_DEFAULTS)
from .parser import UsageError, _option


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

