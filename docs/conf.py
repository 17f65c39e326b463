"""Sphinx configuration: ``python3 -m sphinx -W --keep-going -b html docs docs/_build/html``."""
import pathlib
import sys

import matplotlib

matplotlib.use('Agg')       # autodoc imports the library; never open a window

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / '_ext'))

project = 'braintrace_conv'
author = 'braintrace_conv developers'
copyright = 'braintrace_conv developers'

extensions = [
    'myst_nb',                      # Markdown pages and the notebooks (with stored outputs)
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',          # the Google docstring sections (Args:, Returns:, ...)
    'sphinx.ext.mathjax',
    'apimodule',
]

exclude_patterns = ['_build', '**.ipynb_checkpoints']
source_suffix = {'.md': 'myst-nb', '.ipynb': 'myst-nb'}

# Notebooks are committed with their outputs and executed by the test suite
# (tests/test_notebooks.py); the docs render the stored outputs.
nb_execution_mode = 'off'
nb_merge_streams = True

myst_enable_extensions = ['dollarmath', 'amsmath', 'colon_fence', 'deflist']
myst_heading_anchors = 3

autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
autodoc_default_options = {'exclude-members': '__init__, __new__'}
autosummary_generate = False
napoleon_use_rtype = False

# The order in which the reference pages claim the names they export: a name
# re-exported by a later module is documented once, with the first.
apimodule_order = [
    'braintrace_conv',
    'braintrace_conv.executors',
    'braintrace_conv.extend',
    'braintrace_conv.training',
    'braintrace_conv.training.loss',
    'braintrace_conv.training.stream',
    'braintrace_conv.training.stream_metrics',
    'braintrace_conv.nn',
    'braintrace_conv.nn.neurons',
    'braintrace_conv.nn.surrogate',
    'braintrace_conv.data',
    'braintrace_conv.data.encoders',
    'braintrace_conv.data.transforms',
    'braintrace_conv.data.files.aedat',
    'braintrace_conv.data.files.nmnist',
    'braintrace_conv.data.files.prophesee',
    'braintrace_conv.models',
    'braintrace_conv.primitive',
    'braintrace_conv.plot',
    'braintrace_conv.sharding',
    'braintrace_conv.cli',
    'braintrace_conv.cli.options',
    'braintrace_conv.cli.stream',
    'braintrace_conv.nir',
    'braintrace_conv.nir.modules',
]

html_theme = 'furo'
html_title = 'braintrace_conv'
