"""The model families: one module each, found by name.

A family (``config.model.name``) is one module of :mod:`laplax.models` that
defines ``FAMILY``, a :class:`Family`: its spec class, its model and what the
rest of laplax needs to know of it (the token counts its attention sees, a
relative position bias, analytic FLOPs, an analysis hook). :func:`get` finds
it: the first look-up imports every module of the package and keeps the
``FAMILY`` of each (:func:`families`); a family defined elsewhere (a user's
module, a test's) joins with :func:`register`. No other module names a
family: the config, the tasks, the planner and the analysis ask here.

The pattern is Flax's and timm's model registries (``timm.models.register_model``),
read from the modules instead of from decorators, so adding a family is
adding its module (``docs/architecture.md``, "Adding a model family").
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family: what the rest of laplax reads of it.

  Attributes:
    name: ``config.model.name``.
    spec: its spec class (a :class:`~laplax.models.spec.TransformerSpec`),
      whose fields are the family's config keys and defaults.
    model: its Flax module, built ``model(spec, num_classes=...)`` by the
      task named ``task`` (``None``: the family's own task builds it).
    task: the task (``config.task``) that trains it as its classifier:
      ``"classification"`` makes it one of
      :class:`~laplax.tasks.classification.ClassificationTask`'s families.
    attention_lengths: ``(config, image_side, crop_sides) -> tuple[int, ...]``,
      the token counts its attention sees (``config.model`` and
      ``config.data.image_size``; ``image_side`` the data set's, ``None`` if
      unknown; ``crop_sides`` the extra views a task adds). ``None``: a
      ViT's patches (:func:`laplax.config.validation.attention_lengths`).
    relative_bias: its attention adds a bias to the logits (a relative
      position bias), which only the XLA kernel takes
      (:func:`laplax.kernels.describe`).
    image_patches: its patch embedding needs image sides that
      ``model.patch_size`` divides (the config check of ``data.image_size``).
    flops: ``(config, task, params, remat) -> (matmul parameters, FLOPs a
      step)``, its analytic count (:func:`laplax.plan.flops.analytic_flops`);
      ``None``: the plain transformer's.
    capture: ``(spec, layer) -> (module, reason)``: layer ``layer``'s
      attention as a standalone module for the analysis, and why the
      per-head Theorem 3.4 section does not apply (``None`` if it does);
      ``None``: :func:`laplax.models.layers.attention_module`.
  """

  name: str
  spec: type
  model: Any = None
  task: str | None = None
  attention_lengths: Callable | None = None
  relative_bias: bool = False
  image_patches: bool = False
  flops: Callable | None = None
  capture: Callable | None = None


_FAMILIES: dict[str, Family] = {}
_scanned: list[bool] = []


def register(family: Family) -> Family:
  """Adds ``family`` (or replaces the one of its name); returns it.

  A module of :mod:`laplax.models` needs no call (its ``FAMILY`` is read);
  a family in another module registers itself when that module is imported.

  Raises:
    TypeError: ``family`` is not a :class:`Family`.
  """
  if not isinstance(family, Family):
    raise TypeError(f"register() takes a Family, got {type(family).__name__}")
  _FAMILIES[family.name] = family
  return family


def _scan() -> None:
  """Imports every module of :mod:`laplax.models` once and registers its ``FAMILY``."""
  if _scanned:
    return
  _scanned.append(True)
  package = importlib.import_module("laplax.models")
  for info in pkgutil.iter_modules(package.__path__):
    module = importlib.import_module(f"{package.__name__}.{info.name}")
    family = getattr(module, "FAMILY", None)
    if isinstance(family, Family) and family.name not in _FAMILIES:
      _FAMILIES[family.name] = family


def families() -> dict[str, Family]:
  """``{name: Family}`` of every family: laplax's (modules in name order), then
  the registered ones."""
  _scan()
  return dict(_FAMILIES)


def find(name: str) -> Family | None:
  """The family named ``name``, or ``None``."""
  _scan()
  return _FAMILIES.get(name)


def get(name: str) -> Family:
  """The family named ``name``.

  Raises:
    KeyError: no family has that name.
  """
  family = find(name)
  if family is None:
    raise KeyError(name)
  return family


def of_spec(spec: Any) -> Family | None:
  """The family whose spec class ``spec`` is an instance of (the most
  derived one), or ``None``."""
  found = None
  for family in families().values():
    if isinstance(spec, family.spec) and (found is None or issubclass(family.spec, found.spec)):
      found = family
  return found


def trained_by(task: str) -> tuple[str, ...]:
  """The names of the families whose :attr:`Family.task` is ``task``."""
  return tuple(name for name, f in families().items() if f.task == task)


class TrainedBy:
  """A task class attribute: :func:`trained_by` of ``task``, read when asked
  (so a family registered later is among them).

  ``families = TrainedBy("classification")`` on the task class.
  """

  def __init__(self, task: str):
    self.task = task

  def __get__(self, obj, owner=None) -> tuple[str, ...]:
    return trained_by(self.task)
