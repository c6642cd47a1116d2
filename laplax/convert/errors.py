"""The one error class of the converters (its own module so that the writers
of :mod:`laplax.convert.common` and :mod:`laplax.convert.remote` share it
without importing each other)."""

from laplax.errors import UserError


class ConvertError(UserError, ValueError):
  """A conversion that cannot be done; the message is one line naming the
  tensor, key or file and the fix."""
