"""Every research notebook runs from top to bottom (at the small size), and the committed
notebooks carry the outputs and figures of a complete run."""
import importlib.util
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))


def _executor():
    spec = importlib.util.spec_from_file_location('execute', ROOT / 'notebooks' / 'execute.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebooks_are_there():
    names = {p.stem for p in NOTEBOOKS}
    assert {'quickstart', 'gradient_fidelity', 'memory_time', 'units', 'online_learning',
            'extending'} <= names


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    """A failing cell raises nbclient's CellExecutionError with its source and traceback."""
    nb = _executor().execute(path, small=True, timeout=600)
    errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
              if o.output_type == 'error']
    assert not errors


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_outputs_and_figures(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == 'code']
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f'{path.name} is not stored as one complete top-to-bottom run: execution counts {counts}'
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == 'error'], f'{path.name} stores an error'
    figures = [o for o in outputs if 'image/png' in o.get('data', {})]
    assert figures, f'{path.name} shows no figure'
    assert nb.metadata.get('braintrace_conv', {}).get('small') is False, \
        f'{path.name} was not executed at full size (python3 notebooks/execute.py)'
