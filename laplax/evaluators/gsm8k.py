"""GSM8K as nanochat scores a chat model on it (``tasks/gsm8k.py``).

The model answers each problem
(:func:`~laplax.evaluators.generation.generate_answers`: greedy, 512 new tokens, the calculator tool). An answer
is the first match of ``#### (-?[0-9.,]+)`` (:data:`ANSWER`), stripped, its
commas removed (the normalisation of OpenAI's ``grade_school_math``); it is
right when it equals, as a string, the same extraction from the reference
solution's last text part. Accuracy is the fraction right.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from laplax.data.errors import DataError
from laplax.evaluators.generation import generate_answers

ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_answer(text: str) -> str | None:
  """The number after the first ``#### `` in ``text``, commas removed
  (``"#### 1,234.5"`` -> ``"1234.5"``), or ``None``."""
  match = ANSWER.search(text)
  return match.group(1).strip().replace(",", "") if match else None


def reference_answer(conversation: dict) -> str | None:
  """The reference answer: :func:`extract_answer` of the last part of the
  conversation's final (assistant) message.

  Raises:
    DataError: the last message is not an assistant message with parts.
  """
  message = conversation["messages"][-1]
  content = message.get("content")
  if message.get("role") != "assistant" or not isinstance(content, list) or not content:
    raise DataError("A GSM8K conversation must end with the assistant's solution as parts "
                    "(see laplax.data.chat.sources.gsm8k).")
  return extract_answer(content[-1]["text"])


def score(conversations: Sequence[dict], completions: Sequence[str]) -> dict:
  """Exact-match accuracy of ``completions`` against the references.

  Returns:
    A dict: ``accuracy`` (float), ``correct`` and ``total`` (int), and
    ``answers``, the extracted predictions (``str`` or ``None`` each).
  """
  if len(conversations) != len(completions):
    raise DataError(f"{len(completions)} completions for {len(conversations)} problems.")
  answers = [extract_answer(c) for c in completions]
  correct = sum(a == reference_answer(c) for a, c in zip(answers, conversations))
  total = len(conversations)
  return {"accuracy": correct / total if total else 0.0, "correct": correct, "total": total,
          "answers": answers}


def evaluate(model: Any, params: Any, tokenizer: Any, conversations: Sequence[dict], *,
             max_new_tokens: int = 512, batch_size: int = 8, progress: bool = True) -> dict:
  """:func:`score` of the model's greedy answers with the calculator."""
  completions = generate_answers(model, params, tokenizer, conversations,
                                 max_new_tokens=max_new_tokens, batch_size=batch_size,
                                 desc="GSM8K", progress=progress)
  return score(conversations, completions)
