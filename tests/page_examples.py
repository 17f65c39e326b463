"""The examples of a Markdown page, run as a reader would copy them.

A page's examples are its fenced ``python`` blocks and its ``bash`` blocks, taken in page
order and run in one directory (the reader's working directory, empty at the start). The
python blocks share one namespace, as in one interpreter session; every command of a bash
block runs in one shell per block, so that an ``export`` holds for the lines below it. A
``{code-block} python`` with a ``:caption:`` is a file the page's commands run: it is
written to that file name, not executed.

An HTML comment on the line before a fence (invisible on GitHub and in the built docs)
marks the block:

* ``<!-- example: fragment -->``: not run, only checked for syntax (a part of a larger
  program, an install line, commands for several machines);
* ``<!-- example: slow -->``: a long run, skipped unless ``--slow`` is given.

The ``braintrace-conv`` commands of a block that is not run are still parsed by the
command's parser, so that an option renamed or removed shows on the page's line.

Run as ``python3 page_examples.py PAGE [--slow]`` in the directory to run it in. A failure
prints ``PAGE:LINE: what failed`` (the page's own line numbers) and exits 1. The commands
``braintrace-conv`` and ``python3`` are this interpreter's. ``python3 page_examples.py
--serve`` runs pages on request instead, each in a fresh process (see :func:`serve`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback

MARKERS = ('fragment', 'slow')
_FENCE = re.compile(r'^(`{3,})\s*(\S*)\s*(.*)$')
_MARKER = re.compile(r'^<!--\s*example:\s*(\S+)[^>]*-->\s*$')
_OPTION = re.compile(r'^:(\w[\w-]*):\s*(.*)$')
_BACKGROUND = re.compile(r'(?<![&|])&\s*(#.*)?$')   # a command ending in a lone '&'
_FAILED = 'PAGE-EXAMPLE-FAILED'
ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Block:
    language: str       # 'python' or 'bash'
    line: int           # page line of the block's first code line (1-based)
    code: str
    marker: str | None  # 'fragment', 'slow' or None
    file: str | None    # a file to write the block to, from its caption


class PageError(ValueError):
    """A page whose blocks cannot be read: an unclosed fence or an unknown marker."""


def blocks(path) -> list[Block]:
    """The python and bash blocks of the Markdown page ``path``, in page order."""
    lines = pathlib.Path(path).read_text().splitlines()
    page = display_name(path)
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        ticks, info, rest = fence.groups()
        language, file = info, None
        if info in ('{code-block}', '{code}'):
            language = rest.split()[0] if rest else ''
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        if end is None:
            raise PageError(f'{page}:{i + 1}: the fence opened here is never closed')
        body, first = lines[i + 1:end], i + 2
        if info.startswith('{'):              # directive options, then an optional blank line
            while body and _OPTION.match(body[0]):
                key, value = _OPTION.match(body[0]).groups()
                file = value.strip() if key == 'caption' else file
                body, first = body[1:], first + 1
            if body and not body[0].strip():
                body, first = body[1:], first + 1
        if language in ('python', 'bash'):
            found.append(Block(language, first, '\n'.join(body) + '\n', _marker(page, lines, i),
                               file if language == 'python' else None))
        i = end + 1
    return found


def _marker(page, lines, fence_index):
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    match = _MARKER.match(lines[j].strip()) if j >= 0 else None
    if match is None:
        return None
    if match.group(1) not in MARKERS:
        raise PageError(f'{page}:{j + 1}: unknown example marker {match.group(1)!r}; the markers '
                        f'are {", ".join(MARKERS)}')
    return match.group(1)


def commands(block: Block) -> list[tuple[int, str]]:
    """``(page line, command)`` for each command of a bash block: a line, with the lines that
    continue it (a trailing backslash, an open quote); comment lines and blank lines dropped."""
    out, pending, start = [], [], None
    for offset, text in enumerate(block.code.splitlines()):
        if not pending and (not text.strip() or text.lstrip().startswith('#')):
            continue
        if not pending:
            start = block.line + offset
        pending.append(text)
        joined = '\n'.join(pending)
        if joined.endswith('\\') or not _complete(joined):
            continue
        out.append((start, joined))
        pending = []
    if pending:
        out.append((start, '\n'.join(pending)))
    return out


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:                    # a quote still open: the command goes on
        return False
    return True


def _script(block: Block) -> str:
    """The bash block as a script that stops at the first failing command and names its
    page line; a command sent to the background with ``&`` is waited for at the end."""
    parts = [f'__fail() {{ echo "{_FAILED} $1 $2" >&2; exit 1; }}']
    background = []
    for line, command in commands(block):
        parts.append(command)
        if _BACKGROUND.search(command):
            parts.append(f'__pid_{line}=$!')
            background.append(line)
        else:
            parts.append(f'__status=$?; [ $__status -eq 0 ] || __fail {line} $__status')
    parts += [f'wait $__pid_{line} || __fail {line} $?' for line in background]
    return '\n'.join(parts) + '\n'


def _run_bash(block: Block, env: dict) -> subprocess.CompletedProcess:
    """Run a bash block's script in a process group of its own, which a time limit (a
    ``TimeoutError`` from ``SIGALRM``) ends whole, the commands it started included."""
    with subprocess.Popen(['bash', '-c', _script(block)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate()
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _shims(folder: pathlib.Path) -> None:
    """``braintrace-conv`` and ``python3`` as this interpreter runs them."""
    python = shlex.quote(sys.executable)
    for name, line in (('python3', f'exec {python} "$@"'),
                       ('braintrace-conv', f'exec {python} -m braintrace_conv.cli "$@"')):
        (folder / name).write_text(f'#!/bin/sh\n{line}\n')
        (folder / name).chmod(0o755)


def _python_error(page: str, block: Block, error: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == page]
    line = frames[-1].lineno if frames else block.line
    trace = ''.join(traceback.format_exception(error))
    return f'{page}:{line}: raised {type(error).__name__}: {error}\n{trace}'


def _bash_error(page: str, block: Block, proc) -> str:
    failed = re.findall(rf'^{_FAILED} (\d+) (\d+)$', proc.stderr, flags=re.M)
    line, status = failed[-1] if failed else (block.line, proc.returncode)
    command = dict(commands(block)).get(int(line), '')
    stderr = proc.stderr.replace(f'{_FAILED} {line} {status}\n', '')
    output = proc.stdout[-2000:] + stderr[-4000:]
    return f'{page}:{line}: `{command}` exited with status {status}\n{output}'


def check_syntax(page: str, block: Block) -> str | None:
    """An error message for a block that does not parse, else ``None``."""
    if block.language == 'python':
        try:
            compile('\n' * (block.line - 1) + block.code, page, 'exec')
        except SyntaxError as error:
            return f'{page}:{error.lineno}: {error.msg}'
        return None
    proc = subprocess.run(['bash', '-n'], input=block.code, capture_output=True, text=True)
    if proc.returncode:
        return f'{page}:{block.line}: the bash block does not parse: {proc.stderr.strip()}'
    return None


def check_options(page: str, block: Block) -> str | None:
    """An error message for a ``braintrace-conv`` command of the bash block whose command
    line the command's parser refuses (an unknown option, a value of the wrong form), else
    ``None``. Nothing is run: only the command line is read."""
    from braintrace_conv.cli.parser import UsageError, build_parser
    for line, command in commands(block):
        words = shlex.split(command.replace('\\\n', ''), comments=True)   # joined lines
        for start in (i for i, word in enumerate(words) if word == 'braintrace-conv'):
            argv = []
            for word in words[start + 1:]:
                if word in ('&&', '||', ';', '|', '&'):
                    break
                argv.append(word)
            if '--help' in argv or '-h' in argv:
                continue
            try:
                build_parser().parse_args(argv)
            except UsageError as error:
                return f'{page}:{line}: `{command}` is refused: {error}'
    return None


def display_name(path) -> str:
    """``path`` relative to the repository (``docs/guide/training.md``) when it lies in it."""
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run_page(path, *, slow: bool = False) -> int:
    """Run the examples of the page ``path`` in the current directory; 0, or 1 after printing
    the first failure as ``PAGE:LINE: ...`` to stderr."""
    page = display_name(path)
    try:
        found = blocks(path)
    except PageError as error:
        print(error, file=sys.stderr)
        return 1
    os.environ['MPLBACKEND'] = 'Agg'           # figures are saved, never shown
    env = dict(os.environ)                      # not changed by the python blocks
    namespace = {'__name__': '__main__'}
    with tempfile.TemporaryDirectory(prefix='page-examples-') as tools:
        _shims(pathlib.Path(tools))
        env['PATH'] = f'{tools}{os.pathsep}{env.get("PATH", "")}'
        for block in found:
            error = check_syntax(page, block)
            if error:
                print(error, file=sys.stderr)
                return 1
            if block.marker == 'fragment' or (block.marker == 'slow' and not slow):
                error = check_options(page, block) if block.language == 'bash' else None
                if error:
                    print(error, file=sys.stderr)
                    return 1
                continue
            if block.file:
                pathlib.Path(block.file).write_text(block.code)
            elif block.language == 'python':
                try:
                    exec(compile('\n' * (block.line - 1) + block.code, page, 'exec'), namespace)
                except BaseException as error:   # noqa: B036 - a reader's SystemExit fails too
                    print(_python_error(page, block, error), file=sys.stderr)
                    return 1
            else:
                try:
                    proc = _run_bash(block, env)
                except TimeoutError as error:
                    print(f'{page}:{block.line}: the block stopped: {error}', file=sys.stderr)
                    return 1
                sys.stdout.write(proc.stdout)
                if proc.returncode:
                    print(_bash_error(page, block, proc), file=sys.stderr)
                    return 1
    return 0


def serve(workers: int = 2) -> None:
    """Run pages on request, ``workers`` at a time. Each line of stdin is a JSON list
    ``[id, page, directory, slow, timeout_s]``; each page run in its ``directory`` is
    answered, in the order they finish, by a line ``{"id", "returncode", "stdout",
    "stderr"}`` on stdout. Each page runs in a child forked from this process after it has
    imported the library, before JAX has started a backend: a fresh session, as a reader's,
    without importing JAX again for each page. A page that runs past ``timeout_s`` fails."""
    os.environ['MPLBACKEND'] = 'Agg'                 # before the library imports matplotlib
    import braintrace_conv  # noqa: F401 - what every page imports, once
    import optax  # noqa: F401
    waiting, running, unread, closed = [], {}, b'', False
    while waiting or running or not closed:
        while waiting and len(running) < workers:
            request_id, *request = waiting.pop(0)
            running.update(_start(request_id, *request))
        if not closed and select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 1 << 16)
            closed = not chunk
            *lines, unread = (unread + chunk).split(b'\n')
            waiting += [json.loads(line) for line in lines if line.strip()]
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            request_id, out, err = running.pop(pid)
            with out, err:
                out.seek(0)
                err.seek(0)
                reply = {'id': request_id, 'returncode': os.waitstatus_to_exitcode(status),
                         'stdout': out.read(), 'stderr': err.read()}
            sys.stdout.write(json.dumps(reply) + '\n')
            sys.stdout.flush()
        if closed and running:
            time.sleep(0.05)


def _start(request_id, page, directory, slow, timeout_s) -> dict:
    """Fork a child that runs ``page`` in ``directory``, its output into two files;
    ``{pid: (request_id, stdout file, stderr file)}``."""
    out, err = tempfile.TemporaryFile('w+'), tempfile.TemporaryFile('w+')
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return {pid: (request_id, out, err)}
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)   # the requests are not the page's input
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    returncode = 1
    try:
        signal.signal(signal.SIGALRM, _timed_out)
        signal.alarm(timeout_s)
        os.chdir(directory)
        returncode = run_page(page, slow=slow)
    except BaseException:                           # noqa: B036 - reported, never lost
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(returncode)


def _timed_out(signum, frame):
    raise TimeoutError('the page ran past its time limit')


if __name__ == '__main__':
    args = sys.argv[1:]
    if args == ['--serve']:
        serve()
    else:
        sys.exit(run_page(args[0], slow='--slow' in args[1:]))
