"""TFDS builder for Fashion-MNIST read from local gzipped IDX files.

The four ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` files are read from the
TFDS manual dir (``DownloadConfig(manual_dir=source_dir)``). uint8 ``Tensor``
features (not ``Image``): ``tfds.data_source`` reads them without TensorFlow or PIL.
IDX file order is kept (``disable_shuffling=True``).
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.builders.base import OwnCodePath
from laplax.errors import UserError

DEFAULT_SOURCE_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_COMMAND = "sudo apt-get install -y dataset-fashion-mnist"
CLASS_NAMES = (
  "t-shirt_top",
  "trouser",
  "pullover",
  "dress",
  "coat",
  "sandal",
  "shirt",
  "sneaker",
  "bag",
  "ankle_boot",
)
IMAGE_SHAPE = (28, 28, 1)
NUM_EXAMPLES = {"train": 60_000, "test": 10_000}
_FILE_PREFIX = {"train": "train", "test": "t10k"}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049  # 0x00000803 (uint8, 3 dims), 0x00000801


class IdxFormatError(UserError, ValueError):
  """An IDX source file is malformed; ``path`` names the offending file."""

  def __init__(self, path: str, problem: str):
    super().__init__(f"{path}: {problem}")
    self.path, self.problem = path, problem


def source_files(source_dir: str) -> dict[str, tuple[str, str]]:
  """Maps split name -> (images path, labels path) inside ``source_dir``."""
  return {
    split: (
      os.path.join(source_dir, f"{prefix}-images-idx3-ubyte.gz"),
      os.path.join(source_dir, f"{prefix}-labels-idx1-ubyte.gz"),
    )
    for split, prefix in _FILE_PREFIX.items()
  }


def _read_idx(path: str, magic: int, shape: tuple[int, ...], header_only: bool = False):
  """Reads an IDX file, checking magic number, dims and size; uint8 array of ``shape``."""
  ndim = len(shape)
  try:
    with gzip.open(path, "rb") as f:
      header = f.read(4 + 4 * ndim)
      data = b"" if header_only else f.read()
  except FileNotFoundError:
    raise
  except (OSError, EOFError, zlib.error) as e:
    raise IdxFormatError(path, f"not a readable gzip file ({e})") from e
  if len(header) < 4 + 4 * ndim:
    raise IdxFormatError(path, "file too short for an IDX header")
  found_magic, *dims = (int(v) for v in np.frombuffer(header, dtype=">u4"))
  if found_magic != magic:
    raise IdxFormatError(path, f"bad IDX magic number {found_magic:#010x}, expected {magic:#010x}")
  if tuple(dims) != shape:
    raise IdxFormatError(path, f"IDX dimensions {tuple(dims)}, expected {shape}")
  if header_only:
    return None
  if len(data) != int(np.prod(shape)):
    raise IdxFormatError(path, f"{len(data)} data bytes, expected {int(np.prod(shape))}")
  return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _file_specs(source_dir: str, split: str):
  images_path, labels_path = source_files(source_dir)[split]
  n = NUM_EXAMPLES[split]
  return (images_path, _IMAGES_MAGIC, (n, *IMAGE_SHAPE[:2])), (labels_path, _LABELS_MAGIC, (n,))


def check_headers(source_dir: str) -> None:
  """Validates magic numbers, counts and image sizes of all four files (headers only).

  Raises:
    FileNotFoundError: a missing file. IdxFormatError: a malformed one (named).
  """
  for split in NUM_EXAMPLES:
    for spec in _file_specs(source_dir, split):
      _read_idx(*spec, header_only=True)


def read_split(source_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """``(images uint8 [N, 28, 28, 1], labels uint8 [N])`` of ``split``.

  Raises:
    IdxFormatError: a wrong header, size or label (the file named).
  """
  images_spec, labels_spec = _file_specs(source_dir, split)
  images, labels = _read_idx(*images_spec), _read_idx(*labels_spec)
  if labels.max() >= len(CLASS_NAMES):
    raise IdxFormatError(labels_spec[0], f"label {labels.max()} out of range [0, 10)")
  return images[..., None], labels


class FashionMnistIdx(OwnCodePath, tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST (Xiao et al. 2017) from local IDX files."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: uint8 Tensor images, IDX order."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Place the four Fashion-MNIST *-ubyte.gz IDX files in the manual dir, e.g. "
    f"`{INSTALL_COMMAND}` puts them in {DEFAULT_SOURCE_DIR}."
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      description="Fashion-MNIST 28x28 grayscale images of 10 clothing classes.",
      features=tfds.features.FeaturesDict(
        {
          # Raw bytes: the default encoding stores every pixel as an int64,
          # which doubles the time to prepare and slows reading.
          "image": tfds.features.Tensor(shape=IMAGE_SHAPE, dtype=np.uint8, encoding="bytes"),
          "label": tfds.features.ClassLabel(names=CLASS_NAMES),
        }
      ),
      supervised_keys=("image", "label"),
      homepage="https://github.com/zalandoresearch/fashion-mnist",
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    source_dir = os.fspath(dl_manager.manual_dir)
    check_headers(source_dir)
    return {split: self._generate_examples(source_dir, split) for split in NUM_EXAMPLES}

  def _generate_examples(self, source_dir: str, split: str):
    images, labels = read_split(source_dir, split)
    for i in range(len(labels)):
      yield i, {"image": images[i], "label": int(labels[i])}
