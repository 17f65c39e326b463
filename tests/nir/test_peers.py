"""Spike parity with snnTorch, Norse and Sinabs through NIR files, both directions
(``pytest -m nir_peers``; the peers run in their own environments, see
``benchmarks/nir_peers.py``). Cases a released peer cannot write or read are checked to
still fail the way the documentation quotes."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import nir_peers  # noqa: E402

pytest.importorskip('nir')
pytestmark = [pytest.mark.nir_peers, pytest.mark.usefixtures('float64')]

#: What each released peer cannot do, with the start of the error it raises.
PEER_LIMITS = {
    'recurrent conv (RLeaky with a conv)': 'ValueError: operands could not be broadcast',
    'conv-LIFBox-IAF': 'TypeError: One of data, shape or dtype must be specified',
    ('here -> peer', 'snntorch', 'conv-IF'): 'TypeError: conv2d() received an invalid combination',
    ('here -> peer', 'norse', 'conv-LIF-avgpool, channels first'): "NotImplementedError: "
                                                                    "norse.torch.from_nir",
}


def _limit(case):
    return PEER_LIMITS.get(case.name) or PEER_LIMITS.get((case.direction, case.peer, case.name))


@pytest.mark.parametrize('case', nir_peers.CASES,
                         ids=[f'{c.direction}:{c.peer}:{c.name}' for c in nir_peers.CASES])
def test_spikes_agree_at_every_step(case):
    if not os.path.exists(nir_peers.PYTHONS[case.peer]):
        pytest.skip(f'{case.peer} is not installed at {nir_peers.PYTHONS[case.peer]} '
                    f'(benchmarks/nir_peers.py says how)')
    result = nir_peers.run_case(case, steps=30)
    if _limit(case):
        assert result.get('error', '').startswith(_limit(case)), result
        return
    assert 'error' not in result, result
    layers = result['layers'].values()
    assert len(layers) >= 2 and sum(r['spikes'] for r in layers) > 0, result
    assert result['identical'], result
