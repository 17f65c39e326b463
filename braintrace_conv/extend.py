"""Extending braintrace_conv: every extension point in one place.

* a new trainable operation: :func:`register_primitive` creates an
  :class:`ETPPrimitive` from a forward function, whose online-learning rules are
  installed with :meth:`ETPPrimitive.register_etp_rules` (the rule contract,
  ``docs/theory.md``); :func:`weight_vjp` is the generic body of an ``xy_to_dw`` rule
  and :func:`apply_state_jacobian` applies ``D`` to a trace; :data:`DRTRL_RULES` and
  :data:`ES_DRTRL_RULES` name the rules each executor calls;
* a JAX primitive that acts element by element but does not show it in its own
  definition: :func:`register_elementwise`;
* another plain JAX primitive treated as an ETP operation: :func:`register_lift`;
* a new online executor: subclass :class:`~braintrace_conv.executors.OnlineLearner`.
"""
from .executors import Learner, OnlineLearner, register_elementwise
from .executors._analysis.lift import register_lift
from .primitive import (DRTRL_RULES, ES_DRTRL_RULES, STANDARD_RULES, ETPPrimitive,
                        apply_state_jacobian, register_primitive, weight_vjp)

__all__ = ['register_primitive', 'ETPPrimitive', 'weight_vjp', 'apply_state_jacobian',
           'STANDARD_RULES', 'DRTRL_RULES', 'ES_DRTRL_RULES', 'register_elementwise',
           'register_lift', 'Learner', 'OnlineLearner']
