"""``braintrace-conv train``: tiny end-to-end runs, resume, overwrite, interruption and the run
directory's lock."""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from braintrace_conv.cli import main
from braintrace_conv.cli.train import SUMMARY
from braintrace_conv.training import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT, SCALAR_COLUMNS,
                                      SCALARS_NAME, Trainer, checkpoint, logs)

from cli_runs import AUDIO, EVENT_TINY, TINY, TRAIN, error_line, files_of, refused, run_files


def cli(*argv, timeout=120, prelude=''):
    """``braintrace-conv argv`` in a fresh process (after the Python code ``prelude``)."""
    code = (f'{prelude}\nimport sys\nfrom braintrace_conv.cli import main\n'
            f'sys.exit(main(sys.argv[1:]))')
    return subprocess.run([sys.executable, '-c', code, *map(str, argv)], capture_output=True,
                          text=True, timeout=timeout)


RUN_DIRECTORIES = [  # refused: nothing on disk is created or changed
    ([*TRAIN, '--out', '{run}'], r'--out .*run already holds a run \(checkpoint-last.npz, '
                                 r'checkpoint-best.npz, .*pass --resume to continue it, '
                                 r'--overwrite to replace it, or --out DIR to write the new run '
                                 r'elsewhere$'),
    ([*TRAIN, '--out', '{run}', '--resume', '--overwrite'],
     'argument --overwrite: not allowed with argument --resume'),
    ([*TRAIN, '--out', '{empty}', '--resume'],
     r'--resume: .*empty has no checkpoint \(checkpoint-last.npz\) to resume'),
    ([*TRAIN, '--out', '{run}', '--resume', '--update-every', '2'],
     r'--resume: the run in .* was trained with other options: --update-every unset \(now 2\); '
     r'give the same options, or another --out'),
    ([*TRAIN, '--out', '{run}', '--resume', '--channels', '4,8', '--task', 'digits'],
     r'other options: --channels 2,4 \(now 4,8\), --task moving-bars \(now digits\)'),
    ([*TRAIN, '--out', '{corrupt}', '--resume'], '--resume: .* is corrupt'),
    ([*TRAIN, '--out', '{pickle}', '--resume'], '--resume: .* never unpickled'),
    ([*TRAIN, '--out', '{file}'], '--out: .*file exists and is not a directory'),
    ([*TRAIN, '--out', '{dangling}'],
     '--out: .*dangling is a symbolic link to .*nowhere, which does not exist'),
    ([*TRAIN, '--out', '{linked}', '--resume'],
     r'--out: .*linked holds symbolic links among its run files \(tensorboard\); run files '
     r'are never written through links'),
    ([*TRAIN, '--out', '/proc/no-such-dir/run'],
     '--out /proc/no-such-dir/run cannot be written: No such file or directory'),
]


@pytest.mark.parametrize('argv, match', RUN_DIRECTORIES)
def test_a_refused_run_directory_is_one_line_and_changes_nothing(root, capsys, argv, match):
    refused(root, capsys, argv, match)

REQUIRED = {'test_accuracy', 'train_loss', 'algorithm', 'task', 'wall_time_s', 'peak_rss_mb',
            'run_config', 'skipped_updates'}


@pytest.mark.parametrize('extra, algorithm', [
    ([], 'ES-D-RTRL'),
    (['--task', 'digits', '--algorithm', 'bptt', '--update-every', '3'], 'BPTT'),
    (['--algorithm', 'd-rtrl', '--window', '3', '--update-every', '3'], 'D-RTRL'),
    (['--tau-adapt', '50', '--exact', 'blocks.1', '--window', '3', '--update-every', '3'],
     'ES-D-RTRL'),
    (['--cross-layer', '1'], 'ES-D-RTRL'),
])
def test_train_smoke(tmp_path, capsys, extra, algorithm):
    assert main(['train', *TINY, *extra, '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert REQUIRED <= set(metrics)
    assert metrics['algorithm'] == algorithm and len(metrics['train_loss']) == 1
    assert 0 <= metrics['test_accuracy'] <= 1 and metrics['peak_rss_mb'] > 0
    assert metrics['run_config']['batch_size'] == 12 and metrics['run_config']['channels'] == [2, 4]
    for name in (CURVE_NAME, SCALARS_NAME, LAST_CHECKPOINT, BEST_CHECKPOINT):
        assert (tmp_path / name).exists(), name
    out = capsys.readouterr().out
    assert 'test accuracy' in out and 'wall time' in out and 'peak RSS' in out
    if '--window' in extra:     # stored with the run, so --resume checks it
        assert metrics['run_config']['window'] == 3
        assert checkpoint.read(tmp_path / LAST_CHECKPOINT)[1]['trainer']['window'] == 3
    if '--exact' in extra:      # adaptive neurons, exact traces for one block: stored too
        assert metrics['run_config']['exact'] == ['blocks.1']
    if '--cross-layer' in extra:    # stored with the run, so --resume checks it
        assert metrics['run_config']['cross_layer'] == 1


def test_delayed_bars_run_keeps_its_task_options(tmp_path, capsys):
    # task defaults: a loss at the last step, tau 5 ms, learning rate 0.002, gradients
    # clipped at norm 1; two trials of 3 steps (a bar for 2, then 1 blank)
    assert main(['train', *TINY, '--task', 'delayed-bars', '--cues', '2', '--delay', '1',
                 '--algorithm', 'bptt', '--out', str(tmp_path)]) == 0
    config = json.loads((tmp_path / 'metrics.json').read_text())['run_config']
    assert {k: config[k] for k in ('task', 'steps', 'cues', 'delay', 'tau', 'loss',
                                   'final_steps', 'lr', 'clip_norm')} == dict(
        task='delayed-bars', steps=6, cues=2, delay=1, tau=5.0, loss='final', final_steps=1,
        lr=0.002, clip_norm=1.0)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(tmp_path)]) == 0     # rebuilt from the stored options
    assert 'delayed-bars, 16 test samples' in capsys.readouterr().out


def test_resuming_a_finished_run_says_so_and_changes_nothing(run, capsys):
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(['train', *TINY, '--out', str(run), '--resume']) == 0
    assert 'already finished (1/1 epochs); nothing to do' in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def locked_for_others(directory) -> bool:
    """Whether another process would find the run directory locked: its advisory lock
    tried through a new open file description, as another process tries it."""
    import fcntl

    try:
        fd = os.open(directory / '.lock', os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def test_overwrite_replaces_the_run_holding_its_lock_to_the_last_write(run, tmp_path,
                                                                        monkeypatch):
    out = tmp_path / 'run'
    out.mkdir()
    for p in run.iterdir():
        if p.is_file():
            (out / p.name).write_bytes(p.read_bytes())
    (out / 'notes.txt').write_text('mine')
    seen, write_metrics, fit = [], logs.write_metrics, Trainer.fit

    def watched_write(directory, metrics):
        seen.append(('final metrics' if 'wall_time_s' in metrics else 'metrics',
                     locked_for_others(directory)))
        write_metrics(directory, metrics)

    def watched_fit(self, *args, out_dir, **kwargs):
        history = fit(self, *args, out_dir=out_dir, **kwargs)
        seen.append(('fit returned', locked_for_others(out_dir)))
        return history

    monkeypatch.setattr(logs, 'write_metrics', watched_write)
    monkeypatch.setattr(Trainer, 'fit', watched_fit)
    assert main(['train', *TINY, '--seed', '1', '--out', str(out), '--overwrite']) == 0
    assert checkpoint.read(out / LAST_CHECKPOINT)[1]['run']['seed'] == 1
    assert (out / 'notes.txt').read_text() == 'mine'
    # no other process can take the directory between the epoch and the command's last write
    assert seen == [('metrics', True), ('fit returned', True), ('final metrics', True)]
    assert sorted(os.listdir(out)) == sorted([*os.listdir(run), 'notes.txt'])


@pytest.mark.parametrize('epochs_done, hint', [
    (0, 'no checkpoint was written, and nothing was kept'),
    (2, 'epochs 1-2 are saved in .*; rerun with --resume and the same options to continue'),
])
def test_interrupt_says_how_to_continue(tmp_path, capsys, monkeypatch, epochs_done, hint):
    from braintrace_conv.training import Trainer

    def interrupted(self, *args, out_dir, **kwargs):
        self.epoch = epochs_done
        if epochs_done:                 # its checkpoint moved in
            (out_dir / LAST_CHECKPOINT).write_bytes(b'checkpoint')
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, 'fit', interrupted)
    assert main(['train', *TINY, '--out', str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert re.fullmatch(f'braintrace-conv: interrupted; {hint}\n', err), err
    if not epochs_done:     # the run left nothing behind: no --overwrite needed to rerun
        assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize('task, target', [('moving-bars', 0.90), ('digits', 0.85)])
def test_default_run_reaches_target_accuracy(tmp_path, task, target):
    assert main(['train', '--task', task, '--quiet', '--out', str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    assert metrics['test_accuracy'] >= target
    assert metrics['wall_time_s'] < 600


def copy_of(run, out):
    shutil.copytree(run, out, ignore=shutil.ignore_patterns('tensorboard'))
    return out


def test_resume_repairs_an_interrupted_end_and_extends_a_finished_run(run, tmp_path, capsys):
    out = copy_of(run, tmp_path / 'run')
    metrics = (out / 'metrics.json').read_bytes()
    (out / 'metrics.json').unlink()                 # killed before its final metrics write
    (out / '.checkpoint-last.npz.abcd.tmp').write_bytes(b'partial')
    capsys.readouterr()
    assert main(['train', *TINY, '--out', str(out), '--resume']) == 0
    assert 'was interrupted while writing its files; repairing metrics.json, ' \
           '.checkpoint-last.npz.abcd.tmp' in capsys.readouterr().out
    assert json.loads((out / 'metrics.json').read_bytes())['history'] == \
        json.loads(metrics)['history']
    assert not (out / '.checkpoint-last.npz.abcd.tmp').exists()
    epochs = TINY.index('--epochs') + 1
    longer = [*TINY[:epochs], '2', *TINY[epochs + 1:]]
    assert main(['train', *longer, '--out', str(out), '--resume']) == 0
    assert 'extending the run in' in capsys.readouterr().out
    meta = checkpoint.read(out / LAST_CHECKPOINT)[1]
    assert meta['epoch'] == 2 and meta['run']['epochs'] == 2
    assert main(['train', *longer, '--out', str(out), '--resume']) == 0
    assert 'already finished (2/2 epochs)' in capsys.readouterr().out
    assert main(['train', *TINY, '--out', str(out), '--resume']) == 2     # fewer: another run
    assert 'other options: --epochs 2 (now 1)' in error_line(capsys)


# killed right after this write of the last epoch (a fresh process, its write functions
# wrapped): the curve, or the epoch's metrics.json before the command adds its summary
KILLED_AFTER = {
    'write_curve': 'len(args[1]) == 2',
    'write_metrics': "args[1]['epochs_completed'] == 2 and 'wall_time_s' not in args[1]",
}


@pytest.mark.parametrize('write', KILLED_AFTER)
def test_a_run_killed_in_its_last_writes_is_repaired_on_resume(tmp_path, capsys, write):
    out = tmp_path / 'run'      # killed in float64, the precision of the suite that resumes it
    prelude = (f'import os, signal\nimport braintrace_conv\nbraintrace_conv.use_float64()\n'
               f'from braintrace_conv.training import logs\n'
               f'write = logs.{write}\n'
               f'def killed(*args):\n    write(*args)\n'
               f'    if {KILLED_AFTER[write]}:\n        os.kill(os.getpid(), signal.SIGKILL)\n'
               f'logs.{write} = killed')
    epochs = [*TINY[:TINY.index('--epochs') + 1], '2', *TINY[TINY.index('--epochs') + 2:]]
    assert cli('train', *epochs, '--out', out, prelude=prelude).returncode == -9
    capsys.readouterr()
    assert main(['train', *epochs, '--out', str(out), '--resume']) == 0
    assert 'was interrupted while writing its files; repairing metrics.json' in \
        capsys.readouterr().out
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['epochs_completed'] == 2 and set(SUMMARY) <= set(metrics)
    logs.write_curve(tmp_path, metrics['history'],                 # the curve of epoch 2
                     logs.run_title({**metrics['run_config'], **metrics}))
    assert (out / CURVE_NAME).read_bytes() == (tmp_path / CURVE_NAME).read_bytes()
    assert main(['train', *epochs, '--out', str(out), '--resume']) == 0
    assert 'already finished (2/2 epochs); nothing to do' in capsys.readouterr().out


def test_a_locked_run_directory_names_its_holder(run, tmp_path, capsys):
    out = copy_of(run, tmp_path / 'run')
    hold = ('import sys, time\nfrom braintrace_conv.training import run_dir\n'
            'with run_dir.locked(sys.argv[1]):\n    print("locked", flush=True)\n'
            '    time.sleep(120)\n')
    holder = subprocess.Popen([sys.executable, '-c', hold, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == 'locked\n'
        for flag in ('--resume', '--overwrite'):
            assert main(['train', *TINY, '--out', str(out), flag]) == 2
            assert re.search(rf'--out: .*run is in use: another process \(pid {holder.pid}\) is '
                             rf'writing a run in it', error_line(capsys))
    finally:
        holder.kill()
        holder.wait()
    assert (out / LAST_CHECKPOINT).read_bytes() == (run / LAST_CHECKPOINT).read_bytes()


def test_a_lock_file_that_is_no_regular_file_is_named_and_never_waited_for(tmp_path, capsys):
    out = tmp_path / 'run'
    out.mkdir()
    os.mkfifo(out / '.lock')        # opened for reading, a FIFO blocks until a writer comes
    done = cli('train', *TINY, '--out', out, timeout=60)
    assert done.returncode == 2 and 'Traceback' not in done.stderr
    assert done.stderr.endswith(f'error: --out: the lock file {out}/.lock is a FIFO, not a '
                                f'regular file; remove it to write a run in {out}.\n'), done.stderr
    for kind, make in (('a symbolic link', lambda p: p.symlink_to(tmp_path / 'elsewhere')),
                       ('a directory', lambda p: p.mkdir())):
        out = tmp_path / kind.split()[-1]
        out.mkdir()
        make(out / '.lock')
        assert main(['train', *TINY, '--out', str(out)]) == 2
        assert error_line(capsys) == (f'braintrace-conv: error: --out: the lock file '
                                      f'{out}/.lock is {kind}, not a regular file; remove it to '
                                      f'write a run in {out}.')
        assert os.listdir(out) == ['.lock'] and not (tmp_path / 'elsewhere').exists()


def test_without_fcntl_a_lock_left_on_another_host_names_the_file_to_remove(tmp_path):
    out = tmp_path / 'run'
    out.mkdir()
    (out / '.lock').write_text('4242 otherhost 0123\n')    # a day old: its host crashed
    os.utime(out / '.lock', (time.time() - 86400,) * 2)
    done = cli('train', *TINY, '--out', out, prelude="import sys; sys.modules['fcntl'] = None")
    assert done.returncode == 2 and 'Traceback' not in done.stderr
    assert done.stderr.endswith(
        f'error: --out: {out} is in use: another process (pid 4242 on otherhost) is writing a '
        f'run in it; wait for it to end or stop it; if it no longer runs on otherhost, remove '
        f'its lock file {out}/.lock (written 24.0 h ago).\n'), done.stderr
    assert os.listdir(out) == ['.lock']


def test_a_run_directory_removed_during_the_run_is_said_so(tmp_path):
    out = tmp_path / 'run'
    run = run_cli(out)
    deadline = time.monotonic() + 300
    while not (out / LAST_CHECKPOINT).exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.rename(out, tmp_path / 'removed')    # as a user removing it sees it: gone at once
    shutil.rmtree(tmp_path / 'removed', ignore_errors=True)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 1 and 'Traceback' not in err, err
    assert err == (f'braintrace-conv: error: the run directory {out} was removed or replaced '
                   f'while this process was writing a run in it (its lock file .lock is no '
                   f'longer the one it holds); nothing more is written there.\n')
    assert not out.exists()     # never created again


@pytest.mark.parametrize('options, remedy', [
    (['--lr', '1e300'], r'lower --lr \(now 1e\+300\)'),
    (['--rate-target', '0.1', '--rate-strength', '1e300'],
     r'the loss was not finite for any batch; lower --rate-strength \(now 1e\+300\)'),
])
def test_an_impossible_setting_is_named(tmp_path, options, remedy):
    # in float32 (the default; the suite runs in float64) every update overflows
    done = cli('train', *TINY, *options, '--out', tmp_path)
    assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr
    assert re.search(r'warning: all \d+ updates were skipped for non-finite values, so the model '
                     rf'did not learn; {remedy}\n', done.stderr), done.stderr


def test_progress_off_a_terminal_is_plain_lines(tmp_path, capsys):
    argv = ['train', *[a for a in TINY if a != '--quiet'], '--out', str(tmp_path)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert '\r' not in captured.err + captured.out
    assert re.search(r'^epoch 1/1: train loss .*\n', captured.out, re.M)


def test_train_and_evaluate_with_a_sequence_loss(tmp_path, capsys):
    out = tmp_path / 'run'
    assert main(['train', *TINY, '--loss', 'count-mse', '--target-rates', '0.9', '0.1',
                 '--out', str(out)]) == 0
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['loss'] == 'count_mse' and metrics['target_rates'] == [0.9, 0.1]
    assert metrics['run_config']['target_rates'] == [0.9, 0.1]
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 0
    assert 'test loss' in capsys.readouterr().out
    assert main(['train', *TINY, '--loss', 'max-membrane', '--update-every', '2',
                 '--out', str(tmp_path / 'online')]) == 2
    assert ("--loss must be a per-step loss (every_step, final) with --update-every (2), got "
            "'max_membrane'; a loss of the whole sequence needs the outputs of every step."
            in capsys.readouterr().err)


def test_train_with_the_rate_regulariser(tmp_path):
    out = tmp_path / 'run'
    assert main(['train', *TINY, '--rate-target', '0.02', '0.05', '--rate-strength', '3',
                 '--out', str(out)]) == 0
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['rate_targets'] == {'blocks.0.neuron': 0.02, 'blocks.1.neuron': 0.05}
    assert metrics['rate_strength'] == 3.0
    assert set(metrics['history'][0]['spike_rates']) == {'blocks.0.neuron', 'blocks.1.neuron'}
    assert main(['train', *TINY, '--rate-target', '0.1', '0.1', '0.1',
                 '--out', str(tmp_path / 'bad')]) == 2


def test_an_overwrite_that_cannot_move_a_run_file_changes_nothing(root, tmp_path, capsys,
                                                                   monkeypatch):
    out = tmp_path / 'run'
    shutil.copytree(root / 'run', out)
    before, names = files_of(out), sorted(os.listdir(out))
    rename = os.rename

    def refused(src, dst):     # e.g. a directory without write permission cannot be moved
        if os.path.basename(src) == CURVE_NAME:
            raise PermissionError(13, 'Permission denied')
        return rename(src, dst)

    monkeypatch.setattr(os, 'rename', refused)
    capsys.readouterr()
    assert main([*TRAIN, '--out', str(out), '--overwrite']) == 1
    captured = capsys.readouterr()
    # found when the new run's first checkpoint was to replace it: that run is dropped
    assert captured.err == (f'braintrace-conv: error: [Errno 13] cannot replace the run in {out}: '
                            f'{out / CURVE_NAME} cannot be moved (Permission denied); nothing was '
                            f'moved; the run in {out} was not replaced\n')
    assert files_of(out) == before and sorted(os.listdir(out)) == names


def copied(recordings, tmp_path, sensor='audio'):
    data = tmp_path / 'data'
    shutil.copytree(recordings / sensor, data)
    return data


@pytest.mark.parametrize('how', ['new', 'overwrite'])
def test_a_bad_file_met_while_training_keeps_what_the_run_directory_holds(
        recordings, tmp_path, capsys, monkeypatch, how):
    command = sys.modules['braintrace_conv.cli.train']     # the package names its function so
    data, out = copied(recordings, tmp_path), tmp_path / 'run'
    streamed = ['train', '--task', 'events', '--data', str(data), '--sensor-size', '32,1,1',
                '--pool', '1', '--stream', '--cache-size', '0', *EVENT_TINY, '--out', str(out)]
    if how == 'overwrite':
        assert main(streamed) == 0
    before = run_files(out)

    def spoil():                # an event outside the sensor in every file
        for file in data.rglob('*.npy'):
            events = np.load(file)
            events['x'][-1] = 99
            np.save(file, events)

    if how == 'overwrite':      # met before the new run's first checkpoint
        setup = command.setup
        monkeypatch.setattr(command, 'setup', lambda *a, **k: (setup(*a, **k), spoil())[0])
    else:                       # met in the second epoch, after the first one's checkpoint
        write_metrics = logs.write_metrics
        monkeypatch.setattr(logs, 'write_metrics', lambda *a: (write_metrics(*a), spoil()))
    capsys.readouterr()
    epochs = streamed.index('--epochs') + 1
    assert main([*streamed[:epochs], '2', *streamed[epochs + 1:],
                 *(['--overwrite'] if how == 'overwrite' else [])]) == 2
    line = error_line(capsys)
    assert re.search(r"error: --data: sample .*\.npy: .*'x'.*; ", line), line
    if how == 'overwrite':
        assert line.endswith(f'; the run in {out} was not replaced') and run_files(out) == before
    else:
        assert line.endswith(f'; the run in {out} is kept as of its last checkpoint')
        assert checkpoint.read(out / LAST_CHECKPOINT)[1]['epoch'] == 1


def test_resume_needs_the_same_event_options(recordings, tmp_path, capsys):
    out = tmp_path / 'run'
    common = ['train', '--task', 'events', '--data', str(recordings / 'audio'), '--sensor-size',
              '32,1,1', *EVENT_TINY, '--out', str(out)]
    assert main(common) == 0
    capsys.readouterr()
    assert main([*common, '--resume', '--window-us', '12500', '--pool', '2']) == 2
    assert re.search(r'other options: --pool 4 \(now 2\), --window-us unset \(now 12500.0\)',
                     capsys.readouterr().err)
    assert main([*common, '--resume']) == 0
    assert 'already finished' in capsys.readouterr().out


@pytest.mark.parametrize('write, match', [
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(200)), 'is not a NumPy .npy array'),
    (lambda p: np.save(p, np.array([1, None], dtype=object), allow_pickle=True),
     r'holds Python objects \(dtype object\), which are never loaded'),
    (lambda p: np.save(p, np.array([(5, 40, 1)], AUDIO)),
     r"events field 'x' must lie in \[0, 32\) for this sensor_size"),
])
def test_a_bad_streamed_file_is_one_line_and_leaves_no_run(recordings, tmp_path, capsys, write,
                                                           match):
    data = copied(recordings, tmp_path)
    bad = data / 'up' / '011.npy'       # the last file: streaming reads it only in a batch
    write(bad)
    out = tmp_path / 'run'
    assert main(['train', '--task', 'events', '--data', str(data), '--sensor-size', '32,1,1',
                 '--stream', *EVENT_TINY, '--batch-size', '18', '--out', str(out)]) == 2
    error = error_line(capsys)
    assert str(bad) in error and re.search(match, error), error
    assert not out.exists()      # nothing to --overwrite before the rerun


# ----------------------------------------------------------------------------- kill and resume
SIX_EPOCHS = ['train', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--epochs', '6', '--quiet']


def run_cli(out, *extra):
    return subprocess.Popen([sys.executable, '-m', 'braintrace_conv.cli', *SIX_EPOCHS, '--out',
                             str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def scalars(out):
    with open(out / SCALARS_NAME, newline='') as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(SCALAR_COLUMNS)
    return [row[:-1] for row in rows[1:]]                   # all but the time column


def test_killed_run_resumes_to_the_bitwise_result_of_an_uninterrupted_one(tmp_path):
    straight = run_cli(tmp_path / 'straight')
    victim = run_cli(tmp_path / 'killed')
    first = tmp_path / 'killed' / LAST_CHECKPOINT
    deadline = time.monotonic() + 300
    while not first.exists():
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.kill()
    victim.communicate()
    interrupted_at = checkpoint.read(first)[1]['epoch']
    assert victim.returncode == -9 and 1 <= interrupted_at < 6

    resumed = run_cli(tmp_path / 'killed', '--resume')
    assert resumed.wait(300) == 0, resumed.communicate()
    assert straight.wait(300) == 0, straight.communicate()
    a, meta_a = checkpoint.read(tmp_path / 'straight' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'killed' / LAST_CHECKPOINT)
    assert a.keys() == b.keys() and any(k.startswith('opt/') for k in a)
    for name in a:                                           # params, optimiser state, RNG key
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    for meta in (meta_a, meta_b):
        for record in meta['history']:
            record.pop('epoch_time_s')
    assert meta_a == meta_b and meta_a['epoch'] == 6
    assert scalars(tmp_path / 'straight') == scalars(tmp_path / 'killed')
