"""Tasks: what the one training loop needs to know about a model and its loss.

A task builds its model from the run's model spec
(:class:`laplax.config.run.RunSpec`, built once by :func:`validate`), says
what a batch looks like, and
gives the training loss and the evaluation. Every task follows the
:class:`~laplax.tasks.base.Task` protocol, so the loop calls the same
methods of every task. Adding a task is one class here and one entry in
:data:`TASKS`, the one task registry.
"""

from __future__ import annotations

import ml_collections

from laplax.config import run as run_lib
from laplax.config import validation as config_lib
from laplax.tasks.base import Task, with_debug_faults
from laplax.tasks.classification import ClassificationTask
from laplax.tasks.dino import DINOTask
from laplax.tasks.glue import GLUETask
from laplax.tasks.language_model import LanguageModelTask
from laplax.tasks.mlm import MaskedLMTask
from laplax.tasks.sequence_classification import SequenceClassificationTask

#: ``config.task`` -> the task class that builds its model, loss and evaluation.
TASKS = {
  "classification": ClassificationTask,
  "lm": LanguageModelTask,
  "dino": DINOTask,
  "sequence_classification": SequenceClassificationTask,
  "mlm": MaskedLMTask,
  "glue": GLUETask,
}


def make_task(run: run_lib.RunSpec, workdir: str | None) -> Task:
  """Prepares the data of the checked run ``run`` (:func:`validate`'s) and
  returns its task object, built on the run's model spec (wrapped by
  :func:`~laplax.tasks.base.with_debug_faults` for ``config.debug.nan_at_step``
  and ``config.debug.stall_at_step``).

  Raises:
    DataError, ConfigError: one-line user errors.
  """
  task = run.task.from_data(run.config, workdir, spec=run.model)
  return with_debug_faults(task, run.config.debug)


def task_class(config: ml_collections.ConfigDict) -> type | None:
  """The class of ``config.task`` in :data:`TASKS` (``None`` for a name it
  lacks). Code outside this package asks the class (``issubclass(...,
  LanguageModelTask)``, its attributes and methods), never the name."""
  return TASKS.get(config.get("task"))  # .get: asked of broken saved configs too


def is_language_model(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config``'s task is :class:`LanguageModelTask` or a subclass."""
  cls = task_class(config)
  return cls is not None and issubclass(cls, LanguageModelTask)


def task_names() -> tuple[str, ...]:
  """The names of the tasks of the one registry, :data:`TASKS`."""
  return tuple(TASKS)


def validate(
  config: ml_collections.ConfigDict,
  num_devices: int | None = None,
  strict_keys: bool = True,
  *,
  num_processes: int | None = None,
  platform: str | None = None,
) -> run_lib.RunSpec:
  """Checks every key the trainer reads and returns the run spec:
  ``config.task`` names a task of :data:`TASKS`, then
  :func:`laplax.config.run.build` with that task's class (its own sections,
  keys and token counts).

  With ``num_devices`` the mesh is checked against the devices; with
  ``strict_keys`` (training; ``eval.py`` reads saved configs) a key that no
  config of the task has is an error. ``num_processes`` and ``platform``
  stand for this machine's (``python -m laplax.plan`` checks a config for
  another).

  Raises:
    ConfigError: the first problem found, as one line naming the key and the fix.
  """
  config_lib.require_keys(config)
  config_lib.require(
    config.task in TASKS,
    f"config.task={config.task!r} is unknown; use one of {', '.join(task_names())}",
  )
  return run_lib.build(
    config,
    num_devices,
    strict_keys,
    task_class=TASKS[config.task],
    num_processes=num_processes,
    platform=platform,
  )
