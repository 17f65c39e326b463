"""``braintrace-conv stream``: a run and its directory, refusals in one line, and a run
killed at a random point that resumes to the bitwise result of an uninterrupted one."""
import csv
import json
import random
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

from cli_runs import error_line, refused

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
    (['--sensor-size', '8,2'], '--sensor-size must be W,H,P for a camera, got 8,2'),
    (['--sensor-size', '4,4,2'], r'user01_synthetic.npy: event 0 has x = \d; expected an integer '
                                 r'pixel coordinate in \[0, 4\)'),
    (['--num-classes', '2'], r'--recordings: .*label .* out of range for 2 classes|'
                             r'--recordings: .*2 classes'),
    (['--held-out', '{missing}'], r'--held-out: .*missing.npy is not a file'),
])
def test_refusals_are_one_line_and_change_nothing(gestures, tmp_path, capsys, extra, match):
    csv_file = gestures[0][0].replace('.npy', '_labels.csv')
    extra = [a.format(csv=csv_file, missing=tmp_path / 'missing.npy') for a in extra]
    sensor = [] if '--sensor-size' in extra else SENSOR
    refused(tmp_path, capsys, ['stream', '--recordings', *gestures[0], *sensor, *TINY, *extra],
            match)


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


@pytest.mark.parametrize('removable, hint', [
    (True, 'no checkpoint was written, and nothing was kept'),
    (False, 'no checkpoint was written; rerun with --overwrite to start again'),
])
def test_an_interrupt_before_the_first_checkpoint_says_what_was_kept(
        gestures, tmp_path, capsys, monkeypatch, removable, hint):
    from braintrace_conv.training import Trainer, run_dir

    def interrupted(self, stream, *, out_dir, **kwargs):
        (out_dir / SCALARS_NAME).write_text('chunk\n')
        raise KeyboardInterrupt

    def unremovable(directory, *, overwrite, create=run_dir.create):
        if overwrite:       # removing the run's files
            raise PermissionError(13, 'Permission denied', str(directory))
        return create(directory, overwrite=overwrite)

    monkeypatch.setattr(Trainer, 'fit_stream', interrupted)
    if not removable:
        monkeypatch.setattr(run_dir, 'create', unremovable)
    out = tmp_path / 'run'
    assert main(['stream', '--recordings', *gestures[0], *SENSOR, *TINY, '--out',
                 str(out)]) == 130
    assert capsys.readouterr().err == f'braintrace-conv: interrupted; {hint}\n'
    assert out.exists() != removable


# ----------------------------------------------------------------------------- kill and resume
def run_cli(files, out, *extra):
    argv = ['stream', '--recordings', *files, *SENSOR, *TINY, '--dt-us', '5000',
            '--checkpoint-every', '2', '--log-every', '3', '--settle-steps', '10', '--out',
            str(out), *extra]
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
