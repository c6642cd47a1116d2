"""The base of every error laplax shows its user as one line.

A :class:`UserError` is bad input -- a config, a flag, a file, a dataset, a
workdir -- not a bug. Each part of laplax derives its own class from it
(:class:`~laplax.config.validation.ConfigError`,
:class:`~laplax.data.errors.DataError`,
:class:`~laplax.workdir.lock.LockError`, ...), usually together with the
built-in it stands for (``class ConfigError(UserError, ValueError)``) so
that ``except ValueError`` keeps catching it. The command-line programs
(``train.py``, ``eval.py``, ``python -m laplax.convert``,
``python -m laplax.sweep``, ``python -m laplax.evaluators.sandbox``,
``python -m laplax.evaluators.humaneval``,
``python -m laplax.cli.lm_harness``) catch this one class, print
``error: MESSAGE`` on stderr and exit with code 2, with no traceback and
nothing written. See the documentation page on errors (``docs/errors.md``).

This module imports nothing, so that any module can derive from it.
"""


class UserError(Exception):
  """Bad input, shown to the user as one line; the CLIs print it and exit 2.

  The contract: the message is one line (no newline) that says what is wrong
  -- naming the key, flag, file or value -- and how to fix it, e.g. ``"runs/vit
  has no checkpoint; train first with train.py --workdir runs/vit"``. Raise a
  subclass (the one of the part of laplax that found the problem), not this
  class itself.
  """
