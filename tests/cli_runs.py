"""Command lines for the tests of the command line (tests/cli/): tiny runs, event formats, and
the check that a refused command is one line and changes nothing."""
import hashlib
import os
import re

import numpy as np

from braintrace_conv.cli import main

#: A run of seconds: one epoch of 48 moving-bars samples of 6 steps, 8 x 8 pixels.
TINY = ['--epochs', '1', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--quiet']
TRAIN = ['train', *TINY]
#: A run of seconds on the recordings of the ``recordings`` fixture.
EVENT_TINY = ['--epochs', '1', '--steps', '8', '--batch-size', '6', '--channels', '2,4',
              '--lr', '2e-2', '--quiet']
# tonic's formats: audio sensors (SHD) store t, x, p; DVS cameras x, y, t, p with a bool polarity
AUDIO = np.dtype([('t', np.int64), ('x', np.int64), ('p', np.int64)])
DVS = np.dtype([('x', np.int16), ('y', np.int16), ('t', np.int64), ('p', bool)])


def files_of(directory) -> dict:
    """Every file's content digest (a link's target) under ``directory``, links unfollowed."""
    def content(path):
        if os.path.islink(path):
            return 'link to ' + os.readlink(path)
        return hashlib.sha256(open(path, 'rb').read()).hexdigest()
    return {os.path.relpath(os.path.join(r, f), directory): content(os.path.join(r, f))
            for r, dirs, names in os.walk(directory) for f in names + dirs
            if os.path.islink(os.path.join(r, f)) or f in names}


def run_files(out) -> dict:
    """:func:`files_of` the run in ``out`` ({} if there is none), leaving out its lock and
    what a run writes before its first checkpoint (hidden)."""
    return {k: v for k, v in files_of(out).items() if not k.startswith('.')} \
        if os.path.exists(out) else {}


def error_line(capsys) -> str:
    """The one error line of a refused command (after its usage line), with no traceback."""
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    usage, error = err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv') and error.startswith('braintrace-conv: ')
    return error


def refused(root, capsys, argv, match) -> None:
    """``braintrace-conv argv`` is a user error: exit code 2, the usage line and one line
    matching ``match``, nothing printed on stdout, and nothing under ``root`` created or
    changed. ``{name}`` in ``argv`` is ``root / name`` (``{root}``: ``root``); a train
    command without ``--out`` writes to ``root / 'new'``."""
    argv = [a.format(root=root, **{p.name: str(p) for p in root.iterdir()}) for a in argv]
    if argv[:1] == ['train'] and '--out' not in argv:
        argv += ['--out', str(root / 'new')]
    before = files_of(root)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    usage, error = captured.err.rstrip('\n').split('\n')
    assert usage.startswith('usage: braintrace-conv'), captured.err
    assert error.startswith('braintrace-conv: error: '), captured.err
    assert 'Traceback' not in captured.err and captured.out == ''
    assert re.search(match, error), error
    assert files_of(root) == before and not (root / 'new').exists()
