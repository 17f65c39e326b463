"""Random camera events for the file-format tests: one recording drawn the same way for
every reader and writer that is tested on it."""
import numpy as np

from braintrace_conv.data import CAMERA_EVENT_DTYPE


def random_events(n, size=(24, 16), seed=0, start_us=3_000_000, max_step_us=40):
    """``n`` events of :data:`CAMERA_EVENT_DTYPE` on a ``size = (width, height)`` sensor:
    uniform pixels and polarities, timestamps from ``start_us`` on in steps drawn from
    ``0 .. max_step_us - 1`` microseconds (so several events share a time)."""
    rng = np.random.default_rng(seed)
    events = np.zeros(n, CAMERA_EVENT_DTYPE)
    events["t"] = start_us + np.cumsum(rng.integers(0, max_step_us, n))
    events["x"], events["y"] = rng.integers(0, size[0], n), rng.integers(0, size[1], n)
    events["p"] = rng.integers(0, 2, n)
    return events
