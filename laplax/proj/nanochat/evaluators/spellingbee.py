"""SpellingBee as nanochat scores a chat model on it (``tasks/spellingbee.py`` at
karpathy/nanochat da32e1d; ``scripts/chat_eval.py`` runs its test split with
``size=256``).

Problem ``index`` of split ``split`` is made by ``random.Random(seed)``,
``seed = index`` for ``"train"`` and ``10,000,000 + index`` for ``"test"``
(:data:`TEST_RANDOM_SEED_OFFSET`), drawing in nanochat's order: a word of the
word list (the dwyl ``english-words`` ``words_alpha.txt``, one word a line,
which nanochat downloads; here a local file), a letter of it (90%) or of the
alphabet (10%), one of nanochat's :data:`USER_MSG_TEMPLATES`, lower-cased in
30% of problems, quotes (none, ``'`` or ``"``) around the letter and the word,
a ``?`` in 50%. The reference answer spells the word, counts by hand, checks
with a calculator call ``'word'.count('letter')`` and ends ``#### N``.

The model answers greedily with the calculator
(:func:`laplax.proj.nanochat.evaluators.generation.generate_answers`; nanochat's calculator
evaluates ``.count(...)`` of a string literal since this task). An answer is
right when nanochat's :func:`extract_answer` (the number after the first ``####``, its
commas removed) of the completion equals that of the reference's last part;
ChatCORE counts it with chance 0.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from typing import Any

from laplax.data.errors import DataError
from laplax.proj.nanochat.evaluators.generation import exact_match, generate_and_score

#: The alphabet of the 10% of problems whose letter is drawn at random.
LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: Added to the index of a test problem for its seed (more than the list's 370K words).
TEST_RANDOM_SEED_OFFSET = 10_000_000
#: nanochat's answer pattern (the same as its GSM8K's).
ANSWER_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
#: The file nanochat reads (``WORD_LIST_URL``'s last part).
WORD_LIST_FILE = "words_alpha.txt"

#: nanochat's user-message templates, in its order (the draw picks by position).
USER_MSG_TEMPLATES = [
  "How many {letter} are in the word {word}",
  "How many {letter} are in {word}",
  "Count the number of {letter} in {word}",
  "How many times does {letter} appear in {word}",
  "What's the count of {letter} in {word}",
  "In the word {word}, how many {letter} are there",
  "How many letter {letter} are in the word {word}",
  "Count how many {letter} appear in {word}",
  "Tell me the number of {letter} in {word}",
  "How many occurrences of {letter} are in {word}",
  "Find the count of {letter} in {word}",
  "Can you count the {letter} letters in {word}",
  "What is the frequency of {letter} in {word}",
  "How many {letter}s are in {word}",
  "How many {letter}'s are in {word}",
  "Count all the {letter} in {word}",
  "How many times is {letter} in {word}",
  "Number of {letter} in {word}",
  "Total count of {letter} in {word}",
  "How many {letter} does {word} have",
  "How many {letter} does {word} contain",
  "What's the number of {letter} in {word}",
  "{word} has how many {letter}",
  "In {word}, count the {letter}",
  "How many {letter} appear in {word}",
  "Count the {letter} in {word}",
  "Give me the count of {letter} in {word}",
  "How many instances of {letter} in {word}",
  "Show me how many {letter} are in {word}",
  "Calculate the number of {letter} in {word}",
  # Spanish
  "¿Cuántas {letter} hay en {word}?",
  "¿Cuántas veces aparece {letter} en {word}?",
  "Cuenta las {letter} en {word}",
  "¿Cuántas letras {letter} tiene {word}?",
  # Chinese (Simplified)
  "{word}中有多少个{letter}",
  "{word}里有几个{letter}",
  "数一下{word}中的{letter}",
  "{word}这个词里有多少{letter}",
  # Korean
  "{word}에 {letter}가 몇 개 있나요",
  "{word}에서 {letter}의 개수는",
  "{word}에 {letter}가 몇 번 나오나요",
  "{word}라는 단어에 {letter}가 몇 개",
  # French
  "Combien de {letter} dans {word}",
  "Combien de fois {letter} apparaît dans {word}",
  "Compte les {letter} dans {word}",
  # German
  "Wie viele {letter} sind in {word}",
  "Wie oft kommt {letter} in {word} vor",
  "Zähle die {letter} in {word}",
  # Japanese
  "{word}に{letter}は何個ありますか",
  "{word}の中に{letter}がいくつ",
  "{word}に{letter}が何回出てくる",
]


def extract_answer(completion: str) -> str | None:
  """The number after the first ``####`` and a space (nanochat's :data:`ANSWER_RE`),
  stripped, its commas removed; ``None`` without one."""
  match = ANSWER_RE.search(completion)
  return match.group(1).strip().replace(",", "") if match else None


def read_words(path: str) -> list[str]:
  """The word list, one word a line (each line stripped, as nanochat reads it).

  Raises:
    DataError: the file is missing or unreadable, has a blank line (nanochat
      would draw an empty word) or no word.
  """
  try:
    with open(os.path.expanduser(path), encoding="utf-8") as f:
      words = [line.strip() for line in f]
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(
      f"cannot read the SpellingBee word list {path} ({getattr(e, 'strerror', None) or e}); "
      f"give dwyl english-words' {WORD_LIST_FILE} (one word a line)"
    ) from None
  if not words:
    raise DataError(f"the SpellingBee word list {path} has no words")
  blank = next((i for i, w in enumerate(words, 1) if not w), None)
  if blank is not None:
    raise DataError(f"{path}:{blank} is blank; the SpellingBee word list has one word a line")
  return words


def problem(words: Sequence[str], index: int, split: str = "test") -> dict:
  """Problem ``index`` of ``split`` (``"train"`` or ``"test"``): the
  conversation, the user's question and the assistant's reference answer as
  parts (text, python, python_output, text), as nanochat's ``get_example``
  makes it."""
  if split not in ("train", "test"):
    raise ValueError(f"SpellingBee split must be train or test, not {split!r}")
  rng = random.Random(index if split == "train" else TEST_RANDOM_SEED_OFFSET + index)
  word = rng.choice(words)
  letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(LETTERS)
  count = word.count(letter)
  template = rng.choice(USER_MSG_TEMPLATES)
  if rng.random() < 0.3:
    template = template.lower()
  quotes = ["", "'", '"']
  letter_quote, word_quote = rng.choice(quotes), rng.choice(quotes)
  user = template.format(
    letter=f"{letter_quote}{letter}{letter_quote}", word=f"{word_quote}{word}{word_quote}"
  )
  if rng.random() < 0.5:
    user += "?"
  manual = (
    f"We are asked to find the number '{letter}' in the word '{word}'. Let me try a manual "
    f"approach first.\n\nFirst spell the word out:\n{word}:{','.join(word)}\n\n"
    f"Then count the occurrences of '{letter}':\n"
  )
  running = 0
  for i, char in enumerate(word, 1):
    if char == letter:
      running += 1
      manual += f"{i}:{char} hit! count={running}\n"  # no space: " a" is another token
    else:
      manual += f"{i}:{char}\n"
  manual += f"\nThis gives us {running}."
  parts = [
    {"type": "text", "text": manual},
    {"type": "text", "text": "\n\nLet me double check this using Python:\n\n"},
    {"type": "python", "text": f"'{word}'.count('{letter}')"},
    {"type": "python_output", "text": str(count)},
    {
      "type": "text",
      "text": f"\n\nPython gives us {count}.\n\nMy final answer is:\n\n#### {count}",
    },
  ]
  return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": parts}]}


def problems(words: Sequence[str], size: int = 256, split: str = "test") -> list[dict]:
  """Problems 0 to ``size - 1`` of ``split`` (nanochat's chat_eval: 256 of the test split)."""
  return [problem(words, i, split) for i in range(size)]


def reference_answer(conversation: dict) -> str | None:
  """:func:`extract_answer` of the last part of the conversation's last
  message (the reference's ``#### N``), ``None`` without one."""
  return extract_answer(conversation["messages"][-1]["content"][-1]["text"])


def score(conversations: Sequence[dict], completions: Sequence[str]) -> dict:
  """Scores ``completions`` as nanochat's SpellingBee (its ``evaluate``): right
  when the completion's :func:`extract_answer` equals the reference's
  (:func:`reference_answer`), two missing answers included, as nanochat
  compares them (:func:`laplax.proj.nanochat.evaluators.generation.exact_match`).

  Returns:
    ``accuracy``, ``correct``, ``total`` and ``answers`` (the extracted
    predictions).

  Raises:
    DataError: different lengths.
  """
  return exact_match(
    conversations,
    completions,
    extract=extract_answer,
    reference=reference_answer,
    missing_matches_missing=True,
  )


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
    desc="SpellingBee",
    max_new_tokens=max_new_tokens,
    batch_size=batch_size,
    progress=progress,
  )
