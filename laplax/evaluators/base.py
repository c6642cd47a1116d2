"""What every evaluator is: :class:`Evaluator` and the :class:`Context` of a round.

An evaluator is a subclass of :class:`Evaluator` with a :attr:`~Evaluator.name`,
in any module of :mod:`laplax.evaluators` (:mod:`laplax.evaluators.registry`
imports them all and finds the subclasses, so no table lists them). It
declares where it runs (:attr:`~Evaluator.stages`), which tasks it evaluates
(:attr:`~Evaluator.tasks`, names of :data:`laplax.tasks.TASKS`), its settings
with their defaults (:attr:`~Evaluator.defaults`: keys of the config's
``eval`` section) and their checks (:meth:`~Evaluator.validate`), as
big_vision's evaluators take their settings as keyword arguments with
defaults. A config turns it on by naming it in ``config.evals``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import ml_collections

from laplax.tasks.base import Task

#: The stage of the training loop's evaluations.
TRAIN = "train"
#: The stage of ``eval.py``.
EVAL = "eval"


@dataclasses.dataclass
class Context:
  """What one evaluation round gives its evaluators.

  Attributes:
    place: maps a host batch to device arrays (the trainer's
      :func:`laplax.sharding.whole_batch`); ``None``: batches as they are.
    out_dir: the directory for figures (``eval.py``'s workdir or ``--out``'s
      directory); ``None`` (the training loop): no figures.
    say: prints a line for the user.
    mesh: a device mesh for evaluators that split batches over devices
      (``eval.py`` passes one over every device; ``None``: the default device).
    figures: paths of the figures written in this round (evaluators append).
    cache: values shared within one round (the DINO teacher's features, which
      ``knn``, ``linear_probe`` and ``patch_pca`` use; the chat scores that
      ChatCORE averages), by key.
    tokens: patch tokens of this many eval images are kept with the eval
      split's features (:func:`laplax.evaluators.registry.run` sets it:
      ``patch_pca``'s :meth:`Evaluator.tokens_wanted`), so one pass gives all
      of them.
    step: the training step of a round of the training loop; ``None`` in
      ``eval.py``.
  """

  place: Callable | None = None
  out_dir: str | None = None
  say: Callable[[str], Any] = print
  mesh: Any = None
  figures: list[str] = dataclasses.field(default_factory=list)
  cache: dict = dataclasses.field(default_factory=dict)
  tokens: int = 0
  step: int | None = None


class Evaluator:
  """One named evaluation of a task's :class:`~laplax.state.TrainState`.

  A subclass with a :attr:`name` is an evaluator of the registry (one without
  is a base for others). It may read or check its data in :meth:`prepare`
  (called for every evaluator of a list before any of them computes, so bad
  data fails before anything is computed or written), and returns its numbers
  from :meth:`run` and its text from :meth:`texts`.

  Attributes:
    name: its name in ``config.evals`` and in error messages.
    stages: where it runs: :data:`TRAIN` (the training loop), :data:`EVAL`
      (``eval.py``).
    tasks: the ``config.task`` names it evaluates (empty: none may name it;
      ``multiple_choice`` is added by ``eval.py --choices`` only).
    defaults: its settings, ``config.eval.KEY`` -> default (bool, int, float
      or str); the registry adds the missing ones to a config before it is
      validated or saved (:func:`laplax.evaluators.registry.complete`).
      Evaluators that share a key declare the same default.
  """

  name: ClassVar[str]
  stages: ClassVar[tuple[str, ...]] = (TRAIN, EVAL)
  tasks: ClassVar[tuple[str, ...]] = ()
  defaults: ClassVar[dict[str, Any]] = {}

  def __init__(self, task: Task):
    self.task = task
    self.config = task.config

  @property
  def settings(self) -> dict[str, Any]:
    """Its :attr:`defaults` with the values ``config.eval`` gives them."""
    given = self.config.eval if "eval" in self.config else {}
    return {k: given[k] if k in given else v for k, v in self.defaults.items()}

  @classmethod
  def runs_at(cls, stage: str, config: ml_collections.ConfigDict) -> bool:
    """Whether it runs at ``stage`` for ``config``: ``stage`` in :attr:`stages`
    (an evaluator whose settings choose override this)."""
    del config
    return stage in cls.stages

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Checks its settings in ``config`` (a config of one of its
    :attr:`tasks`, its ``eval`` section completed); none here.

    Raises:
      ConfigError, DataError: the first bad key, with its fix.
    """

  def prepare(self) -> None:
    """Reads and checks what :meth:`run` needs (nothing here).

    Raises:
      DataError, ConfigError: the evaluator's data cannot be used.
    """

  def run(self, state: Any, ctx: Context) -> dict:
    """The evaluator's numbers (JSON scalars, or lists of them) for ``state``."""
    raise NotImplementedError

  def texts(self, state: Any) -> dict[str, str]:
    """Text the model generates, by name (none here)."""
    del state
    return {}

  def tokens_wanted(self, ctx: Context) -> int:
    """Eval images whose patch tokens this evaluator needs (none here)."""
    del ctx
    return 0
