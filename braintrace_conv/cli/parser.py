"""The argument parser of ``braintrace-conv``, built from the option records
(:mod:`braintrace_conv.cli.options`), and the user errors it raises."""
from __future__ import annotations

import argparse
from importlib import metadata

from .._validation import ArgumentError
from .options import (EVALUATE_OPTIONS, MODEL_DEFAULTS, STREAM_OPTIONS, TASK_DEFAULTS,
                      TRAIN_OPTIONS, Option, flag, spell)

PROG = 'braintrace-conv'

_TRAIN = ('Train a recurrent spiking conv net. Tasks: moving-bars (DVS-like), delayed-bars '
          '(--cues trials of a moving bar then --delay blank steps; the last bar\'s direction is '
          'asked for at the last step), digits (digit saccades), shd (SHD-like spoken words, '
          '700 channels, 1-D convolutions), events (a directory DATA/<class>/<sample>.npy|.npz '
          'of tonic-format events), and two long-memory tasks at their published timings: '
          'cue-accumulation (e-prop\'s evidence accumulation, 2250 steps, which side showed '
          'more cues 1050 steps earlier) and delayed-match (delayed match-to-sample, 3200 '
          'steps, a delay of 1000 steps between the sample and the test).')
_STREAM = ('Learn online from long recordings that are never cut into samples: the event '
           'files are played as a stream, binned into steps of --dt-us, labelled by time '
           'segments (DVS Gesture\'s layout), with one update every --update-every steps; '
           'hidden states and traces carry across chunks, segments and recordings. Reports '
           'the online and held-out accuracy per segment; --resume continues a stopped run '
           'exactly where it stopped.')
_EVALUATE = ('Score a saved run\'s best (or --checkpoint last) parameters, saying which. A run '
             'of "train": rebuild its test set and model and report test loss, accuracy and '
             'spike rates. A run of "stream": play held-out recordings (the run\'s --held-out, '
             'or --recordings with their segments) through its model from fresh hidden states '
             'and report what the run reports of its held-out evaluations: the segment '
             'accuracy, the step accuracy and the loss per labelled step.')


class UsageError(Exception):
    """A user error: shown as the usage line and one line of message, exit code 2."""

    def __init__(self, message: str, usage: str = ''):
        super().__init__(message)
        self.usage = usage


class Interrupted(Exception):
    """The command was interrupted; the message says what was kept and how to go on."""


class RunError(Exception):
    """A run stopped by an error other than the user's input (an I/O error, a non-finite
    update with ``--nonfinite raise``): one line saying what was kept, exit code 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message, self.format_usage())


def _version() -> str:
    try:
        return metadata.version('braintrace_conv')
    except metadata.PackageNotFoundError:
        return 'unknown (not installed)'


def _defaults_text() -> str:
    """The task and model defaults, for the description of ``train``."""
    def listed(table: dict, label) -> str:
        return '; '.join(f'{label(key)}: ' + ', '.join(f'{name}={value}' for name, value
                                                       in defaults.items())
                         for key, defaults in table.items() if defaults)
    return (f' Task defaults: {listed(TASK_DEFAULTS, str)}. Model defaults by frame rank: '
            f'{listed(MODEL_DEFAULTS, lambda rank: f"{rank}-D")}.')


def _add(parser: argparse.ArgumentParser, options: tuple) -> None:
    """Add the arguments of ``options`` (their defaults are filled in when resolved, so the
    parser leaves every option it is not given unset)."""
    groups = {}
    for option in options:
        target = parser
        if option.group is not None:
            target = groups.setdefault(option.group, parser.add_mutually_exclusive_group())
        target.add_argument(flag(option.name), **_argument(option))


def _argument(option: Option) -> dict:
    """The keyword arguments of ``add_argument`` for ``option``."""
    help_text = option.help.format(default=option.default) if option.help else None
    if option.flag:
        return dict(action='store_true', help=help_text)
    keywords = dict(help=help_text, required=option.required)
    for key in ('type', 'choices', 'nargs', 'metavar'):
        if getattr(option, key) is not None:
            keywords[key] = getattr(option, key)
    return keywords


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``braintrace-conv`` (errors raise :class:`UsageError`)."""
    parser = _Parser(prog=PROG, description='Online training of recurrent spiking conv nets.')
    parser.add_argument('--version', action='version', version=f'{PROG} {_version()}')
    commands = parser.add_subparsers(dest='command', required=True, parser_class=_Parser)
    train = commands.add_parser(
        'train', usage='%(prog)s [options]  (see --help)', description=_TRAIN + _defaults_text(),
        help='train a recurrent spiking conv net on a synthetic or recorded event dataset')
    _add(train, TRAIN_OPTIONS)
    train.set_defaults(usage=train.format_usage())
    stream = commands.add_parser(
        'stream', usage='%(prog)s --recordings FILE [FILE ...] --sensor-size W,H,P [options]  '
                        '(see --help)', description=_STREAM,
        help='learn online from long labelled recordings played as a stream')
    _add(stream, STREAM_OPTIONS)
    stream.set_defaults(usage=stream.format_usage())
    evaluate = commands.add_parser('evaluate', usage='%(prog)s --run DIR [options]  (see --help)',
                                   help='score a saved run on its test set or on held-out '
                                        'recordings',
                                   description=_EVALUATE)
    _add(evaluate, EVALUATE_OPTIONS)
    evaluate.set_defaults(usage=evaluate.format_usage())
    return parser


def usage_error(error: Exception, usage: str, prefix: str = '') -> UsageError:
    """A library error as a user error: an :class:`~braintrace_conv._validation.ArgumentError`
    names the options its arguments came from (``--update-every``, not ``update_every``)."""
    message = error.render(spell) if isinstance(error, ArgumentError) else str(error)
    return UsageError(prefix + message, usage)
