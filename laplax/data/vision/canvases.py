"""Fashion-MNIST canvases: an offline proxy for a segmentation dataset.

Stored by the TFDS dataset ``fashion_mosaic`` and built from a run's own images by
the DINO segmentation probe.
"""

from __future__ import annotations

import numpy as np

#: The label of a pixel that no garment covers.
BACKGROUND = 0
#: Fashion-MNIST pixels at or below this (of 255) are background.
GARMENT_THRESHOLD = 10


def fashion_canvases(
  images,
  labels,
  num_canvases: int,
  *,
  canvas_size: int = 56,
  min_items: int = 2,
  max_items: int = 4,
  seed: int = 0,
):
  """Canvases of 2-4 pasted Fashion-MNIST garments with per-pixel labels.

  Each canvas draws ``k`` in ``[min_items, max_items]`` garments (with replacement),
  pasted at uniform top-left corners; pixels above :data:`GARMENT_THRESHOLD` overwrite
  the canvas with label + 1. Deterministic: ``numpy.random.default_rng(seed)``.

  Args:
    images: uint8 ``[N, 28, 28]`` (or ``[N, 28, 28, 1]``); labels: int ``[N]`` in ``[0, 10)``.
    num_canvases: how many; canvas_size: side in pixels, ``>= 28``.
    min_items, max_items: ``1 <= min_items <= max_items``.

  Returns:
    ``(canvases uint8 [M, S, S, 1], masks int32 [M, S, S])``, 11 classes (0 background).

  Raises:
    ValueError: bad shapes or settings.
  """
  images = np.asarray(images)
  if images.ndim == 4 and images.shape[-1] == 1:
    images = images[..., 0]
  labels = np.asarray(labels)
  if images.ndim != 3 or labels.shape != images.shape[:1] or not len(images):
    raise ValueError(f"images [N, h, w] and labels [N] do not fit: {images.shape}, {labels.shape}")
  h, w = images.shape[1:]
  if canvas_size < max(h, w) or not 1 <= min_items <= max_items or num_canvases < 0:
    raise ValueError(
      f"need canvas_size >= {max(h, w)} and 1 <= min_items <= max_items; got "
      f"{canvas_size}, {min_items}, {max_items}"
    )
  rng = np.random.default_rng(seed)
  canvases = np.zeros((num_canvases, canvas_size, canvas_size), np.uint8)
  masks = np.full((num_canvases, canvas_size, canvas_size), BACKGROUND, np.int32)
  for m in range(num_canvases):
    for i in rng.integers(0, len(images), size=rng.integers(min_items, max_items + 1)):
      top, left = rng.integers(0, canvas_size - h + 1), rng.integers(0, canvas_size - w + 1)
      on = images[i] > GARMENT_THRESHOLD
      canvases[m, top : top + h, left : left + w][on] = images[i][on]
      masks[m, top : top + h, left : left + w][on] = int(labels[i]) + 1
  return canvases[..., None], masks
