"""A run's metric records: ``metrics.jsonl`` on a local disk, one object per record under ``metrics/`` in an object store.

An object store has no append and no rename, so a ``gs://`` workdir keeps its
metrics as ``metrics/0000000000.jsonl``, ``metrics/0000000001.jsonl``, ...:
each a complete JSON line, uploaded once with a create-if-absent
precondition (``ifGenerationMatch=0``); read back in the order of their
numbers they are the lines ``metrics.jsonl`` would hold. A run killed
mid-upload leaves no partial object. Local workdirs keep ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys

from laplax import store

PREFIX = "metrics"
METRICS_FILE = "metrics.jsonl"  # a local workdir's records


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


def metric_lines(workdir: str) -> list[str]:
  """The records of ``workdir``'s metrics as JSON lines, in the order written
  (``metrics.jsonl``, or the record objects of a ``gs://`` workdir); ``[]``
  when there are none."""
  if store.is_remote(workdir):
    return [line for _, line in lines(workdir)]
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [line for line in f if line.strip()]
