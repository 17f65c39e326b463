"""The options of ``braintrace-conv``: one record per option.

An :class:`Option` holds everything about one option: its value type, its default (for
every task, per task, or per frame rank), the checks the command line needs before it
uses the value, what the option depends on (:class:`Requires`), whether it is stored
with a run and compared on ``--resume``, the names the library gives its value (so a
library error names the option), and its help. The parser, the checks, ``--help`` and
the run options stored with a run are all derived from :data:`TRAIN_OPTIONS`,
:data:`EVALUATE_OPTIONS` and :data:`STREAM_OPTIONS`; adding an option means adding a record
here and the code that uses its value.

Rules the library checks itself (a positive ``--tau``, a ``--decay`` in (0, 1], a
``--window`` no longer than ``--update-every``, ...) are not repeated here: the library's
error is shown with the option's name.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .._validation import ArgumentError, integer, interval, non_negative, number, positive
from ..training import NONFINITE, run_dir
from ..training.loss import DEFAULT_TARGET_RATES, LOSSES

__all__ = ['Option', 'Requires', 'TRAIN_OPTIONS', 'EVALUATE_OPTIONS', 'STREAM_OPTIONS', 'TASKS',
           'LONG_MEMORY', 'ALGORITHMS', 'TASK_DEFAULTS', 'MODEL_DEFAULTS', 'RUN_OPTIONS', 'SHD_CHANNELS',
           'DEFAULT_CACHE_SIZE', 'MAX_SEED', 'flag', 'spell', 'given', 'stored_options']

#: Tasks: synthetic data sets (nothing is downloaded) and directories of recorded events.
TASKS = ('moving-bars', 'delayed-bars', 'digits', 'shd', 'events', 'cue-accumulation',
         'delayed-match')
ALGORITHMS = ('es-d-rtrl', 'd-rtrl', 'bptt')
#: Channels of the SHD-like task (those of the Spiking Heidelberg Digits).
SHD_CHANNELS = 700
#: Samples whose frames a streamed dataset keeps in memory, unless --cache-size says.
DEFAULT_CACHE_SIZE = 256
#: Largest --seed (the generators take 64-bit seeds).
MAX_SEED = 2**63 - 1
_BARS_AND_DIGITS = ('moving-bars', 'delayed-bars', 'digits')
#: The long-memory tasks: published timings, 40 input channels, the answer read out at the end.
LONG_MEMORY = ('cue-accumulation', 'delayed-match')
_CUE, _DMS = LONG_MEMORY


@dataclasses.dataclass(frozen=True)
class Requires:
    """An option takes effect only when ``option`` has one of ``values`` (with no values:
    when ``option`` is given); given without effect, it is refused
    (:func:`~braintrace_conv.cli.resolve.resolve`, the one place this is checked).

    Attributes:
      option: The option depended on.
      values: Its values that let the dependent option take effect.
      word: ``'to'`` or ``'with'``: how the refusal reads (``--decay applies only to
        --algorithm es-d-rtrl``, ``--final-steps applies only with --loss final``).
      note: Said after the refusal, in parentheses.
    """
    option: str
    values: tuple = ()
    word: str = 'with'
    note: str = ''

    def met(self, values: dict) -> bool:
        """Whether the option depended on has a value that lets the dependent one act."""
        value = values.get(self.option)
        return value in self.values if self.values else given(value)

    def refusal(self, name: str) -> str:
        """The sentence refusing the option ``name`` without effect."""
        wanted = ' or '.join(self.values)
        text = f'{flag(name)} applies only {self.word} {flag(self.option)}' + \
            (f' {wanted}' if wanted else '')
        return text + (f' ({self.note})' if self.note else '')


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a command.

    Attributes:
      name: The option's attribute name; its flag is ``--`` and the name with dashes.
      help: Its help; ``{default}`` is replaced by the default.
      type: Converts the text of a value (argparse's ``type``); ``None`` keeps the text.
      flag: Whether the option takes no value: given, it is ``True``.
      choices, nargs, metavar: As for argparse.
      default: The value when the option is not given.
      task_defaults: ``{task: value}`` overriding ``default`` for those tasks.
      rank_defaults: ``{number of spatial axes of the frames: value}`` (model options).
      check: ``check(name, value)``: the checks the command line needs before it uses the
        value (the library checks what it is given itself).
      requires: What the option depends on (:class:`Requires`).
      stored: Whether the option is stored with a run and must be equal on ``--resume``:
        ``'always'``, ``'when given'`` (options added after runs were made without them,
        so those still resume), ``'when effective'`` (only where its requirements are
        met) or ``'never'``.
      aliases: The names the library gives this value, e.g. ``T`` for ``--steps``.
      group: Options of the same group exclude each other.
      required: Whether the option must be given.
    """
    name: str
    help: str = ''
    type: Optional[Callable] = None
    flag: bool = False
    choices: Optional[tuple] = None
    nargs: Union[int, str, None] = None
    metavar: Union[str, tuple, None] = None
    default: Any = None
    task_defaults: dict = dataclasses.field(default_factory=dict)
    rank_defaults: dict = dataclasses.field(default_factory=dict)
    check: Optional[Callable] = None
    requires: tuple = ()
    stored: str = 'always'
    aliases: tuple = ()
    group: Optional[str] = None
    required: bool = False

    def default_for(self, task: Optional[str]):
        """The default of the option for ``task``."""
        return self.task_defaults.get(task, self.default)


def flag(name: str) -> str:
    """``'--update-every'`` for ``'update_every'``."""
    return '--' + name.replace('_', '-')


def given(value) -> bool:
    """Whether an option has a value: not ``None``, ``False`` or empty."""
    return value is not None and value is not False and value != () and value != []


# ----------------------------------------------------------------------------- value types
def path(text: str) -> Path:
    """A path that is not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError('expected a path, got an empty string')
    return Path(text)


def channels(text: str) -> tuple:
    """Comma-separated positive ints: the channels of the blocks."""
    try:
        values = tuple(int(c) for c in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'expected comma-separated ints such as 8,16, got {text!r}') from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f'channels must be positive, got {text!r}')
    return values


def sensor_size(text: str) -> tuple:
    """The sensor size in tonic's order: 2 to 4 comma-separated positive ints."""
    try:
        size = tuple(int(c) for c in text.split(','))
    except ValueError:
        size = ()
    if not 2 <= len(size) <= 4 or min(size) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected the sensor size in tonic's order, 2 to 4 comma-separated positive ints "
            f"with the polarities last, such as 700,1,1 or 34,34,2, got {text!r}")
    return size


def region(text: str) -> tuple:
    """A crop region ``X,Y,W,H``: its first column and row, its width and height."""
    try:
        values = tuple(int(c) for c in text.split(','))
    except ValueError:
        values = ()
    if len(values) != 4 or min(values[:2]) < 0 or min(values[2:]) <= 0:
        raise argparse.ArgumentTypeError(
            f'expected X,Y,W,H: the first column and row (from 0) and the width and height '
            f'of the region in pixels, such as 320,0,720,720, got {text!r}')
    return values


def _fraction(name: str, value) -> float:
    return interval(name, value, 0, 1, '(]')


def _seed(name: str, value) -> int:
    value = integer(name, value)
    if not 0 <= value <= MAX_SEED:
        raise ArgumentError(name, value, f'lie in [0, {MAX_SEED}]')
    return value


def _positive_number(name: str, value) -> float:
    return number(name, value, sign='positive')


def _non_negative_number(name: str, value) -> float:
    return number(name, value, sign='non-negative')


# ----------------------------------------------------------------------------- the options
_EVENTS = Requires('task', ('events',), word='to')
_LOSS_CHOICES = tuple(name.replace('_', '-') for name in LOSSES)

#: The options of ``braintrace-conv train``, in the order of ``--help``.
TRAIN_OPTIONS = (
    Option('task', choices=TASKS, default='moving-bars', help='the data set (default {default})'),
    Option('data', type=path, metavar='DIR', requires=(_EVENTS,),
           help='events: directory with one sub-directory of event files per class'),
    Option('sensor_size', type=sensor_size, metavar='X,Y,P', requires=(_EVENTS,),
           help="events: sensor size in tonic's order, e.g. 700,1,1 (1-D, fields t, x, p) or "
                "34,34,2 (2-D, fields t, x, y, p)"),
    Option('window_us', type=float, metavar='W', requires=(_EVENTS,),
           aliases=('time_window_us',),
           help="events: time bins of W microseconds from each recording's first event, "
                "--steps of them (default: --steps equal bins spanning each recording)"),
    Option('stream', flag=True, default=False, requires=(_EVENTS,),
           help='events: read and bin files per batch instead of loading them all'),
    Option('cache_size', type=int, metavar='N', default=DEFAULT_CACHE_SIZE, stored='never',
           requires=(_EVENTS, Requires('stream')),
           help='events with --stream: samples whose frames stay in memory (default {default})'),
    Option('verify_data', flag=True, default=False, stored='when given',
           requires=(_EVENTS, Requires('stream')),
           help='events with --stream: fingerprint the files by their contents too (SHA-256, '
                'each file read once per run: about a third of the time an epoch takes to read '
                'them), so --resume and evaluate also refuse a file rewritten with its size '
                'and modification time restored'),
    Option('devices', type=int, metavar='N', stored='never',
           help='data-parallel devices (default: all of jax.devices()); the batch size must be '
                'a multiple of their number'),
    Option('algorithm', choices=ALGORITHMS, default='es-d-rtrl',
           help='how gradients are computed (default {default})'),
    Option('epochs', type=int, check=positive,
           task_defaults={'moving-bars': 6, 'delayed-bars': 24, 'digits': 6, 'shd': 8,
                          'events': 6, _CUE: 30, _DMS: 30},
           help='training epochs (task default)'),
    Option('batch_size', type=int, default=32, check=positive,
           help='sequences per optimiser update (default {default})'),
    Option('seed', type=int, default=0, check=_seed,
           help='seeds the data, the initial weights and the shuffling'),
    Option('out', type=path, stored='never',
           help='run directory (default runs/<task>-<algorithm>)'),
    Option('lr', type=float, default=5e-3,
           task_defaults={'delayed-bars': 2e-3, _CUE: 1e-3, _DMS: 1e-3},
           check=_positive_number,
           help='peak Adam learning rate (cosine decay to 10%% of it; default {default:g}, task '
                'default if set)'),
    Option('clip_norm', type=float, metavar='C', stored='when given',
           task_defaults={'delayed-bars': 1.0, _CUE: 1.0, _DMS: 1.0},
           check=_non_negative_number,
           help='scale every gradient down to global norm at most C before Adam (default: no '
                'clipping; 1 for delayed-bars and the long-memory tasks; 0: none)'),
    Option('samples', type=int, aliases=('n_samples',),
           task_defaults={'moving-bars': 2048, 'delayed-bars': 768, 'digits': 1797, 'shd': 1000,
                          _CUE: 512, _DMS: 512},
           requires=(Requires('task', (*_BARS_AND_DIGITS, 'shd', *LONG_MEMORY), word='to'),),
           help='dataset size, train + test (every task but events; task default)'),
    Option('size', type=int, task_defaults={'moving-bars': 16, 'delayed-bars': 8, 'digits': 16},
           requires=(Requires('task', _BARS_AND_DIGITS, word='to'),),
           help='frame height = width in pixels (moving-bars, delayed-bars, digits; task '
                'default)'),
    Option('steps', type=int, aliases=('T', 'num_steps', 'n_time_bins'),
           task_defaults={'moving-bars': 20, 'delayed-bars': 128, 'digits': 24, 'shd': 50,
                          'events': 20, _CUE: 2250, _DMS: 3200},
           requires=(Requires('task', tuple(t for t in TASKS if t not in LONG_MEMORY),
                              word='to', note='the long-memory tasks have their published '
                                              'lengths: 2250 and 3200 steps'),),
           help='time steps T per sample (task default)'),
    Option('delay', type=int, metavar='STEPS', stored='when given', aliases=('delay_steps',),
           task_defaults={'delayed-bars': 24},
           requires=(Requires('task', ('delayed-bars',), word='to'),),
           help='delayed-bars: blank steps after each moving bar; the bar fills the rest of a '
                'trial (task default)'),
    Option('cues', type=int, metavar='N', stored='when given', check=positive,
           task_defaults={'delayed-bars': 4},
           requires=(Requires('task', ('delayed-bars',), word='to'),),
           help="delayed-bars: trials per sample, each --steps / N steps long; the label is the "
                "last bar's direction, the others are distractors (task default)"),
    Option('test_fraction', type=float, default=0.25,
           help='fraction of each class held out for testing (default {default})'),
    Option('channels', type=channels, default=(8, 16), task_defaults={_CUE: (64, 64),
                                                                       _DMS: (64, 64)},
           help='channels of the spiking blocks, e.g. 8,16 (default 8,16; 64,64 for the '
                'long-memory tasks, whose 40 input channels at one position make every '
                'block a dense layer)'),
    Option('kernel_size', type=int, metavar='SIZE', rank_defaults={1: 7, 2: 3, 3: 3},
           task_defaults={_CUE: 1, _DMS: 1},
           help='kernel extent along every spatial axis (default by frame rank; 1 for the '
                'long-memory tasks)'),
    Option('pool', type=int, metavar='P', rank_defaults={1: 4, 2: 1, 3: 1},
           task_defaults={_CUE: 1, _DMS: 1},
           help='average the spikes of each block over windows of this many positions per '
                'axis; 1: none (default by frame rank; 1 for the long-memory tasks)'),
    Option('tau', type=float, default=10.0,
           task_defaults={'delayed-bars': 5.0, _CUE: 20.0, _DMS: 20.0},
           help='membrane time constant, ms (default {default:g}, task default if set)'),
    Option('tau_adapt', type=float, metavar='MS', stored='when given',
           task_defaults={_CUE: 2000.0, _DMS: 2000.0}, check=_positive_number,
           help='adaptive neurons (ALIF) whose threshold recovers with this time constant, '
                'ms, instead of LIF neurons (default: LIF; 2000 for the long-memory tasks)'),
    Option('decay', type=float,
           requires=(Requires('algorithm', ('es-d-rtrl',), word='to'),),
           help='ES-D-RTRL: one input-trace decay for every layer (default: each layer gets '
                'the decays of its neurons, inferred from the model: exp(-dt/tau) for LIF, '
                'also exp(-dt/tau_adapt) for the adaptive neurons of --tau-adapt)'),
    Option('exact', nargs='+', metavar='PATH', stored='when given',
           requires=(Requires('algorithm', ('es-d-rtrl',), word='to'),),
           help="es-d-rtrl: D-RTRL's exact traces for the layers of these parameters, named as "
                "the report prints them (e.g. blocks.1.rec.weight) or by a module above them "
                "(blocks.1); ES-D-RTRL's traces for the others"),
    Option('exact_budget', type=float, metavar='MIB', stored='when given',
           check=_non_negative_number,
           requires=(Requires('algorithm', ('es-d-rtrl',), word='to'),),
           help="es-d-rtrl: D-RTRL's exact traces also for further layers, smallest trace "
                "first, while all exact traces together take at most MIB MiB"),
    Option('cross_layer', type=int, metavar='HOPS', choices=(0, 1), stored='when given',
           requires=(Requires('algorithm', ('es-d-rtrl',), word='to'),),
           help="es-d-rtrl: 1 follows each layer's effect one hop through the dynamics of the "
                "neurons of the layer that reads it (gradients closer to BPTT's in the lower "
                "layers; not measured to train better; one more weight-gradient and one "
                "transposed op per layer and step); 0: each layer's own traces only (default)"),
    Option('update_every', type=int, metavar='STEPS', check=positive,
           help='truly online: optimiser step every STEPS time steps (default: once per batch '
                'of sequences)'),
    Option('window', type=int, metavar='STEPS', stored='when given',
           requires=(Requires('algorithm', ('d-rtrl', 'es-d-rtrl'), word='to',
                              note='BPTT is exact already'),),
           help='d-rtrl / es-d-rtrl: exact BPTT inside windows of STEPS steps, eligibility '
                'traces across them (memory grows with STEPS, not T; default: traces only)'),
    Option('loss', choices=_LOSS_CHOICES, default='every-step',
           task_defaults={'delayed-bars': 'final', _CUE: 'final', _DMS: 'final'},
           help='cross-entropy at every step (default, unless the task sets it) or the final '
                'steps; or a loss of the whole sequence (not with --update-every): '
                'cross-entropy or MSE of spike counts, cross-entropy of the maximum or mean '
                'over time of the readout (braintrace_conv.training.loss)'),
    Option('final_steps', type=int, default=1, task_defaults={_CUE: 150, _DMS: 900},
           requires=(Requires('loss', ('final',)),),
           help='with --loss final: number of last steps in the loss (default {default}; the '
                'read-out period of the long-memory tasks: 150 and 900)'),
    Option('target_rates', type=float, nargs=2, metavar=('TRUE', 'OTHER'),
           default=DEFAULT_TARGET_RATES, stored='when effective',
           requires=(Requires('loss', ('count-mse',)),),
           help='with --loss count-mse: target output rate per step of the true class and of '
                'the others (default {default[0]} {default[1]})'),
    Option('rate_target', type=float, nargs='+', metavar='RATE', stored='when given',
           aliases=('rate_targets',),
           help='firing-rate regulariser: target fraction of neurons spiking per step, one for '
                'every block or one per block'),
    Option('rate_strength', type=float, default=1.0, stored='when effective',
           requires=(Requires('rate_target'),),
           help='with --rate-target: weight of the regulariser'),
    Option('nonfinite', choices=NONFINITE, default='skip',
           help='an update with a non-finite gradient is never applied: skip it (counted, '
                'warned) or stop the run'),
    Option('log_every', type=int, metavar='BATCHES', default=1, stored='never',
           help='batches between rows of scalars.csv (and TensorBoard)'),
    Option('resume', flag=True, default=False, stored='never', group='existing',
           help='continue the run in OUT from its last checkpoint (the run options must be '
                'those of the run; a larger --epochs extends a finished run)'),
    Option('overwrite', flag=True, default=False, stored='never', group='existing',
           help='replace the run in OUT once this run has written its first checkpoint '
                '(otherwise a run there is an error)'),
    Option('quiet', flag=True, default=False, stored='never',
           help='no progress bar or epoch lines'),
)

#: The options of ``braintrace-conv evaluate``.
EVALUATE_OPTIONS = (
    Option('run', type=path, required=True, stored='never',
           help='run directory (of "train" or "stream"), or one of its checkpoint files'),
    Option('checkpoint', choices=tuple(run_dir.CHECKPOINTS), stored='never',
           help='which checkpoint to score: best (the best evaluation of the run) or last '
                '(where the run stopped); default: best if the run has one, else last'),
    Option('batch_size', type=int, default=64, check=positive, stored='never',
           help='runs of "train": sequences per forward pass (default {default})'),
    Option('devices', type=int, metavar='N', stored='never',
           help='data-parallel devices (default: all of jax.devices())'),
    Option('data', type=path, metavar='DIR', stored='never',
           help='runs of --task events: the directory to rebuild the test set from, e.g. a '
                'moved or copied data set (default: the one the run recorded, if its '
                'checkpoint and its metrics.json agree; no other directory is read)'),
    Option('recordings', type=path, nargs='+', metavar='FILE', stored='never',
           help='runs of "stream": held-out event files to evaluate on, each labelled by the '
                'segments file NAME_labels.csv beside it unless --segments names them '
                '(default: the run\'s --held-out recordings and their segments)'),
    Option('segments', type=path, nargs='+', metavar='CSV', stored='never',
           requires=(Requires('recordings'),),
           help='segments files of --recordings, one per recording in the same order'),
    Option('allow_data_change', flag=True, default=False, stored='never',
           help='evaluate even if the test data (the held-out recordings of a stream run) '
                'differ from those the run was evaluated on (by default an error)'),
)


def _shared(name: str, help: Optional[str] = None) -> Option:
    """The record of ``train``'s option ``name``, which ``stream`` takes with its own
    ``help`` (if given): the same value, checks and storage, described for a stream."""
    record = next(option for option in TRAIN_OPTIONS if option.name == name)
    return record if help is None else dataclasses.replace(record, help=help)


_HELD_OUT = Requires('held_out')

#: The options of ``braintrace-conv stream``, in the order of ``--help``.
STREAM_OPTIONS = (
    Option('recordings', type=path, nargs='+', metavar='FILE', required=True,
           help='event files of the training stream (.npy, .npz, .aedat, .aedat4, .raw, .dat, '
                '.bin), played in this order, each labelled by the segments file NAME_labels.csv beside it '
                '(DVS Gesture\'s layout) unless --segments names them'),
    Option('segments', type=path, nargs='+', metavar='CSV',
           help='segments files of --recordings, one per recording in the same order '
                '(class,startTime_usec,endTime_usec or label,start_us,end_us)'),
    Option('held_out', type=path, nargs='+', metavar='FILE',
           help='held-out event files, evaluated every --eval-every chunks and at the end '
                '(segments beside them unless --held-out-segments names them)'),
    Option('held_out_segments', type=path, nargs='+', metavar='CSV', requires=(_HELD_OUT,),
           help='segments files of --held-out, one per recording in the same order'),
    Option('sensor_size', type=sensor_size, metavar='W,H,P', required=True,
           help="the camera's size in tonic's order, e.g. 128,128,2"),
    Option('denoise_us', type=float, metavar='US', check=_positive_number, stored='when given',
           help="keep an event only where a neighbouring pixel fired less than US "
                "microseconds before it (tonic's Denoise); the event transforms apply in "
                "this order: --denoise-us, --refractory-us, --crop, --downsample"),
    Option('refractory_us', type=float, metavar='US', check=_non_negative_number,
           stored='when given',
           help="drop every event that follows its pixel's previous event by at most US "
                "microseconds (tonic's RefractoryPeriod)"),
    Option('crop', type=region, metavar='X,Y,W,H', stored='when given',
           help='keep the events of the region of W x H pixels whose corner is at column X, '
                'row Y (e.g. 280,0,720,720: the middle square of a 1280x720 camera)'),
    Option('downsample', type=float, metavar='F', check=_fraction, stored='when given',
           help='map the pixels onto a grid F times as fine, F in (0, 1]: 0.125 gives frames '
                'of 160x90 from a 1280x720 camera'),
    Option('dt_us', type=int, metavar='US', default=1000, check=positive,
           help='time step, microseconds (default {default})'),
    Option('update_every', type=int, metavar='STEPS', default=100, check=positive,
           aliases=('chunk_steps',),
           help='time steps per chunk: one optimiser update per chunk (default {default})'),
    Option('batch_size', type=int, metavar='B', check=positive,
           help='parallel streams: the recordings as one playlist played by B streams from '
                'evenly spaced offsets (default: one stream per recording)'),
    Option('num_classes', type=int, metavar='K', check=positive,
           help='number of classes (default: the largest label of the segments, plus one)'),
    Option('max_steps', type=int, metavar='STEPS', check=positive,
           help='stop after this many time steps of each stream (default: where the '
                'recordings end)'),
    Option('loop', flag=True, default=False, requires=(Requires('max_steps'),),
           help='play the recordings again and again (with --max-steps)'),
    Option('eval_every', type=int, metavar='CHUNKS', check=positive, requires=(_HELD_OUT,),
           help='chunks between evaluations on --held-out (default: at the end only)'),
    Option('settle_steps', type=int, metavar='STEPS', default=0, check=non_negative,
           help="steps at the start of each segment that do not vote for the segment's "
                "prediction (default {default})"),
    _shared('algorithm', 'how gradients are computed (default {default}; bptt: truncated at '
                         'the chunk boundaries)'),
    _shared('window', 'd-rtrl / es-d-rtrl: exact BPTT inside windows of STEPS steps, at most '
                      '--update-every, eligibility traces across them (default: traces only)'),
    _shared('decay', 'es-d-rtrl: one input-trace decay per step for every layer (default: '
                     'each layer gets the decays of its neurons, inferred from the model)'),
    _shared('exact'),
    _shared('exact_budget'),
    _shared('cross_layer'),
    _shared('channels', 'channels of the spiking blocks, e.g. 8,16 (default 8,16)'),
    _shared('kernel_size', 'kernel extent along both spatial axes (default 3)'),
    _shared('pool', 'average the spikes of each block over windows of P x P pixels; 1: none '
                    '(default 1)'),
    _shared('tau', 'membrane time constant, in time steps (of --dt-us each; default '
                   '{default:g})'),
    _shared('lr', 'peak Adam learning rate, decayed along a cosine to 10%% of it over the '
                  'updates of the run (default {default:g})'),
    _shared('clip_norm', 'scale every gradient down to global norm at most C before Adam '
                         '(default: no clipping)'),
    _shared('seed', 'seeds the initial weights (default {default})'),
    _shared('nonfinite'),
    _shared('devices', 'data-parallel devices (default: all of jax.devices()); the number of '
                       'parallel streams must be a multiple of their number'),
    Option('checkpoint_every', type=int, metavar='CHUNKS', default=100, check=positive,
           stored='never',
           help='chunks between checkpoints (also written after every evaluation and at the '
                'end; default {default})'),
    Option('log_every', type=int, metavar='CHUNKS', default=10, check=positive, stored='never',
           help='chunks between rows of scalars.csv (and TensorBoard; default {default})'),
    Option('out', type=path, stored='never',
           help='run directory (default runs/stream-<algorithm>)'),
    Option('resume', flag=True, default=False, stored='never', group='existing',
           help='continue the run in OUT from its last checkpoint, where it stopped (the run '
                'options must be those of the run)'),
    _shared('overwrite'),
    Option('quiet', flag=True, default=False, stored='never',
           help='no progress bar or evaluation lines'),
)

def _names(options: tuple) -> dict:
    """``{name or alias: option}`` of ``options``."""
    return {key: option for option in options for key in (option.name, *option.aliases)}


_BY_NAME = {**_names(STREAM_OPTIONS), **_names(EVALUATE_OPTIONS), **_names(TRAIN_OPTIONS)}


def spell(name: str) -> Optional[str]:
    """The flag of the option whose value the library calls ``name`` (``'T'`` or
    ``'sizes[1]'`` included: an index names the option), or ``None``."""
    option = _BY_NAME.get(name.split('[')[0])
    return None if option is None else flag(option.name)


def effective(values: dict, name: str):
    """The value of option ``name`` among resolved ``values`` where its requirements are
    met, else ``None`` (the library's "not set"), so a default never reaches a setting it
    cannot act on."""
    return values.get(name) if all(r.met(values) for r in _BY_NAME[name].requires) else None


def stored_options(values: dict, options: tuple = TRAIN_OPTIONS) -> dict:
    """The run options among resolved ``values`` (of ``options``, default ``train``'s) that
    are stored with a run and compared on ``--resume`` (lists for tuples, so they compare
    with what JSON reads back)."""
    stored = {}
    for option in options:
        value = values.get(option.name)
        if option.stored == 'never' or (option.stored == 'when given' and not given(value)):
            continue
        if option.stored == 'when effective' and not all(r.met(values) for r in option.requires):
            continue
        stored[option.name] = list(value) if isinstance(value, tuple) else value
    return stored


#: Per-task defaults of the options a task sets (derived from :data:`TRAIN_OPTIONS`). A
#: task without ``samples`` or ``size`` takes them from its data (the option is refused).
TASK_DEFAULTS = {task: {o.name: o.task_defaults[task] for o in TRAIN_OPTIONS
                        if task in o.task_defaults} for task in TASKS}
#: Model defaults by the number of spatial axes of the frames: kernel extent and the pooling
#: window after each block (1-D streams over many channels are pooled).
MODEL_DEFAULTS = {rank: {o.name: o.rank_defaults[rank] for o in TRAIN_OPTIONS
                         if rank in o.rank_defaults} for rank in (1, 2, 3)}
#: The options that define a run: stored with it, and equal on ``--resume``.
RUN_OPTIONS = tuple(o.name for o in TRAIN_OPTIONS if o.stored != 'never')
