"""Attention composed of XLA ops, with a hand-written derivative.

:func:`xla_attention` is the ``P V`` that :func:`laplax.attention.attend`
uses for ``"xla"`` (and for ``implementation=None`` on a CPU, or where a
fused kernel does not suit the shape; see :mod:`laplax.kernels`): the softmax
attention of Vaswani et al. (2017, eq. 1), computed heads-major with a custom
VJP. Its values are those of the materialising
:func:`laplax.kernels.reference.reference_attention`; its gradients are checked
against autodiff of it in ``tests/attention/test_attention.py``.

What the backward pass keeps: on a CPU the float32 ``P`` (the fastest there,
docs/benchmarks.md, "Where the step's time goes"); on an accelerator nothing of size
``[length, length]``: the backward pass computes ``P`` again from ``q`` and
``k`` (``keep_probs=False``): a kept ``P`` of ``gpt_d20.py`` is 2.5 GiB per
layer on each chip of a v5e:4x4 slice, a sixth of the chip (docs/scale-out.md,
"Will it fit? Ahead-of-time compilation"); the price is one more
``Q K^T`` and softmax per layer in the backward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from laplax.kernels.common import MASK_VALUE, causal_mask


def _softmax(q, k, mask, is_causal, scale, bias=None):
  """``P``, float32 ``[batch, heads, q, kv]``, of heads-major ``[batch, heads,
  length, head_dim]`` queries and keys; ``bias`` (float32, broadcastable to
  ``[batch, heads, q, kv]``, or ``None``) is added to the scaled logits."""
  q_len, kv_len = q.shape[2], k.shape[2]
  if q.dtype == jnp.float32:  # scale the [L, d] queries, not the [L, L] logits
    logits = jnp.einsum("bhqd,bhkd->bhqk", q * jnp.float32(scale), k)
  else:
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * jnp.float32(
      scale
    )
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if is_causal:
    logits = jnp.where(causal_mask(q_len, kv_len), logits, jnp.float32(MASK_VALUE))
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.float32(MASK_VALUE))
  logits = logits - jnp.max(logits, axis=-1, keepdims=True)
  unnormalised = jnp.exp(logits)
  return unnormalised / jnp.sum(unnormalised, axis=-1, keepdims=True)


def _softmax_pv(q, k, v, mask, is_causal, scale, bias=None):
  """Forward of :func:`xla_attention` on heads-major ``[batch, heads, length,
  head_dim]`` arrays: ``(P V, P)``, ``P`` float32 ``[batch, heads, q, kv]``."""
  probs = _softmax(q, k, mask, is_causal, scale, bias)
  pv = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return pv.astype(v.dtype), probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _heads_major_attention(q, k, v, mask, bias, is_causal, scale, keep_probs):
  return _softmax_pv(q, k, v, mask, is_causal, scale, bias)[0]


def _heads_major_attention_fwd(q, k, v, mask, bias, is_causal, scale, keep_probs):
  pv, probs = _softmax_pv(q, k, v, mask, is_causal, scale, bias)
  return pv, (q, k, v, mask, bias, probs if keep_probs else None)


def _heads_major_attention_bwd(is_causal, scale, keep_probs, residuals, d_pv):
  q, k, v, mask, bias, probs = residuals
  if not keep_probs:  # recomputed: the same ops as the forward pass, behind a
    # barrier so that XLA cannot merge them with the forward's (CSE would keep
    # the forward's P alive until here, as jax.checkpoint's barriers prevent).
    q_again, k_again = jax.lax.optimization_barrier((q, k))
    probs = _softmax(q_again, k_again, mask, is_causal, scale, bias)
  f32 = jnp.float32
  d_pv32 = d_pv.astype(f32)
  d_v = jnp.einsum("bhqk,bhqd->bhkd", probs, d_pv32)
  d_probs = jnp.einsum("bhqd,bhkd->bhqk", d_pv32, v.astype(f32))
  # softmax backward: dS = P * (dP - rowsum(dP * P)). (FlashAttention's
  # rowsum(dO * O), equal in exact arithmetic, is not used: O is a matmul's
  # output, so its rounding moves with the fusion, and the cancellation in
  # dP - rowsum amplified that in the gradients of rematerialised blocks.)
  delta = jnp.sum(d_probs * probs, axis=-1, keepdims=True)
  d_scores = probs * (d_probs - delta)  # d(scaled logits + bias)
  d_logits = d_scores * f32(scale)
  # Masked logits are constants (MASK_VALUE): no gradient reaches q or k
  # through them. P is exactly 0 there already, except in a row whose keys
  # are all masked, where it is uniform: only a mask (or more queries than
  # keys) can empty a row, so the causal-only step skips this select.
  allowed = mask
  if is_causal and (mask is not None or q.shape[2] > k.shape[2]):
    causal = causal_mask(q.shape[2], k.shape[2])
    allowed = causal if mask is None else jnp.logical_and(mask, causal)
  if allowed is not None:
    d_logits = jnp.where(allowed, d_logits, 0.0)
  d_q = jnp.einsum("bhqk,bhkd->bhqd", d_logits, k.astype(f32))
  d_k = jnp.einsum("bhqk,bhqd->bhkd", d_logits, q.astype(f32))
  d_bias = None
  if bias is not None:  # summed over the axes the bias was broadcast along
    if allowed is not None:
      d_scores = jnp.where(allowed, d_scores, 0.0)
    lead = d_scores.ndim - bias.ndim
    d_bias = d_scores.sum(axis=tuple(range(lead))) if lead else d_scores
    axes = tuple(i for i, n in enumerate(bias.shape) if n == 1 and d_bias.shape[i] != 1)
    d_bias = d_bias.sum(axis=axes, keepdims=True).astype(bias.dtype)
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None, d_bias


_heads_major_attention.defvjp(_heads_major_attention_fwd, _heads_major_attention_bwd)


def xla_attention(query, key, value, mask, is_causal, scale, keep_probs=True, bias=None):
  """``P V`` of softmax attention, composed of XLA ops with a hand-written VJP.

  ``query [batch, q_length, heads, head_dim]``, ``key``/``value [batch,
  kv_length, heads, head_dim]`` (as many heads), ``mask`` bool broadcastable
  to ``[batch, heads, q_length, kv_length]`` or ``None``; ``bias`` an
  additive float bias of the logits, broadcastable to ``[batch, heads,
  q_length, kv_length]``, or ``None`` (``softmax(scale q k^T + bias)``: Swin's
  relative position bias and shifted-window mask; it is differentiated, its
  gradient summed over the broadcast axes); ``is_causal`` and
  ``scale`` are Python values; ``keep_probs`` (a Python bool): the backward
  pass reuses the forward pass's float32 ``P`` (True) or computes it again
  from ``q`` and ``k`` (False: one more ``Q K^T`` and softmax per layer, no
  ``[batch, heads, q_length, kv_length]`` residual; the same values, the
  same ops). Returns ``[batch, q_length, heads, head_dim]``
  in ``value.dtype``. Logits and softmax are float32 (masked with
  :data:`MASK_VALUE`); the backward pass reuses the saved ``P`` (the
  softmax's VJP ``dS = P (dP - rowsum(dP P))`` written out, no logits kept)
  and everything runs heads-major, one transpose in and out: on CPU this is
  faster than the autodiff of ``jax.nn.dot_product_attention``'s XLA path
  (docs/benchmarks.md, "Where the step's time goes, and what changed").

  Raises nothing itself; a mask that does not broadcast fails in ``jnp.where``.
  """
  to_heads = lambda x: jnp.swapaxes(x, 1, 2)
  if bias is not None:
    bias = jnp.asarray(bias)
  out = _heads_major_attention(
    to_heads(query), to_heads(key), to_heads(value), mask, bias, is_causal, scale, bool(keep_probs)
  )
  return to_heads(out)
