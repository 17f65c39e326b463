"""Deprecated module: use :func:`braintrace_conv.extend.register_lift`.

``braintrace_conv.lift.register_lift`` and ``lift_rule`` still work and warn; the
lifting of plain JAX ops is now an internal pass of the executors.
"""
import warnings

_MOVED = {'register_lift': 'braintrace_conv.extend.register_lift',
          'lift_rule': None}    # internal now, no public replacement


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    new = _MOVED[name]
    warnings.warn(f'braintrace_conv.lift.{name} is deprecated' + (f'; use {new}.' if new else
                  ' and will be removed (the lifting of plain JAX ops is internal).'),
                  DeprecationWarning, stacklevel=2)
    from .executors._analysis import lift
    return getattr(lift, name)
