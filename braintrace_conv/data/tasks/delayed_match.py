"""Delayed match-to-sample: is the test stimulus the one shown before the delay?

The task of Miller, Erickson & Desimone, "Neural mechanisms of visual working memory in
prefrontal cortex of the macaque", J. Neurosci. 16(16), 5154 (1996), with the trial timing
NeuroGym uses for it (``DelayMatchSample-v0``; Molano-Mazón et al. 2022): fixation 300 ms,
sample 500 ms, delay 1000 ms, test 500 ms, decision 900 ms, two sample stimuli. At ``dt =
1`` ms a trial is 3,200 steps, and the sample must be held for the 1,000 steps of the
delay: the answer is a function of both stimuli (with two stimuli, their exclusive or), so
nothing read from the test alone beats chance.

Spiking input, in the style of :func:`~braintrace_conv.data.cue_accumulation`: Poisson
channels in groups of ``C``: a fixation group firing until the decision period begins
(its silence is the go signal), one group per stimulus firing during the sample and test
periods, and a noise group firing throughout.
"""

from __future__ import annotations

import numpy as np

from ..._validation import integer, number
from ..datasets.dataset import EventDataset

__all__ = ["delayed_match_to_sample"]


def delayed_match_to_sample(
    n_samples: int,
    *,
    n_stimuli: int = 2,
    fixation_steps: int = 300,
    sample_steps: int = 500,
    delay_steps: int = 1000,
    test_steps: int = 500,
    decision_steps: int = 900,
    channels_per_group: int = 10,
    rate_hz: float = 40.0,
    noise_hz: float = 10.0,
    dt_ms: float = 1.0,
    seed: int = 0,
) -> EventDataset:
    """Delayed match-to-sample trials as Poisson spike trains (module docstring); the
    defaults are the published timing.

    A trial runs through fixation, sample, delay, test and decision periods of the given
    numbers of steps. The sample is one of ``n_stimuli`` stimuli (uniform); on match trials
    the test is the same stimulus, on non-match trials one of the others (uniform). A
    channel spikes in a step with probability ``rate * dt``: the fixation group at
    ``rate_hz`` until the decision period, the group of the shown stimulus at ``rate_hz``
    during the sample and test periods, the noise group at ``noise_hz`` always. Read the
    answer out during the decision period: ``Trainer(..., loss='final',
    final_steps=decision_steps)``.

    Args:
      n_samples: Number of trials ``N``; half are match trials, in a random order.
      n_stimuli: Number of distinct stimuli, at least 2.
      fixation_steps, sample_steps, delay_steps, test_steps, decision_steps: Lengths of
        the periods, steps.
      channels_per_group: Channels ``C`` per group.
      rate_hz, noise_hz: Rates of the fixation and stimulus groups, and of the noise group.
      dt_ms: Step length, milliseconds.
      seed: Seed; equal arguments give identical datasets.

    Returns:
      EventDataset: ``events`` float32 spikes (0 or 1) of shape ``(N, T, 1, (n_stimuli +
      2) C)``, ``T`` the sum of the periods (3200 by default); channels ``[0, C)``
      fixation, ``[(1 + s) C, (2 + s) C)`` stimulus ``s``, the last ``C`` noise;
      ``labels`` int32 ``(N,)``: 1 for a match, 0 for a non-match;
      ``class_names=('non-match', 'match')``, ``name='delayed_match_to_sample'``.
    """
    n_samples = integer("n_samples", n_samples, sign="positive")
    n_stimuli = integer("n_stimuli", n_stimuli, sign="positive")
    if n_stimuli < 2:
        raise ValueError(f"n_stimuli must be at least 2 (a non-match needs another "
                         f"stimulus), got {n_stimuli}")
    periods = [integer(name, value, sign="positive") for name, value in (
        ("fixation_steps", fixation_steps), ("sample_steps", sample_steps),
        ("delay_steps", delay_steps), ("test_steps", test_steps),
        ("decision_steps", decision_steps))]
    channels = integer("channels_per_group", channels_per_group, sign="positive")
    dt_s = number("dt_ms", dt_ms, sign="positive") / 1000
    signal_p = number("rate_hz", rate_hz, sign="non-negative") * dt_s
    noise_p = number("noise_hz", noise_hz, sign="non-negative") * dt_s
    if max(signal_p, noise_p) > 1:
        raise ValueError(f"rates times dt must be at most 1 (a spike per step), got "
                         f"{signal_p} and {noise_p}")
    rng = np.random.default_rng(seed)
    match = rng.permutation(np.arange(n_samples) % 2).astype(np.int32)
    sample = rng.integers(n_stimuli, size=n_samples)
    other = (sample + rng.integers(1, n_stimuli, size=n_samples)) % n_stimuli
    test = np.where(match == 1, sample, other)
    edges = np.cumsum([0] + periods)        # fixation, sample, delay, test, decision
    probability = np.zeros((n_samples, edges[-1], n_stimuli + 2), np.float32)
    probability[:, :edges[4], 0] = signal_p
    rows = np.arange(n_samples)
    probability[rows, edges[1]:edges[2], 1 + sample] = signal_p
    probability[rows, edges[3]:edges[4], 1 + test] = signal_p
    probability[:, :, -1] = noise_p
    probability = np.repeat(probability, channels, axis=2)
    spikes = rng.random(probability.shape, dtype=np.float32) < probability
    return EventDataset(events=spikes[:, :, None, :].astype(np.float32), labels=match,
                        num_classes=2, name="delayed_match_to_sample",
                        class_names=("non-match", "match"))
