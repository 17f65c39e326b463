"""Executors: BPTT (reference), D-RTRL (exact traces) and ES-D-RTRL (linear memory)."""
from .base import Learner, Report
from .bptt import BPTT
from .d_rtrl import D_RTRL
from .es_d_rtrl import ES_D_RTRL
from ._analysis.positions import register_elementwise

__all__ = ['Learner', 'Report', 'BPTT', 'D_RTRL', 'ES_D_RTRL', 'register_elementwise']
