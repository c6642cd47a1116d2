"""Memory options: gradient accumulation, rematerialisation, scan over layers.

Each option must leave the numbers as they are: one step with micro-batches
equals one step on the whole batch, remat gives the same loss and gradients,
and a scanned model with the unscanned parameters restacked gives the same
logits (also through the KV cache). Tiny models, float32.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.config import validation as config_lib
from laplax.config.defaults import base_config
from laplax.train import loop

from helpers.configs import load
from helpers.models import make_gpt, make_vit
from helpers.tasks import gpt_task, vit_task


def restack(params, depth):
  """Unscanned ``block{i}`` parameters -> the scanned layout ``blocks [depth, ...]``."""
  params = dict(params)
  blocks = [params.pop(f"block{i}") for i in range(depth)]
  params["blocks"] = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *blocks)
  return params


def init(model, x):
  """Parameters of ``model`` for input ``x`` (jitted: eager init is slow)."""
  return jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]


def forward(model, params, x):
  return jax.jit(model.apply)({"params": params}, x)


def assert_trees_close(a, b, atol, scaled=False):
  """Leafwise ``|a - b| <= atol + atol |b|``; ``scaled``: ``atol`` times each
  leaf's largest ``|b|`` (an error relative to the tensor's scale)."""

  def check(x, y):
    tol = atol * max(float(np.abs(y).max()), 1.0) if scaled else atol
    np.testing.assert_allclose(x, y, atol=tol, rtol=atol)

  jax.tree_util.tree_map(check, a, b)


# --------------------------------------------------------------------------
# Gradient accumulation.


@pytest.mark.slow
@pytest.mark.parametrize("make", [vit_task, gpt_task], ids=["vit", "gpt_scan_remat"])
def test_grad_accumulation_equals_one_batch(make):
  """Two steps (the ViT head starts at 0, so only the second step reaches the
  blocks) with 4 micro-batches equal two steps on the whole batch. Plain SGD:
  the parameters then show the mean gradient itself. (Adam's first step
  would turn the rounding noise of gradients that are exactly 0 in exact
  arithmetic -- key biases, the value biases of Laplacian heads -- into
  updates of order lr * noise / eps.)"""
  c, build, batch = make()
  c.total_steps = 10
  tx = optax.sgd(0.1)
  task = build()
  start = jax.jit(lambda: state_lib.init_state(task, tx, 0))()
  results = []
  for accum, unroll in ((1, False), (4, False), (4, True)):
    c.optim.grad_accum_steps, c.optim.grad_accum_unroll = accum, unroll
    tasks.validate(c)
    state = start
    step = jax.jit(loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, 10)))
    metrics = []
    for _ in range(2):
      state, m = step(state, batch)
      metrics.append(m)
    results.append((state, metrics))
  (one, m1), (four, m4), (unrolled, mu) = results
  for a, b in zip(m1, m4):
    for key in a:
      assert float(b[key]) == pytest.approx(float(a[key]), rel=1e-5, abs=1e-7), key
  assert_trees_close(four.params, one.params, 1e-5)
  # Unrolled: the same micro-batch sums in the same order as the rolled loop.
  for a, b in zip(m4, mu):
    for key in a:
      assert float(b[key]) == pytest.approx(float(a[key]), rel=1e-6, abs=1e-8), key
  assert_trees_close(unrolled.params, four.params, 1e-6)


@pytest.mark.slow
def test_grad_accumulation_dino_splits_the_batch_axis_and_keeps_the_centre():
  """DINO's batch is the second axis of its views; the averaged aux (teacher
  logits) gives the same centre, the update the same student and teacher."""
  c = load("dino_fashion_mnist")
  c.model.update(width=32, depth=1, num_heads=2, mlp_dim=32, num_laplacian_heads=1, drop_path=0.0)
  c.dino.update(out_dim=32, hidden_dim=16, bottleneck_dim=8)
  c.data.multicrop.num_local = 0  # the 2 global views only
  c.batch_size, c.total_steps, c.optim.warmup_steps = 4, 10, 0
  task = tasks.DINOTask(c, 10, (28, 28, 1))
  rng = np.random.default_rng(0)
  batch = {
    k: rng.standard_normal(v.shape).astype(np.float32) for k, v in task.batch_spec(4).items()
  }  # [views, 4, H, W, C]
  tx = optax.sgd(1e-3)  # see test_grad_accumulation_equals_one_batch; the class
  # token gets gradients of ~1e3 (its init is ~1e-6, then a LayerNorm)
  state = jax.jit(lambda: state_lib.init_state(task, tx, 0))()
  out = []
  for accum in (1, 2):
    step = jax.jit(
      loop.make_train_step(
        task, tx, optim.learning_rate_schedule(c.optim, 10), grad_accum_steps=accum
      )
    )
    out.append(step(state, batch))
  (one, m1), (two, m2) = out
  assert float(m2["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-5)
  assert_trees_close(two.params, one.params, 1e-5)
  assert_trees_close(two.task_state, one.task_state, 1e-5)  # teacher and centre


def test_micro_batches_are_strided_and_reject_indivisible():
  x = np.arange(12).reshape(2, 6)  # axis 1 is the batch
  mb = loop.micro_batches({"x": x}, 3, axis=1)["x"]
  assert mb.shape == (3, 2, 2)
  np.testing.assert_array_equal(mb[1], [[1, 4], [7, 10]])
  with pytest.raises(ValueError, match="micro-batches"):
    loop.micro_batches({"x": x}, 4, axis=1)


# --------------------------------------------------------------------------
# Rematerialisation and scan.


def tiny_vit(depth=3, **kw):
  return make_vit(
    num_classes=5,
    patch_size=4,
    width=32,
    depth=depth,
    mlp_dim=32,
    num_heads=4,
    num_laplacian_heads=(1, 4, 0)[:depth],
    spectral_lam=10.0,
    layerscale_init=0.1,
    head_init_zero=False,
    **kw,
  )


def tiny_gpt(depth=3, **kw):
  return make_gpt(
    vocab_size=40,
    max_length=10,
    width=32,
    depth=depth,
    num_heads=4,
    mlp_dim=32,
    num_laplacian_heads=(0, 2, 4)[:depth],
    spectral_lam=10.0,
    posemb="rope",
    qk_norm=True,
    **kw,
  )


IMAGES = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 8, 1))
TOKENS = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, 40)


@pytest.mark.slow
@pytest.mark.parametrize(
  "family,remat", [("vit", "full"), ("gpt", "dots_with_no_batch_dims_saveable")]
)
def test_remat_same_loss_gradients_and_parameter_names(family, remat):
  make, x = (tiny_vit, IMAGES) if family == "vit" else (tiny_gpt, TOKENS)
  plain, rematted = make(depth=2), make(depth=2, remat=remat)
  params = init(plain, x)
  shapes = jax.eval_shape(rematted.init, jax.random.PRNGKey(0), x)["params"]
  assert jax.tree_util.tree_map(lambda a: a.shape, shapes) == jax.tree_util.tree_map(
    lambda a: a.shape, params
  )

  def loss(model, p):
    logits, _ = model.apply({"params": p}, x, train=True)
    return jnp.mean(logits**2)

  v0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(plain, p)))(params)
  v1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(rematted, p)))(params)
  assert float(v1) == pytest.approx(float(v0), rel=1e-6)
  # The recomputed forward fuses and sums in another order: a float32 kernel
  # gradient whose entries reach 3e4 differs by ~1e-6 of that scale.
  assert_trees_close(g1, g0, 1e-5, scaled=True)


@pytest.mark.slow
def test_scanned_vit_same_logits_with_mixed_heads_and_spectral():
  """Per-layer head mixes (1, 4, 0 of 4) and drop-path rates (0, 0.1, 0.2)
  are scanned inputs."""
  plain = tiny_vit(drop_path=0.2)
  scanned = tiny_vit(drop_path=0.2, scan_layers=True, remat="full")
  params = init(plain, IMAGES)
  shapes = jax.eval_shape(scanned.init, jax.random.PRNGKey(0), IMAGES)["params"]
  stacked = restack(params, 3)
  assert jax.tree_util.tree_map(lambda a: a.shape, stacked) == jax.tree_util.tree_map(
    lambda a: a.shape, shapes
  )
  a, out_a = forward(plain, params, IMAGES)
  b, out_b = forward(scanned, stacked, IMAGES)
  np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out_b["block1"]["sa"], out_a["block1"]["sa"], atol=1e-5)
  # Drop-path in training runs per layer under scan (random, but finite).
  b, _ = jax.jit(
    lambda p: scanned.apply(
      {"params": p}, IMAGES, train=True, rngs={"dropout": jax.random.PRNGKey(3)}
    )
  )(stacked)
  assert np.isfinite(np.asarray(b)).all()


@pytest.mark.slow
def test_scanned_gpt_same_logits_and_kv_cache():
  plain, scanned = tiny_gpt(), tiny_gpt(scan_layers=True)
  params = init(plain, TOKENS)
  stacked = restack(params, 3)
  full, _ = forward(plain, params, TOKENS)
  np.testing.assert_allclose(forward(scanned, stacked, TOKENS)[0], full, atol=1e-5, rtol=1e-5)
  # The KV cache is scanned too: prefill, then the rest.
  cache = jax.jit(lambda: scanned.init(jax.random.PRNGKey(0), TOKENS, decode=True))()["cache"]
  assert cache["blocks"]["attention"]["cached_key"].shape == (3, 2, 10, 4, 8)
  decode = jax.jit(
    lambda c, t: scanned.apply({"params": stacked, "cache": c}, t, decode=True, mutable=["cache"])
  )
  pieces = []
  for lo, hi in ((0, 5), (5, 10)):
    (logits, _), upd = decode(cache, TOKENS[:, lo:hi])
    cache = upd["cache"]
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=1e-5, rtol=1e-5)


def test_weight_decay_mask_ignores_the_layer_axis():
  shapes = lambda m: jax.eval_shape(m.init, jax.random.PRNGKey(0), IMAGES)["params"]
  mask = optim.decay_mask(shapes(tiny_vit()), ("pos_embedding", "cls"))
  scanned = optim.decay_mask(shapes(tiny_vit(scan_layers=True)), ("pos_embedding", "cls"))
  expected = {k: v for k, v in mask.items() if not k.startswith("block")}
  expected["blocks"] = mask["block0"]  # kernels decay, biases and scales do not
  assert scanned == expected
  assert scanned["blocks"]["attention"]["query"] == {"kernel": True, "bias": False}


# --------------------------------------------------------------------------
# Config keys.


@pytest.mark.parametrize(
  "key,value,fragment",
  [
    ("model.remat", "some", "model.remat"),
    ("model.scan_layers", 1, "model.scan_layers"),
    ("optim.grad_accum_steps", 0, "optim.grad_accum_steps"),
    ("optim.grad_accum_steps", 3, "not divisible"),
    ("optim.grad_accum_unroll", "yes", "optim.grad_accum_unroll"),
  ],
)
def test_validate_rejects_memory_keys_with_one_line(key, value, fragment):
  c = base_config()
  section, name = key.split(".")
  del c[section][name]  # a config file may give any type
  c[section][name] = value
  with pytest.raises(config_lib.ConfigError) as e:
    tasks.validate(c)
  assert fragment in str(e.value) and "\n" not in str(e.value)


def test_remat_is_not_architecture_scan_is_and_old_runs_resume():
  saved = base_config().to_dict()
  other = base_config()
  other.model.remat = "full"
  other.optim.grad_accum_steps = 4
  assert config_lib.architecture_diff(saved, other) == []
  other.model.scan_layers = True
  assert config_lib.architecture_diff(saved, other) == ["model.scan_layers"]
  # A run saved before these keys existed resumes under the default config.
  del saved["model"]["scan_layers"], saved["model"]["remat"]
  del saved["optim"]["grad_accum_steps"]
  assert config_lib.architecture_diff(saved, base_config()) == []


@pytest.mark.slow
@pytest.mark.parametrize("make", [vit_task, gpt_task], ids=["vit", "gpt_scan_traced_mask"])
def test_train_step_traces_once_for_many_steps(make):
  """``chex.assert_max_traces``: a run of many steps compiles the step once,
  also with scanned layers whose Laplacian heads differ per layer (the mask
  [depth, heads] is a traced scanned input; gpt_task's (0, 2, 4))."""
  c, build, batch = make()
  c.total_steps = 10
  task = build()
  tx = optim.make_optimizer(c)
  state = jax.jit(lambda: state_lib.init_state(task, tx, 0))()
  chex.clear_trace_counter()
  step = jax.jit(
    chex.assert_max_traces(
      loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, 10)), n=1
    )
  )
  for _ in range(4):
    state, metrics = step(state, batch)
  assert int(state.step) == 4 and np.isfinite(float(metrics["loss"]))
