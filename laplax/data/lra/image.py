"""LRA Image and Pathfinder: images as sequences of pixel-intensity tokens.

Image (Tay et al. 2021, ``lra_benchmarks/image/input_pipeline.py``): TFDS
``cifar10``, ``train[:90%]`` / ``train[90%:]`` / ``test`` as train /
validation / test, each image turned to grayscale as TensorFlow's
``tf.image.rgb_to_grayscale`` does (:func:`grayscale`) and read row by row:
1,024 tokens, ids 0..255.

Pathfinder (``lra_benchmarks/data/pathfinder.py``, ``Pathfinder32``): the
release's ``lra_release/pathfinder32/{curv_baseline, curv_contour_length_9,
curv_contour_length_14}`` (easy, intermediate, hard), each holding
``metadata/*.npy`` (text, despite the name: one example a line, fields
separated by spaces, ``SUBDIR FILE ... LABEL`` with the image at
``DIFFICULTY/SUBDIR/FILE`` and the label the fourth field, 0 or 1) and the
32 x 32 grayscale PNGs. The examples, metadata files in numeric order and
lines in file order, are split ``[:80%]`` / ``[80%:90%]`` / ``[90%:]`` as the
release's pipeline does (bounds rounded as TFDS's percent slices); empty
image files are dropped, as the release's ``tf.strings.length > 0`` filter.

``mask_zero`` (the config key ``data.mask_zero_pixels``): pixels of value 0
are masked as padding, as the Nystromformer authors' ``LRADataset`` (its
mask is ``input_ids != 0`` for every task; ``LRA/code/dataset.py`` of
mlpen/Nystromformer) and LRA's own Transformer (``inputs > 0``) do; without
it (runs saved before the key) every pixel is a real token.
"""

from __future__ import annotations

import glob
import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from laplax.data.errors import DataError
from laplax.data.lra.text import open_tfds

#: ``tf.image.rgb_to_grayscale``'s weights (ITU-R BT.601 luma).
RGB_WEIGHTS = np.asarray([0.2989, 0.5870, 0.1140], np.float32)
VOCAB_SIZE = 256
CIFAR_SPLITS = {"train": "train[:90%]", "val": "train[90%:]", "test": "test"}
DIFFICULTIES = ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14")
SIDE = 32


def grayscale(images: np.ndarray) -> np.ndarray:
  """``uint8 [..., H, W, 3]`` RGB -> ``int32 [..., H, W]`` intensities 0..255
  as ``tf.image.rgb_to_grayscale``: float32 ``x / 255`` weighted by
  :data:`RGB_WEIGHTS`, times 255.5, truncated (``convert_image_dtype``)."""
  x = np.asarray(images, np.uint8).astype(np.float32) * np.float32(1.0 / 255.0)
  gray = np.tensordot(x, RGB_WEIGHTS, axes=([-1], [-1])).astype(np.float32)
  return (gray * np.float32(255.5)).astype(np.int32)


def pixel_mask(tokens: np.ndarray, mask_zero: bool) -> np.ndarray:
  """``bool`` like ``tokens``: ``tokens != 0`` with ``mask_zero``, else all True."""
  return tokens != 0 if mask_zero else np.ones_like(tokens, bool)


def load_cifar10(data_dir: str, split: str, mask_zero: bool = True) -> dict:
  """``{"tokens": int32 [n, 1024], "mask": bool (:func:`pixel_mask`), "label": int32 [n]}``.

  Raises:
    DataError: TFDS ``cifar10`` not prepared in ``data_dir``, or images not ``32 x 32 x 3``.
  """
  source = open_tfds("cifar10", CIFAR_SPLITS[split], data_dir)
  n = len(source)
  if not n:
    raise DataError(f"TFDS cifar10 split {split!r} in {data_dir} is empty")
  images = np.stack([np.asarray(source[i]["image"]) for i in range(n)])
  if images.shape[1:] != (SIDE, SIDE, 3):
    raise DataError(f"TFDS cifar10 in {data_dir} has images of {images.shape[1:]}, not 32x32x3")
  tokens = grayscale(images).reshape(n, SIDE * SIDE)
  labels = np.asarray([int(source[i]["label"]) for i in range(n)], np.int32)
  return {"tokens": tokens, "mask": pixel_mask(tokens, mask_zero), "label": labels}


def _numeric(path: str):
  stem = os.path.splitext(os.path.basename(path))[0]
  return (0, int(stem), stem) if stem.isdigit() else (1, 0, stem)


def read_metadata(root: str, difficulty: str) -> list[tuple[str, int]]:
  """``(image path, label)`` of every line of ``ROOT/DIFFICULTY/metadata/*.npy``.

  Raises:
    DataError: an unknown difficulty, no metadata file, a line with fewer
      than four fields or a label other than 0/1, an image file missing.
  """
  if difficulty not in DIFFICULTIES:
    raise DataError(
      f"Pathfinder difficulty {difficulty!r} is unknown; use one of {', '.join(DIFFICULTIES)}"
    )
  base = os.path.join(os.path.expanduser(root), difficulty)
  files = sorted(glob.glob(os.path.join(base, "metadata", "*.npy")), key=_numeric)
  if not files:
    raise DataError(
      f"no Pathfinder metadata in {base}/metadata; set --config.data.data_dir to the "
      f"release's lra_release/pathfinder32 folder"
    )
  rows = []
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line_no, line in enumerate(f, start=1):
        if not line.strip():
          continue
        fields = line.split()
        if len(fields) < 4 or fields[3] not in ("0", "1"):
          raise DataError(
            f"{path}:{line_no}: expected 'SUBDIR FILE _ LABEL ...' with a label 0 or 1, "
            f"got {line.strip()[:60]!r}; not a Pathfinder release file"
          )
        image = os.path.join(base, fields[0], fields[1])
        if not os.path.isfile(image):
          raise DataError(f"{path}:{line_no}: image {image} is missing; copy the release again")
        rows.append((image, int(fields[3])))
  return rows


def read_png(path: str) -> np.ndarray:
  """``uint8 [32, 32]`` of a grayscale Pathfinder PNG.

  Raises:
    DataError: not a PNG, or not one channel of 32 x 32.
  """
  try:
    with Image.open(path) as im:
      a = np.asarray(im)
  except (UnidentifiedImageError, OSError) as e:
    raise DataError(f"Pathfinder image {path} cannot be decoded ({e}); copy it again") from e
  if a.shape != (SIDE, SIDE) or a.dtype != np.uint8:
    raise DataError(
      f"Pathfinder image {path} is {a.dtype} {a.shape}, not 32x32 grayscale; use pathfinder32"
    )
  return a


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
  """``[:80%]``, ``[80%:90%]``, ``[90%:]`` of ``n`` examples (TFDS rounds a
  percent bound to the nearest example)."""
  a, b = round(80 * n / 100.0), round(90 * n / 100.0)
  return {"train": (0, a), "val": (a, b), "test": (b, n)}


def load_pathfinder(
  root: str, split: str, difficulty: str = "curv_baseline", mask_zero: bool = True
) -> dict:
  """``{"tokens": int32 [n, 1024], "mask": bool (:func:`pixel_mask`), "label": int32 [n]}``.

  Raises:
    DataError: as :func:`read_metadata` and :func:`read_png`, or an empty split.
  """
  rows = [(p, y) for p, y in read_metadata(root, difficulty) if os.path.getsize(p) > 0]
  lo, hi = split_bounds(len(rows))[split]
  rows = rows[lo:hi]
  if not rows:
    raise DataError(f"Pathfinder {difficulty} in {root} has no {split} examples")
  tokens = np.stack([read_png(p).reshape(-1) for p, _ in rows]).astype(np.int32)
  labels = np.asarray([y for _, y in rows], np.int32)
  return {"tokens": tokens, "mask": pixel_mask(tokens, mask_zero), "label": labels}
