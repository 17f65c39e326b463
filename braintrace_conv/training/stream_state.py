"""The state of a stream run in a checkpoint, saved and restored.

A checkpoint of :meth:`Trainer.fit_stream <braintrace_conv.training.Trainer.fit_stream>`
is one of :mod:`~braintrace_conv.training.checkpoint` holding the trainer's state
(:func:`~braintrace_conv.training.state.snapshot`: parameters, optimiser state, counts,
settings) and

* ``carry/<i>``: the leaves of the learner's carry
  (:meth:`~braintrace_conv.executors.Learner.online_state`: hidden states and traces);
* under the metadata key ``stream`` (:meth:`StreamRun.state`): the stream's position
  (:meth:`~braintrace_conv.data.EventStream.position`), the chunks, steps and events
  played, the metrics' aggregates
  (:meth:`~braintrace_conv.training.stream_metrics.StreamMetrics.state`), the
  evaluations, the best one, whether the run stopped (``finished``) and whether its
  stream ended (``ended``: a run stopped by ``max_steps`` may be extended).

:func:`restore` checks all of it, the streams' arguments included, before the trainer
or its learner change.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from . import checkpoint, run_dir, state
from .stream_metrics import MetricTotals, StreamMetrics

__all__ = ['StreamRun', 'snapshot', 'restore', 'lagging', 'run_differences', 'stream_config']

_FORMAT = 'braintrace_conv.stream-run/1'


@dataclasses.dataclass
class StreamRun:
    """Where a stream run is: what a checkpoint holds besides the trainer's state."""

    position: Optional[dict]        # the stream's, after the last chunk counted
    metrics: StreamMetrics
    dt_us: int                      # the stream's step
    chunks: int = 0
    steps: int = 0                  # time steps played by each stream
    events: int = 0                 # events binned, all streams
    evaluations: list = dataclasses.field(default_factory=list)
    best: Optional[dict] = None     # step and test_accuracy of the best evaluation
    row: dict = dataclasses.field(default_factory=lambda: dataclasses.asdict(MetricTotals()))
    finished: bool = False          # it stopped: the stream ended, or max_steps were played
    ended: bool = False             # the stream ended (nothing more to play)

    def state(self) -> dict:
        """JSON-able (the key ``stream`` of a checkpoint's metadata)."""
        return dict(format=_FORMAT, position=self.position, metrics=self.metrics.state(),
                    dt_us=self.dt_us, chunks=self.chunks, steps=self.steps, events=self.events,
                    evaluations=self.evaluations, best=self.best, row=self.row,
                    finished=self.finished, ended=self.ended)

    def more_to_play(self, max_steps: Optional[int]) -> bool:
        """Whether a run continued until it has played ``max_steps`` (``None``: until the
        stream ends) plays on: a run not finished, or finished by a smaller ``max_steps``
        before its stream ended."""
        return not self.finished or (not self.ended and (max_steps is None
                                                         or max_steps > self.steps))

    @property
    def stream_time_s(self) -> float:
        """Seconds of recording each stream has played."""
        return self.steps * self.dt_us / 1e6

    @classmethod
    def from_state(cls, saved, path) -> 'StreamRun':
        """The run :meth:`state` saved in the checkpoint ``path`` (``CheckpointError`` if
        it is not valid)."""
        if not isinstance(saved, dict) or saved.get('format') != _FORMAT:
            raise checkpoint.CheckpointError(f'{path} is not a checkpoint of a stream run '
                                             f'(no valid {_FORMAT!r} entry in its metadata).')
        try:
            run = cls(saved['position'], StreamMetrics.from_state(saved['metrics']),
                      *(int(saved[k]) for k in ('dt_us', 'chunks', 'steps', 'events')),
                      list(saved['evaluations']), saved['best'], dict(saved['row']),
                      bool(saved['finished']), bool(saved['ended']))
            MetricTotals(**run.row)
        except (KeyError, TypeError, ValueError) as err:
            raise checkpoint.CheckpointError(f'the stream entry of {path} must hold a stream '
                                             f'run\'s state ({_FORMAT}); {err}') from None
        return run


def snapshot(trainer, run: StreamRun) -> tuple:
    """``(arrays, metadata)`` of a checkpoint of a stream run: the trainer's
    (:func:`~.state.snapshot`) with the leaves of the learner's carry as arrays
    ``carry/0``, ``carry/1``, ... (:meth:`~braintrace_conv.executors.Learner.online_state`)
    and the metadata key ``stream``: :meth:`StreamRun.state` with the carry's batch size
    (``carry_batch``) and number of leaves (``carry_leaves``)."""
    arrays, meta = state.snapshot(trainer)
    carry = trainer.learner.online_state()
    for i, leaf in enumerate(carry['leaves']):
        arrays[f'carry/{i}'] = leaf
    meta['stream'] = dict(run.state(), carry_batch=carry['batch_size'],
                          carry_leaves=len(carry['leaves']))
    return arrays, meta


def lagging(out_dir: Path, run: StreamRun, summary: tuple = ()) -> list:
    """The files of the run directory ``out_dir`` that lag behind its last checkpoint, of
    ``run`` (:func:`~.run_dir.lagging_files`; ``summary``: keys the caller adds to the
    ``metrics.json`` of a finished run); ``metrics.json`` tells its checkpoint by ``chunks``
    and ``finished``."""
    last_is_best = run.best is not None and run.best['step'] == run.steps
    played = lambda meta: isinstance(meta.get('stream'), dict) and \
        meta['stream'].get('steps') == run.steps
    return run_dir.lagging_files(out_dir, dict(chunks=run.chunks, finished=run.finished)
                                 if run.chunks else {}, curve=bool(run.evaluations),
                                 best_of=played if last_is_best else None, summary=summary)


def restore(trainer, path: Path, expected: dict, stream, eval_stream,
            max_steps: Optional[int]) -> StreamRun:
    """Continue the stream run saved at ``path`` until it has played ``max_steps``:
    everything is checked (the trainer's state by :func:`~.state.restore`, the streams'
    arguments by the position) before the trainer and the learner change.

    Args:
      trainer: The trainer restored, with its learner's carry.
      path: The checkpoint.
      expected: What its metadata must hold: ``{'trainer': Trainer.config(), 'run': the
        run options, 'fit': fit_stream's settings}``; the run options may differ in
        ``max_steps`` (:func:`run_differences`).
      stream: The training stream, sought to the checkpoint's position.
      eval_stream: The held-out stream, which must be the one the run was evaluated on.
      max_steps: The length of the run being played.

    Raises:
      FileNotFoundError: No file at ``path``.
      CheckpointError: The file is no checkpoint of a stream run, lacks the learner's
        carry, does not continue ``stream``, or does not fit ``trainer``.
      ConfigMismatchError: Its settings, run options or held-out stream differ from
        ``expected`` and ``eval_stream`` (a ``CheckpointError``).
    """
    arrays, meta = checkpoint.read(path)
    run = StreamRun.from_state(meta.get('stream'), path)
    count, batch = (meta['stream'].get(k) for k in ('carry_leaves', 'carry_batch'))
    leaves = [arrays.get(f'carry/{i}') for i in range(count)] if isinstance(count, int) else []
    if not leaves or any(a is None for a in leaves) or not isinstance(batch, int):
        raise checkpoint.CheckpointError(f'{path} lacks the carry of its learner '
                                         f'(carry/<i> entries).')
    _check_eval_stream(meta, eval_stream, path)
    try:
        stream.seek(run.position)
    except (ValueError, TypeError, KeyError) as err:
        raise checkpoint.CheckpointError(f'{path} does not continue this stream: {err}') \
            from None
    state.restore(trainer, path, expected,
                  lambda stored, given: run_differences(stored, given, max_steps))
    trainer.learner.restore_online_state(dict(batch_size=batch, leaves=leaves))
    return run


def run_differences(stored: dict, given: dict, max_steps: Optional[int]) -> dict:
    """``{option: (stored, given)}`` of the run options ``given`` that differ from those a
    run ``stored``, except ``max_steps`` when ``given['max_steps']`` is ``max_steps``, the
    length of the run being played: a run plays until it has played ``max_steps``, so a
    larger one extends a run it stopped (:meth:`StreamRun.more_to_play`)."""
    differences = checkpoint.config_differences(stored, given)
    if given.get('max_steps') == max_steps:
        differences.pop('max_steps', None)
    return differences


def stream_config(stream) -> Optional[dict]:
    """The arguments of an :class:`~braintrace_conv.data.EventStream` (its recordings'
    names, sizes and lengths included) as its position records them; ``None`` for none."""
    return None if stream is None else stream.position()['config']


def _check_eval_stream(meta: dict, eval_stream, path) -> None:
    """The held-out stream must be the one the run was evaluated on."""
    stored, now = meta.get('fit', {}).get('eval_stream'), stream_config(eval_stream)
    if not checkpoint.config_differences({'eval_stream': stored}, {'eval_stream': now}):
        return
    if stored is None or now is None:
        what = 'the run had none' if stored is None else 'none is given now'
    else:
        keys = checkpoint.config_differences(stored, now)
        what = f'in {", ".join(keys)}'
    raise checkpoint.ConfigMismatchError(path, {'eval_stream': (stored, now)},
                                         {'eval_stream': f'the held-out stream differs '
                                                         f'({what})'})
