"""A benchmark's results: one JSON file with the machine it ran on, and the result of a part
run in a fresh process (so that its peak memory is its own)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys


def default_path(name: str) -> str:
    """``benchmarks/results/<name>.json``, where every benchmark writes by default (not tracked)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', f'{name}.json')


def write_results(path: str, **content) -> None:
    """Write ``{'machine': {...}, **content}`` to ``path`` as JSON (creating its folder)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    machine = dict(platform=platform.platform(), cpus=os.cpu_count(),
                   python=platform.python_version())
    machine.update(content.pop('machine', {}))
    with open(path, 'w') as f:
        json.dump(dict(machine=machine, **content), f, indent=2)
    print(f'wrote {path}', file=sys.stderr)


def run_fresh(script: str, argv: list) -> dict:
    """Run ``script`` with ``argv`` in a fresh Python process; the JSON object its last line
    of output holds. A failing run raises ``RuntimeError`` with the end of its stderr."""
    done = subprocess.run([sys.executable, os.path.abspath(script), *argv],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f'{" ".join(argv)} failed:\n{done.stderr[-3000:]}')
    return json.loads(done.stdout.strip().splitlines()[-1])
