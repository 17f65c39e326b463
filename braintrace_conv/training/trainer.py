"""Training loop for spiking classifiers on event streams, per sequence or truly online.

A :class:`Trainer` drives any executor (:class:`~braintrace_conv.BPTT`,
:class:`~braintrace_conv.D_RTRL`, :class:`~braintrace_conv.ES_D_RTRL`) with an
optax optimiser on any :class:`~braintrace_conv.data.FrameDataset` (frames in
memory, :class:`~braintrace_conv.data.EventDataset`, or binned from files on
demand, :class:`~braintrace_conv.data.StreamingEventDataset`).

Data layout: batches are time-major, inputs ``xs`` of shape ``(T, B,
*frame_shape)`` -- ``(T, B, P, X)`` for 1-D event streams, ``(T, B, P, H, W)``
for DVS frames, any rank the model takes -- and integer labels ``(B,)``; the
model maps one step ``(B, *frame_shape)`` to dimensionless class scores ``(B,
K)``. The loss and the prediction are those of
:mod:`braintrace_conv.training.loss`: a cross-entropy weighted over time
steps (``loss='every_step'`` or ``'final'``), or a loss of the whole
sequence (spike-count cross-entropy or MSE, membrane maximum or mean over
time), trained exactly in two passes per batch.

Spikes: a step may return ``(scores, {layer name: spikes (B, ...)})``
instead of the scores alone; those spikes feed the firing-rate regulariser
(``rate_targets``) and the spike rates reported by :meth:`Trainer.evaluate`,
together with those of every neuron module with a ``spike()`` method (this
package's neurons) or ``get_spike()`` method (brainpy.state's), called
without arguments after the step. A neuron of another kind (e.g. one that
stores its potential after the reset) is reported by returning its spikes.

Updates: ``update_every=None`` takes one optimiser step per batch of
sequences, from the gradient of the whole sequence loss
(``learner.value_and_grad``). ``update_every`` set to a number of time steps is
truly online: hidden states and traces are reset at the start of each batch of
sequences, then the batch is cut into chunks of ``update_every`` steps and the
gradient of each chunk's loss (``learner.advance``) is applied while hidden
states and traces carry on; chunks whose steps all have weight 0 advance the
network without an optimiser step. An online executor with a ``window`` (e.g.
``D_RTRL(model, window=16)``) cuts each chunk into windows of that many steps,
a window never spanning two chunks, so ``window`` may not exceed
``update_every``.

Devices: ``devices`` (default: all of ``jax.devices()``) is a data-parallel
mesh (:mod:`braintrace_conv.training.placement`): parameters and optimiser
state are replicated, every batch is split along ``B`` over the devices
(``B`` must be a multiple of their number) and XLA all-reduces the
gradients. One device is the plain single-device computation.

Units: parameters may be ``saiunit`` quantities; the optimiser acts on each
parameter's mantissa in the parameter's own unit (see
:mod:`braintrace_conv.training.params`), and :meth:`Trainer.value_and_grad`
returns gradients in ``1 / unit(parameter)``.

Bad data never becomes bad parameters: inputs, labels and shapes are checked
against the model before the first step, and an update whose loss, gradient
or result is not finite is never applied (``nonfinite='skip'`` counts it and
warns, ``'raise'`` stops).

Non-finite inputs follow one rule, under the learner's one switch
(``check_finite``, on by default): the trainer refuses a NaN or an infinity
where it first sees the data, naming the data set and the first bad position
-- a data set in memory whole before the first step (by sample), other data
batch by batch, the ``xs`` of :meth:`Trainer.train_batch` and
:meth:`Trainer.value_and_grad` as given -- so the learner's own check of the
same inputs always passes. What the trainer computes itself is no input: a
loss whose derivative with respect to the outputs is not finite (e.g. a
firing-rate regulariser that overflows) is a non-finite update, under
``nonfinite``.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Optional, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import saiunit as u

from .._validation import (ArgumentError, at_most, class_labels, finite, one_of, optional,
                           positive)
from ..data import EventDataset, FrameDataset
from ..executors import Learner
from ..units import split_unit
from . import _fit, checkpoint, logs, placement, run_dir, state
from . import stream as stream_run
from . import loss as losses
from .loss import (DEFAULT_TARGET_RATES, LOSSES, SEQUENCE_LOSSES, check_rate_targets,
                   check_target_rates, linearised_step_loss, predicted_labels, rate_penalty,
                   sequence_loss, weighted_cross_entropy)
from .params import ParamView
from .spikes import fraction_spiking, spike_rate_observer, spiking_layers, split_output

__all__ = ['Trainer', 'NONFINITE']

#: What to do with an update whose loss, gradient or result is not finite.
NONFINITE = ('skip', 'raise')
# Names of the spatial axes of a frame (P, *spatial), for messages naming a position.
_SPATIAL_AXES = {1: ('position',), 2: ('row', 'column'), 3: ('depth', 'row', 'column')}


def _axes(ndim: int, lead: tuple) -> Optional[tuple]:
    """Names of the axes of an array ``(*lead, channel, *spatial)`` of ``ndim`` axes."""
    spatial = _SPATIAL_AXES.get(ndim - len(lead) - 1)
    return None if spatial is None else lead + ('channel',) + spatial



def _step_loss(out, target):
    """The executors' per-step loss: :func:`weighted_cross_entropy` of the scores;
    ``target`` is one step's ``(labels, step weight)``."""
    return weighted_cross_entropy(split_output(out)[0], target)


def _step_output(model: brainstate.nn.Module, frame_shape: tuple, dtype):
    """The shape of one step's output for a batch of one, traced on a copy of ``model``
    whose hidden states are initialised: the model, its states and ``brainstate.random``'s
    key are left as they were."""
    probe, key = brainstate.graph.clone(model), brainstate.random.get_key()
    try:
        brainstate.nn.init_all_states(probe, 1)
        return brainstate.transform.eval_shape(probe, jax.ShapeDtypeStruct((1, *frame_shape),
                                                                          dtype))
    finally:
        brainstate.random.set_key(key)


class Trainer:
    """Train a classifier with an executor and an optax optimiser.

    See the module docstring for the data layout, the loss, the update
    schedule, units and non-finite values.

    Args:
      learner: An executor wrapping the model, e.g. ``ES_D_RTRL(model, decay)``.
      optimizer: Applied to the parameters' mantissas, keyed like
        ``model.states(brainstate.ParamState)``. ``None`` makes an
        inference-only trainer (:meth:`evaluate`, :meth:`load_params`).
      loss: One of :data:`~braintrace_conv.training.loss.LOSSES`:
        ``'every_step'``, ``'final'``, ``'count_ce'``, ``'count_mse'``,
        ``'max_membrane'``, ``'mean_membrane'`` (defined in
        :mod:`braintrace_conv.training.loss`); it also sets the prediction.
      final_steps: With ``loss='final'``, the number of last steps weighted (``None``: 1);
        refused with any other loss, where it would have no effect.
      target_rates ((float, float)): With ``loss='count_mse'``, the target rate per step of the
        true class and of the other classes (``None``: ``(0.8, 0.2)``); refused with any
        other loss.
      rate_targets: ``{layer name: target rate}``: add the firing-rate regulariser of
        :mod:`braintrace_conv.training.loss` for these layers, whose spikes
        the model returns with its scores (module docstring).
      rate_strength: The weight lambda of the regulariser (``None``: 1); refused without
        ``rate_targets``.
      update_every: ``None``: one update per batch of sequences; a number of time steps:
        truly online, one update per chunk of that many steps (only with
        ``'every_step'`` and ``'final'`` and no ``rate_targets``: the others
        need the whole sequence).
      nonfinite ({'skip', 'raise'}): An update with a non-finite loss, gradient or result is
        never applied: ``'skip'`` counts it in :attr:`skipped_updates` and warns, ``'raise'``
        raises ``FloatingPointError``.
      devices (None, int or sequence of jax.Device): Data-parallel devices: ``None`` all of
        ``jax.devices()``, ``n`` the first ``n``, or the given devices. Parameters and
        optimiser state are replicated on each; batches are split along ``B``, which must be a
        multiple of their number (module docstring). The result does not depend on the number
        of devices except through the order in which the gradient's batch sum is added up
        (floating-point rounding).

    Attributes:
      devices (tuple of jax.Device): The devices of :attr:`mesh`, in order.
      mesh (jax.sharding.Mesh): One-axis mesh (axis ``'batch'``) the batches are split over.
      epoch (int): Completed training epochs.
      updates (int): Optimiser updates attempted (applied or skipped).
      skipped_updates (int): Updates skipped for non-finite values.
      history (list of dict): One record per completed epoch (see :meth:`fit`).
      best (dict or None): ``epoch`` and ``test_accuracy`` of the best evaluated epoch so far.
      run_config (dict): The caller's description of the run (``fit(run_config=...)``),
        stored in checkpoints and compared on resume.
      spiking_layers (dict): Name (dotted path in the model) -> neuron module with ``spike()``
        or ``get_spike()``, whose spike rates :meth:`evaluate` reports (module docstring).
      opt_state: The optimiser state (``None`` without an optimiser).

    Examples:
      Two epochs on moving bars of 8 x 8 pixels, 10 steps each:

      >>> import optax
      >>> import braintrace_conv as bc
      >>> from braintrace_conv.data import moving_bars
      >>> from braintrace_conv.models import recurrent_conv_snn
      >>> train, test = moving_bars(32, T=10, size=(8, 8), seed=0).split(0.25, seed=0)
      >>> model = recurrent_conv_snn(train.frame_shape, train.num_classes, channels=(4,))
      >>> trainer = bc.Trainer(bc.ES_D_RTRL(model), optax.adam(5e-3))
      >>> history = trainer.fit(train, epochs=2, batch_size=8, progress=False)
      >>> [record['epoch'] for record in history]       # one record per epoch
      [1, 2]
      >>> sorted(trainer.evaluate(test))                 # test accuracy and loss, spike rates
      ['accuracy', 'loss', 'spike_rates']
    """

    def __init__(self, learner: Learner, optimizer: Optional[optax.GradientTransformation] = None,
                 *, loss: str = 'every_step', final_steps: Optional[int] = None,
                 target_rates: Optional[tuple] = None,
                 rate_targets: Optional[dict] = None, rate_strength: Optional[float] = None,
                 update_every: Optional[int] = None, nonfinite: str = 'skip',
                 devices: placement.Devices = None):
        if not isinstance(learner, Learner):
            raise TypeError(f'learner must be an executor (BPTT, D_RTRL, ES_D_RTRL), got '
                            f'{type(learner).__name__}.')
        if optimizer is not None and not (callable(getattr(optimizer, 'init', None))
                                          and callable(getattr(optimizer, 'update', None))):
            raise TypeError(f'optimizer must be an optax.GradientTransformation or None, got '
                            f'{type(optimizer).__name__}.')
        self.learner = learner
        self.model = learner.model
        self.optimizer = optimizer
        self.loss = one_of('loss', loss, LOSSES)
        self.rate_targets = check_rate_targets(rate_targets)
        self.final_steps = positive('final_steps', 1 if final_steps is None else final_steps)
        self.target_rates = check_target_rates(
            DEFAULT_TARGET_RATES if target_rates is None else target_rates)
        self.rate_strength = positive('rate_strength',
                                      1.0 if rate_strength is None else rate_strength, float)
        self._refuse_without_effect(final_steps=final_steps, target_rates=target_rates,
                                    rate_strength=rate_strength)
        self.update_every = optional(positive, 'update_every', update_every,
                                     means='one update per sequence')
        self._check_schedule(getattr(learner, 'window', None))
        self.nonfinite = one_of('nonfinite', nonfinite, NONFINITE)
        self._parallel = placement.DataParallel(devices)
        self.mesh, self.devices = self._parallel.mesh, self._parallel.devices
        self._view = ParamView(self.model)
        self.spiking_layers = spiking_layers(self.model)
        self._observe = spike_rate_observer(list(self.spiking_layers.values()))
        self._set_params(self._view.mantissas())
        self.opt_state = None if optimizer is None else self._parallel.replicate(
            optimizer.init(self._view.mantissas()))
        # Only the first process writes run files and shows progress.
        self._writer = jax.process_index() == 0
        self.epoch = self.updates = self.skipped_updates = 0
        self.history: list = []
        self.best: Optional[dict] = None
        self.run_config: dict = {}
        self._fit_config: dict = {}
        self._rng: Optional[np.random.Generator] = None
        self._update = jax.jit(self._candidate_update)
        self._stream_update = None      # compiled by the first stream run (stream.py)
        self._outputs: dict = {}

    def config(self) -> dict:
        """The trainer's settings: ``algorithm``, ``loss``, ``final_steps``,
        ``update_every``, ``nonfinite`` (and ``target_rates`` with ``'count_mse'``, the
        rate regulariser's settings, and the learner's ``window`` when it has one)."""
        config = dict(algorithm=self.learner.algorithm, loss=self.loss,
                      final_steps=self.final_steps, update_every=self.update_every,
                      nonfinite=self.nonfinite)
        if self.loss == 'count_mse':
            config['target_rates'] = list(self.target_rates)
        if self.rate_targets:
            config.update(rate_targets=self.rate_targets, rate_strength=self.rate_strength)
        if getattr(self.learner, 'window', None) is not None:
            config['window'] = self.learner.window
        return config

    def _refuse_without_effect(self, **given) -> None:
        """Refuse a setting given where it changes nothing (``None`` is not given): a run
        that sets it believes it trains with it."""
        no_effect = f'it has no effect with loss={self.loss!r}'
        acts = dict(final_steps=("loss='final'", self.loss == 'final', no_effect),
                    target_rates=("loss='count_mse'", self.loss == 'count_mse', no_effect),
                    rate_strength=('{rate_targets} is set', bool(self.rate_targets),
                                   'it weights the regulariser {rate_targets} turns on'))
        for name, value in given.items():
            where, met, fix = acts[name]
            if value is not None and not met:
                raise ArgumentError(name, value, f'be None unless {where}', fix,
                                    refs=('rate_targets',))

    def _check_schedule(self, window: Optional[int]) -> None:
        """Refuse online updates that cannot be made: a loss of the whole sequence, or a
        learner's window longer than a chunk."""
        if self.update_every is None:
            return
        per_step = f'with {{update_every}} ({self.update_every})'
        if self.loss in SEQUENCE_LOSSES:
            raise ArgumentError('loss', self.loss, f'be a per-step loss (every_step, final) '
                                                   f'{per_step}', 'a loss of the whole sequence '
                                'needs the outputs of every step', refs=('update_every',))
        if self.rate_targets:
            raise ArgumentError('rate_targets', self.rate_targets, f'be empty {per_step}',
                                'the firing-rate regulariser is a function of the whole '
                                'sequence', refs=('update_every',))
        if window is not None:
            at_most('window', window, self.update_every, 'update_every',
                    fix='a window never spans two online chunks',
                    names={'window': "the learner's window"})

    @property
    def step(self) -> int:
        """Deprecated name of :attr:`updates` (``step`` means a time step elsewhere)."""
        warnings.warn('Trainer.step is Trainer.updates, the number of optimiser updates; '
                      'step is deprecated.', DeprecationWarning, stacklevel=2)
        return self.updates

    def params(self) -> dict:
        """``{leaf name: mantissa}``: the parameters as NumPy arrays, each in its own unit
        (``'blocks.0.ff.weight'``; :mod:`braintrace_conv.training.params`)."""
        return {name: np.asarray(value)      # replicated: every process holds all of it
                for name, value in self._view.named(self._view.mantissas()).items()}

    @property
    def _whole_sequence(self) -> bool:
        """Whether the loss is a function of the whole sequence (trained in two passes)."""
        return self.loss in SEQUENCE_LOSSES or bool(self.rate_targets)

    def _set_params(self, mantissas: dict) -> None:
        """Replicate parameter mantissas on every device and write them to the model."""
        self._view.assign(self._parallel.replicate(mantissas))

    def _require_optimizer(self, what: str) -> None:
        if self.optimizer is None:
            raise ValueError(f'{what} needs an optimizer; this Trainer was built without one '
                             f'(for inference).')

    # ------------------------------------------------------------------ data checks
    def _num_outputs(self, frame_shape: tuple, dtype, name: str) -> int:
        """Number of class scores the model returns for one step of ``frame_shape``
        (traced on a copy of the model: :func:`_step_output`)."""
        key = (tuple(frame_shape), np.dtype(dtype).str)
        if key not in self._outputs:
            try:
                out = _step_output(self.model, frame_shape, dtype)
            except Exception as err:   # the model's own check of its input, whatever its type
                raise ValueError(f'{name} does not fit the model: one step of shape (B, '
                                 f'{", ".join(map(str, frame_shape))}) gives: {err}') from err
            out, spikes = split_output(out)
            missing = sorted(set(self.rate_targets) - set(spikes))
            if missing:
                raise ValueError(f'rate_targets names layers {missing} whose spikes the model '
                                 f'does not return; a step must return (scores, {{layer name: '
                                 f'spikes}}) with them, got spikes of {sorted(spikes)}.')
            if isinstance(out, (jax.ShapeDtypeStruct, u.Quantity)):
                out, unit = split_unit(out, 'the model output')
            if not isinstance(out, jax.ShapeDtypeStruct) or len(out.shape) != 2:
                raise ValueError(f'the model must return class scores (B, K) per step, got '
                                 f'{out}.')
            if not unit.dim.is_dimensionless:
                raise ValueError(f'the model must return dimensionless class scores, got unit '
                                 f'{unit}; divide them by a reference (e.g. V / u.mV).')
            self._outputs[key] = out.shape[1]
        return self._outputs[key]

    def _step_weights(self, num_steps: int, name: str) -> np.ndarray:
        """The loss weights ``(T,)`` of the time steps of ``name``, data of ``num_steps``
        steps."""
        try:
            return losses.step_weights(self.loss, num_steps, self.final_steps)
        except ArgumentError as err:
            raise ArgumentError(err.name, err.value, err.expected, err.fix, refs=err.refs,
                                names={'num_steps': f'the number of time steps of {name}'}
                                ) from None

    def _check_dataset(self, name: str, dataset) -> None:
        """Check a dataset against the model, naming the first problem. The events of a
        dataset in memory are checked here; those of other datasets batch by batch
        (:meth:`_batches`)."""
        if not isinstance(dataset, FrameDataset):
            raise TypeError(f'{name} must be a FrameDataset (an EventDataset or '
                            f'StreamingEventDataset of braintrace_conv.data), got '
                            f'{type(dataset).__name__}.')
        if len(dataset.labels) == 0:
            raise ValueError(f'{name} must hold at least one sample, got 0.')
        num_outputs = self._num_outputs(dataset.frame_shape, np.float32, name)
        if dataset.num_classes > num_outputs:
            raise ValueError(f'{name} has {dataset.num_classes} classes but the model has '
                             f'{num_outputs} outputs (class scores); build the model with '
                             f'num_classes={dataset.num_classes}.')
        class_labels(f'{name} labels', dataset.labels, num_outputs)
        self._step_weights(dataset.num_steps, name)
        if isinstance(dataset, EventDataset):
            self._check_finite(f'{name} events', dataset.events, ('sample', 't'))

    def _check_finite(self, name: str, array, lead: tuple) -> None:
        """The one input rule (module docstring): ``array`` ``(*lead, *frame_shape)`` holds no
        NaN or infinity, unless the learner's ``check_finite`` is off."""
        if self.learner.check_finite:
            finite(name, array, _axes(np.ndim(array), lead))

    def _batches(self, name: str, dataset, batch_size: int, **kwargs):
        """``dataset.batches(batch_size, **kwargs)``, each checked to be finite unless the
        whole dataset was (in memory)."""
        for i, (xs, labels) in enumerate(dataset.batches(batch_size, **kwargs)):
            if not isinstance(dataset, EventDataset):
                self._check_finite(f'{name} events (batch {i})', xs, ('t', 'b'))
            yield xs, labels

    def _check_batch(self, xs, labels) -> tuple:
        """``(xs, labels)`` of one batch as NumPy arrays, checked against the model."""
        xs = np.asarray(xs)
        if xs.ndim < 3 or not (jnp.issubdtype(xs.dtype, jnp.number) or xs.dtype == bool):
            raise ValueError(f'xs must be a numeric array (T, B, ...), got shape {xs.shape} and '
                             f'dtype {xs.dtype}.')
        num_outputs = self._num_outputs(xs.shape[2:], xs.dtype, 'xs')
        labels = class_labels('labels', labels, num_outputs, batch=xs.shape[1])
        self._parallel.check_batch_size('the batch size B of xs (T, B, ...)', xs.shape[1])
        self._step_weights(xs.shape[0], 'xs')
        self._check_finite('xs', xs, ('t', 'b'))
        return xs, labels

    # ------------------------------------------------------------------ updates
    def _placed(self, xs: np.ndarray, labels: np.ndarray, step_weights: np.ndarray) -> tuple:
        """``(xs, (labels (T, B), step weights (T,)))`` on the devices, the arguments the
        executors take for :func:`_step_loss`: inputs and labels split along the batch
        axis, step weights replicated."""
        labels = np.broadcast_to(labels, (len(step_weights),) + labels.shape)
        xs, labels = self._parallel.shard((xs, labels))
        return xs, (labels, self._parallel.replicate(step_weights))

    def _candidate_update(self, grads, opt_state, params, loss):
        """The optimiser step, with per-leaf gradient finiteness and whether it may be
        applied (finite loss, gradients and new parameters)."""
        finite_grads = jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
        changes, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, changes)
        ok = (jnp.isfinite(loss) & jnp.all(finite_grads)
              & jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)])))
        return params, opt_state, ok, finite_grads

    def _apply(self, grads: Optional[dict], loss) -> bool:
        """Apply gradient mantissas unless something is not finite (``grads`` ``None``: the
        loss's derivative was not, so there are none); True if applied."""
        if grads is None:
            what = ('non-finite loss' if not np.isfinite(float(loss))
                    else 'non-finite derivative of the loss with respect to the outputs')
            return self._refuse_update(what, f'epoch {self.epoch + 1}', stacklevel=3)
        params, opt_state, ok, finite_grads = self._update(
            grads, self.opt_state, self._view.mantissas(), jnp.asarray(loss))
        if bool(ok):
            self._view.assign(params)
            self.opt_state = opt_state
            self.updates += 1
            return True
        return self._not_applied(finite_grads, loss, f'epoch {self.epoch + 1}')

    def _not_applied(self, finite_grads, loss, when: str) -> bool:
        """An update that was not applied, with per-leaf gradient finiteness
        ``finite_grads``: :meth:`_refuse_update` with what was not finite."""
        bad = [n for n, f in zip(self._view.names, np.asarray(finite_grads)) if not f]
        what = (f'non-finite gradient of {", ".join(bad)}' if bad
                else 'non-finite loss' if not np.isfinite(float(loss))
                else 'the update would make parameters non-finite')
        return self._refuse_update(what, when)

    def _refuse_update(self, what: str, when: str, stacklevel: int = 4) -> bool:
        """An update not applied because of ``what``: raised or skipped (``nonfinite``);
        ``when`` says where in the run it was (``'epoch 3'``). False: not applied. The
        warning names the frame ``stacklevel`` (counted from here: the default is the
        caller of :meth:`_apply` through :meth:`_not_applied`)."""
        if self.nonfinite == 'raise':
            raise FloatingPointError(
                f'update {self.updates + 1} ({when}): {what}; parameters and '
                f'optimiser state are unchanged. Lower the learning rate or check the data '
                f'(nonfinite="skip" skips such updates).')
        self.updates += 1
        self.skipped_updates += 1
        warnings.warn(f'skipped an optimiser update: {what}; parameters and optimiser state '
                      f'are unchanged (Trainer.skipped_updates counts them).', RuntimeWarning,
                      stacklevel=stacklevel)
        return False

    def apply_gradients(self, grads: dict) -> bool:
        """One optimiser step from ``grads`` (keyed like ``model.states(ParamState)``).

        Leaves are what the executors return: plain arrays for plain
        parameters, quantities ``dL/dW`` in ``1 / unit(W)`` (any unit of that
        dimension) for parameters with a unit; a plain array for such a
        parameter is taken as ``dL/dw`` of its mantissa ``w``. Returns whether
        the update was applied (non-finite: see ``nonfinite``).
        """
        self._require_optimizer('apply_gradients')
        return self._apply(self._view.grad_mantissas(grads), 0.0)

    def value_and_grad(self, xs, labels) -> tuple:
        """Batch loss of one batch of sequences and its gradient, applying nothing.

        ``xs``: ``(T, B, *frame_shape)`` (``B`` a multiple of the number of
        devices); ``labels``: int ``(B,)``. Returns
        ``(loss, grads)``: ``grads`` keyed like ``model.states(ParamState)``,
        each ``dL/dW`` in ``1 / unit(W)`` (plain arrays for plain parameters);
        NaN where the loss of the whole sequence has no finite derivative.
        """
        xs, labels = self._check_batch(xs, labels)
        loss, grads, _ = self._sequence_gradient(xs, labels,
                                                 self._step_weights(xs.shape[0], 'xs'))
        if grads is None:   # the loss's derivative is not finite: neither is its gradient
            return float(loss), self._view.gradients(
                jax.tree.map(lambda m: jnp.full_like(m, jnp.nan), self._view.mantissas()))
        return float(loss), self._view.gradients(self._view.grad_mantissas(grads))

    def _batch_loss(self, outputs, labels, step_weights):
        """Per-sample loss ``(B,)`` of stacked outputs ``(T, B, ...)``: the loss of the
        scores plus, with ``rate_targets``, the firing-rate regulariser."""
        scores, spikes = split_output(outputs)
        loss = sequence_loss(scores, labels, step_weights, self.loss, self.target_rates)
        if self.rate_targets:
            loss = loss + rate_penalty(spikes, self.rate_targets, self.rate_strength)
        return loss

    def _sequence_gradient(self, xs: np.ndarray, labels: np.ndarray, step_weights: np.ndarray):
        """``(loss, grads, outputs)`` of whole sequences. A loss of the whole sequence takes
        two passes (:mod:`braintrace_conv.training.loss`): the outputs and the cotangents
        ``dL/d output``, then the gradient of the linearised step loss; ``grads`` is
        ``None`` when the cotangents are not finite (no gradient is taken)."""
        xs, weighted_labels = self._placed(xs, labels, step_weights)
        if not self._whole_sequence:
            return self.learner.value_and_grad(_step_loss, xs, weighted_labels,
                                               return_outputs=True)
        outputs = self.learner.predict(xs)
        placed_labels = weighted_labels[0][0]       # (B,), split over the devices
        loss, cotangents = jax.value_and_grad(
            lambda out: jnp.mean(self._batch_loss(out, placed_labels, step_weights)))(outputs)
        if not all(bool(jnp.all(jnp.isfinite(c))) for c in jax.tree.leaves(cotangents)):
            return loss, None, outputs
        _, grads = self.learner.value_and_grad(linearised_step_loss, xs, cotangents)
        return loss, grads, outputs

    # ------------------------------------------------------------------ one batch
    def train_batch(self, xs, labels) -> tuple:
        """Train on one batch of sequences; returns ``(loss, number correct)``.

        ``xs``: ``(T, B, *frame_shape)`` (``B`` a multiple of the number of
        devices); ``labels``: int ``(B,)``, checked against the model first.
        The loss is the batch loss (module docstring); in online mode it is
        summed over the chunks, each computed with the parameters current at
        that chunk.
        """
        self._require_optimizer('train_batch')
        return self._train_batch(*self._check_batch(xs, labels))

    def _train_batch(self, xs: np.ndarray, labels: np.ndarray) -> tuple:
        """:meth:`train_batch` of a checked batch."""
        step_weights = self._step_weights(xs.shape[0], 'xs')
        if self.update_every is None:
            loss, grads, outputs = self._sequence_gradient(xs, labels, step_weights)
            self._apply(None if grads is None else self._view.grad_mantissas(grads), loss)
            total, scores = float(loss), placement.to_host(split_output(outputs)[0])
        else:
            self.learner.reset(len(labels))
            total, chunks = 0.0, []
            for start in range(0, len(step_weights), self.update_every):
                chunk = slice(start, start + self.update_every)
                loss, grads, outputs = self.learner.advance(
                    _step_loss, *self._placed(xs[chunk], labels, step_weights[chunk]),
                    return_outputs=True)
                if step_weights[chunk].any():
                    self._apply(self._view.grad_mantissas(grads), loss)
                total += float(loss)
                chunks.append(placement.to_host(split_output(outputs)[0]))
            scores = np.concatenate(chunks)
        return total, int(np.sum(predicted_labels(scores, step_weights, self.loss) == labels))

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, dataset, batch_size: int = 64) -> dict:
        """Loss, accuracy and spike rates of the current parameters on ``dataset``.

        Args:
          dataset (FrameDataset): Samples ``(N, T, *frame_shape)`` with labels ``(N,)``,
            checked against the model first.
          batch_size: Sequences per forward pass (``Learner.predict``), split over the
            devices. Every batch, the last one included, is zero-padded to
            ``batch_size`` (at most the number of samples) rounded up to a
            multiple of the number of devices; the padding is excluded from
            every figure.

        Returns:
          dict: ``loss``: mean sequence loss; ``accuracy``: fraction in [0, 1] of
          correct predictions; ``spike_rates``: per spiking layer name (the
          neuron modules of :attr:`spiking_layers`, then the layers whose
          spikes the model returns), the mean number of spikes per neuron
          and time step (over all samples and steps).
        """
        batch_size = positive('batch_size', batch_size)
        self._check_dataset('dataset', dataset)
        step_weights = self._step_weights(dataset.num_steps, 'dataset')
        # a batch larger than the data set would only be padding
        padded = self._parallel.padded_size(min(batch_size, len(dataset.labels)))
        n_total, correct, loss_sum = 0, 0, 0.0
        spike_sums = {name: 0.0 for name in self.spiking_layers}
        returned = {}   # spikes the model returns; they replace a neuron's of the same name
        for xs, labels in self._batches('dataset', dataset, batch_size, shuffle=False):
            n = len(labels)
            pad = [(0, 0)] * xs.ndim
            pad[1] = (0, padded - n)
            outputs, rates = self.learner.predict(self._parallel.shard(np.pad(xs, pad)),
                                                  observe=self._observe)
            scores, spikes = split_output(outputs)
            scores, spikes = placement.to_host(scores)[:, :n], {
                name: placement.to_host(fraction_spiking(value))[:, :n]
                for name, value in spikes.items()}
            loss_sum += float(np.sum(self._batch_loss((scores, spikes), labels, step_weights)))
            correct += int(np.sum(predicted_labels(scores, step_weights, self.loss) == labels))
            for name, r in zip(self.spiking_layers, rates):
                spike_sums[name] += float(np.sum(placement.to_host(r)[:, :n]))
            for name, r in spikes.items():
                returned[name] = returned.get(name, 0.0) + float(np.sum(r))
            n_total += n
        steps = n_total * dataset.num_steps
        return dict(loss=loss_sum / n_total, accuracy=correct / n_total,
                    spike_rates={name: total / steps
                                 for name, total in {**spike_sums, **returned}.items()})

    # ------------------------------------------------------------------ training
    def fit(self, train_dataset, *, epochs: int, batch_size: int, seed: int = 0,
            eval_dataset=None, eval_batch_size: Optional[int] = None,
            out_dir: Union[str, os.PathLike, None] = None, resume: bool = False,
            overwrite: bool = False, run_config: Optional[dict] = None, log_every: int = 1,
            tensorboard: Optional[bool] = None, progress: bool = True,
            verify_data: bool = False) -> list:
        """Train until ``epochs`` epochs in total are completed.

        Each epoch visits the training set once in a random order, in batches
        of ``batch_size`` (an incomplete last batch is dropped; the order
        differs per epoch), then evaluates ``eval_dataset`` if given. Both
        datasets are checked against the model before the first step.

        With ``out_dir``, after every epoch the trainer writes the
        ``checkpoint-last.npz`` checkpoint, ``checkpoint-best.npz`` when the
        evaluation accuracy improved, ``metrics.json`` and
        ``learning_curve.png``, and every ``log_every`` batches a row of
        ``scalars.csv`` (and TensorBoard events); see
        :mod:`braintrace_conv.training.logs`. A directory that already holds
        a run is refused unless ``resume`` or ``overwrite``, and so is one in
        which another process is writing a run (it holds the directory's lock,
        :func:`~braintrace_conv.training.run_dir.locked`).

        Args:
          train_dataset, eval_dataset (FrameDataset): Samples ``(N, T, *frame_shape)``, labels
            ``(N,)``.
          epochs: Total number of epochs; training continues from :attr:`epoch`
            (non-zero after a restore), so a finished run does nothing.
          batch_size: Sequences per batch, at most ``len(train_dataset)`` and a multiple
            of the number of devices.
          seed: Seeds the shuffling generator when the trainer has none yet (a
            restored checkpoint brings its own generator state).
          eval_batch_size: Batch size of the evaluation (any size: see :meth:`evaluate`);
            default ``batch_size``.
          out_dir: Run directory (created if needed). With several processes, only
            process 0 writes to it; resuming needs it visible to every process.
          resume: Continue the run in ``out_dir`` from its last checkpoint (which
            must exist), so an interrupted run ends exactly as an
            uninterrupted one. The checkpoint's trainer settings, datasets,
            ``batch_size``, ``seed`` and ``run_config`` must equal the given
            ones (:class:`~braintrace_conv.training.checkpoint.ConfigMismatchError`
            names those that differ); nothing is changed otherwise. Datasets
            are compared by their fingerprints
            (:mod:`~braintrace_conv.training.fingerprint`), which name a file
            of a streamed dataset whose size or modification time changed; a
            fingerprint of an older version, of the file paths only, is
            compared as such, with a warning (see ``verify_data`` for a file
            rewritten with its size and modification time restored). A larger
            ``epochs`` continues a finished run (an entry ``'epochs'`` of
            ``run_config`` equal to ``epochs`` may exceed the stored one).
            The best checkpoint, ``metrics.json`` and the learning curve of a
            run killed after its last checkpoint are repaired first. The number
            of devices may differ (a warning says so): the run then equals an
            uninterrupted one up to the rounding of the gradient's batch sum.
          overwrite: Replace the run in ``out_dir``, once this run has written its first
            checkpoint: until then a new run writes into a hidden directory in ``out_dir``
            (:func:`~braintrace_conv.training.run_dir.stage`), so a run that fails or is
            interrupted before leaves the old one as it was; then the old run files are
            replaced all or nothing (a file that cannot be moved aside is an ``OSError``
            naming it, and the old run is left as it was).
          run_config: JSON-able description of the run (e.g. the command-line options),
            stored in checkpoints and ``metrics.json``.
          log_every: Batches between rows of ``scalars.csv``.
          tensorboard: TensorBoard events too: ``None`` when ``tensorboardX`` is installed.
          progress: Show a tqdm bar per epoch (in a notebook or on a terminal only)
            and print one summary line per epoch.
          verify_data: Fingerprint a streamed data set's files by their contents too
            (SHA-256; :func:`~braintrace_conv.training.fingerprint.data_fingerprint`), so a
            resumed or re-evaluated run also refuses a file rewritten with its size and
            modification time restored. Every file is read once per call (about a third
            of the time one epoch takes to read and bin them, ``docs/benchmarks.md``).
            Needs ``out_dir``; a run is resumed with the value it was started with.

        Returns:
          list of dict: :attr:`history`: per epoch ``epoch``, ``train_loss`` (mean over
          batches with a finite loss), ``train_accuracy``,
          ``skipped_updates``, ``epoch_time_s`` and, with an
          ``eval_dataset``, ``test_loss``, ``test_accuracy``, ``spike_rates``.
        """
        return _fit.fit(self, train_dataset, epochs=epochs, batch_size=batch_size, seed=seed,
                        eval_dataset=eval_dataset, eval_batch_size=eval_batch_size,
                        out_dir=out_dir, resume=resume, overwrite=overwrite,
                        run_config=run_config, log_every=log_every, tensorboard=tensorboard,
                        progress=progress, verify_data=verify_data)

    def check_fit(self, train_dataset, *, epochs: int, batch_size: int, seed: int = 0,
                  eval_dataset=None, eval_batch_size: Optional[int] = None,
                  out_dir: Union[str, os.PathLike, None] = None, resume: bool = False,
                  overwrite: bool = False, run_config: Optional[dict] = None,
                  log_every: int = 1, verify_data: bool = False) -> None:
        """Check the arguments of :meth:`fit` as it does before it changes anything: each
        argument, and the data sets against the model. Raises what :meth:`fit` would
        raise for them; the run directory is checked by :meth:`fit` itself."""
        _fit.check_arguments(self, train_dataset, eval_dataset, epochs=epochs,
                             batch_size=batch_size, seed=seed, eval_batch_size=eval_batch_size,
                             out_dir=out_dir, resume=resume, overwrite=overwrite,
                             run_config=run_config, log_every=log_every,
                             verify_data=verify_data)

    # ------------------------------------------------------------------ streams
    def fit_stream(self, stream, *, eval_stream=None, eval_every: Optional[int] = None,
                   max_steps: Optional[int] = None, settle_steps: int = 0,
                   out_dir: Union[str, os.PathLike, None] = None, resume: bool = False,
                   overwrite: bool = False, run_config: Optional[dict] = None,
                   checkpoint_every: Optional[int] = None, log_every: int = 10,
                   tensorboard: Optional[bool] = None, progress: bool = True) -> dict:
        """Learn online from an endless stream, one update per chunk, never resetting
        (:mod:`braintrace_conv.training.stream`).

        The learner's hidden states and traces carry across every chunk, segment and
        recording of ``stream``; with :class:`~braintrace_conv.BPTT` this is truncated
        BPTT (the gradient is cut at chunk boundaries). Needs ``loss='every_step'``,
        ``update_every`` ``None`` or the stream's ``chunk_steps``, and an online learner's
        ``window`` at most ``chunk_steps``. A chunk without a labelled step makes no
        update: plan a learning-rate schedule over ``stream.labelled_chunks(max_steps)``
        updates (:meth:`~braintrace_conv.data.EventStream.labelled_chunks`).

        Args:
          stream (EventStream): The training stream, from its start (or, with ``resume``,
            from the checkpoint's position): frames ``(T, B, *frame_shape)`` (``T``: its
            ``chunk_steps``) and per-step labels and weights ``(T, B)``.
          eval_stream (EventStream): Held-out recordings, evaluated every ``eval_every``
            chunks and at the end (:meth:`evaluate_stream`).
          eval_every: Chunks between evaluations; ``None``: at the end only.
          max_steps: Stop after the chunk that reaches this many time steps (per stream);
            ``None``: when the stream ends. It may differ on ``resume``: a run continues
            until it has played ``max_steps``, so a larger one extends a run it stopped
            (which then equals a run given the larger one from the start when the earlier
            stop fell on an evaluation, and the optimiser is the same).
          settle_steps: Steps at the start of each segment that do not vote for its
            prediction (:mod:`~braintrace_conv.training.stream_metrics`).
          out_dir: Run directory: checkpoints, ``metrics.json``, ``scalars.csv`` and the
            learning curve (module docstring); refused if it holds a run, unless
            ``resume`` or ``overwrite``.
          resume: Continue the run in ``out_dir`` from its last checkpoint, bit for bit as
            if it had not stopped; the trainer's settings, ``run_config``, the streams'
            arguments and files (names and sizes), ``eval_every`` and ``settle_steps`` must
            be those of the run.
          overwrite: Replace the run in ``out_dir``, once this run has written its first
            checkpoint (as :meth:`fit` does).
          run_config: JSON-able description of the run, stored and compared on resume.
          checkpoint_every: Chunks between checkpoints (also written after every
            evaluation and at the end); ``None``: only then.
          log_every: Chunks between rows of ``scalars.csv``.
          tensorboard: TensorBoard events too: ``None`` when ``tensorboardX`` is installed.
          progress: A progress bar (on a terminal or in a notebook) and a line per
            evaluation.

        Returns:
          dict: :func:`~braintrace_conv.training.stream.summary`: counts, ``online``
          metrics since the start, the last evaluation ``test``, ``best``,
          ``evaluations`` (one record per evaluation: step, stream time, the online
          metrics of the period before it and the held-out ones) and ``finished``.

        Examples:
          A generated recording of 5 s with one labelled gesture, played in chunks of 100
          steps of 1 ms:

          >>> import tempfile, optax
          >>> import braintrace_conv as bc
          >>> from braintrace_conv.data import EventStream, gesture_recordings
          >>> from braintrace_conv.models import recurrent_conv_snn
          >>> recordings = gesture_recordings(tempfile.mkdtemp(), 1, duration_s=5.0,
          ...                                 size=(8, 8), formats=('npy',))
          >>> stream = EventStream(recordings, sensor_size=(8, 8, 2), dt_us=1000,
          ...                      chunk_steps=100, num_classes=6)
          >>> model = recurrent_conv_snn(stream.frame_shape, 6, channels=(4,))
          >>> trainer = bc.Trainer(bc.ES_D_RTRL(model), optax.adam(1e-2))
          >>> result = trainer.fit_stream(stream, progress=False)
          >>> result['steps'], result['chunks'], result['updates']  # one per labelled chunk
          (4902, 50, 17)
          >>> result['online']['segments']     # gestures played, each decided by its steps' vote
          1
        """
        return stream_run.fit_stream(
            self, stream, eval_stream=eval_stream, eval_every=eval_every, max_steps=max_steps,
            settle_steps=settle_steps, out_dir=out_dir, resume=resume, overwrite=overwrite,
            run_config=run_config, checkpoint_every=checkpoint_every, log_every=log_every,
            tensorboard=tensorboard, progress=progress)

    def check_fit_stream(self, stream, *, eval_stream=None, eval_every: Optional[int] = None,
                         max_steps: Optional[int] = None, settle_steps: int = 0,
                         out_dir: Union[str, os.PathLike, None] = None, resume: bool = False,
                         overwrite: bool = False, run_config: Optional[dict] = None,
                         checkpoint_every: Optional[int] = None, log_every: int = 10) -> None:
        """Check the arguments of :meth:`fit_stream` as it does before it changes anything:
        each argument, and the streams against the model and the learner. Raises what
        :meth:`fit_stream` would raise for them; the run directory is checked by
        :meth:`fit_stream` itself."""
        stream_run.check_arguments(
            self, stream, eval_stream, max_steps=max_steps, eval_every=eval_every,
            checkpoint_every=checkpoint_every, log_every=log_every, settle_steps=settle_steps,
            out_dir=out_dir, resume=resume, overwrite=overwrite, run_config=run_config)

    def evaluate_stream(self, stream, *, settle_steps: int = 0) -> dict:
        """Loss, step accuracy and segment accuracy of the current parameters on ``stream``
        (an :class:`~braintrace_conv.data.EventStream`, played from its start with fresh
        hidden states; :mod:`~braintrace_conv.training.stream_metrics`). The model's hidden
        states and an online run of the learner are left as they were.

        Args:
          stream (EventStream): The held-out stream.
          settle_steps: Steps at the start of each segment that do not vote for its
            prediction; a segment no longer than that is undecided
            (:mod:`~braintrace_conv.training.stream_metrics`).

        Returns:
          dict: ``loss`` (per labelled step), ``step_accuracy``, ``segment_accuracy``
          (``None`` where nothing was labelled or decided), ``segments``, ``undecided``,
          ``labelled_steps``, ``steps``.
        """
        return stream_run.evaluate_stream(self, stream, settle_steps=settle_steps)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Write the trainer's state to the checkpoint file ``path`` (atomically).

        It holds the parameters (mantissas, with their units), the optimiser
        state, the shuffling generator and ``brainstate.random``'s key, epoch,
        update counts, history, best epoch and the configuration; see
        :mod:`braintrace_conv.training.checkpoint` for the format.
        """
        self._require_optimizer('save_checkpoint')
        checkpoint.write(path, *state.snapshot(self))

    def restore_checkpoint(self, path: Union[str, os.PathLike], *,
                           run_config: Optional[dict] = None) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint` (or :meth:`fit`).

        Everything is checked before anything changes: the file's digest and
        format, the trainer settings (and ``run_config`` if given), the
        parameter names, shapes, dtypes and units, the optimiser state's
        structure, and the generator states. Also restores
        ``brainstate.random``'s key.

        Raises:
          FileNotFoundError: No file at ``path``.
          CheckpointError: The file is not a valid checkpoint or does not fit this trainer
            (:class:`~braintrace_conv.training.checkpoint.ConfigMismatchError`
            names the settings that differ).
        """
        self._require_optimizer('restore_checkpoint (use load_params for inference)')
        expected = dict(trainer=self.config())
        if run_config is not None:
            expected['run'] = run_config
        state.restore(self, Path(path), expected)

    def load_params(self, path: Union[str, os.PathLike], which: Optional[str] = None) -> dict:
        """Load only the parameters of a checkpoint, for inference (no optimiser needed).

        Args:
          path: A checkpoint file, or a run directory.
          which ({'best', 'last'}): In a run directory, which checkpoint; default the best if
            the run has one (it was evaluated), else the last.

        Returns:
          The checkpoint's metadata (``epoch``, ``history``, ``trainer``,
          ``run``, ...). Names, shapes and units must match the model;
          floating values are cast to the model's dtype. Nothing changes
          unless everything matches.
        """
        return state.load_params(self, path, which)

    # ------------------------------------------------------------------ logs
    def metrics(self) -> dict:
        """Summary of the run so far (the content of ``metrics.json``).

        Keys: :meth:`config`, ``devices`` (their number), ``run_config``,
        ``epochs_completed``, ``updates``, ``skipped_updates``, per-epoch lists ``train_loss`` and
        ``train_accuracy``, ``test_accuracy`` (of the last epoch, or None
        without evaluation), ``best`` and ``history`` (see :meth:`fit`).
        """
        last = self.history[-1] if self.history else {}
        return dict(self.config(), devices=len(self.devices), run_config=self.run_config,
                    epochs_completed=self.epoch, updates=self.updates,
                    skipped_updates=self.skipped_updates,
                    train_loss=[r['train_loss'] for r in self.history],
                    train_accuracy=[r['train_accuracy'] for r in self.history],
                    test_accuracy=last.get('test_accuracy'), best=self.best,
                    history=self.history)

    def write_logs(self, out_dir: Union[str, os.PathLike], **extra) -> dict:
        """Write ``learning_curve.png`` and then ``metrics.json`` (:meth:`metrics` plus
        ``extra``; written last, so a ``metrics.json`` of this epoch says the curve is of
        this epoch too) into ``out_dir``, holding its lock
        (:func:`~braintrace_conv.training.run_dir.locked`: ``RunLockedError`` while another
        process writes a run there); returns the metrics dict."""
        metrics = dict(self.metrics(), **extra)
        with run_dir.locked(out_dir) as out_dir:
            if self.history:
                logs.write_curve(out_dir, self.history, logs.run_title({**self.run_config,
                                                                         **self.config()}))
            logs.write_metrics(out_dir, metrics)
        return metrics
