"""Decoder-only causal language model in the GPT-2 style (Radford et al. 2019).

Token embedding, learned or rotary position encoding, pre-norm blocks with a
GELU (or ReLU^2) MLP, LayerNorm (or parameter-free RMSNorm, optionally also
after the token embedding: the options of the Laplacian authors' nanochat,
``configs/gpt_d20.py``), optional qk-norm and weight tying, residual output projections
initialised with std ``0.02 / sqrt(2 * num_layers)`` (or nanochat's
initialisation, ``model.kernel_init="nanochat"``), an optional logit soft-cap
``c tanh(logits / c)``; with ``targets`` the model returns the per-token
cross-entropy instead of the logits, computed ``model.loss_chunk`` positions at
a time when that is set (:func:`token_losses`). Laplacian heads take the
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
import optax

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
  def __call__(
    self,
    tokens: jax.Array,
    *,
    train: bool = False,
    decode: bool = False,
    targets: jax.Array | None = None,
  ):
    """Logits of the next token at every position of ``tokens``, or, given
    ``targets`` (int ``[batch, length]``, each in ``[0, vocab_size)``), the
    next-token cross-entropy ``(float32 [batch, length] nats, out)``
    (:func:`token_losses`: ``spec.loss_chunk`` positions at a time, the
    ``[batch, length, vocab]`` logits never formed, when it is set and less
    than ``length``; else from the whole logits).

    Raises:
      ValueError: a sequence longer than ``spec.max_length``, or one that
        ``spec.loss_chunk`` does not divide.
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
    chunked = (
      targets is not None
      and spec.loss_chunk is not None
      and spec.loss_chunk < length
      and not self.is_initializing()
    )
    if spec.tie_embeddings:
      if chunked:
        unembedding = embed.embedding.astype(jnp.float32).T
      else:
        logits = embed.attend(x.astype(jnp.float32))
    else:
      head_init = nn.initializers.zeros if nanochat else init
      head = nn.Dense(
        self.vocab_size,
        use_bias=False,
        dtype=jnp.float32,
        kernel_init=sharding.logical_init(head_init, ("embed", "vocab")),
        name="lm_head",
      )
      if chunked:
        unembedding = sharding.unbox(head.variables["params"]["kernel"]).astype(jnp.float32)
      else:
        logits = head(x)
    if chunked:
      losses = token_losses(
        x, unembedding, targets, softcap=spec.logit_softcap, chunk=spec.loss_chunk
      )
      return losses, out
    if spec.logit_softcap is not None:  # nanochat/gpt.py: 15 tanh(logits / 15)
      cap = spec.logit_softcap
      logits = cap * jnp.tanh(logits.astype(jnp.float32) / cap)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    if targets is not None:
      return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets
      ), out
    return logits.astype(jnp.float32), out


def token_losses(
  hidden: jax.Array,
  unembedding: jax.Array,
  targets: jax.Array,
  *,
  softcap: float | None,
  chunk: int,
) -> jax.Array:
  """Next-token cross-entropy of the soft-capped logits, ``chunk`` positions
  at a time.

  The logits of ``chunk`` positions, ``float32 [batch, chunk, vocab]``, are
  the only vocabulary-sized array alive at once, in the forward and the
  backward pass: a ``jax.lax.map`` over the chunks of a ``jax.checkpoint``-ed
  body (the backward pass computes each chunk's logits again). Each token's
  loss is computed as the unchunked model computes it (``hidden @
  unembedding`` in float32, ``c tanh(logits / c)``,
  ``optax.softmax_cross_entropy_with_integer_labels``); the gradient of
  ``unembedding`` is summed over the chunks, another summation order than
  one matmul over all positions (float32 rounding). The technique is the
  chunked cross-entropy of MaxText and Liger-Kernel; 4 bytes x batch x
  length x vocab (8 GiB for 16 sequences of 2048 tokens over 65,536 tokens)
  become 4 bytes x batch x chunk x vocab.

  Args:
    hidden: the final-norm hidden states ``[batch, length, width]`` (any
      float dtype; cast to float32).
    unembedding: float32 ``[width, vocab]`` (``lm_head``'s kernel, or the
      tied embedding transposed).
    targets: int ``[batch, length]``, each in ``[0, vocab)``.
    softcap: ``c`` of ``c tanh(logits / c)`` (nanochat/gpt.py), or ``None``.
    chunk: positions per chunk; must divide ``length``.

  Returns:
    float32 ``[batch, length]``: each position's loss in nats.

  Raises:
    ValueError: ``chunk`` does not divide ``length``.
  """
  batch, length, width = hidden.shape
  if length % chunk:
    raise ValueError(f"model.loss_chunk={chunk} must divide the sequence length {length}")
  n = length // chunk
  xs = hidden.astype(jnp.float32).reshape(batch, n, chunk, width).swapaxes(0, 1)
  ts = targets.reshape(batch, n, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one(args):
    x, t = args
    logits = jax.lax.dot_general(x, unembedding, (((2,), (0,)), ((), ())))
    if softcap is not None:
      logits = softcap * jnp.tanh(logits / softcap)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return optax.softmax_cross_entropy_with_integer_labels(logits, t)

  return jax.lax.map(one, (xs, ts)).swapaxes(0, 1).reshape(batch, length)
