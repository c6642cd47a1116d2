"""What the image and text pipelines share: the data directory and grain's read options."""

from __future__ import annotations

import os

import grain
import ml_collections


def local_only(path: str, key: str) -> None:
  """Refuses an object-store URL (``gs://...``) for a data folder read from local disk.

  TFDS's array_record files and the parquet shards are read through local
  file APIs (grain's ``ArrayRecordDataSource``, pyarrow on a path), so the
  data is copied to local disk first (docs/workdir.md, "Object stores").

  Raises:
    DataError: ``path`` is a URL.
  """
  if "://" in str(path):
    from laplax.data.errors import DataError

    raise DataError(
      f"--config.data.{key}={path}: data is read from local disk; copy it there first "
      f"(gcloud storage cp -r {str(path).rstrip('/')} /tmp/data) and give that folder"
    )


def data_dir(data_config: ml_collections.ConfigDict) -> str:
  """The TFDS data directory ``data_config.data_dir`` with ``~`` expanded.

  Raises:
    DataError: it is a ``gs://`` URL (:func:`local_only`).
  """
  local_only(data_config.data_dir, "data_dir")
  return os.path.expanduser(data_config.data_dir)


def read_options(data_config: ml_collections.ConfigDict) -> grain.ReadOptions:
  """grain's read options from ``data_config.num_threads`` and ``data_config.prefetch``."""
  return grain.ReadOptions(
    num_threads=int(data_config.num_threads),
    prefetch_buffer_size=int(data_config.prefetch),
  )
