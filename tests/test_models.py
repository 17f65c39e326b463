"""The standard models: their structure, every rank, and their argument errors."""
import brainstate
import numpy as np
import pytest

import braintrace_conv as bc
from braintrace_conv.models import recurrent_conv_snn, standard_benchmark_snn

SIZE = (8, 8)


def tiny_model(seed=0, channels=(2, 4)):
    brainstate.random.seed(seed)
    return recurrent_conv_snn((2,) + SIZE, 8, channels=channels)


# ----------------------------------------------------------------------------- models
def test_standard_benchmark_snn_structure():
    model = standard_benchmark_snn()
    shapes = {'.'.join(map(str, k)): np.shape(st.value)
              for k, st in model.states(brainstate.ParamState).items()}
    assert shapes == {'blocks.0.ff.weight': (8, 2, 3, 3), 'blocks.0.ff.bias': (8,),
                      'blocks.1.ff.weight': (16, 8, 3, 3), 'blocks.1.ff.bias': (16,),
                      'fc.weight': (16 * 16 * 16, 10), 'fc.bias': (10,)}
    brainstate.nn.init_all_states(model, 3)
    assert model(np.zeros((3, 2, 32, 32), np.float32)).shape == (3, 10)
    assert model.membrane_decay() == pytest.approx(np.exp(-0.1))


@pytest.mark.parametrize('in_shape, pool', [((2,) + SIZE, 1), ((1, 40), 2)])
def test_every_parameter_goes_through_etp_ops(in_shape, pool):
    brainstate.random.seed(0)
    model = recurrent_conv_snn(in_shape, 8, channels=(2, 4), pool=pool)
    learner = bc.ES_D_RTRL(model, model.membrane_decay())
    learner.predict(np.zeros((1, 2) + in_shape, np.float32))
    report = learner.report()
    assert len(report.rows) == len(model.states(brainstate.ParamState))
    for row in report.rows:
        assert 'via etp_' in row['method'] and 'non-ETP' not in row['method'], row


@pytest.mark.parametrize('in_shape, kernel, features', [
    ((1, 700), (4, 1, 7), 6 * 87),                # 700 -pool-> 350 -stride-> 175 -pool-> 87
    ((2, 9, 9), (4, 2, 3, 3), 6 * 1 * 1),         # 9 -pool-> 4 -stride-> 2 -pool-> 1
    ((2, 8, 8, 8), (4, 2, 3, 3, 3), 6 * 1 * 1 * 1),
])
def test_models_of_every_rank_pool_after_the_neurons(in_shape, kernel, features):
    brainstate.random.seed(0)
    model = recurrent_conv_snn(in_shape, 5, channels=(4, 6), kernel_size=kernel[-1], pool=2)
    assert model.blocks[0].ff.weight.value.shape == kernel
    assert model.blocks[1].rec.weight.value.shape[:2] == (6, 6)
    assert len(model.pools) == 2 and model.fc.weight.value.shape == (features, 5)
    brainstate.nn.init_all_states(model, 3)
    assert model(np.ones((3,) + in_shape, np.float32)).shape == (3, 5)


def test_model_rejects_wrong_input_shape_and_arguments():
    model = tiny_model()
    brainstate.nn.init_all_states(model, 2)
    with pytest.raises(ValueError, match='expects inputs'):
        model(np.zeros((2, 2, 9, 9), np.float32))
    with pytest.raises(ValueError, match='readout'):
        recurrent_conv_snn((2, 8, 8), 8, readout='softmax')
    with pytest.raises(ValueError, match=r'channels\[1\]'):
        recurrent_conv_snn((2, 8, 8), 8, channels=(4, 0))
    with pytest.raises(ValueError, match=r'in_shape must be \(C, \*spatial\) with 1 to 3 spatial'):
        recurrent_conv_snn((700,), 8)
    with pytest.raises(ValueError, match=r'pool=3 is larger than the output of block 1, of shape '
                                         r'\(C, \*spatial\) = \(4, 1\)'):
        recurrent_conv_snn((1, 6), 8, channels=(2, 4), pool=3)
    with pytest.raises(ValueError, match='tau_adapt must be a positive number, got 0.0'):
        recurrent_conv_snn((2, 8, 8), 8, tau_adapt=0.0)


def test_adaptive_neurons_are_traced_exactly_within_their_layer():
    brainstate.random.seed(0)
    model = recurrent_conv_snn((40, 1), 2, channels=(4, 4), kernel_size=1, tau_adapt=500.0)
    assert all(isinstance(b.neuron, bc.nn.ALIF) for b in model.blocks)
    learner = bc.D_RTRL(model)
    learner.predict(np.ones((3, 2, 40, 1), np.float32))
    methods = {r['parameter']: r['method'] for r in learner.report().rows}
    assert methods['blocks.0.ff.weight'].startswith('exact within its layer')
