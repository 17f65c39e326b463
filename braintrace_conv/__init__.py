"""braintrace_conv: online training of recurrent spiking convolutional networks.

Trainable operations are ETP primitives (:func:`conv`, :func:`dense`) that
carry the rules an online learner needs; the executors :class:`D_RTRL`,
:class:`ES_D_RTRL` and :class:`BPTT` compute gradients of any ``brainstate``
model built on them.
"""
import jax as _jax

_X64 = _jax.config.jax_enable_x64
import brainstate as _brainstate  # noqa: E402  (importing it resets jax_enable_x64)

if _X64 and not _jax.config.jax_enable_x64:   # keep the user's float64 setting
    _brainstate.environ.set(precision=64)

from .precision import use_float64  # noqa: E402
from .primitive import ETPPrimitive, register_primitive  # noqa: E402
from .conv import conv, etp_conv_p  # noqa: E402
from .dense import dense, etp_dense_p  # noqa: E402
from .executors import BPTT, D_RTRL, ES_D_RTRL, register_elementwise  # noqa: E402
from .training import Trainer  # noqa: E402
from . import data, extend, nn  # noqa: E402  (bc.nn, bc.data, bc.extend after import)

__all__ = ['ETPPrimitive', 'register_primitive', 'conv', 'etp_conv_p', 'dense', 'etp_dense_p',
           'BPTT', 'D_RTRL', 'ES_D_RTRL', 'register_elementwise', 'Trainer', 'use_float64']
