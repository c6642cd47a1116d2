"""Image classification input pipelines: TFDS array_record data sources -> grain.

Typical use::

  images.prepare(cfg.data)                 # once; builds fashion_mnist_idx
  meta = images.info(cfg.data)             # ImageInfo(num_classes, image_shape, ...)
  it = iter(images.train_dataset(cfg.data, batch_size=128, seed=0))
  batch = next(it)                         # {"image": f32[B,H,W,C], "label": i32[B]}
  state = it.get_state()                   # checkpoint with the model; it.set_state(state)
  for batch in images.eval_batches(cfg.data, batch_size=500): ...  # + "mask"
  mc = images.default_multicrop_config(cfg.data.name)  # DINO multi-crop views, no labels:
  views = next(iter(images.multicrop_train_dataset(cfg.data, mc, batch_size=128, seed=0)))
  # {"global": f32[2,B,28,28,C], "local": f32[6,B,14,14,C]} for Fashion-MNIST

Reading is batched: the pipelines shuffle and batch example *indices* and fetch
each batch with one ``__getitems__`` call on the TFDS data source. Per-example
reads through ``grain.MapDataset.source(...)`` cost ~25x more per example in
array_record (a fixed ~200 us per read call), which made the per-example
pipeline ~6x slower. Augmentation is vectorised over the batch where the images
have a fixed size and uses the per-batch ``np.random.Generator`` that grain's
``random_map`` derives from the seed, so the stream is deterministic under the
seed and resumable with ``get_state()``/``set_state()``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import NamedTuple

import grain
import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from laplax.data.builders import fashion_mnist_idx as fmnist
from laplax.data.errors import DataError  # Re-exported: images.DataError.
from laplax.data.errors import corrupt_prepared

EVAL_CROP_FRACTION = 0.875  # eval of variable-size images: crop 224 of 256, as usual
RRC_SCALE = (0.08, 1.0)  # random-resized-crop area fraction range (Inception)
RRC_RATIO = (3 / 4, 4 / 3)  # random-resized-crop aspect ratio range


class ImageInfo(NamedTuple):
  """Dataset facts the model and trainer need.

  Attributes:
    num_classes: number of labels; labels are in [0, num_classes).
    image_shape: (H, W, C) of the model input, i.e. after preprocessing.
    num_train: examples in the train split (all processes together).
    num_eval: examples in the eval split.
  """

  num_classes: int
  image_shape: tuple[int, int, int]
  num_train: int
  num_eval: int


def default_config(name: str = fmnist.FashionMnistIdx.name) -> ml_collections.ConfigDict:
  """Returns a data config with every key this module reads, for dataset ``name``."""
  return ml_collections.ConfigDict(
    {
      "name": name,
      "data_dir": "~/tensorflow_datasets",
      "source_dir": fmnist.DEFAULT_SOURCE_DIR,
      "train_split": "train",
      "eval_split": "validation" if name.startswith("imagenet") else "test",
      "image_size": 224 if name.startswith("imagenet") else None,
      "crop_padding": 2 if name.startswith("fashion_mnist") else 4,
      "flip": True,
      "mean": None,
      "std": None,
      "num_threads": 2,
      "prefetch": 4,
    }
  )


# --------------------------------------------------------------------------
# Preparing and opening datasets.


def _data_dir(data_config) -> str:
  return os.path.expanduser(data_config.data_dir)


def _one_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def prepare(data_config: ml_collections.ConfigDict) -> None:
  """Makes sure the dataset is prepared in ``data_config.data_dir``.

  For ``fashion_mnist_idx``, builds it (array_record, ~70 MB, some seconds) from
  the IDX files in ``data_config.source_dir`` unless already prepared. For any
  other TFDS name (cifar10, imagenet2012, ...) only checks that both splits
  are readable, since preparing those needs the internet.

  Raises:
    DataError: Fashion-MNIST source files missing or corrupt (checked before
    anything is written to data_dir), or the dataset is not prepared.
  """
  if data_config.name != fmnist.FashionMnistIdx.name:
    _open(data_config, data_config.train_split)
    _open(data_config, data_config.eval_split)
    return
  builder = tfds.builder(data_config.name, data_dir=_data_dir(data_config))
  if builder.is_prepared():
    return
  source_dir = os.path.expanduser(data_config.source_dir or fmnist.DEFAULT_SOURCE_DIR)
  files = [p for pair in fmnist.source_files(source_dir).values() for p in pair]
  missing = [os.path.basename(p) for p in files if not os.path.isfile(p)]
  if missing:
    raise DataError(
      f"Fashion-MNIST IDX files missing in {source_dir}: {', '.join(missing)}. "
      f"Install them with `{fmnist.INSTALL_COMMAND}`, or set "
      "--config.data.source_dir=... to a directory that has them."
    )
  try:
    fmnist.check_headers(source_dir)
    builder.download_and_prepare(
      file_format="array_record",
      download_config=tfds.download.DownloadConfig(manual_dir=source_dir),
    )
  except fmnist.IdxFormatError as e:
    raise DataError(
      f"Corrupt Fashion-MNIST file {e.path}: {e.problem}. Reinstall it with "
      f"`{fmnist.INSTALL_COMMAND} --reinstall`, or set "
      "--config.data.source_dir=... to a directory with intact files."
    ) from e


def _unreadable(name: str, data_dir: str, split: str, error: Exception) -> str:
  """One-line DataError message for a data source tfds could not open."""
  if name == fmnist.FashionMnistIdx.name:
    fix = "run laplax.data.images.prepare(config) first"
  else:
    fix = (
      "it must be prepared with TFDS on a machine with internet (`tfds build "
      f"{name} --data_dir=DIR --file_format=array_record`) and DIR/{name} copied there"
    )
  fix += ", or set --config.data.data_dir=... to where it is prepared"
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    return f"Unknown TFDS dataset {name!r}; fix --config.data.name."
  except Exception:  # Let the message below quote tfds's original error.
    builder = None
  if builder is not None and not builder.is_prepared():
    return f"TFDS dataset {name!r} is not prepared in {data_dir}; {fix}."
  if builder is not None and split not in builder.info.splits:
    return (
      f"TFDS dataset {name!r} in {data_dir} has no split {split!r}, only "
      f"{sorted(builder.info.splits)}; fix --config.data.train_split/eval_split."
    )
  return (
    f"Cannot read split {split!r} of TFDS dataset {name!r} from {data_dir} "
    f"({_one_line(error)}); the reader needs array_record format: {fix}."
  )


def _open(data_config, split: str):
  """Returns the TFDS data source of ``split``, or raises DataError."""
  name, data_dir = data_config.name, _data_dir(data_config)
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises NotImplementedError, ValueError, ... here.
    raise DataError(_unreadable(name, data_dir, split, e)) from e
  try:
    source[0]  # Decodes one example: fails early if an image decoder is missing.
    source[len(source) - 1]  # and if a prepared file is truncated or corrupt.
  except ImportError as e:
    raise DataError(
      f"Decoding the encoded images of {name!r} needs Pillow or OpenCV "
      f"({_one_line(e)}); install one with `pip install pillow`."
    ) from e
  except Exception as e:  # array_record raises RuntimeError, OSError, ...
    raise corrupt_prepared(f"split {split!r} of {name!r} in {data_dir}",
                           os.path.join(data_dir, name), e) from e
  return source


# --------------------------------------------------------------------------
# Preprocessing (numpy only).


@dataclasses.dataclass(frozen=True)
class _Preprocess:
  """Static preprocessing settings derived from a data config."""

  image_size: int | None  # None: images keep their fixed stored size.
  eval_crop: float  # eval: central square of this fraction of the short side
  crop_padding: int
  flip: bool
  scale: np.ndarray  # float32 [C]: 1 / (255 std)
  offset: np.ndarray  # float32 [C]: mean / std


def _preprocess_settings(data_config, features) -> tuple[_Preprocess, tuple[int, int, int]]:
  """Returns preprocessing settings and the (H, W, C) model input shape."""
  height, width, channels = features["image"].shape
  size = data_config.image_size
  if size is None and (height is None or width is None):
    raise DataError(
      f"{data_config.name!r} has images of varying size; set "
      "--config.data.image_size=... (e.g. 224) to resize them."
    )
  if size == height == width:
    size = None
  mean, std = (_per_channel(data_config, key, channels) for key in ("mean", "std"))
  settings = _Preprocess(
    image_size=size,
    eval_crop=EVAL_CROP_FRACTION if height is None or width is None else 1.0,
    crop_padding=int(data_config.crop_padding),
    flip=bool(data_config.flip),
    scale=(1.0 / (255.0 * std)).astype(np.float32),
    offset=(mean / std).astype(np.float32),
  )
  shape = (size, size, channels) if size else (height, width, channels)
  return settings, shape


def _per_channel(data_config, key: str, channels: int) -> np.ndarray:
  """float32 [channels] from config ``key`` (None -> 0.5), or DataError."""
  value = np.asarray(0.5 if data_config[key] is None else data_config[key], np.float32)
  if value.size not in (1, channels):
    raise DataError(
      f"--config.data.{key} has {value.size} values but {data_config.name!r} "
      f"images have {channels} channels; give 1 or {channels} values."
    )
  return np.broadcast_to(value.reshape(-1), (channels,))


def _normalise(images: np.ndarray, p: _Preprocess) -> np.ndarray:
  """[..., C] pixel values in [0, 255] -> float32 (x / 255 - mean) / std."""
  return images.astype(np.float32) * p.scale - p.offset


def _random_crop(images: np.ndarray, padding: int, rng) -> np.ndarray:
  """[B, H, W, C] -> same shape: random H x W window of the zero-padded images."""
  if not padding:
    return images
  n, h, w, _ = images.shape
  padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  dy, dx = rng.integers(0, 2 * padding + 1, size=(2, n))
  rows = dy[:, None, None] + np.arange(h)[None, :, None]
  cols = dx[:, None, None] + np.arange(w)[None, None, :]
  return padded[np.arange(n)[:, None, None], rows, cols]


def _random_flip(images: np.ndarray, rng) -> np.ndarray:
  """[B, H, W, C] -> same shape, each image flipped left-right with probability 0.5."""
  flipped = rng.random(len(images)) < 0.5
  return np.where(flipped[:, None, None, None], images[:, :, ::-1], images)


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """Bilinear resize, half-pixel centres, no antialiasing: [h, w, C] -> f32 [height, width, C]."""

  def taps(n_in, n_out):
    x = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    lo = np.floor(x).astype(np.int64)
    return lo, np.minimum(lo + 1, n_in - 1), (x - lo).astype(np.float32)

  y0, y1, wy = taps(image.shape[0], height)
  x0, x1, wx = taps(image.shape[1], width)
  image = image.astype(np.float32)
  rows = image[y0] * (1 - wy)[:, None, None] + image[y1] * wy[:, None, None]
  return rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]


def _center_crop_resize(image: np.ndarray, size: int, fraction: float) -> np.ndarray:
  """Central square of side ``fraction * min(h, w)``, resized to [size, size, C]."""
  h, w = image.shape[:2]
  side = max(1, int(round(fraction * min(h, w))))
  top, left = (h - side) // 2, (w - side) // 2
  return _resize(image[top : top + side, left : left + side], size, size)


def _random_resized_crop(image: np.ndarray, size: int, rng) -> np.ndarray:
  """Inception-style crop (area/aspect from RRC_SCALE/RRC_RATIO), resized to [size, size, C]."""
  h, w = image.shape[:2]
  log_ratio = np.log(RRC_RATIO)
  for _ in range(10):
    area = h * w * rng.uniform(*RRC_SCALE)
    aspect = np.exp(rng.uniform(*log_ratio))
    cw, ch = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
    if 0 < cw <= w and 0 < ch <= h:
      top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
      return _resize(image[top : top + ch, left : left + cw], size, size)
  return _center_crop_resize(image, size, 1.0)


def _read(source, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  """One batched read: (list of uint8 [h, w, C] images, int32 [n] labels)."""
  examples = source.__getitems__(indices.tolist())
  labels = np.array([e["label"] for e in examples], dtype=np.int32)
  return [e["image"] for e in examples], labels


def _train_batch(indices: np.ndarray, rng, *, source, p: _Preprocess):
  images, labels = _read(source, indices)
  if p.image_size:
    images = np.stack([_random_resized_crop(x, p.image_size, rng) for x in images])
  else:
    images = _random_crop(np.stack(images), p.crop_padding, rng)
  if p.flip:
    images = _random_flip(images, rng)
  return {"image": _normalise(images, p), "label": labels}


def _eval_batch(indices: np.ndarray, *, source, p: _Preprocess, batch_size: int):
  images, labels = _read(source, indices)
  if p.image_size:
    images = [_center_crop_resize(x, p.image_size, p.eval_crop) for x in images]
  images = _normalise(np.stack(images), p)
  n, pad = len(labels), batch_size - len(labels)
  return {
    "image": np.pad(images, ((0, pad), (0, 0), (0, 0), (0, 0))),
    "label": np.pad(labels, (0, pad)),
    "mask": np.pad(np.ones(n, np.float32), (0, pad)),
  }


# --------------------------------------------------------------------------
# Public pipelines.


def info(data_config: ml_collections.ConfigDict) -> ImageInfo:
  """Returns num_classes, model input (H, W, C) and split sizes.

  Raises:
    DataError: the dataset is not prepared/readable, or has variable-size
    images and ``image_size`` is None.
  """
  train = _open(data_config, data_config.train_split)
  evaluation = _open(data_config, data_config.eval_split)
  features = train.dataset_info.features
  _, shape = _preprocess_settings(data_config, features)
  return ImageInfo(
    num_classes=features["label"].num_classes,
    image_shape=shape,
    num_train=len(train),
    num_eval=len(evaluation),
  )


def _read_options(data_config) -> grain.ReadOptions:
  return grain.ReadOptions(
    num_threads=int(data_config.num_threads),
    prefetch_buffer_size=int(data_config.prefetch),
  )


def _shuffled_batches(data_config, source, make_batch, *, batch_size: int, seed: int,
                      process_index: int, process_count: int) -> grain.IterDataset:
  """This process's shard of ``source`` indices, shuffled per epoch, batched, and
  turned into batches by ``make_batch(indices, rng)`` (grain ``random_map``)."""
  ds = grain.MapDataset.range(len(source))[process_index::process_count]
  ds = ds.seed(seed).shuffle().repeat().batch(batch_size, drop_remainder=True)
  return ds.random_map(make_batch).to_iter_dataset(_read_options(data_config))


def train_dataset(
  data_config: ml_collections.ConfigDict,
  *,
  batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.IterDataset:
  """Infinite, shuffled, augmented training batches of this process's shard.

  Process ``process_index`` reads examples ``process_index::process_count`` of
  ``data_config.train_split``, reshuffled every epoch. Augmentation: for
  fixed-size images (``image_size`` None or equal to the stored size), a random
  crop of the image zero-padded by ``crop_padding`` pixels; otherwise
  (``crop_padding`` unused) an Inception random-resized crop to ``image_size``; then, if ``flip``, a
  horizontal flip with probability 0.5. The stream is a deterministic
  function of (dataset, shard, batch_size, seed, preprocessing settings) and
  independent of ``num_threads``/``prefetch``.

  Args:
    data_config: data config (see ``default_config``).
    batch_size: examples per batch on this process.
    seed: non-negative int seeding shuffling and augmentation.
    process_index: index of this process, in [0, process_count).
    process_count: number of processes sharing the data.

  Returns:
    A ``grain.IterDataset``; ``iter()`` on it gives a ``grain.DatasetIterator``
    (supports ``get_state()``/``set_state()``) yielding dicts with
    "image": float32 [batch_size, H, W, C], normalised ``(x/255 - mean)/std``,
    and "label": int32 [batch_size].

  Raises:
    DataError: the dataset is not prepared/readable or misconfigured.
  """
  source = _open(data_config, data_config.train_split)
  p, _ = _preprocess_settings(data_config, source.dataset_info.features)
  return _shuffled_batches(
    data_config, source, functools.partial(_train_batch, source=source, p=p),
    batch_size=batch_size, seed=seed, process_index=process_index,
    process_count=process_count)


def eval_batches(
  data_config: ml_collections.ConfigDict,
  *,
  batch_size: int,
  split: str | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Every example of the eval split exactly once, in order, without augmentation.

  Images are normalised and, if ``image_size`` differs from the stored size,
  resized to it: stored images of one fixed size whole; variable-size ones
  (ImageNet) after cropping their central square of side ``EVAL_CROP_FRACTION``
  times the short side.

  Args:
    data_config: data config (see ``default_config``).
    batch_size: examples per batch.
    split: TFDS split, default ``data_config.eval_split``.

  Returns:
    An iterator of dicts: "image" float32 [batch_size, H, W, C], "label"
    int32 [batch_size] and "mask" float32 [batch_size] (1 real, 0 padding).
    The last batch is zero-padded to batch_size.

  Raises:
    DataError: the dataset is not prepared/readable or misconfigured.
  """
  source = _open(data_config, split or data_config.eval_split)
  p, _ = _preprocess_settings(data_config, source.dataset_info.features)
  ds = grain.MapDataset.range(len(source)).batch(batch_size)
  ds = ds.map(functools.partial(_eval_batch, source=source, p=p, batch_size=batch_size))
  return iter(ds.to_iter_dataset(_read_options(data_config)))


# --------------------------------------------------------------------------
# Multi-crop (DINO).
#
# Caron et al. 2021, "Emerging Properties in Self-Supervised Vision
# Transformers" (arXiv:2104.14294), section 3.1 and appendix; the photometric
# recipe is BYOL's (Grill et al. 2020, arXiv:2006.07733, appendix B). Crops and
# colour operations work on float32 pixel values in [0, 255] and are vectorised
# over all views of one size in a batch; only the crop of variable-size images
# (ImageNet) runs per image.

GREY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L")
_CHUNK_PIXELS = 1 << 16  # pixels per augmentation pass: each f32 plane stays in cache


def default_multicrop_config(name: str = fmnist.FashionMnistIdx.name) -> ml_collections.ConfigDict:
  """Returns the DINO multi-crop augmentation config for dataset ``name``.

  ImageNet names (``imagenet*``) get DINO's ImageNet settings (2 global 224 px
  and 10 local 96 px crops, blur sigma up to 2 px); any other name gets the
  small-image settings chosen for Fashion-MNIST (2 global 28 px and 6 local
  14 px crops, blur sigma up to 1 px). Keys:

  * ``num_global``, ``num_local``: number of global and local views (>= 1, >= 0).
  * ``global_size``, ``local_size``: side in pixels of the square views.
  * ``global_scale``, ``local_scale``: (min, max) area fraction of the
    random-resized crops; the aspect ratio is log-uniform in ``RRC_RATIO``.
  * ``flip``: horizontal flip with probability 0.5.
  * ``jitter_prob``: probability of colour jitter with strengths ``brightness``,
    ``contrast``, ``saturation`` (factor uniform in [1 - s, 1 + s]) and ``hue``
    (shift uniform in [-hue, hue] turns); saturation and hue only for RGB.
  * ``grayscale_prob``: probability of converting to grey (RGB only).
  * ``blur_prob``: Gaussian blur probability of (the first global view, the
    second global view, every local view); ``blur_sigma``: (min, max) of its
    uniform standard deviation, in pixels of the view.
  * ``solarize_prob``: solarisation probability of the second global view;
    ``solarize_threshold``: pixels >= it (0..255 units) become 255 - pixel.
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


@dataclasses.dataclass(frozen=True)
class _MultiCrop:
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


def _multicrop_settings(data_config, multicrop, channels: int) -> _MultiCrop:
  """Checks ``multicrop`` and returns its settings for ``channels``-channel images.

  Raises:
    DataError: a key is missing or a value is out of range (one line naming it).
  """
  missing = sorted(set(default_multicrop_config()) - set(multicrop))
  if missing:
    raise DataError(
      f"The multi-crop config lacks {', '.join(missing)}; start from "
      "laplax.data.images.default_multicrop_config()."
    )

  def check(key, ok, want):
    value = multicrop[key]
    try:
      good = bool(ok(value))
    except (TypeError, ValueError):
      good = False
    if not good:
      raise DataError(f"Multi-crop {key}={value!r}; it must be {want}.")
    return value

  def integer(key, low):
    return int(check(key, lambda v: int(v) == v and v >= low, f"an integer >= {low}"))

  def prob(key):
    return float(check(key, lambda v: 0 <= v <= 1, "a probability in [0, 1]"))

  def strength(key, high=np.inf):
    return float(check(key, lambda v: 0 <= v <= high, f"in [0, {high}]"))

  def span(key, high, *, zero_low=False):
    def ok(v):
      return len(v) == 2 and (0 <= v[0] if zero_low else 0 < v[0]) and v[0] <= v[1] <= high

    want = f"a pair (low, high) with 0 {'<=' if zero_low else '<'} low <= high <= {high}"
    value = check(key, ok, want)
    return (float(value[0]), float(value[1]))

  blur = check(
    "blur_prob", lambda v: len(v) == 3 and all(0 <= p <= 1 for p in v), "3 probabilities"
  )
  threshold = check("solarize_threshold", lambda v: float(v) == v, "a number (0..255 units)")
  mean, std = (_per_channel(data_config, key, channels) for key in ("mean", "std"))
  return _MultiCrop(
    num_global=integer("num_global", 1),
    num_local=integer("num_local", 0),
    global_size=integer("global_size", 1),
    local_size=integer("local_size", 1),
    global_scale=span("global_scale", 1.0),
    local_scale=span("local_scale", 1.0),
    flip=bool(multicrop.flip),
    jitter_prob=prob("jitter_prob"),
    brightness=strength("brightness"),
    contrast=strength("contrast"),
    saturation=strength("saturation"),
    hue=strength("hue", 0.5),
    grayscale_prob=prob("grayscale_prob"),
    blur_prob=tuple(float(p) for p in blur),
    blur_sigma=span("blur_sigma", np.inf, zero_low=True),
    solarize_prob=prob("solarize_prob"),
    solarize_threshold=float(threshold),
    scale=(1.0 / (255.0 * std)).astype(np.float32),
    offset=(mean / std).astype(np.float32),
  )


def _sample_boxes(rng, height, width, scale, ratio=RRC_RATIO, attempts: int = 10) -> np.ndarray:
  """Random-resized-crop boxes, as torchvision's RandomResizedCrop but not rounded.

  Each box has an area fraction uniform in ``scale`` and an aspect ratio
  (width / height) log-uniform in ``ratio``; of ``attempts`` draws the first
  that fits in the image is placed uniformly at random. If none fits (only
  possible for images with an aspect ratio far from 1, or ``scale`` reaching
  above ``1 / ratio[1]``), the box is the central crop of the whole height or
  width with the aspect ratio clipped into ``ratio``. Boxes are continuous, in
  pixel-edge coordinates: pixel i covers [i, i + 1].

  Args:
    rng: np.random.Generator.
    height: image heights in pixels, int or float array of any shape [...].
    width: image widths, broadcastable with ``height``.
    scale: (min, max) area fraction.
    ratio: (min, max) aspect ratio.
    attempts: draws before the central fallback.

  Returns:
    float64 [..., 4]: (top, left, box height, box width) per image, with
    0 <= top, top + box height <= height and likewise for left and width.
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
  """Bilinear taps sampling [start, start + length] of an axis of n_in pixels at n_out points.

  Sample j is at pixel-centre coordinate ``start + (j + 0.5) length / n_out -
  0.5`` (half-pixel centres, as ``_resize``), clipped to [0, n_in - 1].

  Returns:
    (lo, hi, frac): int [N, n_out] neighbour indices and float32 [N, n_out]
    weights of ``hi``, for start, length float [N].
  """
  x = start[:, None] + (np.arange(n_out) + 0.5) * (length[:, None] / n_out) - 0.5
  x = np.clip(x, 0, n_in - 1)
  lo = np.floor(x).astype(np.intp)
  return lo, np.minimum(lo + 1, n_in - 1), (x - lo).astype(np.float32)


def _resized_crops(images: np.ndarray, boxes: np.ndarray, flips: np.ndarray, size: int):
  """Bilinear crop-and-resize of several boxes per image, optionally mirrored.

  No antialiasing (as ``_resize``): boxes much larger than ``size`` alias. A
  flip reverses the sampled columns, which equals flipping the resized crop.
  Both passes gather whole contiguous rows (rows of the image first, then
  columns of the transposed result), several times faster in numpy than
  gathering single pixels.

  Args:
    images: uint8 or float [B, H, W, C].
    boxes: float [V, B, 4] (top, left, height, width), see ``_sample_boxes``.
    flips: bool [V, B], mirror left-right.
    size: side of the square output.

  Returns:
    float32 [V, B, C, size, size], channels first: view v of image b in
    [v, b], values within the range of the image's values.
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


def _grey(x: np.ndarray) -> np.ndarray:
  """float32 [N, C, H, W] -> [N, 1, H, W]: luma ``GREY_WEIGHTS`` of RGB, or x itself if C == 1."""
  if x.shape[1] == 1:
    return x
  r, g, b = (np.float32(w) for w in GREY_WEIGHTS)
  return x[:, 0:1] * r + x[:, 1:2] * g + x[:, 2:3] * b


def _per_image(factor: np.ndarray) -> np.ndarray:
  return np.asarray(factor, np.float32)[:, None, None, None]


def _adjust_brightness(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """float32 [N, C, H, W] in [0, 255], factor [N] -> clip(factor x, 0, 255)."""
  return np.clip(x * _per_image(factor), 0, 255)


def _adjust_contrast(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """Blends toward each image's mean grey level m: clip(f x + (1 - f) m, 0, 255).

  Args:
    x: float32 [N, C, H, W] in [0, 255].
    factor: [N] blend factors f (1: unchanged, 0: uniform grey m).

  Returns:
    float32 [N, C, H, W].
  """
  f = _per_image(factor)
  mean = _grey(x).mean(axis=(1, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
  return np.clip(f * x + (1 - f) * mean, 0, 255)


def _adjust_saturation(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
  """Blends RGB float32 [N, 3, H, W] with its grey image g: clip(f x + (1 - f) g, 0, 255)."""
  f = _per_image(factor)
  return np.clip(f * x + (1 - f) * _grey(x), 0, 255)


def _shift_hue(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
  """Rotates the HSV hue of RGB float32 [N, 3, H, W] by ``shift`` [N] turns.

  Keeps each pixel's HSV value (largest channel) and chroma (largest minus
  smallest channel), so the result stays within the pixel's channel range;
  grey pixels are unchanged.

  Returns:
    float32 [N, 3, H, W].
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
  """float32 [N, 2 radius + 1]: Gaussian weights at -radius..radius for sigma [N], summing to 1.

  Sigma 0 (allowed in ``blur_sigma``) gives the identity kernel [.., 0, 1, 0, ..].
  """
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


def _blur(x: np.ndarray, sigma: np.ndarray, radius: int) -> np.ndarray:
  """Separable Gaussian blur with per-image sigma, truncated at ``radius``, reflect padding.

  Args:
    x: float32 [N, C, H, W].
    sigma: [N] standard deviations in pixels.
    radius: kernel half width in pixels (3 times the largest sigma suffices).

  Returns:
    float32 [N, C, H, W].
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


def _solarize(x: np.ndarray, threshold: float) -> np.ndarray:
  """Pixels >= threshold (0..255 units) become 255 - pixel."""
  return np.where(x >= threshold, 255 - x, x)


def _augment_views(x: np.ndarray, rng, m: _MultiCrop, blur_prob, solarize_prob) -> np.ndarray:
  """The photometric part of the DINO recipe on N crops, then normalisation.

  In this fixed order: colour jitter with probability ``m.jitter_prob``
  (brightness, contrast, then for RGB saturation and hue, each clipped to
  [0, 255]; torchvision's ColorJitter picks a random order instead); for RGB
  grey with probability ``m.grayscale_prob``; Gaussian blur with probability
  ``blur_prob``; solarisation with probability ``solarize_prob``; ``(x / 255 -
  mean) / std``. The same random numbers are drawn whatever the probabilities
  and strengths, so changing a probability changes only which crops get that
  operation. Works through the crops in chunks of about ``_CHUNK_PIXELS``
  pixels, which keeps the temporaries in cache (about 2x faster).

  Args:
    x: float32 [N, C, S, S] crops in [0, 255], channels first; overwritten.
    rng: np.random.Generator.
    m: settings.
    blur_prob: [N] blur probability of each crop.
    solarize_prob: [N] solarisation probability of each crop.

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
  x, m: _MultiCrop, *, brightness, contrast, saturation, hue, grey, blur, sigma, solarize
):
  """Applies drawn jitter factors, grey, blur and solarise flags ([N] each) to f32 [N, C, S, S].

  ``x`` may be overwritten; returns float32 [N, C, S, S].
  """
  rgb = x.shape[1] == 3
  if m.brightness and np.any(brightness != 1):
    x = _adjust_brightness(x, brightness)
  if m.contrast and np.any(contrast != 1):
    x = _adjust_contrast(x, contrast)
  if rgb and m.saturation and np.any(saturation != 1):
    x = _adjust_saturation(x, saturation)
  rows = np.flatnonzero(hue) if rgb else ()
  if len(rows):
    x[rows] = _shift_hue(x[rows], hue[rows])
  rows = np.flatnonzero(grey) if rgb else ()
  if len(rows):
    x[rows] = _grey(x[rows])
  rows = np.flatnonzero(blur)
  if len(rows):
    x[rows] = _blur(x[rows], sigma[rows], int(np.ceil(3 * m.blur_sigma[1])))
  rows = np.flatnonzero(solarize)
  if len(rows):
    x[rows] = _solarize(x[rows], m.solarize_threshold)
  return x


def _multicrop_views(images, rng, m: _MultiCrop, fixed_size: bool, local: bool) -> np.ndarray:
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
  boxes = _sample_boxes(rng, np.broadcast_to(heights, (views, batch)), widths, scale)
  flips = rng.random((views, batch)) < 0.5 if m.flip else np.zeros((views, batch), bool)
  if fixed_size:
    crops = _resized_crops(np.stack(images), boxes, flips, size)
  else:
    crops = np.concatenate(
      [
        _resized_crops(x[None], boxes[:, i : i + 1], flips[:, i : i + 1], size)
        for i, x in enumerate(images)
      ],
      axis=1,
    )
  x = crops.reshape(views * batch, channels, size, size)
  x = _augment_views(x, rng, m, np.repeat(blur_prob, batch), np.repeat(solarize_prob, batch))
  return x.reshape(views, batch, size, size, channels)


def _multicrop_batch(indices: np.ndarray, rng, *, source, m: _MultiCrop, fixed_size: bool):
  images, _ = _read(source, indices)
  return {
    "global": _multicrop_views(images, rng, m, fixed_size, local=False),
    "local": _multicrop_views(images, rng, m, fixed_size, local=True),
  }


def multicrop_train_dataset(
  data_config: ml_collections.ConfigDict,
  multicrop: ml_collections.ConfigDict,
  *,
  batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.IterDataset:
  """Infinite, shuffled DINO multi-crop views of this process's shard, without labels.

  Examples are sharded, shuffled per epoch and batched exactly as in
  ``train_dataset``. Each image gives ``num_global`` global and ``num_local``
  local views (Caron et al. 2021, arXiv:2104.14294; photometric recipe of
  BYOL, Grill et al. 2020, arXiv:2006.07733): a random-resized crop (area
  fraction uniform in ``global_scale``/``local_scale``, aspect ratio
  log-uniform in ``RRC_RATIO``, bilinear, no antialiasing) -> horizontal flip
  with probability 0.5 if ``flip`` -> colour jitter with probability
  ``jitter_prob``, in the fixed order brightness (multiply by a factor uniform
  in [1 - b, 1 + b]), contrast (blend toward the image's mean grey level),
  saturation (blend with the grey image) and hue (HSV hue shift), each clipped
  to [0, 255] -> grey with probability ``grayscale_prob`` -> Gaussian blur
  (sigma uniform in ``blur_sigma`` pixels of the view, reflect padding) with
  probability ``blur_prob[0]`` for the first global view, ``blur_prob[1]`` for
  the second and ``blur_prob[2]`` for local views -> solarisation of the second
  global view with probability ``solarize_prob`` -> ``(x / 255 - mean) /
  std`` with the data config's mean/std. Saturation, hue and grey are skipped
  for 1-channel images. With more than two global views, views 2, 4, ...
  follow the first view's recipe and views 3, 5, ... the second's.

  Fixed-size images (Fashion-MNIST, CIFAR) are cropped vectorised over the
  batch; variable-size ones (ImageNet) one image at a time. The data config's
  ``image_size``, ``crop_padding`` and ``flip`` are not used. The stream is a
  deterministic function of (dataset, shard, batch_size, seed, settings),
  independent of ``num_threads``/``prefetch``.

  Args:
    data_config: data config (see ``default_config``).
    multicrop: multi-crop config (see ``default_multicrop_config``).
    batch_size: images per batch on this process.
    seed: non-negative int seeding shuffling and augmentation.
    process_index: index of this process, in [0, process_count).
    process_count: number of processes sharing the data.

  Returns:
    A ``grain.IterDataset``; ``iter()`` on it gives a ``grain.DatasetIterator``
    (supports ``get_state()``/``set_state()``) yielding dicts with "global":
    float32 [num_global, batch_size, global_size, global_size, C] and "local":
    float32 [num_local, batch_size, local_size, local_size, C] (zero-size if
    num_local is 0); view v of image b is at [v, b].

  Raises:
    DataError: the dataset is not prepared/readable, or the data or
    multi-crop config is invalid.
  """
  source = _open(data_config, data_config.train_split)
  height, width, channels = source.dataset_info.features["image"].shape
  m = _multicrop_settings(data_config, multicrop, channels)
  fixed_size = height is not None and width is not None
  return _shuffled_batches(
    data_config, source,
    functools.partial(_multicrop_batch, source=source, m=m, fixed_size=fixed_size),
    batch_size=batch_size, seed=seed, process_index=process_index,
    process_count=process_count)
