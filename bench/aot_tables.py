"""Regenerates the ahead-of-time table of docs/scale-out.md, each row stamped
with the commit and date it was measured at and the fingerprint of the
program it compiled.

    .venv-tpu/bin/python bench/aot_tables.py --rows 1          # compile row 1, rewrite it
    .venv-tpu/bin/python bench/aot_tables.py --rows all        # every row of ROWS (hours)
    python bench/aot_tables.py --check                         # which rows are stale
    python bench/aot_tables.py --fingerprint 1,5               # record "unchanged at HEAD"
    python bench/aot_tables.py --list                          # the rows and their commands

Each row of :data:`ROWS` is one ``bench/compile_report.py --json`` command,
run one at a time (a compile takes minutes to most of an hour on a 2-core
machine). Its record becomes a row of the table between the markers
``<!-- aot-table begin -->`` and ``<!-- aot-table end -->`` of
``docs/scale-out.md``, with the commit (``git rev-parse --short HEAD``) and
the date (UTC) in its last column, followed by the fingerprint of the
program compiled (``program sha256:...``: ``compile_report.py --fingerprint``,
the hash of the train step's StableHLO lowered for the slice's TPU without
source locations, ``bench/program_fingerprint.py``; lowering takes seconds
to a minute, without libtpu); rows not named keep their cells and stamp.
A compile is refused when a file the rows depend on (:data:`DEPENDS`) differs
from ``HEAD`` (commit first: the stamp must name the code measured).

``--check`` asks git first: a row whose files (:func:`row_depends`: the model,
attention, kernels, optimisers, sharding, the task, the train step, the
config code, the requirements, the AOT scripts, and the row's own config
files) are the same at ``HEAD`` as at its stamp is current. Otherwise the row
is lowered again (:func:`lower_row`) and compared with the fingerprint it
records: a change that leaves the program as it was (a renamed function, a
moved module) keeps the row current, a change to the program makes it stale;
a row without a fingerprint is stale by git alone. Each stale row is printed
with the command that measures it again and the exit status is 1
(``tests/bench/test_aot_tables.py`` runs it). ``--fingerprint ROWS`` lowers
the rows and writes ``unchanged at COMMIT`` (``HEAD``) after the fingerprint
of those whose program is unchanged, so that git alone clears them again.

Errors: an unknown row, a dirty tree, a failed compile or lowering, or
``--fingerprint`` of a row whose program changed print one line and exit 2.
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
# A row depends on its own config files besides (:func:`row_depends`). Such
# a change is confirmed by lowering the row again (:func:`stale_rows`).
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
  # How the step is built and lowered (the figures and the fingerprints).
  "bench/common.py",
  "bench/compile_report.py",
  "bench/program_fingerprint.py",
  "laplax/plan/aot.py",
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
  # Issue 54: the 64-chip slice, and the paper configs never compiled before.
  (
    "v5e:8x8 (64 chips)",
    f"--topology v5e:8x8 --config {D20} --set model.remat=full",
    "4 sequences of 2048 per chip",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/deit3_imagenet.py",
    "ViT-B/16, batch 2048 (32 images per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/bert_glue.py --mesh (16,1,4)",
    "BERT fine-tuning on GLUE (CoLA), batch 16 x 128 tokens: one example on each of 16 groups "
    "of 4 chips, the heads and the MLP split over the 4 (batch 16 does not split over 64)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/nystrom_lra.py:task=listops --mesh (32,1,2)",
    "LRA ListOps, Nystromformer, batch 32 x 2048 tokens: one example on each of 32 chip pairs",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/dino_vits16_imagenet.py",
    "DINO ViT-S/16, batch 1024 (64 images per chip), 2 global crops of 224 and 10 local "
    "crops of 96, 65,536 prototypes",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/gpt_d20_mid.py --set model.remat=full",
    "mid-training: d20 at 256 x 2048, 16 sequences per chip",
  ),
  (
    "v5e:4x4",
    "--topology v5e:4x4 --config configs/deit3_cifar.py",
    "ViT-B/16 on CIFAR-100 at 224 px, batch 512 (32 images per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/nystrom_lra.py:task=text --mesh (32,1,2)",
    "LRA text, batch 32 x 1024 tokens: one example on each of 32 chip pairs",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/nystrom_lra.py:task=retrieval --mesh (32,1,2)",
    "LRA retrieval, batch 32 pairs x 4096 tokens: one pair on each of 32 chip pairs",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/nystrom_lra.py:task=image",
    "LRA image, batch 256 x 1024 pixels (4 per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/nystrom_lra.py:task=pathfinder",
    "LRA Pathfinder, batch 256 x 1024 pixels (4 per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/swin_imagenet.py --set model.remat=full",
    "Swin-B, batch 1024 (16 images per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/davit_imagenet.py --set model.remat=full",
    "DaViT-B, batch 2048 (32 images per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/xcit_imagenet.py --set model.remat=full",
    "XCiT-M24/16, batch 1024 (16 images per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/bert_cramming.py:size=paper --set model.remat=full",
    "crammed BERT, 16 micro-batches of 512 (8 sequences per chip)",
  ),
  (
    "v5e:8x8",
    "--topology v5e:8x8 --config configs/gpt_d20_sft.py --set model.remat=full "
    "--set optim.grad_accum_steps=1 --mesh (32,1,2)",
    "SFT's 32 conversations in one step, one on each of 32 chip pairs",
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
  """The commit in a table line's last cell (``abc1234, 2026-12-04, ...``)."""
  return last_cell(line).split(",")[0].strip()


def last_cell(line: str) -> str:
  return line.rstrip(" |").rsplit("|", 1)[-1]


def fingerprint_of(line: str) -> tuple[str | None, str | None]:
  """(fingerprint, commit) of a table line's last cell: ``program sha256:X``
  and the ``unchanged at C`` after it, each ``None`` where absent."""
  found = re.search(r"program (sha256:[0-9a-f]+)(?: unchanged at (\w+))?", last_cell(line))
  return (found.group(1), found.group(2)) if found else (None, None)


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


def lower_row(number: int, root: str = ROOT) -> str:
  """The fingerprint of row ``number``'s program at ``root``'s working tree
  (``compile_report.py --fingerprint`` and the row's options, in a process of
  its own with JAX's defaults: no ``JAX_*`` or ``XLA_*`` variables; no libtpu
  needed).

  Raises:
    RuntimeError: the lowering failed (its last line of errors).
  """
  command = [sys.executable, os.path.join("bench", "compile_report.py"), "--fingerprint"]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
  proc = subprocess.run(
    command + ROWS[number - 1][1].split(), cwd=root, capture_output=True, text=True, env=env
  )
  records = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
  if proc.returncode or len(records) != 1:
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"lowering row {number} failed (exit {proc.returncode}): {last[:300]}")
  return records[0]["fingerprint"]


def in_history(commit: str | None, root: str) -> bool:
  if not commit:
    return False
  try:
    git("cat-file", "-e", f"{commit}^{{commit}}", cwd=root)
    git("merge-base", "--is-ancestor", commit, "HEAD", cwd=root)
  except subprocess.CalledProcessError:
    return False
  return True


def changed_since(commit: str, depends: tuple[str, ...], root: str) -> list[str]:
  """The files of ``depends`` that differ between ``commit`` and ``HEAD``."""
  return git("diff", "--name-only", commit, "HEAD", "--", *depends, cwd=root).split()


def stale_rows(root: str = ROOT, lower=lower_row) -> list[str]:
  """One message per stale row of the table in ``root``'s docs: git first,
  then ``lower(number, root)`` (a fingerprint) for the rows whose files
  changed since their stamp (or its ``unchanged at`` commit) and that record
  a fingerprint. A row whose lowering fails is stale, with the error."""
  with open(os.path.join(root, DOC)) as f:
    _, rows, _ = read_table(f.read())
  messages = []
  for number, line in sorted(rows.items()):
    commit = stamp_of(line)
    recorded, unchanged_at = fingerprint_of(line)
    since = unchanged_at if in_history(unchanged_at, root) else commit
    rerun = f"rerun: .venv-tpu/bin/python bench/aot_tables.py --rows {number}"
    depends = row_depends(ROWS[number - 1][1], root) if number <= len(ROWS) else DEPENDS
    if number <= len(ROWS) and f"| `{ROWS[number - 1][1]}`" not in line:
      messages.append(f"row {number}: its options in ROWS are not the ones measured; {rerun}")
      continue
    if in_history(since, root):
      files = changed_since(since, depends, root)
      if not files:
        continue
      why = f"{len(files)} file(s) changed since {since} ({', '.join(files[:4])})"
    else:
      why = f"commit {commit!r} is not in this branch's history"
    if recorded is None or number > len(ROWS):
      messages.append(f"row {number}: {why} and the row records no program fingerprint; {rerun}")
      continue
    try:
      now = lower(number, root)
    except RuntimeError as e:
      messages.append(f"row {number}: {why}, and {e}; {rerun}")
      continue
    if now != recorded:
      messages.append(
        f"row {number}: its program changed (measured at {commit}: {recorded}, now {now}); "
        f"{why}; {rerun}"
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
  try:
    program = lower_row(number)
  except RuntimeError as e:
    fail(str(e))
  commit = git("rev-parse", "--short", "HEAD")
  date = datetime.datetime.now(datetime.UTC).date().isoformat()
  shown = f"`{options}`" + (f" ({note})" if note else "")
  stamp = f"{commit}, {date}, program {program}"
  cols = (str(number), slice_name, shown, kernel, peak, flops, took, stamp)
  return "| " + " | ".join(cols) + " |"


def record_unchanged(number: int, line: str, root: str = ROOT, lower=lower_row) -> str:
  """Row ``number``'s table ``line`` with its program's fingerprint recorded:
  ``unchanged at HEAD`` after its fingerprint once its program lowered at
  ``HEAD`` is the one it records; ``program sha256:...`` added to a row
  without one whose files git shows unchanged since its stamp.

  Raises:
    ValueError: the row's program changed, or it has no fingerprint and its
      files changed since its stamp (it needs ``--rows``).
  """
  recorded, _ = fingerprint_of(line)
  rerun = f"compile it: .venv-tpu/bin/python bench/aot_tables.py --rows {number}"
  cell = last_cell(line)
  start = line.rstrip(" |").rindex(cell)
  if recorded is None:
    commit = stamp_of(line)
    if not in_history(commit, root):
      raise ValueError(f"row {number}: commit {commit!r} is not in this history; {rerun}")
    files = changed_since(commit, row_depends(ROWS[number - 1][1], root), root)
    if files:
      raise ValueError(f"row {number}: {', '.join(files[:4])} changed since {commit}; {rerun}")
    return line[:start] + f"{cell.rstrip()}, program {lower(number, root)} |"
  now = lower(number, root)
  if now != recorded:
    raise ValueError(f"row {number}'s program changed ({recorded}, now {now}); {rerun}")
  head = git("rev-parse", "--short", "HEAD", cwd=root)
  kept = re.sub(r" unchanged at \w+", "", cell).rstrip()
  return line[:start] + f"{kept} unchanged at {head} |"


def unchanged(number: int, path: str) -> str:
  """:func:`record_unchanged` of row ``number`` of the table at ``path``; a
  row not in the table, without a fingerprint or whose program changed fails."""
  with open(path) as f:
    rows = read_table(f.read())[1]
  if number not in rows:
    fail(f"row {number} is not in the table; compile it: --rows {number}")
  try:
    return record_unchanged(number, rows[number])
  except (ValueError, RuntimeError) as e:
    fail(str(e))


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
  what.add_argument("--check", action="store_true", help="list the stale rows (git, then lowering)")
  what.add_argument(
    "--fingerprint",
    metavar="ROWS",
    help="lower rows ('all' or numbers) and record 'unchanged at HEAD' where their "
    "program is the one measured",
  )
  what.add_argument("--list", action="store_true", help="print the rows and their options")
  args = p.parse_args(argv)
  if args.list:
    for i, (slice_name, options, note) in enumerate(ROWS, 1):
      print(f"{i:2d}  {slice_name}: {options}" + (f"  ({note})" if note else ""))
    return
  if args.check:
    messages = stale_rows()
    print("\n".join(messages) or "every row's program is the one it measured")
    sys.exit(1 if messages else 0)
  numbers = parse_rows(args.rows or args.fingerprint)
  dirty = git("status", "--porcelain", "--", *DEPENDS)
  if dirty:
    fail(f"commit first: the files the rows depend on differ from HEAD ({dirty.split()[-1]}, ...)")
  path = os.path.join(ROOT, DOC)
  for number in numbers:  # one at a time, the table read and written after each
    line = measure(number) if args.rows else unchanged(number, path)
    with open(path) as f:
      before, rows, after = read_table(f.read())
    rows[number] = line
    with open(path, "w") as f:
      f.write(write_table(before, rows, after))
    print(line)


if __name__ == "__main__":
  main()
