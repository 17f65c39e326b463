"""What a run records: a per-epoch summary, per-batch scalars and a learning curve.

* ``metrics.json``: the run's configuration and per-epoch history (NaN and
  infinities are written as ``null``, so the file is strict JSON);
* ``scalars.csv``: one row every ``log_every`` batches with the columns
  :data:`SCALAR_COLUMNS`; with ``tensorboardX`` installed, the same scalars
  (and the per-epoch evaluation) as TensorBoard events under ``tensorboard/``;
* ``learning_curve.png``: loss and accuracy per epoch, titled with the task,
  algorithm and settings.

Every file except the append-only CSV and TensorBoard logs is replaced
atomically. A resumed run first drops the rows and events logged after its
checkpoint (by a run killed mid-epoch), so the logs match the restored state.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Optional, Union

from ._files import atomic_write, fsync_dir
from .run_dir import CURVE_NAME, METRICS_NAME, SCALARS_NAME, TENSORBOARD_DIR

__all__ = ['SCALAR_COLUMNS', 'ScalarLog', 'write_metrics', 'write_curve', 'run_title']

#: Columns of ``scalars.csv``: the number of optimiser updates after the batch (``step``,
#: TensorBoard's name for it), epoch (1-based), batch index in the epoch, the batch's loss
#: and accuracy, updates skipped so far (non-finite gradients), seconds since the epoch
#: started.
SCALAR_COLUMNS = ('step', 'epoch', 'batch', 'loss', 'accuracy', 'skipped_updates', 'time_s')
# The columns also written as TensorBoard scalars, where a log has them.
_TENSORBOARD_KEYS = ('loss', 'accuracy', 'step_accuracy', 'segment_accuracy',
                     'skipped_updates')


def _strict(value):
    """``value`` with non-finite floats replaced by ``None`` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_metrics(directory: Union[str, os.PathLike], metrics: dict) -> None:
    """Write ``metrics`` as ``metrics.json`` in ``directory`` (atomically)."""
    atomic_write(Path(directory) / METRICS_NAME,
                 json.dumps(_strict(metrics), indent=2, allow_nan=False).encode())


def run_title(config: dict) -> str:
    """Two lines naming the task and algorithm, then the settings of a run, from its
    configuration (the keys of ``Trainer.config()`` plus any of ``task``, ``lr``,
    ``batch_size``, ``channels``, ``seed``)."""
    head = ', '.join(str(config[k]) for k in ('task', 'algorithm') if config.get(k))
    parts = []
    loss = config.get('loss')
    if loss == 'final':
        parts.append(f"loss on the last {config.get('final_steps')} step(s)")
    elif loss:
        parts.append('loss at every step')
    every = config.get('update_every')
    parts.append('one update per sequence' if every is None else f'update every {every} steps')
    for key, label in (('lr', 'lr'), ('batch_size', 'batch'), ('channels', 'channels'),
                       ('seed', 'seed')):
        if config.get(key) is not None:
            value = config[key]
            value = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else value
            parts.append(f'{label} {value}')
    return head + '\n' + ' | '.join(map(str, parts))


def write_curve(directory: Union[str, os.PathLike], history: list, title: str,
                **axes) -> None:
    """Draw loss and accuracy per epoch (or, with ``axes``, the ``x`` and ``panels`` of
    :func:`~braintrace_conv.plot.learning_curve`) and write ``learning_curve.png``
    (atomically)."""
    import matplotlib.pyplot as plt

    from ..plot import learning_curve

    fig = learning_curve(history, **axes)
    fig.suptitle(title, fontsize=10)
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format='png', dpi=100)
    finally:
        plt.close(fig)
    atomic_write(Path(directory) / CURVE_NAME, buffer.getvalue())


def _summary_writer(directory: Path, tensorboard: Optional[bool], purge_step: int):
    if tensorboard is False:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        if tensorboard:
            raise ImportError('tensorboard=True needs tensorboardX: pip install '
                              '"braintrace_conv[tensorboard]".') from None
        return None
    return SummaryWriter(str(directory / TENSORBOARD_DIR),
                         purge_step=purge_step if purge_step else None)


class ScalarLog:
    """Per-batch scalars of a run: ``scalars.csv`` and, when available, TensorBoard.

    Args:
      directory: The run directory (must exist).
      start_update: Number of updates of the state the run starts from (0 for a new run,
        the checkpoint's for a resumed one); rows logged after it are dropped.
      tensorboard: Also write TensorBoard events: ``None`` when ``tensorboardX`` is
        installed, ``True`` always (error without it), ``False`` never.
      columns: The columns of the file; the first counts what ``start_update`` counts
        (default :data:`SCALAR_COLUMNS`; a stream run's are those of
        :data:`~braintrace_conv.training.stream.STREAM_COLUMNS`, counted in chunks).
    """

    def __init__(self, directory: Union[str, os.PathLike], *, start_update: int,
                 tensorboard: Optional[bool] = None, columns: tuple = SCALAR_COLUMNS):
        self.path = Path(directory) / SCALARS_NAME
        self.columns = tuple(columns)
        rows = self._rows_until(start_update)
        text = io.StringIO()
        writer = csv.writer(text, lineterminator='\n')
        writer.writerow(self.columns)
        writer.writerows(rows)
        atomic_write(self.path, text.getvalue().encode())
        self._tensorboard = tensorboard
        self._file = open(self.path, 'a', newline='')
        self._csv = csv.writer(self._file, lineterminator='\n')
        self._tb = _summary_writer(self.path.parent, tensorboard, start_update + 1)

    def reopen(self, directory: Union[str, os.PathLike]) -> None:
        """Continue the log, :meth:`close`\\ d, in ``directory``, where its files were
        moved (a new run's first checkpoint moves them from where it started)."""
        self.path = Path(directory) / SCALARS_NAME
        self._file = open(self.path, 'a', newline='')
        self._csv = csv.writer(self._file, lineterminator='\n')
        if self._tb is not None:
            self._tb = _summary_writer(self.path.parent, self._tensorboard, 0)

    def _rows_until(self, update: int) -> list:
        if update == 0 or not self.path.is_file():
            return []
        # undecodable bytes (a damaged file) become U+FFFD and fail the checks below
        with open(self.path, newline='', encoding='utf-8', errors='replace') as f:
            rows = list(csv.reader(f))[1:]
        kept = []
        for row in rows:    # a run killed mid-write may leave a partial last line
            if (len(row) == len(self.columns) and row[0].isascii() and row[0].isdigit()
                    and int(row[0]) <= update
                    and not any('\ufffd' in cell for cell in row)):
                kept.append(row)
        return kept

    def log(self, update: int, **scalars) -> None:
        """Append one row: ``update`` in the first column (what ``start_update`` counts:
        the updates so far, ``step``, for :meth:`Trainer.fit
        <braintrace_conv.training.Trainer.fit>`; the chunks played, ``chunk``, for a
        stream), and the other columns."""
        row = dict(scalars, **{self.columns[0]: update})
        try:
            self._csv.writerow([row[c] for c in self.columns])
            self._file.flush()
        except OSError as err:      # e.g. a full disk: name the file being written
            raise OSError(err.errno, err.strerror or str(err), str(self.path)) from None
        if self._tb is not None:
            for key in _TENSORBOARD_KEYS:
                if row.get(key) is not None:
                    self._tb.add_scalar(f'train/{key}', row[key], update)

    def log_epoch(self, update: int, record: dict) -> None:
        """The evaluation of an epoch record (see ``Trainer.fit``) to TensorBoard."""
        if self._tb is None:
            return
        for key in ('test_loss', 'test_accuracy'):
            if key in record:
                self._tb.add_scalar(f"eval/{key[len('test_'):]}", record[key], update)
        for name, rate in record.get('spike_rates', {}).items():
            self._tb.add_scalar(f'spike_rate/{name}', rate, update)

    def sync(self) -> None:
        """Make everything logged so far durable (called with each checkpoint)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        fsync_dir(self.path.parent)
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
