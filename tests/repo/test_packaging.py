"""The package as pip installs it, checked without installing: pyproject.toml's
console scripts and dependency ranges against the pinned requirements files,
the public API of ``laplax/__init__.py``, and README's "Use it in your own
model" snippet, run as written."""

import contextlib
import importlib
import inspect
import io
import os
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers.runs import ROOT, run_in_process

# Extras whose packages are not pinned in any requirements file: Jupyter's
# front end (the notebook's CI run needs only nbclient, nbformat, ipykernel).
UNPINNED = {"notebook": {"jupyter"}}


def _pyproject() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def _pins(name: str) -> dict:
  """``{canonical name: Requirement}`` of a requirements file's own lines
  (not those of the files it includes with ``-r``)."""
  pins = {}
  with open(os.path.join(ROOT, name)) as f:
    for line in f:
      line = line.split("#", 1)[0].strip()
      if not line or line.startswith("-r "):
        continue
      req = Requirement(line)
      assert canonicalize_name(req.name) not in pins, f"{name}: {req.name} twice"
      pins[canonicalize_name(req.name)] = req
  return pins


def _ranges(requirements: list[str]) -> dict:
  return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


def _check_pins_in_ranges(pins: dict, ranges: dict, unpinned=frozenset()) -> None:
  """Every pin is ``==`` one version inside its range (same extras), and every
  range (but ``unpinned``) has a pin."""
  assert set(ranges) - set(unpinned) <= set(pins), (
    f"not pinned: {sorted(set(ranges) - set(pins) - set(unpinned))}"
  )
  for name, pin in pins.items():
    assert name in ranges, f"{pin} is pinned but not a dependency in pyproject.toml"
    specs = list(pin.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"{pin} is not an exact pin"
    version = specs[0].version
    assert ranges[name].specifier.contains(version), f"{pin} is outside {ranges[name]}"
    assert pin.extras == ranges[name].extras, (pin, ranges[name])


def test_requirements_pins_lie_in_the_pyproject_ranges():
  project = _pyproject()["project"]
  extras = project["optional-dependencies"]
  base = _pins("requirements.txt")
  assert len(base) >= 20  # the whole file was read
  _check_pins_in_ranges(base, _ranges(project["dependencies"]))
  test_pins = _pins("requirements-test.txt")
  _check_pins_in_ranges(test_pins, _ranges(extras["test"]))
  _check_pins_in_ranges(_pins("requirements-tpu.txt"), _ranges(extras["tpu"]))
  _check_pins_in_ranges(_pins("requirements-cuda.txt"), _ranges(extras["cuda"]))
  for accelerator in ("tpu", "cuda"):  # JAX's plugin at the JAX version of requirements.txt
    (jax,) = _pins(f"requirements-{accelerator}.txt").values()
    assert jax.name == "jax" and jax.specifier == base["jax"].specifier, jax
  _check_pins_in_ranges(_pins("requirements-bench.txt"), _ranges(extras["bench"]))
  _check_pins_in_ranges(_pins("requirements-docs.txt"), _ranges(extras["docs"]))
  assert _pins("requirements-bench.txt")["torch"] == test_pins["torch"]  # one torch
  every_pin = {**base, **test_pins}
  notebook = _ranges(extras["notebook"])
  _check_pins_in_ranges(
    {k: v for k, v in every_pin.items() if k in notebook}, notebook, UNPINNED["notebook"]
  )
  for name in (
    "requirements-test.txt",
    "requirements-tpu.txt",
    "requirements-cuda.txt",
    "requirements-bench.txt",
    "requirements-docs.txt",
  ):
    with open(os.path.join(ROOT, name)) as f:
      assert f.readline().strip() == "-r requirements.txt", name


def test_pin_check_catches_a_pin_outside_its_range():
  ranges = _ranges(["jax>=0.10.2,<0.11"])
  with pytest.raises(AssertionError, match="outside"):
    _check_pins_in_ranges({"jax": Requirement("jax==0.11.0")}, ranges)
  with pytest.raises(AssertionError, match="not pinned"):
    _check_pins_in_ranges({}, ranges)
  with pytest.raises(AssertionError, match="not an exact pin"):
    _check_pins_in_ranges({"jax": Requirement("jax>=0.10.2")}, ranges)


def test_console_scripts_are_the_checkout_scripts_entry_points():
  """``laplax-train`` / ``laplax-eval`` name callables in the package, the
  same functions ``python train.py`` / ``python eval.py`` run; ``laplax-chat``
  is what ``python -m laplax.proj.nanochat.chat`` runs."""
  scripts = _pyproject()["project"]["scripts"]
  assert set(scripts) == {"laplax-train", "laplax-eval", "laplax-chat"}
  module_name, _, attribute = scripts["laplax-chat"].partition(":")
  target = getattr(importlib.import_module(module_name), attribute)
  assert importlib.import_module("laplax.proj.nanochat.chat.__main__").run_cli is target
  for command, script in (("laplax-train", "train"), ("laplax-eval", "eval")):
    module_name, _, attribute = scripts[command].partition(":")
    assert module_name.startswith("laplax."), scripts[command]
    target = getattr(importlib.import_module(module_name), attribute)
    assert callable(target) and inspect.signature(target).parameters == {}
    assert importlib.import_module(script).run_cli is target


@pytest.mark.parametrize(
  "script,words",
  [
    ("train.py", ["laplax-train --config configs/", "--config", "--workdir"]),
    ("eval.py", ["laplax-eval --workdir", "--step", "--out", "--analysis"]),
  ],
)
def test_help_names_the_commands_and_their_flags(script, words, capfd):
  """``--help`` prints the package module's docstring and flags, also when
  ``__main__`` is not the module (pip's console-script launcher)."""
  r = run_in_process([script, "--help"], capfd)
  assert r.returncode == 0, r.stderr
  assert all(w in r.stdout for w in words), r.stdout[-2000:]


@pytest.mark.subprocess
def test_public_api_resolves_with_docstrings_and_import_stays_light():
  code = (
    "import sys, laplax; heavy = [m for m in ('jax', 'flax', 'numpy', 'optax', "
    "'laplax.attention', 'laplax.train') if m in sys.modules]; "
    "print(heavy, sorted(set(laplax.__all__) - set(dir(laplax))))"
  )
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0 and r.stdout.strip() == "[] []", (r.stdout, r.stderr[-2000:])
  import laplax

  names = [n for n in laplax.__all__ if n != "__version__"]
  for name in (
    "attend",
    "MultiHeadAttention",
    "correction",
    "condition_number",
    "ViT",
    "GPT",
    "DINO",
    "build_spec",
    "load",
    "run_analysis",
  ):
    assert name in names, name
  for name in names:
    value = getattr(laplax, name)
    doc = vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__
    assert doc and len(doc.strip()) > 40, f"laplax.{name} has no docstring of its own"
  from laplax import attention, spectral
  from laplax.models import spec

  assert laplax.attend is attention.attend and laplax.correction is spectral.correction
  assert laplax.build_spec is spec.build
  with pytest.raises(AttributeError, match="no attribute 'attention_heads'"):
    _ = laplax.attention_heads
  assert re.fullmatch(r"\d+\.\d+\.\d+", laplax.__version__)


def _readme_snippet() -> tuple[str, str]:
  """The code block under README's "## Use it in your own model" heading and
  the ``text`` block after it (what it prints)."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  section = text.split("\n## Use it in your own model\n", 1)[1].split("\n## ", 1)[0]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  printed = re.search(r"```text\n(.*?)```", section, re.S).group(1)
  return code, printed


def test_readme_snippet_runs_as_written_and_prints_what_readme_says():
  code, printed = _readme_snippet()
  assert 10 <= len(code.strip().splitlines()) <= 25
  namespace = {"__name__": "readme"}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, "README.md", "exec"), namespace)
  assert out.getvalue() == printed
  import jax

  params, grads, w_q = namespace["params"], namespace["grads"], namespace["w_q"]
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
  assert all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in jax.tree_util.tree_leaves(grads))
  # The printed condition numbers against NumPy: W_Q alone, and with the
  # rectangular identity of Theorem 3.8 (the "full" layout: eye(64, 64)).
  w = np.asarray(w_q, np.float64)
  assert f"kappa(W_Q) = {np.linalg.cond(w):.1f}" in printed
  assert f"kappa(W_Q + 10 I_k) = {np.linalg.cond(w + 10.0 * np.eye(*w.shape)):.2f}" in printed
