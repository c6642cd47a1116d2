"""Image classification input pipelines: TFDS array_record data sources -> grain.

Typical use::

  images.prepare(cfg.data)                 # once; builds fashion_mnist_idx
  meta = images.info(cfg.data)             # ImageInfo(num_classes, image_shape, ...)
  it = iter(images.train_dataset(cfg.data, batch_size=128, seed=0))
  batch = next(it)                         # {"image": f32[B,H,W,C], "label": i32[B]}
  state = it.get_state()                   # checkpoint with the model; it.set_state(state)
  for batch in images.eval_batches(cfg.data, batch_size=500): ...  # + "mask"

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
  except ImportError as e:
    raise DataError(
      f"Decoding the encoded images of {name!r} needs Pillow or OpenCV "
      f"({_one_line(e)}); install one with `pip install pillow`."
    ) from e
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
  ds = grain.MapDataset.range(len(source))[process_index::process_count]
  ds = ds.seed(seed).shuffle().repeat().batch(batch_size, drop_remainder=True)
  ds = ds.random_map(functools.partial(_train_batch, source=source, p=p))
  return ds.to_iter_dataset(_read_options(data_config))


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
