"""``braintrace-conv train``: a run written to its run directory, new, resumed or replaced."""
from __future__ import annotations

import contextlib
import math
import os
import time
import warnings

from .._memory import peak_rss_mib
from .._validation import ArgumentError
from ..training import Trainer, checkpoint, run_dir
from ..training._fit import hold
from ..training.state import run_differences
from .build import setup, trace_choice
from .options import spell
from .parser import PROG, Interrupted, RunError, UsageError, usage_error
from .resolve import option_list, resolve, run_config

__all__ = ['train', 'SUMMARY']

#: What the command adds to ``metrics.json`` when a run is finished, after the last epoch's
#: own write: the task, the wall time and peak resident memory of the command that finished
#: it, and the sizes of the training and test sets. A finished run whose ``metrics.json``
#: lacks them is repaired on ``--resume``.
SUMMARY = ('task', 'wall_time_s', 'peak_rss_mb', 'num_train', 'num_test')


def _out_error(run, error: Exception, usage: str) -> UsageError:
    """A refused run directory as a user error naming the command-line options."""
    if isinstance(error, run_dir.RunExistsError):
        found = ', '.join(run_dir.run_files(run.out))
        return UsageError(f'--out {run.out} already holds a run ({found}); pass --resume to '
                          f'continue it, --overwrite to replace it, or --out DIR to write '
                          f'the new run elsewhere', usage)
    if isinstance(error, run_dir.NothingToResumeError):
        return UsageError(f'--resume: {run.out} has no checkpoint ({run_dir.LAST_CHECKPOINT}) '
                          f'to resume', usage)
    if isinstance(error, (ValueError, run_dir.RunLockedError)):
        return UsageError(f'--out: {error}', usage)
    return UsageError(f'--out {run.out} cannot be written: {error.strerror or error}', usage)


def _resume(run, usage: str) -> bool:
    """Whether the run to resume is to be trained (or repaired), checked against the
    options; a run already finished is said so."""
    path = run.out / run_dir.LAST_CHECKPOINT
    try:
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    if 'stream' in meta:
        raise UsageError(f'--resume: the run in {run.out} was written by "{PROG} stream"; '
                         f'continue it with "{PROG} stream --resume" and its options', usage)
    differences = run_differences(stored, run_config(run), run.epochs)
    if differences:
        raise UsageError(f'--resume: the run in {run.out} was trained with other options: '
                         f'{option_list(differences)}; give the same options, or another '
                         f'--out', usage)
    if meta['epoch'] >= run.epochs:
        lagging = run_dir.lagging(run.out, meta['epoch'], meta.get('best'), SUMMARY)
        if lagging:
            print(f'the run in {run.out} is finished ({meta["epoch"]} epochs) but was '
                  f'interrupted while writing its files; repairing {", ".join(lagging)}')
            return True
        print(f'the run in {run.out} is already finished ({meta["epoch"]}/{run.epochs} '
              f'epochs); nothing to do. Evaluate it with: {PROG} evaluate --run {run.out}, '
              f'or extend it with a larger --epochs')
        return False
    old_epochs = stored.get('epochs')
    if isinstance(old_epochs, int) and old_epochs < run.epochs:
        print(f'extending the run in {run.out} from {old_epochs} to {run.epochs} epochs (the '
              f'learning-rate schedule is stretched over {run.epochs} epochs from here on)')
    return True


def train(args, usage: str, start: float) -> int:
    """Run ``braintrace-conv train`` with the parsed command line ``args``."""
    run = resolve(args, usage)
    out_existed = checked_out(run, usage)
    if run.resume and not _resume(run, usage):
        return 0
    trainer, train_set, test_set = setup(run, usage)
    try:
        trainer.check_fit(train_set, eval_dataset=test_set, **_fit_arguments(run))
    except (ValueError, TypeError) as error:
        raise usage_error(error, usage) from None
    return holding_out(run, usage, out_existed,
                       lambda: _fit(run, usage, start, trainer, train_set, test_set))


def checked_out(run, usage: str) -> bool:
    """Refuse ``--out`` (with ``--resume`` or ``--overwrite``) before any data are built;
    returns whether it existed, for :func:`holding_out`."""
    out_existed = os.path.lexists(run.out)
    try:
        run_dir.check(run.out, resume=run.resume, overwrite=run.overwrite)
    except (OSError, ValueError, run_dir.RunLockedError) as error:
        raise _out_error(run, error, usage) from None
    return out_existed


def holding_out(run, usage: str, out_existed: bool, fit) -> int:
    """``fit()`` (a command's run, returning its exit code) while holding ``--out``: every
    write to the run directory, the last metrics.json included, holds its lock. A run
    that wrote nothing leaves no directory behind where there was none
    (``out_existed``)."""
    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(hold(run.out, resume=run.resume, overwrite=run.overwrite))
            except (OSError, ValueError, run_dir.RunLockedError) as error:
                raise _out_error(run, error, usage) from None
            return fit()
    finally:
        if not out_existed:
            with contextlib.suppress(OSError):
                run.out.rmdir()


def _fit_arguments(run) -> dict:
    """The arguments of ``Trainer.fit`` and ``Trainer.check_fit`` of ``run``."""
    return dict(epochs=run.epochs, batch_size=run.batch_size, seed=run.seed, out_dir=run.out,
                resume=run.resume, overwrite=run.overwrite, run_config=run_config(run),
                log_every=run.log_every, verify_data=run.verify_data)


def last_checkpoint(run):
    """What identifies the last checkpoint in ``--out`` (a new file each time one is
    written), or ``None`` if there is none: taken before a run, :func:`kept` tells by it
    whether the run wrote one."""
    try:
        found = os.stat(run.out / run_dir.LAST_CHECKPOINT)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_mtime_ns


def kept(run, before, saved: str) -> str:
    """What a run stopped by an error or an interruption left in ``--out``: ``saved`` if it
    continued a run (``--resume``) or wrote a checkpoint of its own (its last checkpoint
    is no longer ``before``, :func:`last_checkpoint`); else nothing of it, and the run it
    was to replace is as it was."""
    if run.resume or last_checkpoint(run) not in (None, before):
        return saved
    if before is not None:
        return f'the run in {run.out} was not replaced'
    return 'no checkpoint was written, and nothing was kept'


def stopped(error: Exception, run, before, usage: str, prefix: str = '') -> Exception:
    """A run stopped by ``error`` (bad data met while training, an I/O error, a non-finite
    update with ``--nonfinite raise``) as one line, with what it left in ``--out``
    (:func:`kept`): a user error (exit code 2) for a value, else :class:`RunError`."""
    where = kept(run, before, f'the run in {run.out} is kept as of its last checkpoint')
    if isinstance(error, (ValueError, TypeError)):
        refused = usage_error(error, usage, prefix)
        return UsageError(f'{str(refused).rstrip(".")}; {where}', usage)
    return RunError(f'{str(error).rstrip(".")}; {where}')


def _fit(run, usage: str, start: float, trainer: Trainer, train_set, test_set) -> int:
    """Train (holding the run directory's lock), write the final metrics and report."""
    if not run.quiet:
        print(_start_line(run, trainer, train_set, test_set), flush=True)
    before = last_checkpoint(run)
    try:
        trainer.fit(train_set, eval_dataset=test_set, progress=not run.quiet,
                    **_fit_arguments(run))
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    except (run_dir.RunExistsError, run_dir.NothingToResumeError,
            run_dir.RunLockedError) as error:
        raise _out_error(run, error, usage) from None   # another process came first
    except (ValueError, TypeError, OSError, FloatingPointError) as error:
        if isinstance(error, run_dir.RunDirectoryLostError):
            raise
        raise stopped(error, run, before, usage, _data_prefix(run, error)) from None
    except KeyboardInterrupt:
        raise Interrupted(kept(run, before, f'epochs 1-{trainer.epoch} are saved in {run.out}; '
                                            f'rerun with --resume and the same options to '
                                            f'continue')) from None
    wall = time.perf_counter() - start
    peak_mb = peak_rss_mib()
    summary = dict(zip(SUMMARY, (run.task, wall, peak_mb, len(train_set), len(test_set))))
    metrics = trainer.write_logs(run.out, **summary)
    if trainer.updates and trainer.skipped_updates == trainer.updates:
        warnings.warn(f'all {trainer.updates} updates were skipped for non-finite values, so '
                      f'the model did not learn; {_remedy(run, trainer)}', RuntimeWarning)
    print(f"test accuracy {metrics['test_accuracy']:.1%} | wall time {wall:.1f} s | "
          f"peak RSS {peak_mb:.0f} MB")
    return 0


def _remedy(run, trainer: Trainer) -> str:
    """What to change when no update of the run was applied: a learning rate too large for
    the updates, or (the loss itself never finite) the regulariser's strength."""
    if any(math.isfinite(record['train_loss']) for record in trainer.history):
        return f'lower --lr (now {run.lr:g})'
    return 'the loss was not finite for any batch' + (
        f'; lower --rate-strength (now {run.rate_strength:g})' if run.rate_target else '')


def _start_line(run, trainer: Trainer, train_set, test_set) -> str:
    """What is trained, on what, where."""
    learner = trainer.learner
    return (f'{run.task}: {len(train_set)} train / {len(test_set)} test samples, '
            f'T={train_set.num_steps}, frames {train_set.frame_shape}; {learner.algorithm}'
            + trace_choice(learner)
            + (f', exact within windows of {learner.window} steps'
               if getattr(learner, 'window', None) else '')
            + f'; {run.devices} device(s); run directory {run.out}')


def _data_prefix(run, error: Exception) -> str:
    """What names the source of a value refused while training: nothing for an option's
    (the message names it), ``--data: `` for bad data met in a streamed file."""
    if isinstance(error, ArgumentError) and spell(error.name) is not None:
        return ''
    return '--data: ' if run.task == 'events' else ''
