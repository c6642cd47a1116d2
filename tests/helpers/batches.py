"""Comparing input batches and a NumPy bilinear resize (the data tests' references)."""

import numpy as np


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def bilinear_resize(image, height, width):
  """NumPy reference: bilinear resize of uint8/float [h, w, C] to float32 [height, width, C].

  Half-pixel centres (output pixel j samples input coordinate (j + 0.5) n_in /
  n_out - 0.5, clipped to the image), no antialiasing: the convention
  ``augment.resized_crops`` documents, written independently of it.
  """

  def taps(n_in, n_out):
    x = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    lo = np.floor(x).astype(np.int64)
    return lo, np.minimum(lo + 1, n_in - 1), (x - lo).astype(np.float32)

  y0, y1, wy = taps(image.shape[0], height)
  x0, x1, wx = taps(image.shape[1], width)
  image = image.astype(np.float32)
  rows = image[y0] * (1 - wy)[:, None, None] + image[y1] * wy[:, None, None]
  return rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
