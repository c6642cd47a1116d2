"""A Transformer encoder for sequence classification: the Long Range Arena models.

The form of the Nystromformer authors' ``LRA/code/model.py`` and
``model_wrapper.py`` (``mlpen/Nystromformer``; Tay et al. 2021's LRA
baselines): token (or patch) embedding plus learned or sinusoidal positions,
dropout, pre-LN blocks (:func:`~laplax.models.layers.transformer_blocks`, so
every attention kernel, Laplacian heads and spectral conditioning apply), a
final norm with the padded tokens zeroed, mean or class-token pooling, and
an MLP head. The model takes its :class:`~laplax.models.encoder.EncoderSpec`
whole.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.models.layers import EMBED_AXES, norm_layer, transformer_blocks
from laplax.models.registry import Family
from laplax.models.spec import TransformerSpec, spec_field


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderSpec(TransformerSpec):
  """A sequence classifier (the Long Range Arena models of Tay et al. 2021 and
  of the Nystromformer authors' ``LRA/code/model.py``): token or patch
  embedding, positions, pre-LN blocks, a final norm, pooling, an MLP head.

  Attributes:
    inputs: ``"tokens"`` (int ids ``[batch, length]``) or ``"patches"``
      (images ``[batch, H, W, C]``, ``patch_size`` square patches).
    vocab_size: token ids (``"tokens"``).
    max_length: the longest sequence (the learned position table's size).
    patch_size: patch side (``"patches"``).
    posemb: ``"learn"`` (normal 0.02) or ``"sincos"`` (Vaswani et al. 2017,
      the authors' ``fixed_pos_emb``: sin and cos interleaved).
    pool: ``"mean"`` (the final-norm tokens, padded ones zeroed, averaged over
      the whole length, as the authors' ``pooling``) or ``"cls"`` (a learned
      class token first).
    classifier_hidden: the head's hidden layer (``Dense -> ReLU -> Dense``, the
      authors' ``SCHead``); 0: one linear layer.
  """

  inputs: str = spec_field("tokens", "choice", choices=("tokens", "patches"))
  vocab_size: int = spec_field(32, "int", min=1)
  max_length: int = spec_field(2000, "int", min=1)
  patch_size: int = spec_field(1, "int", min=1)
  posemb: str = spec_field("learn", "choice", choices=("learn", "sincos"))
  pool: str = spec_field("mean", "choice", choices=("mean", "cls"))
  classifier_hidden: int = spec_field(128, "int", min=0)


def posemb_sincos_1d(length: int, dim: int) -> np.ndarray:
  """Sinusoidal positions (Vaswani et al. 2017), float32 ``[1, length, dim]``,
  sin and cos interleaved (``[..., 2i]`` sin, ``[..., 2i+1]`` cos) as the
  authors' ``Embeddings.fixed_pos_emb``.

  Raises:
    ValueError: an odd ``dim``.
  """
  if dim % 2:
    raise ValueError(f"sincos position embedding needs an even width, got {dim}")
  position = np.arange(length)[:, None]
  div = np.exp(np.arange(0, dim, 2) * -(math.log(10000.0) / dim))
  pe = np.stack([np.sin(position * div), np.cos(position * div)], -1).reshape(length, dim)
  return pe[None].astype(np.float32)


class Encoder(nn.Module):
  """Sequence classifier with Laplacian heads and spectral conditioning.

  ``inputs``: int32 token ids ``[batch, length]`` (``spec.inputs ==
  "tokens"``) or float images ``[batch, H, W, C]`` (``"patches"``);
  ``mask``: bool ``[batch, length]`` (True = a real token; ``None``: all),
  the key padding of every layer's attention and of the pooling. Returns
  ``(logits [batch, num_classes] float32, out)`` with the block
  intermediates, ``out["encoded"]`` (final-norm tokens, padded ones zero)
  and ``out["pre_logits"]`` (pooled).

  With ``pool == "cls"`` a learned class token is put first and the last
  token dropped, so the length stays (the authors' ``append_cls``).

  Attributes:
    spec: the :class:`~laplax.models.encoder.EncoderSpec`.
    num_classes: classifier outputs (0: the pooled features are the output).
  """

  spec: EncoderSpec
  num_classes: int = 0

  def embed(self, inputs: jax.Array) -> jax.Array:
    """Token or patch embedding, ``[batch, length, width]`` in the compute dtype."""
    spec = self.spec
    dtype = spec.compute_dtype() or jnp.float32
    if spec.inputs == "tokens":
      embed = nn.Embed(
        spec.vocab_size,
        spec.width,
        embedding_init=sharding.logical_init(nn.initializers.normal(0.02), ("vocab", "embed")),
        name="token_embedding",
      )
      return embed(inputs).astype(dtype)
    p = spec.patch_size
    x = nn.Conv(
      spec.width,
      (p, p),
      strides=p,
      padding="VALID",
      dtype=dtype,
      name="embedding",
      kernel_init=sharding.logical_init(
        nn.initializers.lecun_normal(), (None, None, None, "embed")
      ),
      bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
    )(inputs.astype(dtype))
    return x.reshape(x.shape[0], -1, spec.width)

  @nn.compact
  def __call__(self, inputs: jax.Array, mask: jax.Array | None = None, *, train: bool = False):
    """Classifies ``inputs``; ``train`` enables dropout.

    Raises:
      ValueError: more tokens than ``spec.max_length``.
    """
    spec = self.spec
    out = {}
    x = self.embed(inputs)
    batch, length, width = x.shape
    if length > spec.max_length:
      raise ValueError(
        f"{length} tokens exceed model.max_length={spec.max_length}; raise max_length"
      )
    if spec.posemb == "learn":
      pos = self.param(
        "pos_embedding",
        sharding.logical_init(nn.initializers.normal(0.02), (None, "length", "embed")),
        (1, spec.max_length, width),
        jnp.float32,
      )[:, :length]
    else:
      pos = jnp.asarray(posemb_sincos_1d(length, width))
    x = x + pos.astype(x.dtype)
    keep = jnp.ones((batch, length), bool) if mask is None else jnp.asarray(mask, bool)
    if spec.pool == "cls":
      cls = self.param(
        "cls",
        sharding.logical_init(nn.initializers.normal(0.02), (None, None, "embed")),
        (1, 1, width),
        jnp.float32,
      )
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (batch, 1, 1)), x[:, :-1]], 1)
      keep = jnp.concatenate([jnp.ones((batch, 1), bool), keep[:, :-1]], 1)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)
    call = dict(deterministic=not train)
    if mask is not None:
      call["mask"] = keep[:, None, None, :]
    x, blocks = transformer_blocks(x, spec, call=call)
    out.update(blocks)
    x = norm_layer(spec, "encoder_norm")(x) * keep[..., None]
    out["encoded"] = x
    x = x[:, 0] if spec.pool == "cls" else x.mean(axis=1)
    out["pre_logits"] = x
    if self.num_classes:
      if spec.classifier_hidden:
        x = nn.relu(nn.Dense(spec.classifier_hidden, dtype=jnp.float32, name="head_hidden")(x))
      x = nn.Dense(self.num_classes, dtype=jnp.float32, name="head")(x)
    out["logits"] = x
    return x, out


class DualEncoder(nn.Module):
  """The two-tower classifier of LRA Retrieval (the Nystromformer authors'
  ``ModelForSCDual`` and ``SCHeadDual``; LRA's ``classifier_head_dual`` with
  ``interaction="NLI"``): one :class:`Encoder` (shared weights) pools each
  document to ``u`` and ``v``, and ``Dense(classifier_hidden) -> ReLU ->
  Dense(num_classes)`` classifies ``[u, v, u * v, u - v]``.

  ``inputs``, ``inputs2``: int32 ``[batch, length]``; ``mask``, ``mask2``:
  bool ``[batch, length]`` or ``None``. Returns ``(logits [batch,
  num_classes] float32, out)``: ``out["pre_logits"]`` the combined features
  ``[batch, 4 * width]``, ``out["towers"]`` each tower's ``out``.

  Attributes:
    spec: the :class:`~laplax.models.encoder.EncoderSpec` of the tower.
    num_classes: classifier outputs.
  """

  spec: EncoderSpec
  num_classes: int = 2

  @nn.compact
  def __call__(self, inputs, inputs2, mask=None, mask2=None, *, train: bool = False):
    """Classifies the pair; ``train`` enables dropout."""
    tower = Encoder(self.spec, num_classes=0, name="encoder")
    u, out_u = tower(inputs, mask, train=train)
    v, out_v = tower(inputs2, mask2, train=train)
    x = jnp.concatenate([u, v, u * v, u - v], axis=-1).astype(jnp.float32)
    out = {"pre_logits": x, "towers": (out_u, out_v)}
    if self.spec.classifier_hidden:
      x = nn.relu(nn.Dense(self.spec.classifier_hidden, dtype=jnp.float32, name="head_hidden")(x))
    x = nn.Dense(self.num_classes, dtype=jnp.float32, name="head")(x)
    out["logits"] = x
    return x, out


#: The sequence-classifier family: ``config.model.name="encoder"`` (the LRA
#: tasks build it; its attention lengths follow the default rule).
FAMILY = Family(name="encoder", spec=EncoderSpec, model=Encoder)
