"""Language-model evaluations: multiple choice for ``eval.py``, and the text
sample of the validation prompt that ``train.py`` writes at each evaluation.

Multiple-choice files are JSON lines, one question per line::

    {"question": "...", "choices": ["...", "..."], "answer": 1}

(the form of the ARC-Easy, ARC-Challenge and MMLU exports). A question is
answered by the choice with the largest summed log-likelihood
``sum_t log p(choice_t | question, choice_<t)``, each choice preceded by a
space.
"""

from __future__ import annotations

import json
from typing import Any

import flax.linen as nn
import numpy as np

from laplax import sharding
from laplax.errors import UserError
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
  try:
    with open(path) as f:
      lines = f.readlines()
  except OSError as e:
    raise ChoicesError(f"cannot read choices file {path}: {e.strerror}") from None
  items = []
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    where = f"{path} line {n}"
    try:
      item = json.loads(line)
    except json.JSONDecodeError as e:
      raise ChoicesError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(item, dict):
      raise ChoicesError(f"{where}: expected a JSON object with question, choices, answer")
    q, choices, answer = item.get("question"), item.get("choices"), item.get("answer")
    if not isinstance(q, str):
      raise ChoicesError(f"{where}: 'question' must be a string")
    if (not isinstance(choices, list) or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)):
      raise ChoicesError(f"{where}: 'choices' must be a list of at least two non-empty strings")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
      raise ChoicesError(f"{where}: 'answer' must be an index in 0..{len(choices) - 1}")
    items.append({"question": q, "choices": choices, "answer": answer})
  if not items:
    raise ChoicesError(f"{path} has no questions")
  return items


def score_choices(model: Any, params: Any, tokenizer: Any, items: list[dict]) -> dict:
  """Multiple-choice accuracy by summed log-likelihood.

  Returns:
    ``{"choices_accuracy": float, "num_questions": int, "predictions": [int]}``.
  """
  predictions = []
  for item in items:
    context = tokenizer.encode(item["question"])
    scores = [sampling.continuation_logprob(model, params, context,
                                            tokenizer.encode(" " + c))
              for c in item["choices"]]
    predictions.append(int(np.argmax(scores)))
  correct = sum(p == item["answer"] for p, item in zip(predictions, items))
  return {"choices_accuracy": correct / len(items), "num_questions": len(items),
          "predictions": predictions}


def greedy_sample(model: nn.Module, params: Any, tokenizer: Any, prompt: np.ndarray,
                  num_tokens: int) -> str:
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