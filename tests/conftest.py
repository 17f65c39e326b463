"""Test-suite configuration: float64 everywhere, so exactness claims are checked tightly,
and XLA's CPU code generation without LLVM optimisation."""
import os
import sys

# Test files import shared helpers (snn_reference) from this folder, wherever they sit below it
# (the suite mirrors the package in subfolders and is collected with --import-mode=importlib).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The suite compiles hundreds of small programs and runs each for milliseconds: without
# LLVM's optimisation passes compilation takes about a third less CPU time, and the tests
# check values, never speed. Set before JAX starts its backend; notebooks, documentation
# examples and worker processes started by the tests inherit it.
_NO_LLVM_OPT = '--xla_backend_optimization_level=0'
if _NO_LLVM_OPT not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_NO_LLVM_OPT}".strip()

import brainstate  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

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
