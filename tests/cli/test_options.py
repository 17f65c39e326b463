"""The option records: each option defined once, the tables derived from them, what an
option depends on, what a run stores, and the library's names of option values."""
import argparse
import dataclasses
import pathlib
import re

import pytest

from braintrace_conv import cli
from braintrace_conv.cli import options
from braintrace_conv.cli.options import (EVALUATE_OPTIONS, STREAM_OPTIONS, TRAIN_OPTIONS, Option,
                                         Requires, flag, given, spell, stored_options)

CLI_SOURCES = sorted(pathlib.Path(cli.__file__).parent.glob('*.py'))
#: The options stream takes from train's records.
SHARED = ('algorithm', 'window', 'decay', 'exact', 'exact_budget', 'cross_layer', 'channels',
          'kernel_size', 'pool', 'tau', 'lr', 'clip_norm', 'seed', 'nonfinite', 'devices', 'overwrite')


def test_each_option_is_defined_in_exactly_one_record():
    sources = '\n'.join(path.read_text() for path in CLI_SOURCES)
    tables = (TRAIN_OPTIONS, EVALUATE_OPTIONS, STREAM_OPTIONS)
    for table in tables:
        names = [option.name for option in table]
        assert len(names) == len(set(names))
    # a record per meaning (stream shares train's, with a help of its own), and no other
    # table naming it
    records = list({id(option): option for option in (*TRAIN_OPTIONS, *EVALUATE_OPTIONS, *(
        o for o in STREAM_OPTIONS if o.name not in SHARED))}.values())
    for name in {option.name for option in records}:
        assert sources.count(f"Option('{name}'") == sum(o.name == name for o in records), name


def test_stream_shares_the_records_whose_meaning_it_shares():
    train = {option.name: option for option in TRAIN_OPTIONS}
    stream = {option.name: option for option in STREAM_OPTIONS}
    for name in SHARED:         # the same value, checks and storage; the help of a stream
        assert dataclasses.replace(stream[name], help='') == \
            dataclasses.replace(train[name], help=''), name
    assert stream['update_every'] is not train['update_every']     # a default of its own
    assert spell('chunk_steps') == '--update-every' and spell('max_steps') == '--max-steps'


@pytest.mark.parametrize('command, table', [('train', TRAIN_OPTIONS),
                                            ('stream', STREAM_OPTIONS)])
def test_help_lists_every_record_and_nothing_else(capsys, command, table):
    assert cli.main([command, '--help']) == 0
    listed = set(re.findall(r'^  (--[a-z-]+)', capsys.readouterr().out, re.M)) - {'--help'}
    assert listed == {flag(option.name) for option in table}


def test_the_old_tables_are_views_of_the_records():
    assert options.TASK_DEFAULTS['moving-bars'] == dict(epochs=6, samples=2048, size=16, steps=20)
    assert options.TASK_DEFAULTS['delayed-bars'] == dict(
        epochs=24, lr=2e-3, clip_norm=1.0, samples=768, size=8, steps=128, delay=24, cues=4,
        tau=5.0, loss='final')
    assert options.TASK_DEFAULTS['events'] == dict(epochs=6, steps=20)
    assert options.MODEL_DEFAULTS == {1: dict(kernel_size=7, pool=4),
                                      2: dict(kernel_size=3, pool=1),
                                      3: dict(kernel_size=3, pool=1)}
    assert set(options.RUN_OPTIONS) == {
        'task', 'algorithm', 'epochs', 'batch_size', 'seed', 'lr', 'samples', 'size', 'steps',
        'test_fraction', 'channels', 'kernel_size', 'pool', 'tau', 'decay', 'update_every',
        'loss', 'final_steps', 'target_rates', 'rate_target', 'rate_strength', 'nonfinite',
        'data', 'sensor_size', 'window_us', 'stream', 'window', 'delay', 'cues', 'clip_norm',
        'verify_data', 'tau_adapt', 'exact', 'exact_budget', 'cross_layer'}


def test_library_names_of_option_values_are_spelled_as_the_options():
    assert spell('T') == spell('num_steps') == spell('n_time_bins') == '--steps'
    assert spell('channels[1]') == '--channels' and spell('n_samples') == '--samples'
    assert spell('update_every') == '--update-every' and spell('rate_targets') == '--rate-target'
    assert spell('allow_data_change') == '--allow-data-change'
    assert spell('training_samples') is None and spell('the learner') is None


def test_requirements_say_what_an_option_depends_on():
    stream = Requires('stream')
    assert stream.met({'stream': True}) and not stream.met({'stream': False})
    assert stream.refusal('cache_size') == '--cache-size applies only with --stream'
    window = Requires('algorithm', ('d-rtrl', 'es-d-rtrl'), word='to', note='BPTT is exact')
    assert window.met({'algorithm': 'd-rtrl'}) and not window.met({'algorithm': 'bptt'})
    assert window.refusal('window') == ('--window applies only to --algorithm d-rtrl or '
                                        'es-d-rtrl (BPTT is exact)')
    by_name = {option.name: option for option in TRAIN_OPTIONS}
    assert [r.option for r in by_name['target_rates'].requires] == ['loss']
    assert [r.option for r in by_name['rate_strength'].requires] == ['rate_target']
    assert [r.option for r in by_name['decay'].requires] == ['algorithm']


def resolved(*argv):
    args = cli.build_parser().parse_args(['train', *argv])
    return vars(cli.resolve.resolve(args, args.usage))


def test_a_run_stores_the_options_that_define_it():
    stored = stored_options(resolved('--samples', '48'))
    assert set(stored) == set(options.RUN_OPTIONS) - {
        'target_rates', 'rate_target', 'rate_strength', 'window', 'delay', 'cues', 'clip_norm',
        'verify_data', 'tau_adapt', 'exact', 'exact_budget', 'cross_layer'}
    assert stored['channels'] == [8, 16] and stored['final_steps'] == 1
    assert 'devices' not in stored and 'out' not in stored and 'log_every' not in stored
    effective = stored_options(resolved('--loss', 'count-mse', '--rate-target', '0.1'))
    assert effective['target_rates'] == [0.8, 0.2] and effective['rate_strength'] == 1.0
    assert stored_options(resolved('--task', 'delayed-bars'))['cues'] == 4


def test_resolving_leaves_the_parsed_arguments_as_they_were():
    args = cli.build_parser().parse_args(['train', '--task', 'digits'])
    before = dict(vars(args))
    run = cli.resolve.resolve(args, args.usage)
    assert vars(args) == before and args.samples is None and run.samples == 1797
    assert isinstance(run, argparse.Namespace) and run.kernel_size == 3


@pytest.mark.parametrize('value, expected', [(None, False), (False, False), ((), False),
                                             ([], False), (0, True), (True, True), ('x', True)])
def test_given(value, expected):
    assert given(value) is expected


def test_a_record_with_a_task_default_falls_back_to_its_default():
    option = Option('lr', default=5e-3, task_defaults={'delayed-bars': 2e-3})
    assert option.default_for('delayed-bars') == 2e-3 and option.default_for('digits') == 5e-3
