"""Image classification input pipelines: TFDS array_record data sources -> grain.

Typical use::

  images.prepare(cfg.data)                 # once; builds fashion_mnist_idx
  meta = images.info(cfg.data)             # ImageInfo(num_classes, image_shape, ...)
  it = iter(images.train_dataset(cfg.data, batch_size=128, seed=0))
  batch = next(it)                         # {"image": f32[B,H,W,C], "label": i32[B]}
  state = it.get_state()                   # checkpoint with the model; it.set_state(state)
  for batch in images.eval_batches(cfg.data, batch_size=500): ...  # + "mask"

The pipelines shuffle and batch example indices and fetch each batch with one
``__getitems__`` call (per-example array_record reads cost ~25x more). Augmentation
uses grain's per-batch ``np.random.Generator``, so the stream is deterministic under
the seed and resumable with ``get_state()``/``set_state()``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import threading
from collections.abc import Iterator
from typing import NamedTuple

import grain
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from ml_collections import config_dict

from laplax.data import common
from laplax.data.builders import fashion_mnist_idx as fmnist
from laplax.data.builders import fashion_mosaic
from laplax.data.errors import (
  DataError,  # Re-exported: images.DataError.
  corrupt_prepared,
)
from laplax.data.vision import augment
from laplax.data.vision.multicrop import (
  MultiCrop,
  default_multicrop_config,  # noqa: F401  (re-exported)
  multicrop_settings,
  multicrop_views,
)
from laplax.utils import first_line

EVAL_CROP_FRACTION = 0.875  # eval of variable-size images: crop 224 of 256, as usual
# The TFDS builders prepare() builds from the Fashion-MNIST IDX files.
LOCAL_BUILDERS = (fmnist.FashionMnistIdx.name, fashion_mosaic.FashionMosaic.name)


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
  """A data config with every key this module reads, for dataset ``name``.

  Keys: ``name``, ``data_dir``, ``source_dir`` (Fashion-MNIST IDX files),
  ``train_split``/``eval_split``, ``image_size`` (None: the stored size),
  ``crop_padding`` (pixels), ``flip``, ``mean``/``std`` (1 or C numbers; None: 0.5),
  ``num_threads``, ``prefetch``. The ``data`` section of the image configs.
  """
  imagenet = name.startswith("imagenet")
  return ml_collections.ConfigDict(
    {
      "name": name,
      "data_dir": "~/tensorflow_datasets",
      "source_dir": fmnist.DEFAULT_SOURCE_DIR,
      "train_split": "train",
      "eval_split": "validation" if imagenet else "test",
      "image_size": 224 if imagenet else config_dict.placeholder(int),
      "crop_padding": 2 if name.startswith("fashion_mnist") else 4,
      "flip": True,
      "mean": config_dict.placeholder(tuple),
      "std": config_dict.placeholder(tuple),
      "num_threads": 2,
      "prefetch": 4,
    }
  )


# --------------------------------------------------------------------------
# Preparing and opening datasets.


def prepare(data_config: ml_collections.ConfigDict) -> None:
  """Makes sure the dataset is prepared in ``data_config.data_dir``.

  Builds ``fashion_mnist_idx`` (~70 MB) and ``fashion_mosaic`` (~27 MB, about 15 s)
  from the IDX files in ``source_dir`` unless prepared; for other TFDS names only
  checks that both splits are readable.

  Raises:
    DataError: Fashion-MNIST source files missing or corrupt (checked before anything
      is written), or the dataset is not prepared.
  """
  if data_config.name.split("/")[0] not in LOCAL_BUILDERS:
    _open(data_config, data_config.train_split)
    _open(data_config, data_config.eval_split)
    return
  builder = tfds.builder(data_config.name, data_dir=common.data_dir(data_config))
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
  if name.split("/")[0] in LOCAL_BUILDERS:
    fix = "run laplax.data.vision.images.prepare(config) first"
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
    f"({first_line(error)}); the reader needs array_record format: {fix}."
  )


def _open(data_config, split: str):
  """Returns the TFDS data source of ``split``, or raises DataError."""
  name, data_dir = data_config.name, common.data_dir(data_config)
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
      f"({first_line(e)}); install one with `pip install pillow`."
    ) from e
  except Exception as e:  # array_record raises RuntimeError, OSError, ...
    raise corrupt_prepared(
      f"split {split!r} of {name!r} in {data_dir}", os.path.join(data_dir, name), e
    ) from e
  return source


# --------------------------------------------------------------------------
# Preprocessing (numpy only).


@dataclasses.dataclass(frozen=True)
class _Preprocess:
  """Static preprocessing settings derived from a data config."""

  image_size: int | None  # None: images keep their fixed stored size.
  fixed_size: bool  # all stored images have one size: crops are vectorised
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
  fixed_size = height is not None and width is not None
  scale, offset = _normalisation(data_config, channels)
  settings = _Preprocess(
    image_size=size,
    fixed_size=fixed_size,
    eval_crop=1.0 if fixed_size else EVAL_CROP_FRACTION,
    crop_padding=int(data_config.crop_padding),
    flip=bool(data_config.flip),
    scale=scale,
    offset=offset,
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


def _normalisation(data_config, channels: int) -> tuple[np.ndarray, np.ndarray]:
  """float32 [channels] (scale, offset) = (1 / (255 std), mean / std), or DataError."""
  mean, std = (_per_channel(data_config, key, channels) for key in ("mean", "std"))
  return (1.0 / (255.0 * std)).astype(np.float32), (mean / std).astype(np.float32)


def _normalise(images: np.ndarray, p: _Preprocess) -> np.ndarray:
  """[..., C] pixel values in [0, 255] -> float32 (x / 255 - mean) / std."""
  return images.astype(np.float32) * p.scale - p.offset


# Largest split :class:`DecodedCache` keeps, in bytes of decoded uint8 pixels.
CACHE_MAX_BYTES = 2 << 30


class DecodedCache:
  """The decoded images and labels of one split of fixed-size images, kept after the first read.

  TFDS decodes every example in Python holding the GIL (~20 ms per 256 Fashion-MNIST
  examples on a 2-core CPU, every epoch); the cache keeps the uint8 pixels (47 MB for
  Fashion-MNIST's training split, pages allocated as read). Batches are bit-equal with
  and without it. Thread-safe: an example decoded twice is written with the same
  bytes and marked present only after.
  """

  # Examples one background read decodes (in index order: array_record reads
  # consecutive records faster than a random batch).
  FILL_CHUNK = 2048

  def __init__(self, source, shape: tuple[int, int, int]):
    """``source``: a TFDS data source whose ``image`` feature is uint8 of the
    fixed ``shape`` (H, W, C)."""
    n = len(source)
    self.source = source
    self.dataset_info = source.dataset_info
    self._images = np.zeros((n,) + tuple(shape), np.uint8)
    self._labels = np.zeros(n, np.int32)
    self._have = np.zeros(n, bool)
    self._fill = None

  def __len__(self) -> int:
    return len(self._labels)

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [n, H, W, C] images, int32 [n] labels) of the examples ``indices``."""
    indices = np.asarray(indices, np.int64)
    self._decode(indices)
    return self._images[indices], self._labels[indices]

  def _decode(self, indices: np.ndarray) -> None:
    missing = np.unique(indices[~self._have[indices]])
    if missing.size:
      examples = self.source.__getitems__(missing.tolist())
      self._images[missing] = np.stack([e["image"] for e in examples])
      self._labels[missing] = [e["label"] for e in examples]
      self._have[missing] = True

  def start_fill(self, indices: np.ndarray) -> threading.Thread:
    """Decodes ``indices`` (int [n]) on a daemon thread, ascending, :data:`FILL_CHUNK` at a time.

    Once per cache (later calls return the first thread); reads decode what is still
    missing themselves; at exit the thread stops after its chunk.
    """
    if self._fill is None:
      order = np.unique(np.asarray(indices, np.int64))
      stop = threading.Event()

      def halt():  # at exit, before Python stops daemon threads inside a read
        stop.set()
        thread.join()

      def fill():
        try:
          for start in range(0, order.size, self.FILL_CHUNK):
            if stop.is_set():
              return
            self._decode(order[start : start + self.FILL_CHUNK])
        except Exception:
          return  # a bad example: the read that needs it raises the error
        finally:
          atexit.unregister(halt)  # done: nothing holds the cache any more

      thread = threading.Thread(target=fill, name="laplax-decode-fill", daemon=True)
      self._fill = thread
      atexit.register(halt)
      self._fill.start()
    return self._fill


def cached(source):
  """``source`` behind a :class:`DecodedCache` when its images have one fixed
  size and uint8 pixels and the split's pixels fit in :data:`CACHE_MAX_BYTES`;
  else ``source`` itself."""
  feature = source.dataset_info.features["image"]
  shape = feature.shape
  if (
    None in shape
    or np.dtype(feature.np_dtype) != np.uint8
    or len(source) * int(np.prod(shape)) > CACHE_MAX_BYTES
  ):
    return source
  return DecodedCache(source, shape)


def _read(source, indices: np.ndarray) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray]:
  """One batched read: (uint8 images, [n, h, w, C] from a :class:`DecodedCache`,
  else a list of [h, w, C]; int32 [n] labels)."""
  if isinstance(source, DecodedCache):
    return source.read(indices)
  examples = source.__getitems__(indices.tolist())
  labels = np.array([e["label"] for e in examples], dtype=np.int32)
  return [e["image"] for e in examples], labels


def _train_batch(indices: np.ndarray, rng, *, source, p: _Preprocess):
  images, labels = _read(source, indices)
  if p.image_size:
    images = augment.random_resized_crops(
      images, rng, p.image_size, fixed_size=p.fixed_size, flip=p.flip
    )
  else:
    images = augment.random_crop(np.stack(images), p.crop_padding, rng)
    if p.flip:
      images = augment.random_flip(images, rng)
  return {"image": _normalise(images, p), "label": labels}


def _eval_batch(indices: np.ndarray, *, source, p: _Preprocess, batch_size: int):
  images, labels = _read(source, indices)
  if p.image_size:
    images = augment.center_crops(images, p.image_size, p.eval_crop, fixed_size=p.fixed_size)
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


def _shuffled_batches(
  data_config,
  source,
  make_batch,
  *,
  batch_size: int,
  seed: int,
  process_index: int,
  process_count: int,
) -> grain.IterDataset:
  """This process's shard of ``source`` indices, shuffled per epoch, batched, and
  turned into batches by ``make_batch(indices, rng)`` (grain ``random_map``)."""
  ds = grain.MapDataset.range(len(source))[process_index::process_count]
  if isinstance(source, DecodedCache):  # this process's shard, decoded ahead
    source.start_fill(np.arange(len(source))[process_index::process_count])
  ds = ds.seed(seed).shuffle().repeat().batch(batch_size, drop_remainder=True)
  return ds.random_map(make_batch).to_iter_dataset(common.read_options(data_config))


def train_dataset(
  data_config: ml_collections.ConfigDict,
  *,
  batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.IterDataset:
  """Infinite, shuffled, augmented training batches of this process's shard.

  Process ``process_index`` reads examples ``process_index::process_count``,
  reshuffled every epoch. Fixed-size images: random crop of the image zero-padded by
  ``crop_padding``; otherwise an Inception random-resized crop to ``image_size``
  (:func:`laplax.data.vision.augment.random_resized_crops`); then a flip with
  probability 0.5 if ``flip``. Deterministic in (dataset, shard, batch_size, seed,
  settings), independent of ``num_threads``/``prefetch``.

  Returns:
    A ``grain.IterDataset`` whose iterator (``get_state()``/``set_state()``) yields
    ``{"image": float32 [batch_size, H, W, C] as (x/255 - mean)/std, "label": int32
    [batch_size]}``.

  Raises:
    DataError: the dataset is not prepared/readable or misconfigured.
  """
  source = cached(_open(data_config, data_config.train_split))
  p, _ = _preprocess_settings(data_config, source.dataset_info.features)
  return _shuffled_batches(
    data_config,
    source,
    functools.partial(_train_batch, source=source, p=p),
    batch_size=batch_size,
    seed=seed,
    process_index=process_index,
    process_count=process_count,
  )


def eval_batches(
  data_config: ml_collections.ConfigDict,
  *,
  batch_size: int,
  split: str | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Every example of the eval split exactly once, in order, without augmentation.

  Resized to ``image_size`` when it differs from the stored size
  (:func:`laplax.data.vision.augment.center_crops`): whole fixed-size images (their
  central square), variable-size ones after a central crop of
  ``EVAL_CROP_FRACTION`` of the short side.

  Returns:
    An iterator of dicts, ``"image"`` float32 [batch_size, H, W, C], ``"label"``
    int32 [batch_size] and ``"mask"`` float32 [batch_size] (1 real, 0 padding); the
    last batch is zero-padded, and ``batch_size`` is cut to the split's size.

  Raises:
    DataError: the dataset is not prepared/readable or misconfigured.
  """
  source = _open(data_config, split or data_config.eval_split)
  p, _ = _preprocess_settings(data_config, source.dataset_info.features)
  batch_size = max(min(batch_size, len(source)), 1)  # more would only pad
  ds = grain.MapDataset.range(len(source)).batch(batch_size)
  ds = ds.map(functools.partial(_eval_batch, source=source, p=p, batch_size=batch_size))
  return iter(ds.to_iter_dataset(common.read_options(data_config)))


# --------------------------------------------------------------------------
# Multi-crop (DINO).


def _multicrop_settings(data_config, multicrop, channels: int) -> MultiCrop:
  """``multicrop_settings`` with the data config's normalisation; raises DataError."""
  return multicrop_settings(multicrop, *_normalisation(data_config, channels))


def _multicrop_batch(indices: np.ndarray, rng, *, source, m: MultiCrop, fixed_size: bool):
  images, _ = _read(source, indices)
  return {
    "global": multicrop_views(images, rng, m, fixed_size, local=False),
    "local": multicrop_views(images, rng, m, fixed_size, local=True),
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

  Sharded, shuffled and batched as :func:`train_dataset`. The views and their recipe
  (Caron et al. 2021, arXiv:2104.14294; BYOL's photometric recipe, arXiv:2006.07733)
  are :mod:`laplax.data.vision.multicrop`'s; the data config's ``image_size``,
  ``crop_padding`` and ``flip`` are not used. Deterministic as :func:`train_dataset`.

  Args:
    data_config: data config; multicrop: see ``default_multicrop_config``.
    batch_size: images per batch on this process; seed: non-negative int.
    process_index, process_count: this process among those sharing the data.

  Returns:
    A ``grain.IterDataset`` yielding dicts, ``"global"`` float32 [num_global,
    batch_size, global_size, global_size, C] and ``"local"`` float32 [num_local,
    batch_size, local_size, local_size, C] (zero-size without local views); view v
    of image b at [v, b].

  Raises:
    DataError: the dataset is not prepared/readable, or a config is invalid.
  """
  source = cached(_open(data_config, data_config.train_split))
  height, width, channels = source.dataset_info.features["image"].shape
  m = _multicrop_settings(data_config, multicrop, channels)
  fixed_size = height is not None and width is not None
  return _shuffled_batches(
    data_config,
    source,
    functools.partial(_multicrop_batch, source=source, m=m, fixed_size=fixed_size),
    batch_size=batch_size,
    seed=seed,
    process_index=process_index,
    process_count=process_count,
  )
