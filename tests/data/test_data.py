"""Tests of laplax.data: the Fashion-MNIST IDX builder and the grain pipelines."""

import gzip
import os
import shutil
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.testing import mocking

from laplax.data.builders import fashion_mnist_idx as fmnist
from laplax.data.vision import augment, images

from helpers.batches import assert_batches_equal, bilinear_resize, take

SOURCE_DIR = fmnist.DEFAULT_SOURCE_DIR
needs_source = pytest.mark.skipif(
  not os.path.isdir(SOURCE_DIR),
  reason=f"Fashion-MNIST IDX files not in {SOURCE_DIR} "
  "(sudo apt-get install -y dataset-fashion-mnist)",
)


def read_idx(prefix, kind):
  """The raw IDX payload, read independently of the builder."""
  offset, shape = {"images-idx3": (16, (-1, 28, 28, 1)), "labels-idx1": (8, (-1,))}[kind]
  with gzip.open(os.path.join(SOURCE_DIR, f"{prefix}-{kind}-ubyte.gz"), "rb") as f:
    return np.frombuffer(f.read()[offset:], np.uint8).reshape(shape)


def unnormalise(x):
  """Inverts the default (x / 255 - 0.5) / 0.5 normalisation."""
  return np.round((x * 0.5 + 0.5) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def idx():
  return {
    split: (read_idx(prefix, "images-idx3"), read_idx(prefix, "labels-idx1"))
    for split, prefix in (("train", "train"), ("test", "t10k"))
  }


@pytest.fixture
def fm_config(fmnist_data_dir):  # Prepared once per session in conftest.py.
  config = images.default_config()
  config.data_dir = fmnist_data_dir
  return config


@pytest.fixture
def mock_cifar10(monkeypatch):
  # tfds 4.9.10's mock assigns `__getitems__` to a MagicMock as a plain
  # attribute, so its `_getitems(self, record_keys, ...)` is called without
  # `self` and fails; swap in a version without `self`.
  monkeypatch.setattr(
    mocking,
    "_getitems",
    lambda record_keys, generator, serialized=False: [generator[k] for k in record_keys],
  )
  config = images.default_config("cifar10")
  config.data_dir = "/nonexistent/tfds"  # mock_data ignores it
  with tfds.testing.mock_data(num_examples=10):
    yield config


# ------------------------------------------------------------------ builder


@needs_source
def test_prepared_dataset_matches_idx_files(fm_config, idx):
  meta = images.info(fm_config)
  assert meta == images.ImageInfo(
    num_classes=10, image_shape=(28, 28, 1), num_train=60_000, num_eval=10_000
  )
  with gzip.open(os.path.join(SOURCE_DIR, "train-labels-idx1-ubyte.gz")) as f:
    first_label = f.read(9)[8]
  with gzip.open(os.path.join(SOURCE_DIR, "train-images-idx3-ubyte.gz")) as f:
    first_image = f.read(16 + 784)[16:]
  sources = tfds.data_source("fashion_mnist_idx", data_dir=fm_config.data_dir, download=False)
  train, test = sources["train"], sources["test"]
  assert train[0]["label"] == first_label
  assert train[0]["image"].dtype == np.uint8 and train[0]["image"].shape == (28, 28, 1)
  assert train[0]["image"].tobytes() == first_image
  for source, (x, y) in ((train, idx["train"]), (test, idx["test"])):
    for i in (1, 12_345 % len(source), len(source) - 1):
      np.testing.assert_array_equal(source[i]["image"], x[i])
      assert source[i]["label"] == y[i]
  assert train.dataset_info.features["label"].names[0] == "t-shirt_top"
  images.prepare(fm_config)  # Already prepared: a no-op.


def test_missing_source_dir_raises_before_touching_data_dir(tmp_path):
  config = images.default_config()
  config.source_dir = str(tmp_path / "no-such-dir")
  config.data_dir = str(tmp_path / "tfds")
  with pytest.raises(images.DataError) as error:
    images.prepare(config)
  message = str(error.value)
  assert "apt-get install -y dataset-fashion-mnist" in message
  assert config.source_dir in message and "--config.data.source_dir" in message
  assert "\n" not in message
  assert not os.path.exists(config.data_dir)


@needs_source
@pytest.mark.parametrize(
  "corrupt, problem",
  [
    (lambda raw: b"\x00\x00\x08\x03" + raw[4:], "magic"),  # images magic on labels
    (lambda raw: raw[:4] + (59_999).to_bytes(4, "big") + raw[8:], "dimensions"),
    (lambda raw: b"not gzip", "gzip"),
  ],
)
def test_corrupt_idx_file_raises_naming_it(tmp_path, corrupt, problem):
  source_dir = tmp_path / "source"
  shutil.copytree(SOURCE_DIR, source_dir)
  bad = source_dir / "train-labels-idx1-ubyte.gz"
  with gzip.open(bad) as f:
    raw = f.read()
  data = corrupt(raw)
  bad.write_bytes(data if problem == "gzip" else gzip.compress(data))
  data_dir = tmp_path / "tfds"
  data_dir.mkdir()
  config = images.default_config()
  config.source_dir, config.data_dir = str(source_dir), str(data_dir)
  with pytest.raises(images.DataError, match=problem) as error:
    images.prepare(config)
  assert str(bad) in str(error.value) and "\n" not in str(error.value)
  assert list(data_dir.iterdir()) == []


def test_unprepared_tfds_dataset_raises(tmp_path):
  config = images.default_config("cifar10")
  config.data_dir = str(tmp_path)
  with pytest.raises(images.DataError, match="internet") as error:
    images.prepare(config)
  assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)
  config = images.default_config()
  config.data_dir = str(tmp_path)
  with pytest.raises(images.DataError, match="prepare"):
    images.info(config)


# ---------------------------------------------------------------- pipelines


@needs_source
def test_train_batches_shapes_dtypes_and_range(fm_config):
  batch = next(iter(images.train_dataset(fm_config, batch_size=64, seed=0)))
  assert batch.keys() == {"image", "label"}
  assert batch["image"].shape == (64, 28, 28, 1) and batch["image"].dtype == np.float32
  assert batch["label"].shape == (64,) and batch["label"].dtype == np.int32
  assert batch["image"].min() >= -1.0 and batch["image"].max() <= 1.0
  assert batch["image"].min() == -1.0 and batch["image"].max() > 0.9
  assert 0 <= batch["label"].min() and batch["label"].max() < 10


@pytest.mark.slow
@needs_source
def test_train_is_deterministic_under_seed(fm_config):
  def batches(seed, num_threads):
    fm_config.num_threads = num_threads
    return take(iter(images.train_dataset(fm_config, batch_size=32, seed=seed)), 3)

  first = batches(0, num_threads=2)
  assert_batches_equal(first, batches(0, num_threads=1))
  other = batches(1, num_threads=2)
  assert not np.array_equal(first[0]["image"], other[0]["image"])


@pytest.mark.slow
@needs_source
def test_train_resumes_exactly_from_state(fm_config):
  dataset = images.train_dataset(fm_config, batch_size=32, seed=3)
  iterator = iter(dataset)
  take(iterator, 5)
  state = iterator.get_state()
  expected = take(iterator, 4)
  resumed = iter(images.train_dataset(fm_config, batch_size=32, seed=3))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 4), expected)


class CountingSource:
  """A TFDS data source that counts the examples read through ``__getitems__``."""

  def __init__(self, source):
    self.source, self.dataset_info, self.reads = source, source.dataset_info, 0

  def __len__(self):
    return len(self.source)

  def __getitems__(self, keys):
    self.reads += len(keys)
    return self.source.__getitems__(keys)


@needs_source
def test_decoded_cache_gives_the_idx_values_and_decodes_each_example_once(fm_config, idx):
  counting = CountingSource(images._open(fm_config, "train"))
  cache = images.cached(counting)
  assert isinstance(cache, images.DecodedCache) and len(cache) == 60000
  first = np.array([59999, 7, 7, 0, 123])
  pixels, labels = cache.read(first)
  np.testing.assert_array_equal(pixels, idx["train"][0][first])
  np.testing.assert_array_equal(labels, idx["train"][1][first])
  assert pixels.dtype == np.uint8 and labels.dtype == np.int32
  assert counting.reads == 4  # 7 twice in one batch: decoded once
  pixels, labels = cache.read(np.array([123, 8, 0]))
  assert counting.reads == 5  # only 8 is new
  np.testing.assert_array_equal(pixels, idx["train"][0][[123, 8, 0]])
  np.testing.assert_array_equal(labels, idx["train"][1][[123, 8, 0]])


@needs_source
def test_decoded_cache_fill_decodes_the_shard_in_the_background(fm_config, idx):
  counting = CountingSource(images._open(fm_config, "test"))
  cache = images.cached(counting)
  shard = np.arange(10000)[1::3]  # process 1 of 3
  thread = cache.start_fill(shard[::-1])  # any order: decoded ascending
  assert cache.start_fill(np.arange(5)) is thread  # once per cache
  thread.join(timeout=60)
  assert not thread.is_alive()
  assert counting.reads == shard.size  # each example of the shard once
  pixels, labels = cache.read(shard[[0, 100, -1]])
  assert counting.reads == shard.size  # read from memory
  np.testing.assert_array_equal(pixels, idx["test"][0][shard[[0, 100, -1]]])
  np.testing.assert_array_equal(labels, idx["test"][1][shard[[0, 100, -1]]])
  cache.read(np.array([0]))  # not in the shard: decoded on demand
  assert counting.reads == shard.size + 1


def test_decoded_cache_fill_leaves_a_bad_example_to_the_read_that_needs_it():
  class Broken:
    dataset_info = None

    def __len__(self):
      return 10

    def __getitems__(self, keys):
      raise OSError("record 3 is corrupt")

  cache = images.DecodedCache(Broken(), (2, 2, 1))
  thread = cache.start_fill(np.arange(10))
  thread.join(timeout=60)
  assert not thread.is_alive()  # ended quietly
  with pytest.raises(OSError, match="record 3 is corrupt"):
    cache.read(np.array([3]))


@needs_source
def test_decoded_cache_only_for_fixed_size_uint8_splits_that_fit(fm_config, monkeypatch):
  source = images._open(fm_config, "test")
  assert isinstance(images.cached(source), images.DecodedCache)
  monkeypatch.setattr(images, "CACHE_MAX_BYTES", 10000 * 28 * 28 - 1)
  assert images.cached(source) is source  # one byte over the limit
  monkeypatch.undo()
  for shape, dtype in (((None, None, 3), np.uint8), ((28, 28, 1), np.float32)):
    feature = types.SimpleNamespace(shape=shape, np_dtype=dtype)
    other = types.SimpleNamespace(dataset_info=types.SimpleNamespace(features={"image": feature}))
    assert images.cached(other) is other


@pytest.mark.slow
@needs_source
def test_train_and_multicrop_batches_equal_with_and_without_the_cache(fm_config, monkeypatch):
  # 1000 x 61 batches: the second epoch starts inside the run and reads cached examples.
  cached = take(iter(images.train_dataset(fm_config, batch_size=1000, seed=5)), 61)
  views = take(
    iter(
      images.multicrop_train_dataset(
        fm_config, images.default_multicrop_config(fm_config.name), batch_size=64, seed=2
      )
    ),
    2,
  )
  monkeypatch.setattr(images, "cached", lambda source: source)
  assert_batches_equal(
    cached[-2:], take(iter(images.train_dataset(fm_config, batch_size=1000, seed=5)), 61)[-2:]
  )
  assert_batches_equal(
    views,
    take(
      iter(
        images.multicrop_train_dataset(
          fm_config, images.default_multicrop_config(fm_config.name), batch_size=64, seed=2
        )
      ),
      2,
    ),
  )


@pytest.mark.slow
@needs_source
def test_without_augmentation_train_yields_shuffled_shard_of_source(fm_config, idx):
  x, y = idx["train"]
  where = {}
  for i, image in enumerate(x):  # Fashion-MNIST has a few duplicate images.
    where.setdefault(image.tobytes(), []).append(i)
  fm_config.crop_padding, fm_config.flip = 0, False
  for process_index in (0, 1):
    dataset = images.train_dataset(
      fm_config, batch_size=256, seed=0, process_index=process_index, process_count=2
    )
    seen = []
    for batch in take(iter(dataset), 4):
      for image, label in zip(unnormalise(batch["image"]), batch["label"]):
        candidates = [i for i in where[image.tobytes()] if i % 2 == process_index]
        assert any(y[i] == label for i in candidates)
        seen.append(candidates[0])
    assert len(set(seen)) == len(seen) == 1024
    assert seen[:256] != sorted(seen[:256])


def test_random_crop_flip_takes_windows_of_the_padded_image():
  rng = np.random.default_rng(0)
  batch = rng.integers(1, 256, size=(16, 8, 8, 2), dtype=np.uint8)
  out = augment.random_flip(augment.random_crop(batch, 2, rng), rng)
  assert out.shape == batch.shape and out.dtype == batch.dtype
  padded = np.pad(batch, ((0, 0), (2, 2), (2, 2), (0, 0)))
  windows = (
    lambda i: [  # noqa: E731
      w[:, ::-1] if flip else w
      for dy in range(5)
      for dx in range(5)
      for w in [padded[i, dy : dy + 8, dx : dx + 8]]
      for flip in (False, True)
    ]
  )
  assert all(any(np.array_equal(out[i], w) for w in windows(i)) for i in range(16))
  assert any(not np.array_equal(out[i], batch[i]) for i in range(16))


@pytest.mark.slow
@needs_source
def test_eval_batches_cover_every_example_once_in_order(fm_config, idx):
  x, y = idx["test"]
  batches = list(images.eval_batches(fm_config, batch_size=512))
  assert len(batches) == 20  # 19 full + 272 real examples in the last one.
  for batch in batches:
    assert batch["image"].shape == (512, 28, 28, 1) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32 and batch["mask"].dtype == np.float32
  mask = np.concatenate([b["mask"] for b in batches])
  np.testing.assert_array_equal(mask, np.arange(20 * 512) < 10_000)
  real = mask.astype(bool)
  image = np.concatenate([b["image"] for b in batches])[real]
  np.testing.assert_array_equal(unnormalise(image), x)
  np.testing.assert_allclose(image, x / 255.0 * 2 - 1, atol=1e-6)
  np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches])[real], y)
  np.testing.assert_array_equal(batches[-1]["image"][272:], 0)


# ------------------------------------------------------- cifar10 via mocks


def test_cifar10_train_and_eval_through_mock(mock_cifar10):
  config = mock_cifar10
  assert images.info(config) == images.ImageInfo(10, (32, 32, 3), 10, 10)
  source = tfds.data_source("cifar10", split="test")
  batch = next(iter(images.train_dataset(config, batch_size=4, seed=0)))
  assert batch["image"].shape == (4, 32, 32, 3) and batch["image"].dtype == np.float32
  assert batch["label"].shape == (4,) and batch["label"].dtype == np.int32

  batches = list(images.eval_batches(config, batch_size=4))
  np.testing.assert_array_equal([b["mask"].tolist() for b in batches][-1], [1, 1, 0, 0])
  assert all(b["image"].shape == (4, 32, 32, 3) for b in batches)
  labels = np.concatenate([b["label"] for b in batches])[:10]
  np.testing.assert_array_equal(labels, [source[i]["label"] for i in range(10)])

  config.crop_padding, config.flip = 0, False
  # Each epoch (2 batches of 5) without augmentation is a new permutation of the source.
  train = tfds.data_source("cifar10", split="train")
  expected = sorted(train[i]["image"].tobytes() for i in range(10))
  batches = take(iter(images.train_dataset(config, batch_size=5, seed=0)), 4)
  epochs = [
    [unnormalise(x).tobytes() for b in batches[e : e + 2] for x in b["image"]] for e in (0, 2)
  ]
  assert sorted(epochs[0]) == sorted(epochs[1]) == expected
  assert epochs[0] != epochs[1]

  # Resuming mid-epoch, with batches that straddle epochs, repeats exactly.
  config.crop_padding, config.flip = 4, True
  iterator = iter(images.train_dataset(config, batch_size=3, seed=1))
  take(iterator, 5)
  state, expected = iterator.get_state(), take(iterator, 5)
  resumed = iter(images.train_dataset(config, batch_size=3, seed=1))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 5), expected)


def test_per_channel_normalisation(mock_cifar10):
  config = mock_cifar10
  config.mean, config.std = (0.1, 0.2, 0.3), (0.5, 0.25, 0.2)
  batch = next(images.eval_batches(config, batch_size=2))
  source = tfds.data_source("cifar10", split="test")
  expected = (source[0]["image"] / 255.0 - np.array(config.mean)) / np.array(config.std)
  np.testing.assert_allclose(batch["image"][0], expected, rtol=1e-5, atol=1e-5)
  config.std = (0.5, 0.5)
  with pytest.raises(images.DataError, match="std"):
    images.info(config)


def test_cifar10_resized_through_mock(mock_cifar10):
  config = mock_cifar10
  config.image_size = 40
  assert images.info(config).image_shape == (40, 40, 3)
  batch = next(iter(images.train_dataset(config, batch_size=4, seed=0)))
  assert batch["image"].shape == (4, 40, 40, 3) and batch["image"].dtype == np.float32
  assert -1.0 <= batch["image"].min() and batch["image"].max() <= 1.0
  batch = next(images.eval_batches(config, batch_size=4))
  assert batch["image"].shape == (4, 40, 40, 3)
  # Fixed-size (32 px) images are resized whole for eval, not centre-cropped.
  image = tfds.data_source("cifar10", split="test")[0]["image"]
  expected = bilinear_resize(image, 40, 40) / 127.5 - 1
  np.testing.assert_allclose(batch["image"][0], expected, atol=1e-5)


def test_resize_crops_handle_any_image_size():
  rng = np.random.default_rng(0)
  for shape in ((50, 70, 3), (17, 9, 3), (1, 1, 3)):
    image = rng.integers(0, 256, size=shape).astype(np.uint8)
    out = augment.random_resized_crops([image], rng, 24, fixed_size=False, flip=True)[0]
    assert out.shape == (24, 24, 3) and out.dtype == np.float32
    assert image.min() <= out.min() and out.max() <= image.max()
    assert augment.center_crops([image], 24, 0.875, fixed_size=False)[0].shape == (24, 24, 3)
  constant = np.full((33, 45, 3), 7, np.uint8)
  np.testing.assert_allclose(augment.center_crops([constant], 16, 0.875, fixed_size=True), 7)
  ramp = np.arange(8, dtype=np.float32)[None, :, None] * np.ones((8, 1, 1))
  np.testing.assert_allclose(augment.center_crops([ramp], 8, 1.0, fixed_size=True)[0], ramp)
  np.testing.assert_allclose(bilinear_resize(ramp, 8, 8), ramp)


def test_center_crops_resize_the_central_square_like_the_reference():
  rng = np.random.default_rng(1)
  image = rng.integers(0, 256, size=(12, 20, 2)).astype(np.uint8)
  # The central 12 x 12 square (columns 4..15) resized to 7 x 7, vectorised or not.
  expected = bilinear_resize(image[:, 4:16], 7, 7)
  for fixed_size in (True, False):
    out = augment.center_crops([image, image], 7, 1.0, fixed_size=fixed_size)
    assert out.shape == (2, 7, 7, 2) and out.flags.c_contiguous
    np.testing.assert_allclose(out[1], expected, atol=1e-4)
