"""Language-model evaluations: multiple choice for ``eval.py``, and the text
sample of the validation prompt that ``train.py`` writes at each evaluation.

Two evaluators: ``samples`` (:class:`Samples`) and ``multiple_choice``
(:class:`MultipleChoice`). Multiple-choice files are JSON lines, one question per line::

    {"question": "...", "choices": ["...", "..."], "answer": 1}

(the form of the ARC-Easy, ARC-Challenge and MMLU exports). A question is
answered by the choice with the largest summed log-likelihood
``sum_t log p(choice_t | question, choice_<t)``, each choice preceded by a
space.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import numpy as np

from laplax import sharding, utils
from laplax.config import validation as config_lib
from laplax.errors import UserError
from laplax.evaluators.base import EVAL, TRAIN, Context, Evaluator
from laplax.models import sampling


class ChoicesError(UserError, ValueError):
  """A malformed multiple-choice file; the message names the line."""


def read_choices(path: str) -> list[dict]:
  """Reads and checks a multiple-choice JSON-lines file.

  Returns:
    A list of ``{"question": str, "choices": list[str], "answer": int}``.

  Raises:
    ChoicesError: unreadable file, bad JSON, missing or mistyped fields, an
      answer index out of range (the message names the line number).
  """
  items = []
  for where, item in utils.json_lines(path, ChoicesError):
    if not isinstance(item, dict):
      raise ChoicesError(f"{where}: expected a JSON object with question, choices, answer")
    q, choices, answer = item.get("question"), item.get("choices"), item.get("answer")
    if not isinstance(q, str):
      raise ChoicesError(f"{where}: 'question' must be a string")
    if (
      not isinstance(choices, list)
      or len(choices) < 2
      or not all(isinstance(c, str) and c for c in choices)
    ):
      raise ChoicesError(f"{where}: 'choices' must be a list of at least two non-empty strings")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
      raise ChoicesError(f"{where}: 'answer' must be an index in 0..{len(choices) - 1}")
    items.append({"question": q, "choices": choices, "answer": answer})
  if not items:
    raise ChoicesError(f"{path} has no questions")
  return items


def _check_fits(encoded: list, max_length: int) -> None:
  """Every choice can be scored: a question of at least one token (the first
  choice token's condition), a choice of fewer tokens than the context."""
  for n, (context, choices) in enumerate(encoded, 1):
    if context.size == 0:
      raise ChoicesError(
        f"question {n} is empty: a choice's first token needs a question to follow; "
        "give the question's text"
      )
    for k, choice in enumerate(choices):
      if choice.size >= max_length:
        raise ChoicesError(
          f"question {n}, choice {k}: {choice.size} tokens, but the model's context is "
          f"{max_length} (a choice may have at most {max_length - 1}); shorten it"
        )


def score_choices(model: Any, params: Any, tokenizer: Any, items: list[dict]) -> dict:
  """Multiple-choice accuracy by summed log-likelihood (a question longer
  than the context keeps its last tokens).

  Returns:
    ``{"choices_accuracy": float, "num_questions": int, "predictions": [int]}``.

  Raises:
    ChoicesError: an empty question, or a choice that does not fit the
      model's context after one token of question; before anything is scored.
  """
  encoded = [
    (
      np.asarray(tokenizer.encode(item["question"])),
      [np.asarray(tokenizer.encode(" " + c)) for c in item["choices"]],
    )
    for item in items
  ]
  _check_fits(encoded, model.spec.max_length)
  predictions = []
  for context, choices in encoded:
    scores = [sampling.continuation_logprob(model, params, context, c) for c in choices]
    predictions.append(int(np.argmax(scores)))
  correct = sum(p == item["answer"] for p, item in zip(predictions, items))
  return {
    "choices_accuracy": correct / len(items),
    "num_questions": len(items),
    "predictions": predictions,
  }


def greedy_sample(
  model: nn.Module, params: Any, tokenizer: Any, prompt: np.ndarray, num_tokens: int
) -> str:
  """The text of ``prompt`` (int32 ``[k]`` token ids) and of ``num_tokens``
  tokens decoded greedily after it with the KV cache
  (:func:`laplax.models.sampling.generate`, temperature 0).

  In training every device of the mesh computes the whole sample: the
  parameters are replicated first (:func:`laplax.sharding.replicated`, a
  collective: every process calls this), and no logical axis rules apply (a
  batch of one is not split).
  """
  params = sharding.replicated(params)
  with nn.logical_axis_rules(()):
    out = sampling.generate(model, params, prompt, max_new_tokens=num_tokens, temperature=0.0)
  return tokenizer.decode(prompt) + tokenizer.decode(out)


class Samples(Evaluator):
  """``samples``: ``{"sample": text}``, the first ``eval.sample_prompt_tokens``
  tokens of the validation text (at most half the context) continued by
  ``eval.sample_tokens`` greedily decoded tokens (:func:`greedy_sample`),
  into TensorBoard and ``metrics.jsonl``. The same prompt at every
  evaluation, so a run's samples show its text change; none when
  ``eval.sample_tokens`` is 0. Training only (``eval.py --sample`` samples)."""

  name = "samples"
  stages = (TRAIN,)
  tasks = ("lm",)
  defaults = {"sample_tokens": 64, "sample_prompt_tokens": 16}

  @classmethod
  def validate(cls, config) -> None:
    """``eval.sample_tokens`` >= 0, ``eval.sample_prompt_tokens`` >= 1 (integers).

    Raises:
      ConfigError: the first bad key.
    """
    for key, low, fix in (
      ("sample_tokens", 0, "tokens sampled at each evaluation, 0 for none"),
      ("sample_prompt_tokens", 1, "validation tokens that prompt the sample"),
    ):
      value = config.eval[key]
      config_lib.require(
        isinstance(value, int) and not isinstance(value, bool) and value >= low,
        f"config.eval.{key}={value!r} must be an integer >= {low}: {fix}",
      )

  def run(self, state: Any, ctx: Context) -> dict:
    del state, ctx
    return {}

  def texts(self, state: Any) -> dict[str, str]:
    e = self.settings
    if e["sample_tokens"] <= 0:
      return {}
    k = max(1, min(int(e["sample_prompt_tokens"]), self.task.seq_len // 2))
    prompt = next(iter(self.task.eval_batches()))["tokens"][0, :k]
    return {
      "sample": greedy_sample(
        self.task.model, state.params, self.task.tokenizer, prompt, e["sample_tokens"]
      )
    }


class MultipleChoice(Evaluator):
  """``multiple_choice``: accuracy on a JSON-lines file of questions by summed
  log-likelihood of each choice (:func:`score_choices`). ``eval.py --choices
  FILE`` adds it, with the file's items (no config names it)."""

  name = "multiple_choice"
  stages = (EVAL,)

  def __init__(self, task, items: list[dict]):
    super().__init__(task)
    self.items = items

  def run(self, state: Any, ctx: Context) -> dict:
    del ctx
    result = score_choices(self.task.model, state.params, self.task.tokenizer, self.items)
    return {
      "choices_accuracy": result["choices_accuracy"],
      "num_questions": result["num_questions"],
    }
