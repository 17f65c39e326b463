"""The README example and the quickstart notebook run as written."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path):
    script = tmp_path / 'example.py'
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_readme_example_runs(tmp_path):
    readme = (ROOT / 'README.md').read_text()
    blocks = re.findall(r'```python\n(.*?)```', readme, flags=re.S)
    assert blocks, 'README has no python example'
    out = _run(blocks[0], tmp_path)
    assert 'exact (instantaneous' in out and 'approximate trace' in out   # report() printed


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path):
    nb = json.loads((ROOT / 'notebooks' / 'quickstart.ipynb').read_text())
    code = '\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code')
    out = _run(code, tmp_path)
    assert 'cosine to BPTT' in out and 'DimensionMismatchError' in out
