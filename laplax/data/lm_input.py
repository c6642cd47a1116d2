"""The input of a language-model config: the TFDS text corpus, FineWeb-Edu or a chat stage.

``LanguageModelTask`` calls these three functions with the whole run config;
``config.data.name`` picks the pipeline: ``"fineweb_edu"`` is
:mod:`laplax.data.text.fineweb` (parquet shards packed as nanochat packs them),
``"chat_mid"`` / ``"chat_sft"`` :mod:`laplax.data.chat.mixture` (nanochat's
mid-training and SFT mixtures), anything else :mod:`laplax.data.text.corpus`
(``"text_corpus"``). All give ``{"tokens": int32 [B, max_length + 1]}``
batches (SFT's also ``"targets"``, :func:`has_targets`; eval batches also
``"mask"``) and a tokenizer with ``vocab_size`` and ``token_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator

import grain
import ml_collections


def is_fineweb(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` reads FineWeb-Edu (``data.name == "fineweb_edu"``)."""
  return config.data.name == "fineweb_edu"


def is_chat(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` is a chat stage (``data.name`` ``"chat_mid"`` or ``"chat_sft"``)."""
  return config.data.name in ("chat_mid", "chat_sft")


def has_targets(config: ml_collections.ConfigDict) -> bool:
  """Whether training batches carry ``"targets"`` (int32 ``[B, max_length]``,
  -1 = no loss): SFT (``data.name == "chat_sft"``)."""
  return config.data.name == "chat_sft"


def default_config(name: str) -> ml_collections.ConfigDict:
  """The data keys, with their defaults, of the pipeline that reads
  ``data.name == name``: :func:`laplax.data.text.fineweb.default_config`,
  :func:`laplax.data.chat.mixture.default_config` or
  :func:`laplax.data.text.corpus.default_config` (the table
  :func:`laplax.tasks.schema.complete` fills a language model's ``data``
  section from)."""
  if name == "fineweb_edu":
    from laplax.data.text import fineweb  # pulls pyarrow

    return fineweb.default_config()
  if name in ("chat_mid", "chat_sft"):
    from laplax.data.chat import mixture as chat_mixture

    return chat_mixture.default_config(name)
  from laplax.data.text import corpus as text

  return text.default_config()


def prepare(config: ml_collections.ConfigDict, workdir: str | None):
  """The run's tokenizer, the corpus checked (and prepared, for the TFDS corpus).

  Raises:
    DataError: see :func:`laplax.data.text.corpus.prepare` / :func:`laplax.data.text.fineweb.prepare`.
  """
  if is_chat(config):
    from laplax.data.chat import mixture as chat_mixture

    return chat_mixture.prepare(config.data, workdir, batch_size=config.batch_size)
  if is_fineweb(config):  # streams and pop rows checked against the global batch
    from laplax.data.text import fineweb

    return fineweb.prepare(
      config.data, workdir, seq_len=config.model.max_length, batch_size=config.batch_size
    )
  from laplax.data.text import corpus as text

  return text.prepare(config.data, workdir, seq_len=config.model.max_length)


def train_dataset(
  config: ml_collections.ConfigDict, tokenizer, process_index: int = 0, process_count: int = 1
) -> grain.IterDataset:
  """This process's infinite training batches of ``config.batch_size // process_count`` rows."""
  from laplax.data.chat import mixture as chat_mixture
  from laplax.data.text import corpus as text
  from laplax.data.text import fineweb

  if is_chat(config):
    return chat_mixture.train_dataset(
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
  if is_chat(config):
    from laplax.data.chat import mixture as chat_mixture

    return chat_mixture.eval_batches(
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
