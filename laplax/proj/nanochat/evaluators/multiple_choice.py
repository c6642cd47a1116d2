"""ARC-Easy, ARC-Challenge and MMLU as nanochat scores a chat model on them
(``scripts/chat_eval.py``, ``run_categorical_eval``).

Each question is a conversation from :mod:`laplax.proj.nanochat.data.sources` (the
user message :func:`~laplax.proj.nanochat.data.sources.render_mc`, the assistant's
the answer letter). Its prompt (:func:`laplax.proj.nanochat.data.render.render_for_completion`,
ending with ``<|assistant_start|>``) goes through the model in batches of
``batch_size``, right-padded with ``<|bos|>`` (attention is causal, so the
padding after a row's last token cannot change its logits); the logits at
the row's last position, ``<|assistant_start|>``, restricted to the tokens
of the question's letters (each letter must be one token, without a leading
space), give the prediction by argmax (ties: the first letter). Accuracy is
the fraction predicted right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from laplax.data.errors import DataError
from laplax.proj.nanochat.data.render import chat_tokens, render_for_completion

_LOGITS_CACHE: dict = {}


def letter_ids(tokenizer: Any, letters: Sequence[str]) -> list[int]:
  """The token id of each letter.

  Raises:
    DataError: a letter that is not exactly one token.
  """
  ids = []
  for letter in letters:
    encoded = tokenizer.encode(letter)
    if len(encoded) != 1:
      raise DataError(
        f"The choice letter {letter!r} is {len(encoded)} tokens; nanochat's "
        "multiple-choice scoring needs one token per letter."
      )
    ids.append(int(encoded[0]))
  return ids


def answer_logits(
  model: Any,
  params: Any,
  prompts: Sequence[np.ndarray],
  pad_id: int,
  batch_size: int = 8,
  desc: str = "multiple choice",
  progress: bool = True,
) -> np.ndarray:
  """float32 ``[len(prompts), vocab]``: each prompt's next-token logits at its
  last token, in batches of ``batch_size`` rows right-padded with ``pad_id``
  to a power-of-two width (at most ``max_length``; a longer prompt keeps its
  last ``max_length`` tokens). The last batch is padded with empty rows."""
  max_length = model.spec.max_length
  prompts = [np.asarray(p, np.int32)[-max_length:] for p in prompts]
  if model not in _LOGITS_CACHE:

    def last_logits(params, tokens, last):
      logits, _ = model.apply({"params": params}, tokens)
      return jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]

    _LOGITS_CACHE[model] = jax.jit(last_logits)
  forward = _LOGITS_CACHE[model]
  out = []
  for b in tqdm.trange(0, len(prompts), batch_size, desc=desc, unit="batch", disable=not progress):
    chunk = prompts[b : b + batch_size]
    longest = max(p.size for p in chunk)
    width = min(max_length, 1 << (longest - 1).bit_length())
    tokens = np.full((batch_size, width), pad_id, np.int32)
    last = np.zeros(batch_size, np.int32)
    for i, p in enumerate(chunk):
      tokens[i, : p.size], last[i] = p, p.size - 1
    out.append(np.asarray(forward(params, tokens, last))[: len(chunk)])
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def evaluate(
  model: Any,
  params: Any,
  tokenizer: Any,
  conversations: Sequence[dict],
  batch_size: int = 8,
  desc: str = "multiple choice",
  progress: bool = True,
) -> dict:
  """Accuracy of the letter predictions (see the module docstring).

  Args:
    conversations: questions with ``"letters"`` and the answer letter as
      the last (assistant) message.

  Returns:
    A dict: ``accuracy`` (float), ``correct`` and ``total`` (int), and
    ``predictions``, the predicted letter of each question.

  Raises:
    DataError: no chat tokens in the tokenizer, a conversation without
      letters or whose answer is not among them, a multi-token letter.
  """
  special = chat_tokens(tokenizer)
  prompts, choices, answers = [], [], []
  for i, conversation in enumerate(conversations):
    where = f"{desc} item {i}"
    letters = conversation.get("letters")
    answer = conversation["messages"][-1].get("content")
    if not letters or answer not in letters:
      raise DataError(f"{where}: needs 'letters' and an answer among them (got {answer!r}).")
    prompts.append(render_for_completion(tokenizer, conversation, where=where))
    choices.append((list(letters), letter_ids(tokenizer, letters)))
    answers.append(answer)
  logits = answer_logits(model, params, prompts, special["<|bos|>"], batch_size, desc, progress)
  predictions = [letters[int(np.argmax(row[ids]))] for row, (letters, ids) in zip(logits, choices)]
  correct = sum(p == a for p, a in zip(predictions, answers))
  return {
    "accuracy": correct / len(answers) if answers else 0.0,
    "correct": correct,
    "total": len(answers),
    "predictions": predictions,
  }
