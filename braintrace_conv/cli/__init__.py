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
replaced with ``--overwrite`` once the new run has written its first checkpoint,
never overwritten silently; a run stopped by bad data, an error or an
interruption keeps what it wrote, and before its first checkpoint leaves the
directory as it was.

The options that define the result are stored with the run and must be equal
on ``--resume``; ``--devices`` and ``--cache-size`` may change (a different
device count changes only the rounding of the gradient's batch sum, and a
warning says so), and a larger ``--epochs`` continues a finished run. So must
the data, by their fingerprint (:mod:`braintrace_conv.training.fingerprint`):
a file of a ``--stream`` data set whose size or modification time changed is
named and refused, and with ``--verify-data`` one whose content changed with
both restored (a run written by a version that recorded paths only is
checked by its paths, and a warning says so). A
resumed run first repairs what a run killed after its last checkpoint left
behind (best checkpoint, ``metrics.json`` and the summary a finished run adds
to it, learning curve, temporary files);
a directory another process is training in is refused with that process's pid.

``braintrace-conv stream --recordings FILE ... --sensor-size W,H,P`` learns online from
long recordings played as one stream (:mod:`braintrace_conv.cli.stream`): one update
every ``--update-every`` steps, hidden states and traces carried across chunks, segments
and recordings, online and held-out accuracy per labelled segment, and a run directory
that ``--resume`` continues exactly where the run stopped.

``braintrace-conv evaluate --run DIR`` rebuilds the data and model of a saved
run from its stored options, loads its best (or ``--checkpoint last``)
parameters, says which, and reports the test loss, accuracy and spike rates; a
run of ``stream`` is scored on its held-out recordings (or those of
``--recordings``) with the metrics of its own evaluations. Test data
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

import sys
import time
import warnings
from typing import Optional, Sequence

from .evaluate import evaluate
from .options import DEFAULT_CACHE_SIZE, MODEL_DEFAULTS, RUN_OPTIONS, SHD_CHANNELS, TASK_DEFAULTS
from .parser import PROG, Interrupted, RunError, UsageError, build_parser
from .stream import stream
from .train import train

__all__ = ['main', 'build_parser', 'TASK_DEFAULTS', 'MODEL_DEFAULTS', 'RUN_OPTIONS',
           'SHD_CHANNELS', 'DEFAULT_CACHE_SIZE', 'EXIT_OK', 'EXIT_ERROR', 'EXIT_USAGE',
           'EXIT_INTERRUPTED']

#: Exit code of a command that did what it was asked (also a resumed run found finished).
EXIT_OK = 0
#: Exit code of an I/O error, running out of memory, or a non-finite update with
#: ``--nonfinite raise`` during the run.
EXIT_ERROR = 1
#: Exit code of a user error: the usage line, then one line saying what was wrong.
EXIT_USAGE = 2
#: Exit code of an interrupted command (Ctrl-C).
EXIT_INTERRUPTED = 130


def _run(argv: Optional[Sequence[str]], start: float) -> int:
    args = build_parser().parse_args(argv)
    if args.command == 'train':
        return train(args, args.usage, start)
    if args.command == 'stream':
        return stream(args, args.usage, start)
    return evaluate(args, args.usage)


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
        return EXIT_USAGE
    except SystemExit as exit_:   # --help, --version
        return exit_.code if isinstance(exit_.code, int) else EXIT_OK
    except (KeyboardInterrupt, Interrupted) as interruption:
        said = f'; {interruption}' if isinstance(interruption, Interrupted) else ''
        print(f'{PROG}: interrupted{said}', file=sys.stderr)
        return EXIT_INTERRUPTED
    # FloatingPointError: a non-finite update with --nonfinite raise
    except (OSError, FloatingPointError, RunError) as error:
        print(f'{PROG}: error: {" ".join(str(error).split())}', file=sys.stderr)
        return EXIT_ERROR
    except MemoryError:
        print(f'{PROG}: error: out of memory; lower the sizes of the task or the model '
              f'(--samples, --size, --steps, --channels, --batch-size)', file=sys.stderr)
        return EXIT_ERROR

