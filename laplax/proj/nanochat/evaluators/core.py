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
Sequences longer than the model's context keep their last tokens (as nanochat);
the scored tokens (a choice, a continuation) must fit with at least one token
of prompt before them: nanochat asserts it, here an example that does not is
a :class:`DataError` naming the task and the example, found before the model
runs (``eval.py`` prints it as one line and exits 2).

The model enters through ``forward(ids) -> (losses, predictions)``, nanochat's
``forward_model``: for int ``[rows, width]`` ids (rows right-padded with BOS),
``losses[i, t]`` the cross-entropy of ``ids[i, t + 1]`` given ``ids[i, :t + 1]``
(the last column unused) and ``predictions[i, t]`` the argmax at ``t``.
:func:`forward_from_logits` makes one from a logits function (float64 NumPy);
the ``core`` evaluator (:class:`Core`, ``eval.py --config.evals=core``)
computes both on the device.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from laplax import utils
from laplax.data.errors import DataError
from laplax.evaluators.base import EVAL, TRAIN, Context, Evaluator

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
#: The fields of an example of each task type (``gold`` indexes the list field).
FIELDS = {
  "multiple_choice": (("query", str), ("choices", list), ("gold", int)),
  "schema": (("context_options", list), ("continuation", str), ("gold", int)),
  "language_modeling": (("context", str), ("continuation", str)),
}


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


RENDER = {"multiple_choice": render_mc, "schema": render_schema, "language_modeling": render_lm}


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


def forward_from_logits(logits_fn: Callable) -> Callable:
  """nanochat's ``forward_model`` on ``logits_fn(int32 [rows, width]) -> float
  [rows, width, vocab]``: ``(losses, predictions)`` in float64 NumPy."""

  def forward(ids):
    ids = np.asarray(ids)
    logits = np.asarray(logits_fn(ids), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    targets = np.roll(ids, -1, axis=1)
    losses = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    losses[:, -1] = np.nan
    return losses, logits.argmax(-1)

  return forward


def unfit(tokens: Sequence[Sequence[int]], starts: Sequence[int], max_length: int) -> int:
  """The most scored tokens of one example's prompts (``tokens[i][starts[i]:]``)
  when some prompt's do not fit ``max_length`` after at least one token that
  predicts the first of them; 0 when every prompt's do (nanochat's
  ``evaluate_example`` asserts the same of its cropped start)."""
  worst = max(len(t) - s for t, s in zip(tokens, starts))
  return worst if worst > max_length - 1 else 0


def check_fits(label: str, examples: Sequence, max_length: int) -> None:
  """Every example of :func:`task_examples` fits the model's context (:func:`unfit`).

  Raises:
    DataError: the first that does not, naming the task and the example.
  """
  for idx, (tokens, starts, _, _) in enumerate(examples):
    n = unfit(tokens, starts, max_length)
    if n:
      raise DataError(
        f"CORE task {label!r}, example {idx} of the shuffle: its scored tokens ({n}) do not "
        f"fit the model's context of {max_length} tokens after one token of prompt (nanochat "
        "asserts this too); score a model with a longer context, or leave the task out of "
        "core.yaml"
      )


def score_example(kind, tokens, starts, ends, gold, forward, bos, max_length=None) -> bool:
  """Whether the model gets one example right (``forward``: see the module);
  a prompt longer than ``max_length`` keeps its last tokens.

  Raises:
    DataError: the scored tokens do not fit ``max_length`` (:func:`unfit`).
  """
  if max_length is not None:
    if unfit(tokens, starts, max_length):
      raise DataError(
        f"a CORE example's scored tokens ({unfit(tokens, starts, max_length)}) do not fit the "
        f"model's context of {max_length} tokens after one token of prompt"
      )
    crop = [max(0, len(t) - max_length) for t in tokens]
    tokens = [t[c:] for t, c in zip(tokens, crop)]
    starts = [s - c for s, c in zip(starts, crop)]
    ends = [e - c for e, c in zip(ends, crop)]
  width = max(len(t) for t in tokens)
  ids = np.full((len(tokens), width), bos, np.int32)
  for i, t in enumerate(tokens):
    ids[i, : len(t)] = t
  losses, predictions = forward(ids)
  if kind == "language_modeling":
    s, e = starts[0], ends[0]
    return bool(np.all(np.asarray(predictions)[0, s - 1 : e - 1] == ids[0, s:e]))
  losses = np.asarray(losses, np.float64)
  spans = [losses[i, s - 1 : e - 1] for i, (s, e) in enumerate(zip(starts, ends))]
  # An empty span (a choice that is the common prefix) has a NaN mean, and
  # Python's min() of nanochat's list then decides as it does there.
  means = [float(x.mean()) if x.size else float("nan") for x in spans]
  return means.index(min(means)) == gold


def selected(data: Sequence[dict], max_per_task: int = -1) -> list[dict]:
  """The examples a task is scored on: shuffled with ``Random(1337)``, the
  first ``max_per_task`` (all when it is not positive)."""
  data = list(data)
  random.Random(1337).shuffle(data)
  return data[:max_per_task] if max_per_task > 0 else data


def task_examples(task: dict, encode: Callable, bos: int, max_per_task: int = -1) -> list:
  """``(tokens, starts, ends, gold)`` of each example of :func:`selected`
  (its prompts with their few-shot examples, tokenised).

  Raises:
    DataError: no examples, fewer than ``shots + 1``, or a language-modelling
      prompt that does not tokenise as a prefix (naming the task).
  """
  data, label, shots = selected(task["data"], max_per_task), task["label"], task["shots"]
  if not data:
    raise DataError(f"CORE task {label!r} has no examples; its eval_data file is empty")
  if shots > len(data) - 1:
    raise DataError(
      f"CORE task {label!r} asks for {shots} few-shot examples but has {len(data)} "
      f"examples (at most {len(data) - 1} shots; a larger max per task, or more data)"
    )
  out = []
  for idx, item in enumerate(data):
    few = []
    if shots > 0:
      others = [i for i in range(len(data)) if i != idx]
      few = [data[i] for i in random.Random(1234 + idx).sample(others, shots)]
    prompts = RENDER[task["kind"]](item, task["delim"], few)
    try:
      tokens, starts, ends = example_spans(task["kind"], prompts, encode, bos)
    except DataError as e:
      raise DataError(f"CORE task {label!r}, example {idx} of the shuffle: {e}") from None
    out.append((tokens, starts, ends, item.get("gold")))
  return out


def examples_accuracy(kind, examples, forward, bos, max_length=None, progress=None) -> float:
  """The fraction of :func:`task_examples`' ``examples`` the model gets right;
  ``progress``: wraps the iterable (e.g. ``tqdm``)."""
  it = progress(examples) if progress is not None else examples
  right = sum(score_example(kind, *ex, forward, bos, max_length) for ex in it)
  return right / len(examples)


def centered(accuracy: float, baseline_percent: float) -> float:
  """``(a - b/100) / (1 - b/100)`` (base_eval.py)."""
  b = 0.01 * baseline_percent
  return (accuracy - b) / (1.0 - b)


def _check_item(kind: str, item: Any, where: str) -> dict:
  """``item`` if it has the fields of ``kind`` (:data:`FIELDS`), else DataError naming ``where``."""
  if not isinstance(item, dict):
    raise DataError(f"{where}: a CORE {kind} example must be a JSON object")
  for key, typ in FIELDS[kind]:
    value = item.get(key)
    if not isinstance(value, typ) or isinstance(value, bool):
      raise DataError(
        f"{where}: a CORE {kind} example needs {key!r} ({typ.__name__}); "
        f"it has the keys {', '.join(sorted(item)) or 'none'}"
      )
  options = item.get("choices", item.get("context_options"))
  if options is not None:
    if not options or not all(isinstance(o, str) for o in options):
      raise DataError(f"{where}: the options of a CORE {kind} example must be strings")
    if not 0 <= item["gold"] < len(options):
      raise DataError(
        f"{where}: 'gold'={item['gold']} is not an index of its {len(options)} options"
      )
  return item


def _read_yaml(path: str) -> list[dict]:
  try:
    import yaml
  except ImportError:
    raise DataError("reading core.yaml needs PyYAML: pip install pyyaml") from None
  try:
    with open(path, encoding="utf-8") as f:
      doc = yaml.safe_load(f)
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"cannot read {path} ({getattr(e, 'strerror', None) or e})") from None
  except yaml.YAMLError as e:
    raise DataError(f"{path} is not valid YAML ({utils.first_line(e)})") from None
  tasks = doc.get("icl_tasks") if isinstance(doc, dict) else None
  if not isinstance(tasks, list) or not tasks:
    raise DataError(f"{path} has no 'icl_tasks' list; the DCLM bundle's core.yaml has one")
  for i, t in enumerate(tasks):
    where = f"{path}: icl_tasks[{i}]"
    if not isinstance(t, dict):
      raise DataError(f"{where} is not a mapping")
    for key in ("label", "icl_task_type", "dataset_uri", "num_fewshot"):
      if key not in t:
        raise DataError(f"{where} has no {key!r}")
    if t["icl_task_type"] not in TASK_TYPES:
      raise DataError(
        f"{where} ({t['label']}): icl_task_type {t['icl_task_type']!r} is not one of "
        f"{', '.join(TASK_TYPES)}"
      )
    shots = t["num_fewshot"]
    shots = shots[0] if isinstance(shots, list) and shots else shots
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
      raise DataError(f"{where} ({t['label']}): num_fewshot must be a list of integers >= 0")
    if not isinstance(t.get("continuation_delimiter", " "), str):
      raise DataError(f"{where} ({t['label']}): continuation_delimiter must be a string")
  return tasks


def _read_baselines(path: str) -> dict[str, float]:
  columns = ("Eval Task", "Random baseline")
  try:
    with open(path, encoding="utf-8", newline="") as f:
      reader = csv.DictReader(f)
      missing = [c for c in columns if c not in (reader.fieldnames or ())]
      if missing:
        raise DataError(f"{path} has no column {missing[0]!r}; its columns: {reader.fieldnames}")
      baselines = {}
      for row in reader:
        where = f"{path}:{reader.line_num}"
        try:
          value = float(row[columns[1]])
        except (TypeError, ValueError):
          raise DataError(
            f"{where}: 'Random baseline' {row[columns[1]]!r} is not a number (percent)"
          ) from None
        if not value < 100:
          raise DataError(f"{where}: 'Random baseline' {value} must be below 100 (percent)")
        baselines[row[columns[0]]] = value
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise DataError(f"cannot read {path} ({getattr(e, 'strerror', None) or e})") from None
  return baselines


def read_index(bundle_dir: str) -> list[dict]:
  """What a bundle's small files say, without reading the examples: per
  task of ``core.yaml`` ``{label, kind, shots, delim, baseline, path}`` (the
  ``eval_data`` file, which must exist).

  Raises:
    DataError: a missing file or directory, malformed ``core.yaml`` or
      ``eval_meta_data.csv`` (a missing key or column, a baseline that is not
      a number below 100), a task without a baseline or a data file, or
      PyYAML missing.
  """
  if not os.path.isdir(os.path.expanduser(bundle_dir)):
    raise DataError(
      f"the CORE bundle {bundle_dir} is not a directory; give the unzipped DCLM eval "
      "bundle (core.yaml, eval_meta_data.csv, eval_data/)"
    )
  bundle_dir = os.path.expanduser(bundle_dir)
  paths = {n: os.path.join(bundle_dir, n) for n in ("core.yaml", "eval_meta_data.csv")}
  for name, path in paths.items():
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing; give the unzipped DCLM eval bundle (it has {name})")
  tasks = _read_yaml(paths["core.yaml"])
  baselines = _read_baselines(paths["eval_meta_data.csv"])
  out = []
  for t in tasks:
    label = t["label"]
    if label not in baselines:
      raise DataError(f"eval_meta_data.csv has no 'Random baseline' for CORE task {label!r}")
    path = os.path.join(bundle_dir, "eval_data", str(t["dataset_uri"]))
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing (dataset_uri of CORE task {label!r})")
    shots = t["num_fewshot"]
    out.append(
      dict(
        label=label,
        kind=t["icl_task_type"],
        shots=int(shots[0] if isinstance(shots, list) else shots),
        delim=t.get("continuation_delimiter", " "),
        baseline=baselines[label],
        path=path,
      )
    )
  return out


def read_bundle(bundle_dir: str) -> list[dict]:
  """The tasks of a local DCLM eval bundle: :func:`read_index`'s with
  ``data``, the examples, in ``core.yaml``'s order.

  Raises:
    DataError: see :func:`read_index`; a task's data line that is not JSON or
      lacks its type's fields (``FILE:LINE``), a data file without examples.
  """
  out = []
  for t in read_index(bundle_dir):
    where = t["path"]
    data = [_check_item(t["kind"], row, at) for at, row in utils.json_lines(where, DataError)]
    if not data:
      raise DataError(f"{where} holds no examples (CORE task {t['label']!r})")
    out.append(dict(t, data=data))
  return out


def core_metric(tasks, forward, encode, bos, max_per_task=-1, max_length=None) -> dict:
  """``{"results": {label: accuracy}, "centered_results": {label: centred},
  "core_metric": mean centred}`` of :func:`read_bundle`'s ``tasks``
  (``forward``: see the module; :func:`forward_from_logits`). Every task is
  tokenised (and checked) before the model runs."""
  examples = [task_examples(t, encode, bos, max_per_task) for t in tasks]
  if max_length is not None:
    for t, ex in zip(tasks, examples):
      check_fits(t["label"], ex, max_length)
  results, cent = {}, {}
  for t, ex in zip(tasks, examples):
    acc = examples_accuracy(t["kind"], ex, forward, bos, max_length)
    results[t["label"]], cent[t["label"]] = acc, centered(acc, t["baseline"])
  return {
    "results": results,
    "centered_results": cent,
    "core_metric": float(np.mean(list(cent.values()))),
  }


# --------------------------------------------------------------------------
# The evaluator.


def _bucket(n: int, low: int = 1, cap: int | None = None) -> int:
  """The power of two >= ``n`` and ``low`` (at most ``cap``), so that few shapes compile."""
  b = max(low, 1 << max(0, n - 1).bit_length())
  return min(b, cap) if cap else b


def device_forward(model: Any, params: Any, bos: int) -> Callable:
  """``forward`` (see the module) of a laplax GPT: one jitted function giving
  the float32 losses and the argmax on the device (the ``[rows, width,
  vocab]`` logits never leave it), on ids padded with ``bos`` to powers of
  two of rows and width (at least 128 and at most the context wide)."""
  import jax
  import jax.numpy as jnp

  @jax.jit
  def scores(params, ids):
    logits, _ = model.apply({"params": params}, ids)
    logits = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    targets = jnp.roll(ids, -1, axis=1)
    losses = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return losses, jnp.argmax(logits, axis=-1)

  max_length = model.spec.max_length

  def forward(ids):
    rows, width = ids.shape
    padded = np.full((_bucket(rows), _bucket(width, 128, max_length)), bos, np.int32)
    padded[:rows, :width] = ids
    losses, predictions = scores(params, padded)
    losses = np.array(losses[:rows, :width], np.float64)
    losses[:, -1] = np.nan
    return losses, np.asarray(predictions[:rows, :width])

  return forward


def bos_token(tokenizer: Any) -> int:
  """The token that starts every CORE prompt and pads the rows:
  ``<|bos|>`` (nanochat's tokenizer), else the last token of ``"\\n\\n"``,
  the separator laplax's text corpora put between documents."""
  bos = getattr(tokenizer, "bos_id", None)
  return int(bos) if bos is not None else int(np.asarray(tokenizer.encode("\n\n"))[-1])


class Core(Evaluator):
  """``core``: nanochat's CORE score of a base model on a local DCLM eval
  bundle (:func:`read_bundle`; ``eval.py --config.evals=core
  --config.eval.core_bundle=DIR``).

  Settings: ``eval.core_bundle`` (the unzipped bundle's directory; required),
  ``eval.core_max_per_task`` (examples per task, the first of the
  ``Random(1337)`` shuffle; 500 as nanochat's CORE during training, 0: all,
  as ``base_eval.py`` and the fork's sweep). Every prompt starts with
  :func:`bos_token` and keeps its last ``max_length`` tokens.

  Reports ``core_metric`` (the mean centred accuracy), ``core_centered`` and
  ``core_accuracy`` (by task label) and ``core_examples`` (examples scored
  per task). ``eval.core_every`` (steps; 0, the default: ``eval.py`` only, as
  the fork's sweep scores CORE once, at the end of training) also scores it
  in the training loop at the evaluations whose step is a multiple of it and
  at the last step, as nanochat's ``base_train.py`` does with
  ``--core-metric-every`` (2000 there, with 500 examples per task); it must
  be a multiple of ``eval_every``.
  """

  name = "core"
  stages = (TRAIN, EVAL)
  tasks = ("lm",)
  defaults = {"core_bundle": "", "core_max_per_task": 500, "core_every": 0}

  @classmethod
  def runs_at(cls, stage: str, config) -> bool:
    """``eval.py`` always; the training loop when ``eval.core_every`` > 0 (a
    completed config: :func:`laplax.evaluators.registry.complete`)."""
    return stage == EVAL or (stage == TRAIN and config.eval.core_every > 0)

  @classmethod
  def validate(cls, config) -> None:
    """``core_bundle`` a directory whose ``core.yaml`` and
    ``eval_meta_data.csv`` are readable (:func:`read_index`; the examples
    are read by :meth:`prepare`), ``core_max_per_task`` an integer >= 0.

    Raises:
      ConfigError: the first bad key.
      DataError: a malformed bundle.
    """
    from laplax.config import validation as config_lib

    bundle = config.eval.core_bundle
    config_lib.require(
      isinstance(bundle, str) and bundle.strip() != "",
      "core needs the DCLM eval bundle: --config.eval.core_bundle=DIR (the unzipped "
      "eval_bundle with core.yaml, eval_meta_data.csv and eval_data/)",
    )
    config_lib.require(
      os.path.isdir(os.path.expanduser(bundle)),
      f"--config.eval.core_bundle={bundle} is not a directory",
    )
    config_lib.check_int(config, "eval.core_max_per_task", 0)
    config_lib.check_int(config, "eval.core_every", 0)
    every = config.eval.core_every
    config_lib.require(
      every == 0 or every % config.eval_every == 0,
      f"--config.eval.core_every={every} is not a multiple of eval_every="
      f"{config.eval_every}: CORE runs at evaluations only; use a multiple, or 0 (eval.py only)",
    )
    read_index(bundle)  # its small files, so a bad bundle fails before training

  def prepare(self) -> None:
    """Reads the bundle and tokenises every task's prompts.

    Raises:
      DataError: see :func:`read_bundle`, :func:`task_examples` and
        :func:`check_fits` (an example that does not fit the model's context).
    """
    e, tok = self.settings, self.task.tokenizer
    self.bos = bos_token(tok)
    encode = lambda text: np.asarray(tok.encode(text)).tolist()  # noqa: E731
    self.bundle = read_bundle(e["core_bundle"])
    self.examples = [
      task_examples(t, encode, self.bos, e["core_max_per_task"]) for t in self.bundle
    ]
    for t, examples in zip(self.bundle, self.examples):
      check_fits(t["label"], examples, self.task.model.spec.max_length)

  def run(self, state: Any, ctx: Context) -> dict:
    every = self.settings["core_every"]
    if ctx.step is not None and ctx.step % every and ctx.step != self.config.total_steps:
      return {}  # a training evaluation between two CORE steps
    import tqdm

    forward = device_forward(self.task.model, state.params, self.bos)
    accuracy, centred, counts = {}, {}, {}
    for t, examples in zip(self.bundle, self.examples):
      label = t["label"]
      accuracy[label] = examples_accuracy(
        t["kind"],
        examples,
        forward,
        self.bos,
        self.task.model.spec.max_length,
        progress=lambda it, label=label: tqdm.tqdm(it, desc=f"CORE {label}", unit="example"),
      )
      centred[label] = centered(accuracy[label], t["baseline"])
      counts[label] = len(examples)
    return {
      "core_metric": float(np.mean(list(centred.values()))),
      "core_centered": centred,
      "core_accuracy": accuracy,
      "core_examples": counts,
    }
