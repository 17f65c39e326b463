r"""Online metrics of a stream, read per step and per labelled segment, as it plays.

A stream (:class:`~braintrace_conv.data.EventStream`) gives every step of every one of its
``B`` parallel streams a label, a weight (1 inside a labelled segment, 0 outside) and the
number of the segment it lies in (``-1`` outside). From the class scores ``s_{t,b}`` of
each step, :class:`StreamMetrics` keeps

* the **loss** per labelled step, :math:`\sum_{t,b} w_{t,b}\,\mathrm{CE}(s_{t,b},
  y_{t,b}) / \sum_{t,b} w_{t,b}`;
* the **step accuracy**: the fraction of labelled steps whose scores' argmax is the
  label;
* the **segment accuracy**: each segment is decided by the majority of the per-step
  predictions over its steps, leaving out its first ``settle_steps`` (the network has
  seen too little of the segment there; ties go to the lower class), and is right when
  that majority is its label. A segment no longer than ``settle_steps`` is not decided (it
  is counted in ``undecided``). A segment is decided when its stream leaves it (or
  when :meth:`StreamMetrics.finish` ends the stream).

Nothing grows with the steps seen: per stream, the vote counts of the segment it is in;
otherwise sums and counts. :meth:`StreamMetrics.state` is JSON-able data from which
:meth:`StreamMetrics.from_state` continues exactly (a checkpoint holds it). Totals are
kept since the start and since the last :meth:`StreamMetrics.take_period` (a period of
the run, e.g. between evaluations).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .._validation import non_negative, positive

__all__ = ['StreamMetrics', 'MetricTotals']


@dataclasses.dataclass
class MetricTotals:
    """Sums and counts over some steps of a stream (:class:`StreamMetrics`)."""

    loss_sum: float = 0.0       # sum over labelled steps of w * CE
    labelled: float = 0.0       # sum of the weights w
    correct_steps: int = 0      # labelled steps predicted right
    segments: int = 0           # segments decided
    correct_segments: int = 0   # ... and right
    undecided: int = 0          # segments no longer than settle_steps
    steps: int = 0              # steps of the B streams (labelled or not)

    def summary(self) -> dict:
        """``loss``, ``step_accuracy``, ``segment_accuracy`` (``None`` where nothing was
        labelled or decided), ``segments``, ``undecided``, ``labelled_steps``, ``steps``."""
        ratio = lambda a, b: a / b if b else None
        return dict(loss=ratio(self.loss_sum, self.labelled),
                    step_accuracy=ratio(self.correct_steps, self.labelled),
                    segment_accuracy=ratio(self.correct_segments, self.segments),
                    segments=self.segments, undecided=self.undecided,
                    labelled_steps=int(self.labelled), steps=self.steps)


@dataclasses.dataclass
class _Open:
    """The segment a stream is in: its number, label, steps seen and vote counts."""

    segment: int
    label: int
    seen: int
    votes: list


class StreamMetrics:
    """Loss, step accuracy and segment accuracy of ``B`` parallel streams (module docstring).

    Args:
      batch_size: Number of parallel streams ``B``.
      num_classes: Number of classes ``K`` (the last axis of the scores).
      settle_steps: Steps at the start of every segment whose predictions do not vote.
    """

    def __init__(self, batch_size: int, num_classes: int, settle_steps: int = 0):
        self.batch_size = positive('batch_size', batch_size)
        self.num_classes = positive('num_classes', num_classes)
        self.settle_steps = non_negative('settle_steps', settle_steps)
        self.total, self.period = MetricTotals(), MetricTotals()
        self._open: list = [None] * self.batch_size

    def add(self, loss_sum: float, scores, labels, weights, segments) -> None:
        """Count one chunk of ``T`` steps.

        Args:
          loss_sum: The chunk's weighted cross-entropy summed over its steps and streams,
            ``sum_{t,b} w_{t,b} CE(s_{t,b}, y_{t,b})``.
          scores: ``(T, B, K)`` class scores (only their argmax is used).
          labels, weights, segments: ``(T, B)`` as the stream gives them (labels, weights
            of 0 or 1, segment numbers with ``-1`` outside every segment).
        """
        predictions = np.argmax(np.asarray(scores), axis=-1)
        weights = np.asarray(weights)
        labels, segments = np.asarray(labels), np.asarray(segments)
        right = (predictions == labels) & (weights > 0)
        for totals in (self.total, self.period):
            totals.loss_sum += float(loss_sum)
            totals.labelled += float(np.sum(weights, dtype=np.float64))
            totals.correct_steps += int(np.sum(right))
            totals.steps += int(labels.size)
        for b in range(self.batch_size):
            self._add_stream(b, predictions[:, b], labels[:, b], segments[:, b])

    def _add_stream(self, b: int, predictions, labels, segments) -> None:
        """The runs of equal segment number of stream ``b`` in a chunk, counted in order."""
        edges = np.flatnonzero(np.diff(segments)) + 1
        for start, stop in zip(np.r_[0, edges], np.r_[edges, len(segments)]):
            segment = int(segments[start])
            current = self._open[b]
            if current is not None and current.segment != segment:
                self._decide(current)
                current = self._open[b] = None
            if segment < 0:
                continue
            if current is None:
                current = self._open[b] = _Open(segment, int(labels[start]), 0,
                                                [0] * self.num_classes)
            first = max(self.settle_steps - current.seen, 0)      # steps still settling
            counts = np.bincount(predictions[start + first:stop], minlength=self.num_classes)
            current.votes = [v + int(c) for v, c in zip(current.votes, counts)]
            current.seen += int(stop - start)

    def _decide(self, segment: _Open) -> None:
        decided = any(segment.votes)
        right = decided and int(np.argmax(segment.votes)) == segment.label
        for totals in (self.total, self.period):
            totals.segments += decided
            totals.correct_segments += right
            totals.undecided += not decided

    def finish(self) -> None:
        """Decide the segments the streams are still in (the stream has ended)."""
        for b, segment in enumerate(self._open):
            if segment is not None:
                self._decide(segment)
                self._open[b] = None

    def take_period(self) -> dict:
        """The summary of the steps since the last call (:meth:`MetricTotals.summary`),
        starting a new period."""
        summary, self.period = self.period.summary(), MetricTotals()
        return summary

    def state(self) -> dict:
        """JSON-able state for :meth:`from_state` (totals, period, open segments)."""
        return dict(batch_size=self.batch_size, num_classes=self.num_classes,
                    settle_steps=self.settle_steps, total=dataclasses.asdict(self.total),
                    period=dataclasses.asdict(self.period),
                    open=[None if s is None else dataclasses.asdict(s) for s in self._open])

    @classmethod
    def from_state(cls, state: dict) -> 'StreamMetrics':
        """The metrics :meth:`state` saved, continuing exactly.

        Raises:
          ValueError: ``state`` is not what :meth:`state` returns.
        """
        try:
            metrics = cls(state['batch_size'], state['num_classes'], state['settle_steps'])
            metrics.total = MetricTotals(**state['total'])
            metrics.period = MetricTotals(**state['period'])
            opened = [None if s is None else _Open(**s) for s in state['open']]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f'state must be the saved stream metrics that '
                             f'StreamMetrics.state returns; {err}') from None
        if len(opened) != metrics.batch_size or any(
                s is not None and len(s.votes) != metrics.num_classes for s in opened):
            raise ValueError(f'state must hold one open segment per stream, with one vote per '
                             f'class ({metrics.batch_size} streams, {metrics.num_classes} '
                             f'classes), got {len(opened)} segments.')
        metrics._open = opened
        return metrics
