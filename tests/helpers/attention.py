"""The Laplacian-head attention written from its definition in float64 NumPy."""

from __future__ import annotations

import numpy as np


def np_attention(
  q, k, v, laplacian, *, mask=None, causal=False, residual_value=None, return_weights=False
):
  """The Laplacian-head formula (laplax.attention.attend) in float64 NumPy.

  ``mask`` is boolean (True = attend) and enters as an additive 0 / -inf term.
  A row without any allowed key has no defined softmax; for it the library's
  documented convention (masked logits replaced by one large negative constant)
  gives the uniform distribution, which is what this reference returns.
  """
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  bsz, tq, nh, d = q.shape
  tk, nkv = k.shape[1], k.shape[2]
  k = np.repeat(k, nh // nkv, axis=2)
  v = np.repeat(v, nh // nkv, axis=2)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
  allow = np.ones((bsz, nh, tq, tk), bool)
  if mask is not None:
    allow &= np.broadcast_to(np.asarray(mask, bool), allow.shape)
  if causal:
    qpos = np.arange(tq)[:, None] + (tk - tq)
    allow &= qpos >= np.arange(tk)[None, :]
  additive = np.where(allow, 0.0, -np.inf)
  z = logits + additive
  empty = ~allow.any(-1)
  zmax = np.where(empty, 0.0, z.max(-1, initial=-np.inf, where=allow))
  e = np.exp(z - zmax[..., None])
  with np.errstate(invalid="ignore"):
    probs = e / e.sum(-1, keepdims=True)
  probs[empty] = 1.0 / tk
  pv = np.einsum("bhqk,bkhd->bqhd", probs, v)
  if residual_value is None:
    res = v if tq == tk else np.zeros_like(pv)  # unused unless Laplacian
  else:
    res = np.repeat(np.asarray(residual_value, np.float64), nh // residual_value.shape[2], axis=2)
  lap = np.asarray(laplacian, bool)[:, None]
  out = np.where(lap, res - pv, pv)
  return (out, probs) if return_weights else out
