"""Writing a benchmark's results: one JSON file with the machine it ran on."""
from __future__ import annotations

import json
import os
import platform
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
