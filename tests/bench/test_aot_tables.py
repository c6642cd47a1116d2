"""bench/aot_tables.py: the docs' ahead-of-time rows carry the commit they were
measured at, and a row is stale once a compiled file changes after it.

The check reads git history only (no compile): the table of
docs/scale-out.md against this checkout, and a scratch repository where a
file under laplax/models changes after the stamp.
"""

import os
import subprocess
import sys

import pytest

from helpers.runs import ROOT

sys.path.insert(0, ROOT)
from bench import aot_tables  # noqa: E402


def git(cwd, *args):
  return subprocess.run(
    ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
    cwd=cwd,
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()


def in_git_checkout():
  try:
    return git(ROOT, "rev-parse", "--is-inside-work-tree") == "true"
  except (OSError, subprocess.CalledProcessError):
    return False


@pytest.mark.skipif(not in_git_checkout(), reason="not a git checkout")
def test_the_docs_table_was_measured_after_the_last_change_to_what_it_compiles():
  with open(os.path.join(ROOT, aot_tables.DOC)) as f:
    _, rows, _ = aot_tables.read_table(f.read())
  assert rows and all(aot_tables.stamp_of(line) for line in rows.values())
  stale = aot_tables.stale_rows(ROOT)
  assert not stale, "\n".join(stale)


def table(commit):
  row = (
    f"| 1 | v5e:4x4 | `--topology v5e:4x4` | splash | 1 GiB | - | 1 min | {commit}, 2026-12-04 |"
  )
  return f"# Scale-out\n\n{aot_tables.BEGIN}\n{aot_tables.HEADER}\n{row}\n{aot_tables.END}\n"


def write(root, path, text):
  os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
  with open(os.path.join(root, path), "w") as f:
    f.write(text)


def test_a_row_is_stale_once_a_compiled_file_changes_after_its_commit(tmp_path):
  root = str(tmp_path)
  git(root, "init", "-q")
  write(root, "laplax/models/gpt.py", "A = 1\n")
  git(root, "add", "-A")
  git(root, "commit", "-qm", "model")
  measured = git(root, "rev-parse", "--short", "HEAD")
  write(root, aot_tables.DOC, table(measured))  # the docs, committed after the compile
  write(root, "README.md", "prose\n")
  git(root, "add", "-A")
  git(root, "commit", "-qm", "docs")
  assert aot_tables.stale_rows(root) == []

  write(root, "configs/bert_cramming.py", "B = 1\n")  # a config row 1 does not compile
  git(root, "add", "-A")
  git(root, "commit", "-qm", "another model's config")
  assert aot_tables.stale_rows(root) == []

  write(root, "laplax/models/sampling.py", "S = 1\n")  # decoding, not the train step
  git(root, "add", "-A")
  git(root, "commit", "-qm", "decoding")
  assert aot_tables.stale_rows(root) == []

  write(root, "laplax/models/gpt.py", "A = 2\n")
  git(root, "commit", "-qam", "change the model")
  (message,) = aot_tables.stale_rows(root)
  assert message.startswith(f"row 1: measured at {measured}, but 1 later commit(s)")
  assert "laplax/models/gpt.py" in message
  assert message.endswith("rerun: .venv-tpu/bin/python bench/aot_tables.py --rows 1")

  write(root, aot_tables.DOC, table("0123abc"))  # a commit this history does not have
  (message,) = aot_tables.stale_rows(root)
  assert "'0123abc' is not in this branch's history" in message


def test_a_row_depends_on_its_config_and_the_configs_it_builds_on(tmp_path):
  root = str(tmp_path)
  write(root, "configs/gpt_d20.py", "BASE = 1\n")
  write(root, "configs/gpt_d20_sft.py", 'sibling_config(__file__, "gpt_d20.py")\n')
  write(root, "configs/bert_cramming.py", "B = 1\n")
  sft = aot_tables.row_depends("--topology v5e:4x4 --config configs/gpt_d20_sft.py:x=1", root)
  assert sft[: len(aot_tables.COMMON)] == aot_tables.COMMON
  assert set(sft[len(aot_tables.COMMON) :]) == {"configs/gpt_d20_sft.py", "configs/gpt_d20.py"}
  assert aot_tables.row_depends("--topology v5e:4x4", root) == aot_tables.DEPENDS


def test_cells_state_the_margin_and_what_does_not_fit():
  base = dict(attention_kernel="splash", device_kind="TPU v5 lite", lower_s=30.0, compile_s=90.0)
  fits = dict(
    base,
    fits=True,
    peak_bytes=12 * 2**30,
    argument_bytes=2**29,
    temp_bytes=11.5 * 2**30,
    flops_total=3e15,
    analytic_flops=2e15,
  )
  kernel, peak, flops, took = aot_tables.cells(fits)
  assert kernel == "splash" and took == "2 min"
  assert peak == (
    "**12.00 GiB: fits** (arguments 0.50 GiB, temporaries 11.50 GiB, "
    "3.75 GiB below the 15.75 GiB allowed)"
  )
  assert flops == "3.000e+15 (compiled / analytic 1.500)"
  # The compiler accepts temporaries below the limit; with the arguments the chip holds more.
  over = dict(fits, argument_bytes=3.65 * 2**30, temp_bytes=12.45 * 2**30, peak_bytes=16.1 * 2**30)
  assert aot_tables.cells(over)[1:3] == (
    "does not fit: 16.10 GiB per chip (arguments 3.65 GiB, temporaries 12.45 GiB), "
    "above the 15.75 GiB allowed",
    "-",
  )
  error = "RESOURCE_EXHAUSTED: ... HLO temporaries (18.41G) exceeds available HBM (15.75G)."
  assert aot_tables.cells(dict(base, fits=False, error=error))[1:] == (
    "does not fit: 18.41 GiB of temporaries",
    "-",
    "2 min",
  )
