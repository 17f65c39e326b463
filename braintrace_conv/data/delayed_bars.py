"""A memory task: a moving-bars clip, then blank frames, classified at the end.

Each sample starts with ``stimulus_steps`` frames of :func:`moving_bars` (a
bar moving in one of 8 directions, drawn bright or dark with probability 1/2,
so that only the temporal order of the frames gives the direction) followed
by ``delay_steps`` all-zero frames. The label, the direction, is asked for
after the delay. With the library's LIF neurons and leaky readout (``tau =
10`` ms, ``dt = 1`` ms) a delay of 48 steps lets a membrane potential decay by
``exp(-4.8)``, about 1/120: what the stimulus left in the neurons' own state
is nearly gone by then, and the label has to be carried across the delay by
recurrent synapses -- the paths that online executors without a window cut.

The clip shows bars only (:func:`moving_bars` also draws dot clusters): with
the few steps of a short clip, dot clusters make the stimulus itself hard to
classify, which would mix the difficulty of seeing the direction into that of
holding it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._validation import integer
from .dataset import EventDataset
from .moving_bars import moving_bars

__all__ = ["delayed_bars"]


def delayed_bars(
    n_samples: int,
    *,
    stimulus_steps: int = 8,
    delay_steps: int = 48,
    size: tuple[int, int] = (8, 8),
    objects: Sequence[str] = ("bar",),
    seed: int = 0,
    **bars,
) -> EventDataset:
    """Moving bars shown for ``stimulus_steps`` steps, then ``delay_steps`` blank steps.

    Samples have ``T = stimulus_steps + delay_steps`` time steps. Steps
    ``0 .. stimulus_steps - 1`` hold the events of a :func:`moving_bars`
    clip of ``stimulus_steps`` steps (same scenes, same seed); steps
    ``stimulus_steps .. T - 1`` are all zero (no events). The label is the
    direction of motion during the clip, so a classifier read out at the end
    (e.g. ``Trainer(..., loss='final')``) must hold it for ``delay_steps``
    time steps of ``dt`` each (1 ms with the library's defaults). The
    defaults are those of ``braintrace-conv train --task delayed-bars``.

    Args:
        n_samples: Number of samples ``N``; directions are balanced.
        stimulus_steps: Time steps of the moving-bars clip, at least 2 (a
            single frame is equally consistent with opposite directions).
        delay_steps: Blank time steps after the clip, positive.
        size: Sensor height ``H`` and width ``W``, pixels.
        objects: Object kinds of the clip, ``"bar"`` and/or ``"dots"`` (module
            docstring).
        seed: Seed; equal arguments give identical datasets.
        **bars: Further keyword arguments of :func:`moving_bars` (``speed``,
            ``threshold``, ``bar_length``, ...), applied to the clip.

    Returns:
        EventDataset: ``events`` float32 ``(N, T, 2, H, W)`` (event counts,
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
    clip = moving_bars(n_samples, T=stimulus_steps, size=size, objects=objects, seed=seed,
                       **bars)
    blank = np.zeros((len(clip), delay_steps, *clip.frame_shape), dtype=np.float32)
    return EventDataset(
        events=np.concatenate([clip.events, blank], axis=1),
        labels=clip.labels,
        num_classes=clip.num_classes,
        name="delayed_bars",
        class_names=clip.class_names,
    )
