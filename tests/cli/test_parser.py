"""The parser built from the option records, and library errors as usage errors that name
the options."""
import pytest

from braintrace_conv._validation import ArgumentError, at_most
from braintrace_conv.cli import build_parser
from braintrace_conv.cli.options import EVALUATE_OPTIONS, STREAM_OPTIONS, TRAIN_OPTIONS
from braintrace_conv.cli.parser import UsageError, usage_error


@pytest.mark.parametrize('argv, table', [
    (['train'], TRAIN_OPTIONS), (['evaluate', '--run', 'runs/x'], EVALUATE_OPTIONS),
    (['stream', '--recordings', 'a.npy', '--sensor-size', '8,8,2'], STREAM_OPTIONS)])
def test_every_argument_comes_from_its_record(argv, table):
    parsed = vars(build_parser().parse_args(argv))
    assert set(parsed) - {'command', 'usage'} == {option.name for option in table}
    # defaults are filled in when resolved, so an option not given is left unset
    assert all(parsed[option.name] in (None, False) for option in table if not option.required)


def test_values_are_converted_by_their_records_types():
    args = build_parser().parse_args(['train', '--channels', '4,8', '--target-rates', '0.9',
                                      '0.1', '--rate-target', '0.1', '--stream', '--lr', '1e-3'])
    assert args.channels == (4, 8) and args.target_rates == [0.9, 0.1]
    assert args.rate_target == [0.1] and args.stream is True and args.lr == 1e-3
    with pytest.raises(UsageError, match='the following arguments are required: --run'):
        build_parser().parse_args(['evaluate'])


def test_parse_errors_are_usage_errors():
    with pytest.raises(UsageError, match="argument --task: invalid choice: 'cifar'") as error:
        build_parser().parse_args(['train', '--task', 'cifar'])
    assert error.value.usage.startswith('usage: braintrace-conv train')
    with pytest.raises(UsageError, match='not allowed with argument --resume'):
        build_parser().parse_args(['train', '--resume', '--overwrite'])


def test_a_library_error_names_the_options_its_arguments_came_from():
    with pytest.raises(ArgumentError) as error:
        at_most('window', 8, 4, 'update_every', fix='a window never spans two online chunks')
    converted = usage_error(error.value, 'usage: x')
    assert str(converted) == ('--window must be at most --update-every (4), got 8; a window '
                              'never spans two online chunks.')
    assert converted.usage == 'usage: x'
    assert str(usage_error(ValueError('no such file'), '', prefix='--data: ')) == \
        '--data: no such file'
