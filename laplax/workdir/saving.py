"""Failed writes (a full disk, a read-only or vanished file system) as one line.

Every file ``train.py`` and ``eval.py`` write -- checkpoints, ``metrics.jsonl``,
``config.json``, TensorBoard events, ``eval.json``, ``analysis.json`` and the
figures -- goes through :func:`guard` (or, for orbax's checkpoints,
:func:`os_error` on what its threads raise), so that an operating-system error
becomes a :class:`SaveError`: one line naming what could not be written, where,
why, and the last complete checkpoint, which the CLIs print as ``error: ...``
with exit code 2.

tensorstore (orbax's storage layer) reports a failed write as
``ValueError: RESOURCE_EXHAUSTED: ... [os_error_code='28']``, not as an
``OSError``; :func:`os_error` reads the code from the text.
"""

from __future__ import annotations

import contextlib
import errno as errno_lib
import os
import re
import shutil
from collections.abc import Callable, Iterator

from laplax.errors import UserError

_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


class SaveError(UserError, RuntimeError):
  """A file of a run could not be written; the message is one line."""


def os_error(exc: BaseException) -> tuple[int | None, str] | None:
  """``(errno, reason)`` when ``exc`` (or an exception it was raised from) is
  an operating-system error, e.g. ``(28, "no space left on device")``;
  ``None`` otherwise."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and (exc.errno or exc.strerror):
      code = exc.errno
      return code, (exc.strerror or os.strerror(code)).lower()
    m = _OS_ERROR_CODE.search(str(exc))
    if m:
      code = int(m.group(1))
      return code, os.strerror(code).lower()
    if "No space left on device" in str(exc):
      return errno_lib.ENOSPC, os.strerror(errno_lib.ENOSPC).lower()
    exc = exc.__cause__ or exc.__context__
  return None


def megabytes(n: int) -> str:
  """``n`` bytes as ``"11 MB"`` (``"0.3 MB"`` below 10 MB)."""
  mb = n / 1e6
  return f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1g} MB" if mb < 1 else f"{mb:.1f} MB"


def message(
  reason: str,
  what: str,
  where: str,
  last_step: int | None = None,
  needed: int | None = None,
  training: bool = True,
) -> str:
  """The one line of a failed write: ``REASON while saving WHAT in WHERE
  (about N MB needed); last complete checkpoint: step S; HOW TO GO ON``
  (``training=False``: ``eval.py``, without the checkpoint)."""
  need = f" (about {megabytes(needed)} needed)" if needed else ""
  fix = "free space" if "no space" in reason or "quota" in reason else "fix the cause"
  if not training:
    return f"{reason} while saving {what} in {where}{need}; {fix} and run the same command again"
  last = (
    "no complete checkpoint yet"
    if last_step is None
    else f"last complete checkpoint: step {last_step}"
  )
  return (
    f"{reason} while saving {what} in {where}{need}; {last}; {fix} and run "
    f"the same command to resume"
  )


@contextlib.contextmanager
def guard(
  what: str, where: str, last_step: Callable[[], int | None] | None = None
) -> Iterator[None]:
  """Turns an OS error raised inside into a :class:`SaveError` naming ``what``
  (e.g. ``"metrics.jsonl"``), ``where`` (its directory) and, in training,
  ``last_step()`` (the newest complete checkpoint; ``None``: not training);
  other exceptions pass unchanged."""
  try:
    yield
  except SaveError:
    raise
  except Exception as e:
    err = os_error(e)
    if err is None:
      raise
    raise SaveError(
      message(
        err[1], what, where, last_step() if last_step else None, training=last_step is not None
      )
    ) from None


def tree_size(path: str) -> int:
  """Bytes the file system gives ``path`` and everything under it (0 if it
  does not exist): per file and directory the larger of its length and its
  allocated blocks (``st_blocks * 512``), since a checkpoint of many small
  files takes more space than its files' lengths add up to; gs://: the
  objects' sizes)."""
  from laplax import store

  if store.is_remote(path):
    return sum(store.files_under(path).values())
  total = 0
  for root, dirs, files in os.walk(path):
    for name in [*dirs, *files, *([""] if root == path else [])]:
      with contextlib.suppress(OSError):
        st = os.lstat(os.path.join(root, name))
        total += max(st.st_size if name in files else 0, st.st_blocks * 512)
  return total


def free_bytes(path: str) -> int | None:
  """Free bytes on the file system of ``path`` for this user, or ``None`` (also gs://)."""
  if "://" in str(path):
    return None
  try:
    return shutil.disk_usage(path).free
  except OSError:
    return None
