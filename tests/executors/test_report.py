"""Reports: one row per parameter leaf saying how its gradient is computed, and the
trace memory."""
import jax.numpy as jnp
import pytest

import braintrace_conv as bc
from snn_reference import xent
from user_models import SpikingConvNet

pytestmark = pytest.mark.usefixtures('float64')


def test_report_describes_every_parameter():
    model = SpikingConvNet(recurrent=True)
    xs = jnp.zeros((2, 2, 8, 8, 2))
    labels = jnp.zeros((2, 2), jnp.int32)
    across = 'truncated across layers (its effect through the dynamics of later layers is cut)'
    recurrent = 'recurrent synapses onto the same neurons are cut'
    for learner, word in [(bc.D_RTRL(model), 'exact within its layer'),
                          (bc.ES_D_RTRL(model, 0.9), 'approximate trace (ES-D-RTRL')]:
        learner.value_and_grad(xent, xs, labels)
        report = learner.report()
        rows = {r['parameter']: r for r in report.rows}
        assert set(rows) == {'K1', 'b1', 'K2', 'b2', 'R2', 'W'}
        # layer 1 feeds layer 2: nothing of it is labelled plainly exact
        assert word in rows['K1']['method'] and across in rows['K1']['method']
        assert rows['K1']['trace_bytes'] > 0
        assert rows['b1']['method'].startswith('exact within its layer, ' + across)
        # layer 2 feeds itself through R2
        for name in ('K2', 'b2', 'R2'):
            assert recurrent in rows[name]['method'], rows[name]
        assert rows['W']['method'].startswith('exact (instantaneous')
        assert 'K1' in str(report)
    d, es = bc.D_RTRL(model), bc.ES_D_RTRL(model, 0.9)
    d.value_and_grad(xent, xs, labels)
    es.value_and_grad(xent, xs, labels)
    assert d.report().trace_bytes > 5 * es.report().trace_bytes
