"""braintrace_conv: online training of recurrent spiking convolutional networks."""
from .primitive import ETPPrimitive, register_primitive
from .conv import conv, etp_conv_p
from .dense import dense, etp_dense_p

__all__ = ['ETPPrimitive', 'register_primitive', 'conv', 'etp_conv_p', 'dense', 'etp_dense_p']
