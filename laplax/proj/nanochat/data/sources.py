"""The chat stages' data sets read from local files in their published formats,
as nanochat's conversations (Karpathy's nanochat, ``tasks/*.py``).

* :func:`smoltalk`: ``HuggingFaceTB/smol-smoltalk`` (column ``messages``):
  the messages as they are;
* :func:`mmlu`: ``cais/mmlu`` (``all``, and ``auxiliary_train`` whose rows
  are nested under ``train``; ``question``, ``choices``, ``answer`` an
  index): the user message :func:`render_mc`, the assistant's the answer
  letter, letters ``A``-``D``;
* :func:`arc`: ``allenai/ai2_arc`` (``question``, ``choices.text``,
  ``choices.label``, ``answerKey``): the same, the letters being the labels
  (A-E or 1-4);
* :func:`gsm8k`: ``openai/gsm8k`` main (``question``, ``answer``): the
  answer with each ``<<expr=result>>`` as a python part and a python_output
  part.

Files: ``.parquet`` (Hugging Face's layout) or JSON lines (``.jsonl``,
``.jsonl.gz``); a path may be one file or a directory (its files of these
kinds, sorted, recursively). :func:`find_split` finds a split in a data
directory laid out as the Hugging Face repositories are, e.g.
``DIR/ai2_arc/ARC-Easy/test-00000-of-00001.parquet``. Nothing is downloaded.

Bad files raise :class:`~laplax.data.errors.DataError` with one line: a
malformed JSON line (named ``FILE:LINE``), a parquet file without an
expected column, a row whose fields have the wrong types.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

import numpy as np

from laplax import utils
from laplax.data.errors import DataError
from laplax.proj.nanochat.data.render import check_conversation

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz")
MMLU_LETTERS = ("A", "B", "C", "D")
SHUFFLE_SEED = 42  # nanochat shuffles every data set with seed 42
_CALCULATOR = re.compile(r"(<<[^>]+>>)")


def data_files(path: str) -> list[str]:
  """``path`` itself, or the ``.parquet`` / ``.jsonl`` / ``.jsonl.gz`` files under
  the directory ``path`` (sorted, recursively).

  Raises:
    DataError: no such path, or a directory without such files.
  """
  path = os.path.expanduser(path)
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise DataError(f"No such file or directory: {path}.")
  files = sorted(
    f
    for f in glob.glob(os.path.join(glob.escape(path), "**", "*"), recursive=True)
    if f.endswith(SUFFIXES) and os.path.isfile(f)
  )
  if not files:
    raise DataError(f"{path} holds no {', '.join(SUFFIXES)} file; give the data set's files.")
  return files


def find_split(data_dir: str, subset: str, split: str, layout: str) -> list[str]:
  """The files of ``split`` of ``subset`` under ``data_dir``: files named
  ``SPLIT*`` with a known suffix in a directory named ``subset`` (at any
  depth), sorted.

  Raises:
    DataError: none found (the message shows the expected ``layout``).
  """
  root = os.path.expanduser(data_dir)
  found = sorted(
    f
    for f in glob.glob(os.path.join(glob.escape(root), "**", subset, split + "*"), recursive=True)
    if f.endswith(SUFFIXES)
  )
  if not found:
    raise DataError(
      f"No {split} split of {subset} under {data_dir}: expected files like "
      f"{os.path.join(data_dir, layout)} (.parquet or .jsonl)."
    )
  return found


def read_rows(path: str | Sequence[str], columns: Sequence[str]) -> list[tuple[str, dict]]:
  """The rows of the files of ``path`` as ``(where, row)``, ``where`` naming
  the file and row (``FILE:LINE`` for JSON lines).

  Args:
    path: a file, a directory (:func:`data_files`) or a list of files.
    columns: fields every row must have; for parquet, checked on the schema.
      A row nested under ``"train"`` (MMLU's ``auxiliary_train``) counts.

  Raises:
    DataError: unreadable file, a line that is not a JSON object, a missing
      column or field.
  """
  files = data_files(path) if isinstance(path, str) else list(path)
  rows = []
  for name in files:
    if name.endswith(".parquet"):
      rows += _parquet_rows(name, columns)
      continue
    for where, row in utils.json_lines(name, DataError):
      rows.append((where, _check_fields(_unnest(row), columns, where)))
  return rows


def _parquet_rows(name: str, columns: Sequence[str]) -> list[tuple[str, dict]]:
  import pyarrow.parquet as pq

  try:
    names = pq.read_schema(name).names
    if not set(columns) <= set(names) and names != ["train"]:
      missing = [c for c in columns if c not in names]
      raise DataError(
        f"{name} has no column {missing[0]!r} (its columns: "
        f"{', '.join(names)}); give the data set's published files."
      )
    table = pq.read_table(name).to_pylist()
  except DataError:
    raise
  except Exception as e:  # pyarrow: ArrowInvalid, OSError, ...
    raise DataError(
      f"Cannot read the parquet file {name} ({' '.join(str(e).split())[:200]})."
    ) from None
  return [
    (f"{name} row {i}", _check_fields(_unnest(row), columns, f"{name} row {i}"))
    for i, row in enumerate(table, 1)
  ]


def _unnest(row):
  """MMLU's auxiliary_train rows are ``{"train": {...}}``: the inner row."""
  if isinstance(row, dict) and set(row) == {"train"} and isinstance(row["train"], dict):
    return row["train"]
  return row


def _check_fields(row, columns: Sequence[str], where: str) -> dict:
  if not isinstance(row, dict):
    raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}.")
  for column in columns:
    if column not in row:
      raise DataError(f"{where}: no field {column!r} (the row has {', '.join(row) or 'none'}).")
  return row


def shuffled(items: list, seed: int = SHUFFLE_SEED) -> list:
  """``items`` in the order of Hugging Face's ``Dataset.shuffle(seed=seed)``
  (NumPy's ``default_rng(seed).permutation``), as nanochat reads them."""
  return [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def render_mc(question: str, letters: Sequence[str], choices: Sequence[str]) -> str:
  """nanochat's multiple-choice prompt (``tasks/common.py``, ``render_mc``):
  ``"Multiple Choice question: {question}\\n"``, then ``"- {choice}={letter}\\n"``
  per choice (no space before the letter), then ``"\\nRespond only with the
  letter of the correct answer."``."""
  return (
    f"Multiple Choice question: {question}\n"
    + "".join(f"- {choice}={letter}\n" for letter, choice in zip(letters, choices))
    + "\nRespond only with the letter of the correct answer."
  )


def _mc_conversation(question, letters, choices, answer, where, **extra) -> dict:
  return {
    "messages": [
      {"role": "user", "content": render_mc(question, letters, choices)},
      {"role": "assistant", "content": answer},
    ],
    "letters": list(letters),
    **extra,
  }


def _strings(values, where: str, what: str) -> list[str]:
  if (
    not isinstance(values, (list, tuple))
    or not values
    or not all(isinstance(v, str) for v in values)
  ):
    raise DataError(f"{where}: {what} must be a non-empty list of strings.")
  return list(values)


def smoltalk(path) -> list[dict]:
  """SmolTalk conversations (``messages``), each checked as nanochat does
  (optional system message, then user/assistant alternating, at least one
  exchange, string contents).

  Raises:
    DataError: see :func:`read_rows`; a conversation of another shape.
  """
  out = []
  for where, row in read_rows(path, ["messages"]):
    messages = check_conversation(row, where)
    if len(messages) < 2 or not all(isinstance(m["content"], str) for m in messages):
      raise DataError(
        f"{where}: a SmolTalk conversation needs a user and an assistant "
        "message with string contents."
      )
    out.append({"messages": row["messages"]})
  return out


def mmlu(path) -> list[dict]:
  """MMLU questions (``all`` test, or ``auxiliary_train`` whose rows are under
  ``train``) as multiple-choice conversations with letters ``A``-``D``.

  Raises:
    DataError: see :func:`read_rows`; not four string choices; an answer
      that is not an index 0-3.
  """
  out = []
  for where, row in read_rows(path, ["question", "choices", "answer"]):
    choices = _strings(row["choices"], where, "'choices'")
    answer = row["answer"]
    if len(choices) != 4 or not isinstance(answer, int) or not 0 <= answer < 4:
      raise DataError(f"{where}: MMLU needs 4 choices and an answer index 0-3.")
    if not isinstance(row["question"], str):
      raise DataError(f"{where}: 'question' must be a string.")
    out.append(
      _mc_conversation(
        row["question"],
        MMLU_LETTERS,
        choices,
        MMLU_LETTERS[answer],
        where,
        subject=row.get("subject", ""),
      )
    )
  return out


def arc(path) -> list[dict]:
  """ARC questions as multiple-choice conversations; the letters are the
  data set's labels and the answer its ``answerKey``.

  Raises:
    DataError: see :func:`read_rows`; mismatched texts and labels; an
      ``answerKey`` not among the labels.
  """
  out = []
  for where, row in read_rows(path, ["question", "choices", "answerKey"]):
    choices = row["choices"]
    if not isinstance(choices, dict):
      raise DataError(f"{where}: 'choices' must be an object with 'text' and 'label'.")
    texts = _strings(choices.get("text"), where, "'choices.text'")
    labels = _strings(choices.get("label"), where, "'choices.label'")
    if len(texts) != len(labels) or row["answerKey"] not in labels:
      raise DataError(
        f"{where}: ARC needs as many labels as texts and an answerKey among "
        f"the labels (got {row['answerKey']!r}, labels {labels})."
      )
    out.append(_mc_conversation(row["question"], labels, texts, row["answerKey"], where))
  return out


# A GSM8K final answer: "#### " and a number with at least one digit (OpenAI's
# grade_school_math format; laplax.proj.nanochat.evaluators.gsm8k extracts it).
GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]*[0-9][0-9\.\,]*)")


def gsm8k_parts(answer: str) -> list[dict]:
  """A GSM8K solution as assistant parts (nanochat's ``tasks/gsm8k.py``): the
  text between calculator marks as ``text`` parts, each ``<<expr=result>>``
  as a ``python`` part ``expr`` and a ``python_output`` part ``result`` (split
  at the last ``=``; no ``=``: the whole mark is the expression, the output
  empty)."""
  parts = []
  for piece in _CALCULATOR.split(answer):
    if piece.startswith("<<") and piece.endswith(">>"):
      inner = piece[2:-2]
      expr, result = inner.rsplit("=", 1) if "=" in inner else (inner, "")
      parts += [{"type": "python", "text": expr}, {"type": "python_output", "text": result}]
    else:
      parts.append({"type": "text", "text": piece})
  return parts


def gsm8k(path) -> list[dict]:
  """GSM8K problems as conversations whose answer has calculator parts.

  Raises:
    DataError: see :func:`read_rows`; non-string question or answer; an
      answer without a ``#### NUMBER`` line (:data:`GSM8K_ANSWER`: the
      reference the scorer compares with; a row without one could only be
      scored by counting a missing answer as right).
  """
  out = []
  for where, row in read_rows(path, ["question", "answer"]):
    if not isinstance(row["question"], str) or not isinstance(row["answer"], str):
      raise DataError(f"{where}: 'question' and 'answer' must be strings.")
    if not GSM8K_ANSWER.search(row["answer"]):
      raise DataError(
        f"{where}: the answer has no '#### NUMBER' line (GSM8K's reference "
        f"answer); fix the row or remove it."
      )
    out.append(
      {
        "messages": [
          {"role": "user", "content": row["question"]},
          {"role": "assistant", "content": gsm8k_parts(row["answer"])},
        ]
      }
    )
  return out
