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
1f70b557, nanochat/gpt.py; the fields of :class:`~laplax.models.gpt.GPTSpec`,
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

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from laplax import sharding
from laplax.models.layers import EMBED_AXES, REMAT_POLICIES, Block, norm_layer, transformer_blocks
from laplax.models.registry import Family
from laplax.models.spec import (
  DTYPES,
  KERNEL_INITS,
  SpecError,
  TransformerSpec,
  check_splash_lengths,
  spec_field,
)


def window_sizes(pattern: str | None, depth: int, max_length: int) -> tuple[int | None, ...]:
  """Per-layer sliding windows of the fork's ``window_pattern`` (its
  ``_compute_window_sizes``, nanochat/gpt.py at yuchongzhang/nanochat 1f70b557).

  The pattern of ``S`` and ``L`` is tiled over the ``depth`` layers and the
  last layer is ``L``. ``L`` is the full context (``None``); ``S`` is
  ``ceil(max_length / 4 / 128) * 128`` tokens back (512 at 2048): query ``i``
  sees key ``j`` iff ``0 <= i - j <= window``. ``pattern`` ``None``: all full.
  """
  if pattern is None:
    return (None,) * depth
  short = -(-max_length // 4 // 128) * 128
  out = [None if pattern[i % len(pattern)] == "L" else short for i in range(depth)]
  out[-1] = None
  return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTSpec(TransformerSpec):
  """A causal LM (GPT-2 form): context, position encoding, tied embeddings.

  Attributes:
    max_length: context length in tokens.
    num_kv_heads: key/value heads, a divisor of ``num_heads``: grouped-query
      attention (Ainslie et al. 2023; nanochat/gpt.py's ``n_kv_head``, its
      ``c_k, c_v`` of ``kv_heads * head_dim`` columns), query head ``h``
      using key/value head ``h // (num_heads / num_kv_heads)``, a Laplacian
      head that head's values; ``None``: ``num_heads`` (one per query head).
      :attr:`kv_heads` is the number.
    posemb: ``"learn"`` (GPT-2) or ``"rope"`` (rotary on queries and keys).
    tie_embeddings: the output layer is the transposed token embedding.
    embed_norm: a ``norm`` of the token embedding before the first block
      (nanochat/gpt.py normalises there).
    logit_softcap: ``c`` of the logit soft-cap ``c tanh(logits / c)`` (15 in
      nanochat/gpt.py), in float32; ``None``: none.
    embedding_dtype: the token embedding's parameter dtype (nanochat keeps
      ``wte`` in bfloat16, and so its AdamW moments).
    kernel_init: :data:`KERNEL_INITS`: ``"gpt2"`` (normal 0.02, the output
      projections ``0.02 / sqrt(2 depth)``, token embedding normal 0.02) or
      ``"nanochat"`` (nanochat/gpt.py's ``init_weights``: every matrix
      :func:`nanochat_normal`, the token embedding N(0, 1), ``lm_head``
      zeros; ``zero_init_out`` zeroes ``W_O`` and the MLP output as there) or
      ``"nanochat-fork"`` (the fork's: ``W_Q, W_K, W_V`` uniform
      ``+-sqrt(3 / width)``, the MLP's first layer 0.4 times that, ``W_O``
      and the MLP output zeros, token embedding N(0, 0.8), ``lm_head`` N(0,
      0.001), value embeddings as ``W_V``, gates U(0, 0.02), the scalars below
      at the fork's values).
    value_embeds, resid_lambdas, x0_lambdas, smear, backout, window_pattern,
      vocab_multiple: the options of the Laplacian authors' nanochat fork
      (yuchongzhang/nanochat 1f70b557, nanochat/gpt.py), each off by default:
    value_embeds: a value embedding table ``[vocab, width]`` on alternating
      layers, the last one included (layer ``i`` iff ``i % 2 == (depth - 1) %
      2``), added to the values as ``v + 3 sigmoid(ve_gate(x[..., :12])) ve``
      with one gate per key/value head (``ve_gate`` ``[12, kv_heads]``, on
      the block's normed input); the table is ``[vocab, kv_heads * head_dim]``.
    resid_lambdas: a learned scalar per layer multiplying the residual stream
      before the block (initialised ``1.15 - 0.10 i / (depth - 1)``).
    x0_lambdas: a learned scalar per layer times the (normed, smeared)
      embedding ``x0`` added before the block (``0.20 - 0.15 i / (depth - 1)``).
    smear: ``x[t] += smear_lambda sigmoid(smear_gate(x[t, :24])) x[t - 1]`` on
      the normed embedding (``smear_lambda`` 0, ``smear_gate [24, 1]`` U(0, 0.02)).
    backout: ``x -= backout_lambda h`` before the final norm, ``h`` the
      residual stream after block ``depth // 2`` (``backout_lambda`` 0.2).
    window_pattern: per-layer causal sliding windows from a pattern of ``S``
      and ``L`` (:func:`window_sizes`; the fork's ``"SSSL"``); ``None``: full
      causal attention everywhere.
    vocab_multiple: the token embedding, ``lm_head`` and value embeddings have
      ``vocab_size`` rounded up to a multiple of this (the fork pads to 64);
      the logits are cut back to ``vocab_size``.
    loss_chunk: the training and evaluation loss takes the logits, soft-cap
      and cross-entropy this many positions at a time
      (:func:`laplax.models.gpt.token_losses`: the float32 ``[batch, length,
      vocab]`` logits never formed); must divide ``max_length`` (a chunk of
      ``max_length`` or more: all positions at once). The same
      loss, the ``lm_head`` gradient summed in another order (float32
      rounding); memory only. ``None``: all positions at once.
  """

  max_length: int = spec_field(128, "int", min=1)
  num_kv_heads: int | None = spec_field(None, "int", optional=True, min=1)
  posemb: str = spec_field("learn", "choice", choices=("learn", "rope"))
  tie_embeddings: bool = spec_field(True, "bool")
  embed_norm: bool = spec_field(False, "bool")
  logit_softcap: float | None = spec_field(None, "float", optional=True, open_min=True)
  embedding_dtype: str = spec_field("float32", "choice", choices=DTYPES)
  kernel_init: str = spec_field("gpt2", "choice", choices=KERNEL_INITS)
  value_embeds: bool = spec_field(False, "bool")
  resid_lambdas: bool = spec_field(False, "bool")
  x0_lambdas: bool = spec_field(False, "bool")
  smear: bool = spec_field(False, "bool")
  backout: bool = spec_field(False, "bool")
  window_pattern: str | None = spec_field(None, "pattern", optional=True)
  vocab_multiple: int = spec_field(1, "int", min=1)
  loss_chunk: int | None = spec_field(None, "int", optional=True, min=1)

  def __post_init__(self):
    super().__post_init__()
    if self.num_heads % self.kv_heads:
      divisors = ", ".join(str(d) for d in range(1, self.num_heads + 1) if self.num_heads % d == 0)
      raise SpecError(
        f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads={self.num_heads} "
        f"(key/value heads shared by the heads); use one of {divisors} or None"
      )
    check_splash_lengths(self, (self.max_length,))
    if self.scan_layers and self.fork_trunk:
      raise SpecError(
        "model.scan_layers=True is not built for the nanochat fork's per-layer options "
        "(value_embeds, resid/x0_lambdas, smear, backout, window_pattern); set "
        "model.scan_layers=False"
      )

    chunk = self.loss_chunk
    if chunk is not None and chunk < self.max_length and self.max_length % chunk:
      raise SpecError(
        f"model.loss_chunk={self.loss_chunk} must divide model.max_length={self.max_length}; "
        f"use a divisor (e.g. {math.gcd(self.max_length, self.loss_chunk)}) or None"
      )

  @property
  def fork_trunk(self) -> bool:
    """Whether any option of the fork's trunk is on (the GPT then runs its own loop)."""
    return bool(
      self.value_embeds
      or self.resid_lambdas
      or self.x0_lambdas
      or self.smear
      or self.backout
      or self.window_pattern is not None
    )

  def windows(self) -> tuple[int | None, ...]:
    """Each layer's sliding window (:func:`window_sizes`; ``None`` = full)."""
    return window_sizes(self.window_pattern, self.depth, self.max_length)

  def padded_vocab(self, vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``vocab_multiple``."""
    return -(-vocab_size // self.vocab_multiple) * self.vocab_multiple


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
    spec: the :class:`~laplax.models.gpt.GPTSpec` (sizes, context, Laplacian
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


def attention_lengths(config, image_side=None, crop_sides=()) -> tuple[int, ...]:
  """The context, ``(model.max_length,)``: the tokens a GPT's attention sees
  (:attr:`laplax.models.registry.Family.attention_lengths`)."""
  del image_side, crop_sides
  return (int(config.model.max_length),)


#: The GPT family: ``config.model.name="gpt"`` (the language-model tasks build it).
FAMILY = Family(name="gpt", spec=GPTSpec, model=GPT, attention_lengths=attention_lengths)
