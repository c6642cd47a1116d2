"""laplax.evaluators.linear_segmentation: mIoU by closed form, the linear probe on
constructed patch features (separable: 1.0; constant: the background-only
score), and the Fashion-MNIST canvases (labels, determinism under the seed).
laplax.data.vision.segmentation: the fashion_mosaic builder against the canvases of
its seeds, the canvases at the backbone's size, scene_parse150 read without
TensorFlow (TFDS's mock data, and prepared files), the DINO task's probe on
fashion_mosaic, and bad segmentation settings."""

import os
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from laplax.data.builders import fashion_mnist_idx as fmnist
from laplax.data.vision import canvases as canvas_lib
from laplax.data.vision import images
from laplax.data.vision import segmentation as seg_data
from laplax.evaluators import linear_segmentation as seg

FMNIST_SOURCE = "/usr/share/datasets/fashion-mnist"


def test_confusion_and_miou_closed_form():
  target = np.array([[0, 0, 1], [1, 2, -1]])
  predicted = np.array([[0, 1, 1], [1, 1, 0]])
  m = seg.confusion(predicted, target, 4)
  np.testing.assert_array_equal(m[:3, :3], [[1, 1, 0], [0, 2, 0], [0, 1, 0]])
  r = seg.miou(m)
  # IoU: class 0 1/2, class 1 2/4, class 2 0/1, class 3 empty (left out).
  assert r["iou"] == [0.5, 0.5, 0.0, None]
  assert r["miou"] == pytest.approx(1 / 3) and r["pixel_accuracy"] == pytest.approx(3 / 5)
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    seg.confusion(np.full((2, 3), 4), target, 4)


@pytest.mark.slow
def test_separable_patches_give_miou_1():
  """One-hot patch features, pixel labels constant on each patch. Bilinear
  upsampling blends a pixel's logits with its neighbour patches' (at a
  corner the own patch weighs (4/7)^2 = 0.33 against 0.67 for the other
  three), so a pixel whose neighbours share a class may take it however good
  the features are; here every 3x3 block of patches holds distinct classes."""
  rng = np.random.default_rng(0)
  rows, cols = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
  pattern = (rows % 3) * 3 + (cols % 3)
  classes = np.stack([rng.permutation(11)[pattern] for _ in range(48)])
  masks = np.repeat(np.repeat(classes, 7, 1), 7, 2).astype(np.int32)
  feats = np.eye(11, dtype=np.float32)[classes] + 0.01 * rng.normal(size=classes.shape + (11,))
  r = seg.linear_segmentation_probe(
    feats[:32], masks[:32], feats[32:], masks[32:], num_classes=11, steps=300, lr=0.2, batch_size=16
  )
  assert r["miou"] == 1.0 and r["pixel_accuracy"] == 1.0
  assert r["predictions"].shape == (16, 28, 28)


def test_constant_features_give_the_background_only_score():
  rng = np.random.default_rng(1)
  masks = np.zeros((24, 28, 28), np.int32)
  for m in masks:  # garments 1..10 on a background of about 80% of the pixels
    for c in rng.integers(1, 11, size=3):
      top, left = rng.integers(0, 22, size=2)
      m[top : top + 6, left : left + 6] = c
  feats = np.ones((24, 4, 4, 8), np.float32)
  r = seg.linear_segmentation_probe(
    feats[:16], masks[:16], feats[16:], masks[16:], num_classes=11, steps=200, batch_size=8
  )
  test = masks[16:]
  background = float((test == 0).mean())
  present = len(np.unique(np.concatenate([test.ravel(), [0]])))
  assert (r["predictions"] == 0).all()
  assert r["iou"][0] == pytest.approx(background)
  assert r["miou"] == pytest.approx(background / present)


def test_fashion_canvases_labels_and_determinism():
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, size=(20, 28, 28)).astype(np.uint8)
  images[images < 128] = 0  # a background the threshold removes
  labels = rng.integers(0, 10, size=20)
  a = canvas_lib.fashion_canvases(images, labels, 6, canvas_size=56, seed=3)
  b = canvas_lib.fashion_canvases(images, labels, 6, canvas_size=56, seed=3)
  c = canvas_lib.fashion_canvases(images, labels, 6, canvas_size=56, seed=4)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[1], c[1])
  canvases, masks = a
  assert canvases.shape == (6, 56, 56, 1) and canvases.dtype == np.uint8
  assert masks.shape == (6, 56, 56) and 0 <= masks.min() and masks.max() <= 10
  np.testing.assert_array_equal(masks > 0, canvases[..., 0] > canvas_lib.GARMENT_THRESHOLD)
  # One garment per canvas: the canvas is that garment at some offset.
  one, one_mask = canvas_lib.fashion_canvases(images, labels, 4, min_items=1, max_items=1, seed=5)
  for canvas, mask in zip(one[..., 0], one_mask):
    found = [
      (i, t, l)
      for i in range(20)
      for t in range(29)
      for l in range(29)
      if np.array_equal(
        np.where(images[i] > canvas_lib.GARMENT_THRESHOLD, images[i], 0),
        canvas[t : t + 28, l : l + 28],
      )
      and canvas.sum() == images[i][images[i] > canvas_lib.GARMENT_THRESHOLD].sum()
    ]
    assert found, "the canvas is not one pasted garment"
    i, t, l = found[0]
    on = images[i] > canvas_lib.GARMENT_THRESHOLD
    np.testing.assert_array_equal(mask[t : t + 28, l : l + 28], np.where(on, labels[i] + 1, 0))
    assert mask.sum() == on.sum() * (labels[i] + 1)


# --------------------------------------------------------------------------
# Segmentation data: the fashion_mosaic builder, Fashion-MNIST canvases at
# the backbone's size, scene_parse150 read without TensorFlow.


@pytest.fixture(scope="module")
def mosaic_data_dir(tmp_path_factory):
  """A TFDS data_dir with ``fashion_mosaic/small`` prepared by images.prepare."""
  if not os.path.exists(os.path.join(FMNIST_SOURCE, "train-images-idx3-ubyte.gz")):
    pytest.skip("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist")
  data = images.default_config("fashion_mosaic/small")
  data.data_dir = str(tmp_path_factory.mktemp("mosaic"))
  data.source_dir = FMNIST_SOURCE
  images.prepare(data)
  return data.data_dir


def test_fashion_mosaic_is_the_canvases_of_its_seeds(mosaic_data_dir):
  """Every test example (and the first train ones) equals fashion_canvases on
  the IDX split with the split's seed; the label is the garment class with the
  most mask pixels."""
  for split, n in (("test", 500), ("train", 40)):
    source = tfds.data_source("fashion_mosaic/small", split=split, data_dir=mosaic_data_dir)
    assert len(source) == {"test": 500, "train": 2000}[split]
    garments, classes = fmnist.read_split(FMNIST_SOURCE, split)
    want_images, want_masks = canvas_lib.fashion_canvases(
      garments, classes, n, canvas_size=56, seed={"train": 0, "test": 1}[split]
    )
    got = source.__getitems__(list(range(n)))
    np.testing.assert_array_equal(np.stack([e["image"] for e in got]), want_images)
    np.testing.assert_array_equal(np.stack([e["mask"] for e in got]), want_masks)
    assert got[0]["image"].dtype == np.uint8 and got[0]["mask"].shape == (56, 56)
    for e, m in zip(got, want_masks):
      counts = [(m == c + 1).sum() for c in range(10)]
      assert e["label"] == counts.index(max(counts)) and max(counts) > 0
  info = images.info(_mosaic_config(mosaic_data_dir))
  assert info.num_classes == 10 and info.image_shape == (56, 56, 1)


def _mosaic_config(data_dir):
  data = images.default_config("fashion_mosaic/small")
  data.data_dir = data_dir
  return data


@pytest.mark.slow
def test_fashion_canvases_at_the_backbone_size(fmnist_data_dir):
  """The canvases of a Fashion-MNIST run: built at 56 px from the first
  CANVAS_POOL * n images of the run's split, then at 28 px: the image is the
  2 x 2 mean (the bilinear halving), normalised as the run's images
  ((x / 255 - 0.5) / 0.5), the mask the nearest pixel centre (odd rows/columns)."""
  data = images.default_config()
  data.data_dir = fmnist_data_dir
  data.train_split, data.eval_split = "train[:500]", "test[:100]"
  d = seg_data.load(data, "fashion_canvases", num_train=20, num_test=6, image_size=28, channels=1)
  assert d.name == "fashion_canvases" and d.num_classes == 11
  for split, n, seed, x, m in (
    ("train", 20, 0, d.train_images, d.train_masks),
    ("test", 6, 1, d.test_images, d.test_masks),
  ):
    garments, classes = fmnist.read_split(FMNIST_SOURCE, split)
    pool = seg_data.CANVAS_POOL * n
    canvases, masks = canvas_lib.fashion_canvases(
      garments[:pool], classes[:pool], n, canvas_size=56, seed=seed
    )
    np.testing.assert_array_equal(m, masks[:, 1::2, 1::2])
    halved = canvases.astype(np.float64).reshape(n, 28, 2, 28, 2, 1).mean((2, 4))
    np.testing.assert_allclose(x, (halved / 255 - 0.5) / 0.5, atol=1e-5)
    assert x.shape == (n, 28, 28, 1) and x.dtype == np.float32 and m.dtype == np.int32


def test_scene_parse150_reader_on_tfds_mock_data():
  """tfds.testing.mock_data (policy USE_CODE: no metadata files needed) serves
  random decoded examples to tfds.data_source; the mock's __getitems__ does
  not take its keys, so the reader reads one index at a time."""
  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
    x, m = seg_data.read_scene_parse150("/nonexistent/tfds", "train", 3, 24)
    raw = tfds.data_source("scene_parse150", split="train", data_dir="/nonexistent/tfds")[1]
  assert x.shape == (3, 24, 24, 3) and x.dtype == np.uint8
  assert m.shape == (3, 24, 24) and m.dtype == np.int32
  assert m.min() >= -1 and m.max() < seg_data.SCENE_PARSE150_CLASSES
  red = raw["annotation"][..., 0]
  values = set(np.unique(red)) & set(range(1, 151))
  assert set(np.unique(m[1])) - {-1} <= {v - 1 for v in values}
  assert "tensorflow" not in sys.modules


def _encoded(array, fmt):
  import io

  from PIL import Image

  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format=fmt, quality=95)
  return buffer.getvalue()


def test_scene_parse150_prepared_files_are_read_without_tensorflow(tmp_path):
  """A scene_parse150 prepared in array_record by TFDS's own builder (its
  examples replaced by two local JPEG/PNG pairs) is read by tfds.data_source
  (PIL decoding) in a process without TensorFlow. The 40 x 60 annotation's red
  channel is constant on 2 x 2 blocks, v = (7 (r // 2) + c // 2) % 152; at
  20 px the central 40 x 40 square's pixel (i, j) reads row 2i + 1 and column
  11 + 2j, so the class is v - 1 with v = (7 i + 5 + j) % 152, or -1 (ignored)
  for v = 0 and v = 151."""
  from etils import epath
  from tensorflow_datasets.datasets.scene_parse150 import scene_parse150_dataset_builder

  from laplax.data.builders.base import OwnCodePath

  rows, cols = np.meshgrid(np.arange(40), np.arange(60), indexing="ij")
  annotation = np.zeros((40, 60, 3), np.uint8)
  annotation[..., 0] = (7 * (rows // 2) + cols // 2) % 152
  annotation[..., 1] = 3  # instance ids: not classes
  picture = np.zeros((40, 60, 3), np.uint8) + np.array([200, 100, 50], np.uint8)
  pair = {"image": _encoded(picture, "JPEG"), "annotation": _encoded(annotation, "PNG")}

  class LocalSceneParse150(
    OwnCodePath, scene_parse150_dataset_builder.Builder, skip_registration=True
  ):
    name = "scene_parse150"
    # TFDS's README and citation of the dataset, beside its builder.
    pkg_dir_path = epath.Path(scene_parse150_dataset_builder.__file__).parent

    def _split_generators(self, dl_manager):
      return {"train": self._pairs(2), "test": self._pairs(1)}

    def _pairs(self, n):
      for i in range(n):
        yield f"ADE_{i}", pair

  LocalSceneParse150(data_dir=str(tmp_path)).download_and_prepare(file_format="array_record")
  x, m = seg_data.read_scene_parse150(str(tmp_path), "train", 5, 20)
  assert x.shape == (2, 20, 20, 3) and m.shape == (2, 20, 20)
  np.testing.assert_allclose(x.astype(float), np.broadcast_to([200, 100, 50], x.shape), atol=3)
  i, j = np.meshgrid(np.arange(20), np.arange(20), indexing="ij")
  v = (7 * i + 5 + j) % 152
  want = np.where((v >= 1) & (v <= 150), v - 1, -1)
  assert (want == -1).sum() == 2  # v = 151 and v = 152 (0): pixels (19, 13), (19, 14)
  np.testing.assert_array_equal(m[0], want)
  np.testing.assert_array_equal(m[1], want)
  assert "tensorflow" not in sys.modules


# --------------------------------------------------------------------------
# The DINO task's probe and the settings.


def test_dino_task_reads_the_mosaic_masks(mosaic_data_dir):
  """configs/dino_fashion_mosaic.py's task ("auto": the dataset's own masks)
  gives the stored images, normalised, and the stored masks unchanged at the
  backbone's 56 px; the k-NN labels are the 10 garment classes. (The probe
  itself runs through eval.py in test_dino.py, on Fashion-MNIST canvases.)"""
  from laplax import tasks

  from helpers.configs import load

  c = load("dino_fashion_mosaic")
  c.data.name, c.data.data_dir = "fashion_mosaic/small", mosaic_data_dir
  c.eval.update(segmentation_train_images=30, segmentation_test_images=12)
  task = tasks.make_task(tasks.validate(c), None)
  assert task.num_classes == 10 and task.image_shape == (56, 56, 1)
  from laplax.evaluators import dino_segmentation

  data = dino_segmentation.load_data(task.config, task.image_shape)
  assert data.name == "fashion_mosaic/small" and data.num_classes == 11
  assert data.train_images.shape == (30, 56, 56, 1) and data.test_masks.shape == (12, 56, 56)
  for split, x, m in (
    ("train", data.train_images, data.train_masks),
    ("test", data.test_images, data.test_masks),
  ):
    source = tfds.data_source("fashion_mosaic/small", split=split, data_dir=mosaic_data_dir)
    stored = [source[i] for i in range(len(m))]
    np.testing.assert_array_equal(m, np.stack([e["mask"] for e in stored]))
    np.testing.assert_allclose(x, np.stack([e["image"] for e in stored]) / 127.5 - 1, atol=1e-6)
  # A run saved before the segmentation keys existed gets their defaults.
  with c.unlocked():
    for key in list(c.eval):
      if key.startswith("segmentation"):
        del c.eval[key]
  from laplax.evaluators import registry
  from laplax.tasks import schema

  registry.complete(schema.complete(c))  # as reading its config.json and validating do
  assert dino_segmentation.settings(task.config) == dino_segmentation.DEFAULTS
  assert {k: c.eval[k] for k in dino_segmentation.DEFAULTS} == dino_segmentation.DEFAULTS


@pytest.mark.parametrize(
  "config,flag,fragment",
  [
    ("dino_fashion_mnist", "--config.eval.segmentation_steps=0", "segmentation_steps=0"),
    (
      "dino_fashion_mnist",
      "--config.eval.segmentation_train_images=1",
      "segmentation_train_images=1",
    ),
    (
      "dino_fashion_mnist",
      "--config.eval.segmentation_dataset=ade20k_full",
      "'ade20k_full' is unknown",
    ),
    (
      "dino_fashion_mnist",
      "--config.eval.segmentation_dataset=ade20k",
      "--config.eval.segmentation_dir=DIR",
    ),
    ("dino_fashion_mnist", "--config.eval.segmentation_image_size=30", "not divisible"),
    (
      "dino_fashion_mosaic",
      "--config.eval.segmentation_dataset=fashion_canvases",
      "Fashion-MNIST images",
    ),
    (
      "dino_fashion_mnist",
      "--config.eval.segmentation=False",
      "eval.segmentation was replaced by config.evals",
    ),
    (
      "dino_fashion_mnist",
      "--config.evals=knn,classification",
      "'classification', not an evaluator of a dino run",
    ),
    ("dino_fashion_mnist", "--config.evals=knn,knn", "names an evaluator twice"),
    ("dino_fashion_mnist", "--config.evals=", "names no evaluator"),
  ],
)
def test_bad_segmentation_settings_one_line_exit_2(tmp_path, config, flag, fragment, capfd):
  from helpers.runs import ROOT, run_in_process

  workdir = tmp_path / "bad"
  r = run_in_process(
    [
      "train.py",
      "--config",
      os.path.join(ROOT, "configs", config + ".py"),
      "--workdir",
      str(workdir),
      flag,
    ],
    capfd,
  )
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], r.stderr
  assert not workdir.exists()


def test_mosaic_config_validates():
  from laplax import tasks
  from laplax.evaluators import registry

  from helpers.configs import load

  c = load("dino_fashion_mosaic")
  tasks.validate(c)
  registry.validate(c)  # the evaluators' settings, completed
  assert c.data.name == "fashion_mosaic" and c.task == "dino"
  assert c.data.multicrop.global_size == 56 and 56 % c.model.patch_size == 0
  assert "segmentation" in c.evals.split(",") and c.eval.segmentation_dataset == "auto"
