"""Images with per-pixel class masks, for the linear segmentation probe of DINO runs.

Images and masks at the backbone's input size ``S``: the central square resized
bilinearly, the mask by nearest neighbour at the same pixel centres. Sources
(``config.eval.segmentation_dataset``; docs/dino.md):

* the run's own dataset when it has a ``mask`` feature (``fashion_mosaic``);
  ``label.num_classes + 1`` classes, 0 background;
* ``fashion_canvases``: canvases of the run's Fashion-MNIST images
  (:func:`laplax.data.vision.canvases.fashion_canvases`, seeds
  ``fashion_mosaic.SEEDS``, from the first ``CANVAS_POOL * n`` images), built at
  56 px and resized to ``S``; 11 classes;
* ``ade20k``: ADEChallengeData2016 in ``config.eval.segmentation_dir``
  (:mod:`laplax.data.vision.ade20k`); 150 classes, 0 ignored;
* ``scene_parse150``: TFDS's data in ``data.data_dir``, splits ``train``/``test``;
  red channel ``c`` in 1..150 -> ``c - 1``, else ignored. TFDS 4.9 builds it from
  the Places Challenge 2017 instance masks (100 categories), so it is not the
  ADE20K benchmark.

Raises :class:`~laplax.data.errors.DataError` (one line) for a dataset that is not
prepared, unreadable, or whose channels do not fit the backbone.
"""

from __future__ import annotations

from typing import NamedTuple

import ml_collections
import numpy as np

from laplax.data.builders import fashion_mosaic
from laplax.data.errors import DataError
from laplax.data.vision import ade20k, augment, images

SCENE_PARSE150 = "scene_parse150"
SCENE_PARSE150_CLASSES = 150
SCENE_PARSE150_SPLITS = ("train", "test")
FASHION_CANVASES = "fashion_canvases"
ADE20K = ade20k.NAME
AUTO = "auto"
DATASETS = (AUTO, FASHION_CANVASES, SCENE_PARSE150, ADE20K)
# Datasets whose images are Fashion-MNIST garments (the canvases' material).
FASHION_MNIST_NAMES = ("fashion_mnist_idx", "fashion_mnist")
# Canvases of n images draw their garments from the first CANVAS_POOL * n
# images of the split (reading all 60,000 would take seconds).
CANVAS_POOL = 10
IGNORE = -1


class SegmentationData(NamedTuple):
  """Train and test images with their masks.

  Attributes:
    train_images: float32 ``[N, S, S, C]``, normalised as the run's images.
    train_masks: int32 ``[N, S, S]`` in ``[0, num_classes)``, -1 ignored.
    test_images: float32 ``[M, S, S, C]``; test_masks: int32 ``[M, S, S]``.
    num_classes: background included where it is one.
    name: the dataset's name, ``fashion_canvases``, ``scene_parse150`` or ``ade20k``.
  """

  train_images: np.ndarray
  train_masks: np.ndarray
  test_images: np.ndarray
  test_masks: np.ndarray
  num_classes: int
  name: str


def is_fashion_mnist(data_config: ml_collections.ConfigDict) -> bool:
  """True if the run reads Fashion-MNIST (the canvases' garments)."""
  return data_config.name.split("/")[0] in FASHION_MNIST_NAMES


def has_masks(data_config: ml_collections.ConfigDict) -> bool:
  """True if the run's dataset has a ``mask`` feature (e.g. ``fashion_mosaic``).

  Raises:
    DataError: the dataset is not prepared or unreadable.
  """
  source = images._open(data_config, data_config.train_split)
  return "mask" in source.dataset_info.features


def resolve(data_config: ml_collections.ConfigDict, dataset: str) -> str | None:
  """Which source ``dataset`` (a value of :data:`DATASETS`) means for this run.

  ``"masks"``, ``"fashion_canvases"``, ``"scene_parse150"``, ``"ade20k"``, or ``None``
  for ``"auto"`` when there is nothing to evaluate on.

  Raises:
    DataError: the run's dataset is unreadable.
  """
  if dataset in (SCENE_PARSE150, FASHION_CANVASES, ADE20K):
    return dataset
  if has_masks(data_config):
    return "masks"
  return FASHION_CANVASES if is_fashion_mnist(data_config) else None


def _square(raw: list[np.ndarray], image_size: int) -> np.ndarray:
  """uint8 images (a list of ``[h, w, C]``) -> float32 ``[N, S, S, C]`` in
  0..255: each image's central square resized to ``S`` (bilinear)."""
  if not raw:
    return np.zeros((0, image_size, image_size, 0), np.float32)
  fixed = len({x.shape for x in raw}) == 1
  if fixed and raw[0].shape[:2] == (image_size, image_size):
    return np.stack(raw).astype(np.float32)
  return augment.center_crops(raw, image_size, 1.0, fixed_size=fixed)


def _normalised(raw: list[np.ndarray], data_config, image_size: int, channels: int) -> np.ndarray:
  """:func:`_square`, then normalised as the run's images (float32 ``[N, S, S, C]``)."""
  if not raw:
    return np.zeros((0, image_size, image_size, channels), np.float32)
  scale, offset = images._normalisation(data_config, channels)
  return _square(raw, image_size) * scale - offset


def _own_split(data_config, split: str, num: int):
  """The first ``num`` (uint8 images, int32 masks) of ``split`` of the run's dataset."""
  source = images._open(data_config, split)
  examples = source.__getitems__(list(range(min(num, len(source)))))
  masks = np.stack([np.asarray(e["mask"], np.int32) for e in examples])
  return [np.asarray(e["image"]) for e in examples], masks


def _canvas_split(data_config, split: str, num: int, seed: int):
  """``num`` canvases (uint8 ``[56, 56, 1]`` list, int32 masks) from ``split``'s garments."""
  from laplax.data.vision import canvases as canvas_lib

  source = images._open(data_config, split)
  pool = source.__getitems__(list(range(min(len(source), CANVAS_POOL * max(num, 1)))))
  garments = np.stack([np.asarray(e["image"]) for e in pool])
  labels = np.array([e["label"] for e in pool])
  canvases, masks = canvas_lib.fashion_canvases(
    garments, labels, num, canvas_size=fashion_mosaic.CANVAS_SIZE, seed=seed
  )
  return list(canvases), masks


def scene_parse150_mask(annotation: np.ndarray) -> np.ndarray:
  """uint8 ``[h, w, 3]`` (or ``[h, w, 1]`` / ``[h, w]``) annotation -> int32 ``[h, w]``.

  Red channel ``c`` in 1..150 -> ``c - 1``, else -1 (ignored).
  """
  a = np.asarray(annotation)
  category = (a[..., 0] if a.ndim == 3 else a).astype(np.int32)
  valid = (category >= 1) & (category <= SCENE_PARSE150_CLASSES)
  return np.where(valid, category - 1, IGNORE).astype(np.int32)


def read_scene_parse150(data_dir: str, split: str, num_images: int, image_size: int):
  """The first ``num_images`` of ``split`` of TFDS ``scene_parse150``, without TensorFlow.

  Returns:
    ``(images uint8 [N, S, S, 3], masks int32 [N, S, S])``, ``S = image_size``.

  Raises:
    DataError: not prepared in ``data_dir``, unreadable, or no image decoder.
  """
  config = ml_collections.ConfigDict({"name": SCENE_PARSE150, "data_dir": data_dir})
  source = images._open(config, split)
  # One read per example: scene_parse150 images are large and few are needed.
  examples = [source[i] for i in range(min(num_images, len(source)))]
  if not examples:
    return (
      np.zeros((0, image_size, image_size, 3), np.uint8),
      np.zeros((0, image_size, image_size), np.int32),
    )
  pictures = _square([np.asarray(e["image"]) for e in examples], image_size)
  masks = np.stack(
    [augment.square_nearest(scene_parse150_mask(e["annotation"]), image_size) for e in examples]
  )
  return np.clip(np.rint(pictures), 0, 255).astype(np.uint8), masks


def load(
  data_config: ml_collections.ConfigDict,
  source: str,
  *,
  num_train: int,
  num_test: int,
  image_size: int,
  channels: int,
  directory: str = "",
) -> SegmentationData:
  """The segmentation train and test data of a run.

  Args:
    data_config: the run's data config (normalisation, splits, data_dir).
    source: a value :func:`resolve` returned (not ``None``).
    num_train, num_test: images per split (fewer if a split is smaller).
    image_size, channels: the backbone's input side ``S`` and channels.
    directory: the ADEChallengeData2016 directory (``ade20k`` only).

  Returns:
    A :class:`SegmentationData`.

  Raises:
    DataError: not prepared or unreadable, too few images, or other channels.
  """
  if source == ADE20K:  # a grey backbone gets the luma (see laplax.data.vision.ade20k)
    parts = [
      ade20k.read_split(directory, split, n, image_size, channels)
      for split, n in zip(ade20k.SPLITS, (num_train, num_test))
    ]
    name, num_classes = ADE20K, ade20k.NUM_CLASSES
    parts = [(list(x), m) for x, m in parts]
  elif source == SCENE_PARSE150:
    if channels != 3:
      raise DataError(
        f"scene_parse150 images are RGB but the backbone takes {channels}-channel "
        f"images; use config.eval.segmentation_dataset='auto' for this run"
      )
    parts = [
      read_scene_parse150(data_config.data_dir, split, n, image_size)
      for split, n in zip(SCENE_PARSE150_SPLITS, (num_train, num_test))
    ]
    name, num_classes = SCENE_PARSE150, SCENE_PARSE150_CLASSES
    parts = [(list(x), m) for x, m in parts]
  elif source == FASHION_CANVASES:
    parts = [
      _canvas_split(data_config, split, n, fashion_mosaic.SEEDS[role])
      for split, n, role in (
        (data_config.train_split, num_train, "train"),
        (data_config.eval_split, num_test, "test"),
      )
    ]
    name, num_classes = FASHION_CANVASES, fashion_mosaic.NUM_MASK_CLASSES
  else:
    parts = [
      _own_split(data_config, split, n)
      for split, n in ((data_config.train_split, num_train), (data_config.eval_split, num_test))
    ]
    info = images._open(data_config, data_config.train_split).dataset_info
    name, num_classes = data_config.name, int(info.features["label"].num_classes) + 1
  (train_raw, train_masks), (test_raw, test_masks) = parts
  for raw in (train_raw, test_raw):
    if raw and raw[0].shape[-1] != channels:
      raise DataError(
        f"{name} images have {raw[0].shape[-1]} channels but the backbone takes {channels}"
      )
  if len(train_raw) < 2 or len(test_raw) < 1:
    raise DataError(
      f"{name} gave {len(train_raw)} train and {len(test_raw)} test images "
      f"for the segmentation probe; it needs at least 2 and 1"
    )

  def masks(m):
    return np.stack([augment.square_nearest(x, image_size) for x in m]).astype(np.int32)

  return SegmentationData(
    train_images=_normalised(train_raw, data_config, image_size, channels),
    train_masks=masks(train_masks),
    test_images=_normalised(test_raw, data_config, image_size, channels),
    test_masks=masks(test_masks),
    num_classes=num_classes,
    name=name,
  )
