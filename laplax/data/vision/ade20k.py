"""ADE20K's scene-parsing benchmark (ADEChallengeData2016) read as published.

Zhou et al., "Scene Parsing through ADE20K Dataset", CVPR 2017; the release
``ADEChallengeData2016.zip`` unpacked in ``DIR``::

    DIR/images/{training,validation}/ADE_*.jpg       20,210 / 2,000 images
    DIR/annotations/{training,validation}/ADE_*.png  one per image, same name

An annotation is an 8-bit single-channel PNG: class 1..150 (``objectInfo150``) or 0
("other", not scored). Decoded with Pillow, without TensorFlow; nothing is
downloaded. The protocol (central square, bilinear image / nearest mask, ``c - 1``
with 0 ignored as mmsegmentation's ``reduce_zero_label``) is in docs/dino.md,
"ADE20K's 150 classes". Every problem raises one-line
:class:`~laplax.data.errors.DataError` naming the file and the fix.
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
  """The ``(image, annotation)`` absolute path pairs of ``split``, sorted by file name.

  ``split`` is ``"training"`` or ``"validation"``; one pair per ``.jpg`` of
  ``root/images/split``.

  Raises:
    DataError: ``root`` missing or of another layout, no images, or an image
      without its annotation.
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
  """uint8 ``[h, w]`` annotation 0..150 -> int32 ``[h, w]`` in ``[-1, 150)`` (``c - 1``, 0 -> -1).

  Raises:
    DataError: not 2-D, or a value above 150 (``path`` names the file).
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

  ``channels`` 3 (RGB) or 1 (Pillow's ``L`` luma, ITU-R 601-2). Images: the central
  square resized bilinearly (:func:`laplax.data.vision.augment.center_crops`), rounded;
  masks: :func:`laplax.data.vision.augment.square_nearest` and :func:`class_mask`.

  Returns:
    ``(images uint8 [N, S, S, channels], masks int32 [N, S, S])`` in ``[-1, 150)``.

  Raises:
    DataError: a malformed release, an undecodable file, an annotation that is not a
      class map or not its image's size, or a value above 150.
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
