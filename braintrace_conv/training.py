"""Training loop for spiking classifiers on event streams, per sequence or truly online.

A :class:`Trainer` drives any executor (:class:`~braintrace_conv.BPTT`,
:class:`~braintrace_conv.D_RTRL`, :class:`~braintrace_conv.ES_D_RTRL`) with an
optax optimiser on an :class:`~braintrace_conv.data.EventDataset`.

Data layout: batches are time-major, inputs ``xs`` of shape ``(T, B, 2, H,
W)`` and integer labels ``(B,)``; the model maps one step ``(B, 2, H, W)`` to
class scores ``(B, K)``.

Loss: per step, the softmax cross-entropy of the step's scores, averaged
over the batch and weighted by a per-step weight ``w_t``; the sequence loss is
``sum_t w_t CE_t``. ``loss='every_step'`` uses ``w_t = 1 / T``;
``loss='final'`` uses ``w_t = 1 / k`` on the last ``k = final_steps`` steps
and 0 elsewhere. Predictions are ``argmax_c sum_t w_t scores_t[c]``.

Updates: ``update_every=None`` takes one optimiser step per batch of
sequences, from the gradient of the whole sequence loss
(``learner.value_and_grad``). ``update_every=k`` is truly online: hidden
states and traces are reset at the start of each batch of sequences, then
every ``k`` steps the gradient of those steps' loss (``learner.advance``) is
applied while hidden states and traces carry on; chunks whose steps all have
weight 0 advance the network without an optimiser step.
"""
from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Callable, Optional, Union

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import saiunit as u
from jax import lax
from tqdm.auto import tqdm

from ._validation import positive
from .executors import Learner

__all__ = ['Trainer', 'weighted_cross_entropy', 'CHECKPOINT_NAME', 'METRICS_NAME', 'CURVE_NAME']

#: File names written into ``out_dir`` by :meth:`Trainer.fit`.
CHECKPOINT_NAME = 'checkpoint.pkl'
METRICS_NAME = 'metrics.json'
CURVE_NAME = 'learning_curve.png'

_LOSSES = ('every_step', 'final')
_FORMAT = 'braintrace_conv.Trainer/1'


def weighted_cross_entropy(scores, target):
    """``w * mean_b CE(scores[b], label[b])`` for one step.

    ``scores``: ``(B, K)``; ``target``: ``(labels (B,) int, w scalar)``.
    """
    labels, weight = target
    ce = optax.softmax_cross_entropy_with_integer_labels(u.get_mantissa(scores), labels)
    return weight * jnp.mean(ce)


def _name(key) -> str:
    return '.'.join(map(str, key))


def _is_spiking(node) -> bool:
    return isinstance(node, brainstate.nn.Module) and callable(getattr(node, 'spike', None))


def _forward_fn(model: brainstate.nn.Module, neurons: list) -> Callable:
    """Compiled pure forward scan of ``model``.

    Returns ``run(hidden, params, xs) -> (scores (T, B, K), rates)`` where
    ``hidden``/``params`` are the values of the model's hidden/parameter
    states (in ``model.states`` order) and ``rates[i]`` is ``(T, B)``, the
    fraction of neurons of ``neurons[i]`` spiking at each step, per sample.
    The model's states are left untouched.
    """

    def run(hidden, params, xs):
        h_states = list(model.states(brainstate.HiddenState).values())
        p_states = list(model.states(brainstate.ParamState).values())
        saved = [st.value for st in h_states + p_states]
        try:
            with brainstate.StateTraceStack():
                for st, v in zip(p_states, params):
                    st.value = v

                def body(h, x):
                    for st, v in zip(h_states, h):
                        st.value = v
                    scores = model(x)
                    rates = [jnp.mean(jnp.reshape(n.spike(), (x.shape[0], -1)), axis=1)
                             for n in neurons]
                    return [st.value for st in h_states], (scores, rates)

                _, (scores, rates) = lax.scan(body, hidden, xs)
        finally:
            for st, v in zip(h_states + p_states, saved):
                st.restore_value(v)
        return scores, rates

    return jax.jit(run)


class Trainer:
    """Train a classifier with an executor and an optax optimiser.

    See the module docstring for the data layout, the loss and the update
    schedule.

    Parameters
    ----------
    learner : Learner
        An executor wrapping the model, e.g. ``ES_D_RTRL(model, decay)``.
        The model maps ``(B, 2, H, W)`` to scores ``(B, K)``.
    optimizer : optax.GradientTransformation
        Applied to the parameters' values (the mantissas for ``saiunit``
        quantities), keyed like ``model.states(brainstate.ParamState)``.
    loss : {'every_step', 'final'}, default 'every_step'
        Which steps carry the loss (and the prediction).
    final_steps : int, default 1
        With ``loss='final'``, the number ``k`` of last steps weighted.
    update_every : int, optional
        ``None``: one update per batch of sequences; ``k``: truly online,
        one update every ``k`` steps.

    Attributes
    ----------
    epoch : int
        Completed training epochs.
    history : list of dict
        One record per completed epoch (see :meth:`fit`).
    spiking_layers : dict
        Name (dotted path in the model) -> neuron module with ``spike()``,
        whose spike rates :meth:`evaluate` reports.
    opt_state
        The optimiser state.
    """

    def __init__(self, learner: Learner, optimizer: optax.GradientTransformation, *,
                 loss: str = 'every_step', final_steps: int = 1,
                 update_every: Optional[int] = None):
        if not isinstance(learner, Learner):
            raise TypeError(f'learner must be an executor (BPTT, D_RTRL, ES_D_RTRL), got '
                            f'{type(learner).__name__}.')
        if not (callable(getattr(optimizer, 'init', None))
                and callable(getattr(optimizer, 'update', None))):
            raise TypeError(f'optimizer must be an optax.GradientTransformation, got '
                            f'{type(optimizer).__name__}.')
        if loss not in _LOSSES:
            raise ValueError(f'loss must be one of {_LOSSES}, got {loss!r}.')
        self.learner = learner
        self.model = learner.model
        self.optimizer = optimizer
        self.loss = loss
        self.final_steps = positive('final_steps', final_steps)
        self.update_every = (None if update_every is None
                             else positive('update_every', update_every))
        self._params = dict(self.model.states(brainstate.ParamState))
        if not self._params:
            raise ValueError('the model has no brainstate.ParamState to train.')
        self.spiking_layers = {_name(k): n for k, n in self.model.nodes().items()
                               if _is_spiking(n)}
        self.opt_state = optimizer.init(self._param_values())
        self.epoch = 0
        self.history: list = []
        self._rng: Optional[np.random.Generator] = None
        self._step = jax.jit(self._optimizer_step)
        self._forward = _forward_fn(self.model, list(self.spiking_layers.values()))

    # ------------------------------------------------------------------ parameters
    def _param_values(self) -> dict:
        return {k: u.get_mantissa(st.value) for k, st in self._params.items()}

    def _set_param_values(self, values: dict) -> None:
        for k, st in self._params.items():
            st.value = u.maybe_decimal(u.Quantity(values[k], unit=u.get_unit(st.value)))

    def _optimizer_step(self, grads, opt_state, params):
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _apply(self, grads) -> None:
        grads = {k: grads[k] for k in self._params}
        values, self.opt_state = self._step(grads, self.opt_state, self._param_values())
        self._set_param_values(values)

    # ------------------------------------------------------------------ loss pieces
    def step_weights(self, num_steps: int) -> np.ndarray:
        """Per-step loss weights ``w_t``, float32 ``(num_steps,)`` (see module docstring)."""
        num_steps = positive('num_steps', num_steps)
        if self.loss == 'every_step':
            return np.full(num_steps, 1.0 / num_steps, np.float32)
        if self.final_steps > num_steps:
            raise ValueError(f'final_steps ({self.final_steps}) exceeds the number of time '
                             f'steps of the data ({num_steps}).')
        w = np.zeros(num_steps, np.float32)
        w[num_steps - self.final_steps:] = 1.0 / self.final_steps
        return w

    def _targets(self, labels: np.ndarray, weights: np.ndarray):
        """``(labels (T, B), w (T,))``: the targets pytree of the executors."""
        return (jnp.asarray(np.broadcast_to(labels, (len(weights),) + labels.shape)),
                jnp.asarray(weights))

    @staticmethod
    def _correct(scores, weights: np.ndarray, labels: np.ndarray) -> int:
        pooled = np.tensordot(weights, np.asarray(u.get_mantissa(scores)), axes=1)
        return int(np.sum(np.argmax(pooled, axis=-1) == labels))

    # ------------------------------------------------------------------ one batch
    def train_batch(self, xs, labels) -> tuple:
        """Train on one batch of sequences; returns ``(loss, number correct)``.

        ``xs``: ``(T, B, 2, H, W)``; ``labels``: int ``(B,)``. The loss is the
        sequence loss (module docstring), averaged over the batch; in online
        mode it is summed over the chunks, each computed with the parameters
        current at that chunk.
        """
        labels = np.asarray(labels)
        weights = self.step_weights(np.shape(xs)[0])
        xs = jnp.asarray(xs)
        if self.update_every is None:
            loss, grads, scores = self.learner.value_and_grad(
                weighted_cross_entropy, xs, self._targets(labels, weights), return_outputs=True)
            self._apply(grads)
            return float(loss), self._correct(scores, weights, labels)
        return self._train_online(xs, labels, weights)

    def _train_online(self, xs, labels, weights) -> tuple:
        self.learner.reset(len(labels))
        total, chunks = 0.0, []
        k = self.update_every
        for start in range(0, len(weights), k):
            part = slice(start, start + k)
            loss, grads, scores = self.learner.advance(
                weighted_cross_entropy, xs[part], self._targets(labels, weights[part]),
                return_outputs=True)
            if weights[part].any():
                self._apply(grads)
            total += float(loss)
            chunks.append(np.asarray(u.get_mantissa(scores)))
        return total, self._correct(np.concatenate(chunks), weights, labels)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, dataset, batch_size: int = 64) -> dict:
        """Loss, accuracy and spike rates of the current parameters on ``dataset``.

        Parameters
        ----------
        dataset : EventDataset
            Samples ``(N, T, 2, H, W)`` with labels ``(N,)``.
        batch_size : int, default 64
            Sequences per forward pass; the last batch is zero-padded to this
            size (padding is excluded from every figure).

        Returns
        -------
        dict
            ``loss``: mean sequence loss; ``accuracy``: fraction in [0, 1] of
            correct predictions (module docstring); ``spike_rates``: per
            spiking layer name, the mean number of spikes per neuron and time
            step (over all samples and steps).
        """
        batch_size = positive('batch_size', batch_size)
        weights = self.step_weights(dataset.num_steps)
        n_total, correct, loss_sum = 0, 0, 0.0
        spike_sums = {name: 0.0 for name in self.spiking_layers}
        for xs, labels in dataset.batches(batch_size, shuffle=False):
            n = len(labels)
            pad = [(0, 0)] * xs.ndim
            pad[1] = (0, batch_size - n)
            brainstate.nn.init_all_states(self.model, batch_size)
            hidden = [st.value for st in self.model.states(brainstate.HiddenState).values()]
            params = [st.value for st in self._params.values()]
            scores, rates = self._forward(hidden, params, jnp.asarray(np.pad(xs, pad)))
            scores = np.asarray(u.get_mantissa(scores))[:, :n]
            ce = optax.softmax_cross_entropy_with_integer_labels(
                scores, np.broadcast_to(labels, scores.shape[:2]))
            loss_sum += float(np.sum(np.tensordot(weights, np.asarray(ce), axes=1)))
            correct += self._correct(scores, weights, labels)
            for name, r in zip(spike_sums, rates):
                spike_sums[name] += float(np.sum(np.asarray(r)[:, :n]))
            n_total += n
        if n_total == 0:
            raise ValueError('dataset is empty.')
        steps = n_total * dataset.num_steps
        return dict(loss=loss_sum / n_total, accuracy=correct / n_total,
                    spike_rates={k: v / steps for k, v in spike_sums.items()})

    # ------------------------------------------------------------------ training
    def fit(self, train_dataset, *, epochs: int, batch_size: int, seed: int = 0,
            eval_dataset=None, eval_batch_size: Optional[int] = None,
            out_dir: Union[str, os.PathLike, None] = None, progress: bool = True,
            resume: bool = False) -> list:
        """Train until ``epochs`` epochs in total are completed.

        Each epoch visits the training set once in a random order, in batches
        of ``batch_size`` (an incomplete last batch is dropped; the order
        differs per epoch). After each epoch it evaluates ``eval_dataset``
        (if given) and, with ``out_dir``, saves ``checkpoint.pkl``,
        ``metrics.json`` and ``learning_curve.png`` there.

        Parameters
        ----------
        train_dataset, eval_dataset : EventDataset
            Samples ``(N, T, 2, H, W)``, labels ``(N,)``.
        epochs : int
            Total number of epochs; training continues from :attr:`epoch`
            (non-zero after a restore), so a finished run does nothing.
        batch_size : int
            Sequences per batch, at most ``len(train_dataset)``.
        seed : int, default 0
            Seeds the shuffling generator when the trainer has none yet (a
            restored checkpoint brings its own generator state).
        eval_batch_size : int, optional
            Batch size of the evaluation; default ``batch_size``.
        out_dir : path, optional
            Directory for checkpoints and logs (created if needed).
        progress : bool, default True
            Show a tqdm bar per epoch and print one summary line per epoch.
        resume : bool, default False
            Restore ``out_dir/checkpoint.pkl`` first when it exists, so an
            interrupted run continues to the same result as an uninterrupted one.

        Returns
        -------
        list of dict
            :attr:`history`: per epoch ``epoch``, ``train_loss``,
            ``train_accuracy``, ``epoch_time_s`` and, with an
            ``eval_dataset``, ``test_loss``, ``test_accuracy``, ``spike_rates``.
        """
        epochs = positive('epochs', epochs)
        batch_size = positive('batch_size', batch_size)
        if batch_size > len(train_dataset):
            raise ValueError(f'batch_size ({batch_size}) exceeds the number of training '
                             f'samples ({len(train_dataset)}).')
        eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        if resume and out_dir is None:
            raise ValueError('resume=True needs out_dir (where the checkpoint is).')
        out_dir = None if out_dir is None else Path(out_dir)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            if resume and (out_dir / CHECKPOINT_NAME).exists():
                self.restore_checkpoint(out_dir / CHECKPOINT_NAME)
        if self._rng is None:
            self._rng = np.random.default_rng(seed)
        while self.epoch < epochs:
            record = self._train_epoch(train_dataset, batch_size, epochs, progress)
            if eval_dataset is not None:
                metrics = self.evaluate(eval_dataset, eval_batch_size)
                record.update(test_loss=metrics['loss'], test_accuracy=metrics['accuracy'],
                              spike_rates=metrics['spike_rates'])
            self.epoch += 1
            self.history.append(record)
            if out_dir is not None:
                self.save_checkpoint(out_dir / CHECKPOINT_NAME)
                self.write_logs(out_dir)
            if progress:
                tqdm.write(_summary_line(record, epochs))
        return self.history

    def _train_epoch(self, dataset, batch_size: int, epochs: int, progress: bool) -> dict:
        start = time.perf_counter()
        order_seed = int(self._rng.integers(2**31))
        n_batches = dataset.num_batches(batch_size, drop_last=True)
        bar = tqdm(dataset.batches(batch_size, shuffle=True, seed=order_seed, drop_last=True),
                   total=n_batches, desc=f'epoch {self.epoch + 1}/{epochs}', disable=not progress,
                   leave=False, unit='batch')
        loss_sum, correct, seen = 0.0, 0, 0
        for xs, labels in bar:
            loss, hits = self.train_batch(xs, labels)
            loss_sum += loss * len(labels)
            correct += hits
            seen += len(labels)
            bar.set_postfix(loss=f'{loss_sum / seen:.3f}', acc=f'{correct / seen:.3f}')
        bar.close()
        return dict(epoch=self.epoch + 1, train_loss=loss_sum / seen,
                    train_accuracy=correct / seen, epoch_time_s=time.perf_counter() - start)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Pickle parameters, optimiser state, epoch, RNG states and history to ``path``.

        The file is written atomically (a temporary file, then a rename). RNG
        states: the trainer's shuffling generator and ``brainstate.random``'s
        global key.
        """
        path = Path(path)
        state = dict(
            format=_FORMAT,
            epoch=self.epoch,
            params={_name(k): np.asarray(v) for k, v in self._param_values().items()},
            opt_state=[np.asarray(leaf) for leaf in jax.tree.leaves(self.opt_state)],
            rng=None if self._rng is None else self._rng.bit_generator.state,
            brainstate_key=np.asarray(jax.random.key_data(brainstate.random.get_key())),
            history=self.history,
            config=self._config(),
        )
        tmp = path.with_name(path.name + '.tmp')
        with open(tmp, 'wb') as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def restore_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Load a checkpoint written by :meth:`save_checkpoint` into this trainer.

        The model must have the same parameters (names and shapes) and the
        optimiser the same state structure. Also restores ``brainstate.random``'s
        global key.

        Raises
        ------
        ValueError
            If the file is not a trainer checkpoint or does not fit the model
            or the optimiser.
        """
        with open(path, 'rb') as f:
            state = pickle.load(f)
        if not isinstance(state, dict) or state.get('format') != _FORMAT:
            raise ValueError(f'{path} is not a Trainer checkpoint ({_FORMAT}).')
        values = self._checked_params(state['params'], path)
        leaves, treedef = jax.tree.flatten(self.opt_state)
        saved = state['opt_state']
        if len(saved) != len(leaves) or any(np.shape(a) != np.shape(b)
                                            for a, b in zip(saved, leaves)):
            raise ValueError(f'the optimiser state in {path} does not match this optimiser.')
        self._set_param_values(values)
        self.opt_state = jax.tree.unflatten(treedef, [jnp.asarray(a) for a in saved])
        self.epoch = int(state['epoch'])
        self.history = list(state['history'])
        if state['rng'] is None:
            self._rng = None
        else:
            self._rng = np.random.default_rng()
            self._rng.bit_generator.state = state['rng']
        brainstate.random.set_key(jax.random.wrap_key_data(jnp.asarray(state['brainstate_key'])))

    def _checked_params(self, saved: dict, path) -> dict:
        names = {_name(k): k for k in self._params}
        if set(saved) != set(names):
            raise ValueError(f'the parameters in {path} ({sorted(saved)}) do not match the '
                             f'model ({sorted(names)}).')
        values = {}
        for name, key in names.items():
            current = np.shape(u.get_mantissa(self._params[key].value))
            if np.shape(saved[name]) != current:
                raise ValueError(f'parameter {name} in {path} has shape '
                                 f'{np.shape(saved[name])}, the model has {current}.')
            values[key] = jnp.asarray(saved[name])
        return values

    # ------------------------------------------------------------------ logs
    def _config(self) -> dict:
        return dict(algorithm=self.learner.algorithm, loss=self.loss,
                    final_steps=self.final_steps, update_every=self.update_every)

    def metrics(self) -> dict:
        """Summary of the run so far (the content of ``metrics.json``).

        Keys: the configuration (``algorithm``, ``loss``, ``final_steps``,
        ``update_every``), ``epochs_completed``, per-epoch lists
        ``train_loss`` and ``train_accuracy``, ``test_accuracy`` (of the last
        epoch, or None without evaluation) and ``history`` (see :meth:`fit`).
        """
        last = self.history[-1] if self.history else {}
        return dict(self._config(), epochs_completed=self.epoch,
                    train_loss=[r['train_loss'] for r in self.history],
                    train_accuracy=[r['train_accuracy'] for r in self.history],
                    test_accuracy=last.get('test_accuracy'), history=self.history)

    def write_logs(self, out_dir: Union[str, os.PathLike], **extra) -> dict:
        """Write ``metrics.json`` (:meth:`metrics` plus ``extra``) and
        ``learning_curve.png`` into ``out_dir``; returns the metrics dict."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics = dict(self.metrics(), **extra)
        tmp = out_dir / (METRICS_NAME + '.tmp')
        tmp.write_text(json.dumps(metrics, indent=2))
        os.replace(tmp, out_dir / METRICS_NAME)
        if self.history:
            _plot_curves(self.history, out_dir / CURVE_NAME)
        return metrics


def _summary_line(record: dict, epochs: int) -> str:
    line = (f"epoch {record['epoch']}/{epochs}: train loss {record['train_loss']:.4f}, "
            f"train acc {record['train_accuracy']:.1%}")
    if 'test_accuracy' in record:
        rates = ', '.join(f'{k} {v:.3f}' for k, v in record['spike_rates'].items())
        line += f", test acc {record['test_accuracy']:.1%}, spike rates [{rates}]"
    return line + f" ({record['epoch_time_s']:.1f} s)"


def _plot_curves(history: list, path: Path) -> None:
    """Loss and accuracy per epoch, two panels, saved as PNG (no pyplot state)."""
    from matplotlib.figure import Figure

    epochs = [r['epoch'] for r in history]
    fig = Figure(figsize=(9, 3.5), layout='constrained')
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r['train_loss'] for r in history], 'o-', label='train')
    ax_acc.plot(epochs, [r['train_accuracy'] for r in history], 'o-', label='train')
    if all('test_accuracy' in r for r in history):
        ax_loss.plot(epochs, [r['test_loss'] for r in history], 's-', label='test')
        ax_acc.plot(epochs, [r['test_accuracy'] for r in history], 's-', label='test')
    ax_loss.set(xlabel='epoch', ylabel='loss (cross-entropy)', title='loss')
    ax_acc.set(xlabel='epoch', ylabel='accuracy', ylim=(0, 1.02), title='accuracy')
    for ax in (ax_loss, ax_acc):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
