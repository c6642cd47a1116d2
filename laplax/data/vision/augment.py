"""Image augmentation ops (numpy only): crops, resizes, flips and colour operations.

:func:`resized_crops` (bilinear, half-pixel centres, no antialiasing, boxes in
pixel-edge coordinates) is the one crop-and-resize of laplax's pipelines: random
resized crops, central crops and whole-image resizes. Photometric ops work on
float32 ``[N, C, H, W]`` in [0, 255]. Randomness is the caller's
``np.random.Generator`` (grain's per-batch generator).
"""

from __future__ import annotations

import numpy as np

RRC_SCALE = (0.08, 1.0)  # random-resized-crop area fraction range (Inception)
RRC_RATIO = (3 / 4, 4 / 3)  # random-resized-crop aspect ratio range
GREY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L")


# --------------------------------------------------------------------------
# Geometric ops.


def random_crop(images: np.ndarray, padding: int, rng) -> np.ndarray:
  """[B, H, W, C] -> same shape: random H x W window of the zero-padded images."""
  if not padding:
    return images
  n, h, w, _ = images.shape
  padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  dy, dx = rng.integers(0, 2 * padding + 1, size=(2, n))
  rows = dy[:, None, None] + np.arange(h)[None, :, None]
  cols = dx[:, None, None] + np.arange(w)[None, None, :]
  return padded[np.arange(n)[:, None, None], rows, cols]


def random_flip(images: np.ndarray, rng) -> np.ndarray:
  """[B, H, W, C] -> same shape, each image flipped left-right with probability 0.5."""
  flipped = rng.random(len(images)) < 0.5
  return np.where(flipped[:, None, None, None], images[:, :, ::-1], images)


def sample_boxes(rng, height, width, scale, ratio=RRC_RATIO, attempts: int = 10) -> np.ndarray:
  """Random-resized-crop boxes, as torchvision's RandomResizedCrop but not rounded.

  Area fraction uniform in ``scale``, aspect ratio (w / h) log-uniform in ``ratio``;
  the first of ``attempts`` draws that fits is placed uniformly, else the central
  crop of the whole height or width with the ratio clipped into ``ratio``.

  Args:
    rng: np.random.Generator.
    height, width: image sizes in pixels, broadcastable arrays of shape [...].
    scale, ratio: (min, max) area fraction and aspect ratio.
    attempts: draws before the central fallback.

  Returns:
    float64 [..., 4]: (top, left, box height, box width) inside the image.
  """
  height, width = np.broadcast_arrays(np.asarray(height, np.float64), np.asarray(width, np.float64))
  shape = height.shape + (attempts,)
  area = (height * width)[..., None] * rng.uniform(scale[0], scale[1], shape)
  aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), shape))
  box_w, box_h = np.sqrt(area * aspect), np.sqrt(area / aspect)
  fits = (box_w <= width[..., None]) & (box_h <= height[..., None])
  first = np.argmax(fits, axis=-1)[..., None]
  box_h = np.take_along_axis(box_h, first, -1)[..., 0]
  box_w = np.take_along_axis(box_w, first, -1)[..., 0]
  top, left = rng.random((2,) + height.shape)
  top, left = top * (height - box_h), left * (width - box_w)
  # Central fallback where no attempt fit.
  image_aspect = width / height
  fallback_w = np.where(image_aspect > ratio[1], height * ratio[1], width)
  fallback_h = np.where(image_aspect < ratio[0], width / ratio[0], height)
  fell_back = ~fits.any(axis=-1)
  box_h, box_w = np.where(fell_back, fallback_h, box_h), np.where(fell_back, fallback_w, box_w)
  top = np.where(fell_back, (height - box_h) / 2, top)
  left = np.where(fell_back, (width - box_w) / 2, left)
  return np.stack([top, left, box_h, box_w], axis=-1)


def _box_taps(start: np.ndarray, length: np.ndarray, n_in: int, n_out: int):
  """Bilinear taps of [start, start + length] of an axis of n_in pixels at n_out points.

  Sample j is at ``start + (j + 0.5) length / n_out - 0.5``, clipped to [0, n_in - 1].
  Returns (lo, hi, frac): int [N, n_out] indices and float32 [N, n_out] weights of ``hi``.
  """
  x = start[:, None] + (np.arange(n_out) + 0.5) * (length[:, None] / n_out) - 0.5
  x = np.clip(x, 0, n_in - 1)
  lo = np.floor(x).astype(np.intp)
  return lo, np.minimum(lo + 1, n_in - 1), (x - lo).astype(np.float32)


def resized_crops(images: np.ndarray, boxes: np.ndarray, flips: np.ndarray, size: int):
  """Bilinear crop-and-resize of several boxes per image, optionally mirrored.

  No antialiasing (boxes much larger than ``size`` alias); a whole-image box at its own
  size is the identity. Both passes gather whole rows, several times faster in numpy
  than single pixels.

  Args:
    images: uint8 or float [B, H, W, C].
    boxes: float [V, B, 4] (top, left, height, width), see :func:`sample_boxes`.
    flips: bool [V, B], mirror left-right.
    size: side of the square output.

  Returns:
    float32 [V, B, C, size, size], channels first, within the images' value range.
  """
  views, batch = flips.shape
  channels = images.shape[-1]
  n = views * batch
  boxes = boxes.reshape(n, 4)
  y0, y1, wy = _box_taps(boxes[:, 0], boxes[:, 2], images.shape[1], size)
  x0, x1, wx = _box_taps(boxes[:, 1], boxes[:, 3], images.shape[2], size)
  mirror = flips.reshape(n, 1)
  x0, x1, wx = (np.where(mirror, t[:, ::-1], t) for t in (x0, x1, wx))
  which = np.tile(np.arange(batch), views)[:, None]
  rows = images[which, y0].astype(np.float32)  # [N, size, W, C]
  rows += (images[which, y1] - rows) * wy[:, :, None, None]
  rows = np.ascontiguousarray(rows.transpose(0, 2, 3, 1))  # [N, W, C, size]
  each = np.arange(n)[:, None]
  out = rows[each, x0]  # [N, size (x), C, size (y)]
  out += (rows[each, x1] - out) * wx[:, :, None, None]
  out = np.ascontiguousarray(out.transpose(0, 2, 3, 1))  # [N, C, size (y), size (x)]
  return out.reshape(views, batch, channels, size, size)


def center_boxes(height, width, fraction: float) -> np.ndarray:
  """Central square boxes of side ``fraction * min(height, width)``, ``fraction`` in (0, 1].

  Returns float64 [..., 4] as :func:`sample_boxes`.
  """
  height, width = np.broadcast_arrays(np.asarray(height, np.float64), np.asarray(width, np.float64))
  side = fraction * np.minimum(height, width)
  return np.stack([(height - side) / 2, (width - side) / 2, side, side], axis=-1)


def crop_batch(images, boxes: np.ndarray, flips: np.ndarray, size: int, *, fixed_size: bool):
  """:func:`resized_crops` of a list of B [h, w, C] images.

  ``fixed_size``: all of one shape, cropped in one pass (else one at a time; the same
  values up to rounding). Returns float32 [V, B, C, size, size].
  """
  if fixed_size:
    return resized_crops(np.stack(images), boxes, flips, size)
  return np.concatenate(
    [
      resized_crops(x[None], boxes[:, i : i + 1], flips[:, i : i + 1], size)
      for i, x in enumerate(images)
    ],
    axis=1,
  )


def _channels_last(crops: np.ndarray) -> np.ndarray:
  """float32 [1, B, C, S, S] (one view per image) -> contiguous [B, S, S, C]."""
  return np.ascontiguousarray(crops[0].transpose(0, 2, 3, 1))


def random_resized_crops(images, rng, size: int, *, fixed_size: bool, flip: bool = False):
  """Inception random-resized crops (:func:`sample_boxes` with ``RRC_SCALE``), one per image.

  ``images``: list of B [h, w, C]; ``flip``: mirror with probability 0.5. Returns
  float32 [B, size, size, C].
  """
  heights = np.array([x.shape[0] for x in images])[None]
  widths = np.array([x.shape[1] for x in images])[None]
  boxes = sample_boxes(rng, heights, widths, RRC_SCALE)
  flips = rng.random(heights.shape) < 0.5 if flip else np.zeros(heights.shape, bool)
  return _channels_last(crop_batch(images, boxes, flips, size, fixed_size=fixed_size))


def center_crops(images, size: int, fraction: float, *, fixed_size: bool) -> np.ndarray:
  """The central square of side ``fraction * min(h, w)`` of each [h, w, C] image, resized.

  Returns float32 [B, size, size, C].
  """
  heights = np.array([x.shape[0] for x in images])[None]
  widths = np.array([x.shape[1] for x in images])[None]
  boxes = center_boxes(heights, widths, fraction)
  flips = np.zeros(heights.shape, bool)
  return _channels_last(crop_batch(images, boxes, flips, size, fixed_size=fixed_size))


def square_nearest(mask: np.ndarray, size: int) -> np.ndarray:
  """The central square of ``mask [h, w]`` resized to ``[size, size]``, nearest
  neighbour, sampled at the pixel centres of the bilinear image resize
  (:func:`center_crops`): output pixel ``i`` reads input
  ``floor(top + (i + 0.5) * side / size)``."""
  mask = np.asarray(mask)
  h, w = mask.shape
  if (h, w) == (size, size):
    return mask
  top, left, side, _ = center_boxes(h, w, 1.0)
  centres = (np.arange(size) + 0.5) * side / size
  rows = np.clip(np.floor(top + centres).astype(np.int64), 0, h - 1)
  cols = np.clip(np.floor(left + centres).astype(np.int64), 0, w - 1)
  return mask[rows][:, cols]


# --------------------------------------------------------------------------
# Photometric ops.


def grey(x: np.ndarray) -> np.ndarray:
  """float32 [N, C, H, W] -> [N, 1, H, W]: luma ``GREY_WEIGHTS`` of RGB, or x itself if C == 1."""
  if x.shape[1] == 1:
    return x
  r, g, b = (np.float32(w) for w in GREY_WEIGHTS)
  return x[:, 0:1] * r + x[:, 1:2] * g + x[:, 2:3] * b


def _per_image(factor: np.ndarray) -> np.ndarray:
  return np.asarray(factor, np.float32)[:, None, None, None]


def adjust_brightness(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """float32 [N, C, H, W] in [0, 255], factor [N] -> clip(factor x, 0, 255)."""
  return np.clip(x * _per_image(factor), 0, 255)


def adjust_contrast(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """Blends float32 [N, C, H, W] toward each image's mean grey m: clip(f x + (1 - f) m, 0, 255).

  ``factor`` [N] (1: unchanged, 0: uniform grey).
  """
  f = _per_image(factor)
  mean = grey(x).mean(axis=(1, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
  return np.clip(f * x + (1 - f) * mean, 0, 255)


def adjust_saturation(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """Blends RGB float32 [N, 3, H, W] with its grey image g: clip(f x + (1 - f) g, 0, 255)."""
  f = _per_image(factor)
  return np.clip(f * x + (1 - f) * grey(x), 0, 255)


def shift_hue(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
  """Rotates the HSV hue of RGB float32 [N, 3, H, W] by ``shift`` [N] turns.

  Keeps HSV value and chroma, so the result stays within the pixel's channel range;
  grey pixels are unchanged.
  """
  r, g, b = x[:, 0], x[:, 1], x[:, 2]
  high = np.maximum(np.maximum(r, g), b)
  chroma = high - np.minimum(np.minimum(r, g), b)
  inverse = np.divide(1, chroma, out=np.zeros_like(chroma), where=chroma > 0)
  sixths = np.where(high == r, g - b, np.where(high == g, b - r + 2 * chroma, r - g + 4 * chroma))
  sixths *= inverse  # hue in sixths of a turn, in [-1, 5)
  sixths += (6 * np.asarray(shift, np.float32))[:, None, None]
  out = np.empty_like(x)
  k = np.empty_like(sixths)
  for channel, offset in enumerate((5, 3, 1)):  # HSV -> RGB: R, G, B
    np.add(sixths, offset, out=k)
    k -= 6 * np.floor(k * np.float32(1 / 6))  # k mod 6 (np.mod is several times slower)
    np.minimum(k, 4 - k, out=k)
    np.clip(k, 0, 1, out=k)
    np.multiply(chroma, k, out=k)
    np.subtract(high, k, out=out[:, channel])
  return out


def _gaussian_kernels(sigma: np.ndarray, radius: int) -> np.ndarray:
  """float32 [N, 2 radius + 1] Gaussian weights for sigma [N], summing to 1 (sigma 0: identity)."""
  t = np.arange(-radius, radius + 1, dtype=np.float64)
  sigma = np.maximum(np.asarray(sigma, np.float64), 1e-3)  # sigma 0: the identity
  k = np.exp(-0.5 * (t[None, :] / sigma[:, None]) ** 2)
  return (k / k.sum(axis=1, keepdims=True)).astype(np.float32)


def _reflect_pad(x: np.ndarray, axis: int, radius: int) -> np.ndarray:
  """``np.pad(mode="reflect")`` (c b | a b c | b a) of ``axis`` by ``radius``, 3x faster."""
  n = x.shape[axis]
  if radius > n - 1:  # Reflects more than once.
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, radius)
    return np.pad(x, pad, mode="reflect")
  shape = list(x.shape)
  shape[axis] += 2 * radius
  out = np.empty(shape, x.dtype)

  def along(index):
    return (slice(None),) * axis + (index,)

  out[along(slice(radius, radius + n))] = x
  out[along(slice(0, radius))] = x[along(slice(radius, 0, -1))]
  stop = n - 2 - radius
  out[along(slice(radius + n, None))] = x[along(slice(n - 2, stop if stop >= 0 else None, -1))]
  return out


def blur(x: np.ndarray, sigma: np.ndarray, radius: int) -> np.ndarray:
  """Separable Gaussian blur of float32 [N, C, H, W], per-image ``sigma`` [N] pixels, reflect padding.

  Truncated at ``radius`` pixels (3 times the largest sigma suffices).
  """
  kernels = _gaussian_kernels(sigma, radius)[:, :, None, None, None]
  taps = range(2 * radius + 1)
  for axis in (2, 3):
    padded = _reflect_pad(x, axis, radius)
    n = x.shape[axis]
    windows = [padded[:, :, t : t + n] if axis == 2 else padded[..., t : t + n] for t in taps]
    x = windows[0] * kernels[:, 0]
    term = np.empty_like(x)
    for t in taps[1:]:
      np.multiply(windows[t], kernels[:, t], out=term)
      x += term
  return x


def solarize(x: np.ndarray, threshold: float) -> np.ndarray:
  """Pixels >= threshold (0..255 units) become 255 - pixel."""
  return np.where(x >= threshold, 255 - x, x)
