"""Bidirectional encoder with a masked-LM head: BERT and crammed BERT.

The original BERT (Devlin et al. 2019, "BERT: Pre-training of Deep
Bidirectional Transformers"; the Hugging Face ``BertForMaskedLM`` computes
the same logits; ``python -m laplax.convert`` maps its weights): token, learned position
and token-type embeddings summed, LayerNorm, dropout; post-norm blocks
(:class:`~laplax.models.layers.Block` with ``spec.post_norm``); the MLM head
``LayerNorm(gelu(dense(h)))`` decoded by the transposed token embedding plus a
bias.

The cramming architecture (Geiping & Goldstein 2023, "Cramming: Training a
Language Model on a Single GPU in One Day"; ``JonasGeiping/cramming``,
``cramming/architectures/crammed_bert.py`` and ``arch/crammed-bert.yaml``)
is the same module with other spec options: pre-norm blocks, no biases in
any dense layer, the gated GELU feed-forward (``mlp_activation="gelu_glu"``),
the scaled sinusoidal position embedding, no token types, a final LayerNorm,
no head transform and no decoder bias (``configs/bert_cramming.py``).

Attention is bidirectional through :func:`laplax.attention.attend` with the
key-padding mask, so both methods apply to every head as in the other
models: Laplacian heads output ``v_t - sum_j p_tj v_j`` over all
(unpadded) tokens ``j``, and spectral conditioning adds ``lambda * I_k`` to
every layer's ``W_Q, W_K, W_V``.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.models.layers import ACTIVATIONS, EMBED_AXES, norm_layer, transformer_blocks
from laplax.models.registry import Family
from laplax.models.spec import (
  KERNEL_INITS,
  MLP_ACTIVATIONS,
  SpecError,
  TransformerSpec,
  check_splash_lengths,
  spec_field,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BERTSpec(TransformerSpec):
  """A bidirectional encoder with a masked-LM head (:class:`laplax.models.bert.BERT`).

  The defaults are the original BERT (Devlin et al. 2019; Hugging Face
  ``BertForMaskedLM``): post-norm blocks, learned positions, token types,
  LayerNorm after the embeddings (eps 1e-12), biases, exact GELU, the MLM
  head's transform (dense, GELU, LayerNorm) and a decoder bias, tied to the
  token embedding. The cramming architecture (Geiping & Goldstein 2023,
  ``JonasGeiping/cramming``, ``arch/crammed-bert.yaml``) is ``post_norm=False``,
  ``use_bias=False``, ``mlp_activation="gelu_glu"``,
  ``posemb="scaled_sinusoidal"``, ``type_vocab_size=0``, ``final_norm=True``,
  ``mlm_transform=False``, ``decoder_bias=False``, ``pooler="mean"``
  (``configs/bert_cramming.py``).

  Attributes:
    max_length: positions of the position embedding (tokens).
    posemb: ``"learn"`` (BERT) or ``"scaled_sinusoidal"`` (cramming's
      ``ScaledSinosoidal``: the fixed sin/cos table times one learned scalar,
      initialised ``1 / sqrt(width)``).
    type_vocab_size: token-type (segment) ids; 0: no token-type embedding.
    post_norm: post-norm blocks ``x = norm(x + f(x))`` (BERT) instead of pre-norm.
    embed_norm: a LayerNorm after the summed embeddings (both BERT and cramming).
    final_norm: a norm after the last block (cramming's ``final_norm``).
    mlm_transform: the MLM head's dense + activation + LayerNorm before the
      decoder (BERT's ``cls.predictions.transform``; cramming skips it).
    decoder_bias: a bias ``[vocab_size]`` on the tied decoder.
    pooler: the classifier's pooling: ``"cls"`` (BERT: token 0, dense, tanh)
      or ``"mean"`` (cramming's ``pooler: avg``: the mean over the real
      tokens, dense, tanh).
    pooler_dim: the pooler's dense width (``None``: ``width``; cramming 1024).
  """

  max_length: int = spec_field(128, "int", min=1)
  posemb: str = spec_field(
    "learn",
    "choice",
    choices=("learn", "scaled_sinusoidal"),
  )
  type_vocab_size: int = spec_field(
    2,
    "int",
    min=0,
  )
  post_norm: bool = spec_field(True, "bool")
  embed_norm: bool = spec_field(True, "bool")
  final_norm: bool = spec_field(False, "bool")
  mlm_transform: bool = spec_field(True, "bool")
  decoder_bias: bool = spec_field(True, "bool")
  pooler: str = spec_field("cls", "choice", choices=("cls", "mean"))
  pooler_dim: int | None = spec_field(None, "int", min=1, optional=True)
  kernel_init: str = spec_field("normal", "choice", choices=KERNEL_INITS)
  norm_eps: float = spec_field(
    1e-12,
    "float",
    open_min=True,
    max=1.0,
  )
  mlp_activation: str = spec_field(
    "gelu_exact",
    "choice",
    choices=MLP_ACTIVATIONS,
  )

  def __post_init__(self):
    super().__post_init__()
    if self.posemb == "scaled_sinusoidal" and self.width % 2:
      raise SpecError(
        f"model.posemb='scaled_sinusoidal' needs an even model.width, got {self.width}; "
        f"change the width or use posemb='learn'"
      )
    check_splash_lengths(self, (self.max_length,))


def sinusoidal_table(length: int, width: int) -> np.ndarray:
  """The fixed position table of Vaswani et al. 2017 as cramming's
  ``SinusoidalPositional`` lays it out: float32 ``[length, width]`` with
  ``pe[p, 2i] = sin(p w_i)``, ``pe[p, 2i + 1] = cos(p w_i)``,
  ``w_i = exp(-2i ln(10000) / width)``; ``width`` even."""
  position = np.arange(length, dtype=np.float32)[:, None]
  freq = np.exp(np.arange(0, width, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / width))
  pe = np.zeros((length, width), np.float32)
  pe[:, 0::2] = np.sin(position * freq)
  pe[:, 1::2] = np.cos(position * freq)
  return pe


class BERT(nn.Module):
  """Transformer encoder with a tied masked-LM head, or a sequence classifier.

  ``tokens`` int ``[batch, length]`` -> ``(logits, out)``: float32 MLM logits
  ``[batch, length, vocab_size]`` (``[batch, num_predictions, vocab_size]``
  with ``positions``), or with ``num_labels`` the classifier's float32
  ``[batch, num_labels]``. ``out["block{i}"]`` holds each block's
  intermediates and ``out["encoded"]`` the encoder output ``[batch, length,
  width]``.

  Attributes:
    spec: the :class:`~laplax.models.bert.BERTSpec`.
    vocab_size: vocabulary size (from the tokenizer).
    num_labels: ``None`` (the MLM head) or the classes of a sequence
      classifier (1: a regression, GLUE's STS-B); the pooler
      (``spec.pooler``) and a dense ``classifier`` replace the MLM head.
  """

  spec: BERTSpec
  vocab_size: int
  num_labels: int | None = None

  @nn.compact
  def __call__(
    self,
    tokens: jax.Array,
    token_types: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    *,
    positions: jax.Array | None = None,
    train: bool = False,
  ):
    """Encodes ``tokens`` and applies the head.

    Args:
      tokens: int ``[batch, length]``.
      token_types: int ``[batch, length]`` segment ids (default 0; ignored
        when ``spec.type_vocab_size`` is 0).
      attention_mask: ``[batch, length]``, nonzero = a real token, 0 =
        padding that no token attends to (default: all real).
      positions: int ``[batch, num_predictions]``: the MLM head reads only
        these positions (cramming's sparse prediction: the head's cost and
        the logits scale with the masked tokens, not the length).
      train: dropout on.

    Raises:
      ValueError: a sequence longer than ``spec.max_length``.
    """
    spec = self.spec
    out = {}
    length = tokens.shape[1]
    if length > spec.max_length:
      raise ValueError(f"sequence length {length} exceeds max_length={spec.max_length}")
    init = nn.initializers.normal(0.02)
    embed = nn.Embed(
      self.vocab_size,
      spec.width,
      name="token_embedding",
      embedding_init=sharding.logical_init(init, ("vocab", "embed")),
    )
    x = embed(tokens).astype(jnp.float32)
    if spec.posemb == "learn":
      pos = self.param(
        "pos_embedding",
        sharding.logical_init(init, ("length", "embed")),
        (spec.max_length, spec.width),
        jnp.float32,
      )
      x = x + pos[:length][None]
    else:  # cramming's ScaledSinosoidal: scale * fixed table, scale starting at width^-1/2
      scale = self.param("pos_scale", nn.initializers.constant(spec.width**-0.5), (1,), jnp.float32)
      x = x + scale * jnp.asarray(sinusoidal_table(length, spec.width))[None]
    if spec.type_vocab_size:
      types = jnp.zeros_like(tokens) if token_types is None else token_types
      x = x + nn.Embed(
        spec.type_vocab_size,
        spec.width,
        name="type_embedding",
        embedding_init=sharding.logical_init(init, (None, "embed")),
      )(types).astype(jnp.float32)
    if spec.embed_norm:
      x = norm_layer(spec, "embed_norm")(x)
    x = x.astype(spec.compute_dtype() or jnp.float32)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)
    mask = None
    if attention_mask is not None:
      mask = (attention_mask != 0)[:, None, None, :]  # [batch, 1, 1, length]: keys
    x, blocks = transformer_blocks(x, spec, call=dict(mask=mask, deterministic=not train))
    out.update(blocks)
    if spec.final_norm:
      x = norm_layer(spec, "final_norm")(x)
    out["encoded"] = x
    if self.num_labels is not None:
      return self._classify(x, attention_mask, train), out
    h = x
    if positions is not None:
      h = jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)
    if spec.mlm_transform:  # BERT's cls.predictions.transform
      h = nn.Dense(
        spec.width,
        use_bias=spec.use_bias,
        dtype=spec.compute_dtype(),
        kernel_init=sharding.logical_init(init, ("embed", "mlp")),
        name="mlm_dense",
      )(h)
      activation = "gelu_exact" if spec.mlp_activation == "gelu_glu" else spec.mlp_activation
      h = ACTIVATIONS[activation](h)
      h = norm_layer(spec, "mlm_norm")(h)
    logits = embed.attend(h.astype(jnp.float32))
    if spec.decoder_bias:
      bias = self.param(
        "mlm_bias", sharding.logical_init(nn.initializers.zeros, ("vocab",)), (self.vocab_size,)
      )
      logits = logits + bias
    return logits.astype(jnp.float32), out

  def _classify(self, x: jax.Array, attention_mask: jax.Array | None, train: bool) -> jax.Array:
    """The pooled classifier: ``spec.pooler`` of ``x [batch, length, width]``,
    dense (``pooler_dim``), tanh, dropout, dense ``num_labels`` (HF's
    ``BertPooler`` + classifier; cramming's ``PoolingComponent`` + head).
    float32 ``[batch, num_labels]``."""
    spec = self.spec
    x = x.astype(jnp.float32)
    if spec.pooler == "cls":
      pooled = x[:, 0]
    else:  # the mean over the real tokens (cramming's "avg", padding left out)
      weight = (
        jnp.ones(x.shape[:2], jnp.float32)
        if attention_mask is None
        else (attention_mask != 0).astype(jnp.float32)
      )
      pooled = (x * weight[..., None]).sum(1) / jnp.maximum(weight.sum(1, keepdims=True), 1.0)
    init = nn.initializers.normal(0.02)
    pooled = nn.Dense(spec.pooler_dim or spec.width, kernel_init=init, name="pooler")(pooled)
    pooled = nn.Dropout(spec.dropout)(jnp.tanh(pooled), deterministic=not train)
    return nn.Dense(self.num_labels, kernel_init=init, name="classifier")(pooled)


def attention_lengths(config, image_side=None, crop_sides=()) -> tuple[int, ...]:
  """``(model.max_length,)``: the tokens a BERT's attention sees
  (:attr:`laplax.models.registry.Family.attention_lengths`)."""
  del image_side, crop_sides
  return (int(config.model.max_length),)


#: The BERT family: ``config.model.name="bert"`` (the masked-LM and GLUE tasks build it).
FAMILY = Family(name="bert", spec=BERTSpec, model=BERT, attention_lengths=attention_lengths)
