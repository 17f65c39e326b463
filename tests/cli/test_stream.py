"""``braintrace-conv stream``: a run and its directory, refusals in one line, and a run
killed at a random point that resumes to the bitwise result of an uninterrupted one."""
import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from braintrace_conv.cli import main
from braintrace_conv.data import gesture_recordings
from braintrace_conv.training import (CURVE_NAME, LAST_CHECKPOINT, METRICS_NAME, SCALARS_NAME,
                                      checkpoint)
from braintrace_conv.training.stream import STREAM_COLUMNS

from cli_runs import error_line, files_of, refused, run_files

#: Steps of 10 ms, chunks of 20 steps, a small net (for 8 x 8 pixels, :data:`SENSOR`).
TINY = ['--dt-us', '10000', '--update-every', '20', '--channels', '2,4', '--lr', '2e-2',
        '--quiet']
SENSOR = ['--sensor-size', '8,8,2']


def write(folder, n, seed, duration_s=2.0):
    """``n`` recordings of gestures of 0.3 to 0.6 s; their event files."""
    recordings = gesture_recordings(folder, n, duration_s=duration_s, size=(8, 8),
                                    segment_s=(0.3, 0.6), gap_s=(0.1, 0.3), formats=('npy',),
                                    seed=seed)
    return [str(r.events) for r in recordings]


@pytest.fixture(scope='module')
def gestures(tmp_path_factory):
    """``(training event files, held-out event files)``, segments beside them."""
    root = tmp_path_factory.mktemp('stream-cli')
    return write(root / 'train', 2, 0), write(root / 'held', 1, 1)


def test_a_run_writes_its_directory_and_a_finished_run_is_said_so(gestures, tmp_path, capsys):
    out = tmp_path / 'run'
    argv = ['stream', '--recordings', *gestures[0], '--held-out', *gestures[1], *SENSOR, *TINY,
            '--eval-every', '4', '--out', str(out)]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith('held-out segment accuracy') and 'peak RSS' in line
    metrics = json.loads((out / METRICS_NAME).read_text())
    assert metrics['finished'] and metrics['algorithm'] == 'ES-D-RTRL'
    assert metrics['run_config']['recordings'] == gestures[0]
    assert 2 <= metrics['run_config']['num_classes'] <= 6 and metrics['steps'] >= 150
    assert [e['chunk'] for e in metrics['evaluations']][:2] == [4, 8]
    assert (out / CURVE_NAME).is_file() and 'carry/0' in checkpoint.read(out / LAST_CHECKPOINT)[0]
    with open(out / SCALARS_NAME, newline='') as f:
        assert next(csv.reader(f)) == list(STREAM_COLUMNS)
    assert main([*argv, '--resume']) == 0
    assert 'is already finished' in capsys.readouterr().out


@pytest.mark.parametrize('extra, match', [
    (['--segments', '{csv}'], r'--segments names 1 file\(s\) for the 2 of --recordings'),
    (['--loop'], '--loop applies only with --max-steps'),
    (['--eval-every', '3'], '--eval-every applies only with --held-out'),
    (['--algorithm', 'd-rtrl', '--window', '30'],
     r'--window must be at most --update-every \(20\), got 30; a window never spans two '
     r'chunks'),
    (['--window', '30'], r'--window must be at most --update-every \(20\), got 30'),
    (['--algorithm', 'bptt', '--window', '10'],
     r'--window applies only to --algorithm d-rtrl or es-d-rtrl \(BPTT is exact already\)$'),
    (['--algorithm', 'bptt', '--decay', '0.9'], r'--decay applies only to --algorithm es-d-rtrl$'),
    (['--sensor-size', '8,2'], '--sensor-size must be W,H,P for a camera, got 8,2'),
    (['--sensor-size', '4,4,2'], r'user01_synthetic.npy: event 0 has x = \d; expected an integer '
                                 r'pixel coordinate in \[0, 4\)'),
    (['--num-classes', '2'], r'--recordings: .*label .* out of range for 2 classes|'
                             r'--recordings: .*2 classes'),
    (['--held-out', '{missing}'], r'--held-out: .*missing.npy is not a file'),
    (['--downsample', '2'], r'--downsample must be a number in \(0, 1\], got 2.0'),
    (['--denoise-us', '0'], r'--denoise-us must be a positive number, got 0.0'),
    (['--crop', '0,0,20,4'], r'--crop: size must fit the sensor \(8, 8\) from the origin '
                             r'\(0, 0\), got \(20, 4\)\.$'),
    (['--crop', '4,4,4,4', '--downsample', '0.5', '--crop', '1,2,3'],
     r'--crop: expected X,Y,W,H: the first column and row'),
])
def test_refusals_are_one_line_and_change_nothing(gestures, tmp_path, capsys, extra, match):
    csv_file = gestures[0][0].replace('.npy', '_labels.csv')
    extra = [a.format(csv=csv_file, missing=tmp_path / 'missing.npy') for a in extra]
    sensor = [] if '--sensor-size' in extra else SENSOR
    refused(tmp_path, capsys, ['stream', '--recordings', *gestures[0], *sensor, *TINY, *extra],
            match)


def test_events_are_transformed_before_binning_in_training_and_evaluation(gestures, tmp_path,
                                                                        capsys):
    out = tmp_path / 'run'
    argv = ['stream', '--recordings', *gestures[0], '--held-out', *gestures[1], *SENSOR, *TINY,
            '--denoise-us', '30000', '--refractory-us', '2000', '--crop', '0,2,8,6',
            '--downsample', '0.5', '--max-steps', '40', '--out', str(out)]
    assert main([a for a in argv if a != '--quiet']) == 0
    assert 'frames (2, 3, 4)' in capsys.readouterr().out
    stored = json.loads((out / METRICS_NAME).read_text())['run_config']
    assert (stored['crop'], stored['downsample']) == ([0, 2, 8, 6], 0.5)
    assert main(['evaluate', '--run', str(out)]) == 0
    assert 'segment accuracy' in capsys.readouterr().out
    assert main([*argv[:-2], '--downsample', '0.25', '--out', str(out), '--resume']) == 2
    assert '--downsample 0.5 (now 0.25)' in error_line(capsys)


def test_the_default_algorithm_takes_a_window_and_a_decay(gestures, capsys):
    from braintrace_conv.cli import build_parser
    resolve = sys.modules['braintrace_conv.cli.stream']._resolve
    args = build_parser().parse_args(['stream', '--recordings', *gestures[0], *SENSOR, *TINY,
                                      '--window', '10', '--decay', '0.9'])
    run = resolve(args, 'usage')
    assert (run.algorithm, run.window, run.decay) == ('es-d-rtrl', 10, 0.9)


def test_help_speaks_of_streams(capsys):
    assert main(['stream', '--help']) == 0
    text = ' '.join(capsys.readouterr().out.split())
    for word in ('long-memory', 'task default', 'delayed-bars', 'shuffl', 'epoch', 'batch size'):
        assert word not in text, word
    assert 'held-out' in text and 'chunk' in text


def test_resuming_a_run_of_the_other_command_says_so(gestures, finished, run, capsys):
    refused(finished.parent, capsys, ['train', '--out', str(finished), '--resume'],
            rf'error: --resume: the run in {finished} was written by "braintrace-conv stream"; '
            rf'continue it with "braintrace-conv stream --resume" and its options$')
    refused(run.parent, capsys, ['stream', '--recordings', *gestures[0], *SENSOR, '--out',
                                 str(run), '--resume'],
            rf'error: --resume: the run in {run} was written by "braintrace-conv train"; '
            rf'continue it with "braintrace-conv train --resume" and its options$')


def test_a_recording_without_its_segments_beside_it_is_named(tmp_path, capsys):
    (tmp_path / 'bare').mkdir()
    events = write(tmp_path / 'bare', 1, 2)[0]
    (tmp_path / 'bare' / 'user01_synthetic_labels.csv').unlink()
    refused(tmp_path, capsys, ['stream', '--recordings', events, *SENSOR, *TINY],
            r'--recordings: .*user01_synthetic.npy has no segments file '
            r'user01_synthetic_labels.csv beside it; name the segments files with --segments')


def test_segments_that_label_nothing_are_named_by_the_option_that_found_them(tmp_path, capsys):
    (tmp_path / 'empty').mkdir()
    events = write(tmp_path / 'empty', 1, 2)[0]
    (tmp_path / 'empty' / 'user01_synthetic_labels.csv').write_text(
        'class,startTime_usec,endTime_usec\n')
    refused(tmp_path, capsys, ['stream', '--recordings', events, *SENSOR, *TINY],
            r'error: --recordings: \S+user01_synthetic_labels.csv: the file holds a header and '
            r'no segments; expected a row per segment below the header '
            r'class,startTime_usec,endTime_usec$')


def test_resuming_with_other_options_is_refused_naming_them(gestures, tmp_path, capsys):
    out = tmp_path / 'run'
    argv = ['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--max-steps', '40', '--out',
            str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, '--lr', '1e-2', '--resume']) == 2
    assert error_line(capsys) == (
        f'braintrace-conv: error: --resume: the run in {out} was trained with other options: '
        f'--lr 0.02 (now 0.01); give the same options, or another --out')


def test_a_larger_max_steps_extends_a_run_as_if_it_had_run_straight_on(gestures, tmp_path,
                                                                      capsys):
    # a run of one chunk makes its update (if any) at the start of the learning-rate
    # schedule, --lr whatever the run's length: extended, it equals the straight run
    argv = ['stream', '--recordings', *gestures[0], *SENSOR, *TINY]
    straight, extended = tmp_path / 'straight', tmp_path / 'extended'
    assert main([*argv, '--max-steps', '100', '--out', str(straight)]) == 0
    assert main([*argv, '--max-steps', '20', '--out', str(extended)]) == 0
    capsys.readouterr()
    assert main([*argv, '--max-steps', '100', '--out', str(extended), '--resume']) == 0
    assert f'the run in {extended} continues to 100 steps' in capsys.readouterr().out
    a, meta_a = checkpoint.read(straight / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(extended / LAST_CHECKPOINT)
    assert a.keys() == b.keys() and any(k.startswith('carry/') for k in a)
    for name in a:              # parameters, optimiser state, the learner's carry, RNG key
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert meta_a == meta_b and meta_a['stream']['steps'] == 100
    assert main([*argv, '--max-steps', '100', '--out', str(extended), '--resume']) == 0
    assert 'is already finished (100 steps); nothing to do' in capsys.readouterr().out


def test_a_run_killed_in_its_last_writes_is_repaired_on_resume(gestures, tmp_path, capsys):
    out = tmp_path / 'run'
    argv = ['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--max-steps', '40',
            '--out', str(out)]
    assert main(argv) == 0
    # killed after the run's last write, before the command added its wall time and memory
    metrics = json.loads((out / METRICS_NAME).read_text())
    (out / METRICS_NAME).write_text(json.dumps({k: v for k, v in metrics.items()
                                                if k not in ('wall_time_s', 'peak_rss_mb')}))
    capsys.readouterr()
    assert main([*argv, '--resume']) == 0
    assert 'was interrupted while writing its files; repairing metrics.json' in \
        capsys.readouterr().out
    repaired = json.loads((out / METRICS_NAME).read_text())
    assert {'wall_time_s', 'peak_rss_mb'} <= set(repaired)
    assert {k: v for k, v in repaired.items() if k not in ('wall_time_s', 'peak_rss_mb')} == \
        {k: v for k, v in metrics.items() if k not in ('wall_time_s', 'peak_rss_mb')}
    assert main([*argv, '--resume']) == 0
    assert 'is already finished (40 steps); nothing to do' in capsys.readouterr().out


# ----------------------------------------------------------------------------- bad data
@pytest.fixture(scope='module')
def finished(gestures, tmp_path_factory):
    """A finished run of 2 chunks (copied by the tests that change it)."""
    out = tmp_path_factory.mktemp('finished') / 'run'
    assert main(['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--max-steps', '40',
                 '--out', str(out)]) == 0
    return out


def spoil(events_file, target, at=-10):
    """``target`` (its format from its suffix), the recording ``events_file`` made bad, the
    segments beside it copied: event ``at`` moved 0.5 s back in time (``.npy``, ``.npz``),
    or (camera files, which their writers keep in time order) the file damaged: the end
    of an AEDAT4 file overwritten, an EVT file cut within a word. Returns ``target``."""
    from braintrace_conv.data import write_events
    events = np.load(events_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix in ('.npy', '.npz'):
        events['t'][at] -= 500_000
        (np.save if target.suffix == '.npy' else np.savez)(target, events)
    else:
        write_events(target, events, sensor_size=(8, 8),
                     format='evt3' if target.suffix == '.raw' else None)
        data = target.read_bytes()
        target.write_bytes(data[:-1] if target.suffix == '.raw' else data[:-40] + b'\xff' * 40)
    labels = target.with_name(target.stem + '_labels.csv')
    if not labels.exists():
        shutil.copy(events_file.replace('.npy', '_labels.csv'), labels)
    return target


@pytest.mark.parametrize('name', ['bad.npy', 'bad.npz', 'bad.aedat4', 'bad.raw'])
def test_every_recording_is_checked_before_the_run_writes_anything(gestures, finished, tmp_path,
                                                                   capsys, name):
    if name.endswith(('.aedat4', '.raw')):
        pytest.importorskip('faery')
    bad = spoil(gestures[0][1], tmp_path / 'data' / name)
    shutil.copytree(finished, tmp_path / 'run')
    # a run it was to replace is left as it was, and so is everything else
    refused(tmp_path, capsys, ['stream', '--recordings', gestures[0][0], str(bad), *SENSOR, *TINY,
                               '--out', '{run}', '--overwrite'],
            rf'error: --recordings: {re.escape(str(bad))}: ' +
            (r'event \d+ has the timestamp \d+ us, earlier than event \d+\'s \d+ us; events must '
             r'be in time order$' if name.endswith(('.npy', '.npz')) else '.+'))


@pytest.mark.parametrize('how', ['new', 'overwrite', 'resume'])
def test_an_error_met_mid_run_keeps_what_the_run_directory_holds(gestures, finished, tmp_path,
                                                                 capsys, monkeypatch, how):
    from braintrace_conv.data.files import read
    command = sys.modules['braintrace_conv.cli.stream']     # the package names its function so
    second, out = tmp_path / 'second.npy', tmp_path / 'run'
    shutil.copy(gestures[0][1], second)
    shutil.copy(gestures[0][1].replace('.npy', '_labels.csv'), tmp_path / 'second_labels.csv')
    # one playlist: the second recording is met after the 10 chunks of the first
    argv = ['stream', '--recordings', gestures[0][0], str(second), *SENSOR, *TINY,
            '--batch-size', '1', '--checkpoint-every', '2', '--out', str(out)]
    if how == 'overwrite':      # no checkpoint of the new run before the bad event
        shutil.copytree(finished, out)
        argv += ['--overwrite', '--checkpoint-every', '100']
    elif how == 'resume':       # a run stopped after 2 chunks, continued to the end
        assert main([*argv, '--max-steps', '40']) == 0
        argv += ['--resume']
    before = run_files(out)
    streams, check, held = command._streams, read.check_events, {}

    def checked_then_spoiled(run, usage):       # the file changes once it was checked
        played = streams(run, usage)
        spoil(str(second), second)              # rewritten in place: same name and size
        return played

    def snapshot_on_failure(*args):
        try:
            check(*args)
        except read.EventFileError:
            held.update(run_files(out))
            raise

    monkeypatch.setattr(command, '_streams', checked_then_spoiled)
    monkeypatch.setattr(read, 'check_events', snapshot_on_failure)
    capsys.readouterr()
    assert main(argv) == 2
    line = error_line(capsys)
    assert re.search(r'error: .*second.npy: event \d+ has the timestamp .*; events must be in '
                     r'time order; ', line), line
    after = run_files(out)
    assert held and set(held) <= set(after), (held, after)
    if how == 'overwrite':      # met before the new run's first checkpoint: not replaced
        assert line.endswith(f'; the run in {out} was not replaced') and after == before
    else:                       # the checkpoints written before are kept
        assert line.endswith(f'; the run in {out} is kept as of its last checkpoint')
        assert checkpoint.read(out / LAST_CHECKPOINT)[1]['stream']['chunks'] >= 4


@pytest.mark.parametrize('how', ['new', 'overwrite'])
def test_an_interrupt_before_the_first_checkpoint_says_what_was_kept(
        gestures, finished, tmp_path, capsys, monkeypatch, how):
    from braintrace_conv.training import stream as training

    send = training._Pipeline.send

    def interrupted(self, *args):
        if self.run.chunks == 2:
            raise KeyboardInterrupt
        return send(self, *args)

    monkeypatch.setattr(training._Pipeline, 'send', interrupted)
    out = tmp_path / 'run'
    if how == 'overwrite':
        shutil.copytree(finished, out)
    before = files_of(out) if out.exists() else None
    capsys.readouterr()
    assert main(['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--out', str(out),
                 *(['--overwrite'] if how == 'overwrite' else [])]) == 130
    hint = ('no checkpoint was written, and nothing was kept' if how == 'new' else
            f'the run in {out} was not replaced')
    assert capsys.readouterr().err == f'braintrace-conv: interrupted; {hint}\n'
    assert (files_of(out) if out.exists() else None) == before      # hidden files too


# ----------------------------------------------------------------------------- kill and resume
def run_cli(files, out, *extra):
    # with stateful event transforms, whose state the resumed run rebuilds from the events
    argv = ['stream', '--recordings', *files, *SENSOR, *TINY, '--dt-us', '5000',
            '--checkpoint-every', '2', '--log-every', '3', '--settle-steps', '10',
            '--denoise-us', '20000', '--refractory-us', '3000', '--out', str(out), *extra]
    return subprocess.Popen([sys.executable, '-m', 'braintrace_conv.cli', *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_killed_at_a_random_point_resumes_to_the_uninterrupted_result(tmp_path):
    files = write(tmp_path / 'long', 2, 3, duration_s=4.0)   # 2 streams of 40 chunks
    straight = run_cli(files, tmp_path / 'straight')
    victim = run_cli(files, tmp_path / 'killed')
    # killed a little after a random row of scalars.csv (one every 3 of the 40 chunks)
    rng = random.Random()
    rows, delay = rng.randint(1, 11), rng.uniform(0, 0.02)
    scalars, deadline = tmp_path / 'killed' / SCALARS_NAME, time.monotonic() + 300
    while not (scalars.exists() and scalars.read_text().count('\n') > rows):
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(delay)
    victim.kill()
    victim.communicate()
    killed_at = checkpoint.read(tmp_path / 'killed' / LAST_CHECKPOINT)[1]['stream']
    where = f'killed {delay:.3f} s after row {rows}, at the checkpoint of chunk ' \
            f'{killed_at["chunks"]}'
    assert victim.returncode == -9 and not killed_at['finished'], where

    resumed = run_cli(files, tmp_path / 'killed', '--resume')
    assert resumed.wait(300) == 0, resumed.communicate()
    assert straight.wait(300) == 0, straight.communicate()
    a, meta_a = checkpoint.read(tmp_path / 'straight' / LAST_CHECKPOINT)
    b, meta_b = checkpoint.read(tmp_path / 'killed' / LAST_CHECKPOINT)
    assert a.keys() == b.keys() and any(k.startswith('carry/') for k in a)
    for name in a:              # parameters, optimiser state, the learner's carry, RNG key
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name], err_msg=f'{name}, {where}')
    assert meta_a == meta_b and meta_a['stream']['finished'], where

    def table(out):             # all but the rates and times
        with open(out / SCALARS_NAME, newline='') as f:
            return [row[:-3] for row in csv.reader(f)]
    assert table(tmp_path / 'straight') == table(tmp_path / 'killed'), where


def test_an_overwrite_killed_before_its_first_checkpoint_leaves_the_old_run(gestures, finished,
                                                                          tmp_path, capsys):
    out = tmp_path / 'run'
    shutil.copytree(finished, out)
    before = run_files(out)
    argv = ['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--out', str(out)]
    victim = subprocess.Popen([sys.executable, '-m', 'braintrace_conv.cli', *argv, '--overwrite',
                               '--log-every', '1'], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(p.name.startswith('.new-run.') and (p / SCALARS_NAME).is_file() and
                  (p / SCALARS_NAME).read_text().count('\n') > 1 for p in out.iterdir()):
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim.kill()
    victim.communicate()
    assert victim.returncode == -9 and run_files(out) == before
    # the old run is still the one there: resumed, it is found finished, the rest cleared
    capsys.readouterr()
    assert main([*argv, '--max-steps', '40', '--resume']) == 0
    assert 'is finished (40 steps) but was interrupted while writing its files; repairing ' \
           '.new-run.' in capsys.readouterr().out
    after = run_files(out)
    assert set(before) <= set(after) and after[LAST_CHECKPOINT] == before[LAST_CHECKPOINT]
    assert not [name for name in os.listdir(out) if name.startswith('.')]
