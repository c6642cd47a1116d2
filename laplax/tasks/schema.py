"""The config schema: every key a run's config has, completed in one place.

A run's config is a ``ml_collections.ConfigDict`` in sections (``optim``,
``data``, ``model``, ...). Where each key's default lives:

* every section but ``data`` and ``model``: the task's base config
  (``TASKS[config.task].base_config()``, from :mod:`laplax.config.defaults`,
  whose comments give each key's meaning and unit);
* ``model``: the model spec's field defaults
  (:func:`laplax.config.defaults.model_config`, built from
  :func:`laplax.models.spec.config_defaults`; the spec's field metadata holds
  the types and ranges);
* ``data``: the table of the pipeline that reads ``data.name``, beside the
  dataset code (``TASKS[config.task].data_defaults(config)``: for images
  :func:`laplax.data.vision.images.default_config` and, for DINO,
  :func:`laplax.data.vision.multicrop.default_multicrop_config`; for text
  :func:`laplax.data.lm_input.default_config`, which picks FineWeb-Edu's,
  a chat mixture's or the text corpus's);
* :data:`OLD_RUN_VALUES`: the value of a key for a config that lacks it, where
  that differs from today's default (a run saved before the key existed keeps
  behaving as it did);
* ``eval``: the settings of the task's evaluators, declared by them and
  added by :func:`laplax.evaluators.registry.complete` (a floor above; the
  base configs hold at most an empty section). An old run's values there
  are the task's :meth:`~laplax.tasks.base.TaskBase.upgrade_saved` (a
  language model saved before its samples existed: ``eval.sample_tokens = 0``).

:func:`complete` gives a config every key of its task with these defaults. It
runs once on each path into the trainer: when a saved ``config.json`` is read
(:func:`laplax.workdir.files.load_saved_config`: resume, ``eval.py``,
:func:`laplax.loading.load`, ``init_from``, the converters) and when ``train.py``
builds the user's config (before validation). Code downstream reads every key
as an attribute (``config.keep_checkpoints``), never as
``config.get(key, default)``. The checks of the values are
:mod:`laplax.config.validation`'s.

This module sits in :mod:`laplax.config` beside the defaults and the checks it
completes configs for; it imports the task registry (:mod:`laplax.tasks`) to
find a config's base config and data table, and nothing in
:mod:`laplax.tasks` imports it.
"""

from __future__ import annotations

import copy
from typing import Any

import ml_collections
from ml_collections import config_dict

from laplax import tasks, utils
from laplax.config import defaults
from laplax.models import spec as spec_lib

#: Values of keys for a config that lacks them, where that value differs from
#: today's default: what the code read for a missing key before the schema,
#: so a run saved before the key existed keeps behaving as it did. Applied only
#: to keys the config's task has (its base config and data table).
OLD_RUN_VALUES = {
  # Runs saved before the exclusion list existed decayed every parameter.
  "optim.weight_decay_exclude": (),
  # A profile section without start_step traced from the first step.
  "profile.start_step": 1,
  # SFT runs saved before the SmolTalk cut existed used all of SmolTalk train.
  "data.smoltalk_stop": None,
  # LRA ListOps runs saved before the key existed dropped the brackets.
  "data.listops_closers": False,
  # LRA Image and Pathfinder runs saved before the key masked no pixel.
  "data.mask_zero_pixels": False,
  # WordPiece tokenizers trained before the key read text as BERT's normaliser.
  "data.wordpiece_normalizer": "bert",
  # Masked-LM runs saved before the key put [CLS] on each window's first token.
  "mlm.cls_first": True,
  # GLUE runs saved before the key fine-tuned without attention dropout.
  "glue.attention_dropout": 0.0,
}


def _field(node: ml_collections.ConfigDict, key: str) -> Any:
  """A copy of ``node[key]`` to insert into another config: a section as a
  ConfigDict, a ``None`` default as a placeholder of its declared type (so a
  later ``--config.KEY=`` override still type-checks), an ``object``-typed
  field (``model.num_laplacian_heads``) as such a reference."""
  value = node[key]
  if isinstance(value, ml_collections.ConfigDict):
    return copy.deepcopy(value)
  kind = node.get_ref(key).get_type()
  if value is None:
    return value if kind is type(None) else config_dict.placeholder(kind)
  if kind is object:
    return config_dict.FieldReference(copy.deepcopy(value), field_type=object)
  return copy.deepcopy(value)


def _fill(config: ml_collections.ConfigDict, table: ml_collections.ConfigDict) -> None:
  """Adds every key of ``table`` (recursively) that ``config`` lacks; the
  values ``config`` has stay."""
  for key in table.keys():
    if key not in config:
      config[key] = _field(table, key)
    elif isinstance(config[key], ml_collections.ConfigDict) and isinstance(
      table[key], ml_collections.ConfigDict
    ):
      _fill(config[key], table[key])


def _set_missing(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  """``config.a.b = value`` for ``"a.b"`` unless the key is there (its
  section is created if missing)."""
  *parents, leaf = dotted.split(".")
  node = config
  for part in parents:
    if part not in node:
      node[part] = ml_collections.ConfigDict()
    node = node[part]
  if leaf not in node:
    node[leaf] = copy.deepcopy(value)


def schema(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Every key of ``config``'s task with today's default, in one ConfigDict:
  the task's base config, its ``data`` section the table of ``data.name``'s
  pipeline (in place of the base config's), its ``model`` section the spec's
  defaults for ``model.name`` (the task's family if unset).

  Raises:
    KeyError: ``config.task`` is not a task of :data:`laplax.tasks.TASKS`.
  """
  task_class = tasks.TASKS[config.task]
  out = task_class.base_config()
  family = config.model.name if "name" in config.model else task_class.family
  out.model = defaults.model_config(family if family in spec_lib.FAMILIES else task_class.family)
  out.data = task_class.data_defaults(config)
  return out


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Gives ``config`` every key its task reads, in place; returns it.

  First the task's :meth:`~laplax.tasks.base.TaskBase.upgrade_saved` (keys an
  older laplax named or shaped otherwise), then :data:`OLD_RUN_VALUES` for the
  keys of the task that ``config`` lacks, then the defaults of
  :func:`schema` for every other key it lacks, section by section. Values the
  config has are kept (so completing twice changes nothing). A config
  without a known ``task`` or a ``model`` section, or whose ``data.name`` is
  no string, is returned as it is, for validation to report
  (:func:`laplax.tasks.validate`).

  Works on a locked config (``train.py``'s) too: its keys are added unlocked.
  """
  if not (
    "task" in config
    and isinstance(config.task, str)
    and config.task in tasks.TASKS
    and "model" in config
    and isinstance(config.model, ml_collections.ConfigDict)
    and (
      "data" not in config
      or (
        isinstance(config.data, ml_collections.ConfigDict)
        and ("name" not in config.data or isinstance(config.data.name, str))
      )
    )
  ):
    return config
  with config.unlocked():
    task_class = tasks.TASKS[config.task]
    if "data" not in config:
      config.data = ml_collections.ConfigDict()
    task_class.upgrade_saved(config)
    _set_missing(config, "data.name", task_class.base_config().data.name)
    table = schema(config)
    known = utils.flatten_dotted(table.to_dict(), keep_empty=True)
    for key, value in OLD_RUN_VALUES.items():
      if key in known:
        _set_missing(config, key, value)
    _fill(config, table)
  return config
