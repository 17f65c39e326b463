"""The data, model and trainer of a run, built from its resolved options: data sets checked
to fit in memory before they are made, and the library's refusals named by option."""
from __future__ import annotations

import math
from typing import Optional

import brainstate
import numpy as np
import optax

from .. import BPTT, D_RTRL, ES_D_RTRL
from .._npy_files import available_memory
from ..data import (EventDataset, cue_accumulation, delayed_bars, delayed_match_to_sample,
                    digits_saccades, moving_bars, stream_directory, synthetic_shd)
from ..models import recurrent_conv_snn
from ..training import Trainer
from .options import LONG_MEMORY, SHD_CHANNELS, effective
from .parser import UsageError, usage_error


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


def _check_model_memory(run, frame_shape: tuple, num_classes: int, usage: str) -> None:
    """Refuse, before building it, a model whose parameters (with their gradient and two
    Adam moments, in float64 as they are drawn) cannot fit in memory."""
    rank, channels = len(frame_shape) - 1, (frame_shape[0], *run.channels)
    kernel = run.kernel_size ** rank
    count = sum(kernel * c_in * c_out for c_in, c_out in zip(channels, channels[1:]))
    count += sum(kernel * c * c for c in run.channels[1:])     # recurrent kernels
    count += run.channels[-1] * math.prod(frame_shape[1:]) * num_classes   # readout, at most
    need, available = 4 * 8 * count, available_memory()
    if available is not None and need > available:
        raise UsageError(f'the model needs about {_bytes(need)} for its {count:.3g} parameters '
                         f'(with gradients and optimiser state) but {_bytes(available)} of '
                         f'memory is available; lower --channels or --kernel-size', usage)


def _dataset(run, usage: str):
    """The task's dataset, checked to fit in memory unless streamed."""
    if run.task == 'events':
        # one recording's frames are built before anything else is known
        _check_memory(1, run.steps, run.sensor_size, 'lower --sensor-size or --steps', usage)
        binning = dict(n_time_bins=run.steps)
        if run.window_us is not None:
            binning['time_window_us'] = run.window_us
        data = stream_directory(run.data, sensor_size=tuple(run.sensor_size),
                                cache_size=run.cache_size if run.stream else 1, **binning)
        if run.stream:
            return data
        _check_memory(len(data), run.steps, data.frame_shape, 'lower --steps or pass --stream',
                      usage)
        return data.to_memory()
    if run.task in LONG_MEMORY:
        return _long_memory(run, usage)
    if run.task == 'shd':
        _check_memory(run.samples, run.steps, (1, SHD_CHANNELS), 'lower --samples or --steps',
                      usage)
        return synthetic_shd(run.samples, T=run.steps, n_channels=SHD_CHANNELS,
                             seed=run.seed)[0]
    size = (run.size, run.size)
    _check_memory(run.samples, run.steps, (2, *size), 'lower --samples, --size or --steps',
                  usage)
    if run.task == 'moving-bars':
        return moving_bars(run.samples, T=run.steps, size=size, seed=run.seed)
    if run.task == 'delayed-bars':
        return delayed_bars(run.samples, stimulus_steps=run.steps // run.cues - run.delay,
                            delay_steps=run.delay, cues=run.cues, size=size, seed=run.seed)
    return digits_saccades(n_samples=run.samples, T=run.steps, size=size,
                           digit_size=min(12, run.size), seed=run.seed)


def _long_memory(run, usage: str) -> EventDataset:
    """Cue accumulation or delayed match-to-sample at their published timings, the 40
    input channels as channels of one position (so every block is a dense layer)."""
    make = cue_accumulation if run.task == 'cue-accumulation' else delayed_match_to_sample
    _check_memory(run.samples, run.steps, (40, 1), 'lower --samples', usage)
    data = make(run.samples, seed=run.seed)
    return EventDataset(np.swapaxes(data.events, 2, 3), data.labels, data.num_classes,
                        name=data.name, class_names=data.class_names)


def _learner(run, model):
    """The executor of ``--algorithm``; ES-D-RTRL's decay is ``--decay`` if given, else each
    layer's inferred from its neurons, with exact traces where ``--exact`` and
    ``--exact-budget`` say, and one hop across layers with ``--cross-layer 1``."""
    if run.algorithm == 'bptt':
        return BPTT(model)
    if run.algorithm == 'd-rtrl':
        return D_RTRL(model, window=run.window)
    budget = getattr(run, 'exact_budget', None)
    return ES_D_RTRL(model, run.decay, exact=getattr(run, 'exact', None),
                     exact_budget=None if budget is None else int(budget * 2**20),
                     window=run.window, cross_layer=getattr(run, 'cross_layer', None) or 0)


def trace_choice(learner) -> str:
    """How an ES-D-RTRL learner traces its layers, for a run's first line (``''`` for the
    other executors): `` (decay 0.9512)``, `` (decays inferred per layer; exact traces for
    blocks.1)``."""
    if not isinstance(learner, ES_D_RTRL):
        return ''
    parts = [f'decay {learner.decay:.4f}' if learner.decay is not None
             else 'decays inferred per layer']
    if learner.exact:
        parts.append(f'exact traces for {", ".join(learner.exact)}')
    if learner.exact_budget is not None:
        parts.append(f'exact traces within {learner.exact_budget / 2**20:g} MiB')
    if learner.cross_layer:
        parts.append('one hop across layers')
    return f' ({"; ".join(parts)})'


def _optimizer(run, train_samples: int):
    """:func:`optimizer` over the run's updates."""
    # at least one update, so the schedule is defined: fit refuses a batch larger than the
    # training set itself
    updates = max(1, run.epochs * (train_samples // run.batch_size))
    if run.update_every is not None:
        updates *= math.ceil(run.steps / run.update_every)
    return optimizer(run, updates)


def optimizer(run, updates: int):
    """Adam with a cosine decay of ``--lr`` to 10% of it over ``updates`` updates, after
    clipping the gradient to ``--clip-norm``."""
    adam = optax.adam(optax.cosine_decay_schedule(run.lr, updates, alpha=0.1))
    if run.clip_norm:
        return optax.chain(optax.clip_by_global_norm(run.clip_norm), adam)
    return adam


def setup(run, usage: str, *, train: bool = True) -> tuple:
    """``(trainer, train set, test set)`` of the resolved run options ``run``, with an
    optimiser if ``train``; a value the library refuses raises :class:`UsageError` naming
    the option it came from."""
    try:
        data = _dataset(run, usage)
        _check_model_memory(run, data.frame_shape, data.num_classes, usage)
        train_set, test_set = data.split(run.test_fraction, seed=run.seed)
        brainstate.random.seed(run.seed)
        model = recurrent_conv_snn(data.frame_shape, data.num_classes, channels=run.channels,
                                   kernel_size=run.kernel_size, pool=run.pool, tau=run.tau,
                                   return_spikes=bool(run.rate_target),
                                   tau_adapt=run.tau_adapt)
        trainer = Trainer(_learner(run, model),
                          _optimizer(run, len(train_set)) if train else None,
                          loss=run.loss.replace('-', '_'),
                          final_steps=effective(vars(run), 'final_steps'),
                          target_rates=effective(vars(run), 'target_rates'),
                          rate_targets=_rate_targets(run.rate_target, len(run.channels), usage),
                          rate_strength=effective(vars(run), 'rate_strength'),
                          update_every=run.update_every,
                          nonfinite=run.nonfinite, devices=run.devices)
    except (ValueError, TypeError) as error:
        raise usage_error(error, usage) from None
    return trainer, train_set, test_set


def _rate_targets(rates, blocks: int, usage: str) -> Optional[dict]:
    """``--rate-target``: one rate for every block, or one per block, as Trainer's
    ``rate_targets`` (the blocks' neurons, named as the model returns their spikes)."""
    if not rates:
        return None
    if len(rates) not in (1, blocks):
        raise UsageError(f'--rate-target takes one rate or one per block ({blocks}), got '
                         f'{len(rates)}', usage)
    return {f'blocks.{i}.neuron': r for i, r in enumerate(rates * blocks if len(rates) == 1
                                                          else rates)}

