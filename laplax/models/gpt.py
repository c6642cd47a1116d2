"""Decoder-only causal language model in the GPT-2 style (Radford et al. 2019).

Token embedding, learned or rotary position encoding, pre-norm blocks with a
GELU (or ReLU^2) MLP, LayerNorm (or parameter-free RMSNorm, optionally also
after the token embedding: the options of the Laplacian authors' nanochat,
``configs/gpt_d20.py``), optional qk-norm and weight tying, residual output projections
initialised with std ``0.02 / sqrt(2 * num_layers)`` (or nanochat's
initialisation, ``model.kernel_init="nanochat"``), optional grouped-query
attention (``model.num_kv_heads`` key/value heads shared by the query heads,
nanochat's ``n_kv_head``), an optional logit soft-cap ``c tanh(logits / c)``; with ``targets`` the model returns the per-token
cross-entropy instead of the logits, computed ``model.loss_chunk`` positions at
a time when that is set (:func:`token_losses`). Laplacian heads take the
causal form ``v_t - sum_{j<=t} p_tj v_j`` (token 0's output is exactly 0) and
spectral conditioning applies to every layer's ``W_Q, W_K, W_V``.

The options of the Laplacian authors' nanochat fork (yuchongzhang/nanochat
1f70b557, nanochat/gpt.py; the fields of :class:`~laplax.models.spec.GPTSpec`,
off by default) run the fork's trunk (:func:`fork_trunk`): the previous-token
smear, per-layer ``resid_lambdas`` and ``x0_lambdas``, value embeddings on
alternating layers, per-layer sliding windows and the mid-layer backout; the
vocabulary may be padded (``vocab_multiple``, logits cut back).

Incremental decoding: ``init`` with ``decode=True`` on a ``[batch,
max_length]`` input creates the KV cache (``"cache"`` collection); then
``apply(..., decode=True, mutable=["cache"])`` on successive chunks returns
the same logits as the full forward pass; the cache holds the key/value
heads only (``[batch, max_length, kv_heads, head_dim]`` per layer).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from laplax import sharding
from laplax.models.layers import EMBED_AXES, REMAT_POLICIES, Block, norm_layer, transformer_blocks
from laplax.models.spec import GPTSpec

# The channels of the normed embedding the fork's smear gate reads.
SMEAR_GATE_CHANNELS = 24


def _uniform(low: float, high: float):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, low, high)


def has_value_embed(spec: GPTSpec, i: int) -> bool:
  """Whether layer ``i`` has a value embedding: alternating layers, the last
  one included (the fork's ``has_ve``)."""
  return spec.value_embeds and i % 2 == (spec.depth - 1) % 2


def fork_trunk(module: nn.Module, x, tokens, spec: GPTSpec, vocab: int, call: dict, start):
  """The fork's trunk, called from :class:`GPT`'s compact ``__call__`` (its
  parameters are the GPT's): smear, then per block ``x = resid_lambdas[i] x +
  x0_lambdas[i] x0`` and the block (value embedding, window), the backout
  before the final norm (yuchongzhang/nanochat 1f70b557, nanochat/gpt.py
  ``GPT.forward``). ``x`` ``[batch, length, width]`` is the normed embedding,
  ``tokens`` its ids, ``vocab`` the padded vocabulary, ``start`` the position
  of the chunk (decoding). Returns ``(x, {"block{i}": intermediates})``.
  """
  depth, dtype = spec.depth, x.dtype
  fork_init = spec.kernel_init == "nanochat-fork"
  if spec.smear:
    lam = module.param("smear_lambda", nn.initializers.zeros, (1,), jnp.float32)
    gate = nn.Dense(
      1,
      use_bias=False,
      dtype=dtype,
      kernel_init=sharding.logical_init(_uniform(0.0, 0.02), (None, None)),
      name="smear_gate",
    )(x[..., :SMEAR_GATE_CHANNELS])
    before = jnp.zeros_like(x[:, :1])
    if call.get("decode"):
      is_init = not module.has_variable("cache", "previous_embedding")
      prev = module.variable("cache", "previous_embedding", jnp.zeros, x[:, :1].shape, dtype)
      if not is_init:
        before = jnp.where(start > 0, prev.value, before)
        prev.value = x[:, -1:]
    shifted = jnp.concatenate([before, x[:, :-1]], axis=1)
    x = x + (lam.astype(dtype) * jax.nn.sigmoid(gate)).astype(dtype) * shifted
  x0 = x
  layers = jnp.arange(depth, dtype=jnp.float32) / max(depth - 1, 1)
  resid = x0_lam = None
  if spec.resid_lambdas:
    init = (lambda k, s, d=jnp.float32: (1.15 - 0.10 * layers).astype(d)) if fork_init else None
    resid = module.param("resid_lambdas", init or nn.initializers.ones, (depth,), jnp.float32)
  if spec.x0_lambdas:
    init = (lambda k, s, d=jnp.float32: (0.20 - 0.15 * layers).astype(d)) if fork_init else None
    x0_lam = module.param("x0_lambdas", init or nn.initializers.zeros, (depth,), jnp.float32)
  ve_bound = (3.0 / spec.width) ** 0.5
  ve_init = _uniform(-ve_bound, ve_bound) if fork_init else nn.initializers.normal(0.02)
  heads, windows, rates = spec.laplacian_array, spec.windows(), spec.drop_path_rates()

  def body(block, y, ve):
    return block(y, **call, value_embed=ve)

  if spec.remat != "none":
    body = nn.remat(body, policy=REMAT_POLICIES[spec.remat])
  outs, cached = {}, None
  for i in range(depth):
    if resid is not None:
      x = resid[i].astype(dtype) * x
    if x0_lam is not None:
      x = x + x0_lam[i].astype(dtype) * x0
    ve = None
    if has_value_embed(spec, i):
      ve = nn.Embed(
        vocab,
        spec.kv_heads * spec.head_dim,
        name=f"value_embed{i}",
        param_dtype=jnp.dtype(spec.embedding_dtype),
        embedding_init=sharding.logical_init(ve_init, ("vocab", "embed")),
      )(tokens).astype(dtype)
    blk = Block(
      spec,
      laplacian_mask=tuple(bool(h) for h in heads[i]),
      drop_path=rates[i],
      window=windows[i],
      name=f"block{i}",
    )
    x, outs[f"block{i}"] = body(blk, x, ve)
    if spec.backout and i == depth // 2:
      cached = x
  if cached is not None:
    lam = module.param("backout_lambda", nn.initializers.constant(0.2), (1,), jnp.float32)
    x = x - lam.astype(dtype) * cached
  return x, outs


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
    fork = spec.kernel_init == "nanochat-fork"  # the fork's init_weights
    vocab = spec.padded_vocab(self.vocab_size)
    embed_init = nn.initializers.normal(1.0 if nanochat else 0.8) if nanochat or fork else init
    embed = nn.Embed(
      vocab,
      spec.width,
      name="token_embedding",
      param_dtype=jnp.dtype(spec.embedding_dtype),
      embedding_init=sharding.logical_init(embed_init, ("vocab", "embed")),
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

    call = dict(is_causal=True, deterministic=not train, decode=decode)
    if spec.fork_trunk:
      x, blocks = fork_trunk(self, x, tokens, spec, vocab, call, start)
    else:
      x, blocks = transformer_blocks(x, spec, call=call)
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
      if fork:
        head_init = nn.initializers.normal(0.001)
      head = nn.Dense(
        vocab,
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
      unembedding = unembedding[:, : self.vocab_size]  # the fork's padding, cut back
      losses = token_losses(
        x, unembedding, targets, softcap=spec.logit_softcap, chunk=spec.loss_chunk
      )
      return losses, out
    if vocab != self.vocab_size:  # the fork's padding, cut back
      logits = logits[..., : self.vocab_size]
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
