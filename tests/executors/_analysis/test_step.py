"""States that pass values along (``step.py``): each state's new value, and each
recurrent op's input read elsewhere too, is a value of its own, so that delay lines
and pipelined layers fall into the groups and cuts they feed."""
import brainstate
import jax.numpy as jnp
import pytest

import braintrace_conv as bc
from user_models import IN, K, analysed

pytestmark = pytest.mark.usefixtures('float64')


class DelayLine(brainstate.nn.Module):
    """``v = 0.9 h + W x + 0.1 d2 + 0.1 e``; ``h = v`` and ``e = v`` (two states share a new
    value); ``d2 = d1``; ``d1 = W x`` (the op's output itself); readout from ``v``."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(jnp.ones((IN, K)))

    def init_state(self, batch_size=None, **kw):
        for name in ('h', 'd1', 'd2', 'e'):
            setattr(self, name, brainstate.HiddenState(jnp.zeros((batch_size, K))))

    def update(self, x):
        y = bc.dense(x, self.W.value)
        v = 0.9 * self.h.value + y + 0.1 * self.d2.value + 0.1 * self.e.value
        self.h.value = v
        self.e.value = v
        self.d2.value = self.d1.value
        self.d1.value = y
        return jnp.tanh(v)


def test_states_that_pass_values_along_are_in_their_group():
    """A state whose new value is another state's old value, an op's output, or another
    state's new value still has a new value of its own, in the group it feeds."""
    graph, *_ = analysed(DelayLine())
    new = graph.step.new_hidden_vars
    assert len(set(new)) == len(new)          # each state's new value is its own variable
    grp, = graph.groups
    assert sorted(grp.names) == ['d1', 'd2', 'e', 'h']
    assert graph.ops[0].group == 0


class Pipeline(brainstate.nn.Module):
    """Layer 2 reads layer 1's value of the step before (``buf``) and layer 2's own old
    value through a recurrent op; the output reads ``buf`` too."""

    def __init__(self):
        super().__init__()
        self.W1 = brainstate.ParamState(jnp.ones((IN, K)))
        self.W2 = brainstate.ParamState(jnp.ones((K, K)))
        self.R = brainstate.ParamState(jnp.ones((K, K)))

    def init_state(self, batch_size=None, **kw):
        for name in ('h1', 'buf', 'h2'):
            setattr(self, name, brainstate.HiddenState(jnp.zeros((batch_size, K))))

    def update(self, x):
        v1 = 0.9 * self.h1.value + bc.dense(x, self.W1.value)
        h2_old = self.h2.value
        v2 = 0.8 * h2_old + bc.dense(self.buf.value, self.W2.value) + bc.dense(h2_old, self.R.value)
        self.h1.value, self.buf.value, self.h2.value = v1, jnp.tanh(v1), v2
        return jnp.tanh(v2) + h2_old


def test_an_old_value_read_by_another_layer_is_cut_and_a_recurrent_one_is_given():
    graph, *_ = analysed(Pipeline())
    step = graph.step
    first = next(g for g in graph.groups if 'h1' in g.names)
    second = next(g for g in graph.groups if g.names == ['h2'])
    buf_old = step.hidden_vars[step.hidden_names.index('buf')]
    # layer 2's op reads buf's old value: it stays in layer 1's cut, so its learning signal
    # reaches layer 1's trace of the step before
    assert buf_old in first.cut and first.feeds == {graph.groups.index(second)}
    # h2's old value feeds its own recurrent op (given: the recurrent-synapse cut) and the
    # output (a path of the step): the op reads a copy of its own, the output the cut value
    h2_old = step.hidden_vars[step.hidden_names.index('h2')]
    recurrent = next(op for op in graph.ops if op.slot_params['weight'] == [step.param_names.index('R')])
    assert recurrent.x_var is not h2_old and recurrent.x_var not in second.cut
