"""The files of a run directory, and the rule that a run is never overwritten silently.

A directory that already holds a run (any of :data:`RUN_FILES`) is continued
with ``resume``, replaced with ``overwrite`` (only the files listed here are
removed), and otherwise refused.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

from .._validation import one_of

__all__ = ['LAST_CHECKPOINT', 'BEST_CHECKPOINT', 'METRICS_NAME', 'SCALARS_NAME', 'CURVE_NAME',
           'TENSORBOARD_DIR', 'RUN_FILES', 'CHECKPOINTS', 'run_files', 'check', 'create',
           'checkpoint_file']

#: Checkpoint after the last completed epoch.
LAST_CHECKPOINT = 'checkpoint-last.npz'
#: Checkpoint of the epoch with the best evaluation accuracy so far.
BEST_CHECKPOINT = 'checkpoint-best.npz'
#: Per-epoch summary of the run.
METRICS_NAME = 'metrics.json'
#: Per-step scalars (CSV).
SCALARS_NAME = 'scalars.csv'
#: Loss and accuracy per epoch (PNG).
CURVE_NAME = 'learning_curve.png'
#: TensorBoard event files (when tensorboardX is installed).
TENSORBOARD_DIR = 'tensorboard'
#: Checkpoint names by kind.
CHECKPOINTS = {'best': BEST_CHECKPOINT, 'last': LAST_CHECKPOINT}
#: Everything a run writes (and older versions wrote: ``checkpoint.pkl``).
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, METRICS_NAME, SCALARS_NAME, CURVE_NAME,
             TENSORBOARD_DIR, 'checkpoint.pkl')


def run_files(directory: Union[str, os.PathLike]) -> list:
    """Names of the :data:`RUN_FILES` present in ``directory``."""
    directory = Path(directory)
    return [name for name in RUN_FILES if (directory / name).exists()]


def check(directory: Union[str, os.PathLike], *, resume: bool, overwrite: bool) -> Path:
    """Check, without changing anything, that a run may be written to ``directory``.

    Raises
    ------
    ValueError
        ``resume`` and ``overwrite`` together, or ``directory`` is not a directory.
    FileNotFoundError
        ``resume`` without a :data:`LAST_CHECKPOINT` in ``directory``.
    FileExistsError
        ``directory`` holds a run and neither ``resume`` nor ``overwrite`` is set.
    """
    directory = Path(directory)
    if resume and overwrite:
        raise ValueError('resume and overwrite exclude each other: continue the run in the '
                         'directory, or replace it.')
    if directory.exists() and not directory.is_dir():
        raise ValueError(f'{directory} exists and is not a directory.')
    if resume:
        if not (directory / LAST_CHECKPOINT).is_file():
            raise FileNotFoundError(f'nothing to resume: {directory} has no {LAST_CHECKPOINT}.')
    elif not overwrite:
        found = run_files(directory)
        if found:
            raise FileExistsError(f'{directory} already holds a run ({", ".join(found)}); '
                                  f'pass resume=True to continue it or overwrite=True to '
                                  f'replace it.')
    return directory


def create(directory: Union[str, os.PathLike], *, overwrite: bool) -> Path:
    """Create ``directory`` (with ``overwrite``, first remove the run files in it) and check
    that it is writable; raises ``OSError`` otherwise."""
    directory = Path(directory)
    if overwrite:
        for name in run_files(directory):
            target = directory / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
        pass
    return directory


def checkpoint_file(path: Union[str, os.PathLike], which: Optional[str] = None) -> Path:
    """The checkpoint file ``path``, or in the run directory ``path`` the ``which``
    (``'best'``/``'last'``; ``None``: best if it exists, else last) checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return path
    if which is not None:
        return path / CHECKPOINTS[one_of('which', which, tuple(CHECKPOINTS))]
    for name in CHECKPOINTS.values():
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f'{path} holds no checkpoint ({", ".join(CHECKPOINTS.values())}).')
