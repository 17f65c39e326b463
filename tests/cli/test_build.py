"""The data and model the command line builds: the SHD-like task (1-D convolutions over 700
channels) and directories of tonic-format event files, 1-D and 2-D, in memory or streamed."""
import json

import pytest

from braintrace_conv.cli import main
from braintrace_conv.training import LAST_CHECKPOINT, checkpoint

from cli_runs import EVENT_TINY, TRAIN, refused

MEMORY = [  # refused before anything is allocated
    ([*TRAIN, '--channels', '2000000,2000000'],
     r'the model needs about .* PiB for its .* parameters .*; lower --channels or --kernel-size'),
    (['train', '--task', 'events', '--data', '{empty}', '--sensor-size', '1000000,1000000,2'],
     r'the dataset needs about .* \(1 samples x 20 steps x 1000000 x 1000000 x 2 float32.*'
     r'lower --sensor-size or --steps'),
    (['train', '--task', 'shd', '--samples', '100000000'],
     r'the dataset needs about .* \(100000000 samples x 50 steps x 1 x 700 float32.*lower '
     r'--samples or --steps'),
    (['train', '--size', '100000'], r'the dataset needs about 5.82 PiB \(2048 samples x 20 '
                                    r'steps x 2 x 100000 x 100000 float32.*lower --samples'),
]


@pytest.mark.parametrize('argv, match', MEMORY)
def test_data_and_models_that_cannot_fit_in_memory_are_refused_first(root, capsys, argv, match):
    refused(root, capsys, argv, match)


def first_kernel(out) -> tuple:
    arrays, _ = checkpoint.read(out / LAST_CHECKPOINT)
    return arrays['param/blocks.0.ff.weight'].shape


def metrics_of(out) -> dict:
    return json.loads((out / 'metrics.json').read_text())


def test_shd_like_task_trains_a_1d_conv_net(tmp_path, capsys):
    out = tmp_path / 'shd'
    assert main(['train', '--task', 'shd', '--samples', '40', '--steps', '10', '--epochs', '1',
                 '--batch-size', '10', '--channels', '2,4', '--out', str(out)]) == 0
    assert 'shd: 30 train / 10 test samples, T=10, frames (1, 700)' in capsys.readouterr().out
    # (out channels, in channels, kernel): 1-D convolutions over the 700 channels
    assert first_kernel(out) == (2, 1, 7)
    metrics = metrics_of(out)
    assert metrics['run_config']['pool'] == 4 and metrics['devices'] == 1
    assert 0 <= metrics['test_accuracy'] <= 1


@pytest.mark.parametrize('sensor, size, kernel', [('audio', '32,1,1', (2, 1, 7)),
                                                  ('dvs', '8,8,2', (2, 2, 3, 3))])
def test_event_directory_trains_the_model_of_its_rank(recordings, tmp_path, sensor, size,
                                                      kernel, capsys):
    common = ['train', '--task', 'events', '--data', str(recordings / sensor), '--sensor-size',
              size, '--pool', '1', *EVENT_TINY]
    memory, streamed = tmp_path / 'memory', tmp_path / 'streamed'
    assert main([*common, '--out', str(memory)]) == 0
    assert main([*common, '--stream', '--cache-size', '4', '--out', str(streamed)]) == 0
    assert first_kernel(memory) == kernel
    a, b = metrics_of(memory), metrics_of(streamed)
    assert a['test_accuracy'] == 1.0           # the classes differ by the half of x they use
    assert a['run_config']['data'] == str(recordings / sensor)
    # streaming reads and bins the same frames: the same run
    assert a['train_loss'] == b['train_loss'] and a['test_accuracy'] == b['test_accuracy']
    capsys.readouterr()
    assert main(['evaluate', '--run', str(streamed)]) == 0
    assert 'test accuracy 100.0%' in capsys.readouterr().out


@pytest.mark.parametrize('task, steps, final', [('cue-accumulation', 2250, 150),
                                                ('delayed-match', 3200, 900)])
def test_long_memory_tasks_build_a_dense_adaptive_net_at_their_published_timing(task, steps,
                                                                                final):
    from braintrace_conv.cli.build import setup
    from braintrace_conv.cli.parser import build_parser
    from braintrace_conv.cli.resolve import resolve
    from braintrace_conv.nn import ALIF
    args = build_parser().parse_args(['train', '--task', task, '--samples', '8'])
    run = resolve(args, '')
    trainer, train_set, test_set = setup(run, '')
    assert train_set.num_steps == steps and train_set.frame_shape == (40, 1)
    assert (trainer.loss, trainer.final_steps, run.kernel_size, run.pool) == ('final', final, 1, 1)
    # at 5e-3 the surrogate gradient through the adapted reset overflowed float32 for every
    # executor (docs/benchmarks.md, long-memory tasks)
    assert (run.lr, run.clip_norm) == (1e-3, 1.0)
    neurons = [node for node in trainer.model.nodes().values() if isinstance(node, ALIF)]
    assert len(neurons) == 2 and all(float(n.tau_a) == 2000.0 for n in neurons)
    # ES-D-RTRL (the default) infers the decays, the adaptation's too: no --decay is passed
    assert trainer.learner.decay is None


@pytest.mark.parametrize('argv, said', [
    (['--algorithm', 'es-d-rtrl'], ' (decays inferred per layer)'),
    (['--decay', '0.9'], ' (decay 0.9000)'),
    (['--exact', 'blocks.1', 'fc', '--exact-budget', '1.5'],
     ' (decays inferred per layer; exact traces for blocks.1, fc; exact traces within 1.5 MiB)'),
    (['--cross-layer', '1'], ' (decays inferred per layer; one hop across layers)'),
    (['--algorithm', 'bptt'], ''),
])
def test_a_run_says_how_its_layers_are_traced(argv, said):
    from braintrace_conv.cli.build import _learner, trace_choice
    from braintrace_conv.cli.parser import build_parser
    from braintrace_conv.cli.resolve import resolve
    from braintrace_conv.models import recurrent_conv_snn
    run = resolve(build_parser().parse_args(['train', *argv]), '')
    assert trace_choice(_learner(run, recurrent_conv_snn((2, 8, 8), 2, channels=(2, 4)))) == said


def test_the_long_memory_tasks_keep_their_published_length(root, capsys):
    refused(root, capsys, ['train', '--task', 'cue-accumulation', '--steps', '100'],
            r'--steps applies only to --task moving-bars or .* \(the long-memory tasks have '
            r'their published lengths: 2250 and 3200 steps\)')
