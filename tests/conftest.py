"""Test-suite configuration: float64 everywhere, so exactness claims are checked tightly."""
import jax

jax.config.update('jax_enable_x64', True)
