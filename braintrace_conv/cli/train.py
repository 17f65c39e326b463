"""``braintrace-conv train``: a run written to its run directory, new, resumed or replaced."""
from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
import warnings
from typing import Optional

from .. import ES_D_RTRL
from ..training import Trainer, checkpoint, run_dir
from .build import _setup
from .parser import PROG, UsageError, _option
from .resolve import _resolve, _run_config


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ','.join(map(str, value))
    return 'unset' if value is None else str(value)


def _check_resume(args, usage: str) -> Optional[dict]:
    """The metadata of the run to resume, checked against the options; ``None`` with a
    message if the run is already finished (and nothing lags behind its last checkpoint)."""
    path = args.out / run_dir.LAST_CHECKPOINT
    try:
        _, meta = checkpoint.read(path)
        stored = checkpoint.field(meta, 'run', dict, path)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    differences = checkpoint.config_differences(stored, _run_config(args))
    old_epochs = differences.get('epochs', (None,))[0]
    if isinstance(old_epochs, int) and old_epochs <= args.epochs:
        del differences['epochs']    # a longer run continues this one
    if differences:
        listed = ', '.join(f'{_option(k)} {_shown(old)} (now {_shown(new)})'
                           for k, (old, new) in differences.items())
        raise UsageError(f'--resume: the run in {args.out} was trained with other options: '
                         f'{listed}; give the same options, or another --out', usage)
    if meta['epoch'] >= args.epochs:
        lagging = run_dir.lagging(args.out, meta['epoch'], meta.get('best'))
        if lagging:
            print(f'the run in {args.out} is finished ({meta["epoch"]} epochs) but was '
                  f'interrupted while writing its files; repairing {", ".join(lagging)}')
            return meta
        print(f'the run in {args.out} is already finished ({meta["epoch"]}/{args.epochs} '
              f'epochs); nothing to do. Evaluate it with: {PROG} evaluate --run {args.out}, '
              f'or extend it with a larger --epochs')
        return None
    if isinstance(old_epochs, int) and old_epochs < args.epochs:
        print(f'extending the run in {args.out} from {old_epochs} to {args.epochs} epochs (the '
              f'learning-rate schedule is stretched over {args.epochs} epochs from here on)')
    return meta


def _out_error(args, error: Exception, usage: str) -> UsageError:
    """A refused run directory as a user error naming the command-line options."""
    if isinstance(error, FileExistsError):
        found = ', '.join(run_dir.run_files(args.out))
        return UsageError(f'--out {args.out} already holds a run ({found}); pass --resume to '
                          f'continue it or --overwrite to replace it', usage)
    if isinstance(error, FileNotFoundError):
        return UsageError(f'--resume: {args.out} has no checkpoint ({run_dir.LAST_CHECKPOINT}) '
                          f'to resume', usage)
    return UsageError(f'--out: {error}', usage)


def _remove_new_run(args) -> bool:
    """After a new run failed before its first checkpoint: remove the run files it wrote
    (the directory held no run before, or was to be replaced), under the directory's lock.
    Returns whether it did. A directory the run created is removed by :func:`_train` once
    the lock is released, if it is empty then."""
    if args.resume or (args.out / run_dir.LAST_CHECKPOINT).exists():
        return False
    try:
        run_dir.create(args.out, overwrite=True)
    except OSError:
        return False
    args.emptied = True
    return True


def _train(args, usage: str, start: float) -> int:
    args = _resolve(args, usage)
    args.out_existed, args.emptied = os.path.lexists(args.out), False
    try:
        run_dir.check(args.out, resume=args.resume, overwrite=args.overwrite)
    except (OSError, ValueError, run_dir.RunLockedError) as error:
        raise _out_error(args, error, usage) from None
    if args.resume and _check_resume(args, usage) is None:
        return 0
    trainer, train, test = _setup(args, usage)
    try:
        # every write to the run directory, the last metrics.json included, holds its lock
        with contextlib.ExitStack() as lock:
            try:
                lock.enter_context(run_dir.locked(args.out))
                run_dir.create(args.out, overwrite=False)
            except OSError as error:
                raise UsageError(f'--out {args.out} cannot be written: '
                                 f'{error.strerror or error}', usage) from None
            except run_dir.RunLockedError as error:
                raise _out_error(args, error, usage) from None
            return _fit(args, usage, start, trainer, train, test)
    finally:
        if args.emptied and not args.out_existed:
            with contextlib.suppress(OSError):
                args.out.rmdir()    # only if empty


def _fit(args, usage: str, start: float, trainer: Trainer, train, test) -> int:
    """Train (holding the run directory's lock), write the final metrics and report."""
    learner = trainer.learner
    if not args.quiet:
        print(f'{args.task}: {len(train)} train / {len(test)} test samples, '
              f'T={train.num_steps}, frames {train.frame_shape}; {learner.algorithm}'
              + (f' (decay {learner.decay:.4f})' if isinstance(learner, ES_D_RTRL) else '')
              + (f', exact within windows of {learner.window} steps'
                 if getattr(learner, 'window', None) else '')
              + f'; {args.devices} device(s); run directory {args.out}', flush=True)
    try:
        trainer.fit(train, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                    eval_dataset=test, out_dir=args.out, progress=not args.quiet,
                    resume=args.resume, overwrite=args.overwrite, run_config=_run_config(args),
                    log_every=args.log_every)
    except checkpoint.CheckpointError as error:
        raise UsageError(f'--resume: {error}', usage) from None
    except (FileExistsError, FileNotFoundError, run_dir.RunLockedError) as error:
        raise _out_error(args, error, usage) from None   # another process came first
    except (ValueError, TypeError) as error:    # bad data met while training (streamed files)
        _remove_new_run(args)
        raise UsageError(f'--data: {error}' if args.task == 'events' else str(error),
                         usage) from None
    except KeyboardInterrupt:
        if trainer.epoch:
            hint = (f'epochs 1-{trainer.epoch} are saved in {args.out}; rerun with --resume and '
                    f'the same options to continue')
        elif _remove_new_run(args):
            hint = 'no epoch was completed, and nothing was kept'
        else:
            hint = 'no epoch was completed; rerun with --overwrite to start again'
        print(f'{PROG}: interrupted; {hint}', file=sys.stderr)
        raise SystemExit(130)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics = trainer.write_logs(args.out, task=args.task, wall_time_s=wall,
                                 peak_rss_mb=peak_mb, num_train=len(train), num_test=len(test))
    if trainer.step and trainer.skipped_updates == trainer.step:
        warnings.warn(f'all {trainer.step} updates were skipped for non-finite values, so the '
                      f'model did not learn; lower --lr (now {args.lr:g})', RuntimeWarning)
    print(f"test accuracy {metrics['test_accuracy']:.1%} | wall time {wall:.1f} s | "
          f"peak RSS {peak_mb:.0f} MB")
    return 0

