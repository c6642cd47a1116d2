"""bench/aot_tables.py: the docs' ahead-of-time rows carry the commit they were
measured at and the fingerprint of the program compiled; a row is stale once
its program changes.

No compile: git first, then lowering (bench/program_fingerprint.py) where a
row's files changed. The table of docs/scale-out.md against this checkout
(its rows lowered for their TPU slices where git cannot clear them), and
scratch repositories: one where a file under laplax/models changes after the
stamp of rows without fingerprints (git alone), one whose two rows lower a
small program of their own for a TPU (a jitted norm; a Pallas kernel in
shard_map) through a restructure and a change of an epsilon.
"""

import os
import runpy
import subprocess
import sys

import pytest

from helpers.runs import ROOT

sys.path.insert(0, ROOT)
from bench import aot_tables, program_fingerprint  # noqa: E402


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


def test_every_row_of_the_docs_table_records_its_commit_and_program():
  with open(os.path.join(ROOT, aot_tables.DOC)) as f:
    _, rows, _ = aot_tables.read_table(f.read())
  assert rows
  for line in rows.values():
    assert aot_tables.stamp_of(line)
    fingerprint, _ = aot_tables.fingerprint_of(line)
    assert fingerprint and len(fingerprint) == len("sha256:") + 16, line


@pytest.mark.slow  # instant while git shows no change since the stamps; else ~20 s a row
@pytest.mark.skipif(not in_git_checkout(), reason="not a git checkout")
def test_the_docs_table_was_measured_after_the_last_change_to_what_it_compiles():
  stale = aot_tables.stale_rows(ROOT)
  assert not stale, "\n".join(stale)


def table(commit, rows=(1,)):
  lines = [
    f"| {n} | v5e:4x4 | `{aot_tables.ROWS[n - 1][1]}` | splash | 1 GiB | - | 1 min "
    f"| {commit}, 2026-12-04 |"
    for n in rows
  ]
  body = "\n".join(lines)
  return f"# Scale-out\n\n{aot_tables.BEGIN}\n{aot_tables.HEADER}\n{body}\n{aot_tables.END}\n"


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
  assert message == (
    f"row 1: 1 file(s) changed since {measured} (laplax/models/gpt.py) and the row records "
    "no program fingerprint; rerun: .venv-tpu/bin/python bench/aot_tables.py --rows 1"
  )

  write(root, "laplax/models/gpt.py", "A = 1\n")  # changed back: the same files as measured
  git(root, "commit", "-qam", "revert")
  assert aot_tables.stale_rows(root) == []

  write(root, aot_tables.DOC, table("0123abc"))  # a commit this history does not have
  (message,) = aot_tables.stale_rows(root)
  assert "'0123abc' is not in this branch's history" in message

  write(root, aot_tables.DOC, table(measured).replace("v5e:4x4 --config", "v6e:4x4 --config"))
  (message,) = aot_tables.stale_rows(root)  # ROWS names another command than the one measured
  assert message == (
    "row 1: its options in ROWS are not the ones measured; "
    "rerun: .venv-tpu/bin/python bench/aot_tables.py --rows 1"
  )


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


# A program of two rows: row 1 a jitted RMS norm of x @ w, row 2 a Pallas ReLU
# of x @ w in shard_map; lowered (not compiled) for 4 TPU v5e chips.
TINY = """import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-6


@jax.jit
def norm(x):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)


def relu_kernel(x_ref, o_ref):
  o_ref[...] = jnp.maximum(x_ref[...], 0.0)


def relu(x):
  return pl.pallas_call(relu_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def step(x, w, kind):
  h = x @ w
  if kind == "norm":
    return norm(h)
  spec = jax.sharding.PartitionSpec("fsdp")
  mesh = jax.sharding.get_abstract_mesh()
  return jax.shard_map(relu, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(h)
"""
LOWER = """import importlib.util
import os

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

MODULE = "laplax/models/tiny.py"


def lowered_text(number):
  here = os.path.dirname(os.path.abspath(__file__))
  spec = importlib.util.spec_from_file_location("tiny", os.path.join(here, MODULE))
  tiny = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tiny)
  device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
  mesh = AbstractMesh((4,), ("fsdp",), axis_types=(AxisType.Auto,), abstract_device=device)
  x = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
  w = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh, P()))
  with jax.sharding.use_abstract_mesh(mesh):
    traced = jax.jit(tiny.step, static_argnums=2).trace(x, w, {1: "norm", 2: "relu"}[number])
    return traced.lower(lowering_platforms=("tpu",)).as_text(debug_info=False)
"""


def lower_tiny(calls):
  """``lower(number, root)`` of :func:`aot_tables.stale_rows` for the tiny
  program in ``root`` (its ``lower.py``), the numbers it lowers appended to ``calls``."""

  def lower(number, root):
    calls.append(number)
    text = runpy.run_path(os.path.join(root, "lower.py"))["lowered_text"](number)
    return program_fingerprint.fingerprint_text(text)

  return lower


def read_rows(root):
  with open(os.path.join(root, aot_tables.DOC)) as f:
    return aot_tables.read_table(f.read())


def write_rows(root, rows):
  before, _, after = read_rows(root)
  write(root, aot_tables.DOC, aot_tables.write_table(before, rows, after))


@pytest.mark.slow  # 9 lowerings and JAX's import: 5-7 s on 2 busy cores
def test_a_restructure_keeps_rows_current_and_a_program_change_flags_its_rows(tmp_path):
  root, calls = str(tmp_path), []
  lower = lower_tiny(calls)
  git(root, "init", "-q")
  write(root, "laplax/models/tiny.py", TINY)
  write(root, "lower.py", LOWER)
  git(root, "add", "-A")
  git(root, "commit", "-qm", "model")
  measured = git(root, "rev-parse", "--short", "HEAD")
  write(root, aot_tables.DOC, table(measured, rows=(1, 2)))
  rows = read_rows(root)[1]
  # --fingerprint of rows without one whose files are as measured: the program is recorded
  prints = {}
  for n in (1, 2):
    rows[n] = aot_tables.record_unchanged(n, rows[n], root, lower)
    prints[n], unchanged_at = aot_tables.fingerprint_of(rows[n])
    assert unchanged_at is None
    assert rows[n].endswith(f"| {measured}, 2026-12-04, program {prints[n]} |")
  assert prints[1] != prints[2] and len(prints[1]) == len("sha256:") + 16
  write_rows(root, rows)
  git(root, "add", "-A")
  git(root, "commit", "-qm", "docs")
  calls.clear()
  assert aot_tables.stale_rows(root, lower) == [] and calls == []  # git alone

  # Move the module, rename the jitted function and the kernel, shift every line.
  os.remove(os.path.join(root, "laplax/models/tiny.py"))
  moved = TINY.replace("def norm(", "def rms_norm(").replace("return norm(", "return rms_norm(")
  moved = moved.replace("relu_kernel", "rectify").replace(
    "import jax\n", "# Moved.\n\nimport jax\n"
  )
  write(root, "laplax/models/layers/tiny.py", moved)
  write(root, "lower.py", LOWER.replace("laplax/models/tiny.py", "laplax/models/layers/tiny.py"))
  git(root, "add", "-A")
  git(root, "commit", "-qm", "restructure")
  calls.clear()
  assert aot_tables.stale_rows(root, lower) == [] and calls == [1, 2]  # lowered: the same programs

  write(root, "laplax/models/layers/tiny.py", moved.replace("EPS = 1e-6", "EPS = 1e-5"))
  git(root, "commit", "-qam", "another epsilon")
  calls.clear()
  (message,) = aot_tables.stale_rows(root, lower)  # only the row whose program uses it
  assert calls == [1, 2]
  assert message.startswith(f"row 1: its program changed (measured at {measured}: {prints[1]}, ")
  assert "laplax/models/layers/tiny.py" in message
  assert message.endswith("rerun: .venv-tpu/bin/python bench/aot_tables.py --rows 1")
  with pytest.raises(ValueError, match="row 1's program changed"):
    aot_tables.record_unchanged(1, rows[1], root, lower)

  # --fingerprint 2 records that row 2's program is unchanged here: git clears it again.
  head = git(root, "rev-parse", "--short", "HEAD")
  rows[2] = aot_tables.record_unchanged(2, rows[2], root, lower)
  assert rows[2].endswith(f"program {prints[2]} unchanged at {head} |")
  assert aot_tables.fingerprint_of(rows[2]) == (prints[2], head)
  write_rows(root, rows)
  git(root, "commit", "-qam", "docs: row 2 unchanged")
  calls.clear()
  (message,) = aot_tables.stale_rows(root, lower)
  assert message.startswith("row 1: its program changed") and calls == [1]
