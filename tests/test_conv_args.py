"""The conv argument surface: padding forms, dimension numbers, groups and dilations, each bad
argument refused by name before any compute."""
import pytest
from jax import lax

from braintrace_conv.conv_args import conv_params, dilated_extent, normalise_padding

DEFAULTS = dict(strides=(1, 1), padding='SAME', lhs_dilation=None, rhs_dilation=None,
                feature_group_count=1, batch_group_count=1, dimension_numbers=None,
                precision=None, preferred_element_type=None)


def test_dilated_extent():
    assert dilated_extent(3, 1) == 3 and dilated_extent(3, 2) == 5 and dilated_extent(1, 7) == 1


@pytest.mark.parametrize('padding, kwargs, expected', [
    ('same', {}, 'SAME'),
    ('Valid', {}, 'VALID'),
    (((1, 2), (0, 0)), {}, ((1, 2), (0, 0))),
    ([(-1, 0), (0, 1)], {}, ((-1, 0), (0, 1))),          # lax crops with negative pairs
    (2, dict(shorthand=True), ((2, 2), (2, 2))),
    ((1, (0, 3)), dict(shorthand=True), ((1, 1), (0, 3))),
])
def test_padding_forms(padding, kwargs, expected):
    assert normalise_padding(padding, 2, **kwargs) == expected


@pytest.mark.parametrize('padding, kwargs, error, match', [
    ('FULL', {}, ValueError, r"padding must be one of \('SAME', 'SAME_LOWER', 'VALID'\)"),
    (2, {}, TypeError, r'padding must be a string or a sequence of 2 \(low, high\) int pairs'),
    (((1, 1),), {}, ValueError, r'padding must have 2 \(low, high\) pairs, got 1'),
    (((-1, 0), (0, 0)), dict(crop=False), ValueError, 'non-negative'),
    ((1.5, 1), dict(shorthand=True), TypeError, r'an int, 2 ints or 2 \(low, high\) int pairs'),
])
def test_bad_padding_is_named(padding, kwargs, error, match):
    with pytest.raises(error, match=match):
        normalise_padding(padding, 2, **kwargs)


def test_defaults_and_dimension_numbers():
    params = conv_params((2, 3, 8, 8), (4, 3, 3, 3), **DEFAULTS)
    assert params['dimension_numbers'] == lax.ConvDimensionNumbers((0, 1, 2, 3), (0, 1, 2, 3),
                                                                   (0, 1, 2, 3))
    assert params['lhs_dilation'] == params['rhs_dilation'] == (1, 1)
    nhwc = conv_params((2, 8, 8, 3), (3, 3, 3, 4),
                       **dict(DEFAULTS, dimension_numbers=('NHWC', 'HWIO', 'NHWC')))
    assert nhwc['dimension_numbers'] == lax.conv_dimension_numbers(
        (1,) * 4, (1,) * 4, ('NHWC', 'HWIO', 'NHWC'))
    grouped = conv_params((2, 4, 8, 8), (6, 2, 3, 3), **dict(DEFAULTS, feature_group_count=2))
    assert grouped['feature_group_count'] == 2


@pytest.mark.parametrize('x, kernel, changes, match', [
    ((2, 3), (4, 3), {}, r'x must have rank >= 3'),
    ((2, 3, 8, 8), (4, 3, 3), {}, r'kernel must have the same rank as x \(4\)'),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(feature_group_count=2), r'feature_group_count \(2\) must '
                                                              r'divide the input channels \(3\)'),
    ((2, 4, 8, 8), (4, 4, 3, 3), dict(feature_group_count=2), 'kernel input-channel size'),
    ((3, 4, 8, 8), (4, 4, 3, 3), dict(batch_group_count=2), r'batch_group_count \(2\) must '
                                                            r'divide the batch size \(3\)'),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(lhs_dilation=(2, 2)), 'not defined together with '
                                                          'lhs_dilation'),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(strides=None), 'strides is required'),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(dimension_numbers=('NCHW', 'OIHW')),
     'dimension_numbers must be None, a ConvDimensionNumbers or a triple'),
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(dimension_numbers=('NCHW', 'OIHW', 'NCWZ')),
     'must name the same spatial characters'),
])
def test_bad_arguments_are_named_before_any_compute(x, kernel, changes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        conv_params(x, kernel, **dict(DEFAULTS, **changes))
