"""Fine-tuning: a new run that starts from another workdir's parameters.

``config.init_from = WORKDIR`` (a ``train.py`` run, or one that ``python -m
laplax.convert`` wrote): :func:`initial_params` reads the newest parameters
of that workdir for the new run's model (checked name by name and shape by
shape); the optimizer starts fresh. ``laplax.cli.common.model_from_init``
gives the new run the saved run's model keys.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import jax
import numpy as np

from laplax import store, utils
from laplax.config import validation as config_lib
from laplax.data.text import tokenizers
from laplax.workdir import checkpoint as ckpt_lib
from laplax.workdir.files import CHECKPOINT_DIR


def copy_init_tokenizer(config, workdir: str) -> None:
  """A language model fine-tuned from ``config.init_from`` reads that run's
  tokens: its ``tokenizer.json`` (or ``nanochat_tokenizer.json``) is copied
  into a workdir that has none."""
  for kind in ("bpe", "nanochat"):
    source = tokenizers.tokenizer_path(config.init_from, kind)
    target = tokenizers.tokenizer_path(workdir, kind)
    if store.isfile(source) and not store.exists(target):  # only language models have one
      if store.is_remote(source) or store.is_remote(target):
        store.write(target, store.read_bytes(source))
        continue
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copyfile(source, target)


class InitFromError(config_lib.ConfigError):
  """``config.init_from`` does not fit the new run (one line, the parameter named)."""


def initial_params(
  init_from: str, abstract_params: Any, fresh: tuple[str, ...] = (), dropped: tuple[str, ...] = ()
) -> Any:
  """The parameters of the newest checkpoint of the workdir ``init_from``
  for a new run whose parameters are ``abstract_params`` (``config.init_from``).

  Every parameter must be there with its shape (cast to the new dtype), except
  the classifier ``head``: one of another shape (another number of classes)
  is left to the new run's initialisation (leaf ``None`` in the result), as
  fine-tuning on a new label set does; so is a learned Laplacian mix
  (``laplacian_mix``) the saved run has not (one it has and this run has not
  is dropped). So are, for a task with a new head (GLUE on a masked-LM run:
  :attr:`laplax.tasks.glue.GLUETask.init_fresh` and ``init_dropped``), the
  top-level parameters named in ``fresh`` the saved run lacks or has in
  another shape, and the saved run's parameters named in ``dropped``.

  Raises:
    ConfigError: no readable checkpoint, or a parameter missing, extra, or of
      another shape (named, one line).
  """
  where = os.path.join(os.path.expanduser(init_from), CHECKPOINT_DIR)
  try:
    step, saved = ckpt_lib.Checkpointer(where, read_only=True).restore_params()
  except ckpt_lib.CheckpointError as e:
    raise InitFromError(f"config.init_from: {e}") from None
  flat_saved = {utils.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(saved)[0]}
  flat_new, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
  names = [utils.path_str(p) for p, _ in flat_new]
  mix = lambda name: name.endswith("/laplacian_mix")
  top = lambda name: name.split("/")[0]
  extra = sorted(n for n in set(flat_saved) - set(names) if not (mix(n) or top(n) in dropped))
  if extra:
    raise InitFromError(
      f"config.init_from={init_from} has parameter {extra[0]} that this model has "
      f"not; use the same model.* keys (Laplacian heads and spectral settings may differ)"
    )
  leaves = []
  for name, (_, x) in zip(names, flat_new):
    if name not in flat_saved and (mix(name) or top(name) in fresh):
      leaves.append(None)
      continue
    if name not in flat_saved:
      raise InitFromError(
        f"config.init_from={init_from} lacks parameter {name}; use the same model.* "
        f"keys as the run it holds"
      )
    value = np.asarray(flat_saved[name])
    if value.shape != tuple(x.shape):
      if top(name) == "head" or top(name) in fresh:
        logging.info(
          "init_from: %s %s -> %s, left at its initialisation", name, value.shape, tuple(x.shape)
        )
        leaves.append(None)
        continue
      raise InitFromError(
        f"config.init_from={init_from}: parameter {name} has shape {value.shape}, "
        f"this model's is {tuple(x.shape)}; use the same model.* keys"
      )
    leaves.append(value.astype(x.dtype))
  logging.info("initialised from step %d of %s", step, init_from)
  return jax.tree_util.tree_unflatten(treedef, leaves)
