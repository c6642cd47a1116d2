"""Prints the two tables of scripts/spectral_study.sh from its run directories.

    python scripts/spectral_table.py runs/spectral

Table 1 (``init_*``: step-0 checkpoints; ``grad20_*``: the same variants after
20 steps): attention entropy, self-weight ``p_tt`` and head similarity (means
over layers and heads) and ``kappa`` of the effective ``W_Q`` from
``analysis.json`` at step 0, and the W_Q / W_K gradient norms at step 20 (at
step 0 the zero-initialised classifier passes no gradient to the backbone).
Table 2 (the other run directories): ``eval.json`` test accuracy.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def _load(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _mean(layers, key):
  vals = [v for e in layers for v in (e.get(key) or []) if v is not None]
  return float(np.mean(vals)) if vals else float("nan")


def _grad(layers, name):
  vals = [v for e in layers for v in ((e.get("gradient_norms") or {}).get(name) or [])]
  return float(np.mean(vals)) if vals else float("nan")


def _kappa(layers, whole: bool):
  vals = []
  for e in layers:
    w = e["weights"]["query"]
    stats = w[w.get("effective", "raw")]
    vals.append(stats["condition_number"] if whole else max(stats["head_condition_number"]))
  return float(np.median(vals))


def init_table(runs: str) -> None:
  names = sorted(n[5:] for n in os.listdir(runs) if n.startswith("init_"))
  print(
    "| variant (step 0) | entropy (nats) | min entropy | self-weight p_tt | "
    "head similarity | kappa(W_Q) whole | kappa(W_Q) worst head | "
    "|grad W_Q| step 20 | |grad W_K| step 20 |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for name in names:
    a = _load(os.path.join(runs, f"init_{name}", "analysis.json"))
    if a is None:
      continue
    layers = a["layers"]
    ent = [v for e in layers for v in e["attention_entropy"]]
    sim = np.mean([e["attention_head_similarity_mean"] for e in layers])
    g = _load(os.path.join(runs, f"grad20_{name}", "analysis.json"))
    gq = _grad(g["layers"], "query") if g else float("nan")
    gk = _grad(g["layers"], "key") if g else float("nan")
    print(
      f"| {name} | {np.mean(ent):.3f} | {np.min(ent):.3f} | "
      f"{_mean(layers, 'attention_self_weight'):.3f} | {sim:.3f} | "
      f"{_kappa(layers, True):.3g} | {_kappa(layers, False):.3g} | "
      f"{gq:.3g} | {gk:.3g} |"
    )
  if names:
    a = _load(os.path.join(runs, f"init_{names[0]}", "analysis.json"))
    print(
      f"\n(uniform attention: {a['layers'][0]['attention_entropy_uniform']:.3f} nats; "
      f"medians of kappa over the {len(a['layers'])} layers)"
    )


def train_table(runs: str) -> None:
  rows = []
  for name in sorted(os.listdir(runs)):
    if name.startswith(("init_", "grad20_")):
      continue
    e = _load(os.path.join(runs, name, "eval.json"))
    if e is not None:
      rows.append((name, e))
  if not rows:
    return
  print("\n| run (1200 steps) | test accuracy | test loss | step |")
  print("|---|---|---|---|")
  for name, e in rows:
    print(f"| {name} | {e['accuracy']:.4f} | {e['loss']:.4f} | {e['step']} |")


def main(argv) -> int:
  if len(argv) != 2 or not os.path.isdir(argv[1]):
    print("usage: python scripts/spectral_table.py RUNS_DIR", file=sys.stderr)
    return 2
  init_table(argv[1])
  train_table(argv[1])
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
