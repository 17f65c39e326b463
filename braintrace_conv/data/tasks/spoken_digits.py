"""Synthetic spoken-digit spike trains over a cochlea-like channel axis (SHD-like).

The Spiking Heidelberg Digits (SHD) are spoken digits turned into spikes of
700 cochlear channels ordered by frequency. This generator draws data of
the same form without any download: each class is a fixed "word", a
sequence of two or three syllables, each made of three formant bands whose
centre sweeps linearly across channels (low, middle and high frequency
regions). A sample of class ``k`` speaks word ``k``:

* at a random speed (the word's duration is scaled by a factor drawn from
  ``speed``) starting at a random onset,
* with its whole spectrum shifted by a random number of channels (a
  different voice), and every formant moved by its own small random offset,
* as Poisson spikes: a band at centre ``c(t)`` fires on channel ``x`` at
  ``band_rate_hz * a * exp(-(x - c(t))^2 / (2 band_width^2))`` (``a`` the
  formant's strength, in [0.5, 1]), on top of Poisson background spikes at
  ``background_hz`` on every channel.

Neither the onset nor the absolute channel identifies the class: a model
has to recognise the shapes of the sweeps and their order in time, which a
1-D convolution over channels followed by recurrent spiking dynamics can.
Events come in tonic's SHD format: fields ``t`` (int64 microseconds), ``x``
(int64 channel) and ``p`` (int64, always 1), ``sensor_size = (C, 1, 1)``.
"""

from __future__ import annotations

import numpy as np

from ..._validation import integer, number, positive_range
from ..datasets.dataset import EventDataset
from ..binning import events_to_frames

__all__ = ["EVENT_DTYPE", "synthetic_shd"]

#: Event dtype of tonic's SHD data set: time (us), channel, polarity.
EVENT_DTYPE = np.dtype([("t", np.int64), ("x", np.int64), ("p", np.int64)])

# Formant regions as fractions of the channel axis (low, middle, high).
_FORMANT_REGIONS = ((0.05, 0.35), (0.30, 0.65), (0.60, 0.95))
# Largest formant sweep within a syllable, fraction of the channel axis.
_MAX_SWEEP = 0.15
# Nominal word length as a fraction of the recording, before the speed factor.
_WORD_FRACTION = 0.6


def _word_templates(num_classes: int, seed: int) -> list[np.ndarray]:
    """One word per class: rows ``(start, stop, c0, c1, strength)`` per formant.

    ``start``/``stop`` are fractions of the word's duration, ``c0``/``c1``
    the band centre at those times as fractions of the channel axis.
    """
    rng = np.random.default_rng(seed)
    words = []
    for _ in range(num_classes):
        n_syllables = rng.integers(2, 4)
        cuts = np.sort(rng.uniform(0.15, 0.85, n_syllables - 1))
        bounds = np.concatenate([[0.0], cuts, [1.0]])
        rows = []
        for start, stop in zip(bounds[:-1], bounds[1:]):
            gap = 0.1 * (stop - start)  # a short pause between syllables
            for low, high in _FORMANT_REGIONS:
                c0 = rng.uniform(low, high)
                c1 = np.clip(c0 + rng.uniform(-_MAX_SWEEP, _MAX_SWEEP), low, high)
                rows.append((start + gap, stop - gap, c0, c1, rng.uniform(0.5, 1.0)))
        words.append(np.array(rows))
    return words


def synthetic_shd(
    n_samples: int,
    *,
    num_classes: int = 10,
    n_channels: int = 700,
    T: int = 100,
    duration_ms: float = 1000.0,
    speed: tuple[float, float] = (0.8, 1.25),
    channel_shift: int = 40,
    formant_jitter: float = 8.0,
    band_width: float = 6.0,
    band_rate_hz: float = 60.0,
    background_hz: float = 2.0,
    template_seed: int = 0,
    seed: int = 0,
) -> tuple[EventDataset, list[np.ndarray]]:
    """Draw an SHD-like data set of spoken-word spike trains (see the module docstring).

    Args:
      n_samples: Number of samples ``N``; classes are balanced (each appears
        ``N // num_classes`` or one more times) and shuffled.
      num_classes: Number of words (classes).
      n_channels: Number of channels ``C`` (SHD: 700).
      T: Time steps of the frames; each bins ``duration_ms / T`` ms.
      duration_ms: Recording length, ms; every event lies in ``[0, duration_ms)``.
      speed: Range of the factor scaling a word's duration (nominally 60 % of
        the recording, so the upper bound must stay below 1 / 0.6).
      channel_shift: A sample's spectrum is shifted by an integer number of channels
        drawn uniformly from ``[-channel_shift, channel_shift]``.
      formant_jitter: Standard deviation of each formant's extra offset, channels.
      band_width: Standard deviation of a band's spread across channels.
      band_rate_hz: Peak firing rate of a band's centre channel, Hz.
      background_hz: Background firing rate of every channel, Hz.
      template_seed: Seed of the class words; keep it fixed to draw train and test sets
        of the same classes from different ``seed`` values.
      seed: Seed of the samples.

    Returns:
      ``(dataset, events)``: ``dataset`` an :class:`EventDataset` with ``events``
      float32 ``(N, T, 1, C)`` spike counts per bin (bins ``[k d, (k + 1) d)``
      with ``d = duration_ms / T``), ``labels`` int32 ``(N,)``, ``num_classes``
      classes; ``events`` a list of the ``N`` recordings, structured arrays of
      :data:`EVENT_DTYPE` sorted by time; ``events_to_frames(events[i],
      sensor_size=(C, 1, 1), time_window_us=1000 * duration_ms / T,
      n_time_bins=T, t_start_us=0)`` gives ``dataset.events[i]``.
    """
    n_samples = integer("n_samples", n_samples, sign="positive")
    num_classes = integer("num_classes", num_classes, sign="positive")
    n_channels = integer("n_channels", n_channels, sign="positive")
    T = integer("T", T, sign="positive")
    duration_us = 1000.0 * number("duration_ms", duration_ms, sign="positive")
    speed = positive_range("speed", speed)
    if speed[1] * _WORD_FRACTION >= 1.0:
        raise ValueError(
            f"speed must stay below {1 / _WORD_FRACTION:.3f} so that a word fits in the "
            f"recording, got {speed!r}"
        )
    channel_shift = integer("channel_shift", channel_shift, sign="non-negative")
    formant_jitter = number("formant_jitter", formant_jitter, sign="non-negative")
    band_width = number("band_width", band_width, sign="positive")
    band_rate_hz = number("band_rate_hz", band_rate_hz, sign="non-negative")
    background_hz = number("background_hz", background_hz, sign="non-negative")

    words = _word_templates(num_classes, template_seed)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n_samples) % num_classes)
    # Expected spikes of a band per microsecond, summed over its channels.
    band_per_us = band_rate_hz * np.sqrt(2 * np.pi) * band_width * 1e-6
    recordings = []
    for label in labels:
        word = words[label]
        length = _WORD_FRACTION * duration_us * rng.uniform(*speed)
        onset = rng.uniform(0.0, duration_us - length)
        shift = rng.integers(-channel_shift, channel_shift + 1)
        start, stop = onset + word[:, 0] * length, onset + word[:, 1] * length
        centre0 = word[:, 2] * n_channels + shift + formant_jitter * rng.standard_normal(
            len(word)
        )
        centre1 = centre0 + (word[:, 3] - word[:, 2]) * n_channels
        counts = rng.poisson(band_per_us * word[:, 4] * (stop - start))
        band = np.repeat(np.arange(len(word)), counts)
        phase = rng.uniform(size=len(band))
        t_band = start[band] + phase * (stop - start)[band]
        x_band = np.round(
            centre0[band] + phase * (centre1 - centre0)[band]
            + band_width * rng.standard_normal(len(band))
        )
        n_background = rng.poisson(background_hz * 1e-6 * duration_us * n_channels)
        t = np.concatenate([t_band, rng.uniform(0.0, duration_us, n_background)])
        x = np.concatenate([x_band, rng.integers(0, n_channels, n_background)])
        inside = (x >= 0) & (x < n_channels)
        events = np.zeros(int(inside.sum()), dtype=EVENT_DTYPE)
        events["t"], events["x"], events["p"] = np.floor(t[inside]), x[inside], 1
        recordings.append(np.sort(events, order="t", kind="stable"))
    frames = np.stack([
        events_to_frames(
            events, sensor_size=(n_channels, 1, 1), time_window_us=duration_us / T,
            n_time_bins=T, t_start_us=0,
        )
        for events in recordings
    ])
    dataset = EventDataset(
        events=frames, labels=labels, num_classes=num_classes, name="synthetic_shd"
    )
    return dataset, recordings
