"""Theorem 3.4 of Saratchandran & Lucey (2025) in NumPy, and how to compare its terms."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg


def np_condition(a):
  """``sigma_max / sigma_min`` over the ``min(rows, cols)`` singular values."""
  s = np.linalg.svd(np.asarray(a, np.float64), compute_uv=False)
  return s[0] / s[-1] if s[-1] > 0 else np.inf


def np_probs(x, wq, wk, causal=False, scale=1.0):
  """Row-wise ``softmax(scale X W_Q W_K^T X^T)`` in float64, keys after the query masked."""
  logits = (x @ wq) @ (x @ wk).T * scale
  visible = np.tri(len(x), dtype=bool) if causal else np.ones(logits.shape, bool)
  e = np.exp(logits - np.where(visible, logits, -np.inf).max(1, keepdims=True)) * visible
  return e / e.sum(1, keepdims=True)


def np_kappa_l(p, rtol=1e-12):
  """kappa(L) of ``L = blockdiag_t(Diag(p_t) - p_t p_t^T)``: its largest over its
  smallest nonzero eigenvalue (relative threshold ``rtol``), from the full matrix."""
  big = scipy.linalg.block_diag(*[np.diag(r) - np.outer(r, r) for r in p])
  eig = np.linalg.eigvalsh(big)
  nonzero = eig[eig > rtol * eig.max()]
  return nonzero.max() / nonzero.min() if nonzero.size else np.inf


def np_theorem_3_4(x, wq, wk, wv, causal=False, scale=1.0):
  """Theorem 3.4's right side ``kappa(X)^3 kappa(L) kappa(W_V) (kappa(W_Q) +
  kappa(W_K)) + kappa(X) kappa(softmax)``, each term from its definition."""
  p = np_probs(x, wq, wk, causal, scale)
  t = {
    "kappa_x": np_condition(x),
    "kappa_l": np_kappa_l(p),
    "kappa_softmax": np_condition(p),
    "kappa_wq": np_condition(wq),
    "kappa_wk": np_condition(wk),
    "kappa_wv": np_condition(wv),
  }
  with np.errstate(over="ignore", invalid="ignore"):
    t["bound"] = (
      t["kappa_x"] ** 3 * t["kappa_l"] * t["kappa_wv"] * (t["kappa_wq"] + t["kappa_wk"])
      + t["kappa_x"] * t["kappa_softmax"]
    )
  return t


def assert_terms_match(got, want):
  """Each term within its rounding: a condition number ``kappa`` read from
  float64 singular values or eigenvalues carries a relative error of order
  ``eps * kappa`` (the smallest one's absolute error is ``eps * sigma_max``);
  the bound's is at most the sum of its factors' (``kappa_x`` three times)."""
  assert set(got) == set(want), got.keys()
  eps = np.finfo(np.float64).eps
  rel = {k: 1e-9 + 64 * eps * v for k, v in want.items() if k != "bound"}
  rel["bound"] = sum(rel.values()) + 2 * rel["kappa_x"]
  for k, v in want.items():
    assert got[k] == pytest.approx(v, rel=rel[k]), (k, got[k], v)
