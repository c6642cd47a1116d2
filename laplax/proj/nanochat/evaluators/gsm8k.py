"""GSM8K as nanochat scores a chat model on it (``tasks/gsm8k.py``).

The model answers each problem
(:func:`~laplax.proj.nanochat.evaluators.generation.generate_answers`: greedy, 512 new
tokens, the calculator tool). An answer
is the first match of ``#### (-?[0-9.,]+)`` holding a digit (:data:`ANSWER`),
stripped, its commas removed (the normalisation of OpenAI's
``grade_school_math``); it is right when it equals, as a string, the same
extraction from the reference solution's last text part. A completion
without an answer is never right, and a reference without one is refused
(when the data is read, :func:`laplax.proj.nanochat.data.sources.gsm8k`, and again
here). Accuracy is the fraction right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laplax.data.errors import DataError
from laplax.proj.nanochat.data.sources import GSM8K_ANSWER
from laplax.proj.nanochat.evaluators.generation import exact_match, generate_and_score

ANSWER = GSM8K_ANSWER


def extract_answer(text: str) -> str | None:
  """The number after the first ``#### `` in ``text``, commas removed
  (``"#### 1,234.5"`` -> ``"1234.5"``), or ``None``."""
  match = ANSWER.search(text)
  return match.group(1).strip().replace(",", "") if match else None


def reference_answer(conversation: dict) -> str:
  """The reference answer: :func:`extract_answer` of the last part of the
  conversation's final (assistant) message.

  Raises:
    DataError: the last message is not an assistant message with parts, or
      its last part has no ``#### NUMBER`` answer.
  """
  message = conversation["messages"][-1]
  content = message.get("content")
  if message.get("role") != "assistant" or not isinstance(content, list) or not content:
    raise DataError(
      "A GSM8K conversation must end with the assistant's solution as parts "
      "(see laplax.proj.nanochat.data.sources.gsm8k)."
    )
  answer = extract_answer(content[-1].get("text", "")) if isinstance(content[-1], dict) else None
  if answer is None:
    raise DataError(
      "A GSM8K reference solution has no '#### NUMBER' answer in its last part; "
      "fix the data (laplax.proj.nanochat.data.sources.gsm8k refuses such rows)."
    )
  return answer


def score(conversations: Sequence[dict], completions: Sequence[str]) -> dict:
  """Exact-match accuracy of ``completions`` against the references
  (:func:`laplax.proj.nanochat.evaluators.generation.exact_match` with :func:`extract_answer`
  and :func:`reference_answer`); a completion without an answer is wrong.

  Raises:
    DataError: different lengths; a reference without an answer.

  Returns:
    A dict: ``accuracy`` (float), ``correct`` and ``total`` (int), and
    ``answers``, the extracted predictions (``str`` or ``None`` each).
  """
  return exact_match(conversations, completions, extract=extract_answer, reference=reference_answer)


def evaluate(
  model: Any,
  params: Any,
  tokenizer: Any,
  conversations: Sequence[dict],
  *,
  max_new_tokens: int = 512,
  batch_size: int = 8,
  progress: bool = True,
) -> dict:
  """:func:`score` of the model's greedy answers with the calculator
  (:func:`laplax.proj.nanochat.evaluators.generation.generate_and_score`)."""
  return generate_and_score(
    model,
    params,
    tokenizer,
    conversations,
    score,
    desc="GSM8K",
    max_new_tokens=max_new_tokens,
    batch_size=batch_size,
    progress=progress,
  )
