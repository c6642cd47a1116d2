"""The task protocol: what the one training loop asks of every task.

:class:`Task` is the protocol (one ``loss`` signature, one return shape);
:class:`TaskBase` gives the defaults of a task without state; the tasks
themselves are in :mod:`laplax.tasks`. :class:`NaNAtStep` wraps a task
to inject a non-finite loss and :class:`StallAtStep` a step that never ends,
so the faults used to test the trainer's guards are not branches of the
production train step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from laplax import utils
from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.data.errors import DataError
from laplax.models import spec as spec_lib


class Task(Protocol):
  """What the training loop, ``eval.py`` and the analysis use of a task.

  Attributes:
    config: the run's config.
    family: the model family its ``config.model.name`` must be (``"vit"``,
      ``"gpt"``; :mod:`laplax.models.registry`).
    base_config: a function returning the task's base config, which holds
      every key the trainer reads (:mod:`laplax.config.defaults`).
    batch_axis: the examples' axis in every batch field (DINO's views
      ``[V, B, ...]``: 1).
    model: the trained network (``model.apply({"params": params}, ...)``).

  The evaluators that ``config.evals`` may name for a task declare it
  themselves (:func:`laplax.evaluators.registry.accepted`).
  """

  config: ml_collections.ConfigDict
  family: str
  base_config: Any
  batch_axis: int
  model: nn.Module

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters (float32 pytree) from ``rng``."""

  def init_task_state(self, params: Any) -> Any:
    """State the task carries beside the parameters (``None`` if none)."""

  def loss(
    self, params: Any, batch: dict, rng: jax.Array, task_state: Any, step: jax.Array
  ) -> tuple[jax.Array, tuple[dict, Any]]:
    """``(loss float32 scalar, (metrics dict of float32 scalars, aux))``.

    ``aux`` goes to :meth:`update_task_state` (``None`` if unused).
    """

  def mask_updates(self, updates: Any, step: jax.Array) -> Any:
    """The optimizer updates, with those of frozen parameters zeroed."""

  def update_task_state(self, task_state: Any, params: Any, aux: Any, step: jax.Array) -> Any:
    """The task state after the parameters were updated to ``params``."""

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite training batches (a grain IterDataset)."""

  def eval_batches(self) -> Iterator[dict]:
    """Every example of the eval split once (with a ``mask``)."""

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""

  def monitor(self, record: dict) -> str | None:
    """A warning line for a logged training record, or ``None``."""

  def backbone(self, state: Any) -> tuple[nn.Module, Any]:
    """``(network, params)`` whose token geometry the analysis measures."""

  def readout(self, state: Any) -> np.ndarray | None:
    """The matrix ``[classes, width]`` that reads the backbone's features
    (a classifier or an unembedding), or ``None``."""


def model_spec(
  config: ml_collections.ConfigDict, spec: spec_lib.TransformerSpec | None = None
) -> spec_lib.TransformerSpec:
  """A task's model spec: ``spec``, the run's (:attr:`laplax.config.run.RunSpec.model`,
  which ``train.py`` and ``eval.py`` build once and pass down), or for a task
  built from a config alone (``python -m laplax.plan``, tests, benchmarks)
  :func:`laplax.models.spec.from_config` of ``config.model``.

  Raises:
    SpecError: ``config.model`` is not a valid model (``spec`` not given).
  """
  return spec_lib.from_config(config.model) if spec is None else spec


class TaskBase:
  """The defaults of a :class:`Task` without state, frozen parameters or monitor.

  Its :meth:`evaluate` sums the subclass's ``eval_sums(params, batch)`` over
  every eval batch (jitted once per task) and summarises them with
  ``summarize(sums)`` (the ``classification`` and ``bits_per_byte``
  evaluators of :mod:`laplax.evaluators.eval_sums` run it).
  """

  batch_axis = 0
  family: str
  #: Why ``eval.py --analysis`` cannot take gradients of the training loss on
  #: eval batches (``None``: it can).
  analysis_loss_unavailable: str | None = None
  config: ml_collections.ConfigDict
  #: The model spec the task's model is built from (:func:`model_spec`).
  spec: spec_lib.TransformerSpec
  model: nn.Module

  @staticmethod
  def base_config() -> ml_collections.ConfigDict:
    """Every key of the task's config with its default (overridden by each task)."""
    raise NotImplementedError

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Checks the config sections only this task has (the others are
    :func:`laplax.config.run.build`'s); none here.

    Raises:
      ConfigError: the first problem, as one line with its fix.
    """
    del config

  @classmethod
  def data_defaults(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The ``data`` section's keys, with their defaults, of the pipeline that
    reads ``config.data.name`` (the table beside the dataset code that
    :func:`laplax.tasks.schema.complete` fills a config from); here the base
    config's."""
    del config
    return cls.base_config().data

  @classmethod
  def upgrade_saved(cls, config: ml_collections.ConfigDict) -> None:
    """Rewrites, in place, keys that an older laplax named or shaped
    otherwise (a renamed or replaced key), before
    :func:`laplax.tasks.schema.complete` fills the missing ones with their
    defaults; ``config`` is unlocked and has ``task``, ``model`` and ``data``.
    Here ``evals``: a run saved before it existed gets :meth:`saved_evals`."""
    if "evals" not in config:
      config.evals = cls.saved_evals(config)

  @classmethod
  def known_keys(cls, config: ml_collections.ConfigDict) -> set[str]:
    """The dotted keys a config of this task may have: those of
    :meth:`base_config` (with empty sections; its model section that of
    ``config.model.name`` when the task trains several families), of :meth:`data_defaults`
    (the pipeline of ``config.data.name``) and the ``eval`` keys ``config``
    has (the settings of the evaluators, which
    :func:`laplax.evaluators.registry.validate` checks)."""
    known = utils.flatten_dotted(cls.base_config().to_dict(), keep_empty=True)
    model_section = config.get("model")
    family = model_section.get("name") if hasattr(model_section, "get") else None
    if family in getattr(cls, "families", ()) and family != cls.family:  # e.g. a Swin
      known = {k: v for k, v in known.items() if not k.startswith("model.")}
      model = defaults.model_config(family).to_dict()
      known.update(utils.flatten_dotted({"model": model}, keep_empty=True))
    if isinstance(config.get("eval"), ml_collections.ConfigDict):
      known.update({f"eval.{k}": None for k in config.eval.keys()})
    known.update(
      utils.flatten_dotted({"data": cls.data_defaults(config).to_dict()}, keep_empty=True)
    )
    return known

  @classmethod
  def from_shapes(
    cls,
    config: ml_collections.ConfigDict,
    *,
    image_shape: tuple[int, int, int] | None = None,
    num_classes: int | None = None,
    vocab_size: int | None = None,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    """The task built from sizes alone, with no dataset opened (the converters
    and ``bench/`` build their tasks this way; :meth:`from_data` prepares the
    data first). Image tasks need ``image_shape`` ``(H, W, C)`` and
    ``num_classes``; a language model ``vocab_size`` (default: 256 for the
    byte tokenizer, else ``config.data.vocab_size``). ``spec``: the run's
    model spec (:attr:`laplax.config.run.RunSpec.model`; ``None``: built from
    ``config.model``, :func:`model_spec`). Here the image tasks'
    ``cls(config, num_classes, image_shape, spec=spec)``."""
    del vocab_size
    return cls(config, num_classes, image_shape, spec=spec)

  def tokens_per_example(self) -> int:
    """Tokens the trained network sees per example (the model's input)."""
    raise NotImplementedError

  def data_limits(self) -> list[tuple]:
    """What the config asks of the data against what the data has:
    ``(what, available, unit, split, key, requested)`` rows that
    :func:`laplax.train.fit.check_data` compares (a key asking for more
    than is available is refused); none here."""
    return []

  @classmethod
  def saved_evals(cls, config: ml_collections.ConfigDict) -> str:
    """``config.evals`` for a run saved before the key existed: the
    evaluations it ran then, here those of :meth:`base_config`."""
    del config
    return cls.base_config().evals

  @classmethod
  def attention_lengths(
    cls, config: ml_collections.ConfigDict, image_side: int | None = None
  ) -> tuple[int, ...]:
    """Token counts the model's self-attention sees
    (:func:`laplax.config.validation.attention_lengths`)."""
    return config_lib.attention_lengths(config, image_side)

  def init_task_state(self, params: Any) -> Any:
    """No task state."""
    del params

  def mask_updates(self, updates: Any, step: jax.Array) -> Any:
    """Nothing frozen."""
    del step
    return updates

  def update_task_state(self, task_state: Any, params: Any, aux: Any, step: jax.Array) -> Any:
    """No task state to update."""
    del params, aux, step
    return task_state

  def monitor(self, record: dict) -> str | None:
    """Nothing to warn about."""
    del record

  def backbone(self, state: Any) -> tuple[nn.Module, Any]:
    """The trained model and its parameters."""
    return self.model, state.params

  def readout(self, state: Any) -> np.ndarray | None:
    """No readout."""
    del state

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Sums over the real examples of an eval batch (float32 scalars)."""
    raise NotImplementedError

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> the summary."""
    raise NotImplementedError

  @functools.cached_property
  def _eval_step(self):
    return jax.jit(self.eval_sums)  # compiled once per task

  def evaluate(self, state: Any, place=None) -> dict:
    """Sums :meth:`eval_sums` over every eval batch and summarises them.

    ``place`` maps each eval batch to device arrays (the trainer's
    :func:`laplax.sharding.whole_batch`); by default the batches go as they are.
    """
    sums = None
    for batch in self.eval_batches():
      if place is not None:
        batch = place(batch)
      out = jax.device_get(self._eval_step(state.params, batch))
      sums = out if sums is None else {k: sums[k] + np.float64(out[k]) for k in sums}
    return self.summarize(sums)


def counted(sums: dict | None, key: str = "count", what: str = "example") -> float:
  """``sums[key]``, the number of counted eval targets, when it is positive.

  Raises:
    DataError: the evaluation counted nothing (no eval batch, or every
      target masked out, e.g. SFT conversations cut before their assistant
      tokens): one line, instead of a division by zero.
  """
  count = 0.0 if sums is None else float(sums[key])
  if not count > 0:
    raise DataError(
      f"The evaluation counted no {what} (every eval {what} is masked out or the eval "
      f"split is empty), so it has no mean; check config.data.eval_split and the limits "
      f"that cut the eval data (e.g. config.data.max_conversation_tokens)."
    )
  return count


class NaNAtStep:
  """A task whose loss (and so gradient) is NaN at one step: a fault to test
  the trainer's non-finite guard (``config.debug.nan_at_step``).

  Wraps any :class:`Task`; ``loss`` multiplies the wrapped loss and its
  logged value by NaN when the state's step is ``step - 1`` (the step that
  makes ``step``) and by 1 otherwise; everything else is the wrapped task's.
  """

  def __init__(self, task: Task, step: int):
    self._task, self._step = task, int(step)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._task, name)

  def loss(self, params, batch, rng, task_state, step):
    """The wrapped loss, poisoned at the chosen step."""
    loss, (metrics, aux) = self._task.loss(params, batch, rng, task_state, step)
    poison = jnp.where(step + 1 == self._step, jnp.nan, 1.0)
    return loss * poison, (dict(metrics, loss=metrics["loss"] * poison), aux)


def _stall(step):
  """Host side of :class:`StallAtStep`: waits until the process ends."""
  del step
  while True:
    time.sleep(1.0)


class StallAtStep(NaNAtStep):
  """A task whose step ``step`` never finishes: its loss waits inside the
  compiled step (a ``jax.pure_callback`` to the host that sleeps until the
  process ends), as a step on a batch too large for the machine would keep
  XLA busy. A fault to test that signals still stop the run
  (``config.debug.stall_at_step``; :mod:`laplax.signals`). The values
  of every other step are the wrapped task's (0.0 is added to the loss and
  its logged value, outside the gradient).
  """

  def loss(self, params, batch, rng, task_state, step):
    """The wrapped loss; at the chosen step it waits for the host forever."""
    loss, (metrics, aux) = self._task.loss(params, batch, rng, task_state, step)
    out = jax.ShapeDtypeStruct((), jnp.float32)
    waited = jax.lax.cond(
      step + 1 == self._step,
      lambda s: jax.pure_callback(_stall, out, s),
      lambda s: jnp.zeros((), jnp.float32),
      step,
    )
    waited = jax.lax.stop_gradient(waited).astype(loss.dtype)
    return loss + waited, (dict(metrics, loss=metrics["loss"] + waited), aux)


def with_debug_faults(task: Task, debug) -> Task:
  """``task`` wrapped by :class:`NaNAtStep` (``debug.nan_at_step``) and
  :class:`StallAtStep` (``debug.stall_at_step``) when they are set."""
  if debug.nan_at_step is not None:
    task = NaNAtStep(task, debug.nan_at_step)
  if debug.stall_at_step is not None:
    task = StallAtStep(task, debug.stall_at_step)
  return task
