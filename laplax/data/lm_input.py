"""The input of a language-model config: the TFDS text corpus, FineWeb-Edu or a project's.

``LanguageModelTask`` calls these three functions with the whole run config;
``config.data.name`` picks the pipeline: ``"fineweb_edu"`` is
:mod:`laplax.data.text.fineweb` (parquet shards packed as nanochat packs them),
a name that a project registered (:func:`register_input`; nanochat's
mid-training and SFT mixtures ``"chat_mid"`` / ``"chat_sft"``,
:mod:`laplax.proj.nanochat.data`) that project's module, anything else
:mod:`laplax.data.text.corpus` (``"text_corpus"``). All give ``{"tokens": int32 [B, max_length + 1]}``
batches (SFT's also ``"targets"``, :func:`has_targets`; eval batches also
``"mask"``) and a tokenizer with ``vocab_size`` and ``token_bytes``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import grain
import ml_collections

from laplax import projects

#: ``data.name`` -> (the module of a project's input, whether its training
#: batches carry ``"targets"``), from :func:`register_input`.
_PROJECT_INPUTS: dict[str, tuple[str, bool]] = {}


def register_input(name: str, module: str, *, targets: bool = False) -> None:
  """Makes ``data.name == name`` read a project's input: ``module`` (a dotted
  name, imported when first used) has ``default_config(name)``,
  ``prepare(data_config, workdir, batch_size=)``, ``check(data_config,
  tokenizer, seq_len)``, ``train_dataset`` and ``eval_batches`` (as
  :mod:`laplax.proj.nanochat.data.mixture`); ``targets``: its training batches
  carry ``"targets"`` (:func:`has_targets`).

  Raises:
    ValueError: ``name`` is FineWeb-Edu's or another module's already.
  """
  if name == "fineweb_edu" or _PROJECT_INPUTS.get(name, (module, targets)) != (module, targets):
    raise ValueError(f"data.name {name!r} is registered already")
  _PROJECT_INPUTS[name] = (module, targets)


def _project_input(name: str) -> tuple[str, bool] | None:
  """The registration of ``data.name == name``, the projects' ``data``
  modules imported first if none has it (:func:`laplax.projects.discover`)."""
  if name == "fineweb_edu":
    return None
  if name not in _PROJECT_INPUTS:
    projects.discover("data")
  return _PROJECT_INPUTS.get(name)


def _project_module(config: ml_collections.ConfigDict):
  """The module of the project input that ``config`` reads."""
  return importlib.import_module(_project_input(config.data.name)[0])


def is_fineweb(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` reads FineWeb-Edu (``data.name == "fineweb_edu"``)."""
  return config.data.name == "fineweb_edu"


def is_project_input(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` reads a project's input (:func:`register_input`; a chat
  stage of nanochat: ``data.name`` ``"chat_mid"`` or ``"chat_sft"``)."""
  return _project_input(config.data.name) is not None


def has_targets(config: ml_collections.ConfigDict) -> bool:
  """Whether training batches carry ``"targets"`` (int32 ``[B, max_length]``,
  -1 = no loss): a project input registered with ``targets`` (nanochat's SFT,
  ``data.name == "chat_sft"``)."""
  found = _project_input(config.data.name)
  return found is not None and found[1]


def default_config(name: str) -> ml_collections.ConfigDict:
  """The data keys, with their defaults, of the pipeline that reads
  ``data.name == name``: :func:`laplax.data.text.fineweb.default_config`,
  :func:`laplax.proj.nanochat.data.mixture.default_config` or
  :func:`laplax.data.text.corpus.default_config` (the table
  :func:`laplax.tasks.schema.complete` fills a language model's ``data``
  section from)."""
  if name == "fineweb_edu":
    from laplax.data.text import fineweb  # pulls pyarrow

    return fineweb.default_config()
  if _project_input(name) is not None:
    return importlib.import_module(_project_input(name)[0]).default_config(name)
  from laplax.data.text import corpus as text

  return text.default_config()


def prepare(config: ml_collections.ConfigDict, workdir: str | None):
  """The run's tokenizer, the corpus checked (and prepared, for the TFDS corpus).

  Raises:
    DataError: see :func:`laplax.data.text.corpus.prepare` / :func:`laplax.data.text.fineweb.prepare`.
  """
  if is_project_input(config):
    return _project_module(config).prepare(config.data, workdir, batch_size=config.batch_size)
  if is_fineweb(config):  # streams and pop rows checked against the global batch
    from laplax.data.text import fineweb

    return fineweb.prepare(
      config.data, workdir, seq_len=config.model.max_length, batch_size=config.batch_size
    )
  from laplax.data.text import corpus as text

  return text.prepare(config.data, workdir, seq_len=config.model.max_length)


def check_project_input(config: ml_collections.ConfigDict, tokenizer) -> None:
  """Reads and checks every example of a project's input before training
  (its module's ``check``; nanochat's chat stages: every conversation fits).

  Raises:
    DataError: an example the input cannot use.
  """
  _project_module(config).check(config.data, tokenizer, int(config.model.max_length))


def train_dataset(
  config: ml_collections.ConfigDict, tokenizer, process_index: int = 0, process_count: int = 1
) -> grain.IterDataset:
  """This process's infinite training batches of ``config.batch_size // process_count`` rows."""
  from laplax.data.text import corpus as text
  from laplax.data.text import fineweb

  if is_project_input(config):
    return _project_module(config).train_dataset(
      config.data,
      tokenizer,
      batch_size=config.batch_size // process_count,
      seq_len=config.model.max_length,
      process_index=process_index,
      process_count=process_count,
    )
  module = fineweb if is_fineweb(config) else text
  return module.train_dataset(
    config.data,
    tokenizer,
    batch_size=config.batch_size // process_count,
    seq_len=config.model.max_length,
    seed=config.seed,
    process_index=process_index,
    process_count=process_count,
  )


def eval_batches(config: ml_collections.ConfigDict, tokenizer) -> Iterator[dict]:
  """The validation batches of ``config.eval_batch_size`` rows (FineWeb-Edu:
  popped as the train batch pops)."""
  if is_project_input(config):
    return _project_module(config).eval_batches(
      config.data,
      tokenizer,
      batch_size=config.eval_batch_size,
      seq_len=config.model.max_length,
      train_batch_size=config.batch_size,
    )
  if is_fineweb(config):
    from laplax.data.text import fineweb

    return fineweb.eval_batches(
      config.data,
      tokenizer,
      batch_size=config.eval_batch_size,
      seq_len=config.model.max_length,
      train_batch_size=config.batch_size,
    )
  from laplax.data.text import corpus as text

  return text.eval_batches(
    config.data, tokenizer, batch_size=config.eval_batch_size, seq_len=config.model.max_length
  )
