"""The data, model and trainer of a run, built from its resolved options."""
from __future__ import annotations

import math
from typing import Optional

import brainstate
import optax

from .. import BPTT, D_RTRL, ES_D_RTRL
from .._npy_files import available_memory
from ..data import (delayed_bars, digits_saccades, moving_bars, stream_directory,
                    synthetic_shd)
from ..models import recurrent_conv_snn
from ..training import Trainer
from .options import SHD_CHANNELS
from .parser import UsageError


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

