"""Training: the :class:`Trainer` loop, its loss, checkpoints, run directory and logs.

* :mod:`.trainer`: :class:`Trainer` (per-sequence and truly online updates,
  evaluation, data checks, non-finite guard); its run loop, the run directory it holds
  while it writes a run, and resume are in the private ``_fit`` module;
* :mod:`.stream`: :meth:`Trainer.fit_stream` and :meth:`Trainer.evaluate_stream`,
  learning from an endless stream; :mod:`.stream_metrics` its online metrics,
  :mod:`.stream_state` its checkpoints;
* :mod:`.loss`: the losses of training and evaluation (per-step cross-entropy,
  spike-count cross-entropy and MSE, membrane maximum or mean over time);
* :mod:`.spikes`: the spiking layers of a model and their spike rates;
* :mod:`.params`: parameters as mantissas in their own units, for optimisers;
* :mod:`.state`: a trainer's state in a checkpoint, saved and restored;
* :mod:`.checkpoint`: checkpoints as digest-checked ``.npz`` data;
* :mod:`.fingerprint`: fingerprints of data sets, checked on resume and evaluation;
* :mod:`.run_dir`: the files of a run directory, never overwritten silently;
* :mod:`.logs`: ``metrics.json``, ``scalars.csv``, TensorBoard, learning curve;
* :mod:`.placement`: the devices a trainer runs on (data parallelism).
"""
from .checkpoint import CheckpointError, ConfigMismatchError
from .logs import SCALAR_COLUMNS
from .loss import (LOSSES, SEQUENCE_LOSSES, cross_entropy, sequence_loss, step_weights,
                   weighted_cross_entropy)
from .run_dir import (BEST_CHECKPOINT, CURVE_NAME, LAST_CHECKPOINT, METRICS_NAME, SCALARS_NAME,
                      TENSORBOARD_DIR)
from .trainer import NONFINITE, Trainer

__all__ = ['Trainer', 'NONFINITE', 'CheckpointError', 'ConfigMismatchError', 'cross_entropy',
           'LOSSES', 'SEQUENCE_LOSSES', 'sequence_loss',
           'step_weights', 'weighted_cross_entropy', 'LAST_CHECKPOINT', 'BEST_CHECKPOINT',
           'METRICS_NAME', 'SCALARS_NAME', 'CURVE_NAME', 'TENSORBOARD_DIR', 'SCALAR_COLUMNS']
