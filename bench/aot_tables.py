"""Regenerates the ahead-of-time table of docs/scale-out.md, each row stamped
with the commit and date it was measured at.

    .venv-tpu/bin/python bench/aot_tables.py --rows 1          # compile row 1, rewrite it
    .venv-tpu/bin/python bench/aot_tables.py --rows all        # every row of ROWS (hours)
    python bench/aot_tables.py --check                         # which rows are stale (git only)
    python bench/aot_tables.py --list                          # the rows and their commands

Each row of :data:`ROWS` is one ``bench/compile_report.py --json`` command,
run one at a time (a compile takes minutes to most of an hour on a 2-core
machine). Its record becomes a row of the table between the markers
``<!-- aot-table begin -->`` and ``<!-- aot-table end -->`` of
``docs/scale-out.md``, with the commit (``git rev-parse --short HEAD``) and
the date (UTC) in its last column; rows not named keep their cells and stamp.
A compile is refused when a file the rows depend on (:data:`DEPENDS`) differs
from ``HEAD`` (commit first: the stamp must name the code measured).

``--check`` reads git history only: a row is stale when a commit after its
stamp changed one of its files (:func:`row_depends`: the model, attention,
kernels, optimisers, sharding, the task, the train step, the config code, the
requirements, and the row's own config files) or when its commit is not in
the history; it prints the command that measures
it again and exits 1 (``tests/bench/test_aot_tables.py`` runs it).

Errors: an unknown row, a dirty tree or a failed compile print one line and
exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join("docs", "scale-out.md")
BEGIN, END = "<!-- aot-table begin -->", "<!-- aot-table end -->"
# What the compiled train step is made of, whatever the row's config: a
# commit that changes one of these after a row's stamp makes the row stale.
# (bench/compile_report.py builds the step from these and prints it; a change
# to how it lowers the step needs the rows measured again by hand.) A row
# depends on its own config files besides (:func:`row_depends`).
COMMON = (
  "laplax/models",
  "laplax/attention.py",
  "laplax/kernels",
  "laplax/optim",
  "laplax/sharding.py",
  "laplax/rotary.py",
  "laplax/spectral.py",
  "laplax/state.py",
  "laplax/tasks",
  "laplax/train",
  "laplax/config",
  "requirements.txt",
  "requirements-tpu.txt",
  # Decoding (the chat, eval.py --sample) is not part of the train step.
  ":(exclude)laplax/models/sampling.py",
)
DEPENDS = (*COMMON, "configs")  # every row's files: a compile is refused while one is dirty
HBM = {"TPU v5 lite": 15.75 * 2**30}  # what the compiler allows a chip (its RESOURCE_EXHAUSTED)
D20 = "configs/gpt_d20.py"
# (slice, compile_report arguments, note): the table's rows, numbered from 1.
ROWS = (
  ("v5e:4x4 (16 chips)", f"--topology v5e:4x4 --config {D20} --set model.remat=full", ""),
  (
    "v5e:4x4",
    f"--topology v5e:4x4 --config {D20} --set model.remat=full --set model.implementation=xla",
    "",
  ),
  ("v5e:4x4", f"--topology v5e:4x4 --config {D20}", "no rematerialisation"),
  (
    "v5e:4x4",
    f"--topology v5e:4x4 --config {D20} --set model.remat=full --set model.loss_chunk=None",
    "the whole float32 logits (before `model.loss_chunk`)",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/gpt_d20_sft.py --set model.remat=full "
    "--set optim.grad_accum_steps=1",
    "SFT's 32 conversations in one step: its 8 micro-batches of 4 do not split over 16 chips",
  ),
  (
    "v5e:4x4",
    f"--topology v5e:4x4 --config {D20} --batch 320 --set model.remat=full",
    "20 sequences per chip",
  ),
  (
    "v5e:4x4",
    f"--topology v5e:4x4 --config {D20} --batch 128 --set model.max_length=4096 "
    "--set model.remat=full",
    "8 sequences of 4096 per chip",
  ),
  ("v5e:16x16 (256 chips)", f"--topology v5e:16x16 --config {D20} --set model.max_length=8192", ""),
  ("v5p:2x2x2 (8 chips)", f"--topology v5p:2x2x2 --config {D20} --set model.remat=full", ""),
  ("v6e:4x4 (16 chips)", f"--topology v6e:4x4 --config {D20} --set model.remat=full", ""),
  ("v5e:4x4", "--topology v5e:4x4 --config configs/deit3_imagenet.py", "ViT-B/16, batch 2048"),
  (
    "v5e:2x2 (4 chips)",
    "--topology v5e:2x2 --config configs/gpt_d20_sft.py",
    "SFT as configured: 8 micro-batches of 4, docs/language-models.md",
  ),
  (
    "v5e:4x4",
    f"--topology v5e:4x4 --config {D20}:recipe=nanochat-fork --set model.remat=full "
    "--set optim.grad_accum_steps=4",
    "the authors' nanochat fork's d20 (SSSL sliding windows, value embeddings) at its batch "
    "of 512 x 2048 in 4 micro-batches of 8 sequences per chip; in 2 (16 per chip, the fork's "
    "device batch at d20) it needs 16.08 GiB, in 1 (32 per chip) 26.04 GiB of temporaries",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/swin_imagenet.py --set model.remat=full",
    "Swin-B, batch 1024 (64 images per chip), windows of 49 tokens",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/davit_imagenet.py --set model.remat=full",
    "DaViT-B, batch 2048 (128 images per chip), windows of 49 tokens and channel attention",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/xcit_imagenet.py --set model.remat=full",
    "XCiT-M24/16, batch 1024 (64 images per chip), attention over channels",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/bert_cramming.py:size=paper --set model.remat=full",
    (
      "crammed BERT, batch 8192 x 128 tokens in 16 micro-batches of 512 (32 sequences per"
      " chip), cramming's batch-size ramp"
    ),
  ),
)
HEADER = (
  "| # | slice | `bench/compile_report.py` options | attention kernel | per-chip peak "
  "| FLOPs per step (all chips) | compile | measured at |\n"
  "|---|---|---|---|---|---|---|---|"
)


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def git(*args: str, cwd: str = ROOT) -> str:
  return subprocess.run(
    ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
  ).stdout.strip()


def gib(num_bytes: float) -> str:
  return f"{num_bytes / 2**30:.2f} GiB"


def cells(record: dict) -> tuple[str, str, str, str]:
  """(kernel, peak, FLOPs, compile) cells of a ``compile_report --json`` record."""
  minutes = (record["lower_s"] + record["compile_s"]) / 60
  took = f"{minutes:.0f} min" if minutes >= 1 else f"{minutes * 60:.0f} s"
  if not record["fits"]:
    found = re.search(r"temporaries \(([\d.]+)G\)", record["error"] or "")
    what = f"{found.group(1)} GiB of temporaries" if found else record["error"]
    return record["attention_kernel"], f"does not fit: {what}", "-", took
  peak = record["peak_bytes"]
  limit = HBM.get(record["device_kind"])
  if limit and peak > limit:  # the compiler checks the temporaries alone
    return (
      record["attention_kernel"],
      f"does not fit: {gib(peak)} per chip (arguments {gib(record['argument_bytes'])}, "
      f"temporaries {gib(record['temp_bytes'])}), above the {gib(limit)} allowed",
      "-",
      took,
    )
  margin = f", {gib(limit - peak)} below the {gib(limit)} allowed" if limit else ""
  peak_cell = (
    f"**{gib(peak)}: fits** (arguments {gib(record['argument_bytes'])}, temporaries "
    f"{gib(record['temp_bytes'])}{margin})"
  )
  ratio = record["flops_total"] / record["analytic_flops"]
  return (
    record["attention_kernel"],
    peak_cell,
    f"{record['flops_total']:.3e} (compiled / analytic {ratio:.3f})",
    took,
  )


def read_table(text: str) -> tuple[str, dict[int, str], str]:
  """(before, {row number: line}, after) of the generated table in ``text``."""
  if BEGIN not in text or END not in text:
    raise ValueError(f"{DOC} has no {BEGIN} ... {END} table")
  before, rest = text.split(BEGIN, 1)
  body, after = rest.split(END, 1)
  rows = {}
  for line in body.splitlines():
    found = re.match(r"\| (\d+) \|", line)
    if found:
      rows[int(found.group(1))] = line
  return before, rows, after


def write_table(before: str, rows: dict[int, str], after: str) -> str:
  lines = [rows[k] for k in sorted(rows)]
  return before + BEGIN + "\n" + HEADER + "\n" + "\n".join(lines) + "\n" + END + after


def stamp_of(line: str) -> str:
  """The commit in a table line's last cell (``abc1234, 2026-12-04``)."""
  return line.rstrip(" |").rsplit("|", 1)[-1].split(",")[0].strip()


def row_depends(options: str, root: str = ROOT) -> tuple[str, ...]:
  """The paths a row's compile depends on: :data:`COMMON`, the config file its
  ``options`` name (``--config configs/X.py[:ARGS]``) and every file of
  ``configs/`` that file names in its text, followed (``gpt_d20_sft.py`` builds
  on ``"gpt_d20.py"``); all of ``configs`` for a row without ``--config``
  (compile_report's default configs).
  """
  found = re.search(r"--config (\S+)", options)
  if not found:
    return DEPENDS
  todo, seen = [found.group(1).split(":")[0]], []
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.append(path)
    try:
      with open(os.path.join(root, path)) as f:
        text = f.read()
    except OSError:
      continue  # a config a later commit removed: its log still names the commit
    for name in re.findall(r"\b(\w+\.py)\b", text):
      if os.path.isfile(os.path.join(root, "configs", name)):
        todo.append(f"configs/{name}")
  return (*COMMON, *seen)


def stale_rows(root: str = ROOT) -> list[str]:
  """One message per stale row of the table in ``root``'s docs (git history only)."""
  with open(os.path.join(root, DOC)) as f:
    _, rows, _ = read_table(f.read())
  messages = []
  for number, line in sorted(rows.items()):
    commit = stamp_of(line)
    rerun = f"rerun: .venv-tpu/bin/python bench/aot_tables.py --rows {number}"
    try:
      git("cat-file", "-e", f"{commit}^{{commit}}", cwd=root)
      git("merge-base", "--is-ancestor", commit, "HEAD", cwd=root)
    except subprocess.CalledProcessError:
      messages.append(f"row {number}: commit {commit!r} is not in this branch's history; {rerun}")
      continue
    depends = row_depends(ROWS[number - 1][1], root) if number <= len(ROWS) else DEPENDS
    changed = git("log", "--format=%h", f"{commit}..HEAD", "--", *depends, cwd=root).split()
    if changed:
      files = git("diff", "--name-only", commit, "HEAD", "--", *depends, cwd=root).split()
      messages.append(
        f"row {number}: measured at {commit}, but {len(changed)} later commit(s) "
        f"({', '.join(changed[:3])}) changed {', '.join(files[:4])}; {rerun}"
      )
  return messages


def measure(number: int) -> str:
  """Compiles row ``number`` and returns its table line."""
  slice_name, options, note = ROWS[number - 1]
  command = [sys.executable, os.path.join("bench", "compile_report.py"), "--json"]
  command += options.split()
  print(f"row {number}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  records = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
  if proc.returncode or len(records) != 1:
    fail(f"row {number} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
  kernel, peak, flops, took = cells(records[0])
  commit = git("rev-parse", "--short", "HEAD")
  date = datetime.datetime.now(datetime.UTC).date().isoformat()
  shown = f"`{options}`" + (f" ({note})" if note else "")
  cols = (str(number), slice_name, shown, kernel, peak, flops, took, f"{commit}, {date}")
  return "| " + " | ".join(cols) + " |"


def parse_rows(value: str) -> list[int]:
  if value == "all":
    return list(range(1, len(ROWS) + 1))
  try:
    numbers = [int(x) for x in value.split(",")]
  except ValueError:
    numbers = [0]
  if not all(1 <= n <= len(ROWS) for n in numbers):
    fail(f"--rows {value!r} must be 'all' or row numbers 1..{len(ROWS)} (see --list)")
  return numbers


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  what = p.add_mutually_exclusive_group(required=True)
  what.add_argument("--rows", help="'all' or row numbers, e.g. '1,5' (see --list)")
  what.add_argument("--check", action="store_true", help="list the stale rows (git only)")
  what.add_argument("--list", action="store_true", help="print the rows and their options")
  args = p.parse_args(argv)
  if args.list:
    for i, (slice_name, options, note) in enumerate(ROWS, 1):
      print(f"{i:2d}  {slice_name}: {options}" + (f"  ({note})" if note else ""))
    return
  if args.check:
    messages = stale_rows()
    print("\n".join(messages) or "every row was measured at or after the last change")
    sys.exit(1 if messages else 0)
  numbers = parse_rows(args.rows)
  dirty = git("status", "--porcelain", "--", *DEPENDS)
  if dirty:
    fail(f"commit first: the files the rows depend on differ from HEAD ({dirty.split()[-1]}, ...)")
  path = os.path.join(ROOT, DOC)
  for number in numbers:  # one at a time, the table written after each
    line = measure(number)
    with open(path) as f:
      before, rows, after = read_table(f.read())
    rows[number] = line
    with open(path, "w") as f:
      f.write(write_table(before, rows, after))
    print(line)


if __name__ == "__main__":
  main()
