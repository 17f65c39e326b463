"""Timing several computations against each other: interleaved rounds in one process."""
from __future__ import annotations

import time


def interleaved(calls: dict, repeats: int) -> dict:
    """``{name: [seconds per call]}`` of ``repeats`` rounds over ``calls`` (``{name: fn}``,
    each ``fn()`` blocking until its result is ready). The order rotates every round, so a
    drift in the machine's load falls on every computation alike."""
    times = {name: [] for name in calls}
    order = list(calls)
    for r in range(repeats):
        for name in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times
