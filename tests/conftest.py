"""Test-suite configuration: float64 everywhere, so exactness claims are checked tightly."""
import brainstate
import jax
import pytest

# brainstate.environ's precision drives both its parameter dtypes and jax_enable_x64.
brainstate.environ.set(precision=64)
jax.config.update('jax_enable_x64', True)


@pytest.fixture(scope='module')
def float64():
    """float64 for one module's tests, whatever a module before it left set (brainstate's
    precision drives its parameter dtypes; importing brainstate turns JAX's flag off).
    Modules whose exactness checks need it say ``pytestmark = pytest.mark.usefixtures('float64')``."""
    old = brainstate.environ.get_precision()
    brainstate.environ.set(precision=64)
    jax.config.update('jax_enable_x64', True)
    yield
    brainstate.environ.set(precision=old)
