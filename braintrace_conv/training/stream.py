r"""Training on a stream: one long sequence, or ``B`` of them, never cut into samples.

:meth:`Trainer.fit_stream <braintrace_conv.training.Trainer.fit_stream>` plays an
:class:`~braintrace_conv.data.EventStream` chunk by chunk through the learner's
:meth:`~braintrace_conv.executors.Learner.advance`:

* **Updates.** One optimiser update per chunk of ``T = stream.chunk_steps`` steps, from
  the gradient of the chunk's loss :math:`\sum_t \frac1B \sum_b w_{t,b}\,
  \mathrm{CE}(s_{t,b}, y_{t,b})` (the weights are 1 inside a labelled segment, 0
  outside: :func:`~braintrace_conv.training.loss.weighted_cross_entropy`); a chunk
  without a labelled step advances the network without an update.
* **Carry.** Hidden states and eligibility traces carry across chunks, segments and
  recordings: nothing is reset after :meth:`~braintrace_conv.executors.Learner.reset`
  at the start. With :class:`~braintrace_conv.BPTT` this is *truncated* BPTT: the state
  carries across chunks, the gradient is cut at every chunk boundary (the baseline the
  online rules are compared with). An online executor's ``window`` may not exceed ``T``
  (a window never spans two chunks).
* **Metrics.** Loss, step accuracy and segment accuracy (the majority of the per-step
  predictions over each segment; :mod:`~braintrace_conv.training.stream_metrics`),
  aggregated as the stream plays: since the start, per row of ``scalars.csv`` and per
  period between evaluations. Progress is counted in steps per second, events per second
  and stream time (steps x ``dt``).
* **Evaluation.** Every ``eval_every`` chunks and at the end, the current parameters run
  over a held-out stream from fresh hidden states
  (:meth:`~braintrace_conv.training.Trainer.evaluate_stream`), which leaves the training
  run's carry as it was.

Run directory (``out_dir``): ``checkpoint-last.npz`` every ``checkpoint_every`` chunks,
after every evaluation and at the end, ``checkpoint-best.npz`` at the best held-out
segment accuracy, ``metrics.json`` (:func:`summary`), ``scalars.csv`` (one row every
``log_every`` chunks, columns :data:`STREAM_COLUMNS`) and ``learning_curve.png`` (online
and held-out loss and accuracy against stream time). A checkpoint holds, besides the
trainer's state (:mod:`~braintrace_conv.training.state`), the learner's carry
(:meth:`~braintrace_conv.executors.Learner.online_state`, arrays ``carry/<i>``), the
stream's position and the metrics' aggregates, under the key ``stream`` of its metadata;
it is written atomically. ``resume`` continues from it: after a kill at any point, the
parameters, optimiser state, carry and metrics equal those of an uninterrupted run bit for
bit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import NamedTuple, Optional, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._validation import ArgumentError, at_most, optional, positive, non_negative
from ..data import EventStream
from ..executors import BPTT
from . import logs, placement, run_dir
from ._fit import RunFiles, _bar_shown, _json_dict, _repair_run, hold
from .loss import weighted_cross_entropy
from .spikes import split_output
from .stream_metrics import MetricTotals, StreamMetrics
from .stream_state import StreamRun, lagging, restore, snapshot, stream_config

__all__ = ['STREAM_COLUMNS', 'fit_stream', 'evaluate_stream', 'summary']

#: Columns of ``scalars.csv`` of a stream run: chunks played, time steps played (per
#: stream), optimiser updates, stream time (s), then over the steps since the previous
#: row: loss per labelled step, step accuracy, segments decided and their accuracy; then
#: updates skipped so far, steps and events per second since the previous row, and
#: seconds since the run (or its resumption) started.
STREAM_COLUMNS = ('chunk', 'step', 'updates', 'stream_time_s', 'loss', 'step_accuracy',
                  'segments', 'segment_accuracy', 'skipped_updates', 'steps_per_s',
                  'events_per_s', 'time_s')


# ----------------------------------------------------------------------------- arguments
class _Arguments(NamedTuple):
    """The arguments of :func:`fit_stream`, checked."""
    max_steps: Optional[int]
    eval_every: Optional[int]
    checkpoint_every: Optional[int]
    log_every: int
    settle_steps: int
    run_config: dict


def _check_trainer(trainer, stream) -> None:
    """What a trainer needs to learn from ``stream``: an optimiser, a per-step loss, one
    update per chunk and a window that fits in one."""
    trainer._require_optimizer('fit_stream')
    if trainer.loss != 'every_step':
        raise ArgumentError('loss', trainer.loss, "be 'every_step' to learn from a stream",
                            "a stream weighs every step by the segment it lies in")
    if trainer.rate_targets:
        raise ArgumentError('rate_targets', trainer.rate_targets, 'be empty on a stream',
                            'the firing-rate regulariser is a function of a whole sequence')
    if trainer.update_every not in (None, stream.chunk_steps):
        raise ArgumentError('update_every', trainer.update_every,
                            f"be None or the stream's {{chunk_steps}} ({stream.chunk_steps})",
                            'a stream is updated once per chunk',
                            refs=('chunk_steps',))
    window = getattr(trainer.learner, 'window', None)
    if window is not None:
        at_most('window', window, stream.chunk_steps, 'chunk_steps',
                fix='a window never spans two chunks', names={'window': "the learner's window"})


def _check_stream(trainer, name: str, stream) -> None:
    """``stream`` against the model: its frames and its classes."""
    if not isinstance(stream, EventStream):
        raise TypeError(f'{name} must be a braintrace_conv.data.EventStream, got '
                        f'{type(stream).__name__}.')
    outputs = trainer._num_outputs(stream.frame_shape, np.float32, name)
    if stream.num_classes > outputs:
        raise ValueError(f'{name} has {stream.num_classes} classes but the model has {outputs} '
                         f'outputs (class scores); build the model with '
                         f'num_classes={stream.num_classes}.')
    trainer._parallel.check_batch_size(f'the number of parallel streams of {name}',
                                       stream.batch_size)


def check_arguments(trainer, stream, eval_stream, *, max_steps, eval_every,
                    checkpoint_every, log_every, settle_steps, out_dir, resume, overwrite,
                    run_config) -> _Arguments:
    """The arguments of :func:`fit_stream`, checked with the streams; changes nothing."""
    _check_stream(trainer, 'stream', stream)
    _check_trainer(trainer, stream)
    if eval_stream is not None:
        _check_stream(trainer, 'eval_stream', eval_stream)
        if eval_stream.frame_shape != stream.frame_shape:
            raise ValueError(f'eval_stream has frames {eval_stream.frame_shape}, the stream '
                             f'{stream.frame_shape}; they must be equal.')
    args = _Arguments(
        optional(positive, 'max_steps', max_steps, means='until the stream ends'),
        optional(positive, 'eval_every', eval_every, means='at the end only'),
        optional(positive, 'checkpoint_every', checkpoint_every,
                 means='after evaluations and at the end'),
        positive('log_every', log_every), non_negative('settle_steps', settle_steps),
        _json_dict('run_config', run_config))
    if eval_every is not None and eval_stream is None:
        raise ArgumentError('eval_every', eval_every, 'be None without {eval_stream}',
                            'there is nothing to evaluate on', refs=('eval_stream',))
    if stream.loop and args.max_steps is None and out_dir is not None:
        raise ArgumentError('max_steps', None, 'be set for a stream with loop=True and an '
                            'out_dir', 'the run would never end, and never be finished')
    if out_dir is None and (resume or overwrite):
        raise ValueError(f'{"resume" if resume else "overwrite"} needs out_dir (the run '
                         f'directory to {"continue" if resume else "replace"}).')
    return args


# ----------------------------------------------------------------------------- evaluation
@contextlib.contextmanager
def _hidden_kept(model):
    """Put the values of the model's hidden states back after the block (which may
    initialise them anew, for another batch size)."""
    saved = {key: st.value for key, st in model.states(brainstate.HiddenState).items()}
    try:
        yield
    finally:
        for key, st in model.states(brainstate.HiddenState).items():
            if key in saved:
                st.value = saved[key]


def _scores_loss(scores, labels, weights) -> float:
    """``sum_{t,b} w CE`` of a chunk's class scores ``(T, B, num_classes)`` on the
    host."""
    z = np.asarray(scores, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    ce = -np.take_along_axis(log_p, np.asarray(labels)[..., None], axis=-1)[..., 0]
    return float(np.sum(np.asarray(weights, np.float64) * ce))


def evaluate_stream(trainer, stream, *, settle_steps: int = 0, predictor=None) -> dict:
    """:meth:`Trainer.evaluate_stream <braintrace_conv.training.Trainer.evaluate_stream>`;
    ``predictor`` is the learner whose forward pass it runs (default: a new
    :class:`~braintrace_conv.BPTT` of the trainer's model, which the trainer's own learner
    and its online run do not see)."""
    _check_stream(trainer, 'stream', stream)
    settle_steps = non_negative('settle_steps', settle_steps)
    predictor = predictor or BPTT(trainer.model, check_finite=trainer.learner.check_finite)
    metrics = StreamMetrics(stream.batch_size, trainer._num_outputs(stream.frame_shape,
                                                                    np.float32, 'stream'),
                            settle_steps)
    with _hidden_kept(trainer.model):
        stream.seek(None)
        for i, (xs, (labels, weights)) in enumerate(stream):
            segments = stream.last_segments
            outputs = predictor.predict(trainer._parallel.shard(xs), reset=i == 0)
            scores = placement.to_host(split_output(outputs)[0])
            metrics.add(_scores_loss(scores, labels, weights), scores, labels, weights,
                        segments)
        metrics.finish()
    return metrics.total.summary()


# ----------------------------------------------------------------------------- training
def _step_loss(out, target):
    """The executors' per-step loss on a stream: the weighted cross-entropy of the scores,
    ``target`` = ``(labels (B,), weights (B,))``."""
    return weighted_cross_entropy(split_output(out)[0], target)


class _Chunk(NamedTuple):
    """A chunk sent to the learner, whose results are read later (:class:`_Pipeline`)."""
    steps: int
    events: int
    labels: np.ndarray
    weights: np.ndarray
    segments: np.ndarray
    position: dict
    loss: jax.Array
    outputs: object
    update: Optional[tuple]          # (applied, finite gradients) of its update, if any


def _kept_if_finite(trainer, grads, opt_state, params, loss):
    """:meth:`Trainer._candidate_update`, its new parameters and optimiser state kept only
    where everything is finite (else the old ones)."""
    new_params, new_state, ok, finite = trainer._candidate_update(grads, opt_state, params, loss)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
    return keep(new_params, params), keep(new_state, opt_state), ok, finite


class _Pipeline:
    """Chunks through the learner with the host one chunk behind the device: the update
    of chunk ``n`` is applied on the device (kept only if everything is finite, as
    :meth:`Trainer._apply` does), chunk ``n + 1`` is sent, and only then are chunk ``n``'s
    loss and scores read and counted, so the host's work for one chunk overlaps the
    device's for the next. :meth:`flush` reads the chunk in flight (before a checkpoint
    or an evaluation, which need the learner at a chunk boundary)."""

    def __init__(self, trainer, run: StreamRun, log, bar, log_every: int):
        self.trainer, self.run, self.log, self.bar, self.log_every = (trainer, run, log, bar,
                                                                      log_every)
        self.pending: Optional[_Chunk] = None
        self.clock = dict(start=time.perf_counter(), row=time.perf_counter(), steps=run.steps,
                          events=run.events)
        if trainer._stream_update is None:   # compiled once per trainer, not per run
            trainer._stream_update = jax.jit(functools.partial(_kept_if_finite, trainer))
        self._update = trainer._stream_update

    def send(self, xs, labels, weights, segments, position) -> None:
        """Advance the learner over one chunk and update from it; count the chunk before."""
        trainer = self.trainer
        placed = trainer._parallel.shard((xs, (labels, weights)))
        # event counts, 0/1 weights and class labels are finite by construction
        loss, grads, outputs = trainer.learner.advance(_step_loss, *placed, return_outputs=True,
                                                       check_finite=False)
        self.flush()
        update = None
        if weights.any():
            params, opt_state, ok, finite = self._update(
                trainer._view.grad_mantissas(grads), trainer.opt_state,
                trainer._view.mantissas(), loss)
            trainer._view.assign(params)
            trainer.opt_state = opt_state
            update = (ok, finite)
        self.pending = _Chunk(len(xs), int(np.sum(xs, dtype=np.float64)), labels, weights,
                              segments, position, loss, outputs, update)

    def flush(self) -> None:
        """Read and count the chunk in flight, if any."""
        chunk, self.pending = self.pending, None
        if chunk is None:
            return
        trainer, run = self.trainer, self.run
        scores = placement.to_host(split_output(chunk.outputs)[0])
        loss_sum = float(chunk.loss) * chunk.labels.shape[1]
        run.metrics.add(loss_sum, scores, chunk.labels, chunk.weights, chunk.segments)
        run.chunks, run.steps = run.chunks + 1, run.steps + chunk.steps
        run.events += chunk.events
        run.position = chunk.position
        if chunk.update is not None:
            ok, finite = chunk.update
            if bool(ok):
                trainer.updates += 1
            else:
                trainer._not_applied(finite, chunk.loss, f'chunk {run.chunks}, step '
                                                         f'{run.steps:,} of the stream')
        self.bar.update(chunk.steps)
        if self.log is not None and run.chunks % self.log_every == 0:
            self.log.log(run.chunks, **_row(trainer, run, self.clock))


def _evaluate(trainer, run: StreamRun, eval_stream, args: _Arguments, predictor) -> bool:
    """Evaluate on the held-out stream and record it; whether it is the best so far."""
    test = evaluate_stream(trainer, eval_stream, settle_steps=args.settle_steps,
                           predictor=predictor)
    online = run.metrics.take_period()
    record = dict(step=run.steps, chunk=run.chunks, stream_time_s=run.stream_time_s,
                  **{f'online_{k}': v for k, v in online.items() if k != 'steps'},
                  test_loss=test['loss'], test_step_accuracy=test['step_accuracy'],
                  test_accuracy=test['segment_accuracy'], test_segments=test['segments'])
    run.evaluations.append(record)
    better = record['test_accuracy'] is not None and (
        run.best is None or record['test_accuracy'] > run.best['test_accuracy'])
    if better:
        run.best = dict(step=run.steps, test_accuracy=record['test_accuracy'])
    return better


def _row(trainer, run: StreamRun, clock: dict) -> dict:
    """A row of ``scalars.csv``: the metrics since the previous row, and the rates."""
    now = time.perf_counter()
    before, total = MetricTotals(**run.row), run.metrics.total
    since = MetricTotals(*(getattr(total, f.name) - getattr(before, f.name)
                           for f in dataclasses.fields(MetricTotals))).summary()
    seconds = max(now - clock['row'], 1e-9)
    row = dict(step=run.steps, updates=trainer.updates,
               stream_time_s=round(run.stream_time_s, 6), loss=since['loss'],
               step_accuracy=since['step_accuracy'], segments=since['segments'],
               segment_accuracy=since['segment_accuracy'],
               skipped_updates=trainer.skipped_updates,
               steps_per_s=round((run.steps - clock['steps']) / seconds, 2),
               events_per_s=round((run.events - clock['events']) / seconds, 1),
               time_s=round(now - clock['start'], 3))
    run.row = dataclasses.asdict(total)
    clock.update(row=now, steps=run.steps, events=run.events)
    return row


def _play(trainer, stream, eval_stream, run: StreamRun, args: _Arguments,
          files: Optional[RunFiles], bar, show):
    """Play the stream from its position until it ends or ``max_steps`` are played, counting
    steps on the progress ``bar``; ``show(evaluation record, steps per s, events per s)``
    after each evaluation; with ``files`` (the process writing a run), checkpoints and
    logs are written there. Segments still open when ``max_steps`` stops the run stay
    open (a longer run continues them); those open when the stream ends are decided."""
    log = None if files is None else files.log
    predictor = BPTT(trainer.model, check_finite=trainer.learner.check_finite)
    pipeline = _Pipeline(trainer, run, log, bar, args.log_every)
    since = dict(time=time.perf_counter(), steps=run.steps, events=run.events)

    def evaluate() -> bool:
        best = _evaluate(trainer, run, eval_stream, args, predictor)
        seconds = max(time.perf_counter() - since['time'], 1e-9)
        show(run.evaluations[-1], (run.steps - since['steps']) / seconds,
             (run.events - since['events']) / seconds)
        if log is not None:
            log.log_epoch(run.chunks, run.evaluations[-1])
        since.update(time=time.perf_counter(), steps=run.steps, events=run.events)
        return best

    chunks, steps = run.chunks, run.steps
    evaluated_at = run.evaluations[-1]['chunk'] if run.evaluations else None
    run.ended = True                    # unless max_steps stops the loop
    for xs, (labels, weights) in stream:
        pipeline.send(xs, labels, weights, stream.last_segments, stream.position())
        chunks, steps = chunks + 1, steps + len(xs)
        evaluating = bool(args.eval_every) and chunks % args.eval_every == 0
        saving = files is not None and bool(args.checkpoint_every) and \
            chunks % args.checkpoint_every == 0
        done = args.max_steps is not None and steps >= args.max_steps
        if not (evaluating or saving or done):
            continue
        pipeline.flush()                # the learner is now at this chunk's end
        best = False
        if evaluating:
            best, evaluated_at = evaluate(), run.chunks
        if files is not None and (evaluating or saving):
            _write(trainer, run, files, best)
        if done:
            run.ended = False
            break
    pipeline.flush()
    if run.ended:
        run.metrics.finish()
    best = eval_stream is not None and evaluated_at != run.chunks and evaluate()
    run.finished = True
    if files is not None:
        _write(trainer, run, files, best)


def _write(trainer, run: StreamRun, files: RunFiles, best: bool) -> None:
    """The checkpoint(s), the curve and ``metrics.json``, as :meth:`Trainer.fit` writes
    them (:meth:`RunFiles.save <braintrace_conv.training._fit.RunFiles.save>`)."""
    files.save(snapshot(trainer, run), best, functools.partial(_write_logs, trainer, run))


def _write_logs(trainer, run: StreamRun, out_dir: Path) -> None:
    """``learning_curve.png`` (online and held-out loss and segment accuracy against
    stream time), then ``metrics.json`` (:func:`summary`; last, as
    :meth:`Trainer.write_logs` writes it), holding the run directory's lock."""
    with run_dir.locked(out_dir) as out_dir:
        if run.evaluations:
            title = logs.run_title({**trainer.run_config, **trainer.config(),
                                    'update_every': None}).split('\n')[0] + ', on a stream'
            logs.write_curve(out_dir, run.evaluations, title, x='stream_time_s',
                             panels=(('online_loss', 'test_loss'),
                                     ('online_segment_accuracy', 'test_accuracy')))
        logs.write_metrics(out_dir, summary(trainer, run))


def planned_steps(stream, max_steps: Optional[int]) -> Optional[int]:
    """The steps a run played until ``max_steps`` (``None``: until ``stream`` ends) plays
    of each stream: ``None`` for an endless stream and no ``max_steps``."""
    if max_steps is None or stream.num_steps is None:
        return stream.num_steps if max_steps is None else max_steps
    return min(stream.num_steps, max_steps)


def _line(record: dict, steps_per_s: float, events_per_s: float) -> str:
    """The line printed after an evaluation."""
    percent = lambda v: '-' if v is None else f'{v:.1%}'
    return (f"step {record['step']:,} ({record['stream_time_s']:.1f} s of stream): online "
            f"segment acc {percent(record['online_segment_accuracy'])} "
            f"({record['online_segments']} segments), step acc "
            f"{percent(record['online_step_accuracy'])} | held-out segment acc "
            f"{percent(record['test_accuracy'])} ({record['test_segments']} segments), step "
            f"acc {percent(record['test_step_accuracy'])} | {steps_per_s:,.0f} steps/s, "
            f"{events_per_s / 1e6:.2f} M events/s")


def summary(trainer, run: StreamRun) -> dict:
    """The content of ``metrics.json`` of a stream run: the trainer's settings, the run
    options, the counts (``chunks``, ``steps`` per stream, ``events``, ``updates``,
    ``skipped_updates``, ``stream_time_s``), ``online`` (the metrics since the start:
    :meth:`~.stream_metrics.MetricTotals.summary`), ``test`` (the last evaluation),
    ``best``, ``evaluations`` and ``finished``."""
    return dict(trainer.config(), devices=len(trainer.devices), run_config=trainer.run_config,
                chunks=run.chunks, steps=run.steps, events=run.events,
                updates=trainer.updates, skipped_updates=trainer.skipped_updates,
                stream_time_s=run.stream_time_s, online=run.metrics.total.summary(),
                test=run.evaluations[-1] if run.evaluations else None, best=run.best,
                evaluations=run.evaluations, finished=run.finished)


def fit_stream(trainer, stream, *, eval_stream=None, eval_every: Optional[int] = None,
               max_steps: Optional[int] = None, settle_steps: int = 0,
               out_dir: Union[str, os.PathLike, None] = None, resume: bool = False,
               overwrite: bool = False, run_config: Optional[dict] = None,
               checkpoint_every: Optional[int] = None, log_every: int = 10,
               tensorboard: Optional[bool] = None, progress: bool = True) -> dict:
    """:meth:`Trainer.fit_stream <braintrace_conv.training.Trainer.fit_stream>`."""
    args = check_arguments(trainer, stream, eval_stream, max_steps=max_steps,
                           eval_every=eval_every, checkpoint_every=checkpoint_every,
                           log_every=log_every, settle_steps=settle_steps, out_dir=out_dir,
                           resume=resume, overwrite=overwrite, run_config=run_config)
    fit_config = dict(eval_stream=stream_config(eval_stream), eval_every=args.eval_every,
                      settle_steps=args.settle_steps)
    with contextlib.ExitStack() as stack:
        run, files = None, None
        if out_dir is not None:
            out_dir = stack.enter_context(hold(out_dir, resume=resume, overwrite=overwrite,
                                               writer=trainer._writer))
            if resume:
                run = restore(trainer, out_dir / run_dir.LAST_CHECKPOINT,
                              dict(trainer=trainer.config(), run=args.run_config,
                                   fit=fit_config), stream, eval_stream, args.max_steps)
                if trainer._writer:
                    _repair_run(out_dir, lagging(out_dir, run),
                                functools.partial(_write_logs, trainer, run))
                run.finished = not run.more_to_play(args.max_steps)
        if run is None:
            stream.seek(None)
            trainer.learner.reset(stream.batch_size)
            run = StreamRun(None, StreamMetrics(stream.batch_size, trainer._num_outputs(
                stream.frame_shape, np.float32, 'stream'), args.settle_steps), stream.dt_us)
        trainer.run_config, trainer._fit_config = args.run_config, fit_config
        if out_dir is not None and trainer._writer:
            files = RunFiles(out_dir, resume=resume)
            stack.callback(files.close)
            files.open_log(start_update=run.chunks, tensorboard=tensorboard,
                           columns=STREAM_COLUMNS)
        if not run.finished:
            total = planned_steps(stream, args.max_steps)
            shown = progress and trainer._writer
            with tqdm(total=total, initial=run.steps, unit='step', unit_scale=True,
                      disable=not (shown and _bar_shown()), leave=False) as bar:
                show = lambda *a: shown and bar.write(_line(*a))
                _play(trainer, stream, eval_stream, run, args, files, bar, show)
    return summary(trainer, run)
