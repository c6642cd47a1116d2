"""The base of every error laplax shows its user as one line (docs/errors.md).

Each part derives its class from :class:`UserError`, usually with the built-in it
stands for (``class ConfigError(UserError, ValueError)``). Imports nothing, so any
module can derive from it.
"""


class UserError(Exception):
  """Bad input, shown to the user as one line; the CLIs print ``error: MESSAGE`` and exit 2.

  The message is one line naming the key, flag, file or value and how to fix it.
  Raise a subclass, not this class.
  """
