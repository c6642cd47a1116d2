"""Checkpoints: an orbax CheckpointManager holding the whole state of a run.

Each step directory holds two items: ``state`` (step, parameters, optimizer
state, RNG key, task state such as DINO's teacher; :class:`TrainState`) and ``data`` (the grain iterator state as
JSON), so a resumed run continues exactly where the saved one stood. Orbax
writes each step into a temporary directory and renames it when complete, so
a killed save never replaces the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from typing import Any

import flax
import jax
import orbax.checkpoint as ocp


# Orbax writes step N into "N.orbax-checkpoint-tmp..." and renames it when complete.
_INCOMPLETE = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


@contextlib.contextmanager
def _orbax_errors_silenced():
  """Orbax logs unreadable metadata at ERROR level; :class:`Checkpointer`
  reports those steps itself, once, in one line."""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    absl_logger.setLevel(level)


class CheckpointError(ValueError):
  """No checkpoint of a run can be read; the message is one line."""


@flax.struct.dataclass
class TrainState:
  """Everything that decides the rest of a run, besides the data position.

  Attributes:
    step: int32 scalar, number of updates applied.
    params: float32 parameter pytree.
    opt_state: optax state pytree.
    rng: uint32 ``[2]`` raw key; step ``t`` uses ``fold_in(rng, t)``.
    task_state: what a task keeps besides the trained parameters, updated by
      the task after each step (DINO: the teacher parameters and the centre);
      ``None`` for tasks without one.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  task_state: Any = None


class Checkpointer:
  """Saves and restores :class:`TrainState` plus the data iterator state.

  Args:
    directory: where step directories live (created if missing).
    max_to_keep: how many recent checkpoints to keep.
  """

  def __init__(self, directory: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(directory)
    with _orbax_errors_silenced():
      self.manager = ocp.CheckpointManager(
          self.directory,
          options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
          item_names=("state", "data"))

  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints, ascending."""
    with _orbax_errors_silenced():
      return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest complete step, or ``None``."""
    with _orbax_errors_silenced():
      return self.manager.latest_step()

  def incomplete_steps(self) -> dict[int, str]:
    """Steps whose write was interrupted (left in orbax's temporary
    directories), as ``{step: path}``; they are never restored."""
    if not os.path.isdir(self.directory):
      return {}
    found = {}
    for name in os.listdir(self.directory):
      m = _INCOMPLETE.match(name)
      if m:
        found[int(m.group(1))] = os.path.join(self.directory, name)
    return found

  def warn_incomplete(self, delete: bool) -> None:
    """Warns about each :meth:`incomplete_steps` entry; ``delete`` removes
    them (process 0), as the trainer does before it writes again."""
    for bad, path in sorted(self.incomplete_steps().items()):
      logging.warning("checkpoint step %d in %s is incomplete (its write was "
                      "interrupted); it is ignored", bad, self.directory)
      if delete and jax.process_index() == 0:
        shutil.rmtree(path, ignore_errors=True)

  def save(self, state: TrainState, data_state: dict | None) -> bool:
    """Starts an asynchronous save of ``state`` at ``state.step``.

    Returns whether a save was started (orbax skips a step already saved).
    """
    step = int(jax.device_get(state.step))
    if step in self.manager.all_steps():
      return False
    return self.manager.save(
        step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state or {})))

  def restore(self, abstract_state: TrainState, step: int | None = None,
              with_data: bool = True, discard_unreadable: bool = False):
    """Restores ``(state, data_state)`` at ``step`` (default: the newest usable).

    ``abstract_state`` gives the tree, shapes, dtypes and shardings
    (``jax.ShapeDtypeStruct`` leaves): a checkpoint saved on any mesh is
    restored onto these shardings, and leaves without one onto this process's
    first device (``eval.py``). When the newest checkpoint cannot be
    read it is skipped with a warning naming it and the previous one is used;
    a step whose write was interrupted (:meth:`incomplete_steps`) is named in
    a warning too. With ``discard_unreadable`` (the trainer) the unreadable
    and incomplete newer steps are deleted so that the resumed run can save
    those steps again.

    Raises:
      CheckpointError: there is no readable checkpoint.
    """
    steps = [step] if step is not None else self.all_steps()[::-1]
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_state = jax.tree_util.tree_map(
        lambda x: x if getattr(x, "sharding", None) is not None else
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_state)
    unreadable = []
    for s in steps:
      items = {"state": ocp.args.StandardRestore(abstract_state)}
      if with_data:
        items["data"] = ocp.args.JsonRestore()
      try:
        with _orbax_errors_silenced():
          restored = self.manager.restore(s, args=ocp.args.Composite(**items))
      except Exception as e:  # pylint: disable=broad-except
        unreadable.append((s, type(e).__name__))
        continue
      # Warnings only once a usable step is found (else the error says it all).
      self.warn_incomplete(delete=discard_unreadable)
      for bad, reason in unreadable:
        logging.warning("checkpoint step %d in %s is unreadable (%s); using step %d",
                        bad, self.directory, reason, s)
        if discard_unreadable:
          self.manager.delete(bad)
      return restored["state"], (restored["data"] if with_data else None)
    raise CheckpointError(
        f"no readable checkpoint in {self.directory} (steps "
        f"{', '.join(str(b) for b, _ in unreadable)} failed: {unreadable[0][1]}); "
        f"move the directory away to start again")

  def restore_params(self) -> tuple[int, Any]:
    """``(step, params)`` of the newest readable checkpoint: the parameter
    tree as saved (NumPy leaves on the host), without a target tree, so the
    run that saved it may have another task or config (fine-tuning).

    Raises:
      CheckpointError: there is no readable checkpoint.
    """
    steps = self.all_steps()[::-1]
    for s in steps:
      try:
        with _orbax_errors_silenced():
          restored = self.manager.restore(
              s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
      except Exception:  # pylint: disable=broad-except
        logging.warning("checkpoint step %d in %s is unreadable; trying the previous one",
                        s, self.directory)
        continue
      return s, jax.device_get(restored["state"]["params"])
    raise CheckpointError(f"no readable checkpoint in {self.directory}")

  def wait(self) -> None:
    """Blocks until every started save is committed."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self.manager.wait_until_finished()
    self.manager.close()
