"""Loading a trained laplax run in Python: ``laplax.load(workdir)``.

    import laplax
    run = laplax.load("runs/vit")                     # the newest readable step
    logits, _ = run.model.apply({"params": run.params}, images, train=False)

:func:`load` reads the config a run saved in its workdir (``config.json``,
written by ``train.py``), builds the task with it (the task's data must be
prepared, as for ``eval.py``: a classifier needs its number of classes, a
language model its tokenizer) and restores a checkpoint onto one device,
whatever mesh the run was trained on. ``eval.py`` restores through it too.
Every problem with the workdir is a :class:`LoadError` with a one-line message.

A workdir may be read while ``train.py`` writes it: the checkpoints are read
without its lock and without writing anything; orbax renames a step into
place only when it is complete (its checksum manifest with it), and a step
that ``train.py`` deletes while it is read is replaced by its newest one.
With ``checkpoint_verify`` in the run's config (the default) every file of
the restored step is checked against its manifest first.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from laplax.workdir import checkpoint as ckpt_lib
from laplax.train.state import TrainState
from laplax.config import validation as config_lib
from laplax.errors import UserError
from laplax.train import loop, optim
from laplax.workdir.files import CHECKPOINT_DIR, CONFIG_FILE, load_saved_config


class LoadError(UserError, ValueError):
  """A workdir that cannot be loaded; the message is one line with the fix."""


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A restored run, on one device, ready for ``model.apply``.

  Attributes:
    model: the task's network (``ViT`` for classification, ``GPT`` for
      language models, the DINO student ``DINO(backbone, head)`` for DINO);
      ``model.apply({"params": params}, x, train=False)`` returns ``(output,
      aux)``: logits float32 ``[B, num_classes]`` for images float32 ``[B,
      H, W, C]`` (normalised as ``task.eval_batches()`` gives them), or
      float32 ``[B, T, vocab_size]`` for token ids int32 ``[B, T]`` with
      ``T <= config.model.max_length``.
    params: the trained parameters of ``model`` (float32 pytree of
      ``jax.Array`` on ``jax.local_devices()[0]``).
    config: the run's config (``config.json``), locked (no new keys).
    step: the restored step (number of updates applied; 0 = initialisation).
    latest_step: the newest saved step; it differs from ``step`` when an
      older ``step`` was asked for or the newest checkpoint is unreadable.
    teacher: DINO's teacher parameters (``{"backbone", "head"}``, for
      ``task.teacher``; its backbone is what DINO evaluates), else ``None``.
    task: the task object (:mod:`laplax.tasks`): ``task.evaluate(state)``,
      ``task.eval_batches()``, ``task.tokenizer`` (language models).
    state: the whole restored ``TrainState`` (step, parameters, optimizer
      state, RNG key, task state), on the same device.
  """
  model: nn.Module
  params: Any
  config: ml_collections.ConfigDict
  step: int
  latest_step: int
  teacher: Any
  task: Any
  state: TrainState


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a laplax run saved in ``workdir/config.json``.

  Raises:
    LoadError: ``workdir`` does not exist or is not a directory, it has no
      ``config.json``, or that file is unreadable or not a laplax config.
  """
  if not os.path.exists(workdir):
    raise LoadError(f"{workdir} does not exist: no laplax run there; train one "
                    f"with train.py --workdir {workdir}")
  if not os.path.isdir(workdir):
    raise LoadError(f"{workdir} is a file, not a laplax workdir; give the "
                    f"directory train.py --workdir wrote")
  try:
    config = load_saved_config(workdir)
  except config_lib.ConfigError as e:
    raise LoadError(str(e)) from None
  if config is None:
    raise LoadError(f"{workdir} has no {CONFIG_FILE}; train first with train.py "
                    f"--workdir {workdir}")
  return config


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in ``workdir``, ascending (``[]``
  if it has none); creates nothing."""
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    return []
  return ckpt_lib.Checkpointer(directory, read_only=True).all_steps()


def _single_device(abstract_state: TrainState) -> TrainState:
  """``abstract_state`` with every leaf on this process's first device."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_state)


def _restore(workdir: str, task, config, step: int | None) -> TrainState:
  """The TrainState of ``step`` (default: the newest readable) on one device.

  Raises:
    LoadError: the checkpoint(s) cannot be read.
  """
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, CHECKPOINT_DIR),
                                       verify=bool(config.get("checkpoint_verify", True)),
                                       read_only=True)
  target = _single_device(loop.abstract_state(task, optim.make_optimizer(config),
                                              config.seed))
  try:
    state, _ = checkpointer.restore(target, step=step, with_data=False)
  except ckpt_lib.CheckpointError as e:
    if step is None:
      raise LoadError(str(e)) from None
    reason = re.search(r"failed: ([^)]*)\)", str(e))
    raise LoadError(f"checkpoint step {step} in {checkpointer.directory} is "
                    f"unreadable ({reason.group(1) if reason else 'unknown'}); "
                    f"load another step") from None
  return jax.device_put(state, jax.local_devices()[0])


def load(workdir: str, step: int | None = None) -> Loaded:
  """Restores a laplax run (a ``train.py`` workdir) onto one device.

  Reads ``workdir/config.json``, builds the task of that config (preparing its
  data as ``eval.py`` does; nothing is written into ``workdir`` except a
  language model's tokenizer when it is missing) and restores the checkpoint
  of ``step``. A checkpoint saved sharded on any mesh is restored whole onto
  ``jax.local_devices()[0]`` (``jax.devices()[0]`` in a single process).
  When ``step`` is ``None`` and the newest checkpoint is unreadable (or,
  with the run's ``checkpoint_verify``, fails its checksums), the newest
  readable one is used with a logged warning (``Loaded.step`` is then below
  ``Loaded.latest_step``).

  Args:
    workdir: the directory ``train.py --workdir`` wrote.
    step: the saved step to restore (default: the newest).

  Returns:
    A :class:`Loaded`: ``model``, ``params``, ``config``, ``step``,
    ``latest_step``, ``teacher`` (DINO), ``task`` and the whole ``state``.

  Raises:
    LoadError: ``workdir`` missing, no ``config.json`` or not a laplax config,
      no checkpoint, ``step`` not saved (the message lists the saved steps),
      or no readable checkpoint (``step``'s, or any, when ``step`` is None).
    ConfigError, DataError: the saved config's data cannot be prepared
      (e.g. the dataset is not in ``config.data.data_dir`` on this machine).
  """
  config = saved_config(workdir)
  steps = saved_steps(workdir)
  if not steps:
    raise LoadError(f"{workdir} has no checkpoint; train first with train.py "
                    f"--workdir {workdir}")
  if step is not None and int(step) not in steps:
    raise LoadError(f"step {step} is not saved in {workdir}; saved steps: "
                    f"{', '.join(map(str, steps))}")
  task = loop.setup(config, workdir, check=False)
  config.lock()
  state = _restore(workdir, task, config, None if step is None else int(step))
  teacher = None
  if isinstance(state.task_state, dict) and "teacher" in state.task_state:
    teacher = state.task_state["teacher"]
  return Loaded(model=task.model, params=state.params, config=config,
                step=int(state.step), latest_step=max(steps[-1], int(state.step)),
                teacher=teacher,
                task=task, state=state)
