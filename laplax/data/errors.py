"""The one user-facing exception of :mod:`laplax.data`."""


class DataError(ValueError):
  """A user-facing data problem; the message is one line: what is wrong and the fix."""
