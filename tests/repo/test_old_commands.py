"""The ``python -m`` commands of the modules that moved into ``laplax.sandbox``
and ``laplax.proj.nanochat`` keep working at their old names: each old module
runs the new one as ``__main__`` (:data:`OLD_COMMANDS`)."""

import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from helpers.runs import ROOT

#: old ``python -m`` module -> the module it runs now.
OLD_COMMANDS = {
  "laplax.chat": "laplax.proj.nanochat.chat",
  "laplax.data.chat.fixtures": "laplax.proj.nanochat.data.fixtures",
  "laplax.data.chat.mixture": "laplax.proj.nanochat.data.mixture",
  "laplax.evaluators.humaneval": "laplax.proj.nanochat.evaluators.humaneval",
  "laplax.evaluators.sandbox": "laplax.sandbox",
}


def _runs(old: str) -> str:
  """The module that the ``__main__`` block of ``python -m old`` runs, read
  from its source (``runpy.run_module(NAME, ...)``)."""
  spec = importlib.util.find_spec(old)
  path = spec.origin
  if spec.submodule_search_locations is not None:  # a package: its __main__.py
    path = os.path.join(os.path.dirname(path), "__main__.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  calls = [
    n
    for n in ast.walk(tree)
    if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "run_module"
  ]
  assert len(calls) == 1, path
  return calls[0].args[0].value


@pytest.mark.parametrize("old", sorted(OLD_COMMANDS))
def test_old_command_runs_the_moved_module(old):
  new = OLD_COMMANDS[old]
  assert _runs(old) == new
  spec = importlib.util.find_spec(new)
  assert spec is not None
  if spec.submodule_search_locations is not None:
    assert importlib.util.find_spec(f"{new}.__main__") is not None
  else:
    with open(spec.origin, encoding="utf-8") as f:
      assert 'if __name__ == "__main__":' in f.read()


@pytest.mark.subprocess
def test_old_sandbox_command_is_the_new_one(tmp_path):
  """``python -m laplax.evaluators.sandbox`` refuses a zero timeout exactly as
  ``python -m laplax.sandbox`` does: one line, exit 2, nothing run."""
  program = tmp_path / "program.py"
  program.write_text("open('ran', 'w').close()\n")
  results = [
    subprocess.run(
      [sys.executable, "-m", module, "--timeout", "0", str(program)],
      capture_output=True,
      text=True,
      cwd=tmp_path,
      timeout=120,
      env={**os.environ, "PYTHONPATH": ROOT},
    )
    for module in ("laplax.evaluators.sandbox", "laplax.sandbox")
  ]
  assert [r.returncode for r in results] == [2, 2]
  assert results[0].stderr == results[1].stderr
  assert results[0].stderr.startswith("error: ") and results[0].stderr.count("\n") == 1
  assert results[0].stdout == "" and not (tmp_path / "ran").exists()
