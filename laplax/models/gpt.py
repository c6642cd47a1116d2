"""Decoder-only causal language model in the GPT-2 style (Radford et al. 2019).

Token embedding, learned or rotary position encoding, pre-norm blocks with a
GELU (or ReLU^2) MLP, LayerNorm (or parameter-free RMSNorm, optionally also
after the token embedding: the options of the Laplacian authors' nanochat,
``configs/gpt_d20.py``), optional qk-norm and weight tying, residual output projections
initialised with std ``0.02 / sqrt(2 * num_layers)`` (or nanochat's
initialisation, ``model.kernel_init="nanochat"``), an optional logit soft-cap
``c tanh(logits / c)``. Laplacian heads take the
causal form ``v_t - sum_{j<=t} p_tj v_j`` (token 0's output is exactly 0) and
spectral conditioning applies to every layer's ``W_Q, W_K, W_V``.

Incremental decoding: ``init`` with ``decode=True`` on a ``[batch,
max_length]`` input creates the KV cache (``"cache"`` collection); then
``apply(..., decode=True, mutable=["cache"])`` on successive chunks returns
the same logits as the full forward pass.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import sharding
from laplax.models.layers import EMBED_AXES, norm_layer, transformer_blocks
from laplax.models.spec import GPTSpec


class GPT(nn.Module):
  """Causal Transformer LM.

  ``tokens`` int ``[batch, length]`` -> ``(logits float32 [batch, length,
  vocab_size], out)``; ``out["block{i}"]`` holds each block's intermediates
  and ``out["encoded"]`` the final-norm hidden states ``[batch, length, width]``.

  Attributes:
    spec: the :class:`~laplax.models.spec.GPTSpec` (sizes, context, Laplacian
      heads, attention and spectral settings, position encoding, tying,
      biases, dtype, remat, scan).
    vocab_size: vocabulary size (from the tokenizer).
  """

  spec: GPTSpec
  vocab_size: int

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False, decode: bool = False):
    """Logits of the next token at every position of ``tokens``.

    Raises:
      ValueError: a sequence longer than ``spec.max_length``.
    """
    spec = self.spec
    out = {}
    length = tokens.shape[1]
    if length > spec.max_length:
      raise ValueError(f"sequence length {length} exceeds max_length={spec.max_length}")
    init = nn.initializers.normal(0.02)
    nanochat = spec.kernel_init == "nanochat"  # nanochat/gpt.py's init_weights
    embed = nn.Embed(
      self.vocab_size,
      spec.width,
      name="token_embedding",
      param_dtype=jnp.dtype(spec.embedding_dtype),
      embedding_init=sharding.logical_init(
        nn.initializers.normal(1.0) if nanochat else init, ("vocab", "embed")
      ),
    )
    x = embed(tokens).astype(spec.compute_dtype() or jnp.float32)
    start = 0
    if decode:
      is_init = not self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      if not is_init:
        start = position.value
        position.value = start + length
    if spec.posemb == "learn":
      pos = self.param(
        "pos_embedding",
        sharding.logical_init(init, ("length", "embed")),
        (spec.max_length, spec.width),
        jnp.float32,
      )
      x = x + jax.lax.dynamic_slice_in_dim(pos, start, length).astype(x.dtype)[None]
    if spec.embed_norm:  # nanochat/gpt.py: norm(wte(idx)) before the blocks
      x = norm_layer(spec, "embed_norm")(x).astype(x.dtype)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)

    x, blocks = transformer_blocks(
      x, spec, call=dict(is_causal=True, deterministic=not train, decode=decode)
    )
    out.update(blocks)
    x = norm_layer(spec, "final_norm")(x)
    out["encoded"] = x
    if spec.tie_embeddings:
      logits = embed.attend(x.astype(jnp.float32))
    else:
      head_init = nn.initializers.zeros if nanochat else init
      logits = nn.Dense(
        self.vocab_size,
        use_bias=False,
        dtype=jnp.float32,
        kernel_init=sharding.logical_init(head_init, ("embed", "vocab")),
        name="lm_head",
      )(x)
    if spec.logit_softcap is not None:  # nanochat/gpt.py: 15 tanh(logits / 15)
      cap = spec.logit_softcap
      logits = cap * jnp.tanh(logits.astype(jnp.float32) / cap)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32), out
