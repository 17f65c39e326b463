"""Event streams of handwritten digits seen by a saccading DVS camera.

The 8x8 digit images bundled with scikit-learn (1797 images, classes 0-9)
are shown to a simulated dynamic vision sensor that moves along a closed
triangular path of three straight saccades, in the manner of N-MNIST. The
sensor sees the digit as a continuous image (bilinear interpolation of the
8x8 grey levels) magnified to ``digit_size`` pixels, bright ink on a dark
background; log-intensity changes are turned into ON/OFF events by
:func:`~braintrace_conv.data.dvs_events`.
"""

from __future__ import annotations

import numpy as np

from ..._validation import at_most, height_width, integer, number
from ..datasets.dataset import EventDataset
from .moving_bars import dvs_events

__all__ = ["digits_saccades", "saccade_path"]

_SOURCE_SIZE = 8
_N_DIGITS = 1797
# Target number of float64 elements per rendering chunk (about 16 MiB).
_CHUNK_ELEMENTS = 2**21


def saccade_path(T: int, substeps: int, amplitude: float) -> np.ndarray:
    """Image displacement along a closed three-saccade triangle.

    The image moves down-right by ``(amplitude, amplitude / 2)``, then left
    by ``amplitude``, then up-right back to the start; each saccade lasts
    ``T / 3`` time steps at constant speed. The path is shifted so that the
    triangle's centroid is at the origin.

    Args:
      T: Number of time steps covered by the three saccades.
      substeps: Samples per time step.
      amplitude: Saccade amplitude, pixels.

    Returns:
      float64 displacements ``(row, col)`` in pixels of shape
      ``(T * substeps + 1, 2)``, sampled at times ``s / substeps`` time
      steps for ``s = 0 .. T * substeps``.
    """
    T = integer("T", T, sign="positive")
    substeps = integer("substeps", substeps, sign="positive")
    amplitude = number("amplitude", amplitude, sign="positive")
    vertices = amplitude * np.array([[0.0, 0.0], [1.0, 0.5], [1.0, -0.5], [0.0, 0.0]])
    vertices -= vertices[:3].mean(axis=0)
    phase = 3.0 * np.arange(T * substeps + 1) / (T * substeps)
    leg = np.minimum(np.floor(phase).astype(np.intp), 2)
    fraction = (phase - leg)[:, None]
    return (1 - fraction) * vertices[leg] + fraction * vertices[leg + 1]


def _tent_weights(coords: np.ndarray, n_source: int) -> np.ndarray:
    """Bilinear interpolation weights, shape ``coords.shape + (n_source,)``.

    ``coords`` are positions in units of source pixels (source pixel ``a``
    is centred at ``a``); positions outside the source fade to zero, i.e.
    the source is zero-padded.
    """
    return np.maximum(0.0, 1.0 - np.abs(coords[..., None] - np.arange(n_source)))


def _render_ink(
    images: np.ndarray, offsets: np.ndarray, size: tuple[int, int], digit_size: int
) -> np.ndarray:
    """Ink density seen by the sensor, shape ``(N, S + 1, H, W)``, in [0, 1].

    ``images`` has shape ``(N, 8, 8)`` with values in [0, 1]; ``offsets``
    has shape ``(N, S + 1, 2)`` and holds the digit displacement from the
    sensor centre in pixels at every image.
    """
    height, width = size
    scale = _SOURCE_SIZE / digit_size
    # Pixel-edge coordinate of the digit's top-left corner when centred.
    top, left = (height - digit_size) / 2, (width - digit_size) / 2
    row_coords = (np.arange(height) + 0.5 - top - offsets[..., 0, None]) * scale - 0.5
    col_coords = (np.arange(width) + 0.5 - left - offsets[..., 1, None]) * scale - 0.5
    row_weights = _tent_weights(row_coords, _SOURCE_SIZE)  # (N, S + 1, H, 8)
    col_weights = _tent_weights(col_coords, _SOURCE_SIZE)  # (N, S + 1, W, 8)
    return row_weights @ images[:, None] @ np.swapaxes(col_weights, -1, -2)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Digit images ``(1797, 8, 8)`` scaled to [0, 1] and labels ``(1797,)``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "digits_saccades needs scikit-learn for its bundled digits data; "
            "install it with `pip install scikit-learn`"
        ) from error
    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def digits_saccades(
    *,
    n_samples: int | None = None,
    T: int = 24,
    size: tuple[int, int] = (16, 16),
    digit_size: int = 12,
    saccade_amplitude: float = 2.0,
    jitter: float = 1.0,
    substeps: int = 4,
    background: float = 0.1,
    threshold: float = 0.3,
    seed: int = 0,
) -> EventDataset:
    """N-MNIST-style event streams of scikit-learn's 8x8 digits.

    Each digit is centred on the sensor, magnified to ``digit_size`` pixels,
    displaced by a random per-sample offset and moved along the three-saccade
    path of :func:`saccade_path` over the ``T`` time steps. Sensor intensity
    is ``background + (1 - background) * ink`` with ink density in [0, 1];
    it is imaged ``substeps`` times per time step and converted to events by
    :func:`~braintrace_conv.data.dvs_events`.

    Args:
      n_samples: Number of digits ``N`` drawn without replacement from the 1797
        available; all of them (in shuffled order) if None.
      T: Time steps per sample; the three saccades take ``T / 3`` each.
      size: Sensor height ``H`` and width ``W``, pixels.
      digit_size: Edge length of the magnified digit, pixels; between 8 and
        ``min(H, W)``.
      saccade_amplitude: Saccade amplitude, pixels.
      jitter: Per-sample digit offset, uniform in ``[-jitter, jitter]`` pixels
        along each axis; non-negative.
      substeps: Rendered images per time step.
      background: Intensity of ink-free pixels relative to full ink, in ``(0, 1)``.
      threshold: DVS contrast threshold, natural log units.
      seed: Seed of the sample selection and offsets; equal arguments give
        identical datasets.

    Returns:
      ``events`` float32 ``(N, T, 2, H, W)``, ``labels`` int32 ``(N,)``
      with the digit ``0..9``, ``num_classes=10``.

    Raises:
      ImportError: If scikit-learn is not installed.
    """
    T = integer("T", T, sign="positive")
    size = height_width("size", size)
    digit_size = integer("digit_size", digit_size, sign="positive")
    if not _SOURCE_SIZE <= digit_size <= min(size):
        raise ValueError(
            f"digit_size must lie in [{_SOURCE_SIZE}, {min(size)}] for size={size}, "
            f"got {digit_size}"
        )
    substeps = integer("substeps", substeps, sign="positive")
    saccade_amplitude = number("saccade_amplitude", saccade_amplitude, sign="positive")
    jitter = number("jitter", jitter, sign="non-negative")
    background = number("background", background, sign="positive")
    if background >= 1:
        raise ValueError(f"background must lie in (0, 1), got {background}")
    threshold = number("threshold", threshold, sign="positive")
    if n_samples is None:
        n_samples = _N_DIGITS
    n_samples = at_most("n_samples", integer("n_samples", n_samples, sign="positive"), _N_DIGITS,
                        "digits", names={"digits": "the number of digits"})

    images, targets = _load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(_N_DIGITS)[:n_samples]
    offsets = saccade_path(T, substeps, saccade_amplitude)[None] + rng.uniform(
        -jitter, jitter, size=(n_samples, 1, 2)
    )

    chunk = max(1, _CHUNK_ELEMENTS // ((T * substeps + 1) * size[0] * size[1]))
    frames = []
    for start in range(0, n_samples, chunk):
        part = slice(start, start + chunk)
        ink = _render_ink(images[order[part]], offsets[part], size, digit_size)
        log_intensity = np.log(background + (1.0 - background) * ink)
        frames.append(dvs_events(log_intensity, threshold=threshold, substeps=substeps))
    return EventDataset(
        events=np.concatenate(frames),
        labels=targets[order],
        num_classes=10,
        name="digits_saccades",
        class_names=tuple(str(d) for d in range(10)),
    )
