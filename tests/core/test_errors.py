"""One base for the one-line errors: :class:`laplax.errors.UserError`.

Every exception class defined in ``laplax/`` derives from it, except the few
listed in :data:`INTERNAL` with the reason; the CLIs catch that one class
(one ``error:`` line on stderr, exit code 2), and the base is documented.
"""

import ast
import importlib
import os
import sys

import pytest

from laplax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "laplax")

# Exception classes of laplax that are not shown to a user as a line, each
# with the reason; every other one must derive from UserError.
INTERNAL = {
  # A KeyboardInterrupt raised by laplax's SIGINT/SIGTERM handler to unwind
  # the main thread; cli.run turns it into the signal's exit line (130/143).
  "laplax.signals.Signalled",
  # Raised inside a sandbox for a value that is not plain data (a program's
  # answer of a non-builtin type); it fails that run, recorded in the
  # result's status, not shown as laplax's error line.
  "laplax.sandbox.child.NotPlainData",
  # Raised in the HumanEval checker for a program's exception that is not
  # a builtin one; it fails the check, recorded in the result's status.
  "laplax.sandbox.child._RemoteError",
  # A sandbox's line over the caller's limit; caught in the caller's loop
  # and turned into the run's failed status.
  "laplax.sandbox._Flood",
  # The TypeError a sandboxed program gets for a refused call (nanochat's
  # ``None``-ed builtins raise one); it is the program's error, recorded in
  # the result, not laplax's.
  "laplax.sandbox.child.SandboxRefused",
  # A chat request's body that is not JSON or breaks a bound; the server
  # answers it with a 400 of its one line, never the CLI's error line.
  "laplax.proj.nanochat.chat.body.BodyError",
}


def _modules_with_classes() -> list[str]:
  """Dotted names of the laplax modules (``__main__`` entry points left out:
  they define absl flags and no classes) whose source defines a class."""
  names = []
  for folder, _, files in os.walk(PACKAGE):
    for file in sorted(files):
      if not file.endswith(".py") or file == "__main__.py":
        continue
      path = os.path.join(folder, file)
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
      if any(isinstance(node, ast.ClassDef) for node in ast.walk(tree)):
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        names.append(module.removesuffix(".__init__"))
  return sorted(names)


def _exception_classes() -> dict[str, type]:
  """``{module.Name: class}`` of every exception class defined at the top
  level of a laplax module."""
  found = {}
  for name in _modules_with_classes():
    module = importlib.import_module(name)
    for attribute, value in vars(module).items():
      if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == name:
        found[f"{name}.{attribute}"] = value
  return found


def test_every_exception_class_of_laplax_is_a_user_error_or_listed_internal():
  classes = _exception_classes()
  assert len(classes) >= 20  # the walk found them (19 user errors today)
  assert INTERNAL <= set(classes), sorted(INTERNAL - set(classes))
  not_user = sorted(
    n for n, c in classes.items() if not issubclass(c, UserError) and n not in INTERNAL
  )
  assert not not_user, (
    f"{not_user} are not laplax.errors.UserError subclasses: derive "
    f"them from it or list them in INTERNAL with the reason"
  )
  internal_user = sorted(n for n in INTERNAL if issubclass(classes[n], UserError))
  assert not internal_user, f"{internal_user} are UserErrors: take them out of INTERNAL"


def test_user_errors_keep_their_builtin_base():
  """``except ValueError`` / ``except RuntimeError`` callers still catch them."""
  from laplax.config import validation as config
  from laplax.data.errors import DataError
  from laplax.train import fit, loop
  from laplax.workdir import saving

  assert issubclass(DataError, ValueError) and issubclass(config.ConfigError, ValueError)
  assert issubclass(fit.FitError, config.ConfigError)
  assert issubclass(saving.SaveError, RuntimeError) and issubclass(
    loop.NonFiniteError, RuntimeError
  )
  assert all(
    issubclass(c, UserError)
    for c in (DataError, config.ConfigError, saving.SaveError, loop.NonFiniteError)
  )


@pytest.mark.subprocess
def test_cli_run_prints_any_user_error_as_one_line_exit_2(capsys):
  """A UserError that no CLI names (a checksum mismatch) is one line and exit 2."""
  from laplax.cli import common as cli
  from laplax.workdir import integrity

  def main(guard):
    raise integrity.ChecksumError("checksum mismatch in step_6/params; delete step_6")

  with pytest.raises(SystemExit) as exit_info:
    cli.run(main, command="test")
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == "error: checksum mismatch in step_6/params; delete step_6\n"


@pytest.mark.subprocess
def test_cli_run_lets_a_bug_through():
  """A ValueError that is not a UserError is a bug: it is not swallowed."""
  from laplax.cli import common as cli

  def main(guard):
    raise ValueError("a bug")

  with pytest.raises(ValueError, match="a bug"):
    cli.run(main, command="test")


def test_lm_harness_cli_prints_a_user_error_as_one_line_exit_2(monkeypatch, capsys):
  """``python -m laplax.cli.lm_harness``: a workdir that cannot be
  loaded (raised inside lm_eval's command line) is one line and exit 2."""
  lm_eval_main = pytest.importorskip("lm_eval.__main__")
  from laplax import loading as restore
  from laplax.cli import lm_harness

  def cli_evaluate():
    raise restore.LoadError("runs/x has no checkpoint; train first with train.py")

  monkeypatch.setattr(lm_eval_main, "cli_evaluate", cli_evaluate)
  monkeypatch.setattr(sys, "argv", ["lm_harness"])
  with pytest.raises(SystemExit) as exit_info:
    lm_harness.main(["--model", "laplax"])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == ("error: runs/x has no checkpoint; train first with train.py\n")


def test_user_error_is_documented():
  assert "one line" in UserError.__doc__ and "exit 2" in UserError.__doc__
  with open(os.path.join(ROOT, "docs", "errors.md"), encoding="utf-8") as f:
    page = f.read()
  assert "{class}`~laplax.errors.UserError`" in page or "{class}`laplax.errors.UserError`" in page
