"""Test-suite configuration: float64 everywhere, so exactness claims are checked tightly."""
import brainstate
import jax

# brainstate.environ's precision drives both its parameter dtypes and jax_enable_x64.
brainstate.environ.set(precision=64)
jax.config.update('jax_enable_x64', True)
