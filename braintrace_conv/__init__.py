"""braintrace_conv: online training of recurrent spiking convolutional networks.

Trainable operations are ETP primitives (:func:`conv`, :func:`dense`) that
carry the rules an online learner needs; the executors :class:`D_RTRL`,
:class:`ES_D_RTRL` and :class:`BPTT` compute gradients of any ``brainstate``
model built on them.
"""
from .primitive import ETPPrimitive, register_primitive
from .conv import conv, etp_conv_p
from .dense import dense, etp_dense_p
from .executors import BPTT, D_RTRL, ES_D_RTRL, register_elementwise

__all__ = ['ETPPrimitive', 'register_primitive', 'conv', 'etp_conv_p', 'dense', 'etp_dense_p',
           'BPTT', 'D_RTRL', 'ES_D_RTRL', 'register_elementwise']
