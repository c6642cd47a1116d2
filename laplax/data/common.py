"""What the image and text pipelines share: the data directory and grain's read options."""

from __future__ import annotations

import os

import grain
import ml_collections


def data_dir(data_config: ml_collections.ConfigDict) -> str:
  """The TFDS data directory ``data_config.data_dir`` with ``~`` expanded."""
  return os.path.expanduser(data_config.data_dir)


def read_options(data_config: ml_collections.ConfigDict) -> grain.ReadOptions:
  """grain's read options from ``data_config.num_threads`` and ``data_config.prefetch``."""
  return grain.ReadOptions(
    num_threads=int(data_config.num_threads),
    prefetch_buffer_size=int(data_config.prefetch),
  )
