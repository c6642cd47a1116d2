"""Results over seeds: the final metrics of a set of runs, mean +- std per grid cell.

Read by ``python -m laplax.sweep``. The std is the sample one (``ddof=1``, ``None``
for one seed), in the metric's own unit.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import numpy as np

from laplax.analysis import summary as summary_lib

# eval.json counts and ids, not results.
NOT_METRICS = ("step", "num_examples", "num_tokens", "num_questions")
# Training-record keys that are timings, settings or bookkeeping, not results.
NOT_TRAIN_METRICS = ("step", "split", "steps_per_sec", "data_wait_fraction", "time", "lr")


def _numbers(record: dict, skip: Sequence[str]) -> dict:
  return {
    k: float(v)
    for k, v in record.items()
    if k not in skip
    and isinstance(v, (int, float))
    and not isinstance(v, bool)
    and math.isfinite(float(v))
  }


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file (``[]`` if it does not exist); a
  truncated last line (a killed writer) is left out.

  Not :func:`laplax.utils.json_lines`, which refuses the first line that is not
  JSON: a sweep reads the metrics of runs that are still training or were
  killed mid-write, and reports what they have.
  """
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return _parsed(f)


def _parsed(lines) -> list[dict]:
  records = []
  for line in lines:
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records


def read_metrics(workdir: str) -> list[dict]:
  """The metric records of a run's ``workdir`` as :func:`read_jsonl` reads
  them: ``metrics.jsonl``, or a ``gs://`` workdir's record objects in their
  order (:func:`laplax.records.metric_lines`)."""
  from laplax import records

  return _parsed(records.metric_lines(workdir))


def run_results(workdir: str) -> dict:
  """The final results of one run's workdir.

  Returns:
    ``{"metrics": {name: value}, "layers": {quantity: [value per layer]}}``: the
    numbers of ``eval.json`` but :data:`NOT_METRICS`, the last training record's as
    ``train_NAME`` (no timings), and ``analysis.json``'s per-layer quantities.

  Raises:
    ValueError: no readable ``eval.json``.
  """
  from laplax import store

  try:
    evaluated = json.loads(store.read_text(os.path.join(workdir, "eval.json")))
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(
      f"{workdir} has no readable eval.json ({type(e).__name__}); run eval.py --workdir {workdir}"
    ) from None
  metrics = _numbers(evaluated, NOT_METRICS)
  train = [r for r in read_metrics(workdir) if r.get("split") == "train"]
  if train:
    metrics.update({f"train_{k}": v for k, v in _numbers(train[-1], NOT_TRAIN_METRICS).items()})
  layers = {}
  analysis_path = os.path.join(workdir, "analysis.json")
  if store.exists(analysis_path):
    per_layer = summary_lib.summary(json.loads(store.read_text(analysis_path)))
    layers = {k: v for k, v in per_layer.items() if any(x is not None for x in v)}
  return {"metrics": metrics, "layers": layers}


def mean_std(values: Sequence[float | None]) -> dict:
  """``{"mean", "std", "n"}`` of the non-missing ``values`` (sample std,
  ``ddof=1``; ``None`` for fewer than two values, both ``None`` for none)."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  if x.size == 0:
    return {"mean": None, "std": None, "n": 0}
  # Scaled by the largest magnitude so that the squares of huge values (the
  # Jacobian condition numbers reach 1e54 and more) do not overflow.
  scale = float(np.max(np.abs(x)))
  scale = scale if np.isfinite(scale) and scale > 0 else 1.0
  std = float((x / scale).std(ddof=1) * scale) if x.size > 1 else None
  return {"mean": float(x.mean()), "std": std, "n": int(x.size)}


def aggregate(cells: Sequence[dict]) -> list[dict]:
  """Mean +- std over seeds, per cell.

  ``cells`` is ``[{"grid": {key: value}, "runs": {seed: run_results(...)}}]``; returns
  per cell ``grid``, ``seeds`` (sorted), ``metrics`` ``{name: mean_std}`` and ``layers``
  ``{quantity: [mean_std per layer]}``.
  """
  out = []
  for cell in cells:
    runs = [cell["runs"][s] for s in sorted(cell["runs"])]
    names = sorted({k for r in runs for k in r["metrics"]})
    metrics = {k: mean_std([r["metrics"].get(k) for r in runs]) for k in names}
    layers = {}
    for q in sorted({k for r in runs for k in r["layers"] if k != "layer"}):
      depth = max(len(r["layers"].get(q, [])) for r in runs)
      layers[q] = [
        mean_std([r["layers"][q][i] if i < len(r["layers"].get(q, [])) else None for r in runs])
        for i in range(depth)
      ]
    out.append(
      {
        "grid": dict(cell["grid"]),
        "seeds": sorted(cell["runs"]),
        "metrics": metrics,
        "layers": layers,
      }
    )
  return out


def _pm(stat: dict) -> str:
  if stat["mean"] is None:
    return "-"
  if stat["std"] is None:
    return f"{stat['mean']:.4g}"
  return f"{stat['mean']:.4g} ± {stat['std']:.2g}"


def cell_name(grid: dict) -> str:
  """``key=value, ...`` of a cell (``(all runs)`` for an empty grid)."""
  return ", ".join(f"{k}={v}" for k, v in grid.items()) or "(all runs)"


def metrics_table(aggregated: Sequence[dict], columns: Sequence[tuple[str, str]]) -> list[str]:
  """The lines of a markdown table of ``mean ± std`` per cell: ``columns`` is
  ``[(metric, heading)]``, ``-`` where a cell lacks the metric."""
  lines = [
    "| cell | seeds | " + " | ".join(h for _, h in columns) + " |",
    "|" + "---|" * (len(columns) + 2),
  ]
  for c in aggregated:
    row = [_pm(c["metrics"][k]) if k in c["metrics"] else "-" for k, _ in columns]
    lines.append(f"| {cell_name(c['grid'])} | {len(c['seeds'])} | " + " | ".join(row) + " |")
  return lines


def markdown(aggregated: Sequence[dict]) -> str:
  """The cells as markdown tables of ``mean ± std`` (final metrics, then one per quantity)."""
  if not aggregated:
    return "(no finished runs)\n"
  metrics = sorted({k for c in aggregated for k in c["metrics"]})
  lines = metrics_table(aggregated, [(k, k) for k in metrics])
  labels = {key: label for key, label, _ in summary_lib.QUANTITIES}
  for q in [
    key for key, _, _ in summary_lib.QUANTITIES if any(key in c["layers"] for c in aggregated)
  ]:
    depth = max(len(c["layers"].get(q, [])) for c in aggregated)
    lines += [
      "",
      f"### {labels[q]} (`{q}`), per layer",
      "",
      "| cell | " + " | ".join(f"layer {i}" for i in range(depth)) + " |",
      "|" + "---|" * (depth + 1),
    ]
    for c in aggregated:
      vals = c["layers"].get(q, [])
      row = [_pm(vals[i]) if i < len(vals) else "-" for i in range(depth)]
      lines.append(f"| {cell_name(c['grid'])} | " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def _band(series: Sequence[dict[int, float]]):
  """Steps common to every seed's ``{step: value}``, with mean and std there."""
  steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
  values = np.asarray([[s[t] for t in steps] for s in series], np.float64)
  if not steps:
    return np.zeros(0), np.zeros(0), np.zeros(0)
  std = values.std(0, ddof=1) if len(series) > 1 else np.zeros(len(steps))
  return np.asarray(steps), values.mean(0), std


def plot_curves(cells: Sequence[dict], path: str, title: str = "") -> str | None:
  """Training curves, one colour per cell, the seeds' mean +- std as a band.

  ``cells`` is ``[{"grid": {...}, "workdirs": [...]}]``. Panels: the training loss,
  then each eval metric of ``metrics.jsonl``, against the step. Returns ``path``, or
  ``None`` when no run has a training record.
  """
  records = [[read_metrics(w) for w in c["workdirs"]] for c in cells]
  eval_keys = sorted(
    {
      k
      for runs in records
      for run in runs
      for r in run
      if r.get("split") == "eval"
      for k in _numbers(r, NOT_METRICS)
    }
  )
  panels = [("train", "loss")] + [("eval", k) for k in eval_keys]
  if not any(r.get("split") == "train" for runs in records for run in runs for r in run):
    return None
  from laplax.analysis.plots import _pyplot, _save

  plt = _pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
  for ax, (split, key) in zip(axes[0], panels):
    for i, (cell, runs) in enumerate(zip(cells, records)):
      series = [
        {
          r["step"]: float(r[key])
          for r in run
          if r.get("split") == split and isinstance(r.get(key), (int, float))
        }
        for run in runs
      ]
      steps, mean, std = _band([s for s in series if s])
      if not len(steps):
        continue
      colour = f"C{i % 10}"
      ax.plot(
        steps,
        mean,
        color=colour,
        marker="o",
        markersize=3,
        label=f"{cell_name(cell['grid'])} (n={len(runs)})",
      )
      ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.25, linewidth=0)
    ax.set_xlabel("step")
    ax.set_title(f"{split} {key}")
  axes[0][0].legend(fontsize=7)
  if title:
    fig.suptitle(title)
  return _save(fig, path)
