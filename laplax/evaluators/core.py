"""The CORE metric of a base model (Li et al. 2024, DCLM; nanochat's base-model score).

nanochat's ``scripts/base_eval.py`` ``evaluate_core`` and
``nanochat/core_eval.py`` (karpathy/nanochat; the Laplacian authors' fork
runs the same), on a local copy of the DCLM eval bundle in its published
layout (nothing is downloaded): ``core.yaml`` (``icl_tasks``: ``label``,
``icl_task_type``, ``dataset_uri``, ``num_fewshot`` (a list; the first is
used), ``continuation_delimiter``, default ``" "``), ``eval_data/<dataset_uri>``
(JSONL) and ``eval_meta_data.csv`` (columns ``Eval Task`` and ``Random
baseline``, in percent).

Per task: the examples shuffled with ``random.Random(1337)``, the first
``max_per_task`` kept; for example ``idx`` the ``K`` few-shot examples are
``random.Random(1234 + idx).sample`` of the others; every prompt gets BOS.

* multiple choice (``query``, ``choices``, ``gold``): one prompt per choice,
  ``shot.query + d + shot.choices[shot.gold] + "\\n\\n"`` per shot, then
  ``query + d + choice``; the scored tokens follow the common prefix.
* schema (``context_options``, ``continuation``, ``gold``): one prompt per
  context, the scored tokens are the common suffix.
* language modelling (``context``, ``continuation``): ``context.strip() + d +
  continuation``; correct iff every continuation token is the greedy argmax.

Multiple choice and schema pick the lowest mean cross-entropy over the scored
tokens. A task's accuracy ``a`` is centred by its random baseline ``b`` (%):
``(a - b/100) / (1 - b/100)``; CORE is the mean of the centred accuracies.
Sequences longer than the model's context keep their last tokens (as nanochat).
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Callable, Sequence

import numpy as np

from laplax import utils
from laplax.data.errors import DataError

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")


def render_mc(item: dict, delim: str, shots: Sequence[dict]) -> list[str]:
  """One prompt per choice (core_eval.py ``render_prompts_mc``)."""
  head = "".join(f"{s['query']}{delim}{s['choices'][s['gold']]}\n\n" for s in shots)
  return [f"{head}{item['query']}{delim}{c}" for c in item["choices"]]


def render_schema(item: dict, delim: str, shots: Sequence[dict]) -> list[str]:
  """One prompt per context option (``render_prompts_schema``)."""
  head = "".join(f"{s['context_options'][s['gold']]}{delim}{s['continuation']}\n\n" for s in shots)
  return [f"{head}{c}{delim}{item['continuation']}" for c in item["context_options"]]


def render_lm(item: dict, delim: str, shots: Sequence[dict]) -> list[str]:
  """``[prompt without the continuation (stripped), with it]`` (``render_prompts_lm``)."""
  head = "".join(f"{s['context'].strip()}{delim}{s['continuation']}\n\n" for s in shots)
  base = f"{head}{item['context'].strip()}{delim}"
  return [base.strip(), base + item["continuation"]]


def common_length(seqs: Sequence[Sequence[int]], direction: str = "left") -> int:
  """Length of the common prefix (``"left"``) or suffix (``"right"``) of ``seqs``."""
  n = min(len(s) for s in seqs)
  idx = range(n) if direction == "left" else range(-1, -n - 1, -1)
  for i, j in enumerate(idx):
    if not all(s[j] == seqs[0][j] for s in seqs):
      return i
  return n


def example_spans(kind: str, prompts: list[str], encode: Callable, bos: int):
  """``(token lists, starts, ends)`` of one example's prompts (``batch_sequences_*``).

  Raises:
    DataError: a language-modelling prompt whose tokens without the
      continuation are not a prefix of those with it.
  """
  tokens = [[bos, *encode(p)] for p in prompts]
  if kind == "multiple_choice":
    start = common_length(tokens, "left")
    return tokens, [start] * len(tokens), [len(t) for t in tokens]
  if kind == "schema":
    suffix = common_length(tokens, "right")
    return tokens, [len(t) - suffix for t in tokens], [len(t) for t in tokens]
  without, with_ = tokens
  if not (len(without) < len(with_) and with_[: len(without)] == without):
    raise DataError("a CORE language-modelling prompt is not a token prefix of its continuation")
  return [with_], [len(without)], [len(with_)]


def score_example(kind, tokens, starts, ends, gold, logits_fn, bos, max_length=None) -> bool:
  """Whether the model gets one example right. ``logits_fn(int32 [rows, length])
  -> float [rows, length, vocab]`` (rows right-padded with BOS)."""
  if max_length is not None:
    crop = [max(0, len(t) - max_length) for t in tokens]
    tokens = [t[c:] for t, c in zip(tokens, crop)]
    starts = [s - c for s, c in zip(starts, crop)]
    ends = [e - c for e, c in zip(ends, crop)]
  width = max(len(t) for t in tokens)
  ids = np.full((len(tokens), width), bos, np.int32)
  for i, t in enumerate(tokens):
    ids[i, : len(t)] = t
  logits = np.asarray(logits_fn(ids), np.float64)
  if kind == "language_modeling":
    s, e = starts[0], ends[0]
    return bool(np.all(logits[0, s - 1 : e - 1].argmax(-1) == ids[0, s:e]))
  shifted = logits - logits.max(-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  means = []
  for i, (s, e) in enumerate(zip(starts, ends)):
    targets = ids[i, s:e]
    means.append(float(-logp[i, np.arange(s - 1, e - 1), targets].mean()))
  return int(np.argmin(means)) == gold


def task_accuracy(
  data, kind, shots, delim, logits_fn, encode, bos, max_per_task=-1, max_length=None
):
  """A task's accuracy on ``data`` (a list of examples, shuffled here with Random(1337))."""
  if kind not in TASK_TYPES:
    raise DataError(f"CORE task type {kind!r} is unknown; the bundle has {', '.join(TASK_TYPES)}")
  data = list(data)
  random.Random(1337).shuffle(data)
  if max_per_task > 0:
    data = data[:max_per_task]
  render = {"multiple_choice": render_mc, "schema": render_schema, "language_modeling": render_lm}
  correct = 0
  for idx, item in enumerate(data):
    few = []
    if shots > 0:
      others = [i for i in range(len(data)) if i != idx]
      few = [data[i] for i in random.Random(1234 + idx).sample(others, shots)]
    tokens, starts, ends = example_spans(kind, render[kind](item, delim, few), encode, bos)
    correct += score_example(
      kind, tokens, starts, ends, item.get("gold"), logits_fn, bos, max_length
    )
  return correct / len(data)


def centered(accuracy: float, baseline_percent: float) -> float:
  """``(a - b/100) / (1 - b/100)`` (base_eval.py)."""
  b = 0.01 * baseline_percent
  return (accuracy - b) / (1.0 - b)


def read_bundle(bundle_dir: str) -> list[dict]:
  """The tasks of a local DCLM eval bundle: ``[{label, kind, shots, delim,
  baseline, data}]`` in ``core.yaml``'s order.

  Raises:
    DataError: a missing file, a task without a baseline, a task's data line
      that is not JSON (``FILE:LINE``), or PyYAML missing.
  """
  try:
    import yaml
  except ImportError:
    raise DataError("reading core.yaml needs PyYAML: pip install pyyaml") from None
  paths = {n: os.path.join(bundle_dir, n) for n in ("core.yaml", "eval_meta_data.csv")}
  for name, path in paths.items():
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing; give the unzipped DCLM eval bundle (it has {name})")
  with open(paths["core.yaml"], encoding="utf-8") as f:
    tasks = yaml.safe_load(f)["icl_tasks"]
  with open(paths["eval_meta_data.csv"], encoding="utf-8", newline="") as f:
    baselines = {r["Eval Task"]: float(r["Random baseline"]) for r in csv.DictReader(f)}
  out = []
  for t in tasks:
    label = t["label"]
    if label not in baselines:
      raise DataError(f"eval_meta_data.csv has no 'Random baseline' for CORE task {label!r}")
    path = os.path.join(bundle_dir, "eval_data", t["dataset_uri"])
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing (dataset_uri of CORE task {label!r})")
    data = [row for _, row in utils.json_lines(path, DataError)]
    out.append(
      dict(
        label=label,
        kind=t["icl_task_type"],
        shots=int(t["num_fewshot"][0]),
        delim=t.get("continuation_delimiter", " "),
        baseline=baselines[label],
        data=data,
      )
    )
  return out


def core_metric(tasks, logits_fn, encode, bos, max_per_task=-1, max_length=None) -> dict:
  """``{"results": {label: accuracy}, "centered_results": {label: centred},
  "core_metric": mean centred}`` of :func:`read_bundle`'s ``tasks``."""
  results, cent = {}, {}
  for t in tasks:
    acc = task_accuracy(
      t["data"], t["kind"], t["shots"], t["delim"], logits_fn, encode, bos, max_per_task, max_length
    )
    results[t["label"]], cent[t["label"]] = acc, centered(acc, t["baseline"])
  return {
    "results": results,
    "centered_results": cent,
    "core_metric": float(np.mean(list(cent.values()))),
  }
