"""The one user-facing exception of :mod:`laplax.data`."""

from laplax.errors import UserError


class DataError(UserError, ValueError):
  """A user-facing data problem; the message is one line: what is wrong and the fix."""


def corrupt_prepared(what: str, directory: str, error: BaseException) -> DataError:
  """The :class:`DataError` for prepared dataset files that cannot be read.

  Args:
    what: which files, e.g. ``"split 'train' of 'fashion_mnist_idx'"``.
    directory: the folder to delete so that the next run prepares it anew.
    error: what the reader raised (array_record: RuntimeError, OSError, ...);
      its message is quoted on one line, at most 200 characters.
  """
  detail = " ".join(str(error).split())[:200] or type(error).__name__
  return DataError(
    f"The prepared files of {what} are corrupt ({detail}); delete "
    f"{directory} and run again to prepare them anew."
  )
