"""Checkpoints that are data, not code: one ``.npz`` archive, digest-checked on load.

A checkpoint file is a NumPy ``.npz`` archive, always read with
``allow_pickle=False`` (loading never runs code), holding

* ``param/<name>``: every parameter's mantissa (its unit is in the metadata);
* ``opt/<i>``: the leaves of the optimiser state, in tree order;
* ``rng/brainstate_key``: the key data of ``brainstate.random``;
* ``__meta__``: UTF-8 JSON (as ``uint8``): the format tag, the metadata of the
  run (epoch, update count, history, configuration, ...), the parameters'
  units and the optimiser-state leaf paths;
* ``__sha256__``: the SHA-256 digest of every other entry's name, dtype,
  shape and bytes.

Arrays of the extension dtypes of ``ml_dtypes`` (``bfloat16``, the float8
types, ``int4``, ...), which ``.npy`` cannot describe, are stored as
unsigned integers of the same width, their dtype names under ``dtypes`` in
the metadata, and restored bitwise.

:func:`read` refuses a file whose digest, format or layout is wrong, so a
flipped bit is an error and not a silently different number; it checks every
archive entry before inflating it (:mod:`braintrace_conv._npy_files`) and
the metadata against the schema of a training run (types, ranges, nesting
depth) and every floating-point array to be finite. :func:`write` is atomic.
The functions here check a checkpoint against a model, an optimiser state or
a configuration without changing anything, so a caller validates everything
first and mutates afterwards.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Mapping, Optional, Union

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .._npy_files import NpyFileError, read_npz
from ._files import atomic_write
from .params import ParamView

__all__ = ['FORMAT', 'CheckpointError', 'ConfigMismatchError', 'write', 'read',
           'field', 'config_differences', 'check_config', 'params_from', 'tree_arrays', 'tree_from']

#: Format tag stored in (and required of) every checkpoint.
FORMAT = 'braintrace_conv.checkpoint/1'
_META, _DIGEST = '__meta__', '__sha256__'
#: Deepest nesting of lists and dicts accepted in the metadata.
MAX_META_DEPTH = 32


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is corrupt, or does not fit what it is loaded into."""


class ConfigMismatchError(CheckpointError):
    """A checkpoint written with another configuration.

    ``differences`` maps each differing option to ``(stored value, given value)``;
    ``described`` maps some of them to what differs, shown instead of both values.
    """

    def __init__(self, path, differences: dict, described: Optional[dict] = None):
        self.differences = differences
        described = described or {}
        listed = '; '.join(f'{k}: {described[k]}' if k in described else
                           f'{k}: {differences[k][0]!r} in the checkpoint, '
                           f'{differences[k][1]!r} now' for k in sorted(differences))
        super().__init__(f'{path} was written with a different configuration ({listed}).')


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write(path: Union[str, os.PathLike], arrays: Mapping[str, np.ndarray], meta: dict) -> None:
    """Write ``arrays`` (name -> numeric array) and JSON-able ``meta`` to ``path`` atomically."""
    entries = {name: np.asarray(a) for name, a in arrays.items()}
    dtypes = {}
    for name, a in entries.items():
        if a.dtype.hasobject or a.dtype.names is not None:
            raise TypeError(f'checkpoint entry {name} must be a numeric array, got dtype '
                            f'{a.dtype}.')
        if a.dtype.kind == 'V':     # an ml_dtypes type: its bits as unsigned integers
            dtypes[name] = a.dtype.name
            entries[name] = a.view(f'u{a.dtype.itemsize}')
    meta = dict(meta, format=FORMAT)
    if dtypes:
        meta['dtypes'] = dtypes
    entries[_META] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    entries[_DIGEST] = np.frombuffer(_digest(entries).encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    atomic_write(path, buffer.getvalue())


def read(path: Union[str, os.PathLike]) -> tuple[dict, dict]:
    """``(arrays, meta)`` of the checkpoint at ``path``, after checking its digest and format.

    Raises:
      FileNotFoundError: If there is no file at ``path``.
      CheckpointError: If the file is not a checkpoint archive (e.g. a pickle, which is never
        loaded), is truncated or corrupt (digest mismatch), or has another format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'no checkpoint at {path}.')
    try:
        arrays = read_npz(path)
    except NpyFileError as err:
        raise CheckpointError(f'{path} is corrupt or not a checkpoint archive (checkpoints are '
                              f'.npz files, never unpickled): {err.problem}') from None
    except OSError as err:
        raise CheckpointError(f'{path} cannot be read: {err.strerror or err}') from None
    if _META not in arrays or _DIGEST not in arrays:
        raise CheckpointError(f'{path} is not a braintrace_conv checkpoint (no metadata).')
    stored = arrays.pop(_DIGEST)
    if stored.dtype != np.uint8 or stored.tobytes().decode('ascii', 'replace') != _digest(arrays):
        raise CheckpointError(f'{path} is corrupt: its SHA-256 digest does not match its '
                              f'content.')
    try:
        meta = json.loads(arrays.pop(_META).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f'{path} has unreadable metadata: {err}') from None
    except RecursionError:
        raise CheckpointError(f'{path} has metadata nested deeper than {MAX_META_DEPTH} '
                              f'levels.') from None
    if not isinstance(meta, dict) or meta.get('format') != FORMAT:
        found = meta.get('format') if isinstance(meta, dict) else None
        raise CheckpointError(f'{path} has format {found!r}; this version reads {FORMAT!r}.')
    _check_meta(meta, path)
    for name, dtype in meta.get('dtypes', {}).items():
        arrays[name] = _extension_view(arrays, name, dtype, path)
    for name, a in arrays.items():
        if jnp.issubdtype(a.dtype, jnp.inexact) and not np.all(np.isfinite(a)):
            raise CheckpointError(f'{path} holds non-finite values (NaN or infinity) in '
                                  f'{name}; a run never saves them.')
    return arrays, meta


def _depth(value) -> int:
    """Nesting depth of lists and dicts in a JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            deepest = max(deepest, depth)
            if depth <= MAX_META_DEPTH:
                stack.extend((v, depth + 1) for v in
                             (value.values() if isinstance(value, dict) else value))
    return deepest


def _count(meta: dict, key: str, path, low: int = 0, high: float = math.inf) -> int:
    value = field(meta, key, int, path)
    if not low <= value <= high:
        raise CheckpointError(f'{path} has {key} = {value} in its metadata; it must lie in '
                              f'[{low}, {high}].')
    return value


def _check_meta(meta: dict, path) -> None:
    """The metadata of a training run: types, ranges and nesting depth (``CheckpointError``)."""
    if _depth(meta) > MAX_META_DEPTH:
        raise CheckpointError(f'{path} has metadata nested deeper than {MAX_META_DEPTH} '
                              f'levels.')
    epoch = _count(meta, 'epoch', path)
    step = _count(meta, 'step', path)
    _count(meta, 'skipped_updates', path, 0, step)
    if 'devices' in meta:
        _count(meta, 'devices', path, 1)
    history = field(meta, 'history', list, path)
    if len(history) != epoch or not all(
            isinstance(r, dict) and r.get('epoch') == i + 1 for i, r in enumerate(history)):
        raise CheckpointError(f'{path} has an invalid history: {epoch} epoch(s) need one '
                              f'record each, numbered from 1.')
    best = meta.get('best')
    if best is not None and not (
            isinstance(best, dict) and isinstance(best.get('epoch'), int)
            and not isinstance(best['epoch'], bool) and 1 <= best['epoch'] <= epoch
            and isinstance(best.get('test_accuracy'), (int, float))
            and 0 <= best['test_accuracy'] <= 1):
        raise CheckpointError(f'{path} has an invalid best entry: {best!r}.')
    for key in ('trainer', 'run', 'fit', 'units'):
        if key in meta:
            field(meta, key, dict, path)
    if not all(isinstance(v, str) for v in meta.get('units', {}).values()):
        raise CheckpointError(f"{path} lacks a valid 'units' entry in its metadata.")
    paths = meta.get('opt_paths', [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise CheckpointError(f"{path} lacks a valid 'opt_paths' entry in its metadata.")
    # fit draws the shuffling generator before its first epoch; a trainer updated only
    # through train_batch has none yet
    rng = meta.get('rng')
    if (rng is None and epoch > 0) or (rng is not None and not isinstance(rng, dict)):
        raise CheckpointError(f'{path} has invalid generator states: the shuffling '
                              f'generator is {rng!r} after {epoch} epoch(s); a run saves it '
                              f'from its first epoch on.')
    dtypes = meta.get('dtypes', {})
    if not isinstance(dtypes, dict) or not all(isinstance(v, str) for v in dtypes.values()):
        raise CheckpointError(f"{path} lacks a valid 'dtypes' entry in its metadata.")


def _extension_view(arrays: dict, name: str, dtype: str, path) -> np.ndarray:
    """The entry ``name`` (unsigned integers) viewed as the ml_dtypes type ``dtype``."""
    kind = getattr(ml_dtypes, dtype, None) if dtype.isidentifier() else None
    try:
        kind = None if kind is None else np.dtype(kind)
    except TypeError:
        kind = None
    stored = arrays.get(name)
    if (kind is None or kind.kind != 'V' or stored is None
            or stored.dtype != np.dtype(f'u{kind.itemsize}')):
        raise CheckpointError(f'{path} stores {name} as {dtype!r}, which is not an ml_dtypes '
                              f'type of its width.')
    return stored.view(kind)


def field(meta: dict, key: str, kind, path):
    """``meta[key]`` checked to be a ``kind`` (bools are not ints)."""
    value = meta.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CheckpointError(f'{path} lacks a valid {key!r} entry in its metadata.')
    return meta[key]


def _json(value):
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def config_differences(stored: dict, given: dict) -> dict:
    """``{option: (stored, given)}`` for every option whose values differ (JSON-compared)."""
    stored, given = _json(stored), _json(given)
    return {k: (stored.get(k), given.get(k)) for k in sorted(set(stored) | set(given))
            if stored.get(k) != given.get(k)}


def check_config(meta: dict, key: str, given: dict, path) -> None:
    """Raise :class:`ConfigMismatchError` if ``meta[key]`` differs from ``given``."""
    differences = config_differences(field(meta, key, dict, path), given)
    if differences:
        raise ConfigMismatchError(path, differences)


def params_from(arrays: dict, meta: dict, view: ParamView, path, *, cast: bool) -> dict:
    """The parameter mantissas stored in a checkpoint, checked against ``view``'s model.

    Names, shapes and units must match; dtypes must match too unless ``cast``
    (then floating values are converted to the model's dtype).
    """
    units = field(meta, 'units', dict, path)
    stored = {k[len('param/'):] for k in arrays if k.startswith('param/')}
    if stored != set(view.names):
        raise CheckpointError(f'the parameters in {path} do not match the model: only in the '
                              f'checkpoint {sorted(stored - set(view.names))}, only in the model '
                              f'{sorted(set(view.names) - stored)}.')
    current = view.named(view.mantissas())
    out = {}
    for name, unit in zip(view.names, view.units):
        saved, now = arrays[f'param/{name}'], current[name]
        if saved.shape != np.shape(now):
            raise CheckpointError(f'parameter {name} in {path} has shape {saved.shape}, the '
                                  f'model has {np.shape(now)}.')
        if units.get(name) != str(unit):
            raise CheckpointError(f'parameter {name} in {path} is in unit '
                                  f'{units.get(name)!r}, the model has {str(unit)!r}.')
        dtype = jnp.result_type(now)
        if saved.dtype != dtype and not (cast and np.issubdtype(saved.dtype, np.floating)):
            raise CheckpointError(f'parameter {name} in {path} is {saved.dtype}, the model is '
                                  f'{dtype} (set jax_enable_x64 as when the run was saved).')
        out[name] = jnp.asarray(saved, dtype)
    return view.from_named(out)


def _leaf_paths(tree) -> list:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def tree_arrays(prefix: str, tree) -> tuple[dict, list]:
    """``({f'{prefix}/{i}': leaf}, leaf paths)`` of a pytree, leaves in tree order."""
    return ({f'{prefix}/{i}': np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(tree))},
            _leaf_paths(tree))


def tree_from(prefix: str, arrays: dict, paths, like, path, what: str):
    """The pytree stored by :func:`tree_arrays`, checked to have ``like``'s leaf paths,
    shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(like)
    own_paths = _leaf_paths(like)
    stored = [arrays.get(f'{prefix}/{i}') for i in range(len(own_paths))]
    if (paths != own_paths or any(a is None for a in stored)
            or sum(k.startswith(prefix + '/') for k in arrays) != len(own_paths)):
        raise CheckpointError(f'the {what} in {path} does not match this one (stored leaves '
                              f'{paths}, expected {own_paths}).')
    for p, a, leaf in zip(own_paths, stored, leaves):
        if a.shape != np.shape(leaf) or a.dtype != jnp.result_type(leaf):
            raise CheckpointError(f'the {what} leaf {p} in {path} is {a.dtype}{list(a.shape)}, '
                                  f'expected {jnp.result_type(leaf)}{list(np.shape(leaf))}.')
    return jax.tree.unflatten(treedef, [jnp.asarray(a) for a in stored])

