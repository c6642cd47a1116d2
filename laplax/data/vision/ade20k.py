"""ADE20K's scene-parsing benchmark (ADEChallengeData2016) read as published.

The release of the MIT Scene Parsing Benchmark (Zhou et al., "Scene Parsing
through ADE20K Dataset", CVPR 2017; the file ``ADEChallengeData2016.zip`` of
the MIT CSAIL scene-parsing site), unpacked in a local directory ``DIR``::

    DIR/images/training/ADE_train_00000001.jpg       20,210 images
    DIR/images/validation/ADE_val_00000001.jpg       2,000 images
    DIR/annotations/training/ADE_train_00000001.png  one per image, same name
    DIR/annotations/validation/ADE_val_00000001.png

Each annotation is a single-channel 8-bit PNG of the image's size whose pixel
value is the class, 1..150 (``objectInfo150``), or 0 for "other" (not scored).
This is the 150-class benchmark that segmentation papers report as "ADE20K
mIoU", unlike TFDS's ``scene_parse150`` (see :mod:`laplax.data.vision.segmentation`).

Protocol of :func:`read_split` (the images a split gives the probe): the
split's files sorted by name, the first ``num`` of them; each image decoded
with Pillow (converted to RGB, or to Pillow's ``L`` luma, ITU-R 601-2, for a
one-channel backbone), its central square (side = the shorter side) resized
to ``S x S`` bilinearly (:func:`laplax.data.vision.augment.center_crops`) and rounded
to uint8; the annotation's central square resized to ``S x S`` by nearest
neighbour at the same pixel centres
(:func:`laplax.data.vision.augment.square_nearest`); class ``c`` in 1..150
becomes ``c - 1`` and 0 becomes -1, ignored by the loss and the score
(mmsegmentation's ``reduce_zero_label``, ignore index 255 there).

Everything is decoded without TensorFlow; nothing is downloaded. Every
problem with the release raises :class:`~laplax.data.errors.DataError` with
one line naming the file and the fix.
"""

from __future__ import annotations

import os

import numpy as np

from laplax.data.errors import DataError
from laplax.data.vision import augment

NAME = "ade20k"
NUM_CLASSES = 150
SPLITS = ("training", "validation")
IMAGE_SUFFIX = ".jpg"
ANNOTATION_SUFFIX = ".png"
IGNORE = -1
_HINT = (
  "give --config.eval.segmentation_dir=DIR where DIR holds ADEChallengeData2016 "
  "unpacked (images/training, images/validation, annotations/training, "
  "annotations/validation)"
)


def _folder(root: str, kind: str, split: str) -> str:
  """``root/kind/split`` if it is a directory, else DataError naming the layout."""
  path = os.path.join(root, kind, split)
  if not os.path.isdir(path):
    found = sorted(os.listdir(root))[:6] if os.path.isdir(root) else []
    raise DataError(
      f"{root} is not an ADEChallengeData2016 release: {kind}/{split} is "
      f"missing (found {', '.join(found) or 'nothing'}); {_HINT}"
    )
  return path


def split_files(root: str, split: str) -> list[tuple[str, str]]:
  """The ``(image, annotation)`` paths of ``split``, sorted by file name.

  Args:
    root: the release's directory (``images/`` and ``annotations/`` in it).
    split: ``"training"`` or ``"validation"``.

  Returns:
    A list of absolute path pairs, one per ``.jpg`` of ``images/split``.

  Raises:
    DataError: ``root`` missing or of another layout, no images in the split,
      or an image without its annotation.
  """
  root = os.path.abspath(os.path.expanduser(root)) if root else ""
  if not root or not os.path.isdir(root):
    raise DataError(f"the ADE20K directory {root!r} does not exist; {_HINT}")
  image_dir = _folder(root, "images", split)
  annotation_dir = _folder(root, "annotations", split)
  names = sorted(f for f in os.listdir(image_dir) if f.lower().endswith(IMAGE_SUFFIX))
  if not names:
    raise DataError(f"{image_dir} holds no {IMAGE_SUFFIX} images; {_HINT}")
  annotations = set(os.listdir(annotation_dir))
  pairs = []
  for name in names:
    stem = os.path.splitext(name)[0]
    if stem + ANNOTATION_SUFFIX not in annotations:
      raise DataError(
        f"images/{split}/{name} has no annotation annotations/{split}/"
        f"{stem}{ANNOTATION_SUFFIX} in {root}; the release is incomplete, "
        f"unpack ADEChallengeData2016.zip again"
      )
    pairs.append(
      (os.path.join(image_dir, name), os.path.join(annotation_dir, stem + ANNOTATION_SUFFIX))
    )
  return pairs


def class_mask(annotation: np.ndarray, path: str = "annotation") -> np.ndarray:
  """An ADEChallengeData2016 annotation -> int32 classes: ``c`` in 1..150 -> ``c - 1``,
  0 -> -1 (ignored).

  Args:
    annotation: uint8 ``[h, w]`` pixel values 0..150.
    path: the file's name, for the error message.

  Returns:
    int32 ``[h, w]`` in ``[-1, 150)``.

  Raises:
    DataError: not 2-D, or a value above 150.
  """
  a = np.asarray(annotation)
  if a.ndim != 2:
    raise DataError(
      f"{path} has shape {a.shape}, not a single-channel class map; "
      f"ADEChallengeData2016 annotations are 8-bit grey PNGs (another "
      f"ADE20K release?); {_HINT}"
    )
  top = int(a.max(initial=0))
  if top > NUM_CLASSES:
    raise DataError(
      f"{path} has pixel value {top}; ADEChallengeData2016 annotations "
      f"hold 0 (ignored) to {NUM_CLASSES}; {_HINT}"
    )
  a = a.astype(np.int32)
  return np.where(a > 0, a - 1, IGNORE).astype(np.int32)


def _decode(path: str, mode: str | None) -> np.ndarray:
  """The pixels of an image file (converted to ``mode`` if given), or DataError."""
  from PIL import Image

  try:
    with Image.open(path) as image:
      if mode is None:
        if image.mode not in ("L", "P", "I;16", "I"):
          raise DataError(
            f"{path} is a {image.mode} image, not a single-channel class "
            f"map; ADEChallengeData2016 annotations are 8-bit grey PNGs "
            f"(another ADE20K release?); {_HINT}"
          )
        return np.asarray(image)
      return np.asarray(image.convert(mode))
  except (OSError, ValueError) as e:
    if isinstance(e, DataError):
      raise
    raise DataError(
      f"cannot decode {path} ({' '.join(str(e).split())[:160]}); replace "
      f"the file from ADEChallengeData2016.zip"
    ) from None


def read_split(root: str, split: str, num: int, size: int, channels: int = 3):
  """The first ``num`` images of ``split`` and their class masks at ``size x size``.

  Args:
    root: the release's directory.
    split: ``"training"`` or ``"validation"``.
    num: how many images (fewer if the split is smaller).
    size: side ``S`` of the square output, ``>= 1``.
    channels: 3 (RGB) or 1 (Pillow's ``L`` luma, for a grey backbone).

  Returns:
    ``(images, masks)``: uint8 ``[N, S, S, channels]`` and int32 ``[N, S, S]``
    in ``[-1, 150)`` (see the module docstring for the protocol).

  Raises:
    DataError: a malformed release (:func:`split_files`), an undecodable
      file, an annotation that is not a class map, a value above 150, or an
      annotation whose size differs from its image's.
  """
  if channels not in (1, 3):
    raise DataError(f"ADE20K images are RGB; a backbone of {channels} channels cannot take them")
  pairs = split_files(root, split)[: max(int(num), 0)]
  images = np.zeros((len(pairs), size, size, channels), np.uint8)
  masks = np.zeros((len(pairs), size, size), np.int32)
  for i, (image_path, annotation_path) in enumerate(pairs):
    pixels = _decode(image_path, "RGB" if channels == 3 else "L")
    if pixels.ndim == 2:
      pixels = pixels[..., None]
    annotation = _decode(annotation_path, None)
    if annotation.shape[:2] != pixels.shape[:2]:
      raise DataError(
        f"{annotation_path} is {annotation.shape[1]}x{annotation.shape[0]} "
        f"but its image is {pixels.shape[1]}x{pixels.shape[0]}; replace it "
        f"from ADEChallengeData2016.zip"
      )
    mask = class_mask(annotation, annotation_path)
    square = augment.center_crops([pixels], size, 1.0, fixed_size=True)[0]
    images[i] = np.clip(np.rint(square), 0, 255).astype(np.uint8)
    masks[i] = augment.square_nearest(mask, size)
  return images, masks
