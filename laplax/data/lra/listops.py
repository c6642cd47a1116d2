"""ListOps (Nangia & Bowman 2018) as the Long Range Arena releases it.

The release (``lra_release/listops-1000/basic_{train,val,test}.tsv``) is a
tab-separated file with the header ``Source\\tTarget``: ``Source`` an
expression such as ``( ( ( [MAX 2 ) 9 ) ] )``, ``Target`` its value 0..9.
:func:`generate` writes files of that form by the rules of the release's
generator (``lra_benchmarks/data/listops.py`` of google-research/
long-range-arena): operators MIN, MAX, MED (``int(np.median)``) and SM (sum
mod 10) over the digits 0..9; a node below ``max_depth`` is an operator with
probability 0.25 and 2..``max_args`` arguments, else a digit; an expression
is kept when its length (one per digit, two per operator: the operator and
its ``]``) is strictly between ``min_length`` and ``max_length``, and each is
distinct. Release limits: depth 10, 10 arguments, lengths 500..2000, 96,000 /
2,000 / 2,000 examples.

:func:`read_tsv` reads such a file and :func:`encode` turns a ``Source``
into token ids as the release's pipeline (``lra_benchmarks/listops/
input_pipeline.py``) does, in one of its two versions (``closers``, the
config key ``data.listops_closers``):

* ``True`` (the default of new runs): the pipeline since google-research/
  long-range-arena c209b2a (March 2021): ``]`` becomes ``X``, ``(`` and
  ``)`` are removed, and tfds' ``TokenTextEncoder`` splits the rest into its
  vocabulary's words, the operators with their ``[`` (``[MAX``: reserved
  tokens, mixed alphanumeric) and the digits. An expression becomes one
  token per digit and two per operator (the operator and its closer), the
  generator's length; ``[MAX 2 [MIN 3 4 ] 5 ]`` and ``[MAX 2 [MIN 3 4 5 ] ]``
  differ.
* ``False``: the pipeline before that commit (tfds' ``Tokenizer`` keeps the
  alphanumeric words only): the brackets are dropped and an expression
  becomes its operators and digits in order, so the two above are equal.
  The Nystromformer authors' data preparation (``LRA/datasets/listops.py``
  of mlpen/Nystromformer) imports this version, and runs saved before the
  key existed read it.

The ids differ from the release's (it numbers a set's words; here they are
:data:`VOCAB`'s, the closer last so that the words keep their ids).

``python -m laplax.data.listops --out DIR`` writes the three files; a
malformed file read by the task is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import sys

import numpy as np

from laplax.data.errors import DataError

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUE_P = 0.25
#: The release's limits (the generator's flags and the split sizes).
RELEASE = dict(
  max_depth=10, max_args=10, min_length=500, max_length=2000, train=96_000, val=2_000, test=2_000
)
#: Token ids: 0 is padding, then the digits, the operators' words and the
#: closer ``]`` (the release's ``X``; ``closers=False`` has no closer).
VOCAB = {
  w: i for i, w in enumerate(["<pad>", *map(str, range(10)), "MIN", "MAX", "MED", "SM", END])
}
#: The release's tokens since c209b2a (after ``]`` -> ``X``) -> their ids.
CLOSER_TOKENS = {
  **{str(d): VOCAB[str(d)] for d in range(10)},
  **{op: VOCAB[op[1:]] for op in OPERATORS},
  "X": VOCAB[END],
}
SPLITS = ("train", "val", "test")


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
  """A random expression ``(tree, length)`` by the release's ``generate_tree``:
  a digit (an ``int``) or a nested pair structure ``((((op, a1), a2), ...), ']')``."""
  r = rng.random() if depth < max_depth else 1.0
  if r > VALUE_P:
    return rng.choice(range(10)), 1
  length = 2
  values = []
  for _ in range(rng.randint(2, max_args)):
    sub, sub_length = generate_tree(rng, depth + 1, max_depth, max_args)
    values.append(sub)
    length += sub_length
  tree = (rng.choice(OPERATORS), values[0])
  for value in values[1:]:
    tree = (tree, value)
  return (tree, END), length


def to_string(tree) -> str:
  """The release's ``Source`` text of a tree: ``( left right )`` per pair."""
  if isinstance(tree, (str, int)):
    return str(tree)
  return "( " + to_string(tree[0]) + " " + to_string(tree[1]) + " )"


def evaluate(tokens: list[str]) -> int:
  """The value 0..9 of an expression given as its words (``"[MAX"``, digits,
  ``"]"``; parentheses ignored).

  Raises:
    ValueError: not a well-formed expression.
  """
  stack: list[list] = []
  result = None
  for tok in tokens:
    if tok in ("(", ")"):
      continue
    if tok in OPERATORS:
      stack.append([tok])
    elif tok == END:
      if not stack or len(stack[-1]) < 2:
        raise ValueError("']' closes no operator with arguments")
      op, *args = stack.pop()
      if op == MIN:
        value = min(args)
      elif op == MAX:
        value = max(args)
      elif op == MED:
        value = int(np.median(args))
      else:
        value = int(np.sum(args) % 10)
      if stack:
        stack[-1].append(value)
      else:
        result = value
    elif tok.isdigit() and len(tok) == 1:
      if stack:
        stack[-1].append(int(tok))
      else:
        result = int(tok)
    else:
      raise ValueError(f"unknown word {tok!r}")
  if stack or result is None:
    raise ValueError("unbalanced expression")
  return result


def generate(
  num: int,
  *,
  seed: int = 0,
  max_depth: int = RELEASE["max_depth"],
  max_args: int = RELEASE["max_args"],
  min_length: int = RELEASE["min_length"],
  max_length: int = RELEASE["max_length"],
) -> list[tuple[str, int]]:
  """``num`` distinct ``(Source, Target)`` pairs (module docstring), in the
  order generated, from ``random.Random(seed)``.

  Raises:
    ValueError: ``min_length + 1 >= max_length`` (no length fits).
  """
  if min_length + 1 >= max_length:
    raise ValueError(f"no length is strictly between min_length={min_length} and {max_length}")
  rng = random.Random(seed)
  seen: dict[str, int] = {}
  while len(seen) < num:
    tree, length = generate_tree(rng, 1, max_depth, max_args)
    if min_length < length < max_length:
      text = to_string(tree)
      if text not in seen:
        seen[text] = evaluate(text.split())
  return list(seen.items())


def write_tsv(rows: list[tuple[str, int]], path: str) -> None:
  """Writes ``rows`` as the release does (``csv`` with a tab, header ``Source Target``)."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f, delimiter="\t")
    writer.writerow(["Source", "Target"])
    writer.writerows(rows)


def read_tsv(path: str) -> list[tuple[str, int]]:
  """The ``(Source, Target)`` rows of a release-format file.

  Raises:
    DataError: a missing file, a wrong header, a row without two fields, a
      target that is not 0..9 (one line naming the file and the line).
  """
  if not os.path.isfile(path):
    raise DataError(
      f"ListOps file {path} is missing; give the release's listops-1000 folder or "
      f"generate one with python -m laplax.data.listops --out DIR"
    )
  rows = []
  with open(path, newline="") as f:
    reader = csv.reader(f, delimiter="\t")
    header = next(reader, None)
    if header != ["Source", "Target"]:
      raise DataError(
        f"{path}:1: header {header!r} is not 'Source<TAB>Target'; not a ListOps release file"
      )
    for line, row in enumerate(reader, start=2):
      if len(row) != 2 or not re.fullmatch(r"[0-9]", row[1].strip()):
        raise DataError(
          f"{path}:{line}: expected 'Source<TAB>Target' with a target 0..9, got {row!r:.80}"
        )
      rows.append((row[0], int(row[1])))
  return rows


def vocab_size(closers: bool) -> int:
  """The token ids :func:`encode` uses (padding included): 16 with the
  closer, 15 without."""
  return len(VOCAB) if closers else len(VOCAB) - 1


def words(source: str, closers: bool = True) -> list[str]:
  """The release pipeline's tokens of a ``Source`` (module docstring):
  with ``closers``, ``]`` renamed ``X`` and the parentheses removed, then
  tfds ``TokenTextEncoder``'s split (the reserved ``[MIN``, ``[MAX``,
  ``[MED``, ``[SM`` whole, the rest into alphanumeric words); without, the
  alphanumeric words of tfds' ``Tokenizer``."""
  if not closers:
    return re.findall(r"[A-Za-z0-9]+", source)
  text = source.replace("]", "X").replace("(", "").replace(")", "")
  return re.findall(r"\[(?:MIN|MAX|MED|SM)|[A-Za-z0-9]+", text)


def encode(source: str, max_length: int, closers: bool = True) -> np.ndarray:
  """Token ids ``int32 [max_length]`` of a ``Source`` (:func:`words`, cut at
  ``max_length``, zero-padded).

  Raises:
    DataError: a word outside the vocabulary (:data:`CLOSER_TOKENS` with
      ``closers``, else :data:`VOCAB`'s digits and operators).
  """
  vocab = CLOSER_TOKENS if closers else {w: i for w, i in VOCAB.items() if w != END}
  ids = np.zeros(max_length, np.int32)
  tokens = words(source, closers)[:max_length]
  try:
    ids[: len(tokens)] = [vocab[w] for w in tokens]
  except KeyError as e:
    raise DataError(f"ListOps word {e.args[0]!r} is not one of {', '.join(vocab)}") from None
  return ids


def load_split(
  data_dir: str, split: str, max_length: int, task_name: str = "basic", closers: bool = True
):
  """``(ids int32 [n, max_length], mask bool [n, max_length], labels int32 [n])``
  of ``DATA_DIR/{task_name}_{split}.tsv``, tokenized by :func:`encode`
  (``closers``).

  Raises:
    DataError: as :func:`read_tsv` and :func:`encode`, or an empty split.
  """
  path = os.path.join(os.path.expanduser(data_dir), f"{task_name}_{split}.tsv")
  rows = read_tsv(path)
  if not rows:
    raise DataError(f"{path} has no examples; generate or download the split again")
  ids = np.stack([encode(s, max_length, closers) for s, _ in rows])
  labels = np.asarray([t for _, t in rows], np.int32)
  return ids, ids != 0, labels


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.data.listops --out DIR``: writes ``basic_{train,val,test}.tsv``.

  Exit status 2 on bad arguments or an existing file (nothing is overwritten).
  """
  p = argparse.ArgumentParser(
    prog="python -m laplax.data.listops", description=__doc__.split("\n")[0]
  )
  p.add_argument("--out", required=True, help="folder for basic_{train,val,test}.tsv")
  p.add_argument("--seed", type=int, default=0)
  for split in SPLITS:
    p.add_argument(f"--num_{split}", type=int, default=RELEASE[split])
  for key in ("max_depth", "max_args", "min_length", "max_length"):
    p.add_argument(f"--{key}", type=int, default=RELEASE[key])
  a = p.parse_args(argv)
  paths = {s: os.path.join(a.out, f"basic_{s}.tsv") for s in SPLITS}
  existing = [q for q in paths.values() if os.path.exists(q)]
  if existing:
    print(
      f"error: {existing[0]} exists; choose another --out (nothing overwritten)", file=sys.stderr
    )
    return 2
  if min(a.num_train, a.num_val, a.num_test) < 1 or a.min_length + 1 >= a.max_length:
    print("error: need --num_* >= 1 and --min_length + 1 < --max_length", file=sys.stderr)
    return 2
  rows = generate(
    a.num_train + a.num_val + a.num_test,
    seed=a.seed,
    max_depth=a.max_depth,
    max_args=a.max_args,
    min_length=a.min_length,
    max_length=a.max_length,
  )
  os.makedirs(a.out, exist_ok=True)
  write_tsv(rows[: a.num_train], paths["train"])
  write_tsv(rows[a.num_train : a.num_train + a.num_val], paths["val"])
  write_tsv(rows[a.num_train + a.num_val :], paths["test"])
  print(f"wrote {len(rows)} ListOps examples to {a.out}")
  return 0
