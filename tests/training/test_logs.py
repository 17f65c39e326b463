"""What a run records: its title, TensorBoard events."""
import os

import pytest

from braintrace_conv.training import logs


def test_run_title_names_task_algorithm_and_settings():
    config = dict(task='digits', algorithm='D-RTRL', loss='final', final_steps=3,
                  update_every=5, lr=0.01, batch_size=16, channels=[4, 8], seed=2)
    assert logs.run_title(config) == ('digits, D-RTRL\nloss on the last 3 step(s) | update '
                                      'every 5 steps | lr 0.01 | batch 16 | channels 4,8 | seed 2')


def test_tensorboard_events(evaluated_run):
    pytest.importorskip('tensorboardX')
    events = os.listdir(evaluated_run[0] / 'tensorboard')
    assert any(name.startswith('events.out.tfevents') for name in events)
