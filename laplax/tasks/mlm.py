"""Masked-language-model pre-training of a BERT (Devlin et al. 2019), as cramming trains it.

:class:`MaskedLMTask` is the ``"mlm"`` entry of :data:`laplax.tasks.TASKS`.
The corpus is any text corpus the language-model pipeline reads
(:mod:`laplax.data.text.corpus`; a WordPiece tokenizer trained on its train
split, ``data.tokenizer="wordpiece"``), packed: every example is a window of
``model.max_length`` consecutive tokens of the concatenated documents (the
LM pipeline's random windows, so resuming is exact), each document ending in
``[SEP]`` and no ``[CLS]`` (cramming's corpus: ``include_sep_token_in_corpus``,
not ``include_cls_token_in_corpus``; ``data.wordpiece_normalizer``);
``mlm.cls_first=True`` puts ``[CLS]`` on every window's first token instead
(BERT's input, and laplax's packing before the key). The masking is drawn inside the compiled step from the
step's RNG, so a resumed run masks exactly as an uninterrupted one.

Masking (:func:`mask_tokens`; ``config.mlm``):

* ``rule="bert"``: each non-special token is chosen with probability ``p``;
  a chosen token becomes ``[MASK]`` with probability 0.8, a uniformly random
  token with 0.1, stays with 0.1 (Devlin et al. 2019, Appendix A.1).
* ``rule="cramming"`` (Geiping & Goldstein 2023; cramming's collator with
  ``use_80_20_rule``): exactly ``n = round(p * length)`` distinct tokens of
  every sequence are chosen; the first ``round(0.8 n)`` become ``[MASK]``,
  the next ``round(0.9 n) - round(0.8 n)`` random tokens, the rest stay.
  The count is static, so the MLM head runs on the ``n`` chosen positions
  only (cramming's sparse prediction).

Loss: mean cross-entropy over the chosen tokens only (nats).
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
from laplax.config import validation as config_lib
from laplax.data import lm_input
from laplax.data.text import tokenizers
from laplax.models import spec as spec_lib
from laplax.models.bert import BERT
from laplax.tasks.base import TaskBase, counted, model_spec

RULES = ("cramming", "bert")
#: Token ids the masking never chooses ([PAD] [UNK] [CLS] [SEP] [MASK] of
#: :class:`laplax.data.text.tokenizers.WordPieceTokenizer`).
NUM_SPECIAL = 5
MASK_ID, CLS_ID = 4, 2


def num_masked(probability: float, length: int) -> int:
  """cramming's count of chosen tokens per sequence, ``round(p * length)`` (>= 1)."""
  return max(1, round(probability * length))


def mask_tokens(
  rng: jax.Array,
  tokens: jax.Array,
  valid: jax.Array,
  *,
  rule: str,
  probability: float,
  vocab_size: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The masked input and the prediction targets of ``tokens``.

  Args:
    rng: a PRNG key.
    tokens: int32 ``[batch, length]``.
    valid: bool ``[batch, length]``: tokens that may be chosen (real and
      not special).
    rule: ``"cramming"`` or ``"bert"`` (module docstring).
    probability: ``p``, the share of tokens chosen.
    vocab_size: random replacements are uniform in ``[NUM_SPECIAL, vocab_size)``.

  Returns:
    ``(inputs int32 [batch, length], positions int32 [batch, n], targets int32
    [batch, n], weights float32 [batch, n])``: the chosen positions, their
    original tokens and 1 where a position was chosen (``"cramming"``: ``n =
    round(p * length)``, weight 0 where a row has fewer valid tokens;
    ``"bert"``: ``n = length``, every position, weight 1 where chosen).

  Raises:
    ValueError: an unknown rule.
  """
  tokens, valid = jnp.asarray(tokens, jnp.int32), jnp.asarray(valid, bool)
  batch, length = tokens.shape
  k_choose, k_kind, k_random = jax.random.split(rng, 3)
  random_tokens = jax.random.randint(k_random, tokens.shape, NUM_SPECIAL, vocab_size, jnp.int32)
  if rule == "cramming":
    n = num_masked(probability, length)
    scores = jnp.where(valid, jax.random.uniform(k_choose, tokens.shape), -1.0)
    order = jnp.argsort(-scores, axis=1)[:, :n].astype(jnp.int32)  # random distinct positions
    weights = jnp.take_along_axis(valid, order, axis=1).astype(jnp.float32)
    rank = jnp.arange(n)
    n_mask, n_random = round(0.8 * n), round(0.9 * n)
    replace = jnp.where(
      rank < n_mask,
      MASK_ID,
      jnp.where(rank < n_random, jnp.take_along_axis(random_tokens, order, axis=1), -1),
    )
    replace = jnp.where(weights > 0, replace, -1)
    rows = jnp.arange(batch)[:, None]
    current = tokens[rows, order]
    inputs = tokens.at[rows, order].set(jnp.where(replace >= 0, replace, current))
    return inputs, order, current, weights
  if rule == "bert":
    chosen = valid & jax.random.bernoulli(k_choose, probability, tokens.shape)
    u = jax.random.uniform(k_kind, tokens.shape)
    inputs = jnp.where(chosen & (u < 0.8), MASK_ID, tokens)
    inputs = jnp.where(chosen & (u >= 0.8) & (u < 0.9), random_tokens, inputs)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    return inputs, positions, tokens, chosen.astype(jnp.float32)
  raise ValueError(f"mlm.rule={rule!r} is unknown; use one of {', '.join(RULES)}")


class MaskedLMTask(TaskBase):
  """Masked-LM pre-training of :class:`~laplax.models.bert.BERT`.

  Batches: ``{"tokens": int32 [B, max_length]}`` (a window of the corpus;
  token 0 is set to ``[CLS]`` here); eval batches also ``"mask"`` float32
  ``[B, max_length - 1]`` (1 for a real token at positions ``1..``).
  Evaluation: ``loss`` (nats per masked token), ``perplexity``,
  ``accuracy`` (top-1 on the masked tokens) and ``num_masked``, with the
  masking drawn from a fixed key per batch.
  """

  family = "bert"
  base_config = staticmethod(defaults.bert_base_config)

  @classmethod
  def data_defaults(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The text corpus's keys (:func:`laplax.data.lm_input.default_config`),
    with the WordPiece tokenizer masked-LM pre-training needs and its
    vocabulary size (the base config's)."""
    data = lm_input.default_config(config.data.name)
    base = cls.base_config().data
    data.tokenizer, data.vocab_size = base.tokenizer, base.vocab_size
    return data

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """``mlm.rule``, ``mlm.probability``, ``mlm.cls_first``, the corpus and the
    WordPiece tokenizer.

    Raises:
      ConfigError: one line naming the key and the fix.
    """
    rule = config_lib.get(config, "mlm.rule")
    config_lib.require(
      rule in RULES, f"config.mlm.rule={rule!r} is unknown; use one of {', '.join(RULES)}"
    )
    config_lib.check_float(config, "mlm.probability", 0.0, 1.0, open_min=True)
    config_lib.require(
      isinstance(config.mlm.cls_first, bool),
      f"config.mlm.cls_first={config.mlm.cls_first!r} must be True or False",
    )
    config_lib.require(
      not (lm_input.is_fineweb(config) or lm_input.is_project_input(config)),
      f"config.data.name={config.data.name!r}: masked-LM pre-training reads a text corpus "
      f"(data.name='text_corpus')",
    )
    config_lib.require(
      config.data.tokenizer == "wordpiece",
      f"config.data.tokenizer={config.data.tokenizer!r}: masked-LM pre-training needs "
      f"[MASK] and [CLS] tokens; use data.tokenizer='wordpiece'",
    )
    normalizer = config.data.wordpiece_normalizer
    config_lib.require(
      normalizer in tokenizers.WORDPIECE_NORMALIZERS,
      f"config.data.wordpiece_normalizer={normalizer!r} is unknown; use one of "
      f"{', '.join(tokenizers.WORDPIECE_NORMALIZERS)}",
    )

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
    self.seq_len = int(config.model.max_length)
    self.vocab_size = int(tokenizer.vocab_size)
    self.model = BERT(self.spec, vocab_size=self.vocab_size)

  @classmethod
  def from_shapes(cls, config, *, image_shape=None, num_classes=None, vocab_size=None, spec=None):
    """The task for ``vocab_size`` tokens (default ``config.data.vocab_size``), no corpus read."""
    del image_shape, num_classes
    from laplax.tasks.language_model import VocabularySize

    return cls(config, VocabularySize(vocab_size or int(config.data.vocab_size)), spec=spec)

  @classmethod
  def from_data(
    cls,
    config: ml_collections.ConfigDict,
    workdir: str | None,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    """Prepares corpus and WordPiece tokenizer (saved in ``workdir``)."""
    from laplax.data.text import corpus as text

    tokenizer = text.prepare(config.data, workdir, seq_len=int(config.model.max_length) - 1)
    return cls(config, tokenizer, spec=spec)

  def tokens_per_example(self) -> int:
    """``model.max_length``."""
    return self.seq_len

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """Random windows of ``max_length`` tokens (the LM pipeline's, one shorter context)."""
    from laplax.data.text import corpus as text

    return text.train_dataset(
      self.config.data,
      self.tokenizer,
      batch_size=self.config.batch_size // process_count,
      seq_len=self.seq_len - 1,
      seed=self.config.seed,
      process_index=process_index,
      process_count=process_count,
    )

  def eval_batches(self) -> Iterator[dict]:
    """Consecutive validation windows of ``max_length`` tokens."""
    from laplax.data.text import corpus as text

    return text.eval_batches(
      self.config.data,
      self.tokenizer,
      batch_size=self.config.eval_batch_size,
      seq_len=self.seq_len - 1,
    )

  def batch_spec(self, batch_size: int) -> dict:
    """``{"tokens": int32 [batch_size, max_length]}``."""
    return {"tokens": jax.ShapeDtypeStruct((batch_size, self.seq_len), jnp.int32)}

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters from ``rng`` (the MLM head's, no pooler)."""
    return self.model.init({"params": rng}, jnp.zeros((1, self.seq_len), jnp.int32))["params"]

  def packed(self, tokens: jax.Array) -> jax.Array:
    """The model's input of packed windows ``tokens`` (int32 ``[batch,
    max_length]``): the windows as they are (cramming), or with ``[CLS]`` on
    each first token (``mlm.cls_first``)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    return tokens.at[:, 0].set(CLS_ID) if self.config.mlm.cls_first else tokens

  def _masked_loss(self, params, tokens, real, rng, train: bool):
    """``(sum of CE, sum of correct, count)`` over the chosen tokens of ``tokens``."""
    tokens = self.packed(tokens)
    valid = real & (tokens >= NUM_SPECIAL)
    m = self.config.mlm
    inputs, positions, targets, weights = mask_tokens(
      rng, tokens, valid, rule=m.rule, probability=m.probability, vocab_size=self.vocab_size
    )
    dropout = jax.random.fold_in(rng, 1)  # the masking draws from rng itself
    logits, _ = self.model.apply(
      {"params": params},
      inputs,
      attention_mask=real.astype(jnp.int32),
      positions=positions if m.rule == "cramming" else None,
      train=train,
      rngs={"dropout": dropout} if train else None,
    )
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return (losses * weights).sum(), (correct * weights).sum(), weights.sum()

  def loss(self, params, batch, rng, task_state=None, step=None):
    """Mean cross-entropy over the chosen tokens (nats) and ``(metrics, None)``."""
    del task_state, step
    tokens = batch["tokens"]
    real = jnp.ones(tokens.shape, bool)
    total, correct, count = self._masked_loss(params, tokens, real, rng, train=True)
    loss = total / jnp.maximum(count, 1.0)
    return loss, ({"loss": loss, "mlm_accuracy": correct / jnp.maximum(count, 1.0)}, None)

  def readout(self, state: Any) -> np.ndarray:
    """The tied decoder ``[vocab_size, width]``."""
    return np.asarray(state.params["token_embedding"]["embedding"])

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Sums over the chosen tokens: ``loss``, ``correct``, ``count``."""
    tokens, mask = batch["tokens"], batch["mask"]
    row = mask.max(axis=1, keepdims=True) > 0
    real = jnp.concatenate([row, mask > 0], axis=1)
    rng = jax.random.fold_in(jax.random.PRNGKey(0), tokens.sum())
    total, correct, count = self._masked_loss(params, tokens, real, rng, train=False)
    return {"loss": total, "correct": correct, "count": count}

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> ``{"loss", "perplexity", "accuracy", "num_masked"}``; a
    :class:`DataError` when no token of the eval split was masked
    (:func:`laplax.tasks.base.counted`), not a mean over nothing."""
    count = counted(sums, what="masked token")
    loss = float(sums["loss"]) / count
    return {
      "loss": loss,
      "perplexity": math.exp(min(loss, 700.0)),
      "accuracy": float(sums["correct"]) / count,
      "num_masked": int(count),
    }
