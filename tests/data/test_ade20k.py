"""ADE20K's 150 classes (ADEChallengeData2016 as published) for the DINO segmentation probe.

Every test writes its own release in the published layout (a few tiny JPEGs
and 8-bit PNG class maps with known classes and ignored pixels): the reader's
protocol (central square, bilinear image, nearest-neighbour mask at the same
pixel centres, c -> c - 1, 0 ignored), the probe's mIoU against a hand
computation and against NumPy's definition, the last-N-layers features
against a NumPy layer norm, the probe split over a 2-device mesh, and
eval.py on a DINO workdir with --config.eval.segmentation_dataset=ade20k
(150-class mIoU, per-class IoU, the figure; malformed releases: one line,
exit 2)."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from laplax.data.errors import DataError
from laplax.data.vision import ade20k
from laplax.evaluators import linear_segmentation as seg

# Class maps as 12 x 18 blocks (each block 2 x 2 pixels of a 24 x 36 image):
# at 12 px the central 24 x 24 square's pixel (i, j) reads row 2i + 1 and
# column 6 + 2j + 1, i.e. block (i, 3 + j): the sampled mask is block[:, 3:15].
H, W, S = 24, 36, 12


def _blocks(fill, rows=None, value=None):
  block = np.full((12, 18), fill, np.uint8)
  if rows is not None:
    block[rows] = value
  return block


# training: class 7 is the most frequent labelled class; class 1 (the
# smallest id, which an argmax tie would pick) and 150 occur too.
TRAIN = [_blocks(7, slice(0, 3), 12), _blocks(7, slice(6, 12), 3), _blocks(7, slice(0, 4), 0)]
TRAIN[2][4:6] = 150
TRAIN[2][10:12, :9] = 1
# validation: rows 0-5 class 7, rows 6-11 class 3; then rows 0-3 ignored, 4-11 class 7.
VAL = [_blocks(7, slice(6, 12), 3), _blocks(7, slice(0, 4), 0)]
COLOURS = [(200, 100, 50), (20, 160, 90), (90, 90, 220)]


def write_release(root, train=TRAIN, val=VAL):
  """ADEChallengeData2016's layout under ``root`` with the given block maps."""
  for split, maps, prefix in (("training", train, "ADE_train"), ("validation", val, "ADE_val")):
    os.makedirs(os.path.join(root, "images", split), exist_ok=True)
    os.makedirs(os.path.join(root, "annotations", split), exist_ok=True)
    for i, block in enumerate(maps):
      name = f"{prefix}_{i + 1:08d}"
      picture = np.zeros((H, W, 3), np.uint8) + np.array(COLOURS[i % 3], np.uint8)
      Image.fromarray(picture).save(os.path.join(root, "images", split, name + ".jpg"), quality=95)
      Image.fromarray(np.kron(block, np.ones((2, 2), np.uint8))).save(
        os.path.join(root, "annotations", split, name + ".png")
      )
  return str(root)


def test_reader_follows_the_stated_protocol(tmp_path):
  root = write_release(tmp_path / "ADEChallengeData2016")
  x, m = ade20k.read_split(root, "training", 5, S)
  assert x.shape == (3, S, S, 3) and x.dtype == np.uint8
  assert m.shape == (3, S, S) and m.dtype == np.int32
  for i, block in enumerate(TRAIN):
    want = block[:, 3:15].astype(np.int32) - 1  # 0 -> -1 (ignored), c -> c - 1
    np.testing.assert_array_equal(m[i], want)
    np.testing.assert_allclose(x[i].astype(float), np.broadcast_to(COLOURS[i], x[i].shape), atol=3)
  assert m[2].max() == 149 and m[2].min() == -1 and (m[2] == 0).sum() == 6 * 2
  grey, _ = ade20k.read_split(root, "validation", 1, S, channels=1)
  r, g, b = COLOURS[0]  # Pillow's L: ITU-R 601-2 luma
  assert grey.shape == (1, S, S, 1)
  np.testing.assert_allclose(grey.astype(float), (r * 299 + g * 587 + b * 114) / 1000, atol=3)
  assert "tensorflow" not in sys.modules


def test_probe_miou_is_the_hand_computed_one(tmp_path):
  """Constant features: the probe can only learn the class prior, so it
  predicts the most frequent train class, 7, everywhere. On the validation
  masks (72 px of class 7 and 72 of class 3; then 48 ignored and 96 of 7):
  IoU(7) = 168 / (168 + 72) = 0.7, IoU(3) = 0 / 72 = 0, the other 148
  classes are in neither labels nor predictions and are left out of the
  mean (mmsegmentation's nanmean): mIoU = 0.35, pixel accuracy 168 / 240."""
  root = write_release(tmp_path / "release")
  _, y = ade20k.read_split(root, "training", 3, S)
  _, y_test = ade20k.read_split(root, "validation", 2, S)
  feats = np.ones((3, 3, 3, 4), np.float32)
  r = seg.linear_segmentation_probe(
    feats, y, np.ones((2, 3, 3, 4), np.float32), y_test, num_classes=150, steps=60, batch_size=3
  )
  assert (r["predictions"] == 6).all()
  assert r["miou"] == pytest.approx(0.35) and r["pixel_accuracy"] == pytest.approx(0.7)
  assert r["iou"][6] == pytest.approx(0.7) and r["iou"][2] == 0.0
  assert sum(v is not None for v in r["iou"]) == 2 and len(r["iou"]) == 150


def numpy_miou(predicted, target, num_classes):
  """The definition: per class |P & T| / |P | T| over labelled pixels, the mean
  over the classes whose union is not empty."""
  keep = target >= 0
  p, t = predicted[keep], target[keep]
  ious = [
    np.sum((p == c) & (t == c)) / np.sum((p == c) | (t == c))
    for c in range(num_classes)
    if np.sum((p == c) | (t == c))
  ]
  return float(np.mean(ious))


def test_probe_miou_equals_numpy_definition_on_informative_features(tmp_path):
  """Features that carry the class of a patch's centre pixel plus noise: the
  probe's mIoU (summed confusion matrices of padded test batches) equals
  NumPy's definition on its predictions, and is far above the prior's."""
  root = write_release(tmp_path / "release")
  _, y = ade20k.read_split(root, "training", 3, S)
  _, y_test = ade20k.read_split(root, "validation", 2, S)
  rng = np.random.default_rng(0)

  def features(masks):
    centre = masks[:, 2::4, 2::4]  # 3 x 3 patches of 4 x 4 pixels
    return np.eye(151, dtype=np.float32)[centre + 1][
      ..., [0, 1, 3, 7, 12, 150]
    ] + 0.05 * rng.normal(size=centre.shape + (6,)).astype(np.float32)

  r = seg.linear_segmentation_probe(
    features(y), y, features(y_test), y_test, num_classes=150, steps=80, lr=0.2, batch_size=2
  )
  assert r["predictions"].shape == (2, S, S)
  assert r["miou"] == pytest.approx(numpy_miou(r["predictions"], y_test, 150), abs=1e-12)
  assert r["miou"] > 0.6


@pytest.mark.slow
def test_last_layers_are_the_final_norm_of_each_block_concatenated():
  from laplax.evaluators import dino_segmentation

  from helpers.models import make_vit

  vit = make_vit(width=16, depth=3, num_heads=2, mlp_dim=16, patch_size=4, pool="tok")
  images = np.random.default_rng(1).normal(size=(2, 12, 12, 3)).astype(np.float32)
  params = jax.jit(vit.init)(jax.random.key(0), images)["params"]
  one = np.asarray(dino_segmentation.feature_fn(vit, 1)(params, images))
  two = np.asarray(dino_segmentation.feature_fn(vit, 2)(params, images))
  _, out = jax.jit(lambda p, x: vit.apply({"params": p}, x))(params, images)
  assert one.shape == (2, 3, 3, 16) and two.shape == (2, 3, 3, 32)
  np.testing.assert_allclose(one, np.asarray(out["encoded"])[:, 1:].reshape(2, 3, 3, 16), atol=1e-6)
  np.testing.assert_allclose(two[..., 16:], one, atol=1e-5)
  x = np.asarray(out["block1"]["+mlp"], np.float64)[:, 1:]
  norm = params["encoder_norm"]
  eps = vit.spec.norm_eps
  want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * np.asarray(
    norm["scale"]
  ) + np.asarray(norm["bias"])
  np.testing.assert_allclose(two[..., :16], want.reshape(2, 3, 3, 16), atol=1e-5)


MESH_SCRIPT = """
import numpy as np
from laplax import sharding
from laplax.evaluators import linear_segmentation as seg
rng = np.random.default_rng(0)
y = rng.integers(-1, 5, size=(6, 8, 8)).astype(np.int32)
x = rng.normal(size=(6, 2, 2, 3)).astype(np.float32)
kw = dict(num_classes=5, steps=5, batch_size=4)
one = seg.linear_segmentation_probe(x[:4], y[:4], x[4:], y[4:], **kw)
mesh = sharding.make_mesh()
place = lambda b: sharding.whole_batch(b, mesh, sharding.DEFAULT_RULES)
two = seg.linear_segmentation_probe(x[:4], y[:4], x[4:], y[4:], place=place, **kw)
assert len(mesh.devices.ravel()) == 2
assert abs(one["miou"] - two["miou"]) < 1e-6, (one["miou"], two["miou"])
assert (one["predictions"] == two["predictions"]).mean() > 0.99
print("same")
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_probe_split_over_a_two_device_mesh_gives_the_same_score():
  from helpers.runs import ROOT, xla_env

  r = subprocess.run(
    [sys.executable, "-c", MESH_SCRIPT],
    cwd=ROOT,
    env=xla_env(2),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert r.returncode == 0 and "same" in r.stdout, r.stderr[-3000:]


# --------------------------------------------------------------------------
# Through eval.py on a DINO workdir.


@pytest.fixture(scope="module")
def dino_workdir(tmp_path_factory, fmnist_data_dir):
  """A tiny Fashion-MNIST DINO run's step-0 checkpoint (a grey backbone: it
  reads the release's luma; an RGB backbone reads RGB)."""
  from helpers.dino import dino_args
  from helpers.runs import run_in_process

  workdir = tmp_path_factory.mktemp("ade") / "run"
  r = run_in_process(
    dino_args(
      workdir,
      fmnist_data_dir,
      "--config.total_steps=0",
      "--config.data.train_split=train[:300]",
      "--config.data.eval_split=test[:100]",
      "--config.eval_batch_size=100",
    )
  )
  assert r.returncode == 0
  return workdir


def _eval(workdir, out, root, capfd, *extra):
  from helpers.runs import run_in_process

  return run_in_process(
    [
      "eval.py",
      "--workdir",
      str(workdir),
      "--out",
      str(out),
      "--config.eval.segmentation_dataset=ade20k",
      f"--config.eval.segmentation_dir={root}",
      "--config.eval.segmentation_steps=5",
    ]
    + list(extra),
    capfd,
  )


@pytest.mark.slow
def test_eval_py_writes_the_150_class_miou_and_the_figure(tmp_path, dino_workdir, capfd):
  root = write_release(tmp_path / "ADEChallengeData2016")
  out = tmp_path / "evals" / "eval.json"
  r = _eval(
    dino_workdir,
    out,
    root,
    capfd,
    "--config.eval.segmentation_figure_images=2",
    "--config.eval.segmentation_layers=1",
    "--config.eval.segmentation_batch_size=2",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["segmentation_dataset"] == "ade20k"
  assert result["segmentation_num_classes"] == 150 and len(result["segmentation_iou"]) == 150
  assert (result["segmentation_train_images"], result["segmentation_test_images"]) == (3, 2)
  assert result["segmentation_image_size"] == 28
  present = [v for v in result["segmentation_iou"] if v is not None]
  # Classes 3 and 7 are in the labels; only predicted classes can add more.
  assert result["segmentation_iou"][2] is not None and result["segmentation_iou"][6] is not None
  assert result["segmentation_miou"] == pytest.approx(np.mean(present))
  assert (out.parent / "segmentation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "linear segmentation probe on ade20k" in r.stdout
  saved = json.loads((dino_workdir / "config.json").read_text())
  assert saved["eval"]["segmentation_dataset"] == "auto"  # the override is not saved


def _missing_annotation(root):
  os.remove(os.path.join(root, "annotations", "validation", "ADE_val_00000002.png"))


def _value_151(root):
  block = np.kron(_blocks(7, slice(0, 2), 151), np.ones((2, 2), np.uint8))
  Image.fromarray(block).save(
    os.path.join(root, "annotations", "training", "ADE_train_00000001.png")
  )


def _other_layout(root):  # ADE20K's full release: images/ADE/training/<scene>/...
  os.rename(os.path.join(root, "images"), os.path.join(root, "ADE"))
  os.makedirs(os.path.join(root, "images"))
  os.rename(os.path.join(root, "ADE"), os.path.join(root, "images", "ADE"))


def _rgb_annotation(root):
  path = os.path.join(root, "annotations", "training", "ADE_train_00000002.png")
  Image.open(path).convert("RGB").save(path)


@pytest.mark.parametrize(
  "break_it,fragment",
  [
    (_missing_annotation, "ADE_val_00000002.jpg has no annotation"),
    (_value_151, "has pixel value 151"),
    (_other_layout, "is not an ADEChallengeData2016 release: images/training is missing"),
    (_rgb_annotation, "not a single-channel class map"),
    (None, "give --config.eval.segmentation_dir=DIR"),
  ],
)
@pytest.mark.slow
def test_malformed_release_is_one_line_exit_2(tmp_path, dino_workdir, capfd, break_it, fragment):
  root = write_release(tmp_path / "release")
  if break_it is not None:
    break_it(root)
  else:
    root = ""  # ade20k without a directory
  out = tmp_path / "evals" / "eval.json"
  r = _eval(dino_workdir, out, root, capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], r.stderr
  assert not out.exists()


@pytest.mark.parametrize(
  "flag,fragment",
  [
    ("--config.eval.segmentation_colour=1", "unknown config key 'eval.segmentation_colour'"),
    ("--config.eval.segmentation_layers=2", "more than the model's 1 blocks"),
    ("--config.eval.segmentation_lr=fast", "not a float"),
    ("--config.model.width=8", "overrides of its eval section and evaluators only"),
  ],
)
def test_bad_eval_overrides_are_one_line_exit_2(tmp_path, dino_workdir, capfd, flag, fragment):
  from helpers.runs import run_in_process

  out = tmp_path / "eval.json"
  r = run_in_process(["eval.py", "--workdir", str(dino_workdir), "--out", str(out), flag], capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and fragment in lines[0], r.stderr
  assert not out.exists()


def test_overrides_reach_a_run_saved_before_the_keys_existed():
  """eval.py's --config.eval.KEY=VALUE: typed as the default, added to an old
  DINO config that lacks the key, checked by the config's validation."""
  from laplax.cli import eval as eval_cli
  from laplax.config import validation as config_lib

  from helpers.configs import load

  argv, overrides = eval_cli.split_overrides(
    [
      "eval.py",
      "--workdir",
      "w",
      "--config.eval.segmentation_dataset=ade20k",
      "--config.eval.segmentation_dir=/r",
      "--config.eval.segmentation_lr=1",
      "--config.evals=knn,segmentation",
    ]
  )
  assert argv == ["eval.py", "--workdir", "w"] and len(overrides) == 4
  c = load("dino_fashion_mnist")
  with c.unlocked():
    for key in [k for k in c.eval if k.startswith("segmentation")]:
      del c.eval[key]
  c.lock()
  from laplax.tasks import schema

  schema.complete(c)  # as reading its config.json does
  eval_cli.apply_overrides(c, overrides)
  assert (c.eval.segmentation_dataset, c.eval.segmentation_dir) == ("ade20k", "/r")
  assert c.eval.segmentation_lr == 1.0 and isinstance(c.eval.segmentation_lr, float)
  assert c.evals == "knn,segmentation"
  with pytest.raises(config_lib.ConfigError, match="segmentation_dir=DIR"):
    eval_cli.apply_overrides(c, [("eval.segmentation_dir", "")])
  with pytest.raises(config_lib.ConfigError, match="'samples', not an evaluator of a dino"):
    eval_cli.apply_overrides(c, [("evals", "knn,samples")])
  with pytest.raises(config_lib.ConfigError, match="names no evaluator"):
    eval_cli.apply_overrides(c, [("evals", " , ")])


def test_reader_errors_name_the_file(tmp_path):
  with pytest.raises(DataError, match="does not exist"):
    ade20k.split_files(str(tmp_path / "nowhere"), "training")
  write_release(tmp_path / "r")
  with pytest.raises(DataError, match="not a single-channel"):
    ade20k.class_mask(np.zeros((2, 2, 3), np.uint8), "x.png")


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_report_segmentation_eval_on_fake_devices():
  """bench/compile_report.py --segmentation-eval compiles the three programs
  of the evaluation for 2 devices and prints their memory and the host's."""
  from helpers.runs import ROOT, run

  proc = run(
    [
      os.path.join(ROOT, "bench", "compile_report.py"),
      "--segmentation-eval",
      "--cpu-devices",
      "2",
      "--config",
      "configs/dino_fashion_mnist.py",
      "--set",
      "eval.segmentation_layers=2",
      "--set",
      "eval_batch_size=8",
    ]
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout
  assert "cpu x 2" in out and "28 px (4 x 4 patches), last 2 block(s)" in out, out
  for name in ("features", "probe step", "test batch"):
    assert re.search(rf"   {name}: arguments \S+ \w+B, .* per device", out), out
  width = 128  # dino_fashion_mnist: 500 + 200 images x 16 patches x 2 x 128 float32
  assert f"{700 * 16 * 2 * width * 4 / 2**20:.1f} MiB" in out, out
