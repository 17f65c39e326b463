"""Read and write NIR graphs (the Neuromorphic Intermediate Representation, ``nir`` 1.0).

* :func:`load` builds a trainable ``brainstate`` module from a NIR graph or file, written
  here or by snnTorch, Norse, Sinabs, Spyx, ...: every node type of NIR 1.0, cycles (a
  one-step delay) and summed inputs.
* :func:`export` writes a model of this library's or ``brainstate.nn``'s layers and
  neurons (and the NIR-expressible neurons of ``brainpy.state``) as a NIR graph, or
  refuses, naming the layer, what NIR cannot express.

NIR conventions kept throughout: channels-first ``(C, H, W)`` samples without the batch
axis, conv weights ``OIHW``, affine weights ``(out, in)``, time constants in seconds,
parameters of the neuron's full shape. NIR has no step: :func:`export` stores ``dt`` in the
graph's metadata and :func:`load` reads it there or takes it as an argument. Needs the
``nir`` package (``pip install -e ".[nir]"``).
"""
from ._export import export
from ._load import Network, load
from . import modules

__all__ = ['export', 'load', 'Network', 'modules']
