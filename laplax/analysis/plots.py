"""PNG plots of an analysis (``analysis.json``) and of several runs side by side.

Each ``plot_*`` takes the dict of :func:`laplax.analysis.report.run_analysis`, the PNG
path (parents created) and a title, and returns the path; missing quantities
(``None``) are skipped. matplotlib's Agg backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from laplax.analysis import summary

FIGURES = {
  "variance": "analysis_variance.png",
  "spectra": "analysis_spectra.png",
  "conditioning": "analysis_conditioning.png",
  "collapse": "analysis_collapse.png",
}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _series(layers, values):
  """``(x, y)`` of the layers whose value is a positive finite number."""
  pts = [(l, v) for l, v in zip(layers, values) if v is not None and np.isfinite(v) and v > 0]
  return [p[0] for p in pts], [p[1] for p in pts]


def _save(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  _pyplot().close(fig)
  return path


def _layer_axis(ax, layers):
  ax.set_xlabel("layer")
  if layers:
    ax.set_xticks(sorted(set(layers)))


def plot_variance(analysis: dict, path: str, title: str = "") -> str:
  """Per-layer ANOVA traces (Zhang & Papyan 2026), squared representation units, log scale."""
  plt = _pyplot()
  s = summary.summary(analysis)
  fig, ax = plt.subplots(figsize=(6, 4))
  for key, label in (
    ("within_sequence", "within-sequence"),
    ("between_sequence", "between-sequence"),
    ("within_class", "within-class (of seq. means)"),
    ("between_class", "between-class"),
  ):
    x, y = _series(s["layer"], s[key])
    if x:
      ax.plot(x, y, marker="o", label=label)
  ax.set_yscale("log")
  ax.set_ylabel("variance (trace, per token)")
  _layer_axis(ax, s["layer"])
  ax.legend(fontsize=8)
  ax.set_title(title or "token covariance ANOVA")
  return _save(fig, path)


def plot_spectra(analysis: dict, path: str, title: str = "") -> str:
  """Explained variance ``s_i^2 / sum_j s_j^2`` per component of each layer, log-log.

  The 99% component count is in the legend.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for entry in analysis.get("layers", []):
    sv = np.asarray([v or 0.0 for v in entry.get("singular_values", [])], np.float64)
    var = sv**2
    if var.sum() <= 0:
      continue
    ratio = var / var.sum()
    idx = np.flatnonzero(ratio > 0)
    ax.plot(
      idx + 1, ratio[idx], label=f"layer {entry['layer']} (99%: {entry.get('components_99')})"
    )
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("principal component")
  ax.set_ylabel("explained variance ratio")
  ax.legend(fontsize=8)
  ax.set_title(title or "spectral decay of token representations")
  return _save(fig, path)


def plot_conditioning(analysis: dict, path: str, title: str = "") -> str:
  """``kappa`` of ``W_Q, W_K, W_V`` (worst head; dashed ``W``, solid ``W + C``), the
  Jacobian and Theorem 3.4's bound per layer (left); entropy per head in nats and its
  uniform maximum (right).
  """
  plt = _pyplot()
  s = summary.summary(analysis)
  layers = s["layer"]
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  colors = {"query": "C0", "key": "C1", "value": "C2"}
  for name, color in colors.items():
    for state, style in (("raw", "--"), ("corrected", "-")):
      vals = []
      for e in analysis.get("layers", []):
        heads = summary.get_path(e, "weights", name, state, "head_condition_number")
        vals.append(max(heads) if heads and None not in heads else None)
      x, y = _series(layers, vals)
      if x:
        ax.plot(
          x,
          y,
          style,
          color=color,
          marker="o",
          ms=3,
          label=f"W_{name[0].upper()} {'W + C' if state == 'corrected' else 'W'}",
        )
  for key, color, label in (
    ("jacobian", "C3", "block Jacobian w.r.t. X"),
    ("weight_jacobian", "C5", "head Jacobian w.r.t. W"),
    ("bound", "C4", "Theorem 3.4 bound"),
  ):
    x, y = _series(layers, s[key])
    if x:
      ax.plot(x, y, ":", color=color, marker="s", ms=4, label=label)
  ax.set_yscale("log")
  ax.set_ylabel("condition number (worst head)")
  _layer_axis(ax, layers)
  ax.legend(fontsize=7)
  ax.set_title("conditioning")
  entries = analysis.get("layers", [])
  if entries and entries[0].get("attention_entropy"):
    heads = len(entries[0]["attention_entropy"])
    for h in range(heads):
      ax2.plot(layers, [e["attention_entropy"][h] for e in entries], marker="o", label=f"head {h}")
    ax2.plot(
      layers,
      [e.get("attention_entropy_uniform") for e in entries],
      "k--",
      marker="x",
      label="uniform (max)",
    )
    ax2.set_ylabel("attention entropy (nats)")
    _layer_axis(ax2, layers)
    ax2.legend(fontsize=7)
  ax2.set_title("attention entropy")
  if title:
    fig.suptitle(title)
  return _save(fig, path)


def plot_collapse(analysis: dict, path: str, title: str = "") -> str:
  """NC1 (Papyan et al. 2020), CDNV (Galanti et al. 2022) and the 99% component count per layer."""
  plt = _pyplot()
  s = summary.summary(analysis)
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
  for ax, key, label, log in (
    (axes[0], "nc1", "NC1", True),
    (axes[1], "cdnv", "CDNV", True),
    (axes[2], "components_99", "components for 99%", False),
  ):
    x, y = _series(s["layer"], s[key])
    if x:
      ax.plot(x, y, marker="o")
    if log and x:
      ax.set_yscale("log")
    ax.set_ylabel(label)
    _layer_axis(ax, s["layer"])
    ax.set_title(label)
  if title:
    fig.suptitle(title)
  return _save(fig, path)


def save_all(analysis: dict, workdir: str, title: str = "") -> list[str]:
  """Writes the figures of :data:`FIGURES` into ``workdir`` and returns their paths.

  Raises:
    OSError: a file cannot be written.
  """
  return [
    fn(analysis, os.path.join(workdir, FIGURES[key]), title)
    for key, fn in (
      ("variance", plot_variance),
      ("spectra", plot_spectra),
      ("conditioning", plot_conditioning),
      ("collapse", plot_collapse),
    )
  ]


def plot_compare(analyses: dict, path: str, keys: Sequence[str] | None = None) -> str:
  """One panel per quantity, one per-layer curve per run.

  ``analyses`` is ``{run name: analysis dict}`` (legend order); ``keys`` the
  :data:`~laplax.analysis.summary.QUANTITIES` to show (default: those any run has).
  Returns ``path``.
  """
  plt = _pyplot()
  summaries = {name: summary.summary(a) for name, a in analyses.items()}
  labels = {k: label for k, label, _ in summary.QUANTITIES}
  if keys is None:
    keys = [k for k in labels if any(any(v is not None for v in s[k]) for s in summaries.values())]
  cols = min(3, max(1, len(keys)))
  rows = max(1, -(-len(keys) // cols))
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
  for ax, key in zip(axes.ravel(), keys):
    for name, s in summaries.items():
      x, y = _series(s["layer"], s[key])
      if x:
        ax.plot(x, y, marker="o", ms=3, label=name)
    if key not in (
      "components_99",
      "components_99_per_sequence",
      "entropy",
      "self_weight",
      "head_similarity",
    ):
      ax.set_yscale("log")
    ax.set_title(labels[key], fontsize=9)
    _layer_axis(ax, [l for s in summaries.values() for l in s["layer"]])
    ax.legend(fontsize=7)
  for ax in axes.ravel()[len(keys) :]:
    ax.axis("off")
  return _save(fig, path)
