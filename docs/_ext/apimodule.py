"""``apimodule`` directive: the reference page of one module, built from its public names.

``.. apimodule:: braintrace_conv.data`` expands to the module docstring, a summary
table and the autodoc entry of every public class and function (``__all__``, else
the public names the module defines), then its constants with their values and
``#:`` comments. A name exported by a module earlier in the config value
``apimodule_order`` is documented there once and only linked here, so re-exports
(``braintrace_conv.BPTT`` is ``braintrace_conv.executors.BPTT``) get one entry.
Modules are found by import name: pages follow the package as it grows without
listing names by hand.
"""
from __future__ import annotations

import importlib
import inspect
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

# Values such as small ints are shared objects: only objects with an identity of
# their own (classes, functions, primitives) can be recognised as re-exports.
_VALUES = (int, float, complex, str, bytes, tuple, frozenset, type(None))


def public_names(module) -> list[str]:
    """``__all__``, or the names without a leading underscore that ``module`` defines."""
    names = getattr(module, '__all__', None)
    if names is None:
        names = [n for n, obj in vars(module).items() if not n.startswith('_')
                 and getattr(obj, '__module__', '').startswith(module.__name__)]
    return list(names)


def _assignment_doc(package: str, name: str, obj) -> list[str]:
    """The ``#:`` comment above the assignment of ``obj`` in the package module that
    defines it (a re-exporting ``__init__`` has none); empty when there is none."""
    for modname, mod in list(sys.modules.items()):
        if modname.split('.')[0] != package or getattr(mod, name, None) is not obj:
            continue
        docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        if ('', name) in docs:
            return [line for line in docs[('', name)] if line]
    return []


class ApiModule(SphinxDirective):
    required_arguments = 1
    has_content = False

    def _owner(self, obj) -> str | None:
        """The first module of ``apimodule_order`` that exports ``obj``."""
        if isinstance(obj, _VALUES):
            return None
        for name in self.config.apimodule_order:
            module = importlib.import_module(name)
            if any(getattr(module, attr, None) is obj for attr in public_names(module)):
                return name
        return None

    def _link(self, obj, owner: str, name: str) -> str:
        role = 'class' if inspect.isclass(obj) else 'func' if callable(obj) else 'data'
        return f':{role}:`{owner}.{name}`'

    def run(self):
        modname = self.arguments[0]
        try:
            module = importlib.import_module(modname)
        except Exception as err:        # report it on the page's line, do not crash the build
            raise self.error(f'cannot import {modname}: {type(err).__name__}: {err}') from err
        callables, constants, elsewhere = [], [], []
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue                      # submodules have their own page
            owner = self._owner(obj)
            if owner not in (None, modname):
                elsewhere.append(self._link(obj, owner, name))
            elif inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                callables.append((name, 'class' if inspect.isclass(obj) else 'function'))
            else:
                constants.append((name, obj))

        lines = [f'.. automodule:: {modname}', '', f'.. currentmodule:: {modname}', '']
        if callables:
            lines += ['.. autosummary::', '   :nosignatures:', '']
            lines += [f'   {name}' for name, _ in callables] + ['']
        if elsewhere:
            lines += ['Also exported here, documented with the module that exports them '
                      'first: ' + ', '.join(elsewhere) + '.', '']
        for name, kind in callables:
            lines += [f'.. auto{kind}:: {name}']
            if kind == 'class':
                lines += ['   :members:', '   :show-inheritance:']
            lines += ['']
        if constants:
            lines += ['.. rubric:: Constants', '']
        for name, obj in constants:
            doc = _assignment_doc(modname.split('.')[0], name, obj)
            if not doc:
                cls = type(obj)
                owner = self._owner(cls) or cls.__module__
                doc = [f'An instance of {self._link(cls, owner, cls.__qualname__)}.']
            lines += [f'.. py:data:: {name}', f'   :value: {obj!r}', '']
            lines += [f'   {line}' for line in doc] + ['']
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=f'<apimodule {modname}>'),
                                 container)
        return container.children


def setup(app):
    app.add_config_value('apimodule_order', [], 'env')
    app.add_directive('apimodule', ApiModule)
    return dict(parallel_read_safe=True, parallel_write_safe=True)
