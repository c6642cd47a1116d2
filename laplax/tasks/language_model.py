"""Causal language modelling (GPT): next-token cross-entropy, bits per byte,
a text sample at each evaluation.

:class:`LanguageModelTask` follows the :class:`~laplax.tasks.base.Task`
protocol; it is the ``"lm"`` entry of :data:`laplax.tasks.TASKS`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax.config import defaults
from laplax.data import lm_input
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT
from laplax.tasks.base import TaskBase, counted, model_spec


class LanguageModelTask(TaskBase):
  """Causal language modelling (GPT) on a text corpus.

  Batches: ``{"tokens": int32 [B, max_length + 1]}``: the model reads
  ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``; eval batches also carry
  ``"mask": float32 [B, max_length]`` over target positions. Loss: mean
  next-token cross-entropy in nats. Evaluation reports ``loss``,
  ``perplexity = exp(loss)`` and ``bits_per_byte = sum(loss where bytes > 0)
  / ln 2 / sum(UTF-8 bytes of the target tokens)`` (nanochat's definition).

  Args:
    config: the run's config.
    tokenizer: from :func:`laplax.data.lm_input.prepare` (``vocab_size``, ``token_bytes``).
  """

  family = "gpt"
  base_config = staticmethod(defaults.gpt_base_config)

  @classmethod
  def data_defaults(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The keys of the corpus ``config.data.name`` names
    (:func:`laplax.data.lm_input.default_config`: FineWeb-Edu, a chat stage
    or the text corpus)."""
    return lm_input.default_config(config.data.name)

  @classmethod
  def upgrade_saved(cls, config: ml_collections.ConfigDict) -> None:
    """A run saved before ``evals`` existed that has no ``eval.sample_tokens``
    was saved before the samples at each evaluation existed too: it gets
    ``eval.sample_tokens = 0`` (it wrote none); then the base class's
    upgrade (:meth:`~laplax.tasks.base.TaskBase.upgrade_saved`)."""
    if "evals" not in config:
      if "eval" not in config:
        config.eval = ml_collections.ConfigDict()
      if "sample_tokens" not in config.eval:
        config.eval.sample_tokens = 0
    super().upgrade_saved(config)

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    tokenizer: Any,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    self.config = config
    self.spec = model_spec(config, spec)
    self.tokenizer = tokenizer
    self.seq_len = config.model.max_length
    self.model = GPT(self.spec, vocab_size=tokenizer.vocab_size)
    self.token_bytes = jnp.asarray(tokenizer.token_bytes, jnp.float32)
    self.zero_byte_tokens = bool((np.asarray(tokenizer.token_bytes) == 0).any())

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
    """The task for a vocabulary of ``vocab_size`` tokens (default: 256 for
    the byte tokenizer, else ``config.data.vocab_size``), no corpus or
    tokenizer opened: every token counts one byte for bits per byte."""
    del image_shape, num_classes
    if vocab_size is None:
      byte = config.data.tokenizer == "byte"
      vocab_size = 256 if byte else int(config.data.vocab_size)
    return cls(config, VocabularySize(vocab_size), spec=spec)

  @classmethod
  def from_data(
    cls,
    config: ml_collections.ConfigDict,
    workdir: str | None,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    """Prepares corpus and tokenizer (a trained tokenizer is saved in ``workdir``).

    Raises:
      DataError: empty or too short corpus, unknown tokenizer.
    """
    from laplax.data import lm_input

    return cls(config, lm_input.prepare(config, workdir), spec=spec)

  def tokens_per_example(self) -> int:
    """The context, ``model.max_length``."""
    return int(self.config.model.max_length)

  def data_limits(self) -> list[tuple]:
    """The batch against the distinct windows of ``model.max_length + 1``
    tokens of the training split; none for FineWeb-Edu, a stream that starts
    again when it runs out (:func:`laplax.data.text.fineweb.prepare` checks its
    shards)."""
    if lm_input.is_fineweb(self.config):
      return []
    if lm_input.is_project_input(self.config):  # every example read (and checked) before training
      lm_input.check_project_input(self.config, self.tokenizer)
      return []
    from laplax.data.text import corpus as text

    num = len(text.split_tokens(self.config.data, self.tokenizer, "train"))
    return [
      (
        "the training split",
        num - int(self.config.model.max_length),
        "distinct windows of model.max_length + 1 tokens",
        "train",
        "batch_size",
        self.config.batch_size,
      )
    ]

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite stream of training windows."""
    from laplax.data import lm_input

    return lm_input.train_dataset(self.config, self.tokenizer, process_index, process_count)

  def eval_batches(self) -> Iterator[dict]:
    """The validation split's windows (each target once)."""
    from laplax.data import lm_input

    return lm_input.eval_batches(self.config, self.tokenizer)

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch (SFT: also ``targets``)."""
    spec = {"tokens": jax.ShapeDtypeStruct((batch_size, self.seq_len + 1), jnp.int32)}
    if lm_input.has_targets(self.config):
      spec["targets"] = jax.ShapeDtypeStruct((batch_size, self.seq_len), jnp.int32)
    return spec

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters (float32 pytree) from ``rng``."""
    tokens = jnp.zeros((1, self.seq_len), jnp.int32)
    return self.model.init({"params": rng}, tokens)["params"]

  def loss(
    self,
    params: Any,
    batch: dict,
    rng: jax.Array,
    task_state: Any = None,
    step: jax.Array | None = None,
  ):
    """Mean next-token cross-entropy (nats, float32) and ``(metrics, None)``.

    A batch with ``"targets"`` (int32 ``[B, max_length]``, SFT) is scored on
    those instead of ``tokens[:, 1:]``, the mean over the targets that are
    not -1 (PyTorch's ``cross_entropy(..., ignore_index=-1)``, nanochat's
    SFT loss; a batch without any gives 0, not NaN).
    """
    del task_state, step
    tokens = batch["tokens"]
    if "targets" in batch:
      valid = batch["targets"] >= 0
      losses = self.token_losses(
        params, tokens[:, :-1], jnp.where(valid, batch["targets"], 0), train=True, rng=rng
      )
      loss = jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(valid.sum(), 1)
      return loss, ({"loss": loss}, None)
    loss = self.token_losses(params, tokens[:, :-1], tokens[:, 1:], train=True, rng=rng).mean()
    return loss, ({"loss": loss}, None)

  def token_losses(
    self,
    params: Any,
    inputs: jax.Array,
    targets: jax.Array,
    *,
    train: bool,
    rng: jax.Array | None = None,
  ) -> jax.Array:
    """Next-token cross-entropy float32 ``[B, L]`` (nats) of ``inputs`` int
    ``[B, L]`` against ``targets`` int ``[B, L]`` (each in ``[0, vocab)``).

    With ``model.loss_chunk`` set the model computes it chunk by chunk
    (:func:`laplax.models.gpt.token_losses`, no ``[B, L, vocab]`` logits);
    unset, from the whole logits, as before that option existed.
    """
    rngs = {"dropout": rng} if rng is not None else {}
    if self.model.spec.loss_chunk is None:
      logits, _ = self.model.apply({"params": params}, inputs, train=train, rngs=rngs)
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    losses, _ = self.model.apply(
      {"params": params}, inputs, train=train, rngs=rngs, targets=targets
    )
    return losses

  def readout(self, state: Any) -> np.ndarray:
    """The unembedding ``[vocab_size, width]`` (float32): the token embedding
    when tied, else the output layer's kernel transposed."""
    if self.model.spec.tie_embeddings:
      return np.asarray(state.params["token_embedding"]["embedding"])
    return np.asarray(state.params["lm_head"]["kernel"]).T

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Masked sums: ``loss`` (nats), ``count`` (tokens), ``bytes`` (UTF-8 bytes)."""
    tokens, mask = batch["tokens"], batch["mask"]
    targets = tokens[:, 1:]
    loss = self.token_losses(params, tokens[:, :-1], targets, train=False)
    num_bytes = self.token_bytes[targets] * mask
    sums = {"loss": (loss * mask).sum(), "count": mask.sum(), "bytes": num_bytes.sum()}
    if self.zero_byte_tokens:  # left out of bits per byte (nanochat's special tokens)
      sums["byte_loss"] = (loss * mask * (num_bytes > 0)).sum()
    return sums

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> ``{"loss", "perplexity", "bits_per_byte", "num_tokens"}``;
    ``bits_per_byte`` as nanochat's ``loss_eval.py`` (0-byte targets count
    neither loss nor bytes; without such tokens ``byte_loss`` is not summed).
    A :class:`DataError` when no target token, or no byte of one, was counted."""
    count = counted(sums, what="target token")
    num_bytes = counted(sums, key="bytes", what="target byte")
    loss = float(sums["loss"]) / count
    byte_loss = float(sums.get("byte_loss", sums["loss"]))
    return {
      "loss": loss,
      "perplexity": math.exp(min(loss, 700.0)),
      "bits_per_byte": byte_loss / math.log(2) / num_bytes,
      "num_tokens": int(count),
    }


class VocabularySize:
  """The tokenizer fields a :class:`LanguageModelTask` reads (``vocab_size``,
  ``token_bytes`` int32 ``[vocab_size]``, one byte a token) when no tokenizer
  is opened (:meth:`LanguageModelTask.from_shapes`)."""

  def __init__(self, vocab_size: int):
    self.vocab_size = int(vocab_size)
    self.token_bytes = np.ones(self.vocab_size, np.int32)
