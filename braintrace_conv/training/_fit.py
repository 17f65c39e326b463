"""The run loop of :meth:`Trainer.fit <braintrace_conv.training.Trainer.fit>`: its arguments,
the epochs, and the run directory held while a run is written (:func:`hold`, also used by
the command line), resumed and repaired."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np
from tqdm.auto import tqdm

from .._validation import at_most, boolean, non_negative, positive
from . import checkpoint, logs, placement, run_dir, state
from ._files import atomic_write
from .fingerprint import data_fingerprint


@contextlib.contextmanager
def hold(out_dir: Union[str, os.PathLike], *, resume: bool, overwrite: bool,
         writer: bool = True):
    """Hold the run directory ``out_dir`` for the ``with`` block: checked
    (:func:`~.run_dir.check`, so a refused directory is left as it was), then, by the
    process that writes the run (``writer``), locked, checked again under the lock
    (another process may have written a run there meanwhile) and created
    (:func:`~.run_dir.create`). A run to be replaced (``overwrite``) is still there: a new
    run replaces it only with its own first checkpoint (:class:`RunFiles`). Re-entrant,
    so a caller holding the directory (the command line, until its last write) may fit
    in it. Yields the directory as a ``Path``."""
    out_dir = run_dir.check(out_dir, resume=resume, overwrite=overwrite)
    # every process checks the directory before the first one writes to it
    placement.sync_processes('braintrace_conv: run directory checked')
    if not writer:
        yield out_dir
        return
    with run_dir.locked(out_dir):
        run_dir.check(out_dir, resume=resume, overwrite=overwrite)
        run_dir.create(out_dir)
        yield out_dir


class RunFiles:
    """Where the process that writes a run puts its files, in the run directory
    ``out_dir`` it holds (:func:`hold`): a resumed run writes there; a new run (also one
    replacing another) writes into a staging directory (:func:`~.run_dir.stage`) until
    its first checkpoint, with which :meth:`save` moves everything in
    (:func:`~.run_dir.commit`), so a run that fails or is interrupted before it leaves the
    run directory as it was. :meth:`close` closes the scalar log and removes a staging
    directory never committed.

    Attributes:
      directory: Where the run writes now.
      log: The run's :class:`~.logs.ScalarLog` (:meth:`open_log`), or ``None``.
    """

    def __init__(self, out_dir: Path, *, resume: bool):
        self.out_dir = out_dir
        self.directory = out_dir if resume else run_dir.stage(out_dir)
        self.log: Optional[logs.ScalarLog] = None

    def open_log(self, **options) -> logs.ScalarLog:
        """Open the scalar log in :attr:`directory` (``options``: those of
        :class:`~.logs.ScalarLog`)."""
        self.log = logs.ScalarLog(self.directory, **options)
        return self.log

    def save(self, snapshot: tuple, improved: bool, write_logs) -> None:
        """The scalar log made durable, the last (and, ``improved``, the best) checkpoint of
        ``snapshot`` ``(arrays, metadata)``, then the logs (``write_logs(directory)``,
        ``metrics.json`` last), holding the run directory (:func:`~.run_dir.locked` raises
        :class:`~.run_dir.RunDirectoryLostError` if it was removed meanwhile); a new run's
        first checkpoint then moves it into the run directory."""
        with run_dir.locked(self.out_dir):
            if self.log is not None:
                self.log.sync()
            checkpoint.write(self.directory / run_dir.LAST_CHECKPOINT, *snapshot)
            if improved:
                checkpoint.write(self.directory / run_dir.BEST_CHECKPOINT, *snapshot)
            write_logs(self.directory)
            if self.directory != self.out_dir:
                self._commit()

    def _commit(self) -> None:
        if self.log is not None:        # moved closed: Windows renames no open file
            self.log.close()
        run_dir.commit(self.out_dir, self.directory)
        self.directory = self.out_dir
        if self.log is not None:
            self.log.reopen(self.out_dir)

    def close(self) -> None:
        """Close the scalar log; remove the staging directory of a run that wrote no
        checkpoint (the run directory is as it was before the run)."""
        if self.log is not None:
            self.log.close()
        if self.directory != self.out_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


class _Arguments(NamedTuple):
    """The arguments of :meth:`Trainer.fit`, checked."""
    epochs: int
    batch_size: int
    seed: int
    eval_batch_size: int
    run_config: dict
    log_every: int
    verify_data: bool


def check_arguments(trainer, train_dataset, eval_dataset, *, epochs, batch_size, seed,
                    eval_batch_size, out_dir, resume, overwrite, run_config,
                    log_every, verify_data=False) -> _Arguments:
    """The arguments of :meth:`Trainer.fit`, checked with its data sets; changes nothing."""
    trainer._require_optimizer('fit')
    epochs, batch_size = positive('epochs', epochs), positive('batch_size', batch_size)
    seed, log_every = non_negative('seed', seed), positive('log_every', log_every)
    eval_batch_size = (batch_size if eval_batch_size is None
                       else positive('eval_batch_size', eval_batch_size))
    run_config = _json_dict('run_config', run_config)
    trainer._check_dataset('train_dataset', train_dataset)
    at_most('batch_size', batch_size, len(train_dataset.labels), 'training_samples',
            names={'training_samples': 'the number of training samples'})
    trainer._parallel.check_batch_size('batch_size', batch_size)
    if eval_dataset is not None:
        trainer._check_dataset('eval_dataset', eval_dataset)
    if out_dir is None and (resume or overwrite):
        raise ValueError(f'{"resume" if resume else "overwrite"} needs out_dir (the run '
                         f'directory to {"continue" if resume else "replace"}).')
    verify_data = boolean('verify_data', verify_data)
    if verify_data and out_dir is None:
        raise ValueError('verify_data needs out_dir (the run directory whose checkpoints hold '
                         'the data fingerprints).')
    return _Arguments(epochs, batch_size, seed, eval_batch_size, run_config, log_every,
                      verify_data)


def _json_dict(name: str, value: Optional[dict]) -> dict:
    """``value`` (``None``: ``{}``) as JSON reads it back, checked to be a dict."""
    value = {} if value is None else value
    try:
        value = json.loads(json.dumps(value))
    except (TypeError, ValueError) as err:
        raise TypeError(f'{name} must be a JSON-able dict, got {value!r}: {err}') from None
    if not isinstance(value, dict):
        raise TypeError(f'{name} must be a dict, got {type(value).__name__}.')
    return value


def fit(trainer, train_dataset, *, epochs: int, batch_size: int, seed: int, eval_dataset,
        eval_batch_size: Optional[int], out_dir: Union[str, os.PathLike, None], resume: bool,
        overwrite: bool, run_config: Optional[dict], log_every: int,
        tensorboard: Optional[bool], progress: bool, verify_data: bool = False) -> list:
    """:meth:`Trainer.fit <braintrace_conv.training.Trainer.fit>` of ``trainer``."""
    args = check_arguments(trainer, train_dataset, eval_dataset, epochs=epochs,
                           batch_size=batch_size, seed=seed, eval_batch_size=eval_batch_size,
                           out_dir=out_dir, resume=resume, overwrite=overwrite,
                           run_config=run_config, log_every=log_every, verify_data=verify_data)
    with contextlib.ExitStack() as stack:
        files = None
        if out_dir is not None:
            fit_config = _fit_config(args, train_dataset, eval_dataset)
            out_dir = stack.enter_context(hold(out_dir, resume=resume, overwrite=overwrite,
                                               writer=trainer._writer))
            files = _open_run(trainer, out_dir, resume, args.epochs,
                              dict(run=args.run_config, trainer=trainer.config(),
                                   fit=fit_config),
                              tensorboard, dict(train_data=train_dataset,
                                                eval_data=eval_dataset))
            if files is not None:
                stack.callback(files.close)
        trainer.run_config = args.run_config
        if trainer._rng is None:
            trainer._rng = np.random.default_rng(args.seed)
        while trainer.epoch < args.epochs:
            _run_epoch(trainer, train_dataset, eval_dataset, args, files,
                       progress and trainer._writer)
    return trainer.history


def _fit_config(args: _Arguments, train_dataset, eval_dataset) -> dict:
    """The settings of :meth:`Trainer.fit` stored with a run and compared on resume, with
    the data sets' fingerprints (by their files' contents too with ``verify_data``, which
    is stored only when set, so runs written before it existed still resume)."""
    verify = dict(verify_data=True) if args.verify_data else {}
    return dict(batch_size=args.batch_size, seed=args.seed, **verify,
                train_data=data_fingerprint(train_dataset, contents=args.verify_data),
                eval_data=data_fingerprint(eval_dataset, contents=args.verify_data))


def _run_epoch(trainer, train_dataset, eval_dataset, args: _Arguments,
               files: Optional[RunFiles], progress: bool) -> None:
    """One epoch: train, evaluate, record, and (with a run directory) save the run."""
    log = None if files is None else files.log
    record = _train_epoch(trainer, train_dataset, args.batch_size, args.epochs, progress, log,
                          args.log_every)
    if eval_dataset is not None:
        metrics = trainer.evaluate(eval_dataset, args.eval_batch_size)
        record.update(test_loss=metrics['loss'], test_accuracy=metrics['accuracy'],
                      spike_rates=metrics['spike_rates'])
    trainer.epoch += 1
    trainer.history.append(record)
    improved = 'test_accuracy' in record and (
        trainer.best is None or record['test_accuracy'] > trainer.best['test_accuracy'])
    if improved:
        trainer.best = dict(epoch=trainer.epoch, test_accuracy=record['test_accuracy'])
    if files is not None:
        files.log.log_epoch(trainer.updates, record)
        files.save(state.snapshot(trainer), improved, trainer.write_logs)
    if progress:
        tqdm.write(_summary_line(record, args.epochs))


def _open_run(trainer, out_dir: Path, resume: bool, epochs: int, expected: dict,
              tensorboard: Optional[bool], datasets: dict) -> Optional[RunFiles]:
    """Prepare the held run directory: restore its last checkpoint (``resume``, checking
    ``datasets``, keyed like their fingerprints in ``expected['fit']``) and repair what a
    run killed after it left behind; returns where the run writes, with its scalar log
    open (``None`` on other processes than the first)."""
    if resume:
        state.restore(trainer, out_dir / run_dir.LAST_CHECKPOINT, expected,
                      functools.partial(state.run_differences, epochs=epochs), datasets)
        if trainer._writer:
            _repair_run(out_dir, run_dir.lagging(out_dir, trainer.epoch, trainer.best),
                        trainer.write_logs)
    trainer._fit_config = expected['fit']
    if not trainer._writer:
        return None
    files = RunFiles(out_dir, resume=resume)
    try:
        files.open_log(start_update=trainer.updates, tensorboard=tensorboard)
    except BaseException:       # e.g. tensorboard=True without tensorboardX
        files.close()
        raise
    return files


def _repair_run(out_dir: Path, found: list, write_logs) -> None:
    """Write what a run killed between its last checkpoint and the end of the writes that
    follow it left behind (``found``: :func:`~braintrace_conv.training.run_dir.lagging_files`):
    the best checkpoint, a copy of the last one; ``metrics.json`` and the curve, by
    ``write_logs(out_dir)``."""
    if run_dir.BEST_CHECKPOINT in found:    # the last checkpoint is the best one
        atomic_write(out_dir / run_dir.BEST_CHECKPOINT,
                     (out_dir / run_dir.LAST_CHECKPOINT).read_bytes())
    if run_dir.METRICS_NAME in found or run_dir.CURVE_NAME in found:
        write_logs(out_dir)


def _train_epoch(trainer, dataset, batch_size: int, epochs: int, progress: bool, log,
                 log_every: int) -> dict:
    """Train on every batch of ``dataset`` once, in a random order; the epoch's record."""
    start = time.perf_counter()
    skipped_before = trainer.skipped_updates
    order_seed = int(trainer._rng.integers(2**31))
    n_batches = dataset.num_batches(batch_size, drop_last=True)
    bar = tqdm(trainer._batches('train_dataset', dataset, batch_size, shuffle=True,
                                seed=order_seed, drop_last=True),
               total=n_batches, desc=f'epoch {trainer.epoch + 1}/{epochs}',
               disable=not (progress and _bar_shown()), leave=False, unit='batch')
    loss_sum, loss_count, correct, seen = 0.0, 0, 0, 0
    for i, (xs, labels) in enumerate(bar):
        loss, hits = trainer._train_batch(xs, labels)
        if np.isfinite(loss):
            loss_sum += loss * len(labels)
            loss_count += len(labels)
        correct += hits
        seen += len(labels)
        if log is not None and (i + 1) % log_every == 0:
            log.log(trainer.updates, epoch=trainer.epoch + 1, batch=i, loss=loss,
                    accuracy=hits / len(labels), skipped_updates=trainer.skipped_updates,
                    time_s=round(time.perf_counter() - start, 3))
        bar.set_postfix(loss=f'{loss_sum / max(loss_count, 1):.3f}',
                        acc=f'{correct / seen:.3f}')
    bar.close()
    return dict(epoch=trainer.epoch + 1,
                train_loss=loss_sum / loss_count if loss_count else float('nan'),
                train_accuracy=correct / seen,
                skipped_updates=trainer.skipped_updates - skipped_before,
                epoch_time_s=time.perf_counter() - start)


def _bar_shown() -> bool:
    """Whether a progress bar can be drawn: in a notebook, or on a terminal (a bar redrawn
    with carriage returns would fill a log file; the epoch lines are printed anyway)."""
    notebook = any(c.__module__ == 'tqdm.notebook' for c in tqdm.__mro__)
    return notebook or sys.stderr.isatty()


def _summary_line(record: dict, epochs: int) -> str:
    """The line printed after an epoch: its losses, accuracies and spike rates."""
    line = (f"epoch {record['epoch']}/{epochs}: train loss {record['train_loss']:.4f}, "
            f"train acc {record['train_accuracy']:.1%}")
    if record['skipped_updates']:
        line += f", {record['skipped_updates']} update(s) skipped (non-finite)"
    if 'test_accuracy' in record:
        rates = ', '.join(f'{name} {rate:.3f}' for name, rate in record['spike_rates'].items())
        line += f", test acc {record['test_accuracy']:.1%}"
        if rates:
            line += f", spike rates [{rates}]"
    return line + f" ({record['epoch_time_s']:.1f} s)"
