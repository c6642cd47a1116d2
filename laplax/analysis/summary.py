"""The main per-layer quantities of an analysis (:data:`QUANTITIES`), read from its dict."""

from __future__ import annotations

from typing import Any

import numpy as np


def get_path(d: Any, *keys):
  """``d[k0][k1]...``, or ``None`` where a key is missing or a value is ``None``."""
  for k in keys:
    if not isinstance(d, dict) or d.get(k) is None:
      return None
    d = d[k]
  return d


def _kappa(entry: dict, name: str):
  """Worst head's condition number of the effective kernel ``name``."""
  w = get_path(entry, "weights", name)
  if w is None:
    return None
  heads = get_path(w, w.get("effective", "raw"), "head_condition_number")
  if not heads:
    return None
  return None if any(h is None for h in heads) else max(heads)


def _worst_head(entry: dict, *path):
  """Largest value of ``path`` over the heads of ``entry``'s Jacobian section."""
  heads = get_path(entry, "jacobian", "heads")
  if not heads:
    return None
  vals = [get_path(h, *path) for h in heads]
  return None if any(v is None for v in vals) else max(vals)


def _head_mean(entry: dict, *keys):
  """Mean over heads of the per-head list at ``entry[k0][k1]...`` (``None`` if missing)."""
  e = get_path(entry, *keys)
  return float(np.mean(e)) if e and None not in e else None


def _entropy(entry: dict):
  return _head_mean(entry, "attention_entropy")


#: (key, label, extractor of one layer's entry): the main per-layer quantities.
QUANTITIES = (
  (
    "within_sequence",
    "within-sequence variance (trace)",
    lambda e: get_path(e, "anova", "within_sequence"),
  ),
  (
    "between_sequence",
    "between-sequence variance (trace)",
    lambda e: get_path(e, "anova", "between_sequence"),
  ),
  ("within_class", "within-class variance (trace)", lambda e: get_path(e, "anova", "within_class")),
  (
    "between_class",
    "between-class variance (trace)",
    lambda e: get_path(e, "anova", "between_class"),
  ),
  (
    "within_sequence_fraction",
    "within-sequence / total variance",
    lambda e: get_path(e, "fractions", "within_sequence"),
  ),
  (
    "between_class_fraction",
    "between-class / total variance",
    lambda e: get_path(e, "fractions", "between_class"),
  ),
  ("components_99", "principal components for 99% variance", lambda e: e.get("components_99")),
  (
    "components_99_per_sequence",
    "components for 99% of a sequence's variance, mean",
    lambda e: e.get("components_99_per_sequence"),
  ),
  ("nc1", "NC1 tr(Sigma_W Sigma_B^+)/C", lambda e: get_path(e, "classes", "nc1")),
  (
    "cdnv",
    "CDNV (classes; LM: next tokens)",
    lambda e: (
      get_path(e, "classes", "cdnv")
      if get_path(e, "classes", "cdnv") is not None
      else get_path(e, "token_classes", "cdnv")
    ),
  ),
  ("kappa_q", "kappa(W_Q) effective, worst head", lambda e: _kappa(e, "query")),
  ("kappa_k", "kappa(W_K) effective, worst head", lambda e: _kappa(e, "key")),
  ("kappa_v", "kappa(W_V) effective, worst head", lambda e: _kappa(e, "value")),
  (
    "jacobian",
    "kappa(block Jacobian w.r.t. input X)",
    lambda e: get_path(e, "jacobian", "input", "condition_number"),
  ),
  (
    "weight_jacobian",
    "kappa(head Jacobian w.r.t. W_Q,W_K,W_V), unscaled logits, worst",
    lambda e: _worst_head(e, "weight_condition_number_unscaled"),
  ),
  (
    "bound",
    "Theorem 3.4 bound (unscaled logits), worst head",
    lambda e: _worst_head(e, "theorem_3_4", "bound"),
  ),
  ("entropy", "attention entropy, mean over heads (nats)", _entropy),
  (
    "self_weight",
    "attention self-weight p_tt, mean over heads",
    lambda e: _head_mean(e, "attention_self_weight"),
  ),
  (
    "head_similarity",
    "cosine similarity of heads' P rows, mean over pairs",
    lambda e: e.get("attention_head_similarity_mean"),
  ),
  (
    "laplacian_smoothing",
    "cos(Laplacian head's contribution, deviation from sequence mean)",
    lambda e: e.get("laplacian_smoothing_cosine"),
  ),
  (
    "standard_smoothing",
    "cos(standard head's contribution, deviation from sequence mean)",
    lambda e: e.get("standard_smoothing_cosine"),
  ),
  (
    "grad_q",
    "||dL/dW_Q|| of a head, mean over heads",
    lambda e: _head_mean(e, "gradient_norms", "query"),
  ),
  (
    "grad_k",
    "||dL/dW_K|| of a head, mean over heads",
    lambda e: _head_mean(e, "gradient_norms", "key"),
  ),
)


def summary(analysis: dict) -> dict:
  """``{"layer": [...], key: [value per layer or None]}`` for every key of :data:`QUANTITIES`.

  Variances in squared representation units, entropies in nats, gradient norms in
  loss units per kernel unit, the rest dimensionless.
  """
  entries = analysis.get("layers", [])
  out = {"layer": [e["layer"] for e in entries]}
  for key, _, get in QUANTITIES:
    out[key] = [get(e) for e in entries]
  return out
