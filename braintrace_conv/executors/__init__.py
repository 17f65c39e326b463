"""Executors: BPTT (reference), D-RTRL (exact traces) and ES-D-RTRL (linear memory).

A new online executor subclasses :class:`OnlineLearner`; every other extension
point is in :mod:`braintrace_conv.extend`.
"""
from ._analysis.positions import register_elementwise
from .base import Learner, OnlineLearner, Report
from .bptt import BPTT
from .d_rtrl import D_RTRL
from .es_d_rtrl import ES_D_RTRL

__all__ = ['Learner', 'OnlineLearner', 'Report', 'BPTT', 'D_RTRL', 'ES_D_RTRL',
           'register_elementwise']
