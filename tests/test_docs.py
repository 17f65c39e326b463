"""The examples of the README and the documentation pages (python blocks and shell commands)
and of the package's docstrings run as written; the site builds with warnings as errors and
documents every public name."""
import doctest
import importlib
import importlib.util
import json
import pathlib
import re
import runpy
import subprocess
import sys
import tempfile
import time

import pytest

import page_examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
THEORY_ANCHORS = ('notation', 'd-rtrl', 'old-state', 'neuron-parameters', 'conv-kernel-trace',
                  'es-d-rtrl', 'rule-contract', 'windows', 'exactness')


# ------------------------------------------------------------------------- page examples
def _pages() -> list:
    """README.md and the Markdown pages of docs/ that hold python or bash blocks."""
    paths = [ROOT / 'README.md', *sorted(DOCS.rglob('*.md'))]
    return [p.relative_to(ROOT).as_posix() for p in paths
            if '_build' not in p.parts and page_examples.blocks(p)]


PAGES = _pages()
SLOW_PAGES = [p for p in PAGES if any(b.marker == 'slow' for b in page_examples.blocks(ROOT / p))]
# What a page's examples print that says they did what the page claims.
PRINTED = {'README.md': ('exact (instantaneous', 'approximate trace')}   # learner.report()


class PageRunner:
    """Runs pages' examples through ``page_examples.serve``: each page in a fresh process
    (forked from one that has imported the library), two at a time. ``ahead`` maps a page
    submitted before its test to its request."""

    def __init__(self):
        self.server = subprocess.Popen([sys.executable, str(page_examples.__file__), '--serve'],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.submitted, self.replies, self.ahead = {}, {}, {}

    def submit(self, page, directory, *, slow=False, timeout=900) -> str:
        """Start running ``page``'s examples in ``directory``; the request's id."""
        request_id = f'{len(self.submitted)}:{page}'
        self.submitted[request_id] = str(page)
        self.server.stdin.write(json.dumps([request_id, str(page), str(directory), slow,
                                            timeout]) + '\n')
        self.server.stdin.flush()
        return request_id

    def result(self, request_id) -> subprocess.CompletedProcess:
        """The finished run of a submitted page, once it has finished."""
        while request_id not in self.replies:
            line = self.server.stdout.readline()
            assert line, f'the page server stopped (exit status {self.server.wait()})'
            reply = json.loads(line)
            self.replies[reply['id']] = reply
        reply = self.replies.pop(request_id)
        return subprocess.CompletedProcess(self.submitted[request_id], reply['returncode'],
                                           reply['stdout'], reply['stderr'])

    def run(self, page, directory, **options) -> subprocess.CompletedProcess:
        return self.result(self.submit(page, directory, **options))

    def close(self):
        self.server.stdin.close()
        self.server.wait()


@pytest.fixture(scope='module')
def page_runner(request, tmp_path_factory):
    """A ``PageRunner`` that has already submitted every page that this session's
    ``test_page_examples_run`` will check, each in an empty directory of its own, so that
    the pages run ahead of their tests."""
    runner = PageRunner()
    for item in request.session.items:
        if getattr(item, 'originalname', None) == 'test_page_examples_run':
            page = item.callspec.params['page']
            directory = tmp_path_factory.mktemp(f'page-{pathlib.Path(page).stem}')
            runner.ahead[page] = runner.submit(ROOT / page, directory)
    yield runner
    runner.close()


@pytest.mark.parametrize('page', PAGES)
def test_page_examples_run(page, page_runner, tmp_path):
    """The python blocks and shell commands of a page run in page order, from an empty
    directory, as written (long runs are marked and run under ``-m slow``)."""
    request_id = page_runner.ahead.pop(page, None) or page_runner.submit(ROOT / page, tmp_path)
    proc = page_runner.result(request_id)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for text in PRINTED.get(page, ()):
        assert text in proc.stdout, f'{page} no longer prints {text!r}'


@pytest.mark.slow
@pytest.mark.parametrize('page', SLOW_PAGES)
def test_page_examples_run_with_the_long_ones(page, tmp_path, page_runner):
    """The whole page, its long runs included."""
    proc = page_runner.run(ROOT / page, tmp_path, slow=True, timeout=4 * 3600)
    assert proc.returncode == 0, proc.stderr[-6000:]


SYNTHETIC_PAGE = """\
# A page

```python
import os
seen = os.listdir('.')          # runs in the page's directory, empty at the start
```

<!-- example: fragment -->
```python
not_defined_anywhere            # a fragment: parsed, never run
```

<!-- example: slow -->
```bash
exit 3
braintrace-conv train --epochs 2 --out runs/long   # not run, but its options are read
```

```bash
export GREETING=hello
python3 -c "import os; open('made.txt', 'w').write(os.environ['GREETING'])"
true &
```

```python
assert seen == [] and open('made.txt').read() == 'hello'   # page order, one namespace
```

```bash
test -f made.txt
braintrace-conv train --no-such-option
```
"""


def _line(text: str) -> int:
    """The line of the synthetic page that starts with ``text``."""
    return next(n for n, line in enumerate(SYNTHETIC_PAGE.splitlines(), 1)
                if line.startswith(text))


def test_a_broken_example_is_named_by_page_and_line(tmp_path, page_runner):
    """Blocks run in page order in one directory and namespace, markers are obeyed, and the
    first failure names the page and its line: a command, a python block, a background job."""
    page, run = tmp_path / 'page.md', tmp_path / 'run'
    run.mkdir()
    page.write_text(SYNTHETIC_PAGE)
    proc = page_runner.run(page, run)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f'{page}:{_line("braintrace-conv train --no")}: '
                                  f'`braintrace-conv train --no-such-option` exited with status '
                                  f'2'), proc.stderr
    assert 'unrecognized arguments: --no-such-option' in proc.stderr   # the command's error

    for old, new, failure in (
            ('true &', 'false &', f'{_line("true &")}: `false &` exited with status 1'),
            ("'hello'", "'bye'", f'{_line("assert seen")}: raised AssertionError'),
            ('--epochs 2', '--epoch-count 2',
             f"{_line('braintrace-conv train --epochs')}: `braintrace-conv train --epoch-count "
             f"2 --out runs/long   # not run, but its options are read` is refused: "
             f"unrecognized arguments: --epoch-count 2"),
            ('example: slow', 'example: slowly',
             f"{_line('<!-- example: slow')}: unknown example marker 'slowly'")):
        page.write_text(SYNTHETIC_PAGE.replace(old, new))
        for made in run.iterdir():
            made.unlink()
        proc = page_runner.run(page, run)
        assert proc.returncode == 1 and f'{page}:{failure}' in proc.stderr, proc.stderr


def test_a_page_past_its_time_limit_fails_naming_the_block(tmp_path, page_runner):
    """The block that runs past the time limit is named, and the commands it started end."""
    page = tmp_path / 'page.md'
    page.write_text('# A page\n\n```bash\nsleep 61 &\necho $! > sleeper.pid\nsleep 62\n```\n')
    start = time.monotonic()
    proc = page_runner.run(page, tmp_path, timeout=1)
    assert time.monotonic() - start < 30               # not after the commands' 60 s
    assert proc.returncode == 1
    assert proc.stderr.startswith(f'{page}:4: the block stopped: the page ran past its time '
                                  f'limit'), proc.stderr
    sleeper = pathlib.Path('/proc', (tmp_path / 'sleeper.pid').read_text().strip(), 'stat')
    for _ in range(50):         # killed: gone, or a zombie ('Z') until its new parent reaps it
        if not sleeper.exists() or sleeper.read_text().split(')')[-1].split()[0] == 'Z':
            break
        time.sleep(0.1)
    else:
        pytest.fail("the page's background command was left running")


def test_the_markers_do_not_show_in_the_built_pages(site):
    html = (site / 'guide' / 'training.html').read_text()
    assert 'example: slow' not in re.sub(r'<!--.*?-->', '', html, flags=re.S)


# -------------------------------------------------------------------- docstring examples
def _modules_with_examples() -> list:
    names = []
    for path in sorted((ROOT / 'braintrace_conv').rglob('*.py')):
        if '>>>' in path.read_text():
            parts = path.relative_to(ROOT).with_suffix('').parts
            names.append('.'.join(parts[:-1] if parts[-1] == '__init__' else parts))
    return names


# Extras (optional dependencies) that the examples of a subpackage import.
EXAMPLE_EXTRAS = {'braintrace_conv.nir': 'nir'}


@pytest.fixture
def as_a_reader(monkeypatch, tmp_path):
    """A reader's session: brainstate's default float32 (the suite runs in float64) and the
    working and temporary directories in ``tmp_path``."""
    import brainstate
    import jax
    precision, x64 = brainstate.environ.get_precision(), jax.config.jax_enable_x64
    brainstate.environ.set(precision=32)
    jax.config.update('jax_enable_x64', False)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield
    brainstate.environ.set(precision=precision)
    jax.config.update('jax_enable_x64', x64)


@pytest.mark.parametrize('module', _modules_with_examples())
def test_docstring_examples_run(module, as_a_reader):
    """Every ``>>>`` example of the package's docstrings runs and prints what it shows."""
    for package, extra in EXAMPLE_EXTRAS.items():
        if module.startswith(package):
            pytest.importorskip(extra)
    tests = doctest.DocTestFinder().find(importlib.import_module(module), module, globs={})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.tries, f'{module}: no example found'
    assert not runner.failures, ''.join(report)


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
