"""How the online executors read one model step: its jaxpr, ops, groups, cuts and signals.

Internal: nothing here is public API. The executors use these modules; users and
extensions go through :mod:`braintrace_conv.executors` and the top-level package.
"""
