"""Small trainers and data for the training tests, and the check that a refused call changes
nothing (imported by the tests under tests/training/ and their conftest)."""
import hashlib
import json
import os

import brainstate
import numpy as np
import optax
import pytest

import braintrace_conv as bc
from braintrace_conv.data import EventDataset
from braintrace_conv.models import recurrent_conv_snn
from braintrace_conv.training import Trainer
from braintrace_conv.training.state import snapshot

#: Time steps, frame size and classes of the moving bars the training tests use.
T, SIZE, K = 6, (8, 8), 8


def model(seed=0, channels=(2, 4)):
    """A recurrent conv net for (2, 8, 8) frames and 8 classes, its weights drawn from ``seed``."""
    brainstate.random.seed(seed)
    return recurrent_conv_snn((2,) + SIZE, K, channels=channels)


def trainer(seed=0, optimizer='adam', channels=(2, 4), lr=1e-2, **kwargs):
    """An ES-D-RTRL trainer of :func:`model` with Adam (``lr``), or ``optimizer``."""
    m = model(seed, channels)
    opt = optax.adam(lr) if optimizer == 'adam' else optimizer
    return Trainer(bc.ES_D_RTRL(m, m.membrane_decay()), opt, **kwargs)


def events_with(value, at, n=16):
    """A dataset of n samples whose events hold ``value`` at index ``at`` (sample, t, c, y, x)."""
    events = (np.random.default_rng(0).random((n, T, 2) + SIZE) < 0.3).astype(np.float32)
    events[at] = value
    return EventDataset(events, np.arange(n) % K, K)


def params_of(tr) -> dict:
    """The trainer's parameters as NumPy arrays, keyed like ``model.states(ParamState)``."""
    states = tr.model.states(brainstate.ParamState)
    return {k: np.asarray(st.value) for k, st in states.items()}


def state_of(tr) -> tuple:
    """Everything a failed call must leave unchanged: what a checkpoint of ``tr`` holds now
    (parameters, optimiser state, counters, history, generators)."""
    arrays, meta = snapshot(tr)
    return {name: np.array(a) for name, a in arrays.items()}, json.dumps(meta, sort_keys=True)


def files_of(directory) -> dict:
    """Every file's content digest under ``directory``."""
    return {os.path.relpath(os.path.join(root, f), directory):
            hashlib.sha256(open(os.path.join(root, f), 'rb').read()).hexdigest()
            for root, _, names in os.walk(directory) for f in names}


def assert_same(a: tuple, b: tuple) -> None:
    """Two :func:`state_of` results are equal (arrays bitwise)."""
    assert a[0].keys() == b[0].keys() and a[1] == b[1]
    for name in a[0]:
        assert a[0][name].dtype == b[0][name].dtype, name
        assert np.array_equal(a[0][name], b[0][name]), name


def refused(tr, call, error, match, directory=None):
    """``call()`` raises ``error`` matching ``match`` and changes neither ``tr`` nor ``directory``."""
    before, disk = state_of(tr), files_of(directory) if directory else None
    with pytest.raises(error, match=match):
        call()
    assert_same(before, state_of(tr))
    if directory is not None:
        assert files_of(directory) == disk
