"""Tests of the DINO multi-crop pipeline (laplax.data.vision.images, .multicrop, .augment)."""

import colorsys
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.testing import mocking

from laplax.data.vision import augment, images
from laplax.data.vision import multicrop as multicrop_lib

from helpers.batches import assert_batches_equal, bilinear_resize, take


def pixels(x):
  """Inverts the default (x / 255 - 0.5) / 0.5 normalisation (no rounding)."""
  return (x * 0.5 + 0.5) * 255


@pytest.fixture
def fm_config(fmnist_data_dir):  # Prepared once per session in conftest.py.
  config = images.default_config()
  config.data_dir = fmnist_data_dir
  return config


@pytest.fixture
def geometric_only():
  """Multi-crop config with every photometric augmentation off."""
  multicrop = images.default_multicrop_config()
  multicrop.jitter_prob = 0.0
  multicrop.grayscale_prob = 0.0
  multicrop.blur_prob = (0.0, 0.0, 0.0)
  multicrop.solarize_prob = 0.0
  return multicrop


def settings(channels=1, **overrides):
  multicrop = images.default_multicrop_config()
  multicrop.update(overrides)
  return images._multicrop_settings(images.default_config(), multicrop, channels)


# ------------------------------------------------------------------ config


def test_default_multicrop_configs():
  fm = images.default_multicrop_config()
  assert (fm.num_global, fm.num_local, fm.global_size, fm.local_size) == (2, 6, 28, 14)
  assert fm.blur_sigma == (0.1, 1.0)
  inet = images.default_multicrop_config("imagenet2012")
  assert (inet.num_global, inet.num_local, inet.global_size, inet.local_size) == (2, 10, 224, 96)
  assert inet.blur_sigma == (0.1, 2.0)
  for c in (fm, inet):
    assert c.global_scale == (0.4, 1.0) and c.local_scale == (0.05, 0.4) and c.flip
    jitter = (c.jitter_prob, c.brightness, c.contrast, c.saturation, c.hue)
    assert jitter == (0.8, 0.4, 0.4, 0.2, 0.1)
    assert c.grayscale_prob == 0.2 and c.blur_prob == (1.0, 0.1, 0.5)
    assert c.solarize_prob == 0.2 and c.solarize_threshold == 128


@pytest.mark.parametrize(
  "key, value",
  [
    ("num_global", 0),
    ("num_local", -1),
    ("local_scale", (0.4, 0.05)),
    ("global_scale", (0.4, 1.2)),
    ("blur_prob", (1.0, 0.1)),
    ("blur_sigma", (-0.1, 1.0)),
    ("blur_sigma", (1.0, 0.5)),
    ("jitter_prob", 1.5),
    ("hue", 0.7),
    ("brightness", -0.1),
  ],
)
def test_bad_multicrop_values_raise_naming_the_key(key, value):
  multicrop = images.default_multicrop_config()
  multicrop[key] = value
  with pytest.raises(images.DataError, match=key) as error:
    images._multicrop_settings(images.default_config(), multicrop, 1)
  assert "\n" not in str(error.value)
  del multicrop[key]
  with pytest.raises(images.DataError, match=f"lacks {key}"):
    images._multicrop_settings(images.default_config(), multicrop, 1)


def test_check_multicrop_names_the_key_in_config_terms():
  multicrop = images.default_multicrop_config()
  multicrop_lib.check_multicrop(multicrop)
  multicrop_lib.check_multicrop(multicrop, patch_size=7)  # 28 and 14 px views
  with pytest.raises(
    images.DataError,
    match=re.escape(
      "config.data.multicrop.local_size=14 is not divisible by config.model.patch_size=4"
    ),
  ):
    multicrop_lib.check_multicrop(multicrop, patch_size=4)
  cases = [
    (
      "global_scale",
      (0.0, 1.0),
      "config.data.multicrop.global_scale=(0.0, 1.0) must be two "
      "numbers (low, high) with 1e-06 <= low <= high <= 1.0",
    ),
    ("hue", 0.7, "config.data.multicrop.hue=0.7 must be a finite number >= 0.0 and <= 0.5"),
    ("num_global", True, "config.data.multicrop.num_global=True must be an integer >= 1"),
    ("num_local", 0.5, "config.data.multicrop.num_local=0.5 must be an integer >= 0"),
    ("flip", 1, "config.data.multicrop.flip=1 must be True or False"),
    ("solarize_threshold", float("nan"), "config.data.multicrop.solarize_threshold=nan must be"),
  ]
  for key, value, message in cases:
    bad = images.default_multicrop_config().to_dict()  # A dict: any value type.
    bad[key] = value
    with pytest.raises(images.DataError, match="^" + re.escape(message)):
      multicrop_lib.check_multicrop(bad)
  bad = images.default_multicrop_config()
  bad.num_global, bad.num_local = 1, 0
  with pytest.raises(images.DataError, match="1 global and 0 local crops; DINO needs at least 2"):
    multicrop_lib.check_multicrop(bad)


# ---------------------------------------------------------------- pipeline


@pytest.mark.slow
def test_multicrop_batches_shapes_dtypes_and_range(fm_config):
  multicrop = images.default_multicrop_config()
  batch = next(iter(images.multicrop_train_dataset(fm_config, multicrop, batch_size=16, seed=0)))
  assert batch.keys() == {"global", "local"}
  assert batch["global"].shape == (2, 16, 28, 28, 1) and batch["global"].dtype == np.float32
  assert batch["local"].shape == (6, 16, 14, 14, 1) and batch["local"].dtype == np.float32
  for views in batch.values():
    assert views.flags.c_contiguous
    assert -1 - 1e-5 <= views.min() and views.max() <= 1 + 1e-5
    assert views.max() > 0.5  # Real images, not zeros.
  # Every view of an image is a different crop.
  assert all(not np.allclose(batch["global"][0, i], batch["global"][1, i]) for i in range(16))
  assert all(not np.allclose(batch["local"][0, i], batch["local"][1, i]) for i in range(16))


@pytest.mark.slow
def test_multicrop_is_deterministic_under_seed(fm_config):
  multicrop = images.default_multicrop_config()

  def batches(seed, num_threads):
    fm_config.num_threads = num_threads
    dataset = images.multicrop_train_dataset(fm_config, multicrop, batch_size=8, seed=seed)
    return take(iter(dataset), 3)

  first = batches(0, num_threads=2)
  assert_batches_equal(first, batches(0, num_threads=1))
  other = batches(1, num_threads=2)
  assert not np.array_equal(first[0]["global"], other[0]["global"])
  assert not np.array_equal(first[0]["local"], other[0]["local"])


def test_multicrop_resumes_exactly_from_state(fm_config):
  multicrop = images.default_multicrop_config()
  iterator = iter(images.multicrop_train_dataset(fm_config, multicrop, batch_size=8, seed=3))
  take(iterator, 4)
  state = iterator.get_state()
  expected = take(iterator, 3)
  resumed = iter(images.multicrop_train_dataset(fm_config, multicrop, batch_size=8, seed=3))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 3), expected)


def test_multicrop_without_local_views(fm_config):
  multicrop = images.default_multicrop_config()
  multicrop.num_local = 0
  batch = next(iter(images.multicrop_train_dataset(fm_config, multicrop, batch_size=4, seed=0)))
  assert batch["global"].shape == (2, 4, 28, 28, 1)
  assert batch["local"].shape == (0, 4, 14, 14, 1) and batch["local"].dtype == np.float32


def test_solarisation_only_on_second_global_view(fm_config, geometric_only):
  def first_batch(solarize_prob):
    geometric_only.solarize_prob = solarize_prob
    dataset = images.multicrop_train_dataset(fm_config, geometric_only, batch_size=8, seed=5)
    return next(iter(dataset))

  plain, solarised = first_batch(0.0), first_batch(1.0)
  # The same crops are drawn whatever the probabilities.
  np.testing.assert_array_equal(solarised["global"][0], plain["global"][0])
  np.testing.assert_array_equal(solarised["local"], plain["local"])
  second = pixels(plain["global"][1])
  expected = np.where(second >= 128, 255 - second, second)
  clear = np.abs(second - 128) > 1e-2  # Round-trip error can move 128 across the threshold.
  np.testing.assert_allclose(pixels(solarised["global"][1])[clear], expected[clear], atol=1e-3)
  assert pixels(solarised["global"][1]).max() < 128 < pixels(plain["global"][1]).max()


@pytest.mark.slow
def test_blur_probability_per_view(fm_config, geometric_only):
  geometric_only.blur_sigma = (0.5, 1.0)  # Sigma 0.1 leaves images unchanged in float32.

  def first_batch(blur_prob):
    geometric_only.blur_prob = blur_prob
    dataset = images.multicrop_train_dataset(fm_config, geometric_only, batch_size=8, seed=2)
    return next(iter(dataset))

  sharp = first_batch((0.0, 0.0, 0.0))
  for which, blur_prob in enumerate(((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))):
    blurred = first_batch(blur_prob)
    views = [blurred["global"][0], blurred["global"][1], blurred["local"]]
    originals = [sharp["global"][0], sharp["global"][1], sharp["local"]]
    for i, (view, original) in enumerate(zip(views, originals)):
      if i == which:  # Blurring smooths: less total variation, every image changed.
        assert all(not np.array_equal(a, b) for a, b in zip(view, original))
        assert np.abs(np.diff(view, axis=-2)).sum() < np.abs(np.diff(original, axis=-2)).sum()
      else:
        np.testing.assert_array_equal(view, original)


@pytest.mark.slow
def test_rgb_multicrop_through_mock(monkeypatch):
  # As in test_data.py: tfds 4.9.10's mock calls its `_getitems` without `self`.
  monkeypatch.setattr(
    mocking,
    "_getitems",
    lambda record_keys, generator, serialized=False: [generator[k] for k in record_keys],
  )
  config = images.default_config("cifar10")
  config.data_dir = "/nonexistent/tfds"  # mock_data ignores it
  multicrop = images.default_multicrop_config("cifar10")
  multicrop.jitter_prob = multicrop.grayscale_prob = 1.0
  with tfds.testing.mock_data(num_examples=10):
    batch = next(iter(images.multicrop_train_dataset(config, multicrop, batch_size=4, seed=0)))
  assert batch["global"].shape == (2, 4, 28, 28, 3) and batch["local"].shape == (6, 4, 14, 14, 3)
  for views in batch.values():
    assert views.dtype == np.float32 and -1 - 1e-5 <= views.min() and views.max() <= 1 + 1e-5
    np.testing.assert_allclose(views[..., 0], views[..., 2], atol=1e-5)  # All grey.


class _FakeSource:
  """Stands in for a TFDS data source: __getitems__ on a list of images."""

  def __init__(self, pictures):
    self.pictures = pictures

  def __getitems__(self, keys):
    return [{"image": self.pictures[k], "label": 0} for k in keys]


def test_variable_size_path_matches_fixed_size_path():
  rng = np.random.default_rng(0)
  m = settings(channels=3, global_size=20, local_size=8, num_local=3)
  same = [rng.integers(0, 256, (24, 24, 3), dtype=np.uint8) for _ in range(5)]
  indices = np.arange(5)
  batch = {}
  for fixed in (True, False):
    batch[fixed] = images._multicrop_batch(
      indices, np.random.default_rng(7), source=_FakeSource(same), m=m, fixed_size=fixed
    )
  for key in ("global", "local"):
    np.testing.assert_allclose(batch[True][key], batch[False][key], atol=1e-4)
  assert batch[True]["global"].shape == (2, 5, 20, 20, 3)
  assert batch[True]["local"].shape == (3, 5, 8, 8, 3)

  sizes = ((30, 17), (9, 40), (24, 24))
  mixed = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
  out = images._multicrop_batch(
    np.arange(3), np.random.default_rng(1), source=_FakeSource(mixed), m=m, fixed_size=False
  )
  assert out["global"].shape == (2, 3, 20, 20, 3) and out["local"].shape == (3, 3, 8, 8, 3)
  assert np.isfinite(out["local"]).all() and np.abs(out["global"]).max() <= 1 + 1e-5


# ----------------------------------------------------------- crop geometry


@pytest.mark.parametrize("scale", [(0.4, 1.0), (0.05, 0.4)])
def test_box_sampler_respects_scale_ratio_and_bounds(scale):
  boxes = augment.sample_boxes(np.random.default_rng(0), np.full(20_000, 28), 28, scale)
  top, left, h, w = boxes.T
  fraction, aspect = h * w / 28**2, w / h
  assert scale[0] - 1e-12 <= fraction.min() and fraction.max() <= scale[1] + 1e-12
  assert fraction.min() < scale[0] + 0.01 and fraction.max() > scale[1] - 0.03
  if scale[1] * 4 / 3 <= 1:  # Every first draw fits: fractions are uniform in scale.
    assert abs(np.median(fraction) - np.mean(scale)) < 0.02 * (scale[1] - scale[0])
  assert 3 / 4 - 1e-12 <= aspect.min() and aspect.max() <= 4 / 3 + 1e-12
  assert (top >= 0).all() and (left >= 0).all()
  assert (top + h <= 28 + 1e-9).all() and (left + w <= 28 + 1e-9).all()
  assert top.max() > 10 and left.max() > 10  # Placed anywhere, not only at the corner.


def test_box_sampler_falls_back_to_central_crop_and_handles_mixed_sizes():
  rng = np.random.default_rng(0)
  # A 1 x 100 strip fits no box of aspect <= 4/3: central crop of height 1, width 4/3.
  np.testing.assert_allclose(
    augment.sample_boxes(rng, [1], [100], (0.05, 0.4)), [[0.0, (100 - 4 / 3) / 2, 1, 4 / 3]]
  )
  heights, widths = np.array([20, 300]), np.array([30, 200])
  boxes = augment.sample_boxes(rng, np.broadcast_to(heights, (1000, 2)), widths, (0.2, 0.3))
  assert boxes.shape == (1000, 2, 4)
  fraction = boxes[..., 2] * boxes[..., 3] / (heights * widths)
  assert 0.2 - 1e-12 <= fraction.min() and fraction.max() <= 0.3 + 1e-12
  assert (boxes[..., 0] + boxes[..., 2] <= heights + 1e-9).all()
  assert (boxes[..., 1] + boxes[..., 3] <= widths + 1e-9).all()


def test_resized_crops_against_closed_forms():
  rng = np.random.default_rng(0)
  batch = rng.integers(0, 256, size=(3, 12, 10, 2), dtype=np.uint8)
  # The whole image as box: the existing bilinear resize.
  whole = np.broadcast_to([0.0, 0.0, 12.0, 10.0], (1, 3, 4))
  out = augment.resized_crops(batch, whole, np.zeros((1, 3), bool), 7)
  assert out.shape == (1, 3, 2, 7, 7) and out.dtype == np.float32
  for i in range(3):
    expected = bilinear_resize(batch[i], 7, 7)
    np.testing.assert_allclose(out[0, i].transpose(1, 2, 0), expected, atol=1e-4)
  # An integer box at scale 1: exactly that window of pixels; flipped: mirrored.
  box = np.broadcast_to([3.0, 2.0, 5.0, 5.0], (2, 3, 4))
  flips = np.array([[False] * 3, [True] * 3])
  out = augment.resized_crops(batch, box, flips, 5)
  window = batch[:, 3:8, 2:7].transpose(0, 3, 1, 2)
  np.testing.assert_array_equal(out[0], window)
  np.testing.assert_array_equal(out[1], window[..., ::-1])
  # Random boxes: the flipped crop is the mirrored unflipped crop.
  boxes = augment.sample_boxes(rng, np.full((4, 3), 12), 10, (0.05, 0.4))
  plain = augment.resized_crops(batch, boxes, np.zeros((4, 3), bool), 6)
  flipped = augment.resized_crops(batch, boxes, np.ones((4, 3), bool), 6)
  np.testing.assert_array_equal(flipped, plain[..., ::-1])
  assert plain.min() >= 0 and plain.max() <= 255


def test_resized_crops_sample_every_pixel_bilinearly_at_the_box_coordinates():
  rng = np.random.default_rng(3)
  image = rng.uniform(0, 255, (9, 11, 2)).astype(np.float32)
  boxes = augment.sample_boxes(rng, np.full((3, 1), 9), 11, (0.1, 0.9))
  out = augment.resized_crops(image[None], boxes, np.zeros((3, 1), bool), 5)
  for v in range(3):
    top, left, h, w = boxes[v, 0]
    for i in range(5):
      y = min(max(top + (i + 0.5) * h / 5 - 0.5, 0), 8)  # half-pixel centres, clipped
      y0, fy = int(y), y - int(y)
      y1 = min(y0 + 1, 8)
      for j in range(5):
        x = min(max(left + (j + 0.5) * w / 5 - 0.5, 0), 10)
        x0, fx = int(x), x - int(x)
        x1 = min(x0 + 1, 10)
        want = (1 - fy) * ((1 - fx) * image[y0, x0] + fx * image[y0, x1]) + fy * (
          (1 - fx) * image[y1, x0] + fx * image[y1, x1]
        )
        np.testing.assert_allclose(out[v, 0, :, i, j], want, rtol=1e-5, atol=1e-3)
  # The whole image at its own size is the identity; a constant image stays constant.
  whole = np.broadcast_to([0.0, 0.0, 9.0, 11.0], (1, 1, 4))
  same = augment.resized_crops(
    image[None], np.broadcast_to([0.0, 0.0, 9.0, 9.0], (1, 1, 4)), np.zeros((1, 1), bool), 9
  )
  np.testing.assert_array_equal(same[0, 0].transpose(1, 2, 0), image[:, :9])
  constant = np.full((1, 9, 11, 1), 42, np.uint8)
  np.testing.assert_array_equal(
    augment.resized_crops(constant, whole, np.ones((1, 1), bool), 4), 42
  )


# -------------------------------------------------- photometric closed forms


def test_brightness_multiplies_and_clips():
  x = np.array([0, 50, 100, 200, 255], np.float32).reshape(1, 1, 1, 5).repeat(2, axis=0)
  out = augment.adjust_brightness(x, np.array([0.5, 1.4]))
  np.testing.assert_allclose(out[0, 0, 0], [0, 25, 50, 100, 127.5])
  np.testing.assert_allclose(out[1, 0, 0], [0, 70, 140, 255, 255])


def test_contrast_blends_toward_mean_grey():
  rgb = np.array([[[10, 200], [30, 40]], [[20, 0], [250, 60]], [[30, 100], [90, 80]]], np.float32)[
    None
  ]  # [1, 3, 2, 2]
  grey = 0.299 * rgb[0, 0] + 0.587 * rgb[0, 1] + 0.114 * rgb[0, 2]
  mean = grey.mean()
  out = augment.adjust_contrast(rgb, np.array([0.6]))
  np.testing.assert_allclose(out[0], np.clip(0.6 * rgb[0] + 0.4 * mean, 0, 255), rtol=1e-6)
  np.testing.assert_allclose(augment.adjust_contrast(rgb, np.array([0.0])), mean, rtol=1e-6)
  np.testing.assert_allclose(augment.adjust_contrast(rgb, np.array([1.0])), rgb)
  strong = augment.adjust_contrast(rgb, np.array([1.8]))
  np.testing.assert_allclose(strong[0], np.clip(1.8 * rgb[0] - 0.8 * mean, 0, 255), rtol=1e-5)
  assert strong.min() == 0 and strong.max() == 255
  one = np.array([[0, 40], [80, 120]], np.float32)[None, None]  # one channel: its own mean
  np.testing.assert_allclose(augment.adjust_contrast(one, np.array([0.5])), 0.5 * one + 30)


def test_saturation_grey_and_hue_closed_forms():
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 255, (2, 3, 4, 5)).astype(np.float32)
  grey = np.einsum("c,nchw->nhw", np.array([0.299, 0.587, 0.114]), x)[:, None]
  np.testing.assert_allclose(augment.grey(x), grey, rtol=1e-5)
  out = augment.adjust_saturation(x, np.array([0.0, 0.0]))
  np.testing.assert_allclose(out, np.repeat(grey, 3, 1), rtol=1e-5)
  out = augment.adjust_saturation(x, np.array([1.7, 1.7]))
  np.testing.assert_allclose(out, np.clip(1.7 * x - 0.7 * grey, 0, 255), rtol=1e-5, atol=1e-3)

  shifts = np.array([0.1, -0.37])
  out = augment.shift_hue(x, shifts)
  for n in range(2):
    for i in range(4):
      for j in range(5):
        h, s, v = colorsys.rgb_to_hsv(*(x[n, :, i, j] / 255))
        expected = np.array(colorsys.hsv_to_rgb((h + shifts[n]) % 1, s, v)) * 255
        np.testing.assert_allclose(out[n, :, i, j], expected, atol=1e-3)
  np.testing.assert_allclose(augment.shift_hue(x, np.zeros(2)), x, atol=1e-3)
  red = np.array([255, 0, 0], np.float32).reshape(1, 3, 1, 1)
  green = augment.shift_hue(red, np.array([1 / 3]))
  np.testing.assert_allclose(green[0, :, 0, 0], [0, 255, 0], atol=1e-3)


def test_solarize_inverts_pixels_at_or_above_threshold():
  x = np.array([0, 100, 127, 128, 200, 255], np.float32)
  np.testing.assert_array_equal(augment.solarize(x, 128), [0, 100, 127, 127, 55, 0])


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 1, 2), (2, 1, 1, 1)])
def test_reflect_pad_matches_numpy(shape):
  x = np.random.default_rng(0).uniform(size=shape).astype(np.float32)
  for axis in (2, 3):
    for radius in range(9):
      pad = [(0, 0)] * 4
      pad[axis] = (radius, radius)
      expected = np.pad(x, pad, mode="reflect")
      np.testing.assert_array_equal(augment._reflect_pad(x, axis, radius), expected)


def test_gaussian_blur_closed_forms():
  kernels = augment._gaussian_kernels(np.array([0.1, 0.5, 1.0, 2.0]), 6)
  np.testing.assert_allclose(kernels.sum(axis=1), 1, rtol=1e-6)
  np.testing.assert_allclose(kernels, kernels[:, ::-1])  # symmetric
  t = np.arange(-6, 7)
  np.testing.assert_allclose(kernels[2], np.exp(-(t**2) / 2) / np.exp(-(t**2) / 2).sum(), rtol=1e-5)
  assert kernels[0, 6] == 1.0  # sigma 0.1: neighbours get exp(-50)
  np.testing.assert_array_equal(augment._gaussian_kernels(np.zeros(1), 2), [[0, 0, 1, 0, 0]])

  rng = np.random.default_rng(0)
  constant = np.full((3, 2, 9, 9), 77.0, np.float32)
  np.testing.assert_allclose(augment.blur(constant, np.array([0.1, 0.6, 1.0]), 3), 77.0, rtol=1e-6)
  x = rng.uniform(0, 255, (2, 1, 8, 8)).astype(np.float32)
  np.testing.assert_allclose(augment.blur(x, np.array([0.1, 0.1]), 3), x, rtol=1e-6)
  # An impulse away from the border spreads into the outer product of the 1-D kernel.
  impulse = np.zeros((2, 1, 15, 15), np.float32)
  impulse[:, 0, 7, 7] = 1000
  sigma = np.array([0.7, 1.0])
  out = augment.blur(impulse, sigma, 3)
  for n in range(2):
    k = np.exp(-(np.arange(-3, 4) ** 2) / (2 * sigma[n] ** 2))
    k /= k.sum()
    np.testing.assert_allclose(out[n, 0, 4:11, 4:11], 1000 * np.outer(k, k), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.sum(axis=(1, 2, 3)), 1000, rtol=1e-5)
  assert out[0, 0, 7, 7] > out[1, 0, 7, 7]  # a wider sigma spreads more
  # Reflect padding (c b | a b c): an impulse on the border is not duplicated outside it.
  border = np.zeros((1, 1, 6, 10), np.float32)
  border[..., 0] = 100  # constant along H, so the H pass leaves it unchanged
  k = augment._gaussian_kernels(np.array([1.0]), 3)[0]
  blurred = augment.blur(border, np.array([1.0]), 3)[0, 0]
  np.testing.assert_allclose(blurred[:, :4], np.broadcast_to(100 * k[3:], (6, 4)), rtol=1e-5)
  np.testing.assert_allclose(blurred[:, 4:], 0, atol=1e-6)


def test_augment_views_one_channel_brightness_and_skipped_colour_ops():
  rng = np.random.default_rng(0)
  x = rng.uniform(1, 150, (6, 1, 5, 5)).astype(np.float32)  # x * 1.4 stays below 255
  m = settings(
    channels=1,
    jitter_prob=1.0,
    brightness=0.0,
    contrast=0.0,
    grayscale_prob=1.0,
    blur_prob=(0.0, 0.0, 0.0),
    solarize_prob=0.0,
  )
  out = multicrop_lib._augment_views(x.copy(), rng, m, np.zeros(6), np.zeros(6))
  assert out.shape == (6, 5, 5, 1)
  np.testing.assert_allclose(out, x.transpose(0, 2, 3, 1) / 127.5 - 1, atol=1e-6)
  m = settings(channels=1, jitter_prob=1.0, contrast=0.0, blur_prob=(0.0, 0.0, 0.0))
  out = multicrop_lib._augment_views(
    x.copy(), np.random.default_rng(1), m, np.zeros(6), np.zeros(6)
  )
  ratio = (out + 1) * 127.5 / x.transpose(0, 2, 3, 1)  # brightness only: one factor per crop
  spread = ratio.reshape(6, -1).max(1) - ratio.reshape(6, -1).min(1)
  assert (spread < 1e-4).all() and (np.abs(ratio[:, 0, 0, 0] - 1) <= 0.4 + 1e-6).all()
  assert len(np.unique(np.round(ratio[:, 0, 0, 0], 4))) == 6
