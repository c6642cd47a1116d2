"""TFDS builder ``fashion_mosaic``: Fashion-MNIST canvases with per-pixel masks.

Made offline from the IDX files (the manual dir, as ``fashion_mnist_idx``) by
:func:`laplax.data.vision.canvases.fashion_canvases` with a fixed seed per split:
``train`` from the training images, ``test`` from the test images. uint8 ``Tensor``
features, read by ``tfds.data_source`` without TensorFlow:

* ``image``: uint8 ``[56, 56, 1]``, 0 where no garment is;
* ``mask``: uint8 ``[56, 56]``, 0 background, ``c + 1`` garment class ``c`` (11);
* ``label``: ``ClassLabel`` of the garment with the most visible pixels (ties: the
  lower class), for DINO's image-level probes.

``fashion_mosaic/default``: 20,000 / 2,000 canvases; ``fashion_mosaic/small``:
2,000 / 500, a prefix of the default (``disable_shuffling=True``).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.builders import fashion_mnist_idx as fmnist
from laplax.data.builders.base import OwnCodePath

CANVAS_SIZE = 56
NUM_MASK_CLASSES = len(fmnist.CLASS_NAMES) + 1  # 0 is background
# numpy.random.default_rng seed of each split's canvases.
SEEDS = {"train": 0, "test": 1}


@dataclasses.dataclass(eq=False)
class FashionMosaicConfig(tfds.core.BuilderConfig):
  """How many canvases each split has (``num_train``, ``num_test``)."""

  num_train: int = 20_000
  num_test: int = 2_000


def largest_garment(masks: np.ndarray) -> np.ndarray:
  """int64 ``[N]`` in ``[0, 10)``: the class with the most pixels in each int ``[N, H, W]`` mask.

  Lowest class among ties; 0 for a mask without garments.
  """
  masks = np.asarray(masks)
  flat = masks.reshape(len(masks), -1).astype(np.int64)
  counts = (
    np.stack([np.bincount(m, minlength=NUM_MASK_CLASSES) for m in flat])
    if len(flat)
    else np.zeros((0, NUM_MASK_CLASSES), np.int64)
  )
  return np.argmax(counts[:, 1:], axis=1)


def make_split(source_dir: str, split: str, num_canvases: int):
  """The first ``num_canvases`` canvases of ``split`` from the IDX files in ``source_dir``.

  ``"train"`` (training images, seed ``SEEDS["train"]``) or ``"test"`` (test images).

  Returns:
    ``(images uint8 [N, 56, 56, 1], masks uint8 [N, 56, 56], labels int64 [N])``.

  Raises:
    FileNotFoundError, fashion_mnist_idx.IdxFormatError: missing or corrupt files.
  """
  from laplax.data.vision import canvases as canvas_lib

  garments, classes = fmnist.read_split(source_dir, split)
  images, masks = canvas_lib.fashion_canvases(
    garments, classes, num_canvases, canvas_size=CANVAS_SIZE, seed=SEEDS[split]
  )
  return images, masks.astype(np.uint8), largest_garment(masks)


class FashionMosaic(OwnCodePath, tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST garments pasted on 56 x 56 canvases, with per-pixel masks."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: uint8 image, mask and largest-garment label."}
  BUILDER_CONFIGS = [
    FashionMosaicConfig(name="default", description="20,000 train and 2,000 test canvases."),
    FashionMosaicConfig(
      name="small", num_train=2_000, num_test=500, description="2,000 train and 500 test canvases."
    ),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = fmnist.FashionMnistIdx.MANUAL_DOWNLOAD_INSTRUCTIONS

  def _info(self) -> tfds.core.DatasetInfo:
    size = (CANVAS_SIZE, CANVAS_SIZE)
    return self.dataset_info_from_configs(
      description=(
        "Canvases of 2-4 Fashion-MNIST garments at random positions; "
        "mask 0 is background, c + 1 garment class c; label: the largest garment."
      ),
      features=tfds.features.FeaturesDict(
        {
          # zlib: most pixels are background, so both compress several-fold.
          "image": tfds.features.Tensor(shape=size + (1,), dtype=np.uint8, encoding="zlib"),
          "mask": tfds.features.Tensor(shape=size, dtype=np.uint8, encoding="zlib"),
          "label": tfds.features.ClassLabel(names=fmnist.CLASS_NAMES),
        }
      ),
      supervised_keys=("image", "mask"),
      homepage="https://github.com/zalandoresearch/fashion-mnist",
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    source_dir = os.fspath(dl_manager.manual_dir)
    fmnist.check_headers(source_dir)
    sizes = {"train": self.builder_config.num_train, "test": self.builder_config.num_test}
    return {split: self._generate_examples(source_dir, split, n) for split, n in sizes.items()}

  def _generate_examples(self, source_dir: str, split: str, num_canvases: int):
    images, masks, labels = make_split(source_dir, split, num_canvases)
    for i in range(num_canvases):
      yield i, {"image": images[i], "mask": masks[i], "label": int(labels[i])}
