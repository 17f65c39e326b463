"""The one family of argument checks: name first, one sentence (name, expected, value, fix),
one exception convention, and messages a caller can render with its own names."""
import pickle

import numpy as np
import pytest

from braintrace_conv import _validation as check

# (check, arguments after the value, a value of the wrong type, a bad value of the right type)
CHECKS = [
    (check.positive, (), 1.5, 0),
    (check.positive, (float,), 'a', -1.0),
    (check.positive_ints, (2,), 'ab', (1, 0)),
    (check.non_negative, (), 2.0, -1),
    (check.class_labels, (3,), np.zeros(2), np.array([0, 3])),
    (check.integer, (), 2.0, -1),
    (check.number, (), '1', float('nan')),
    (check.interval, (0.0, 1.0, '(]'), 'x', 1.5),
    (check.positive_range, (), 3, (2.0, 1.0)),
    (check.height_width, (), 3, (4, 0)),
    (check.label_array, (3,), np.zeros(2), np.array([0, 3])),
    (check.per_class_names, (2,), ('a', 1), ('a',)),
    (check.index_array, (), np.zeros(2), np.zeros((2, 2), int)),
]


@pytest.mark.parametrize('fn, args, wrong_type, bad_value', CHECKS)
def test_wrong_type_is_a_type_and_a_value_error_bad_value_a_value_error(fn, args, wrong_type,
                                                                        bad_value):
    kwargs = dict(sign='non-negative') if fn in (check.integer, check.number) else {}
    with pytest.raises(check.WrongTypeError, match=r'^arg\S* must .*, got .*\.$') as wrong:
        fn('arg', wrong_type, *args, **kwargs)
    assert isinstance(wrong.value, TypeError) and isinstance(wrong.value, ValueError)
    with pytest.raises(check.ArgumentError, match=r'^arg\S* must .*, got .*\.$') as bad:
        fn('arg', bad_value, *args, **kwargs)
    assert not isinstance(bad.value, TypeError)


@pytest.mark.parametrize('call, message', [
    (lambda: check.integer('n', 2.0), 'n must be an integer, got 2.0.'),
    (lambda: check.integer('n', 0, sign='positive'), 'n must be a positive integer, got 0.'),
    (lambda: check.positive('n', True), 'n must be a positive integer, got True.'),
    (lambda: check.number('x', -0.5, sign='non-negative'),
     'x must be a non-negative number, got -0.5.'),
    (lambda: check.number('x', np.float32(np.inf)), 'x must be a finite number, got inf.'),
    (lambda: check.positive_range('speed', (0, 1)), 'speed[0] must be a positive number, got 0.'),
    (lambda: check.interval('p', 1.0, 0, 1, '[)'), 'p must be a number in [0, 1), got 1.0.'),
    (lambda: check.one_of('mode', 'c', ('a', 'b')), "mode must be one of ('a', 'b'), got 'c'."),
    (lambda: check.per_class_names('class_names', 'ab', 2),
     "class_names must be 2 strings, got 'ab'."),
    (lambda: check.class_labels('labels', np.array([0, 9]), 8),
     'labels must lie in [0, 8) (the model has 8 outputs), got values in [0, 9].'),
    (lambda: check.finite('xs', np.array([[1.0, np.nan]]), ('t', 'b')),
     'xs must be finite, got nan at t=0, b=1 (1 non-finite value(s) in all).'),
    (lambda: check.floating_dtype('dtype', 'int8'),
     "dtype must be a floating-point dtype such as jnp.float32, got 'int8'."),
])
def test_every_message_is_one_sentence_naming_the_argument_and_the_value(call, message):
    with pytest.raises(check.ArgumentError) as error:
        call()
    assert str(error.value) == message


def test_numbers_take_numpy_scalars_and_zero_d_arrays_but_no_bools_or_complex():
    assert check.integer('n', np.int64(3), sign='positive') == 3
    assert type(check.number('x', 2)) is float
    assert check.number('x', np.asarray(0.5)) == 0.5
    assert check.interval('p', np.float32(0.25), 0, 1) == 0.25
    for bad in (True, np.bool_(False), 1j, np.ones(2)):
        with pytest.raises(check.WrongTypeError):
            check.number('x', bad)


def test_a_message_names_other_arguments_and_a_fix_and_renders_with_the_callers_names():
    with pytest.raises(check.ArgumentError) as error:
        check.at_most('window', 8, 4, 'update_every', fix='a window never spans two chunks',
                      names={'window': "the learner's window"})
    err = error.value
    assert str(err) == ("the learner's window must be at most update_every (4), got 8; a window "
                        "never spans two chunks.")
    assert (err.name, err.value, err.refs) == ('window', 8, ('update_every',))
    spell = {'window': '--window', 'update_every': '--update-every'}.get
    assert err.render(spell) == ('--window must be at most --update-every (4), got 8; a window '
                                 'never spans two chunks.')
    # a name the caller does not know keeps the library's words
    assert err.render({'update_every': '--update-every'}.get).startswith("the learner's window")
    assert check.at_most('window', 4, 4, 'update_every') == 4


def test_optional_offers_none_to_the_library_only():
    assert check.optional(check.integer, 'window', None, means='traces only') is None
    assert check.optional(check.integer, 'window', 3, sign='positive', means='traces only') == 3
    with pytest.raises(check.WrongTypeError) as error:
        check.optional(check.integer, 'window', 2.5, sign='positive', means='traces only')
    assert str(error.value) == ('window must be None (traces only) or a positive integer, '
                                'got 2.5.')
    # a caller with names of its own leaves an option out instead of passing None
    assert error.value.render({'window': '--window'}.get) == ('--window must be a positive '
                                                              'integer, got 2.5.')


def test_errors_survive_pickling():
    error = check.ArgumentError('a', 1, 'be {b}', refs=('b',), names={'b': 'the b'})
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is check.ArgumentError and str(copy) == str(error) == \
        'a must be the b, got 1.'
    assert copy.render({'b': '--b'}.get) == 'a must be --b, got 1.'
