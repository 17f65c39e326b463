"""Synthetic DVS recordings of objects moving in one of eight directions.

Each sample shows one object -- a bar oriented across its motion or a small
cluster of random dots -- translating at constant velocity over a uniform
background. The label is the direction of motion, ``k * 45`` degrees
counter-clockwise from "right" for label ``k`` (0 right, 2 up, 4 left,
6 down; "up" is towards row 0).

The scene is rendered as an intensity image at ``substeps`` instants per time
step, converted to log intensity and passed through :func:`dvs_events`, a
simple model of a dynamic vision sensor pixel.

Single frames do not reveal the label
-------------------------------------
Every object is drawn bright-on-dark or dark-on-bright with probability 1/2,
independently of its direction. Objects are rendered as binary masks, so each
pixel only ever switches between two log-intensity levels, and the contrast
between them is at least the DVS threshold, so every switch emits events and
resets the pixel's reference; the events of a step are therefore a function
of the masks at its two ends only. Reversing time turns a bright
object moving in direction ``d`` into the same positions traversed in
direction ``d + 4`` (mod 8), and swaps which transitions brighten a pixel --
exactly what the dark-on-bright version does. Hence the dark object moving in
direction ``d + 4`` produces *exactly* the frames of the bright object moving
in direction ``d``, in reverse order (:meth:`MotionScenes.mirrored` builds
that partner). Both partners are equally likely under the generator
(exactly so when ``n_samples`` is a multiple of 8, which balances the
directions), so any single frame -- indeed any statistic that ignores the
order of the frames, such as the time-summed event counts -- is equally
consistent with two opposite labels. Only the temporal order of the frames
identifies the direction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..._validation import height_width, integer, number, positive_range
from ..datasets.dataset import EventDataset

__all__ = [
    "DIRECTION_NAMES",
    "MotionScenes",
    "dvs_events",
    "moving_bars",
    "render_scenes",
    "sample_scenes",
]

DIRECTION_NAMES = (
    "right",
    "up-right",
    "up",
    "up-left",
    "left",
    "down-left",
    "down",
    "down-right",
)

_OBJECT_KINDS = ("bar", "dots")

# Target number of float64 elements per rendering chunk (about 16 MiB).
_CHUNK_ELEMENTS = 2**21


def _direction_vectors() -> np.ndarray:
    """Unit vectors ``(d_row, d_col)`` of the 8 directions, shape ``(8, 2)``.

    Opposite directions are exact negatives of each other, which the exact
    mirror symmetry of the generator relies on.
    """
    s = np.sqrt(0.5)
    first_half = np.array([[0.0, 1.0], [-s, s], [-1.0, 0.0], [-s, -s]])
    return np.concatenate([first_half, -first_half])


def dvs_events(log_intensity: np.ndarray, *, threshold: float, substeps: int) -> np.ndarray:
    """Convert log-intensity videos into binned ON/OFF event counts.

    Each pixel keeps a reference log intensity, initialised from the first
    image. At every later image the pixel emits ``floor(|L - ref| /
    threshold)`` events, ON if the log intensity ``L`` rose above the
    reference and OFF if it fell, and the reference is reset to ``L``
    whenever at least one event is emitted (the sub-threshold remainder is
    discarded). Events are summed over groups of ``substeps`` consecutive
    images to form one time step.

    Args:
      log_intensity: Natural-log intensity of shape ``(N, S + 1, H, W)``: ``N`` videos
        of ``S + 1`` images sampled at equal intervals. ``S`` must be a multiple of
        ``substeps``.
      threshold: Contrast threshold in natural-log units, positive.
      substeps: Number of image intervals per output time step, positive.

    Returns:
      float32 event counts of shape ``(N, S // substeps, 2, H, W)``;
      channel 0 counts ON events and channel 1 OFF events. Time step ``t``
      holds the events of images ``t * substeps + 1`` to
      ``(t + 1) * substeps``.
    """
    log_intensity = np.asarray(log_intensity, dtype=np.float64)
    threshold = number("threshold", threshold, sign="positive")
    substeps = integer("substeps", substeps, sign="positive")
    if log_intensity.ndim != 4:
        raise ValueError(
            "log_intensity must have shape (N, S + 1, H, W), got shape "
            f"{log_intensity.shape}"
        )
    n_intervals = log_intensity.shape[1] - 1
    if n_intervals < substeps or n_intervals % substeps:
        raise ValueError(
            f"log_intensity must hold a positive multiple of substeps={substeps} "
            f"image intervals, got {n_intervals}"
        )
    n, _, height, width = log_intensity.shape
    frames = np.zeros((n, n_intervals // substeps, 2, height, width), dtype=np.float32)
    reference = log_intensity[:, 0].copy()
    for s in range(1, n_intervals + 1):
        current = log_intensity[:, s]
        change = current - reference
        count = np.floor(np.abs(change) / threshold)
        fired = count > 0
        reference[fired] = current[fired]
        t = (s - 1) // substeps
        frames[:, t, 0] += count * (change > 0)
        frames[:, t, 1] += count * (change < 0)
    return frames


@dataclasses.dataclass(frozen=True, eq=False)
class MotionScenes:
    """Parameters of ``N`` moving-object scenes, one entry per sample.

    Coordinates are in pixels as ``(row, col)``, with pixel ``(i, j)``
    centred at ``(i, j)``. A scene places its object at
    ``center + speed * direction_vector * tau`` at time ``tau`` (in time
    steps) measured from the middle of the clip.

    Attributes:
      direction: int64 ``(N,)``, motion direction and label, ``0..7``; direction ``k``
        points ``k * 45`` degrees counter-clockwise from "right".
      polarity: int64 ``(N,)``, 0 for a bright object on a dark background, 1 for a
        dark object on a bright background.
      speed: float64 ``(N,)``, pixels per time step.
      center: float64 ``(N, 2)``, object position at the middle of the clip,
        pixels.
      is_bar: bool ``(N,)``, True for a bar, False for a dot cluster.
      bar_length: float64 ``(N,)``, bar extent across the motion, pixels.
      bar_width: float64 ``(N,)``, bar extent along the motion, pixels.
      dot_offsets: float64 ``(N, n_dots, 2)``, dot centres relative to the object
        position, pixels.
      dot_radius: Radius of every dot, pixels.
    """

    direction: np.ndarray
    polarity: np.ndarray
    speed: np.ndarray
    center: np.ndarray
    is_bar: np.ndarray
    bar_length: np.ndarray
    bar_width: np.ndarray
    dot_offsets: np.ndarray
    dot_radius: float

    def __post_init__(self):
        n = len(self.direction)
        shapes = {
            "direction": (n,),
            "polarity": (n,),
            "speed": (n,),
            "center": (n, 2),
            "is_bar": (n,),
            "bar_length": (n,),
            "bar_width": (n,),
        }
        for name, shape in shapes.items():
            if np.shape(getattr(self, name)) != shape:
                raise ValueError(
                    f"{name} must have shape {shape}, got {np.shape(getattr(self, name))}"
                )
        offsets_shape = np.shape(self.dot_offsets)
        if len(offsets_shape) != 3 or offsets_shape[0] != n or offsets_shape[2] != 2:
            raise ValueError(
                f"dot_offsets must have shape ({n}, n_dots, 2), got {offsets_shape}"
            )
        if not np.isin(self.direction, np.arange(8)).all():
            raise ValueError("direction must hold integers in 0..7")
        if not np.isin(self.polarity, (0, 1)).all():
            raise ValueError("polarity must hold 0 or 1")
        number("dot_radius", self.dot_radius, sign="positive")

    def __len__(self) -> int:
        return len(self.direction)

    def mirrored(self) -> MotionScenes:
        """Scenes with reversed direction and swapped contrast polarity.

        The result renders to exactly the frames of ``self`` in reverse
        time order (see the module docstring), while its labels are the
        opposite directions.
        """
        return dataclasses.replace(
            self, direction=(self.direction + 4) % 8, polarity=1 - self.polarity
        )


def sample_scenes(
    n_samples: int,
    *,
    size: tuple[int, int] = (16, 16),
    speed: tuple[float, float] = (0.5, 1.0),
    objects: Sequence[str] = _OBJECT_KINDS,
    bar_length: tuple[float, float] = (6.0, 12.0),
    bar_width: tuple[float, float] = (2.0, 4.0),
    n_dots: int = 6,
    dot_radius: float = 1.0,
    pattern_radius: float = 4.0,
    center_spread: float = 0.5,
    seed: int = 0,
) -> MotionScenes:
    """Draw random moving-object scenes.

    Directions are balanced (each of the 8 appears ``n_samples // 8`` or
    one more times) and shuffled; contrast polarity is a fair coin flip
    independent of everything else. All other parameters are drawn
    uniformly and independently of direction and polarity.

    Args:
      n_samples: Number of scenes ``N``.
      size: Sensor height and width, pixels.
      speed: Range of object speeds, pixels per time step.
      objects (sequence of {"bar", "dots"}): Object kinds to draw from with equal
        probability.
      bar_length: Range of bar lengths across the motion direction, pixels.
      bar_width: Range of bar widths along the motion direction, pixels.
      n_dots: Number of dots in a dot cluster.
      dot_radius: Radius of each dot, pixels.
      pattern_radius: Dot centres are uniform over a disc of this radius around the
        object position, pixels.
      center_spread: The object position at mid-clip is uniform over a centred box
        spanning this fraction of the sensor height and width, in ``(0, 1]``.
      seed: Seed of the random draw.

    Returns:
      ``N`` scenes.
    """
    n_samples = integer("n_samples", n_samples, sign="positive")
    height, width = height_width("size", size)
    speed = positive_range("speed", speed)
    bar_length = positive_range("bar_length", bar_length)
    bar_width = positive_range("bar_width", bar_width)
    n_dots = integer("n_dots", n_dots, sign="positive")
    dot_radius = number("dot_radius", dot_radius, sign="positive")
    pattern_radius = number("pattern_radius", pattern_radius, sign="positive")
    center_spread = number("center_spread", center_spread, sign="positive")
    if center_spread > 1:
        raise ValueError(f"center_spread must lie in (0, 1], got {center_spread}")
    objects = tuple(objects) if not isinstance(objects, str) else (objects,)
    if not objects or any(kind not in _OBJECT_KINDS for kind in objects):
        raise ValueError(
            f"objects must be a non-empty selection of {_OBJECT_KINDS}, got {objects!r}"
        )

    rng = np.random.default_rng(seed)
    extent = np.array([height, width], dtype=np.float64)
    kind = np.asarray(objects)[rng.integers(len(objects), size=n_samples)]
    dot_distance = pattern_radius * np.sqrt(rng.uniform(size=(n_samples, n_dots)))
    dot_angle = rng.uniform(0.0, 2 * np.pi, size=(n_samples, n_dots))
    return MotionScenes(
        direction=rng.permutation(np.arange(n_samples) % 8),
        polarity=rng.integers(2, size=n_samples),
        speed=rng.uniform(*speed, size=n_samples),
        center=(extent - 1) / 2
        + center_spread * extent * rng.uniform(-0.5, 0.5, size=(n_samples, 2)),
        is_bar=kind == "bar",
        bar_length=rng.uniform(*bar_length, size=n_samples),
        bar_width=rng.uniform(*bar_width, size=n_samples),
        dot_offsets=np.stack(
            [dot_distance * np.sin(dot_angle), dot_distance * np.cos(dot_angle)], axis=-1
        ),
        dot_radius=dot_radius,
    )


def _bar_masks(
    rel_row: np.ndarray,
    rel_col: np.ndarray,
    unit: np.ndarray,
    length: np.ndarray,
    width: np.ndarray,
) -> np.ndarray:
    """Masks of bars lying across their motion direction.

    ``rel_row`` ``(n, S + 1, H, 1)`` and ``rel_col`` ``(n, S + 1, 1, W)`` are
    pixel centres relative to the bar centre, ``unit`` ``(n, 2)`` the motion
    direction, ``length`` and ``width`` ``(n,)`` the bar extents across and
    along the motion, all in pixels. Returns bool ``(n, S + 1, H, W)``.
    """
    u_row = unit[:, 0, None, None, None]
    u_col = unit[:, 1, None, None, None]
    along = rel_row * u_row + rel_col * u_col
    across = rel_row * u_col - rel_col * u_row
    return (np.abs(along) <= width[:, None, None, None] / 2) & (
        np.abs(across) <= length[:, None, None, None] / 2
    )


def _dot_masks(
    rel_row: np.ndarray, rel_col: np.ndarray, offsets: np.ndarray, radius: float
) -> np.ndarray:
    """Masks of unions of discs of ``radius`` pixels.

    ``rel_row`` and ``rel_col`` are as in :func:`_bar_masks`; ``offsets``
    ``(n, n_dots, 2)`` are the disc centres relative to the object centre,
    pixels. Returns bool ``(n, S + 1, H, W)``.
    """
    mask = np.zeros(np.broadcast_shapes(rel_row.shape, rel_col.shape), dtype=bool)
    for k in range(offsets.shape[1]):
        offset = offsets[:, k, :, None, None, None]
        mask |= (rel_row - offset[:, 0]) ** 2 + (rel_col - offset[:, 1]) ** 2 <= radius**2
    return mask


def _object_masks(
    scenes: MotionScenes, positions: np.ndarray, size: tuple[int, int]
) -> np.ndarray:
    """Binary object masks, shape ``(N, S + 1, H, W)``.

    ``positions`` has shape ``(N, S + 1, 2)``: the object position at every
    image, in pixels.
    """
    height, width = size
    # Pixel centres relative to the object position, (N, S + 1, H, 1) and
    # (N, S + 1, 1, W).
    rel_row = np.arange(height)[:, None] - positions[:, :, 0, None, None]
    rel_col = np.arange(width)[None, :] - positions[:, :, 1, None, None]
    masks = np.empty(positions.shape[:2] + (height, width), dtype=bool)
    bar, dots = scenes.is_bar, ~scenes.is_bar
    masks[bar] = _bar_masks(
        rel_row[bar],
        rel_col[bar],
        _direction_vectors()[scenes.direction[bar]],
        scenes.bar_length[bar],
        scenes.bar_width[bar],
    )
    masks[dots] = _dot_masks(
        rel_row[dots], rel_col[dots], scenes.dot_offsets[dots], scenes.dot_radius
    )
    return masks


def render_scenes(
    scenes: MotionScenes,
    *,
    T: int = 20,
    size: tuple[int, int] = (16, 16),
    substeps: int = 4,
    contrast: float = 1.0,
    threshold: float = 0.6,
) -> np.ndarray:
    """Render scenes to DVS event frames.

    The clip spans ``T`` time steps centred on the scene's mid-clip
    position. The scene is imaged at ``T * substeps + 1`` equally spaced
    instants; at each, pixels whose centre lies inside the object have
    intensity ``exp(contrast)`` (bright object) or 1 (dark object) and all
    others the opposite level. The images go through :func:`dvs_events`.

    Args:
      scenes: ``N`` scenes, e.g. from :func:`sample_scenes`.
      T: Number of output time steps.
      size: Sensor height and width, pixels.
      substeps: Images per time step; keep ``max speed / substeps`` at or below one
        pixel so that objects do not skip pixels.
      contrast: Log-intensity difference between object and background (natural
        log units); must be at least ``threshold``.
      threshold: DVS contrast threshold, natural log units.

    Returns:
      float32 event counts of shape ``(N, T, 2, H, W)``.
    """
    if not isinstance(scenes, MotionScenes):
        raise TypeError(f"scenes must be MotionScenes, got {type(scenes).__name__}")
    T = integer("T", T, sign="positive")
    size = height_width("size", size)
    substeps = integer("substeps", substeps, sign="positive")
    contrast = number("contrast", contrast, sign="positive")
    threshold = number("threshold", threshold, sign="positive")
    if contrast < threshold:
        raise ValueError(
            f"contrast={contrast} is below threshold={threshold}; moving objects "
            "would emit no events"
        )
    n_intervals = T * substeps
    # Time of every image in steps from mid-clip. The integer numerator makes
    # the time grid exactly antisymmetric, tau[S - s] == -tau[s].
    tau = (2.0 * np.arange(n_intervals + 1) - n_intervals) / (2.0 * substeps)
    # Intensities 1 (dark) and exp(contrast) (bright), as log intensities.
    log_dark, log_bright = 0.0, contrast

    chunk = max(1, _CHUNK_ELEMENTS // ((n_intervals + 1) * size[0] * size[1]))
    frames = []
    for start in range(0, len(scenes), chunk):
        part = _take(scenes, slice(start, start + chunk))
        velocity = part.speed[:, None] * _direction_vectors()[part.direction]
        positions = part.center[:, None, :] + velocity[:, None, :] * tau[:, None]
        covered = _object_masks(part, positions, size)
        dark_object = part.polarity.astype(bool)[:, None, None, None]
        log_intensity = np.where(covered != dark_object, log_bright, log_dark)
        frames.append(dvs_events(log_intensity, threshold=threshold, substeps=substeps))
    return np.concatenate(frames)


def _take(scenes: MotionScenes, index: slice) -> MotionScenes:
    """Scenes selected by ``index`` along the sample axis."""
    return dataclasses.replace(
        scenes,
        **{
            field.name: getattr(scenes, field.name)[index]
            for field in dataclasses.fields(scenes)
            if field.name != "dot_radius"
        },
    )


def moving_bars(
    n_samples: int,
    *,
    T: int = 20,
    size: tuple[int, int] = (16, 16),
    speed: tuple[float, float] = (0.5, 1.0),
    objects: Sequence[str] = _OBJECT_KINDS,
    substeps: int = 4,
    contrast: float = 1.0,
    threshold: float = 0.6,
    bar_length: tuple[float, float] = (6.0, 12.0),
    bar_width: tuple[float, float] = (2.0, 4.0),
    n_dots: int = 6,
    dot_radius: float = 1.0,
    pattern_radius: float = 4.0,
    center_spread: float = 0.5,
    seed: int = 0,
) -> EventDataset:
    """Synthetic DVS dataset of objects moving in one of 8 directions.

    Combines :func:`sample_scenes` and :func:`render_scenes`; see the module
    docstring for the scene model and why no single frame reveals the label.
    With the defaults an object travels 10 to 20 pixels during the clip and
    each pixel the object edge crosses emits one event.

    Args:
      n_samples: Number of samples ``N``; directions are balanced.
      T: Time steps per sample.
      size: Sensor height ``H`` and width ``W``, pixels.
      speed: Range of object speeds, pixels per time step.
      objects (sequence of {"bar", "dots"}): Object kinds, drawn with equal probability.
      substeps: Rendered images per time step.
      contrast: Object/background log-intensity difference, natural log units.
      threshold: DVS contrast threshold, natural log units, at most ``contrast``.
      bar_length: Range of bar lengths across the motion, pixels.
      bar_width: Range of bar widths along the motion, pixels.
      n_dots: Dots per dot cluster.
      dot_radius: Dot radius, pixels.
      pattern_radius: Radius of the disc holding the dot centres, pixels.
      center_spread: Mid-clip object positions are uniform over a centred box spanning
        this fraction of the sensor, in ``(0, 1]``.
      seed: Seed; equal arguments give identical datasets.

    Returns:
      ``events`` float32 ``(N, T, 2, H, W)``, ``labels`` int32 ``(N,)``
      with the direction ``0..7``, ``num_classes=8``.
    """
    scenes = sample_scenes(
        n_samples,
        size=size,
        speed=speed,
        objects=objects,
        bar_length=bar_length,
        bar_width=bar_width,
        n_dots=n_dots,
        dot_radius=dot_radius,
        pattern_radius=pattern_radius,
        center_spread=center_spread,
        seed=seed,
    )
    events = render_scenes(
        scenes, T=T, size=size, substeps=substeps, contrast=contrast, threshold=threshold
    )
    return EventDataset(
        events=events,
        labels=scenes.direction,
        num_classes=8,
        name="moving_bars",
        class_names=DIRECTION_NAMES,
    )
