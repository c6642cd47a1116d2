"""A chat model's answers, generated in batches with nanochat's calculator tool.

:func:`generate_answers` renders each conversation's prompt
(:func:`laplax.proj.nanochat.data.render.render_for_completion`), continues the prompts in
batches with the KV cache (:func:`laplax.models.sampling.generate_batch`),
each row ending at ``<|assistant_end|>`` or ``<|bos|>``, and decodes the new
tokens. As in nanochat's ``Engine.generate`` (``nanochat/engine.py``), the
text between ``<|python_start|>`` and ``<|python_end|>`` is a calculator
call: :func:`use_calculator` evaluates it and, when it gives a result,
``<|output_start|>`` + the tokens of ``str(result)`` + ``<|output_end|>`` are
forced into the row (they count towards ``max_new_tokens``).

:func:`exact_match` scores such answers against the references by their
extracted final answers (GSM8K's and SpellingBee's ``#### N``), and
:func:`generate_and_score` generates answers and scores them in one call.
"""

from __future__ import annotations

import re
import signal
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import tqdm

from laplax.data.errors import DataError
from laplax.models import sampling
from laplax.proj.nanochat.data.render import chat_tokens, render_for_completion

CALCULATOR_CHARS = frozenset("0123456789*+-/.() ")
#: The characters of a string expression (``'strawberry'.count('r')``).
STRING_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ ")
#: Words a string expression may not hold (case-insensitive).
STRING_FORBIDDEN = (
  "__",
  "import",
  "exec",
  "eval",
  "compile",
  "open",
  "file",
  "input",
  "raw_input",
  "globals",
  "locals",
  "vars",
  "dir",
  "getattr",
  "setattr",
  "delattr",
  "hasattr",
)
CALCULATOR_SECONDS = 3
_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"")
_METHOD = re.compile(r"\.\s*([A-Za-z_]\w*)")


def use_calculator(expr: str):
  """nanochat's calculator: the value of ``expr`` (commas removed), or ``None``.

  The expression is evaluated only when it is arithmetic, nothing but the
  characters of :data:`CALCULATOR_CHARS` (digits, operators, point,
  parentheses, space) and no ``**``, or, as nanochat's calculator since its
  SpellingBee (karpathy/nanochat 8892470; the fork's), a string
  ``.count(...)``: the characters of :data:`STRING_CHARS`, ``.count(`` in it
  and none of :data:`STRING_FORBIDDEN`. Unlike nanochat, ``count`` must be
  its only method outside the string literals (``'a'.center(999999999)``,
  which nanochat would allocate, is refused). It runs for at most
  :data:`CALCULATOR_SECONDS` (a timer signal in the main thread), without
  builtins; refused, failing or slow expressions give ``None``."""
  expr = expr.replace(",", "")
  if all(c in CALCULATOR_CHARS for c in expr):
    if "**" in expr:
      return None
  elif (
    any(c not in STRING_CHARS for c in expr)
    or any(w in expr.lower() for w in STRING_FORBIDDEN)
    or ".count(" not in expr
    or set(_METHOD.findall(_LITERAL.sub("''", expr))) != {"count"}
  ):
    return None
  main = threading.current_thread() is threading.main_thread()

  def expired(signum, frame):
    raise TimeoutError(f"{expr!r} took over {CALCULATOR_SECONDS} s")

  previous = signal.signal(signal.SIGALRM, expired) if main else None
  try:
    if main:
      signal.alarm(CALCULATOR_SECONDS)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", SyntaxWarning)
      return eval(expr, {"__builtins__": {}}, {})
  except Exception:  # a wrong expression is the model's mistake, not ours
    return None
  finally:
    if main:
      signal.alarm(0)
      signal.signal(signal.SIGALRM, previous)


class Calculator:
  """The calculator tool's state per row, as the ``tool`` hook of
  :func:`laplax.models.sampling.generate_batch`: ``calculator(row, token)``
  returns the tokens to force after ``token`` (none, or the output block
  after a ``<|python_end|>`` that closes an expression with a result)."""

  def __init__(self, tokenizer: Any):
    self.tokenizer = tokenizer
    special = chat_tokens(tokenizer)
    self.python_start = special["<|python_start|>"]
    self.python_end = special["<|python_end|>"]
    self.output = (special["<|output_start|>"], special["<|output_end|>"])
    self.expression: dict[int, list[int] | None] = {}

  def __call__(self, row: int, token: int) -> list[int]:
    expression = self.expression.get(row)
    if token == self.python_start:
      self.expression[row] = []
    elif token == self.python_end and expression is not None:
      self.expression[row] = None
      if expression:
        result = use_calculator(self.tokenizer.decode(expression))
        if result is not None:
          return [self.output[0], *self.tokenizer.encode(str(result)).tolist(), self.output[1]]
    elif expression is not None:
      expression.append(token)
    return []


def generate_answers(
  model: Any,
  params: Any,
  tokenizer: Any,
  conversations: Sequence[dict],
  *,
  max_new_tokens: int = 512,
  batch_size: int = 8,
  temperature: float = 0.0,
  top_k: int | None = None,
  seed: int = 0,
  calculator: bool = True,
  desc: str = "generating",
  progress: bool = True,
) -> list[str]:
  """The model's answer to each conversation (its last message is replaced).

  Prompts are batched in order of length (``batch_size`` rows, the last
  batch padded), a prompt longer than the context keeps its last
  ``max_length`` tokens. nanochat's evaluation: greedy (``temperature`` 0),
  512 new tokens, the calculator on.

  Returns:
    The decoded new tokens of each conversation, in input order, without
    the stop token.

  Raises:
    laplax.data.errors.DataError: a tokenizer without the chat tokens, a
      malformed conversation.
  """
  special = chat_tokens(tokenizer)
  stops = (special["<|assistant_end|>"], special["<|bos|>"])
  max_length = model.spec.max_length
  prompts = [
    render_for_completion(tokenizer, c, where=f"{desc} item {i}")[-max_length:]
    for i, c in enumerate(conversations)
  ]
  order = sorted(range(len(prompts)), key=lambda i: prompts[i].size)
  answers: list[str] = [""] * len(prompts)
  rng = jax.random.PRNGKey(seed)
  with tqdm.tqdm(total=len(prompts), desc=desc, unit="problem", disable=not progress) as bar:
    for b in range(0, len(order), batch_size):
      chunk = order[b : b + batch_size]
      tool = Calculator(tokenizer) if calculator else None
      rows = sampling.generate_batch(
        model,
        params,
        [prompts[i] for i in chunk],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        rng=jax.random.fold_in(rng, b),
        stop_tokens=stops,
        tool=tool,
        rows=batch_size,
      )
      for i, row in zip(chunk, rows):
        answers[i] = tokenizer.decode(np.asarray(row))
      bar.update(len(chunk))
  return answers


def exact_match(
  conversations: Sequence[dict],
  completions: Sequence[str],
  *,
  extract: Callable[[str], str | None],
  reference: Callable[[dict], str | None],
  missing_matches_missing: bool = False,
) -> dict:
  """Exact-match accuracy of ``completions`` against the conversations'
  references, as nanochat's GSM8K and SpellingBee ``evaluate`` score an answer
  (``tasks/gsm8k.py``, ``tasks/spellingbee.py`` at karpathy/nanochat da32e1d).

  Each completion's answer is ``extract(completion)`` and each reference
  ``reference(conversation)`` (the task's own extraction, in that order: the
  references first, so a malformed one is refused before anything else). An
  answer is right when it equals its reference as a string; an answer of
  ``None`` (none found) is wrong, unless ``missing_matches_missing`` and the
  reference is ``None`` too (nanochat's SpellingBee compares the two
  extractions as they are).

  Returns:
    A dict: ``accuracy`` (float, ``correct / total``, 0.0 for no problems),
    ``correct`` and ``total`` (int), and ``answers``, the extracted
    predictions (``str`` or ``None`` each), in input order.

  Raises:
    DataError: different lengths; whatever ``reference`` raises for a
      malformed conversation.
  """
  if len(conversations) != len(completions):
    raise DataError(f"{len(completions)} completions for {len(conversations)} problems.")
  references = [reference(c) for c in conversations]
  answers = [extract(c) for c in completions]
  correct = sum(
    (a is not None or missing_matches_missing) and a == r for a, r in zip(answers, references)
  )
  total = len(conversations)
  return {
    "accuracy": correct / total if total else 0.0,
    "correct": correct,
    "total": total,
    "answers": answers,
  }


def generate_and_score(
  model: Any,
  params: Any,
  tokenizer: Any,
  conversations: Sequence[dict],
  score: Callable[[Sequence[dict], Sequence[str]], dict],
  *,
  desc: str,
  max_new_tokens: int = 512,
  batch_size: int = 8,
  progress: bool = True,
) -> dict:
  """``score(conversations, completions)`` of the model's greedy answers with
  the calculator (:func:`generate_answers`, nanochat's ``chat_eval``
  settings), for any scorer (:func:`exact_match`, HumanEval's programs);
  ``desc`` names the progress bar. Raises what those two raise."""
  completions = generate_answers(
    model,
    params,
    tokenizer,
    conversations,
    max_new_tokens=max_new_tokens,
    batch_size=batch_size,
    desc=desc,
    progress=progress,
  )
  return score(conversations, completions)
