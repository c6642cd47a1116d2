"""The other LRA tasks: Text, Retrieval, Image, Pathfinder (laplax/data/lra/).

* The byte encoding is tfds' ``ByteTextEncoder`` (byte + 1, 0 = padding) and
  the grayscale TensorFlow's ``rgb_to_grayscale`` (closed forms on chosen
  pixels).
* The readers take files written in the release's layouts (AAN ``.tsv``,
  ``pathfinder32/<difficulty>/metadata/*.npy`` and PNGs): tokens equal the
  bytes / pixels written, the splits are the release's 80/10/10, and a
  malformed file is one :class:`DataError` line.
* :class:`DualEncoder` is its tower applied twice plus a head on
  ``[u, v, u * v, u - v]`` (recomputed from the parameters).
* ``configs/nystrom_lra.py`` starts and stops on each fixture (TFDS's
  ``mock_data`` for ``imdb_reviews`` and ``cifar10``), and ``eval.py`` reports.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from laplax.data.errors import DataError
from laplax.data.lra import image, text
from laplax.models import spec as spec_lib
from laplax.models.encoder import DualEncoder, Encoder
from laplax.tasks import sequence_classification

from helpers.runs import ROOT, read_metrics, run_in_process

CONFIG = os.path.join(ROOT, "configs", "nystrom_lra.py")


def test_byte_encoding_and_grayscale():
  ids = text.encode_bytes("a\u00e9\t", 6)
  assert ids.tolist() == [ord("a") + 1, 0xC3 + 1, 0xA9 + 1, 9 + 1, 0, 0]
  assert text.encode_bytes(b"\xff" * 9, 4).tolist() == [256] * 4
  rgb = np.asarray([[[255, 255, 255], [255, 0, 0], [10, 20, 30], [0, 0, 0]]], np.uint8)
  # (0.2989 r + 0.5870 g + 0.1140 b) / 255 * 255.5, truncated
  assert image.grayscale(rgb).tolist() == [[255, 76, 18, 0]]
  assert image.split_bounds(10) == {"train": (0, 8), "val": (8, 9), "test": (9, 10)}
  assert image.split_bounds(7) == {"train": (0, 6), "val": (6, 6), "test": (6, 7)}


def write_aan(path, rows):
  with open(path, "wb") as f:
    for label, a, b in rows:
      f.write(b"\t".join([label, b"id1", b"id2", a, b]) + b"\n")


def test_aan_reader(tmp_path):
  rows = [(b"1.0", b"paper one", b"p\xc3\xa9"), (b"0.0", b"x" * 50, b"")]
  write_aan(tmp_path / "new_aan_pairs.eval.tsv", rows)
  d = text.load_aan(str(tmp_path), "val", 8)
  assert d["label"].tolist() == [1, 0]
  assert d["tokens"][0].tolist() == [b + 1 for b in b"paper on"]
  assert d["tokens2"][0].tolist() == [ord("p") + 1, 0xC4, 0xAA, 0, 0, 0, 0, 0]
  assert d["mask2"][1].sum() == 0 and d["mask"][1].all()
  # cut at data.cut_length, padded to data.max_length (the authors' power of two)
  data = sequence_classification.data_config()
  data.update(name="retrieval", data_dir=str(tmp_path), cut_length=3)
  d = sequence_classification.load_split(data, "val", 8)
  assert d["tokens"][0].tolist() == [b + 1 for b in b"pap"] + [0] * 5
  assert d["mask"].shape == d["tokens2"].shape == (2, 8) and d["mask"][1].sum() == 3
  write_aan(tmp_path / "new_aan_pairs.test.tsv", [(b"2", b"a", b"b")])
  with pytest.raises(DataError, match=r"test.tsv:1: expected") as e:
    text.load_aan(str(tmp_path), "test", 8)
  assert "\n" not in str(e.value)
  (tmp_path / "new_aan_pairs.test.tsv").write_bytes(b"1\ta\tb\n")
  with pytest.raises(DataError, match="not an AAN release file"):
    text.load_aan(str(tmp_path), "test", 8)
  with pytest.raises(DataError, match="missing"):
    text.load_aan(str(tmp_path), "train", 8)


def write_pathfinder(root, n=10, seed=0, difficulty="curv_baseline"):
  """A ``pathfinder32`` release of ``n`` images over metadata files 0, 1 and
  10 (numeric order), plus one empty image; returns the pixels and labels in
  release order."""
  rng = np.random.default_rng(seed)
  base = root / difficulty
  (base / "metadata").mkdir(parents=True)
  (base / "imgs" / "0").mkdir(parents=True)
  pixels, labels, lines = [], [], {0: [], 1: [], 10: []}
  for i in range(n):
    a = rng.integers(0, 256, (32, 32), dtype=np.uint8)
    Image.fromarray(a, mode="L").save(base / "imgs" / "0" / f"sample_{i}.png")
    label = int(rng.integers(0, 2))
    lines[(0, 1, 10)[min(i * 3 // n, 2)]].append(f"imgs/0 sample_{i}.png {i} {label} 14 1.5\n")
    pixels.append(a.reshape(-1))
    labels.append(label)
  (base / "imgs" / "0" / "empty.png").write_bytes(b"")
  lines[1].append("imgs/0 empty.png 99 1 14 1.5\n")
  for k, ls in lines.items():
    (base / "metadata" / f"{k}.npy").write_text("".join(ls))
  return np.stack(pixels), np.asarray(labels)


def test_pathfinder_reader(tmp_path):
  pixels, labels = write_pathfinder(tmp_path, 10)
  d = {s: image.load_pathfinder(str(tmp_path), s) for s in ("train", "val", "test")}
  got = np.concatenate([d[s]["tokens"] for s in d])
  np.testing.assert_array_equal(got, pixels)
  assert np.concatenate([d[s]["label"] for s in d]).tolist() == labels.tolist()
  assert [len(d[s]["label"]) for s in d] == [8, 1, 1]
  mask = np.concatenate([d[s]["mask"] for s in d])
  assert 0 < (~mask).sum() and np.array_equal(mask, pixels != 0)  # the authors' ids != 0
  assert image.load_pathfinder(str(tmp_path), "val", mask_zero=False)["mask"].all()
  meta = tmp_path / "curv_baseline" / "metadata" / "10.npy"
  meta.write_text("imgs/0 sample_0.png 0 7 14\n")
  with pytest.raises(DataError, match=r"10.npy:1: expected") as e:
    image.load_pathfinder(str(tmp_path), "train")
  assert "\n" not in str(e.value)
  meta.write_text("imgs/0 nothing.png 0 1 14\n")
  with pytest.raises(DataError, match="is missing"):
    image.load_pathfinder(str(tmp_path), "train")
  meta.write_text("imgs/0 sample_0.png 0 1 14\n")
  Image.fromarray(np.zeros((16, 16), np.uint8)).save(
    tmp_path / "curv_baseline" / "imgs" / "0" / "sample_0.png"
  )
  with pytest.raises(DataError, match="not 32x32 grayscale"):
    image.load_pathfinder(str(tmp_path), "train")
  with pytest.raises(DataError, match="no Pathfinder metadata"):
    image.load_pathfinder(str(tmp_path), "train", "curv_contour_length_9")


@pytest.mark.slow
def test_dual_encoder_is_the_tower_twice_and_an_nli_head():
  spec = spec_lib.build(
    "encoder",
    width=16,
    depth=1,
    num_heads=2,
    mlp_dim=16,
    vocab_size=20,
    max_length=16,
    classifier_hidden=8,
  )
  rng = np.random.default_rng(0)
  a, b = (jnp.asarray(rng.integers(1, 20, (3, 16)), jnp.int32) for _ in range(2))
  ma = jnp.arange(16)[None] < jnp.asarray([[16], [9], [4]])
  mb = jnp.arange(16)[None] < jnp.asarray([[5], [16], [12]])
  model = DualEncoder(spec, num_classes=2)
  params = model.init(jax.random.key(0), a, b, ma, mb)["params"]
  logits, out = model.apply({"params": params}, a, b, ma, mb)
  tower = Encoder(spec, num_classes=0)
  u, _ = tower.apply({"params": params["encoder"]}, a, ma)
  v, _ = tower.apply({"params": params["encoder"]}, b, mb)
  x = np.concatenate([u, v, u * v, u - v], -1)
  h, o = params["head_hidden"], params["head"]
  want = np.maximum(x @ h["kernel"] + h["bias"], 0) @ o["kernel"] + o["bias"]
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-6)
  assert out["pre_logits"].shape == (3, 64)


# The configs' data, task and attention; one block of width 32 (every layer
# of the configs' two is the same code).
TINY = [
  "--config.model.depth=1",
  "--config.model.width=32",
  "--config.model.mlp_dim=64",
  "--config.total_steps=2",
  "--config.batch_size=4",
  "--config.eval_batch_size=4",
  "--config.log_every=1",
  "--config.eval_every=2",
  "--config.checkpoint_every=2",
]


def train_and_eval(arg, data_dir, workdir, capfd, extra=()):
  argv = ["train.py", "--config", f"{CONFIG}:{arg}", "--workdir", str(workdir)]
  r = run_in_process(argv + [f"--config.data.data_dir={data_dir}", *TINY, *extra], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  losses = [m["loss"] for m in read_metrics(workdir) if "loss" in m]
  assert losses and all(np.isfinite(losses))
  r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "accuracy" in r.stdout + r.stderr


SHORT = ["--config.data.max_length=64", "--config.model.max_length=64"]


@pytest.mark.slow
def test_retrieval_and_pathfinder_configs(tmp_path, capfd):
  rng = np.random.default_rng(1)
  docs = [
    bytes(rng.integers(32, 127, int(rng.integers(10, 90))).astype(np.uint8)) for _ in range(24)
  ]
  for split in ("train", "eval", "test"):
    rows = [(b"%d.0" % (i % 2), docs[i], docs[-i - 1]) for i in range(12)]
    write_aan(tmp_path / f"new_aan_pairs.{split}.tsv", rows)
  train_and_eval(
    "task=retrieval,size=cpu,laplacian=1,spectral=10.0", tmp_path, tmp_path / "r", capfd, SHORT
  )
  pf = tmp_path / "pathfinder32"
  write_pathfinder(pf, 40, difficulty="curv_contour_length_14")  # the config's default
  train_and_eval(
    "task=pathfinder,size=cpu,attention=softmax,laplacian=1", pf, tmp_path / "p", capfd
  )


@pytest.mark.slow
def test_text_and_image_configs_on_mock_tfds(tmp_path, capfd):
  with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
    train_and_eval(
      "task=text,size=cpu,laplacian=1", tmp_path / "tfds", tmp_path / "t", capfd, SHORT
    )
    train_and_eval("task=image,size=cpu", tmp_path / "tfds", tmp_path / "i", capfd)


def test_tfds_not_prepared_is_one_line(tmp_path):
  with pytest.raises(DataError, match="tfds build imdb_reviews") as e:
    text.load_imdb(str(tmp_path), "train", 16)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder"])
def test_every_lra_config_validates(task):
  from laplax import tasks

  from helpers.configs import load

  for size in ("full", "cpu"):
    for attention in ("nystrom", "softmax"):
      c = load("nystrom_lra", f"task={task},size={size},attention={attention}")
      tasks.validate(c)
      n = c.data.max_length
      assert n & (n - 1) == 0  # a power of two, as the authors pad
      if attention == "nystrom":
        assert n % c.model.num_landmarks == 0


def test_lra_configs_have_the_authors_settings():
  """Text 1,000 bytes in 1,024 positions (``LRA/datasets/text.py``) and a
  4,096-row position table; torch's OneCycleLR, eps 1e-6; Pathfinder's hard
  difficulty; zero pixels masked and ListOps' brackets as tokens (new runs;
  runs saved before those keys read the old behaviour)."""
  from laplax.tasks import schema

  from helpers.configs import load

  c = load("nystrom_lra", "task=text")
  assert (c.data.cut_length, c.data.max_length, c.model.max_length) == (1000, 1024, 4096)
  c = load("nystrom_lra", "task=text,text_length=4000")
  assert (c.data.cut_length, c.data.max_length, c.model.max_length) == (4000, 4096, 4096)
  c = load("nystrom_lra", "task=retrieval")
  assert (c.data.cut_length, c.data.max_length, c.model.max_length) == (4000, 4096, 4096)
  for arg in ("task=listops", "task=image,size=cpu", "task=pathfinder"):
    c = load("nystrom_lra", arg)
    assert (c.optim.schedule, c.optim.eps, c.optim.weight_decay) == ("onecycle", 1e-6, 0.0)
    assert c.data.mask_zero_pixels and c.data.listops_closers
  assert load("nystrom_lra", "task=pathfinder").data.task_name == "curv_contour_length_14"
  c = load("nystrom_lra", "task=pathfinder,difficulty=curv_baseline")
  assert c.data.task_name == "curv_baseline"
  with pytest.raises(ValueError, match="difficulty must be one of"):
    load("nystrom_lra", "task=pathfinder,difficulty=hard")
  old = c.to_dict()
  del old["data"]["mask_zero_pixels"], old["data"]["listops_closers"], old["optim"]["eps"]
  old = schema.complete(ml_collections.ConfigDict(old))
  assert not old.data.mask_zero_pixels and not old.data.listops_closers
  assert old.optim.eps == 1e-8  # what make_optimizer read for a config without the key
