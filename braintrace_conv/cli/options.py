"""The options of ``braintrace-conv train`` and what they default to, by task and frame rank."""
from __future__ import annotations

#: Per-task defaults: samples, frame size (pixels), time steps, epochs (and for
#: delayed-bars the trials, their blank steps, the membrane time constant and the
#: training: a loss at the last step, whose gradient through the delay needs clipping).
#: A task without ``samples`` or ``size`` takes them from its data (the option is refused).
TASK_DEFAULTS = {
    'moving-bars': dict(samples=2048, size=16, steps=20, epochs=6),
    'delayed-bars': dict(samples=768, size=8, steps=128, cues=4, delay=24, tau=5.0,
                         loss='final', lr=2e-3, clip_norm=1.0, epochs=24),
    'digits': dict(samples=1797, size=16, steps=24, epochs=6),
    'shd': dict(samples=1000, steps=50, epochs=8),
    'events': dict(steps=20, epochs=6),
}
#: Model defaults by the number of spatial axes of the frames: kernel extent and the
#: pooling window after each block (1-D streams over many channels are pooled).
MODEL_DEFAULTS = {1: dict(kernel_size=7, pool=4), 2: dict(kernel_size=3, pool=1),
                  3: dict(kernel_size=3, pool=1)}
#: Channels of the SHD-like task (those of the Spiking Heidelberg Digits).
SHD_CHANNELS = 700
#: Samples whose frames a streamed dataset keeps in memory, unless --cache-size says.
DEFAULT_CACHE_SIZE = 256
#: Smallest frame (pixels per side) of each synthetic task that poses it: moving bars
#: smaller than 4 x 4 give identical recordings for different directions; digits need
#: room for a digit of 8 pixels.
MIN_SIZE = {'moving-bars': 4, 'delayed-bars': 4, 'digits': 8}
#: Defaults of the options that a task may set otherwise (``TASK_DEFAULTS``).
OVERRIDABLE_DEFAULTS = dict(loss='every-step', lr=5e-3, tau=10.0)
#: Largest --seed (the generators take 64-bit seeds).
MAX_SEED = 2**63 - 1
ALGORITHMS = ('es-d-rtrl', 'd-rtrl', 'bptt')
#: The options that define a run: stored with it, and equal on ``--resume``.
RUN_OPTIONS = ('task', 'algorithm', 'epochs', 'batch_size', 'seed', 'lr', 'samples', 'size',
               'steps', 'test_fraction', 'channels', 'kernel_size', 'pool', 'tau', 'decay',
               'update_every', 'loss', 'final_steps', 'target_rates', 'rate_target',
               'rate_strength', 'nonfinite', 'data', 'sensor_size', 'window_us', 'stream',
               'window', 'delay', 'cues', 'clip_norm')
# Run options given as several values (``--target-rates 0.9 0.1``), not comma-separated.
MULTI_VALUE_OPTIONS = ('target_rates', 'rate_target')
# Options that only some tasks take.
_BARS_AND_DIGITS = ('moving-bars', 'delayed-bars', 'digits')
_TASK_OPTIONS = {'size': _BARS_AND_DIGITS, 'samples': (*_BARS_AND_DIGITS, 'shd'),
                 'delay': ('delayed-bars',), 'cues': ('delayed-bars',),
                 'data': ('events',), 'sensor_size': ('events',), 'window_us': ('events',),
                 'stream': ('events',), 'cache_size': ('events',)}

