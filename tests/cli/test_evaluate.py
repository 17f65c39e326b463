"""``braintrace-conv evaluate``: a saved run rebuilt from its stored options, on the data it
was evaluated on."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from braintrace_conv import cli
from braintrace_conv.cli import main
from braintrace_conv.data import StreamingEventDataset, stream_directory
from braintrace_conv.training import BEST_CHECKPOINT, LAST_CHECKPOINT, checkpoint
from braintrace_conv.training.fingerprint import data_fingerprint

from cli_runs import EVENT_TINY, error_line, files_of, refused

REFUSED = [
    (['evaluate'], 'the following arguments are required: --run'),
    (['evaluate', '--run', '{empty}'], r'--run: .*empty holds no checkpoint'),
    (['evaluate', '--run', ''], 'argument --run: expected a path, got an empty string'),
    (['evaluate', '--run', '{root}/absent'], r'--run: no checkpoint at .*absent'),
    (['evaluate', '--run', '{corrupt}'], '--run: .* is corrupt'),
    (['evaluate', '--run', '{run}', '--checkpoint', 'worst'],
     "argument --checkpoint: invalid choice: 'worst'"),
    (['evaluate', '--run', '{run}', '--batch-size', '0'],
     '--batch-size must be a positive integer, got 0'),
    (['evaluate', '--run', '{run}', '--devices', '3'],
     r'--devices must be between 1 and the 1 available device\(s\) \(cpu\), got 3'),
    (['evaluate', '--run', '{run}', '--data', '{empty}'],
     r'--data applies only to runs of --task events; the run in .*checkpoint-best.npz is of '
     r'--task moving-bars'),
    (['evaluate', '--run', '{run}', '--recordings', '{file}'],
     r'--recordings applies only to runs of "braintrace-conv stream"; the run in '
     r'.*checkpoint-best.npz was written by "braintrace-conv train"$'),
    (['evaluate', '--run', '{run}', '--segments', '{file}'],
     r'--segments applies only with --recordings$'),
]


@pytest.mark.parametrize('argv, match', REFUSED)
def test_a_refused_evaluation_is_one_line_and_changes_nothing(root, capsys, argv, match):
    refused(root, capsys, argv, match)


def test_evaluate_says_which_checkpoint_it_scored(run, capsys):
    capsys.readouterr()
    assert main(['evaluate', '--run', str(run)]) == 0
    metrics = json.loads((run / 'metrics.json').read_text())
    best = metrics['best']
    line = capsys.readouterr().out
    assert line.startswith(f"the best checkpoint ({BEST_CHECKPOINT}, epoch {best['epoch']}) of "
                           f"{run}: moving-bars, ")
    assert f"test accuracy {best['test_accuracy']:.1%}" in line and 'spike rates' in line
    assert main(['evaluate', '--run', str(run), '--checkpoint', 'last']) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"the last checkpoint ({LAST_CHECKPOINT}, epoch "
                           f"{metrics['epochs_completed']}) of {run}: ")
    assert f"test accuracy {metrics['test_accuracy']:.1%}" in line
    assert main(['evaluate', '--run', str(run / LAST_CHECKPOINT)]) == 0
    assert capsys.readouterr().out.startswith(f'the last checkpoint ({LAST_CHECKPOINT}, epoch ')


def test_evaluate_checks_the_stored_options(run, tmp_path, capsys):
    arrays, meta = checkpoint.read(run / LAST_CHECKPOINT)
    for change, match in [
            (dict(samples=-5), r'--run: the data or model of the run in .* cannot be rebuilt: '
                               r'--samples must be a positive integer, got -5'),
            (dict(seed=-1), r'--run: the run options stored in .* are not valid: --seed must '
                            r'lie in \[0, \d+\], got -1'),
            (dict(task='cifar'), r"not valid: argument --task: invalid choice: 'cifar'"),
            (dict(channels='x'), r'not valid: argument --channels: expected comma-separated')]:
        out = tmp_path / 'forged'
        out.mkdir(exist_ok=True)
        checkpoint.write(out / LAST_CHECKPOINT, arrays, dict(meta, run=dict(meta['run'],
                                                                             **change)))
        assert main(['evaluate', '--run', str(out)]) == 2
        error = error_line(capsys)
        assert re.search(match, error), error
    # a batch larger than the test set is only as large as the test set
    assert main(['evaluate', '--run', str(run), '--batch-size', '1000000000']) == 0


def test_a_library_run_is_not_evaluated_as_a_command_line_run(root, tmp_path, capsys):
    import brainstate
    import optax

    import braintrace_conv as bc
    from braintrace_conv.data import moving_bars
    from braintrace_conv.models import recurrent_conv_snn

    brainstate.random.seed(0)
    model = recurrent_conv_snn((2, 8, 8), 8, channels=(2, 4))
    trainer = bc.Trainer(bc.BPTT(model), optax.adam(1e-2))
    trainer.fit(moving_bars(16, T=4, size=(8, 8), seed=0), epochs=1, batch_size=8,
                out_dir=tmp_path, progress=False, tensorboard=False)
    before = files_of(tmp_path)
    assert main(['evaluate', '--run', str(tmp_path)]) == 2
    assert 'was not written by "braintrace-conv train" (its run options lack task' in \
        capsys.readouterr().err
    assert files_of(tmp_path) == before


STREAMED = ['train', '--task', 'events', '--sensor-size', '32,1,1', '--pool', '1', '--stream',
            *EVENT_TINY]


@pytest.fixture(scope='module')
def streamed_run(recordings, tmp_path_factory):
    """``(data, run)``: a copy of the audio recordings and a streamed run trained on it."""
    root = tmp_path_factory.mktemp('streamed')
    data, run = root / 'data', root / 'run'
    shutil.copytree(recordings / 'audio', data)
    assert main([*STREAMED, '--data', str(data), '--out', str(run)]) == 0
    return data, run


@pytest.fixture
def streamed(streamed_run, recordings):
    """``streamed_run``, its recordings put back afterwards (content and modification times)."""
    yield streamed_run
    data = streamed_run[0]
    shutil.rmtree(data)
    shutil.copytree(recordings / 'audio', data)


def tree(directory) -> dict:
    return {p.relative_to(directory): p.read_bytes() if p.is_file() else 'dir'
            for p in directory.rglob('*')}


def split_files(data) -> tuple:
    """The files of the training and test sets the command line splits ``data`` into."""
    full = stream_directory(data, sensor_size=(32, 1, 1), n_time_bins=8)
    return tuple(part.sources for part in full.split(0.25, seed=0))


def test_evaluate_refuses_data_that_changed_since_the_run(streamed, capsys):
    data, out = streamed
    before = tree(out)
    (data / 'down').rename(data / 'tmp')         # the classes swapped: every label changes
    (data / 'up').rename(data / 'down')
    (data / 'tmp').rename(data / 'up')
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 2       # same names: other files there
    assert re.search(r'--run: the test set rebuilt for the run in .* differs from the one it '
                     r'was evaluated on: 6 of its 6 files changed since \(size or modification '
                     r'time\): .* and 3 more; pass --allow-data-change to evaluate anyway',
                     error_line(capsys))
    assert main(['evaluate', '--run', str(out), '--allow-data-change']) == 0
    captured = capsys.readouterr()
    assert 'evaluating anyway (--allow-data-change)' in captured.err
    assert 'test accuracy' in captured.out
    (data / 'up' / '000.npy').unlink()                      # a file removed: other samples
    assert main(['evaluate', '--run', str(out)]) == 2
    assert re.search(r'differs from the one it was evaluated on: other samples or labels \(6 '
                     r'samples then, \d+ samples now\); pass --allow-data-change',
                     error_line(capsys))
    assert tree(out) == before


def test_changed_file_contents_are_named_on_resume_and_evaluate(streamed, capsys):
    data, out = streamed
    train_files, test_files = split_files(data)
    before = tree(out)
    np.save(test_files[0], np.load(test_files[0])[:100])        # another content and size
    st = os.stat(train_files[0])                                 # only the time
    os.utime(train_files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 2
    assert error_line(capsys).endswith(
        f'differs from the one it was evaluated on: 1 of its 6 files changed since (size or '
        f'modification time): {test_files[0]}; pass --allow-data-change to evaluate anyway')
    assert main([*STREAMED, '--epochs', '2', '--data', str(data), '--out', str(out),
                 '--resume']) == 2
    assert re.search(rf'--resume: .*{LAST_CHECKPOINT} was written with a different configuration '
                     rf'\(eval_data: 1 of its 6 files changed since \(size or modification '
                     rf'time\): {test_files[0]}; train_data: 1 of its 18 files changed since '
                     rf'\(size or modification time\): {train_files[0]}\)',
                     error_line(capsys))
    assert tree(out) == before
    assert main(['evaluate', '--run', str(out), '--allow-data-change']) == 0
    assert f'changed since (size or modification time): {test_files[0]}; evaluating anyway' in \
        capsys.readouterr().err


def rewritten_in_place(path) -> None:
    """Another content in ``path``, its size and modification time restored."""
    st, events = os.stat(path), np.load(path)
    events['x'] = 31 - events['x']
    np.save(path, events)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size


def test_verify_data_names_a_file_rewritten_with_its_size_and_time_kept(recordings, tmp_path,
                                                                        capsys):
    data, out = tmp_path / 'data', tmp_path / 'run'
    shutil.copytree(recordings / 'audio', data)
    assert main([*STREAMED, '--verify-data', '--data', str(data), '--out', str(out)]) == 0
    assert main(['evaluate', '--run', str(out)]) == 0
    train_files, test_files = split_files(data)
    rewritten_in_place(train_files[1])
    rewritten_in_place(test_files[0])
    before = tree(out)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 2
    assert error_line(capsys).endswith(
        f'differs from the one it was evaluated on: 1 of its 6 files changed since (content, '
        f'with size and modification time kept): {test_files[0]}; pass --allow-data-change to '
        f'evaluate anyway')
    assert main([*STREAMED, '--verify-data', '--epochs', '2', '--data', str(data), '--out',
                 str(out), '--resume']) == 2
    assert f'train_data: 1 of its 18 files changed since (content, with size and modification ' \
           f'time kept): {train_files[1]})' in error_line(capsys)
    assert main([*STREAMED, '--epochs', '2', '--data', str(data), '--out', str(out),
                 '--resume']) == 2      # the run's option: its checks are not dropped
    assert '--verify-data True (now unset)' in error_line(capsys)
    assert tree(out) == before


def older_fingerprints(data, run, out):
    """A copy ``out`` of ``run`` whose checkpoints hold the fingerprints of an older version:
    the streamed files' absolute paths only."""
    shutil.copytree(run, out)
    train, test = (stream_directory(data, sensor_size=(32, 1, 1), n_time_bins=8)
                   .split(0.25, seed=0))
    for name in (LAST_CHECKPOINT, BEST_CHECKPOINT):
        arrays, meta = checkpoint.read(out / name)
        assert meta['fit']['eval_data'] == data_fingerprint(test)
        fit = dict(meta['fit'], train_data=data_fingerprint(train, 1),
                   eval_data=data_fingerprint(test, 1))
        assert 'version' not in fit['eval_data'] and 'files' not in fit['eval_data']
        checkpoint.write(out / name, arrays, dict(meta, fit=fit))
    return out


def test_runs_with_path_only_fingerprints_still_resume_and_evaluate(streamed, tmp_path,
                                                                    capsys, monkeypatch):
    data, run = streamed
    out = older_fingerprints(data, run, tmp_path / 'old')
    capsys.readouterr()
    assert main(['evaluate', '--run', str(out)]) == 0
    captured = capsys.readouterr()
    assert 'test accuracy 100.0%' in captured.out
    assert captured.err == (f'braintrace-conv: warning: {out / BEST_CHECKPOINT}, test set: its '
                            f'fingerprint was written by an older version and covers the file '
                            f'paths only: changes to the files\' contents cannot be detected\n')

    def stop(self, *args, **kwargs):    # resumed: stop at the first batch it reads
        raise KeyboardInterrupt

    monkeypatch.setattr(StreamingEventDataset, 'batches', stop)
    assert main([*STREAMED, '--epochs', '2', '--data', str(data), '--out', str(out),
                 '--resume']) == 130
    err = capsys.readouterr().err
    for key in ('train_data', 'eval_data'):
        assert (f'warning: {out / LAST_CHECKPOINT}, {key}: its fingerprint was written by an '
                f'older version and covers the file paths only') in err
    assert 'interrupted; epochs 1-1 are saved' in err


def test_evaluate_reads_only_the_data_directory_its_run_recorded(streamed, recordings, tmp_path,
                                                                 capsys, monkeypatch):
    data, run = streamed
    forged = tmp_path / 'forged'
    shutil.copytree(run, forged)
    elsewhere = str(recordings / 'dvs')       # a directory the run never named
    for name in (LAST_CHECKPOINT, BEST_CHECKPOINT):
        arrays, meta = checkpoint.read(forged / name)
        checkpoint.write(forged / name, arrays, dict(meta, run=dict(meta['run'], data=elsewhere)))
    listed = []

    def listing(root, **kwargs):
        listed.append(str(root))
        return stream_directory(root, **kwargs)

    monkeypatch.setattr(cli.build, 'stream_directory', listing)
    before = tree(forged)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(forged)]) == 2
    assert error_line(capsys) == (
        f'braintrace-conv: error: --run: the data directory named in {forged / BEST_CHECKPOINT} '
        f'({elsewhere}) is not the one recorded in {forged / "metrics.json"} ({data}); evaluate '
        f'reads only the data directory its run recorded in both, or the one --data DIR names')
    lone = tmp_path / 'lone'            # a checkpoint without its run directory
    lone.mkdir()
    shutil.copy(run / BEST_CHECKPOINT, lone)
    assert main(['evaluate', '--run', str(lone / BEST_CHECKPOINT)]) == 2
    assert f'is not the one recorded in {lone / "metrics.json"} (none)' in error_line(capsys)
    assert listed == [] and tree(forged) == before
    # --data names the directory: the run's, or a copy elsewhere with the same files and times
    copy = tmp_path / 'copy'
    shutil.copytree(data, copy)
    for path, directory in ((forged, data), (lone / BEST_CHECKPOINT, copy)):
        assert main(['evaluate', '--run', str(path), '--data', str(directory)]) == 0
        assert 'test accuracy 100.0%' in capsys.readouterr().out
    assert listed == [str(data), str(copy)]
    assert main(['evaluate', '--run', str(forged), '--data', str(tmp_path / 'absent')]) == 2
    assert error_line(capsys).endswith(f'--data {tmp_path / "absent"} is not a directory')


# ----------------------------------------------------------------------------- stream runs
#: Steps of 10 ms, chunks of 20 steps, a small net, for recordings of 8 x 8 pixels.
STREAM_TINY = ['--sensor-size', '8,8,2', '--dt-us', '10000', '--update-every', '20', '--channels',
               '2,4', '--lr', '2e-2', '--quiet']


@pytest.fixture(scope='module')
def stream_run(tmp_path_factory):
    """``root``: the training recordings under ``train/``, a held-out one under ``held/``,
    and ``run/``, a finished stream run evaluated on it every 4 chunks and at the end."""
    from braintrace_conv.data import gesture_recordings
    root = tmp_path_factory.mktemp('stream-run')
    short = dict(duration_s=2.0, size=(8, 8), segment_s=(0.3, 0.6), gap_s=(0.1, 0.3),
                 formats=('npy',))
    train = gesture_recordings(root / 'train', 2, seed=0, **short)
    held = gesture_recordings(root / 'held', 1, seed=1, **short)
    assert main(['stream', '--recordings', *(str(r.events) for r in train), '--held-out',
                 str(held[0].events), *STREAM_TINY, '--eval-every', '4', '--out',
                 str(root / 'run')]) == 0
    return root


def test_a_stream_run_is_scored_as_it_scored_its_held_out_recordings(stream_run, capsys):
    run = stream_run / 'run'
    metrics = json.loads((run / 'metrics.json').read_text())
    capsys.readouterr()
    assert main(['evaluate', '--run', str(run), '--checkpoint', 'last']) == 0
    line = capsys.readouterr().out
    test = metrics['test']      # the evaluation at the end: the last checkpoint's parameters
    assert line.startswith(f'the last checkpoint ({LAST_CHECKPOINT}, step {metrics["steps"]:,}) '
                           f'of {run}: 1 held-out recording(s), ')
    assert line.endswith(f'held-out segment accuracy {test["test_accuracy"]:.1%} '
                         f'({test["test_segments"]} segments), step accuracy '
                         f'{test["test_step_accuracy"]:.1%}, loss {test["test_loss"]:.4f}\n')
    assert main(['evaluate', '--run', str(run)]) == 0
    best = next(e for e in metrics['evaluations'] if e['step'] == metrics['best']['step'])
    assert f'the best checkpoint ({BEST_CHECKPOINT}, step {best["step"]:,}) of {run}: ' \
           f'1 held-out recording(s), ' in (line := capsys.readouterr().out)
    assert f'held-out segment accuracy {best["test_accuracy"]:.1%} ({best["test_segments"]} ' \
           f'segments), step accuracy {best["test_step_accuracy"]:.1%}, loss ' \
           f'{best["test_loss"]:.4f}' in line
    # other recordings, labelled by their segments files
    others = sorted(str(p) for p in (stream_run / 'train').glob('*.npy'))
    assert main(['evaluate', '--run', str(run), '--recordings', *others]) == 0
    assert ': 2 held-out recording(s), ' in capsys.readouterr().out


STREAM_REFUSED = [
    (['--batch-size', '8'], r'--batch-size applies only to runs of "braintrace-conv train"; the '
                            r'run in .*checkpoint-best.npz was written by "braintrace-conv '
                            r'stream"$'),
    (['--data', '{train}'], r'--data applies only to runs of "braintrace-conv train"'),
    (['--recordings', '{root}/absent.npy'], r'--recordings: .*absent.npy is not a file$'),
    (['--recordings', '{root}/held/user01_synthetic.npy', '--segments', '{root}/a.csv',
      '{root}/b.csv'], r'--segments names 2 file\(s\) for the 1 of --recordings'),
    (['--recordings', '{root}/train/user01_synthetic_labels.csv'],
     r'--recordings: .*user01_synthetic_labels.csv has no segments file '
     r'user01_synthetic_labels_labels.csv beside it; name the segments files with --segments$'),
    (['--recordings', '{root}/train/user01_synthetic_labels.csv', '--segments',
      '{root}/train/user01_synthetic_labels.csv'],
     r'--recordings: .*user01_synthetic_labels.csv: unknown event-file suffix'),
]


@pytest.mark.parametrize('argv, match', STREAM_REFUSED)
def test_a_refused_stream_evaluation_is_one_line_and_changes_nothing(stream_run, capsys, argv,
                                                                    match):
    refused(stream_run, capsys, ['evaluate', '--run', '{run}', *argv], match)


def test_a_stream_run_is_scored_only_on_the_held_out_recordings_it_was_evaluated_on(
        stream_run, tmp_path, capsys):
    arrays, meta = checkpoint.read(stream_run / 'run' / LAST_CHECKPOINT)
    forged = tmp_path / 'forged'
    forged.mkdir()
    eval_stream = meta['fit']['eval_stream']
    changed = dict(eval_stream, recordings=[[name, size + 1, steps] for name, size, steps
                                            in eval_stream['recordings']])
    checkpoint.write(forged / LAST_CHECKPOINT, arrays,
                     dict(meta, fit=dict(meta['fit'], eval_stream=changed)))
    assert main(['evaluate', '--run', str(forged)]) == 2
    assert error_line(capsys).endswith(
        f'--run: the held-out recordings of the run in {forged / LAST_CHECKPOINT} differ from '
        f'those it was evaluated on (in recordings); pass --allow-data-change to evaluate anyway')
    assert main(['evaluate', '--run', str(forged), '--allow-data-change']) == 0
    assert 'evaluating anyway (--allow-data-change)\n' in capsys.readouterr().err
    # a run without held-out recordings is scored on the ones --recordings names
    checkpoint.write(forged / LAST_CHECKPOINT, arrays,
                     dict(meta, run=dict(meta['run'], held_out=None, held_out_segments=None)))
    assert main(['evaluate', '--run', str(forged)]) == 2
    assert error_line(capsys).endswith(
        f'--run: the run in {forged / LAST_CHECKPOINT} has no held-out recordings (--held-out); '
        f'name the recordings to evaluate on with --recordings FILE ...')
