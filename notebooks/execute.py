"""Execute the research notebooks and store their outputs in place.

Usage (from the repository root)::

    python3 notebooks/execute.py                  # every notebook, full size, outputs written
    python3 notebooks/execute.py memory_time      # only notebooks/memory_time.ipynb
    python3 notebooks/execute.py --small          # test-suite size; outputs are not written

The committed notebooks carry the outputs of a full-size run; re-run this after
a library change so that the figures and numbers they show stay measured. Each
notebook reads ``BRAINTRACE_CONV_SMALL`` in its first cell: ``1`` shrinks data,
models and sweeps so that the test suite (``tests/test_notebooks.py``) can
execute every cell in about a minute per notebook.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent
SMALL_ENV = 'BRAINTRACE_CONV_SMALL'


def notebooks() -> list[Path]:
    """Every notebook of the directory, in name order."""
    return sorted(NOTEBOOK_DIR.glob('*.ipynb'))


def _merge_streams(nb: nbformat.NotebookNode) -> None:
    """Join consecutive stdout (or stderr) outputs of a cell into one, as a front end shows
    them: a loop that prints while it computes otherwise stores one output per line."""
    for cell in nb.cells:
        merged = []
        for out in cell.get('outputs', []):
            if (merged and out.output_type == 'stream' and merged[-1].output_type == 'stream'
                    and merged[-1].name == out.name):
                merged[-1].text += out.text
            else:
                merged.append(out)
        if cell.cell_type == 'code':
            cell.outputs = merged


def execute(path: Path, *, small: bool, timeout: int = 900) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` in a fresh kernel and return it with
    its outputs and ``metadata['braintrace_conv']['small']`` (the file is not touched).
    Raises ``nbclient.exceptions.CellExecutionError`` naming the cell when one fails;
    ``timeout`` is per cell, seconds."""
    nb = nbformat.read(path, as_version=4)
    previous = os.environ.get(SMALL_ENV)
    os.environ[SMALL_ENV] = '1' if small else '0'     # the kernel inherits the environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name='python3', record_timing=False,
                       resources={'metadata': {'path': str(path.parent)}}).execute()
    finally:
        if previous is None:
            del os.environ[SMALL_ENV]
        else:
            os.environ[SMALL_ENV] = previous
    _merge_streams(nb)
    nb.metadata['braintrace_conv'] = {'small': small}
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('names', nargs='*', help='notebook names without .ipynb (default: all)')
    parser.add_argument('--small', action='store_true',
                        help=f'run with {SMALL_ENV}=1 and do not write the outputs')
    args = parser.parse_args(argv)
    paths = notebooks()
    if args.names:
        known = {p.stem: p for p in paths}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            parser.error(f'no notebook named {unknown}; known: {sorted(known)}')
        paths = [known[n] for n in args.names]
    for path in paths:
        start = time.perf_counter()
        nb = execute(path, small=args.small)
        if not args.small:
            nbformat.write(nb, path)
        print(f'{path.name}: {time.perf_counter() - start:.1f} s'
              f'{"" if args.small else ", outputs written"}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
