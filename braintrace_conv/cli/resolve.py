"""The run options of ``braintrace-conv train`` resolved: defaults filled in (for the task
and the frame rank), dependencies between options and the command line's own rules
checked. The options' records are :mod:`braintrace_conv.cli.options`."""
from __future__ import annotations

import argparse
from pathlib import Path

from .._validation import ArgumentError
from ..training import placement
from .options import LONG_MEMORY, TRAIN_OPTIONS, flag, given, stored_options
from .parser import UsageError, usage_error

__all__ = ['resolve', 'check_values', 'run_config', 'frame_rank', 'devices', 'option_list']

#: Smallest frame (pixels per side) of each synthetic task that poses it: moving bars
#: smaller than 4 x 4 give identical recordings for different directions; digits need
#: room for a digit of 8 pixels.
MIN_SIZE = {'moving-bars': 4, 'delayed-bars': 4, 'digits': 8}


def frame_rank(values: dict) -> int:
    """Number of spatial axes of the task's frames (which convolutions the model uses)."""
    if values['task'] in ('shd', *LONG_MEMORY):
        return 1
    if values['task'] != 'events':
        return 2
    size = values['sensor_size']    # tonic's order; (X, P) and (X, 1, P) are 1-D sensors
    return 1 if len(size) == 2 or (len(size) == 3 and size[1] == 1) else len(size) - 1


def devices(requested, usage: str) -> int:
    """The number of devices to use: all of ``jax.devices()``, or ``requested`` if there
    are that many (:func:`~braintrace_conv.training.placement.device_mesh`)."""
    try:
        return len(placement.device_mesh(requested).devices.flat)
    except ArgumentError as error:
        raise usage_error(error, usage) from None


def refuse_without_effect(options, values: dict, given_names: list, usage: str) -> None:
    """Refuse every option of ``options`` (a command's records) given without effect: one
    whose requirements (:class:`Requires`) are not met."""
    for option in options:
        if option.name in given_names:
            for requirement in option.requires:
                if not requirement.met(values):
                    raise UsageError(requirement.refusal(option.name), usage)


def _events(values: dict, usage: str) -> None:
    """What --task events needs: a directory of recordings and the sensor's size."""
    if values['data'] is None or values['sensor_size'] is None:
        raise UsageError('--task events needs --data DIR and --sensor-size X,Y,P', usage)
    if not Path(values['data']).is_dir():
        raise UsageError(f'--data {values["data"]} is not a directory', usage)
    values['data'] = str(Path(values['data']).resolve())


def _tasks_posed(values: dict, usage: str) -> None:
    """The sizes that pose the synthetic tasks (no library rule: a smaller frame or a
    shorter clip is a valid recording, just not of a task that can be learned)."""
    task, size, steps = values['task'], values['size'], values['steps']
    if task in MIN_SIZE and size < MIN_SIZE[task]:
        raise UsageError(f'--size must be at least {MIN_SIZE[task]} for --task {task}, got '
                         f'{size}', usage)
    if task == 'moving-bars' and steps < 2:
        raise UsageError(f'--steps must be at least 2 for --task moving-bars (a single frame '
                         f'is equally consistent with opposite directions), got {steps}', usage)
    if task == 'delayed-bars':
        cues, delay = values['cues'], values['delay']
        if steps % cues:
            raise UsageError(f'--steps ({steps}) must be a multiple of --cues ({cues}), one '
                             f'trial each', usage)
        if steps // cues - delay < 2:
            raise UsageError(f'--delay ({delay}) must leave at least 2 of each trial\'s '
                             f'{steps // cues} steps (--steps / --cues) to the moving bar (a '
                             f'single frame is equally consistent with opposite directions)',
                             usage)


def check_values(options: tuple, values: dict, usage: str) -> dict:
    """``values`` of ``options`` with their defaults where unset, after the checks of their
    records (those the command line needs before it uses a value); a refused value raises
    :class:`UsageError`."""
    checked = dict(values)
    for option in options:
        if checked.get(option.name) is None:
            checked[option.name] = option.default
        if option.check is not None and checked[option.name] is not None:
            try:
                checked[option.name] = option.check(option.name, checked[option.name])
            except ArgumentError as error:
                raise usage_error(error, usage) from None
    return checked


def resolve(args: argparse.Namespace, usage: str) -> argparse.Namespace:
    """The run options of the parsed command line ``args``: every default filled in and
    every rule of the command line checked; raises :class:`UsageError`. ``args`` is left as
    it was."""
    values = {option.name: getattr(args, option.name) for option in TRAIN_OPTIONS}
    given_names = [name for name, value in values.items() if given(value)]
    for option in TRAIN_OPTIONS:   # the task first: other options' defaults depend on it
        if values[option.name] is None:
            values[option.name] = option.default_for(values['task'])
    task = values['task']
    refuse_without_effect(TRAIN_OPTIONS, values, given_names, usage)
    if task == 'events':
        _events(values, usage)
    for option in TRAIN_OPTIONS:
        if values[option.name] is None and option.rank_defaults:
            values[option.name] = option.rank_defaults[frame_rank(values)]
    values = check_values(TRAIN_OPTIONS, values, usage)
    _tasks_posed(values, usage)
    values['devices'] = devices(values['devices'], usage)
    if values['out'] is None:
        values['out'] = Path('runs') / f'{task}-{values["algorithm"]}'
    return argparse.Namespace(**values)


def run_config(run: argparse.Namespace) -> dict:
    """The options of ``run`` stored with it and compared on ``--resume``."""
    return stored_options(vars(run))


def option_list(differences: dict) -> str:
    """``--channels 2,4 (now 4,8), ...``: run options that differ, ``{name: (stored, now)}``."""
    def shown(value) -> str:
        if isinstance(value, (list, tuple)):
            return ','.join(map(str, value))
        return 'unset' if value is None else str(value)
    return ', '.join(f'{flag(name)} {shown(old)} (now {shown(new)})'
                     for name, (old, new) in differences.items())
