"""The cue-accumulation (evidence-accumulation) task of e-prop, a long-memory benchmark.

Bellec et al., "A solution to the learning dilemma for recurrent networks of spiking
neurons", Nature Communications 11, 3625 (2020), Fig. 3 (after Morcos & Harvey 2016): an
agent runs along a virtual corridor, sees cues on its left and right, and after a delay
must turn to the side that showed more cues. The published input, at ``dt = 1`` ms:

* 40 Poisson input channels in four groups of 10: left cues, right cues, the recall cue
  and background noise;
* 7 cues, one every 150 ms: 50 ms of silence then 100 ms in which the cue's group fires at
  40 Hz; each cue is on the trial's majority side with probability 0.7;
* a delay of 1050 ms after the last cue, then the recall cue: its group fires at 40 Hz for
  the last 150 ms; the noise group fires at 10 Hz throughout;
* 2250 steps in all; the network is read out, and the loss taken, during the recall
  period: the class with the larger mean output over its 150 steps is the answer, which
  is ``Trainer(..., loss='final', final_steps=150)``.

The label is the side with more cues (7 is odd: no ties). The first cue comes 2,200 steps
before the answer, so gradients must travel back about 2,000 steps.
"""

from __future__ import annotations

import numpy as np

from ..._validation import integer, number
from ..datasets.dataset import EventDataset

__all__ = ["cue_accumulation"]

_GROUPS = 4   # left, right, recall, noise


def cue_accumulation(
    n_samples: int,
    *,
    n_cues: int = 7,
    silence_steps: int = 50,
    cue_steps: int = 100,
    delay_steps: int = 1050,
    recall_steps: int = 150,
    channels_per_group: int = 10,
    rate_hz: float = 40.0,
    noise_hz: float = 10.0,
    majority_probability: float = 0.7,
    dt_ms: float = 1.0,
    seed: int = 0,
) -> EventDataset:
    """Cue-accumulation trials as Poisson spike trains (module docstring); the defaults are
    the published ones.

    A trial is ``n_cues`` cue periods of ``silence_steps + cue_steps`` steps (cue ``k``'s
    group, left or right, fires at ``rate_hz`` in steps ``k (s + c) + s`` to ``(k + 1)
    (s + c) - 1``), then ``delay_steps`` steps, then ``recall_steps`` steps in which the
    recall group fires at ``rate_hz``; the noise group fires at ``noise_hz`` in every step.
    A channel spikes in a step with probability ``rate * dt``.

    Args:
      n_samples: Number of trials ``N``. Half the trials (in a random order) favour each
        side; the label is the side that did get more cues (the favoured one in about
        87 % of trials with the defaults).
      n_cues: Cues per trial, odd.
      silence_steps, cue_steps: The silence before each cue, and the cue, in steps.
      delay_steps: Steps between the end of the last cue and the recall cue.
      recall_steps: Steps of the recall cue, the read-out period.
      channels_per_group: Channels ``C`` of each of the four groups.
      rate_hz, noise_hz: Firing rates of the cue and recall groups, and of the noise group.
      majority_probability: Probability that a cue is on the trial's majority side.
      dt_ms: Step length, milliseconds.
      seed: Seed; equal arguments give identical datasets.

    Returns:
      EventDataset: ``events`` float32 spikes (0 or 1) of shape ``(N, T, 1, 4 C)``, ``T =
      n_cues (silence_steps + cue_steps) + delay_steps + recall_steps`` (2250 by default),
      channels ``[0, C)`` left cues, ``[C, 2C)`` right cues, ``[2C, 3C)`` recall,
      ``[3C, 4C)`` noise; ``labels`` int32 ``(N,)``, 0 for more cues on the left, 1 on the
      right; ``class_names=('left', 'right')``, ``name='cue_accumulation'``.
    """
    n_samples = integer("n_samples", n_samples, sign="positive")
    n_cues = integer("n_cues", n_cues, sign="positive")
    if n_cues % 2 == 0:
        raise ValueError(f"n_cues must be odd so that one side always has more cues, "
                         f"got {n_cues}")
    silence, cue = (integer(n, v, sign="non-negative") for n, v in
                    (("silence_steps", silence_steps), ("cue_steps", cue_steps)))
    if cue == 0:
        raise ValueError("cue_steps must be positive, got 0")
    delay = integer("delay_steps", delay_steps, sign="non-negative")
    recall = integer("recall_steps", recall_steps, sign="positive")
    channels = integer("channels_per_group", channels_per_group, sign="positive")
    dt_s = number("dt_ms", dt_ms, sign="positive") / 1000
    cue_p = number("rate_hz", rate_hz, sign="non-negative") * dt_s
    noise_p = number("noise_hz", noise_hz, sign="non-negative") * dt_s
    majority = number("majority_probability", majority_probability)
    if not 0.5 < majority <= 1 or max(cue_p, noise_p) > 1:
        raise ValueError(f"majority_probability must lie in (0.5, 1] and rates times dt at "
                         f"most 1, got {majority}, {cue_p}, {noise_p}")
    rng = np.random.default_rng(seed)
    majority_side = rng.permutation(np.arange(n_samples) % 2)
    sides = np.where(rng.random((n_samples, n_cues)) < majority, majority_side[:, None],
                     1 - majority_side[:, None])
    period = silence + cue
    steps = n_cues * period + delay + recall
    probability = np.zeros((n_samples, steps, _GROUPS), np.float32)
    for k in range(n_cues):
        window = slice(k * period + silence, (k + 1) * period)
        probability[np.arange(n_samples), window, sides[:, k]] = cue_p
    probability[:, steps - recall:, 2] = cue_p
    probability[:, :, 3] = noise_p
    probability = np.repeat(probability, channels, axis=2)
    spikes = rng.random(probability.shape, dtype=np.float32) < probability
    labels = (sides.sum(axis=1) > n_cues // 2).astype(np.int32)
    return EventDataset(events=spikes[:, :, None, :].astype(np.float32), labels=labels,
                        num_classes=2, name="cue_accumulation", class_names=("left", "right"))
