"""The memory a process has used."""
from __future__ import annotations

import resource
import sys


def peak_rss_mib() -> float:
    """The peak resident memory of this process so far, MiB (``ru_maxrss`` is in KiB on
    Linux, in bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == 'darwin' else peak / 1024
