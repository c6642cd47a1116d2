"""Decoder-only causal language model in the GPT-2 style (Radford et al. 2019).

Token embedding, learned or rotary position encoding, pre-LN blocks with a GELU
MLP, optional qk-norm and weight tying, residual output projections
initialised with std ``0.02 / sqrt(2 * num_layers)``. Laplacian heads take the
causal form ``v_t - sum_{j<=t} p_tj v_j`` (token 0's output is exactly 0) and
spectral conditioning applies to every layer's ``W_Q, W_K, W_V``.

Incremental decoding: ``init`` with ``decode=True`` on a ``[batch,
max_length]`` input creates the KV cache (``"cache"`` collection); then
``apply(..., decode=True, mutable=["cache"])`` on successive chunks returns
the same logits as the full forward pass.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import sharding
from laplax.models.layers import EMBED_AXES, transformer_blocks


class GPT(nn.Module):
  """Causal Transformer LM.

  ``tokens`` int ``[batch, length]`` -> ``(logits float32 [batch, length,
  vocab_size], out)``; ``out["block{i}"]`` holds each block's intermediates
  and ``out["encoded"]`` the final-norm hidden states ``[batch, length, width]``.

  Attributes:
    vocab_size, max_length: vocabulary and context length.
    width, depth, num_heads, mlp_dim: the architecture (``head_dim`` defaults
      to ``width // num_heads``).
    num_laplacian_heads: an int or a per-layer list (last k heads Laplacian).
    laplacian_mask: optional per-layer lists of per-head booleans.
    posemb: ``"learn"`` (GPT-2) or ``"rope"`` (rotary on queries and keys).
    qk_norm, dropout, attention_dropout, use_bias: as in ``Block``.
    tie_embeddings: the output layer is the transposed token embedding.
    spectral_lam, spectral_mode: spectral conditioning (``None`` = off).
    implementation: attention kernel.
    dtype: compute dtype (parameters float32, logits float32).
    remat: rematerialisation of each block (see ``ViT.remat``).
    scan_layers: blocks under ``nn.scan`` (parameters, and the KV cache when
      decoding, stacked under ``blocks`` with a leading layer axis).
  """
  vocab_size: int
  max_length: int = 256
  width: int = 256
  depth: int = 4
  num_heads: int = 4
  mlp_dim: int | None = None
  num_laplacian_heads: int | Sequence[int] = 0
  laplacian_mask: Sequence[Sequence[bool]] | None = None
  posemb: str = "learn"
  qk_norm: bool = False
  dropout: float = 0.0
  attention_dropout: float = 0.0
  use_bias: bool = True
  tie_embeddings: bool = True
  spectral_lam: float | None = None
  spectral_mode: str = "per_head"
  implementation: str | None = None
  dtype: Any = None
  remat: str = "none"
  scan_layers: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False, decode: bool = False):
    """Logits of the next token at every position of ``tokens``.

    Raises:
      ValueError: a sequence longer than ``max_length`` or an unknown posemb.
    """
    out = {}
    length = tokens.shape[1]
    if length > self.max_length:
      raise ValueError(f"sequence length {length} exceeds max_length={self.max_length}")
    init = nn.initializers.normal(0.02)
    embed = nn.Embed(self.vocab_size, self.width, name="token_embedding",
                     embedding_init=sharding.logical_init(init, ("vocab", "embed")))
    x = embed(tokens).astype(self.dtype or jnp.float32)
    start = 0
    if decode:
      is_init = not self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      if not is_init:
        start = position.value
        position.value = start + length
    if self.posemb == "learn":
      pos = self.param("pos_embedding", sharding.logical_init(init, ("length", "embed")),
                       (self.max_length, self.width), jnp.float32)
      x = x + jax.lax.dynamic_slice_in_dim(pos, start, length).astype(x.dtype)[None]
    elif self.posemb != "rope":
      raise ValueError(f"posemb {self.posemb!r} is unknown; use 'learn' or 'rope'")
    x = nn.Dropout(self.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)

    out_init = nn.initializers.normal(0.02 / (2 * self.depth) ** 0.5)
    x, blocks = transformer_blocks(
        x, depth=self.depth, num_heads=self.num_heads,
        num_laplacian_heads=self.num_laplacian_heads,
        laplacian_mask=self.laplacian_mask, remat=self.remat,
        scan=self.scan_layers,
        call=dict(is_causal=True, deterministic=not train, decode=decode),
        mlp_dim=self.mlp_dim or 4 * self.width, qk_norm=self.qk_norm,
        dropout=self.dropout, attention_dropout=self.attention_dropout,
        spectral_lam=self.spectral_lam, spectral_mode=self.spectral_mode,
        implementation=self.implementation, use_bias=self.use_bias,
        rope=self.posemb == "rope", dtype=self.dtype, kernel_init=init,
        out_init=out_init)
    out.update(blocks)
    x = nn.LayerNorm(name="final_norm", dtype=jnp.float32,
                     **sharding.layer_norm_inits("embed"))(x)
    out["encoded"] = x
    if self.tie_embeddings:
      logits = embed.attend(x.astype(jnp.float32))
    else:
      logits = nn.Dense(self.vocab_size, use_bias=False, dtype=jnp.float32,
                        kernel_init=sharding.logical_init(init, ("embed", "vocab")),
                        name="lm_head")(x)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32), out
