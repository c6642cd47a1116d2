"""What every attention kernel shares: the mask value, the causal and window masks, the GQA head
repeat.

The conventions of :func:`laplax.attention.attend` and all its kernels: a
boolean mask is True where a query may attend; causal queries are the *last*
``q_length`` of the ``kv_length`` keys (a KV cache's chunk), unless a start
position is given; grouped-query attention (Ainslie et al. 2023) repeats each
key/value head for the query heads that share it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Masked logits get this value rather than -inf, so that fully masked rows and
# bfloat16 never produce NaN (the softmax is taken in float32).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def causal_mask(q_length: int, kv_length: int, start=None, *, xp=np):
  """Bool ``[q_length, kv_length]``: query ``i`` (at position ``start + i``)
  may attend to keys ``0..start + i``.

  ``start`` defaults to ``kv_length - q_length`` (the queries are the last
  keys); ``xp`` is then the array module that builds the mask: NumPy (a
  constant of the compiled program) or ``jax.numpy`` (ops in it). The values
  are the same, but XLA compiles the two differently, so the last bits of a
  gradient can differ: each kernel keeps the form it was written with. A
  traced ``start`` (a KV cache's write position) gives a traced mask.
  """
  if start is None:
    return xp.arange(q_length)[:, None] + (kv_length - q_length) >= xp.arange(kv_length)[None, :]
  return (start + np.arange(q_length))[:, None] >= jnp.arange(kv_length)[None, :]


def window_mask(q_positions, kv_length: int, window: int) -> jax.Array:
  """Bool ``[q, kv_length]``: the query at position ``p`` (``q_positions [q]``,
  int, may be traced) sees key ``j`` iff ``p - j <= window``; with the causal
  mask a sliding window of ``window + 1`` keys (nanochat's
  ``window_size=(window, 0)``, nanochat/flash_attention.py)."""
  return (jnp.asarray(q_positions)[:, None] - jnp.arange(kv_length)[None, :]) <= window


def combine_masks(mask, is_causal: bool, q_length: int, kv_length: int, *, xp=np):
  """``mask`` (bool broadcastable to ``[batch, heads, q_length, kv_length]``,
  or ``None``) and, with ``is_causal``, the causal mask ``[1, 1, q_length,
  kv_length]`` (:func:`causal_mask` built with ``xp``): their conjunction,
  or ``None`` when there is neither."""
  if is_causal:
    causal = causal_mask(q_length, kv_length, xp=xp)[None, None]
    mask = causal if mask is None else jnp.logical_and(mask, causal)
  return mask


def repeat_kv(x, heads: int, axis: int = -2):
  """Grouped-query heads: ``x`` with each of its ``x.shape[axis]`` heads
  repeated ``heads // x.shape[axis]`` times along ``axis`` (head ``h`` of the
  result is ``x``'s head ``h // group``); ``x`` itself when it already has
  ``heads`` heads."""
  if x.shape[axis] == heads:
    return x
  return jnp.repeat(x, heads // x.shape[axis], axis=axis)
