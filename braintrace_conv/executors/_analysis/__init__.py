"""How the online executors read one model step: its jaxpr, ops, groups, cuts and signals.

Internal: nothing here is public API. The executors use these modules; users go
through :mod:`braintrace_conv.executors`, extensions through :mod:`braintrace_conv.extend`.
"""
