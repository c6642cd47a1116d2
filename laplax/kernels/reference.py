"""The reference kernel: softmax attention that materialises ``P``.

The definition (Vaswani et al. 2017, eq. 1) in float32, the one kernel that
returns the attention weights and takes attention dropout; the others
(:mod:`laplax.kernels.xla`, :mod:`laplax.kernels.splash`, cuDNN) are
checked against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from laplax.kernels.common import MASK_VALUE, combine_masks, repeat_kv


def reference_attention(
  query,
  key,
  value,
  *,
  mask=None,
  is_causal=False,
  scale=None,
  dropout_rate=0.0,
  dropout_rng=None,
  bias=None,
):
  """Dense softmax attention that materialises ``P``.

  Args:
    query: ``[batch, q_length, num_heads, head_dim]``.
    key, value: ``[batch, kv_length, num_kv_heads, head_dim]``; ``num_kv_heads``
      divides ``num_heads`` (grouped-query attention repeats them).
    mask: bool, broadcastable to ``[batch, num_heads, q_length, kv_length]``,
      True = attend.
    is_causal: add the causal mask (queries aligned to the last keys).
    scale: logit scale, default ``1 / sqrt(head_dim)``.
    dropout_rate, dropout_rng: attention dropout on ``P`` (inverted scaling).
    bias: float, broadcastable to ``[batch, num_heads, q_length, kv_length]``,
      added to the scaled logits (``None``: none).

  Returns:
    ``(PV, P)``: ``PV`` ``[batch, q_length, num_heads, head_dim]`` in
    ``value.dtype`` and ``P`` float32 ``[batch, num_heads, q_length, kv_length]``
    (after dropout). Logits and softmax are computed in float32.
  """
  key, value = repeat_kv(key, query.shape[-2]), repeat_kv(value, query.shape[-2])
  scale = query.shape[-1] ** -0.5 if scale is None else scale
  logits = jnp.einsum("bqhd,bkhd->bhqk", query.astype(jnp.float32), key.astype(jnp.float32)) * scale
  if bias is not None:
    logits = logits + jnp.asarray(bias, jnp.float32)
  mask = combine_masks(mask, is_causal, query.shape[1], key.shape[1], xp=jnp)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  pv = jnp.einsum("bhqk,bkhd->bqhd", probs, value.astype(jnp.float32))
  return pv.astype(value.dtype), probs
