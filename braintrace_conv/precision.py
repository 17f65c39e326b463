"""One switch for float64: JAX's flag and brainstate's default precision together."""
from __future__ import annotations

import brainstate
import jax

__all__ = ['use_float64']


def use_float64(enabled: bool = True) -> None:
    """Compute in float64 (``enabled=True``) or go back to float32.

    JAX creates float64 arrays only with ``jax_enable_x64`` on, and brainstate
    initialises parameters and states in its own default precision; importing
    brainstate turns JAX's flag off. This sets both, so call it after your
    imports and before building the model: parameters, states, traces and
    gradients are then float64. Exactness checks against BPTT need it, since
    float32 round-off is amplified by spike thresholds.

    Args:
      enabled: ``True`` for float64, ``False`` for float32.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f'use_float64 takes True or False, got {enabled!r}.')
    brainstate.environ.set(precision=64 if enabled else 32)
    jax.config.update('jax_enable_x64', enabled)
