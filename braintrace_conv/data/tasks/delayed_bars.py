"""A memory task: moving-bars clips, each followed by blank frames; the direction of
the last clip is asked for at the end.

A trial is ``stimulus_steps`` frames of :func:`moving_bars` (a bar moving in one of
8 directions, drawn bright or dark with probability 1/2, so that only the temporal
order of the frames gives the direction) followed by ``delay_steps`` all-zero frames.
A sample holds ``cues`` trials, and its label is the direction of the last one: the
earlier clips are distractors that a network must forget. With the neurons of
``braintrace-conv train --task delayed-bars`` (``tau = 5`` ms, ``dt = 1`` ms) the
default delay of 24 steps lets a membrane potential decay by ``exp(-4.8)``, about
1/120: what the last clip left in the neurons' own state is nearly gone at the end,
and the label has to be carried across the delay by recurrent synapses -- paths that
the online executors without a window cut, and that a window of a trial's length
(``window=stimulus_steps + delay_steps``) keeps exact for the labelled trial.

The clips show bars only (:func:`moving_bars` also draws dot clusters): with the few
steps of a short clip, dot clusters make the stimulus itself hard to classify, which
would mix the difficulty of seeing the direction into that of holding it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._validation import integer
from ..datasets.dataset import EventDataset
from .moving_bars import moving_bars

__all__ = ["delayed_bars"]


def delayed_bars(
    n_samples: int,
    *,
    stimulus_steps: int = 8,
    delay_steps: int = 24,
    cues: int = 1,
    size: tuple[int, int] = (8, 8),
    objects: Sequence[str] = ("bar",),
    seed: int = 0,
    **bars,
) -> EventDataset:
    """Moving bars shown for ``stimulus_steps`` steps, then ``delay_steps`` blank steps,
    ``cues`` times over; the label is the direction of the last bar.

    A trial is ``S = stimulus_steps + delay_steps`` steps: a :func:`moving_bars`
    clip of ``stimulus_steps`` steps, then all-zero frames (no events). Samples
    hold ``cues`` trials, ``T = cues * S`` steps. The label is the direction of
    the last trial's clip, so a classifier read out at the end (e.g.
    ``Trainer(..., loss='final')``) must hold it for ``delay_steps`` time steps
    of ``dt`` each (1 ms with the library's defaults), and with ``cues > 1``
    must also replace what it held of the earlier clips, whose directions are
    drawn independently (distractors). The last clips are those of
    ``moving_bars(n_samples, T=stimulus_steps, seed=seed, ...)``. The defaults
    are those of ``braintrace-conv train --task delayed-bars``.

    Args:
        n_samples: Number of samples ``N``; directions are balanced.
        stimulus_steps: Time steps of the moving-bars clip, at least 2 (a
            single frame is equally consistent with opposite directions).
        delay_steps: Blank time steps after each clip, positive.
        cues: Trials per sample, positive; all but the last are distractors.
        size: Sensor height ``H`` and width ``W``, pixels.
        objects: Object kinds of the clip, ``"bar"`` and/or ``"dots"`` (module
            docstring).
        seed: Seed; equal arguments give identical datasets.
        **bars: Further keyword arguments of :func:`moving_bars` (``speed``,
            ``threshold``, ``bar_length``, ...), applied to the clip.

    Returns:
        EventDataset: ``events`` float32 ``(N, cues * S, 2, H, W)`` (event counts,
        channel 0 ON, 1 OFF), ``labels`` int32 ``(N,)`` with the direction
        ``0..7`` (``k * 45`` degrees counter-clockwise from "right"),
        ``num_classes=8``, ``name='delayed_bars'``.
    """
    stimulus_steps = integer("stimulus_steps", stimulus_steps, sign="positive")
    if stimulus_steps < 2:
        raise ValueError(
            "stimulus_steps must be at least 2 (a single frame is equally consistent "
            f"with opposite directions), got {stimulus_steps}"
        )
    delay_steps = integer("delay_steps", delay_steps, sign="positive")
    cues = integer("cues", cues, sign="positive")
    clip = moving_bars(n_samples, T=stimulus_steps, size=size, objects=objects, seed=seed,
                       **bars)
    blank = np.zeros((n_samples, delay_steps, *clip.frame_shape), dtype=np.float32)
    trials = [clip.events, blank]
    if cues > 1:
        distractor_seed = int(np.random.default_rng(seed).integers(2**63))
        distractors = moving_bars(n_samples * (cues - 1), T=stimulus_steps, size=size,
                                  objects=objects, seed=distractor_seed, **bars).events
        distractors = distractors.reshape(cues - 1, n_samples, *distractors.shape[1:])
        trials = [part for events in distractors for part in (events, blank)] + trials
    return EventDataset(
        events=np.concatenate(trials, axis=1),
        labels=clip.labels,
        num_classes=clip.num_classes,
        name="delayed_bars",
        class_names=clip.class_names,
    )
