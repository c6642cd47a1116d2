"""``metrics.jsonl`` in an object store: one object per record under ``metrics/``.

An object store has no append and no rename, so a ``gs://`` workdir keeps its
metrics as ``metrics/0000000000.jsonl``, ``metrics/0000000001.jsonl``, ...:
each a complete JSON line, uploaded once with a create-if-absent
precondition (``ifGenerationMatch=0``); read back in the order of their
numbers they are the lines ``metrics.jsonl`` would hold. A run killed
mid-upload leaves no partial object. Local workdirs keep ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import sys

from laplax import store

PREFIX = "metrics"


def _path(workdir: str, index: int) -> str:
  return store.join(workdir, PREFIX, f"{index:010d}.jsonl")


def indices(workdir: str) -> list[int]:
  """The numbers of the record objects of ``workdir``, ascending."""
  names = store.listdir(store.join(workdir, PREFIX))
  return sorted(int(n.split(".")[0]) for n in names if n.endswith(".jsonl") and n[:-6].isdigit())


def append(workdir: str, index: int, line: str) -> None:
  """Uploads record object ``index`` holding ``line`` (one JSON line).

  Raises:
    StoreError: the object exists already (another writer) or the upload failed.
  """
  if store.create(_path(workdir, index), line) is None:
    raise store.StoreError(
      f"{_path(workdir, index)} exists: another train.py writes workdir {workdir}"
    )


def lines(workdir: str) -> list[tuple[int, str]]:
  """``(index, line)`` of every record object of ``workdir``, in order."""
  return [(i, store.read_text(_path(workdir, i))) for i in indices(workdir)]


def _step(line: str) -> int:
  try:
    return int(json.loads(line).get("step", 0))
  except (ValueError, AttributeError, TypeError):
    return sys.maxsize


def drop_after(workdir: str, step: int) -> None:
  """Removes the records newer than ``step`` (left by a run killed after it)."""
  for index, line in lines(workdir):
    if _step(line) > step:
      store.remove(_path(workdir, index))
