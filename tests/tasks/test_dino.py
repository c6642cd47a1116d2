"""DINO: head, loss, centre/teacher updates and schedules against their closed forms;
the task's train step (frozen last layer, EMA), the collapse monitor, bad input
and the ViT-S/16 ImageNet config (the bitwise resume of teacher and centre is in
test_resume.py)."""

import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.models import dino
from laplax.train import loop

from helpers.configs import load
from helpers.dino import DINO_CONFIG, dino_args
from helpers.models import make_vit
from helpers.runs import read_metrics, run_in_process

# --------------------------------------------------------------------------
# The method's pieces against their closed forms.


def softmax(x, axis=-1):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def test_head_matches_formula_and_last_layer_is_weight_normalised():
  head = dino.DINOHead(out_dim=7, hidden_dim=5, bottleneck_dim=4, num_layers=3)
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 6))
  params = head.init(jax.random.PRNGKey(1), x)["params"]
  # Scaling the raw last-layer kernel changes nothing: its column norms are fixed to 1.
  scaled = jax.tree_util.tree_map(lambda a: a, params)
  scaled["last_layer"] = params["last_layer"] * 3.0
  out = np.asarray(head.apply({"params": params}, x))
  np.testing.assert_allclose(head.apply({"params": scaled}, x), out, rtol=1e-5, atol=1e-6)

  p = jax.tree_util.tree_map(np.asarray, params)
  h = np.asarray(x, np.float64)
  for i in range(3):
    h = h @ p[f"mlp{i}"]["kernel"] + p[f"mlp{i}"]["bias"]
    if i < 2:
      h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
  h = h / np.linalg.norm(h, axis=-1, keepdims=True)
  w = p["last_layer"] / np.linalg.norm(p["last_layer"], axis=0, keepdims=True)
  np.testing.assert_allclose(out, h @ w, rtol=1e-4, atol=1e-5)
  assert np.all(np.abs(out) <= 1 + 1e-5)  # unit vector times unit columns


def test_dino_loss_equals_numpy_reference_over_pairs_of_different_views():
  rng = np.random.default_rng(0)
  g, v, b, k = 2, 5, 3, 11
  s = rng.standard_normal((v, b, k)).astype(np.float32)
  t = rng.standard_normal((g, b, k)).astype(np.float32)
  c = rng.standard_normal(k).astype(np.float32) * 0.1
  loss = dino.dino_loss(
    jnp.asarray(s), jnp.asarray(t), jnp.asarray(c), student_temp=0.1, teacher_temp=0.04
  )
  q = softmax((t - c) / 0.04)
  logp = np.log(softmax(s / 0.1))
  terms = [-(q[i] * logp[j]).sum(-1).mean() for i in range(g) for j in range(v) if i != j]
  assert len(terms) == 2 * v - 2
  np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)
  # No gradient flows into the teacher.
  grad_t = jax.grad(
    lambda t_: dino.dino_loss(
      jnp.asarray(s), t_, jnp.asarray(c), student_temp=0.1, teacher_temp=0.04
    )
  )(jnp.asarray(t))
  assert float(jnp.abs(grad_t).max()) == 0.0
  with pytest.raises(ValueError, match="views"):
    dino.dino_loss(
      jnp.asarray(s[:1]), jnp.asarray(t[:1]), jnp.asarray(c), student_temp=0.1, teacher_temp=0.04
    )


def test_center_and_teacher_updates_are_emas():
  rng = np.random.default_rng(1)
  c = rng.standard_normal(6).astype(np.float32)
  t = rng.standard_normal((2, 4, 6)).astype(np.float32)
  np.testing.assert_allclose(
    dino.update_center(jnp.asarray(c), jnp.asarray(t), 0.9),
    0.9 * c + 0.1 * t.reshape(-1, 6).mean(0),
    rtol=1e-6,
  )
  teacher = {"a": np.ones(3, np.float32), "b": {"c": np.zeros(2, np.float32)}}
  student = {"a": np.full(3, 3.0, np.float32), "b": {"c": np.full(2, -1.0, np.float32)}}
  out = dino.update_teacher(teacher, student, 0.75)
  np.testing.assert_allclose(out["a"], 0.75 * 1 + 0.25 * 3)
  np.testing.assert_allclose(out["b"]["c"], -0.25)


def test_schedules_follow_their_closed_forms():
  total = 100
  ramp = optim.cosine_ramp(0.996, 1.0, total)
  for t in (0, 10, 50, 77, 100, 150):
    expected = 1.0 - (1.0 - 0.996) * (1 + math.cos(math.pi * min(t, total) / total)) / 2
    assert float(ramp(t)) == pytest.approx(expected, abs=1e-7)
  c = load("dino_fashion_mnist")
  c.total_steps = total
  wd = optim.weight_decay_schedule(c.optim, total)
  for t in (0, 25, 50, 100):
    expected = 0.4 + (0.04 - 0.4) * (1 + math.cos(math.pi * t / total)) / 2
    assert float(wd(t)) == pytest.approx(expected, abs=1e-7)
  # The optimizer really applies wd(t): with zero gradients AdamW's update is
  # -lr(t) * wd(t) * p on decayed tensors.
  c.optim.grad_clip = None
  tx = optim.make_optimizer(c)
  params = {"kernel": jnp.ones((2, 2))}
  state = tx.init(params)
  lr = optim.learning_rate_schedule(c.optim, total)
  for t in range(3):
    updates, state = tx.update({"kernel": jnp.zeros((2, 2))}, state, params)
    np.testing.assert_allclose(updates["kernel"], -float(lr(t)) * float(wd(t)), rtol=1e-5)


@pytest.mark.slow
def test_posemb_is_resized_for_smaller_crops():
  vit = make_vit(
    num_classes=0, patch_size=7, width=16, depth=1, mlp_dim=16, num_heads=2, posemb_grid=(4, 4)
  )
  params = vit.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  assert params["pos_embedding"].shape == (1, 16, 16)
  feats, _ = vit.apply({"params": params}, jnp.ones((2, 14, 14, 1)))
  assert feats.shape == (2, 16) and np.all(np.isfinite(feats))
  # An embedding constant over positions resizes to the same constant: with a
  # block whose parameters are all zero (an identity: both branches output 0)
  # and zero images, every encoded patch token is LayerNorm(pos).
  vit0 = make_vit(
    num_classes=0, patch_size=7, width=16, depth=1, mlp_dim=16, num_heads=2, posemb_grid=(4, 4)
  )
  params0 = vit0.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  row = jnp.linspace(-1.0, 1.0, 16)
  params0 = dict(
    params0,
    pos_embedding=jnp.tile(row, (1, 16, 1)),
    block0=jax.tree_util.tree_map(jnp.zeros_like, params0["block0"]),
    embedding={"kernel": jnp.zeros_like(params0["embedding"]["kernel"]), "bias": jnp.zeros(16)},
  )
  _, small = vit0.apply({"params": params0}, jnp.zeros((1, 14, 14, 1)))
  _, big = vit0.apply({"params": params0}, jnp.zeros((1, 28, 28, 1)))
  assert small["encoded"].shape == (1, 5, 16) and big["encoded"].shape == (1, 17, 16)
  np.testing.assert_allclose(small["encoded"][0, 1:], big["encoded"][0, 1:5], atol=1e-4)
  # A learned embedding is interpolated, not cropped: the 2x2 grid is not the
  # top-left 2x2 of the 4x4 one.
  pos = params["pos_embedding"].reshape(4, 4, 16)
  resized = jax.image.resize(pos, (2, 2, 16), method="bicubic", antialias=False)
  assert not np.allclose(resized, pos[:2, :2])


def test_collapse_statistics_and_monitor():
  k = 64
  s = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, k)), jnp.float32)
  uniform = dino.collapse_statistics(
    s, jnp.zeros((2, 8, k)), jnp.zeros(k), student_temp=0.1, teacher_temp=0.07
  )
  assert float(uniform["teacher_entropy"]) == pytest.approx(math.log(k), rel=1e-5)
  stats = {key: float(v) for key, v in uniform.items()}
  assert dino.collapsed(stats, k) == "uniform"
  # Every example on dimension 0, student agreeing: one-dimension collapse, KL ~ 0.
  t = jnp.zeros((2, 8, k)).at[..., 0].set(10.0)
  s1 = jnp.zeros((4, 8, k)).at[..., 0].set(10.0)
  one = {
    key: float(v)
    for key, v in dino.collapse_statistics(
      s1, t, jnp.zeros(k), student_temp=0.01, teacher_temp=0.01
    ).items()
  }
  assert one["teacher_marginal_entropy"] < 1e-3 and one["kl_teacher_student"] < 1e-6
  assert dino.collapsed(one, k) == "one dimension"
  # Distinct sharp targets per example: healthy.
  t2 = jnp.asarray(np.eye(k)[np.arange(16) % k].reshape(2, 8, k) * 10, jnp.float32)
  healthy = {
    key: float(v)
    for key, v in dino.collapse_statistics(
      s, t2, jnp.zeros(k), student_temp=0.1, teacher_temp=0.07
    ).items()
  }
  assert dino.collapsed(healthy, k) is None
  # KL against the direct formula.
  q = softmax(np.asarray(t2) / 0.07)
  logp = np.log(softmax(np.asarray(s) / 0.1))
  kls = [
    ((q[i] * (np.log(np.maximum(q[i], 1e-30)) - logp[j])).sum(-1)).mean()
    for i in range(2)
    for j in range(4)
    if i != j
  ]
  assert healthy["kl_teacher_student"] == pytest.approx(np.mean(kls), rel=1e-4)


# --------------------------------------------------------------------------
# The task's train step.


def tiny_task(**dino_overrides):
  c = load("dino_fashion_mnist")
  c.model.update(width=32, depth=1, num_heads=2, mlp_dim=32, num_laplacian_heads=1)
  c.dino.update(
    out_dim=32,
    hidden_dim=16,
    bottleneck_dim=8,
    freeze_last_layer_steps=2,
    warmup_teacher_temp=0.04,
    teacher_temp=0.07,
    warmup_teacher_temp_steps=200,
    **dino_overrides,
  )
  c.data.multicrop.num_local = 2
  c.batch_size = 4
  c.total_steps = 10
  tasks.validate(c)
  return c, tasks.DINOTask(c, 10, (28, 28, 1))


def synthetic_batch(task, seed=0):
  rng = np.random.default_rng(seed)
  spec = task.batch_spec(task.config.batch_size)
  return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in spec.items()}


@pytest.mark.slow
def test_train_step_freezes_last_layer_then_updates_teacher_and_center():
  c, task = tiny_task()
  tx = optim.make_optimizer(c)
  state = jax.jit(lambda: state_lib.init_state(task, tx, 0))()
  chex.assert_trees_all_equal(state.params, state.task_state["teacher"])
  step = jax.jit(loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, 10)))
  lasts = [np.asarray(state.params["head"]["last_layer"])]
  for i in range(4):
    batch = synthetic_batch(task, i)
    old = state
    teacher_logits, _ = task.teacher.apply({"params": old.task_state["teacher"]}, batch["global"])
    state, metrics = step(state, batch)
    lasts.append(np.asarray(state.params["head"]["last_layer"]))
    # Teacher: EMA of the updated student with the cosine momentum of this step.
    m = float(task.momentum(i))
    expected = jax.tree_util.tree_map(
      lambda t, s, m=m: m * t + (1 - m) * s, old.task_state["teacher"], state.params
    )
    chex.assert_trees_all_close(state.task_state["teacher"], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
      state.task_state["center"],
      0.9 * np.asarray(old.task_state["center"])
      + 0.1 * np.asarray(teacher_logits).reshape(-1, 32).mean(0),
      rtol=1e-5,
      atol=1e-6,
    )
    assert float(metrics["teacher_temp"]) == pytest.approx(0.04 + 0.03 * min(i, 200) / 200)
  # Frozen for steps 0 and 1 (step 0 also has learning rate 0), free afterwards.
  np.testing.assert_array_equal(lasts[0], lasts[1])
  np.testing.assert_array_equal(lasts[1], lasts[2])
  assert not np.array_equal(lasts[2], lasts[3])


# --------------------------------------------------------------------------
# Through train.py and eval.py on real Fashion-MNIST.


@pytest.mark.slow
def test_dino_train_eval_and_init_checkpoint(tmp_path, fmnist_data_dir, capfd):
  init = tmp_path / "init"
  r = run_in_process(dino_args(init, fmnist_data_dir, "--config.total_steps=0"), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert (init / "checkpoints" / "0").exists()
  r = run_in_process(["eval.py", "--workdir", str(init)], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((init / "eval.json").read_text())
  assert result["step"] == 0 and result["num_examples"] == 1000
  assert 0.1 < result["knn_accuracy"] <= 1.0
  # Raw-pixel k-NN against NumPy: cosine similarity of the normalised pixels,
  # the 20 nearest vote with weight exp(sim / 0.07).
  from laplax.data.vision import images

  data = images.default_config()
  data.data_dir = fmnist_data_dir
  pix = {}
  for split in ("train[:3000]", "test[:1000]"):
    batches = list(images.eval_batches(data, batch_size=1000, split=split))
    pix[split] = (
      np.concatenate([b["image"].reshape(len(b["image"]), -1) for b in batches]),
      np.concatenate([b["label"] for b in batches]),
    )
  (xtr, ytr), (xte, yte) = pix["train[:3000]"], pix["test[:1000]"]
  xtr = xtr / np.linalg.norm(xtr, axis=1, keepdims=True)
  xte = xte / np.linalg.norm(xte, axis=1, keepdims=True)
  sims = xte @ xtr.T
  top = np.argsort(-sims, axis=1)[:, :20]
  votes = np.zeros((len(xte), 10))
  for i in range(len(xte)):
    np.add.at(votes[i], ytr[top[i]], np.exp(sims[i, top[i]] / 0.07))
  expected = float(np.mean(votes.argmax(1) == yte))
  assert result["raw_pixel_knn_accuracy"] == pytest.approx(expected, abs=0.003)
  assert 0.7 < expected < 0.9
  assert (init / "patch_pca.png").exists()
  # The linear segmentation probe on Fashion-MNIST canvases at 28 px (11
  # classes, most pixels background) and its picture.
  assert result["segmentation_dataset"] == "fashion_canvases"
  assert 0.0 <= result["segmentation_miou"] <= 1.0
  assert 1 / 11 < result["segmentation_pixel_accuracy"] <= 1.0
  assert (init / "segmentation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "linear segmentation probe on fashion_canvases" in r.stdout
  # Both pictures are also images of the run's TensorBoard events, byte for byte.
  assert tensorboard_images(init) == {
    "patch_pca": (0, (init / "patch_pca.png").read_bytes()),
    "segmentation": (0, (init / "segmentation.png").read_bytes()),
  }

  workdir = tmp_path / "run"
  r = run_in_process(
    dino_args(
      workdir,
      fmnist_data_dir,
      "--config.total_steps=6",
      "--config.eval_every=6",
      "--config.checkpoint_every=3",
      "--config.evals=knn,raw_pixel_knn,patch_pca",
    ),
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  records = read_metrics(workdir)
  train = [x for x in records if x["split"] == "train"]
  assert [x["step"] for x in train] == [2, 4, 6]
  for key in (
    "loss",
    "teacher_entropy",
    "kl_teacher_student",
    "teacher_temp",
    "teacher_momentum",
    "weight_decay",
  ):
    assert all(np.isfinite(x[key]) for x in train), key
  final = [x for x in records if x["split"] == "eval"][-1]
  r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["step"] == 6
  assert result["knn_accuracy"] == pytest.approx(final["knn_accuracy"], abs=1e-9)
  assert "segmentation_miou" not in result and not (workdir / "segmentation.png").exists()
  assert tensorboard_images(workdir) == {"patch_pca": (6, (workdir / "patch_pca.png").read_bytes())}


def tensorboard_images(workdir):
  """``{tag: (step, PNG bytes)}`` of the images in the run's TensorBoard events."""
  from helpers.events import read_events

  return {
    v.tag: (step, v.image.encoded_image_string)
    for step, v in read_events(workdir)
    if v.WhichOneof("value") == "image"
  }


@pytest.mark.slow
def test_collapse_is_flagged_with_a_uniform_teacher(tmp_path, fmnist_data_dir, capfd):
  workdir = tmp_path / "hot"
  r = run_in_process(
    dino_args(
      workdir,
      fmnist_data_dir,
      "--config.total_steps=4",
      "--config.eval_every=100",
      "--config.dino.warmup_teacher_temp=100.0",
      "--config.dino.teacher_temp=100.0",
    ),
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "collapsed (uniform)" in r.stderr + r.stdout


@pytest.mark.parametrize(
  "flag,fragment",
  [
    ("--config.data.multicrop.local_size=35", "larger than global_size"),
    ("--config.data.multicrop.num_global=0", "num_global=0"),
    ("--config.dino.out_dim=1", "out_dim=1"),
    ("--config.data.multicrop.local_scale=(0.5,0.1)", "local_scale"),
    ("--config.model.pool=gap", "class token"),
  ],
)
def test_bad_dino_input_one_line_exit_2(tmp_path, fragment, flag, capfd):
  workdir = tmp_path / "bad"
  r = run_in_process(["train.py", "--config", DINO_CONFIG, "--workdir", str(workdir), flag], capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and fragment in lines[0], r.stderr
  assert not workdir.exists()


@pytest.mark.slow
def test_dino_vits16_imagenet_builds_and_lowers_one_step():
  c = load("dino_vits16_imagenet")
  tasks.validate(c)
  assert c.model.num_laplacian_heads == 5 and c.model.num_heads == 6
  assert (c.model.width, c.model.depth, c.model.patch_size) == (384, 12, 16)
  mc = c.data.multicrop
  assert (mc.num_global, mc.num_local, mc.global_size, mc.local_size) == (2, 10, 224, 96)
  c.batch_size = 1
  c.data.multicrop.num_local = 2  # one step at tiny batch: 2 global + 2 local crops
  task = tasks.DINOTask(c, 1000, (224, 224, 3))
  tx = optim.make_optimizer(c)
  abstract = state_lib.abstract_state(task, tx, 0)
  n = sum(x.size for x in jax.tree_util.tree_leaves(abstract.params["backbone"]))
  # ViT-S/16 without classifier: 21,665,664 with a 197-token position embedding;
  # here the embedding covers the 196 patches only.
  assert n == 21_665_664 - 384
  head = sum(x.size for x in jax.tree_util.tree_leaves(abstract.params["head"]))
  assert head == (384 * 2048 + 2048) + (2048 * 2048 + 2048) + (2048 * 256 + 256) + 256 * 65536
  # Traced and lowered on abstract arrays (shapes only; the tiny DINO runs
  # real steps above, and test_configs compiles a paper-scale ViT-B step).
  step = jax.jit(
    loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, c.total_steps))
  )
  batch = {
    k: jax.ShapeDtypeStruct(v.shape, jnp.float32) for k, v in task.batch_spec(c.batch_size).items()
  }
  out_state, metrics = step.lower(abstract, batch).out_info
  shapes = lambda t: [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(t)]
  assert shapes(out_state) == shapes(abstract)
  assert metrics["loss"].shape == () and metrics["grad_norm"].shape == ()
