"""FineWeb-Edu's parquet shards: the files of a directory and their documents.

The source (``data.source_dir``, default ``$LAPLAX_DATA/fineweb_edu``) is a
directory of parquet files with a ``text`` column, FineWeb-Edu's shards as
nanochat publishes them (``shard_00000.parquet``, ...), sorted by name: the
last is the validation split, the others the train split (Karpathy's
nanochat, ``nanochat/dataset.py``). Each file is read row group by row group
(pyarrow). :mod:`laplax.data.text.fineweb` packs these documents into token
streams; ``python -m laplax.data.text.nanochat_tokenizer`` trains its tokenizer
on them. Every unreadable file or directory raises
:class:`~laplax.data.errors.DataError` (one line).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from laplax.data.errors import DataError
from laplax.utils import first_line

#: The shard directory when ``data.source_dir`` is empty.
DEFAULT_SOURCE_DIR = os.path.join(os.environ.get("LAPLAX_DATA", "~/.cache/laplax"), "fineweb_edu")
#: The parquet column holding each document's text.
TEXT_COLUMN = "text"


def list_shards(source_dir: str) -> list[str]:
  """The ``*.parquet`` files of ``source_dir``, sorted by name (train, then validation last).

  Raises:
    DataError: the directory is missing or holds fewer than two parquet files, or
      is a ``gs://`` URL.
  """
  from laplax.data.common import local_only

  local_only(source_dir or DEFAULT_SOURCE_DIR, "source_dir")
  directory = os.path.expanduser(source_dir or DEFAULT_SOURCE_DIR)
  if not os.path.isdir(directory):
    raise DataError(
      f"FineWeb-Edu directory {directory} does not exist; put the parquet "
      "shards there or set --config.data.source_dir=DIR."
    )
  names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
  if len(names) < 2:
    raise DataError(
      f"FineWeb-Edu directory {directory} has {len(names)} parquet file(s); it "
      "needs at least two (the last one is the validation split)."
    )
  return [os.path.join(directory, n) for n in names]


def _parquet_file(path: str):
  import pyarrow.parquet as pq

  try:
    pf = pq.ParquetFile(path)
    if TEXT_COLUMN not in pf.schema_arrow.names:
      raise ValueError(f"no {TEXT_COLUMN!r} column (columns: {pf.schema_arrow.names})")
    return pf
  except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
    raise DataError(
      f"Cannot read the parquet shard {path} ({first_line(e)}); replace or remove it."
    ) from None


def row_group_counts(paths: Sequence[str]) -> list[int]:
  """Row groups in each file (from the parquet footers).

  Raises:
    DataError: a file is not parquet or has no ``text`` column.
  """
  return [_parquet_file(p).metadata.num_row_groups for p in paths]


def read_row_group(path: str, index: int) -> list[str]:
  """The ``text`` values of row group ``index`` of ``path``.

  Raises:
    DataError: unreadable file.
  """
  try:
    return (
      _parquet_file(path)
      .read_row_group(index, columns=[TEXT_COLUMN])
      .column(TEXT_COLUMN)
      .to_pylist()
    )
  except DataError:
    raise
  except Exception as e:  # pyarrow: ArrowInvalid, OSError
    raise DataError(f"Cannot read row group {index} of {path} ({first_line(e)}).") from None


def iter_documents(paths: Sequence[str]) -> Iterator[str]:
  """Every document of ``paths``, file by file, row group by row group."""
  for path, count in zip(paths, row_group_counts(paths)):
    for index in range(count):
      yield from read_row_group(path, index)
