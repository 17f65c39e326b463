"""The shared argument checks: name first, one exception convention."""
import numpy as np
import pytest

from braintrace_conv import _validation as check

# (check, arguments after the name, a value of the wrong type, a bad value of the right type)
CHECKS = [
    (check.positive, (), 1.5, 0),
    (check.positive, (float,), 'a', -1.0),
    (check.positive_ints, (2,), 'ab', (1, 0)),
    (check.non_negative, (), 2.0, -1),
    (check.class_labels, (3,), np.zeros(2), np.array([0, 3])),
    (check.integer, (), 2.0, -1),
    (check.number, (), '1', float('nan')),
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
    with pytest.raises(check.WrongTypeError, match='^arg ') as wrong:
        fn('arg', wrong_type, *args, **kwargs)
    assert isinstance(wrong.value, TypeError) and isinstance(wrong.value, ValueError)
    with pytest.raises(ValueError, match='^arg') as bad:
        fn('arg', bad_value, *args, **kwargs)
    assert not isinstance(bad.value, TypeError)


def test_integer_and_number_name_type_and_sign_apart():
    assert check.integer('n', np.int64(3), sign='positive') == 3
    assert type(check.number('x', 2)) is float
    with pytest.raises(TypeError, match='^n must be an int, got float$'):
        check.integer('n', 2.0)
    with pytest.raises(ValueError, match='^n must be positive, got 0$'):
        check.integer('n', 0, sign='positive')
    with pytest.raises(ValueError, match='^x must be non-negative, got -0.5$'):
        check.number('x', -0.5, sign='non-negative')
    with pytest.raises(ValueError, match=r'^speed\[0\] must be positive, got 0.0$'):
        check.positive_range('speed', (0, 1))


@pytest.mark.parametrize('value', ['ab', 5])
def test_class_names_must_be_a_collection_of_strings(value):
    with pytest.raises(TypeError, match=f'^class_names must be 2 strings, got {value!r}$'):
        check.per_class_names('class_names', value, 2)
