"""Array helpers shared by the datasets."""

from __future__ import annotations

import numpy as np

__all__ = ["read_only"]


def read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be written to; ``array`` itself is unchanged."""
    view = array.view()
    view.flags.writeable = False
    return view
