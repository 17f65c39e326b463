"""A model's parameters as one pytree of mantissas, each in its parameter's own unit.

Optimisers act on plain arrays. A ``saiunit`` parameter ``W = w * unit`` is
optimised through its mantissa ``w``: the optimiser sees ``w`` and ``dL/dw``
(the mantissa of ``dL/dW`` expressed in ``1 / unit``), and the updated ``w`` is
put back as ``w * unit``. Step sizes are therefore in each parameter's own
unit: Adam moves ``w`` by about ``lr`` per step, i.e. ``W`` by about
``lr * unit`` (0.005 mV for a weight stored in mV, 0.005 V for one stored in
V), so store a parameter in a unit in which its values are of order one.
"""
from __future__ import annotations

import brainstate
import jax
import numpy as np
import saiunit as u

from ..units import join_unit, split_unit

__all__ = ['ParamView']


def _is_quantity(x) -> bool:
    return isinstance(x, u.Quantity)


def _leaf_name(path) -> str:
    """``'blocks.0.ff.weight'`` for the state key, plus the pytree path inside its value."""
    head, rest = path[0], path[1:]
    key = head.key if isinstance(head.key, tuple) else (head.key,)
    return '.'.join(map(str, key)) + jax.tree_util.keystr(rest)


class ParamView:
    """Mantissas, units and names of ``model.states(brainstate.ParamState)``.

    Trees returned and accepted here are dicts keyed like
    ``model.states(brainstate.ParamState)`` whose leaves are plain arrays
    (the mantissas); ``names`` and ``units`` list the leaves in tree order.
    """

    def __init__(self, model: brainstate.nn.Module):
        self._states = dict(model.states(brainstate.ParamState))
        if not self._states:
            raise ValueError('the model has no brainstate.ParamState to train.')
        paths, self.treedef = jax.tree_util.tree_flatten_with_path(self._values(),
                                                                   is_leaf=_is_quantity)
        self.names = [_leaf_name(p) for p, _ in paths]
        self.units = [split_unit(leaf, name)[1] for name, (_, leaf) in zip(self.names, paths)]

    def _values(self) -> dict:
        return {k: st.value for k, st in self._states.items()}

    def mantissas(self) -> dict:
        """The current parameter values without their units."""
        leaves = jax.tree.leaves(self._values(), is_leaf=_is_quantity)
        return jax.tree.unflatten(self.treedef, [split_unit(v, name)[0]
                                                 for name, v in zip(self.names, leaves)])

    def assign(self, mantissas: dict) -> None:
        """Write ``mantissas`` back to the model, each with its parameter's unit."""
        leaves = self.treedef.flatten_up_to(mantissas)
        values = jax.tree.unflatten(self.treedef, [join_unit(m, unit)
                                                   for m, unit in zip(leaves, self.units)])
        for key, st in self._states.items():
            st.value = values[key]

    def named(self, tree: dict) -> dict:
        """``{leaf name: leaf}`` of a mantissa tree."""
        return dict(zip(self.names, self.treedef.flatten_up_to(tree)))

    def from_named(self, named: dict) -> dict:
        """Inverse of :meth:`named`."""
        return jax.tree.unflatten(self.treedef, [named[n] for n in self.names])

    def grad_mantissas(self, grads: dict) -> dict:
        """Gradients keyed like the parameters -> ``dL/dw`` per leaf (``w`` the mantissa).

        A leaf may be a plain array (taken as ``dL/dw``) or, for a parameter
        ``W`` with a unit, a quantity ``dL/dW`` in any unit of the dimension
        ``1 / unit(W)`` (the loss being dimensionless; the executors return
        ``1 / unit(W)``), which is expressed in ``1 / unit(W)``.
        """
        if not isinstance(grads, dict) or set(grads) != set(self._states):
            got = sorted(map(str, grads)) if isinstance(grads, dict) else type(grads).__name__
            raise ValueError(f'grads must be a dict keyed like model.states(ParamState) '
                             f'({sorted(map(str, self._states))}), got {got}.')
        try:
            leaves = self.treedef.flatten_up_to(grads)
        except (ValueError, TypeError) as err:
            raise ValueError(f'grads must have the structure of the parameters: {err}') from None
        out = []
        for name, unit, g in zip(self.names, self.units, leaves):
            value, g_unit = split_unit(g, f'grads[{name}]')
            if isinstance(g, u.Quantity) and g_unit != unit ** -1:
                if not (g_unit * unit).dim.is_dimensionless:
                    raise ValueError(f'the gradient of {name} must be in {unit ** -1} (dL/d{name} '
                                     f'of a dimensionless loss), got unit {g_unit}.')
                value = value * (1.0 * g_unit).to_decimal(unit ** -1)
            out.append(value)
        shapes = [np.shape(g) for g in out]
        expected = [np.shape(m) for m in jax.tree.leaves(self.mantissas())]
        for name, got, want in zip(self.names, shapes, expected):
            if got != want:
                raise ValueError(f'the gradient of {name} must have shape {want}, got {got}.')
        return jax.tree.unflatten(self.treedef, out)

    def gradients(self, grad_mantissas: dict) -> dict:
        """``dL/d(mantissa)`` per leaf -> ``dL/dW`` in ``1 / unit(W)`` (plain arrays for
        plain parameters), keyed like the parameters."""
        leaves = self.treedef.flatten_up_to(grad_mantissas)
        return jax.tree.unflatten(self.treedef, [join_unit(g, unit ** -1)
                                                 for g, unit in zip(leaves, self.units)])
