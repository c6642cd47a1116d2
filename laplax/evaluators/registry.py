"""Evaluators chosen by name: ``config.evals``.

A run's evaluations are the comma-separated names in ``config.evals`` (as
big_vision's ``config.evals`` names its evaluators), their settings the
config's ``eval`` section. The training loop runs those whose
:attr:`~laplax.evaluators.base.Evaluator.stages` hold ``"train"`` at every
``eval_every`` steps and at the last step (their numbers are the ``eval``
records of ``metrics.jsonl``); ``eval.py`` runs those that hold ``"eval"``
and writes their numbers into ``eval.json``. Both build the list with
:func:`build`, so the two cannot drift apart.

The registry is the subclasses of :class:`~laplax.evaluators.base.Evaluator`
that have a ``name``: those of every module of :mod:`laplax.evaluators`
and of the projects' ``evaluators`` modules (:func:`laplax.projects.discover`;
nanochat's chat benchmarks and CORE), imported here, and of any module
imported before (a user's, a test's). Each
declares the tasks it evaluates, its settings with their defaults and their
checks, so a task's list of evaluators, the ``eval`` section of its config
and the checks of both are derived from them (:func:`accepted`,
:func:`complete`, :func:`validate`). Adding an evaluator is one module and
its name in a config's ``evals`` (``docs/evaluation.md``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import ml_collections

import laplax.evaluators
from laplax import projects
from laplax.config import validation as config_lib
from laplax.evaluators.base import EVAL, TRAIN, Context, Evaluator  # the registry's API
from laplax.tasks.base import Task

__all__ = [
  "EVAL",
  "TRAIN",
  "Context",
  "Evaluator",
  "registered",
  "get",
  "accepted",
  "eval_defaults",
  "complete",
  "names",
  "validate",
  "build",
  "run",
]

# The projects' evaluators first (laplax.projects), then this package's: the
# order in which the classes are defined is the order of accepted().
projects.discover("evaluators")
for _module in pkgutil.iter_modules(laplax.evaluators.__path__):
  importlib.import_module(f"laplax.evaluators.{_module.name}")


def _subclasses(cls: type) -> list[type]:
  """Every subclass of ``cls``, depth first, in definition order."""
  out = []
  for sub in cls.__subclasses__():
    out += [sub] + _subclasses(sub)
  return out


def registered() -> dict[str, type[Evaluator]]:
  """Name -> class of every evaluator defined so far (a subclass of
  :class:`Evaluator` with its own ``name``).

  Raises:
    ValueError: two classes with one name (a programming error).
  """
  out = {}
  for cls in _subclasses(Evaluator):
    if "name" not in vars(cls):
      continue
    if cls.name in out and out[cls.name] is not cls:
      raise ValueError(
        f"two evaluators named {cls.name!r}: {out[cls.name].__module__}."
        f"{out[cls.name].__qualname__} and {cls.__module__}.{cls.__qualname__}"
      )
    out[cls.name] = cls
  return out


def get(name: str) -> type[Evaluator]:
  """The evaluator class called ``name``.

  Raises:
    KeyError: no evaluator has that name.
  """
  return registered()[name]


def accepted(task: str) -> tuple[str, ...]:
  """The names ``config.evals`` may list for task ``task`` (those whose
  ``tasks`` hold it), in definition order."""
  return tuple(n for n, cls in registered().items() if task in cls.tasks)


def eval_defaults(task: str) -> dict[str, Any]:
  """The ``eval`` section of a ``task`` config: the settings of every
  evaluator of :func:`accepted` with their defaults.

  Raises:
    ValueError: two evaluators give one key different defaults (a programming error).
  """
  out, owner = {}, {}
  for name in accepted(task):
    for key, value in get(name).defaults.items():
      if key in out and out[key] != value:
        raise ValueError(
          f"evaluators {owner[key]!r} and {name!r} give eval.{key} the "
          f"defaults {out[key]!r} and {value!r}"
        )
      out.setdefault(key, value)
      owner.setdefault(key, name)
  return out


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds to ``config.eval`` (created if missing and needed) the settings of
  :func:`eval_defaults` it lacks, in place (a locked config too); the values
  it has stay. Returns ``config``; one without a known string ``task`` is
  returned as it is, for validation to report."""
  task = config.get("task")
  if not isinstance(task, str):
    return config
  wanted = eval_defaults(task)
  if not wanted:
    return config
  with config.unlocked():
    if "eval" not in config:
      config.eval = ml_collections.ConfigDict()
    for key, value in wanted.items():
      if key not in config.eval:
        config.eval[key] = value
  return config


def names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The evaluator names of ``config.evals`` in order (empty names dropped);
  a run saved before the key existed has it from
  :func:`laplax.tasks.schema.complete`
  (:meth:`laplax.tasks.base.TaskBase.saved_evals`)."""
  return config_lib.split_evals(config.evals)


def check_names(evals: Any, task: str) -> tuple[str, ...]:
  """The names of ``evals`` (``config.evals``, or ``Loaded.evaluate``'s
  argument) checked for task ``task``: at least one, each of
  :func:`accepted`, none twice.

  Raises:
    ConfigError: the first problem, naming the evaluators ``task`` has.
  """
  return config_lib.check_evals(evals, accepted(task), task)


def validate(config: ml_collections.ConfigDict) -> None:
  """Completes ``config.eval`` (:func:`complete`), then checks the names of
  ``config.evals`` against the task (:func:`check_names`), that every
  ``eval`` key is a setting of one of the task's evaluators, and the
  settings of every evaluator it names (their ``validate``).

  Raises:
    ConfigError: the first bad name or key, with its fix (a key that
      ``config.evals`` replaced names its replacement).
    DataError: an evaluator that cannot evaluate this run (a chat benchmark
      of a run without nanochat's tokenizer).
  """
  complete(config)
  chosen = check_names(config.evals, config.task)
  known = eval_defaults(config.task)
  for key in config.eval.keys() if "eval" in config else ():
    replaced = config_lib.REPLACED_KEYS.get(f"eval.{key}")
    config_lib.require(
      replaced is None, f"config.eval.{key} was replaced by config.evals; {replaced}"
    )
    config_lib.require(
      key in known,
      f"config.eval.{key} is not a setting of an evaluator "
      f"of a {config.task} run; its settings: "
      f"{', '.join(sorted(known)) or 'none'}",
    )
  for name in chosen:
    get(name).validate(config)


def build(
  task: Task, stage: str, evals: tuple[str, ...] | None = None, **extra: Evaluator
) -> list[Evaluator]:
  """The evaluators named by ``evals`` (the run spec's evaluation section,
  ``run.evaluation.evals``; ``None``: those of ``task.config.evals``) that
  run at ``stage`` (:data:`TRAIN` or :data:`EVAL`), in that order, then
  ``extra``'s (``eval.py --choices``' ``multiple_choice``). ``prepare`` is
  called on each (data read and checked before anything is computed).

  Raises:
    DataError, ConfigError: an evaluator's data cannot be used.
  """
  evals = names(task.config) if evals is None else evals
  out = [get(n)(task) for n in evals if get(n).runs_at(stage, task.config)]
  out += [e for e in extra.values() if e is not None]
  for evaluator in out:
    evaluator.prepare()
  return out


def run(evaluators: list[Evaluator], state: Any, ctx: Context) -> tuple[dict, dict[str, str]]:
  """Runs ``evaluators`` on ``state`` in order: their numbers merged into one
  summary (later keys win: the DINO evaluators all report the same
  ``num_examples``, each chat benchmark the ChatCORE so far) and their
  texts. Figures go to ``ctx.figures``."""
  summary, texts = {}, {}
  ctx.tokens = max([ctx.tokens] + [e.tokens_wanted(ctx) for e in evaluators])
  for evaluator in evaluators:
    summary.update(evaluator.run(state, ctx))
    texts.update(evaluator.texts(state))
  return summary, texts
