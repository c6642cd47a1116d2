"""What the converters share: the error, the layer layout, and laplax workdirs.

A converter maps a foreign ``state_dict`` (``{name: np.ndarray}``) to the
parameter tree of a laplax model and back; :func:`write_workdir` turns a
config and such a tree into a laplax workdir (``config.json`` and a step-0
orbax checkpoint, as ``train.py --config.total_steps=0`` writes), and
:func:`read_workdir` reads one back without preparing its data.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from laplax import state as state_lib
from laplax import utils
from laplax.errors import UserError
from laplax.models import spec as spec_lib
from laplax.models import support
from laplax.models.layers import SCANNED_BLOCKS


class ConvertError(UserError, ValueError):
  """A conversion that cannot be done; the message is one line naming the
  tensor, key or file and the fix."""


def flat(tree: Mapping) -> dict[str, np.ndarray]:
  """``{"a/b/c": leaf}`` of a nested parameter dict."""
  return {utils.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(dict(tree))[0]}


def nested(flat_params: Mapping[str, Any]) -> dict:
  """The nested dict of ``{"a/b/c": leaf}`` (inverse of :func:`flat`)."""
  out: dict = {}
  for name, value in flat_params.items():
    node = out
    *parents, leaf = name.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return out


def to_layout(params: dict, spec: spec_lib.TransformerSpec) -> dict:
  """Per-layer ``block{i}`` subtrees stacked into ``blocks`` when
  ``spec.scan_layers`` (the layout of :func:`laplax.models.layers.transformer_blocks`)."""
  if not spec.scan_layers:
    return params
  params = dict(params)
  layers = [params.pop(f"block{i}") for i in range(spec.depth)]
  params[SCANNED_BLOCKS] = jax.tree_util.tree_map(lambda *x: np.stack(x), *layers)
  return params


def from_layout(params: dict, spec: spec_lib.TransformerSpec) -> dict:
  """The inverse of :func:`to_layout`: ``block{i}`` subtrees, whatever the layout."""
  if SCANNED_BLOCKS not in params:
    return params
  params = dict(params)
  stacked = params.pop(SCANNED_BLOCKS)
  for i in range(spec.depth):
    params[f"block{i}"] = jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], stacked)
  return params


def torch_state_dict(path: str, missing_torch_hint: str) -> tuple[Any, Mapping]:
  """``(torch, state)``: the module and ``torch.load(path, map_location="cpu",
  weights_only=True)`` of an untrusted PyTorch file (no code in it runs).
  PyTorch is imported here only.

  Raises:
    ConvertError: torch missing (the line ends with ``missing_torch_hint``),
      an unreadable file, or an object that is not a mapping.
  """
  try:
    import torch
  except ImportError:
    raise ConvertError(
      f"{path} is a PyTorch file and torch is not installed; {missing_torch_hint}"
    ) from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:
    raise ConvertError(
      f"cannot read {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    ) from None
  if not isinstance(state, Mapping):
    raise ConvertError(f"{path} holds a {type(state).__name__}, not a state dict")
  return torch, state


def new_directory(parent: str) -> str:
  """A new temporary directory in ``parent`` (renamed into place by
  :func:`commit_directory`) with the permissions ``os.makedirs`` would give
  (``mkdtemp``'s are 0700). A SIGINT/SIGTERM that ends the process at once
  (:mod:`laplax.signals`) removes it first."""
  from laplax import signals

  tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)
  _PENDING[tmp] = signals.at_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
  return tmp


_PENDING: dict = {}  # temporary directory -> the function unregistering its removal


def commit_directory(tmp: str, path: str) -> None:
  """Renames the finished :func:`new_directory` ``tmp`` to ``path``, as one
  step that a signal's immediate exit waits for (it never sees half of it)."""
  from laplax import signals

  with signals.critical():
    os.rename(tmp, path)
    _PENDING.pop(tmp, lambda: None)()


def check_params(params: Mapping, abstract: Mapping, source: str) -> None:
  """Raises :class:`ConvertError` unless ``params`` has exactly the names,
  shapes and dtypes of ``abstract`` (the laplax model's parameter tree)."""
  got, want = flat(params), flat(abstract)
  for name in want:
    if name not in got:
      raise ConvertError(f"{source} gives no value for laplax parameter {name}")
  for name, value in got.items():
    if name not in want:
      raise ConvertError(f"{source} gives laplax parameter {name}, which this model has not")
    if tuple(np.shape(value)) != tuple(want[name].shape):
      raise ConvertError(
        f"{source}: laplax parameter {name} would be "
        f"{tuple(np.shape(value))}, the model's is {tuple(want[name].shape)}"
      )


def write_workdir(
  workdir: str,
  config: ml_collections.ConfigDict,
  params: Mapping,
  *,
  num_classes: int | None = None,
  image_shape: tuple | None = None,
  vocab_size: int | None = None,
  files: Mapping[str, str] | None = None,
  source: str = "the source",
) -> None:
  """Writes a new laplax workdir: ``config.json`` and the step-0 checkpoint
  of ``params`` (a fresh optimizer state, RNG from ``config.seed``), plus
  ``files`` (``{name in workdir: path to copy}``, e.g. ``tokenizer.json``).

  Everything is written in a temporary directory beside ``workdir`` and
  renamed at the end, so a failure leaves nothing.

  Args:
    workdir: the new run directory (must not exist).
    config: a validated laplax config (classification or lm).
    params: the model's parameter tree (float32 NumPy leaves).
    num_classes, image_shape: the classifier's sizes (classification).
    vocab_size: the language model's vocabulary (lm).
    files: extra files to copy in.
    source: how errors name where the parameters came from.

  Raises:
    ConvertError: ``workdir`` exists, or ``params`` does not fit the model.
  """
  from laplax import (
    optim,
    tasks,
  )
  from laplax.state import TrainState
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir.files import CHECKPOINT_DIR, write_config

  workdir = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(workdir):
    raise ConvertError(f"--workdir {workdir} exists; give a new directory (nothing was written)")
  task = tasks.task_class(config).from_shapes(
    config, num_classes=num_classes, image_shape=image_shape, vocab_size=vocab_size
  )
  tx = optim.make_optimizer(config)
  abstract = state_lib.abstract_state(task, tx, config.seed)
  check_params(params, abstract.params, source)
  params = jax.tree_util.tree_map(
    lambda x, a: np.asarray(x, a.dtype), dict(params), abstract.params
  )
  rng = jax.random.PRNGKey(config.seed)
  state = TrainState(
    step=np.zeros((), np.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.fold_in(rng, 1),
    task_state=task.init_task_state(params),
  )
  parent = os.path.dirname(workdir)
  os.makedirs(parent, exist_ok=True)
  tmp = new_directory(parent)
  try:
    write_config(config, tmp)
    checkpointer = ckpt_lib.Checkpointer(os.path.join(tmp, CHECKPOINT_DIR))
    checkpointer.save(state, None)
    checkpointer.close()
    for name, path in (files or {}).items():
      shutil.copyfile(path, os.path.join(tmp, name))
    commit_directory(tmp, workdir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def read_workdir(workdir: str):
  """``(config, spec, params, step)`` of the newest checkpoint of a laplax
  workdir; the data is not needed (parameters only, NumPy leaves, per-layer
  ``block{i}`` layout whatever ``scan_layers``).

  Raises:
    ConvertError: not a laplax workdir, or no readable checkpoint.
  """
  from laplax import loading as restore
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir.files import CHECKPOINT_DIR

  try:
    config = restore.saved_config(workdir)
  except restore.LoadError as e:
    raise ConvertError(str(e)) from None
  if not restore.saved_steps(workdir):
    raise ConvertError(
      f"{workdir} has no checkpoint; train first with train.py --workdir {workdir}"
    )
  try:
    step, params = ckpt_lib.Checkpointer(
      os.path.join(workdir, CHECKPOINT_DIR), read_only=True
    ).restore_params()
  except ckpt_lib.CheckpointError as e:
    raise ConvertError(str(e)) from None
  spec = spec_lib.from_config(config.model)
  return config, spec, from_layout(params, spec), step


#: The ``config.model`` options a conversion from another framework resets to
#: the source's model (plain attention, float32 compute, so the logits are the
#: source's) unless the command line sets them: the spec fields whose metadata
#: marks them ``source`` (:func:`laplax.models.support.source_options`).
SOURCE_OPTIONS = {
  k: v for cls in spec_lib.FAMILIES.values() for k, v in support.source_options(cls).items()
}


def refuse_unsupported(
  spec: spec_lib.TransformerSpec, target: str, name: str, fix: str, *, skip_source: bool = False
) -> None:
  """Refuses the first option of ``spec`` that converter ``target`` cannot
  express, as the fields' metadata declares it
  (:func:`laplax.models.support.unsupported`: an option a field does not
  declare for ``target`` is refused unless at its default, so a new spec
  field fails closed). ``name`` is the target as the message names it,
  ``fix`` ends the line; ``skip_source`` (``--from``) leaves the options
  the command line may add (:data:`SOURCE_OPTIONS`) to the caller.

  Raises:
    ConvertError: ``model.KEY=VALUE: NAME has no equivalent (it has ...); FIX``.
  """
  refused = support.unsupported(spec, target, skip_source=skip_source)
  if refused:
    key, shown, supported = refused[0]
    raise ConvertError(f"model.{key}={shown}: {name} has no equivalent (it has {supported}); {fix}")


def plain_attention(config: ml_collections.ConfigDict, given: list[str]) -> None:
  """Sets :data:`SOURCE_OPTIONS` in ``config.model``, except the keys in
  ``given`` (:func:`laplax.cli.common.explicit_model_keys`:
  ``--config.model.num_laplacian_heads=2`` converts into a model with
  Laplacian heads)."""
  for key, value in SOURCE_OPTIONS.items():
    if any(key == g or key.startswith(g + ".") for g in given):
      continue
    node, leaf = config.model, key
    if "." in key:
      section, leaf = key.split(".")
      node = config.model.get(section)
    if node is not None and leaf in node:
      node[leaf] = value


def refuse_laplax_only(spec: spec_lib.TransformerSpec, target: str, force: bool) -> str | None:
  """What ``target`` (timm, Hugging Face) must change to run a model with
  Laplacian heads or spectral conditioning, or ``None`` for a plain model.

  Raises:
    ConvertError: such a model without ``force``.
  """
  changes = []
  heads = spec.laplacian_array
  if heads.any() or spec.attention.laplacian_mix != "fixed":
    layers = "; ".join(
      f"layer {i}: heads {[int(h) for h in np.flatnonzero(row)]}"
      for i, row in enumerate(heads)
      if row.any()
    )
    changes.append(
      f"Laplacian heads output V - softmax(QK^T/sqrt(d))V ({layers or 'a learned mix per head'})"
    )
  if spec.attention.spectral is not None:
    sp = spec.attention.spectral
    changes.append(
      f"spectral conditioning adds the fixed correction (lambda={sp.lam}, "
      f"mode={sp.mode}) of laplax.spectral.correction to W_{'/W_'.join(sp.targets.upper())}"
      f" at every forward (the written weights are W without it)"
    )
  if not changes:
    return None
  message = f"{target} has no equivalent of: " + "; ".join(changes)
  if not force:
    raise ConvertError(
      f"{message}; pass --force to write the weights anyway (the "
      f"target code must then make these changes)"
    )
  return message
