"""Loading a trained laplax run in Python: ``laplax.load(workdir)``.

    import laplax
    run = laplax.load("runs/vit")                     # the newest readable step
    logits, _ = run.model.apply({"params": run.params}, images, train=False)

The user guide is docs/evaluation.md, "Python API". No data is prepared and no
optimizer built until :attr:`Loaded.task` / :attr:`Loaded.state` are first read. A
workdir may be read while ``train.py`` writes it: nothing is written or locked,
orbax renames a step into place only when complete, and a step deleted while read
is replaced by the newest one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from laplax import optim, sharding, store, tasks
from laplax import state as state_lib
from laplax.config import run as run_lib
from laplax.config import validation as config_lib
from laplax.errors import UserError
from laplax.evaluators import registry
from laplax.state import TrainState
from laplax.train import loop
from laplax.workdir import checkpoint as ckpt_lib
from laplax.workdir.files import CHECKPOINT_DIR, CONFIG_FILE, load_saved_config


class LoadError(UserError, ValueError):
  """A workdir that cannot be loaded; the message is one line with the fix."""


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A restored run, on one device, ready for ``model.apply``.

  Attributes:
    model: the network built from the saved spec (``ViT``, ``GPT``, or the DINO
      student ``DINO(backbone, head)``); ``model.apply({"params": params}, x,
      train=False)`` returns ``(output, aux)``: logits float32 ``[B, num_classes]``
      for images float32 ``[B, H, W, C]`` (normalised as ``task.eval_batches()``), or
      float32 ``[B, T, vocab_size]`` for token ids int32 ``[B, T]``, ``T <=
      config.model.max_length``.
    params: float32 pytree of ``jax.Array`` on ``jax.local_devices()[0]``.
    config: the run's ``config.json``, locked.
    step: the restored step (updates applied; 0 = initialisation).
    latest_step: the newest saved step (differs when an older or readable one was used).
    teacher: DINO's teacher ``{"backbone", "head"}``, else ``None``.
    task_state: the task's restored state (DINO: ``{"teacher", "center"}``) or ``None``.
    workdir: the loaded directory.
    shapes_task: the task built without data at the checkpoint's sizes
      (:meth:`~laplax.tasks.base.TaskBase.from_shapes`).
    run_spec: the checked run spec of ``config``
      (:class:`laplax.config.run.RunSpec`), built once by :func:`load`.
  """

  model: nn.Module
  params: Any
  config: ml_collections.ConfigDict
  step: int
  latest_step: int
  teacher: Any
  task_state: Any = None
  workdir: str = ""
  shapes_task: Any = dataclasses.field(default=None, repr=False, compare=False)
  run_spec: run_lib.RunSpec | None = dataclasses.field(default=None, repr=False, compare=False)

  @functools.cached_property
  def task(self):
    """The task (:mod:`laplax.tasks`) with its data prepared, built on first access.

    Writes nothing but a language model's missing tokenizer.

    Raises:
      ConfigError, DataError: the config's data cannot be prepared here.
    """
    return loop.setup(self.config, self.workdir, check=False, run=self.run_spec)[1]

  def evaluate(self, evals: str | None = None) -> dict:
    """The numbers ``eval.py`` writes for this step, without figures or writing anything.

    The evaluators of ``config.evals`` meant for ``eval.py``, or those of ``evals``
    (comma-separated, e.g. ``"knn,linear_probe"``), on :attr:`eval_state`.

    Raises:
      ConfigError: ``evals`` names an evaluator this run's task lacks, or none.
      DataError: the data of the task or of an evaluator cannot be read.
    """
    task = self.task
    wanted = (
      run_lib.section(self.run_spec or self.config, "evaluation").evals
      if evals is None
      else registry.check_names(evals, self.config.task)
    )
    evaluators = [
      registry.get(n)(task)
      for n in wanted
      if evals is not None or registry.get(n).runs_at(registry.EVAL, self.config)
    ]
    for evaluator in evaluators:
      evaluator.prepare()
    return registry.run(evaluators, self.eval_state, registry.Context(say=lambda line: None))[0]

  @property
  def eval_state(self) -> TrainState:
    """A :class:`~laplax.state.TrainState` of ``step``, ``params``, ``task_state`` (the rest ``None``)."""
    return TrainState(
      step=jnp.asarray(self.step, jnp.int32),
      params=self.params,
      opt_state=None,
      rng=None,
      task_state=self.task_state,
    )

  @functools.cached_property
  def state(self) -> TrainState:
    """The whole restored ``TrainState`` of :attr:`step`, read on first access (no data needed).

    Raises:
      LoadError: the step has become unreadable since it was loaded.
    """
    run = self.run_spec or self.config
    target = state_lib.abstract_state(self.shapes_task, optim.make_optimizer(run), self.config.seed)
    checkpointer = _checkpointer(self.workdir, run_lib.section(run, "schedule"))
    state, _ = _read(checkpointer, target, self.step, partial=False)
    return jax.device_put(state, jax.local_devices()[0])


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a laplax run saved in ``workdir/config.json``.

  Raises:
    LoadError: ``workdir`` missing or not a directory, no ``config.json``, or that file
      unreadable or not a laplax config.
  """
  store.check_scheme(workdir, "workdir")
  if not store.exists(workdir):
    raise LoadError(
      f"{workdir} does not exist: no laplax run there; train one with train.py --workdir {workdir}"
    )
  if not store.isdir(workdir):
    raise LoadError(
      f"{workdir} is a file, not a laplax workdir; give the directory train.py --workdir wrote"
    )
  try:
    config = load_saved_config(workdir)
  except config_lib.ConfigError as e:
    raise LoadError(str(e)) from None
  if config is None:
    raise LoadError(
      f"{workdir} has no {CONFIG_FILE}; train first with train.py --workdir {workdir}"
    )
  return config


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in ``workdir``, ascending (``[]``
  if it has none); creates nothing."""
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not store.isdir(directory):
    return []
  return ckpt_lib.Checkpointer(directory, read_only=True).all_steps()


def _only(flat: Mapping[str, Any], suffix: str, workdir: str):
  """The shape of the one saved parameter whose name ends with ``suffix``
  (``None`` if there is none).

  Raises:
    LoadError: several parameters end with ``suffix``.
  """
  found = [v for k, v in flat.items() if k == suffix or k.endswith("/" + suffix)]
  if len(found) > 1:
    raise LoadError(
      f"the checkpoint in {workdir} has {len(found)} parameters "
      f"{suffix}; it is not a laplax model of its config"
    )
  return tuple(found[0].shape) if found else None


def _vocabulary(config: ml_collections.ConfigDict, rows: int) -> int:
  """The vocabulary of a token table of ``rows`` rows: the config's (256 for
  bytes, else ``data.vocab_size``) where the table is that vocabulary padded
  to ``model.vocab_multiple`` (a GPT of the Laplacian authors' nanochat fork:
  its logits are cut back to the vocabulary, so no padded id is ever scored
  or sampled), else the rows."""
  if not tasks.is_language_model(config):
    return rows
  vocab = 256 if config.data.tokenizer == "byte" else int(config.data.vocab_size)
  multiple = int(config.model.vocab_multiple)
  return vocab if -(-vocab // multiple) * multiple == rows else rows


def checkpoint_sizes(
  config: ml_collections.ConfigDict, params: Mapping, workdir: str = "the workdir"
) -> dict:
  """The sizes a task takes from its data, read from a saved parameter tree.

  ``num_classes`` (the ``head`` kernel ``[width, classes]``; 0 without), ``image_shape``
  ``(H, W, C)`` (C from the patch kernel ``[p, p, C, width]``; the square grid of a
  learned position embedding ``[1, N, width]``, else ``config.data.image_size``; DINO:
  the global crops' size) and ``vocab_size`` (the token embedding ``[V, width]``;
  a GPT's vocabulary without the padding of ``model.vocab_multiple``).

  Raises:
    LoadError: a tree without the parameters the config's model has.
  """
  flat = {
    "/".join(str(getattr(k, "key", k)) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(dict(params))[0]
  }
  if tasks.is_language_model(config) or tasks.task_class(config).family == "bert":
    embedding = _only(flat, "token_embedding/embedding", workdir)
    if embedding is None:
      raise LoadError(
        f"the checkpoint in {workdir} has no token embedding; it is not the "
        f"{config.model.name.upper()} of its config.json"
      )
    return {"vocab_size": _vocabulary(config, int(embedding[0]))}
  if tasks.task_class(config).family == "encoder":  # sequence classification
    head = flat.get("head/kernel")
    return {"num_classes": int(head.shape[1]) if head is not None else 0}
  kernel = _only(flat, "embedding/kernel", workdir)
  if kernel is None or len(kernel) != 4:
    raise LoadError(
      f"the checkpoint in {workdir} has no patch embedding; it is not the ViT of its config.json"
    )
  patch, channels = int(kernel[0]), int(kernel[2])
  if issubclass(tasks.task_class(config), tasks.DINOTask):
    size = int(config.data.multicrop.global_size)
    return {"num_classes": 0, "image_shape": (size, size, channels)}
  head = flat.get("head/kernel")
  pos = flat.get("pos_embedding")
  side = math.isqrt(int(pos.shape[1])) if pos is not None else 0
  if pos is not None and side * side == int(pos.shape[1]):
    size = side * patch
  else:
    size = int(config.data.image_size or patch)
  return {
    "num_classes": int(head.shape[1]) if head is not None else 0,
    "image_shape": (size, size, channels),
  }


def abstract_weights(task) -> dict:
  """``{"step", "params", "task_state"}`` of ``task`` as ``jax.ShapeDtypeStruct`` leaves."""

  def init():
    params = sharding.unbox(task.init(jax.random.PRNGKey(0)))
    return {
      "step": jnp.zeros((), jnp.int32),
      "params": params,
      "task_state": task.init_task_state(params),
    }

  return jax.eval_shape(init)


def _checkpointer(workdir: str, schedule: run_lib.Schedule) -> ckpt_lib.Checkpointer:
  """A read-only :class:`~laplax.workdir.checkpoint.Checkpointer` of ``workdir``
  (``checkpoint_verify`` of the run's schedule section)."""
  return ckpt_lib.Checkpointer(
    os.path.join(workdir, CHECKPOINT_DIR), verify=schedule.checkpoint_verify, read_only=True
  )


def _read(checkpointer: ckpt_lib.Checkpointer, target, step: int | None, partial: bool):
  """``checkpointer.restore(target, step, with_data=False, partial=partial)``.

  Raises:
    LoadError: the checkpoint(s) cannot be read.
  """
  try:
    return checkpointer.restore(target, step=step, with_data=False, partial=partial)
  except ckpt_lib.CheckpointError as e:
    if step is None:
      raise LoadError(str(e)) from None
    reason = re.search(r"failed: ([^)]*)\)", str(e))
    raise LoadError(
      f"checkpoint step {step} in {checkpointer.directory} is "
      f"unreadable ({reason.group(1) if reason else 'unknown'}); "
      f"load another step"
    ) from None


def first_difference(saved: Any, expected: Any) -> str | None:
  """``"NAME: saved SHAPE, the config's model SHAPE"`` of the first parameter that differs.

  Between two trees of ``jax.ShapeDtypeStruct`` leaves; ``None`` when names and
  shapes agree (dtypes are not compared).
  """

  def flat(tree):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
      jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
      for path, leaf in leaves
      if hasattr(leaf, "shape")
    }

  a, b = flat(saved), flat(expected)
  for name in sorted(set(a) | set(b)):
    if a.get(name) != b.get(name):
      show = lambda shape: "none" if shape is None else str(shape)
      return f"{name}: saved {show(a.get(name))}, the config's model {show(b.get(name))}"
  return None


def load(workdir: str, step: int | None = None, run: run_lib.RunSpec | None = None) -> Loaded:
  """Restores a laplax run (a ``train.py`` or ``laplax.convert`` workdir) onto one device.

  Builds the model at the saved parameters' sizes (:func:`checkpoint_sizes`) and
  restores the parameters and task state of ``step``, checked against its checksums
  first (``checkpoint_verify``), whatever mesh it was saved on, onto
  ``jax.local_devices()[0]``. With ``step=None`` and an unreadable newest checkpoint,
  the newest readable one is used with a logged warning.

  ``run``: the run spec of ``workdir/config.json`` checked already (``eval.py``
  checks it with its ``--config.eval*`` overrides before anything is read:
  :func:`laplax.cli.eval.apply_overrides`); ``None``: this checks the saved
  config (:func:`laplax.tasks.validate`, :func:`laplax.evaluators.registry.validate`).

  Returns:
    A :class:`Loaded`.

  Raises:
    LoadError: ``workdir`` missing, no laplax ``config.json``, no checkpoint, ``step``
      not saved (the saved steps listed), no readable checkpoint, or parameters that
      are not the config's model (:func:`first_difference`).
    ConfigError, SpecError: the saved config does not validate.
  """
  config = saved_config(workdir) if run is None else run.config
  steps = saved_steps(workdir)
  if not steps:
    raise LoadError(f"{workdir} has no checkpoint; train first with train.py --workdir {workdir}")
  if step is not None and int(step) not in steps:
    raise LoadError(
      f"step {step} is not saved in {workdir}; saved steps: {', '.join(map(str, steps))}"
    )
  if run is None:
    run = tasks.validate(config, None, strict_keys=False)
    registry.validate(config)
  config.lock()
  built = {}

  def target(state_dir: str) -> dict:  # the model at the sizes this step holds
    saved = ckpt_lib.saved_shapes(state_dir)
    built["task"] = run.task.from_shapes(
      config, spec=run.model, **checkpoint_sizes(config, saved["params"], workdir)
    )
    weights = abstract_weights(built["task"])
    built["difference"] = first_difference(saved["params"], weights["params"])
    return weights

  try:
    state, _ = _read(
      _checkpointer(workdir, run.schedule),
      target,
      None if step is None else int(step),
      partial=True,
    )
  except LoadError:
    if built.get("difference"):  # the checkpoints are fine; config.json is not theirs
      raise LoadError(
        f"the checkpoint in {workdir} is not the model of its config.json "
        f"({built['difference']}); config.json was changed after the run "
        f"saved it, or the checkpoints are another run's: put back the "
        f"run's own config.json"
      ) from None
    raise
  state = jax.device_put(state, jax.local_devices()[0])
  task_state = state.get("task_state")
  teacher = task_state.get("teacher") if isinstance(task_state, dict) else None
  restored = int(state["step"])
  return Loaded(
    model=built["task"].model,
    params=state["params"],
    config=config,
    step=restored,
    latest_step=max(steps[-1], restored),
    teacher=teacher,
    task_state=task_state,
    workdir=workdir,
    shapes_task=built["task"],
    run_spec=run,
  )
