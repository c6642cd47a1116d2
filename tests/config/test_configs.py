"""Config files, validation, optimizer: build the paper-scale configs and run one step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.config import validation as config_lib
from laplax.config.defaults import base_config, parse_arg
from laplax.tasks import classification
from laplax.train import loop

from helpers.configs import load


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,arg,image_shape,num_classes,compile_step",
  [
    ("deit3_imagenet", "laplacian=12,spectral=True", (192, 192, 3), 1000, True),
    ("deit3_cifar", "laplacian=6,spectral=True", (224, 224, 3), 100, False),
  ],
)
def test_paper_scale_config_builds_and_compiles_one_step(
  name, arg, image_shape, num_classes, compile_step
):
  """The ViT-B/16 configs build with the paper's parameter count, and their
  train step at batch 2 traces and lowers on abstract arrays (shapes only);
  the ImageNet one's is also compiled. The CIFAR one has the same blocks at
  224 px and 100 classes, so its compile would repeat the ImageNet one's."""
  c = load(name, arg)
  tasks.validate(c)
  assert (c.model.width, c.model.depth, c.model.num_heads, c.model.patch_size) == (768, 12, 12, 16)
  assert c.model.spectral.enabled and c.model.qk_norm and c.model.layerscale_init == 1e-6
  assert c.loss.type == "sigmoid" and c.model.dtype == "bfloat16"
  c.batch_size = 2
  task = tasks.ClassificationTask(c, num_classes, image_shape)
  tx = optim.make_optimizer(c)
  abstract = state_lib.abstract_state(task, tx, 0)
  n = sum(x.size for x in jax.tree_util.tree_leaves(abstract.params))
  # ViT-B/16 is 86,567,656 parameters at 224 px with a 1000-way head and a
  # 197-token position embedding; without those two: 85,647,360. This model
  # adds qk-norm (12 x 2 x 128) and LayerScale (12 x 2 x 768), and its
  # position embedding covers the patches only.
  expected = (
    85_647_360
    + 12 * 2 * 128
    + 12 * 2 * 768
    + (image_shape[0] // 16) ** 2 * 768
    + 768 * num_classes
    + num_classes
  )
  assert n == expected
  step = jax.jit(
    loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, c.total_steps))
  )
  batch = {
    "image": jax.ShapeDtypeStruct((2,) + image_shape, jnp.float32),
    "label": jax.ShapeDtypeStruct((2,), jnp.int32),
  }
  lowered = step.lower(abstract, batch)
  # XLA's fusion emitters, which conftest.py turns off for the suite's small
  # programs, compile this large one faster (34 instead of 58 s).
  out_state, metrics = (
    lowered.compile({"xla_cpu_use_fusion_emitters": True}).out_info
    if compile_step
    else lowered.out_info
  )
  shapes = lambda t: [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(t)]
  assert jax.tree_util.tree_structure(out_state) == jax.tree_util.tree_structure(abstract)
  assert shapes(out_state) == shapes(abstract)
  assert metrics["loss"].shape == () and metrics["grad_norm"].shape == ()


def test_parse_arg_and_errors():
  a = parse_arg(
    "laplacian=5,spectral=True,dataset=cifar10", laplacian=0, spectral=False, dataset="cifar100"
  )
  assert a.laplacian == 5 and a.spectral is True and a.dataset == "cifar10"
  with pytest.raises(ValueError, match="laplacien"):
    parse_arg("laplacien=5", laplacian=0)


def test_default_config_validates_and_has_contract_keys():
  c = load("vit_fashion_mnist")
  tasks.validate(c)
  for key in config_lib.REQUIRED:
    config_lib.get(c, key)
  assert c.model.num_laplacian_heads == c.model.num_heads  # all heads Laplacian


@pytest.mark.parametrize(
  "key,value,fragment",
  [
    ("model.num_laplacian_heads", 5, "num_laplacian_heads"),
    ("model.num_laplacian_heads", -1, "num_laplacian_heads"),
    ("model.num_heads", 3, "not divisible"),
    ("model.spectral.mode", "diag", "spectral.mode"),
    ("batch_size", 0, "batch_size"),
    ("optim.lr", 0.0, "optim.lr"),
    ("model.implementation", "cudnn", "cudnn"),
    ("data.image_size", 30, "not divisible"),
    ("loss.type", "hinge", "loss.type"),
    ("task", "segmentation", "task"),
  ],
)
def test_validate_rejects_with_one_line(key, value, fragment):
  c = base_config()
  node = c
  *path, last = key.split(".")
  for p in path:
    node = node[p]
  with c.unlocked():
    node[last] = value
  with pytest.raises(config_lib.ConfigError) as e:
    tasks.validate(c)
  assert fragment in str(e.value) and "\n" not in str(e.value)


def test_per_layer_counts_validated():
  c = base_config()
  c.model.num_laplacian_heads = (0, 1, 2, 4)
  tasks.validate(c)
  c.model.num_laplacian_heads = (0, 1, 2)
  with pytest.raises(config_lib.ConfigError, match="one count per layer"):
    tasks.validate(c)


def test_architecture_diff_names_keys():
  c = base_config()
  saved = c.to_dict()
  other = base_config()
  other.model.width = 256
  other.total_steps = 99  # not architecture
  assert config_lib.architecture_diff(saved, other) == ["model.width"]


def test_schedule_closed_form():
  c = base_config()
  c.optim.lr, c.optim.warmup_steps, c.optim.min_lr_ratio = 1e-3, 10, 0.1
  sched = optim.learning_rate_schedule(c.optim, 110)
  assert float(sched(0)) == 0.0
  np.testing.assert_allclose(float(sched(5)), 0.5e-3, rtol=1e-6)
  np.testing.assert_allclose(float(sched(10)), 1e-3, rtol=1e-6)
  t = 50
  expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + np.cos(np.pi * (t - 10) / 100))
  np.testing.assert_allclose(float(sched(t)), expected, rtol=1e-5)
  np.testing.assert_allclose(float(sched(110)), 1e-4, rtol=1e-5)


def test_weight_decay_mask_excludes_biases_norms_tokens():
  c = base_config()
  task = tasks.ClassificationTask(c, 10, (28, 28, 1))
  params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  mask = optim.decay_mask(params, tuple(c.optim.weight_decay_exclude))
  flat = {
    "/".join(str(k.key) for k in path): v
    for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]
  }
  assert flat["block0/attention/query/kernel"] and flat["head/kernel"]
  assert flat["embedding/kernel"]
  assert not flat["block0/attention/query/bias"] and not flat["block0/norm1/scale"]
  assert not flat["cls"] and not flat["pos_embedding"]


@pytest.mark.slow
def test_weight_decay_applied_exactly_where_masked():
  """One AdamW step with zero gradients: only decayed leaves shrink, by lr * wd * w."""
  c = base_config()
  c.optim.warmup_steps, c.optim.grad_clip = 0, None
  c.total_steps = 10
  task = tasks.ClassificationTask(c, 10, (28, 28, 1))
  params = jax.jit(task.init)(jax.random.PRNGKey(0))
  tx = optim.make_optimizer(c)
  state = tx.init(params)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, state, params)
  lr = float(optim.learning_rate_schedule(c.optim, 10)(0))
  np.testing.assert_allclose(
    updates["head"]["kernel"], -lr * 0.05 * params["head"]["kernel"], rtol=1e-6, atol=1e-12
  )
  np.testing.assert_array_equal(updates["cls"], 0.0)
  np.testing.assert_array_equal(updates["block0"]["norm1"]["scale"], 0.0)


@pytest.mark.slow
def test_mixup_cutmix_targets_are_mixtures():
  rng = jax.random.PRNGKey(3)
  images = jnp.arange(4 * 8 * 8 * 1, dtype=jnp.float32).reshape(4, 8, 8, 1)
  targets = jax.nn.one_hot(jnp.arange(4), 4)
  for mix, cut in ((0.8, 0.0), (0.0, 1.0)):
    mixed, t = classification.mixup_cutmix(rng, images, targets, mixup=mix, cutmix=cut)
    np.testing.assert_allclose(t.sum(-1), 1.0, rtol=1e-6)
    lam = float(t[0, 0])
    if mix:
      np.testing.assert_allclose(mixed, lam * images + (1 - lam) * images[::-1], rtol=1e-5)
    else:  # the pasted area fraction equals 1 - lam
      from_other = np.asarray(mixed[0] == images[3]) & np.asarray(mixed[0] != images[0])
      np.testing.assert_allclose(from_other.mean(), 1 - lam, atol=1e-6)


def test_recipes_set_the_authors_options_and_unknown_ones_are_refused():
  """``recipe=deit3`` / ``recipe=nanochat`` (the options of the Laplacian
  authors' timm and nanochat code); the defaults stay plain."""
  from laplax.models import spec as spec_lib

  plain, deit3 = load("vit_fashion_mnist"), load("vit_fashion_mnist", "recipe=deit3")
  assert not plain.model.qk_norm and plain.model.layerscale_init is None
  assert deit3.model.qk_norm and deit3.model.layerscale_init == 1e-6
  spec = spec_lib.from_config(deit3.model)
  assert spec.attention.qk_norm.qk_norm_type == "layernorm"
  gpt, nano = load("gpt_shakespeare"), load("gpt_shakespeare", "recipe=nanochat")
  d20 = load("gpt_d20")
  assert gpt.optim.optimizer == "adamw" and not gpt.model.zero_init_out
  keys = (
    "posemb",
    "tie_embeddings",
    "use_bias",
    "norm",
    "embed_norm",
    "mlp_activation",
    "qk_norm",
    "qk_norm_type",
    "qk_scale",
    "zero_init_out",
    "rope_style",
    "rope_theta",
    "kernel_init",
    "logit_softcap",
  )
  assert {k: nano.model[k] for k in keys} == {k: d20.model[k] for k in keys}
  assert nano.model.zero_init_out and nano.optim.optimizer == "nanochat"
  # nanochat's AdamW learning rates scale with (width / 768)^-0.5.
  assert nano.optim.embedding_lr == 0.2 * (128 / 768) ** -0.5
  for c in (deit3, nano):
    tasks.validate(c, 1)
  for name in ("vit_fashion_mnist", "gpt_shakespeare"):
    with pytest.raises(ValueError, match="recipe='mae' is unknown"):
      load(name, "recipe=mae")
