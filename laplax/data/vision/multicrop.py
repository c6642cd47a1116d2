"""DINO multi-crop views: the config, its one check, and the views of a batch of images.

Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers"
(arXiv:2104.14294), section 3.1 and appendix; photometric recipe of BYOL (Grill et
al. 2020, arXiv:2006.07733, appendix B). Vectorised over all views of one size;
only variable-size images (ImageNet) are cropped one at a time.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections
import numpy as np

from laplax.data.errors import DataError
from laplax.data.vision import augment
from laplax.models import spec as spec_lib

_FASHION_MNIST = "fashion_mnist_idx"  # the default dataset (images.default_config)
_CHUNK_PIXELS = 1 << 16  # pixels per augmentation pass: each f32 plane stays in cache


def default_multicrop_config(name: str = _FASHION_MNIST) -> ml_collections.ConfigDict:
  """The DINO multi-crop augmentation config for dataset ``name``.

  ``imagenet*``: DINO's (2 global 224 px, 10 local 96 px, blur sigma up to 2 px);
  otherwise Fashion-MNIST's (2 global 28 px, 6 local 14 px, sigma up to 1 px). Keys:

  * ``num_global`` (>= 1), ``num_local`` (>= 0); ``global_size``, ``local_size`` (px).
  * ``global_scale``, ``local_scale``: (min, max) area fraction; aspect ratio
    log-uniform in ``augment.RRC_RATIO``. ``flip``: probability 0.5.
  * ``jitter_prob`` with ``brightness``, ``contrast``, ``saturation`` (factor uniform
    in [1 - s, 1 + s]) and ``hue`` (shift in [-hue, hue] turns; with saturation RGB
    only); ``grayscale_prob`` (RGB only).
  * ``blur_prob``: (first global, second global, every local); ``blur_sigma``: (min,
    max) pixels of the view.
  * ``solarize_prob`` (second global view), ``solarize_threshold`` (0..255 units).

  Jitter runs brightness, contrast, saturation, hue in that fixed order, each clipped
  to [0, 255]; views 3, 5, ... follow the second view's recipe.
  """
  imagenet = name.startswith("imagenet")
  return ml_collections.ConfigDict(
    {
      "num_global": 2,
      "num_local": 10 if imagenet else 6,
      "global_size": 224 if imagenet else 28,
      "local_size": 96 if imagenet else 14,
      "global_scale": (0.4, 1.0),
      "local_scale": (0.05, 0.4),
      "flip": True,
      "jitter_prob": 0.8,
      "brightness": 0.4,
      "contrast": 0.4,
      "saturation": 0.2,
      "hue": 0.1,
      "grayscale_prob": 0.2,
      "blur_prob": (1.0, 0.1, 0.5),
      "blur_sigma": (0.1, 2.0) if imagenet else (0.1, 1.0),
      "solarize_prob": 0.2,
      "solarize_threshold": 128,
    }
  )


_KEY = "config.data.multicrop"  # how messages name the multi-crop config


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise DataError(message)


def _integer(multicrop, key: str, minimum: int) -> int:
  value = multicrop[key]
  _require(
    isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
    f"{_KEY}.{key}={value!r} must be an integer >= {minimum}",
  )
  return value


def _fraction(multicrop, key: str, maximum: float) -> float:
  value = multicrop[key]
  _require(
    _number(value) and math.isfinite(value) and 0.0 <= value <= maximum,
    f"{_KEY}.{key}={value!r} must be a finite number >= 0.0 and <= {maximum}",
  )
  return value


def _pair(multicrop, key: str, minimum: float, maximum: float) -> tuple[float, float]:
  value = multicrop[key]
  ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(v) for v in value)
  _require(
    ok and minimum <= value[0] <= value[1] <= maximum,
    f"{_KEY}.{key}={value!r} must be two numbers (low, high) with "
    f"{minimum} <= low <= high <= {maximum}",
  )
  return (float(value[0]), float(value[1]))


def check_multicrop(multicrop: ml_collections.ConfigDict, patch_size: int = 1) -> None:
  """Checks every key of a multi-crop config; view sides must be multiples of ``patch_size``.

  The one check: the pipeline runs it with ``patch_size`` 1, the config check
  (``laplax.config.validation``) with the model's.

  Raises:
    DataError: the first key missing or out of range, one line naming it
      (``config.data.multicrop.KEY=...``) and what it must be.
  """
  missing = sorted(set(default_multicrop_config()) - set(multicrop))
  _require(
    not missing,
    f"{_KEY} lacks {', '.join(missing)}; start from "
    "laplax.data.vision.multicrop.default_multicrop_config()",
  )
  num_global = _integer(multicrop, "num_global", 1)
  num_local = _integer(multicrop, "num_local", 0)
  _require(
    num_global + num_local >= 2,
    f"{_KEY} has {num_global} global and {num_local} local crops; DINO needs "
    "at least 2 views (e.g. num_global=2)",
  )
  for key in ("global_size", "local_size"):
    size = _integer(multicrop, key, patch_size)
    try:
      spec_lib.patch_grid(size, size, patch_size)
    except spec_lib.SpecError:
      raise DataError(
        f"{_KEY}.{key}={size} is not divisible by config.model.patch_size="
        f"{patch_size}; choose a multiple of it"
      ) from None
  g, l = multicrop["global_size"], multicrop["local_size"]
  _require(
    l <= g,
    f"{_KEY}.local_size={l} is larger than global_size={g}; local crops "
    "must not be larger than global crops",
  )
  _pair(multicrop, "global_scale", 1e-6, 1.0)
  _pair(multicrop, "local_scale", 1e-6, 1.0)
  for key in ("jitter_prob", "grayscale_prob", "solarize_prob"):
    _fraction(multicrop, key, 1.0)
  for key in ("brightness", "contrast", "saturation"):
    _fraction(multicrop, key, 1.0)
  _fraction(multicrop, "hue", 0.5)
  blur = multicrop["blur_prob"]
  _require(
    isinstance(blur, (list, tuple))
    and len(blur) == 3
    and all(_number(p) and 0 <= p <= 1 for p in blur),
    f"{_KEY}.blur_prob={blur!r} must be 3 probabilities (first global view, "
    "second global view, local views)",
  )
  _pair(multicrop, "blur_sigma", 0.0, 1e3)
  flip = multicrop["flip"]
  _require(isinstance(flip, bool), f"{_KEY}.flip={flip!r} must be True or False")
  threshold = multicrop["solarize_threshold"]
  _require(
    _number(threshold) and math.isfinite(threshold),
    f"{_KEY}.solarize_threshold={threshold!r} must be a finite number (0..255 "
    "units: pixels >= it become 255 - pixel)",
  )


@dataclasses.dataclass(frozen=True)
class MultiCrop:
  """Validated multi-crop settings (see ``default_multicrop_config``)."""

  num_global: int
  num_local: int
  global_size: int
  local_size: int
  global_scale: tuple[float, float]
  local_scale: tuple[float, float]
  flip: bool
  jitter_prob: float
  brightness: float
  contrast: float
  saturation: float
  hue: float
  grayscale_prob: float
  blur_prob: tuple[float, float, float]
  blur_sigma: tuple[float, float]
  solarize_prob: float
  solarize_threshold: float
  scale: np.ndarray  # float32 [C]: 1 / (255 std)
  offset: np.ndarray  # float32 [C]: mean / std


def multicrop_settings(
  multicrop: ml_collections.ConfigDict, scale: np.ndarray, offset: np.ndarray
) -> MultiCrop:
  """Checks ``multicrop`` (:func:`check_multicrop`) and returns its settings.

  ``scale``, ``offset``: float32 [C], ``1 / (255 std)`` and ``mean / std``.

  Raises:
    DataError: a key is missing or out of range (one line naming it).
  """
  check_multicrop(multicrop)
  m = multicrop

  def pair(key):
    return (float(m[key][0]), float(m[key][1]))

  numbers = (
    "jitter_prob",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "grayscale_prob",
    "solarize_prob",
    "solarize_threshold",
  )
  return MultiCrop(
    num_global=m["num_global"],
    num_local=m["num_local"],
    global_size=m["global_size"],
    local_size=m["local_size"],
    global_scale=pair("global_scale"),
    local_scale=pair("local_scale"),
    flip=m["flip"],
    blur_prob=tuple(float(p) for p in m["blur_prob"]),
    blur_sigma=pair("blur_sigma"),
    **{key: float(m[key]) for key in numbers},
    scale=scale,
    offset=offset,
  )


def multicrop_views(images, rng, m: MultiCrop, fixed_size: bool, local: bool) -> np.ndarray:
  """float32 [V, B, S, S, C]: the global (or local) views of a list of B uint8 [h, w, C] images."""
  batch, channels = len(images), images[0].shape[-1]
  if local:
    views, size, scale = m.num_local, m.local_size, m.local_scale
    blur_prob, solarize_prob = np.full(views, m.blur_prob[2]), np.zeros(views)
  else:
    views, size, scale = m.num_global, m.global_size, m.global_scale
    second = np.arange(views) % 2 == 1  # Views 1, 3, ... follow the second view's recipe.
    blur_prob = np.where(second, m.blur_prob[1], m.blur_prob[0])
    solarize_prob = np.where(second, m.solarize_prob, 0.0)
  if not views:
    return np.zeros((0, batch, size, size, channels), np.float32)
  heights = np.array([x.shape[0] for x in images])
  widths = np.array([x.shape[1] for x in images])
  boxes = augment.sample_boxes(rng, np.broadcast_to(heights, (views, batch)), widths, scale)
  flips = rng.random((views, batch)) < 0.5 if m.flip else np.zeros((views, batch), bool)
  crops = augment.crop_batch(images, boxes, flips, size, fixed_size=fixed_size)
  x = crops.reshape(views * batch, channels, size, size)
  x = _augment_views(x, rng, m, np.repeat(blur_prob, batch), np.repeat(solarize_prob, batch))
  return x.reshape(views, batch, size, size, channels)


def _augment_views(x: np.ndarray, rng, m: MultiCrop, blur_prob, solarize_prob) -> np.ndarray:
  """The photometric part of the DINO recipe on N crops, then normalisation.

  Jitter (fixed order, unlike torchvision's random one), grey, blur, solarise,
  ``(x / 255 - mean) / std``. The same random numbers are drawn whatever the
  probabilities, so changing one changes only which crops get that op. Chunks of about
  ``_CHUNK_PIXELS`` pixels stay in cache (about 2x faster).

  Args:
    x: float32 [N, C, S, S] in [0, 255]; overwritten.
    rng, m: generator and settings.
    blur_prob, solarize_prob: [N] probabilities per crop.

  Returns:
    float32 [N, S, S, C], normalised, channels last.
  """
  n, channels, height, width = x.shape
  jitter = rng.random(n) < m.jitter_prob

  def factors(strength):
    return np.where(jitter, rng.uniform(max(0.0, 1 - strength), 1 + strength, n), 1.0)

  draws = {
    "brightness": factors(m.brightness),
    "contrast": factors(m.contrast),
    "saturation": factors(m.saturation),
    "hue": np.where(jitter, rng.uniform(-m.hue, m.hue, n), 0.0),
    "grey": rng.random(n) < m.grayscale_prob,
    "blur": rng.random(n) < blur_prob,
    "sigma": rng.uniform(m.blur_sigma[0], m.blur_sigma[1], n),
    "solarize": rng.random(n) < solarize_prob,
  }
  out = np.empty((n, height, width, channels), np.float32)
  step = max(1, _CHUNK_PIXELS // (height * width))
  for start in range(0, n, step):
    rows = slice(start, start + step)
    part = _photometric(x[rows], m, **{k: v[rows] for k, v in draws.items()})
    part *= m.scale[:, None, None]  # Normalising before the transposing copy is 2x faster.
    part -= m.offset[:, None, None]
    out[rows] = part.transpose(0, 2, 3, 1)
  return out


def _photometric(
  x, m: MultiCrop, *, brightness, contrast, saturation, hue, grey, blur, sigma, solarize
):
  """Applies drawn jitter factors, grey, blur and solarise flags ([N] each) to f32 [N, C, S, S].

  ``x`` may be overwritten; returns float32 [N, C, S, S].
  """
  rgb = x.shape[1] == 3
  if m.brightness and np.any(brightness != 1):
    x = augment.adjust_brightness(x, brightness)
  if m.contrast and np.any(contrast != 1):
    x = augment.adjust_contrast(x, contrast)
  if rgb and m.saturation and np.any(saturation != 1):
    x = augment.adjust_saturation(x, saturation)
  rows = np.flatnonzero(hue) if rgb else ()
  if len(rows):
    x[rows] = augment.shift_hue(x[rows], hue[rows])
  rows = np.flatnonzero(grey) if rgb else ()
  if len(rows):
    x[rows] = augment.grey(x[rows])
  rows = np.flatnonzero(blur)
  if len(rows):
    x[rows] = augment.blur(x[rows], sigma[rows], int(np.ceil(3 * m.blur_sigma[1])))
  rows = np.flatnonzero(solarize)
  if len(rows):
    x[rows] = augment.solarize(x[rows], m.solarize_threshold)
  return x
