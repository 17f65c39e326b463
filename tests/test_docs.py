"""The README example and the documentation's code run as written; the site builds with
warnings as errors and documents every public name."""
import importlib.util
import pathlib
import re
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
THEORY_ANCHORS = ('notation', 'd-rtrl', 'old-state', 'neuron-parameters', 'conv-kernel-trace',
                  'es-d-rtrl', 'rule-contract', 'windows', 'exactness')


def _python_blocks(path: pathlib.Path) -> list:
    return re.findall(r'```python\n(.*?)```', path.read_text(), flags=re.S)


def _run(code: str, tmp_path):
    script = tmp_path / 'example.py'
    script.write_text('import matplotlib\nmatplotlib.use("Agg")\n' + code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_readme_example_runs(tmp_path):
    blocks = _python_blocks(ROOT / 'README.md')
    assert blocks, 'README has no python example'
    out = _run(blocks[0], tmp_path)
    assert 'exact (instantaneous' in out and 'approximate trace' in out   # report() printed


GUIDE_PAGES = sorted(p.relative_to(DOCS).as_posix() for p in
                     [DOCS / 'install.md', *(DOCS / 'guide').glob('*.md')] if _python_blocks(p))


@pytest.mark.parametrize('page', GUIDE_PAGES)
def test_docs_page_examples_run(page, tmp_path):
    """The python blocks of a page, in order, form one script that runs."""
    _run('\n'.join(_python_blocks(DOCS / page)), tmp_path)


# ----------------------------------------------------------------------------- the site
@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """The HTML site built from docs/ like the README says, with -W, into a temp dir."""
    out = tmp_path_factory.mktemp('site')
    proc = subprocess.run(
        [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html', str(DOCS),
         str(out / 'html'), '-d', str(out / 'doctrees')],
        cwd=out, capture_output=True, text=True, timeout=600)   # cwd: import the installed package
    assert proc.returncode == 0, f'docs build failed or warned:\n{proc.stderr[-6000:]}'
    return out / 'html'


def test_readme_names_the_docs_build_command():
    readme = (ROOT / 'README.md').read_text()
    assert 'python3 -m sphinx -W --keep-going -b html docs docs/_build/html' in readme
    assert 'pip install -e ".[docs]"' in readme


def test_theory_page_has_the_stable_anchors(site):
    html = (site / 'theory.html').read_text()
    missing = [a for a in THEORY_ANCHORS if f'id="{a}"' not in html]
    assert not missing, f'docs/theory.md lost the anchors {missing}'


def test_every_notebook_page_shows_its_figures(site):
    notebooks = sorted((ROOT / 'notebooks').glob('*.ipynb'))
    assert notebooks
    for nb in notebooks:
        html = (site / 'notebooks' / f'{nb.stem}.html').read_text()
        assert re.search(r'<img[^>]+src="[^"]+\.png"', html), f'{nb.name}: no figure rendered'


def _apimodule():
    spec = importlib.util.spec_from_file_location('apimodule', DOCS / '_ext' / 'apimodule.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_documents_every_public_name(site):
    """Every name in a reference module's ``__all__`` has an entry, on the page of the
    first module in ``apimodule_order`` that exports it."""
    apimodule = _apimodule()
    conf = runpy.run_path(str(DOCS / 'conf.py'))
    ids = set()
    for page in (site / 'api').glob('*.html'):
        ids |= set(re.findall(r'id="(?:module-)?(braintrace_conv[\w.]*)"', page.read_text()))
    missing = []
    for modname in conf['apimodule_order']:
        module = importlib.import_module(modname)
        for name in apimodule.public_names(module):
            obj = getattr(module, name)
            if isinstance(obj, type(sys)):
                expected = {obj.__name__}
            else:
                expected = {f'{owner}.{name}' for owner in conf['apimodule_order']
                            if getattr(importlib.import_module(owner), name, None) is obj}
            if not expected & ids:
                missing.append(f'{modname}.{name}')
    assert not missing, f'public names without an API entry: {missing}'
    pages = {p.stem for p in (site / 'api').glob('*.html')}
    assert set(conf['apimodule_order']) <= pages
