"""The nanochat option set (configs/gpt_d20.py): parameter-free RMSNorm, ReLU^2,
the qk-norm (and the later fork's qk scale as an option), the Muon / AdamW
partition, defaults unchanged.

Facts from nanochat/gpt.py: ``norm(x) = F.rms_norm(x, (d,))`` (no weight, eps
= float32's machine epsilon, also for bfloat16 inputs), ``relu(x)^2``, Muon
for ``transformer.h``, AdamW for ``wte`` and ``lm_head``. The exact forward
and optimiser are tests/models/test_nanochat_exact.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention, optim, tasks
from laplax.config import validation as config_lib
from laplax.models import layers
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT

from helpers.configs import load
from helpers.models import make_gpt


def _rms_np(x, eps):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def test_rms_norm_and_relu2_match_numpy():
  x = np.random.default_rng(0).normal(size=(3, 5, 16)).astype(np.float32) * 3
  eps = float(np.finfo(np.float32).eps)
  np.testing.assert_allclose(attention.rms_norm(jnp.asarray(x)), _rms_np(x, eps), rtol=1e-5)
  # bfloat16 input, float32 eps (PyTorch's default for its float32 opmath):
  # a row of 1e-3 normalises to 0.945 (bfloat16's eps 2^-7 would give 0.011).
  tiny = jnp.full((1, 4), 1e-3, jnp.bfloat16)
  v = float(tiny[0, 0])
  np.testing.assert_allclose(attention.rms_norm(tiny), v / np.sqrt(v * v + 2.0**-23), rtol=1e-6)
  np.testing.assert_allclose(layers.relu2(jnp.asarray(x)), np.maximum(x, 0) ** 2, rtol=1e-6)
  assert layers.ACTIVATIONS["gelu"] is jax.nn.gelu or layers.ACTIVATIONS["gelu"].__name__ == "gelu"


def test_nanochat_qk_norm_logits_match_numpy():
  """P from MultiHeadAttention (rmsnorm qk-norm, scale 1.2) equals the softmax of
  1.44 * rms(q) . rms(k) / sqrt(head_dim) computed in NumPy from its kernels."""
  heads, width, length = 2, 16, 6
  mha = attention.MultiHeadAttention(
    num_heads=heads, qk_norm=True, qk_norm_type="rmsnorm", qk_scale=1.2, use_bias=False
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (1, length, width))
  params = mha.init(jax.random.PRNGKey(1), x)["params"]
  assert set(params) == {"query", "key", "value", "out"}  # no norm parameters
  _, inter = mha.apply({"params": params}, x, is_causal=True, mutable=["intermediates"])
  weights = np.asarray(inter["intermediates"]["attention_weights"][0])[0]
  xn, d = np.asarray(x[0], np.float64), width // heads
  proj = lambda name: (xn @ np.asarray(params[name]["kernel"])).reshape(length, heads, d)
  eps = float(np.finfo(np.float32).eps)
  q, k = _rms_np(proj("query"), eps) * 1.2, _rms_np(proj("key"), eps) * 1.2
  logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
  logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  np.testing.assert_allclose(weights, p / p.sum(-1, keepdims=True), atol=2e-5)


def _tiny_d20(vocab=64):
  c = load("gpt_d20")
  m = c.model
  m.width, m.depth, m.mlp_dim, m.max_length = 8 * m.num_heads, 2, 64, 16
  c.optim.warmup_steps = 0
  c.total_steps = 10
  return c, GPT(spec_lib.from_config(m), vocab_size=vocab)


def _params(model):
  return jax.jit(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))()[
    "params"
  ]


def _shapes(model):
  return jax.eval_shape(lambda: _params(model))


def test_rmsnorm_model_has_no_norm_parameters_and_muon_labels():
  c, model = _tiny_d20()
  params = _shapes(model)
  paths = [
    "/".join(map(str, (getattr(k, "key", k) for k in p)))
    for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]
  assert not [p for p in paths if "norm" in p], paths
  labels = optim.param_labels(params)
  expected = {"token_embedding": {"embedding": "embedding"}, "lm_head": {"kernel": "unembedding"}}
  for i in range(2):
    expected[f"block{i}"] = {
      "attention": {n: {"kernel": "muon"} for n in ("query", "key", "value", "out")},
      "mlp": {"fc1": {"kernel": "muon"}, "fc2": {"kernel": "muon"}},
    }
  assert labels == expected
  # A LayerNorm model: norm scales / biases go to the plain AdamW group.
  lab = optim.param_labels(
    _shapes(make_gpt(vocab_size=40, max_length=8, width=16, depth=1, num_heads=2))
  )
  assert lab["block0"]["norm1"] == {"scale": "adamw", "bias": "adamw"}
  assert lab["block0"]["attention"]["query"] == {"kernel": "muon", "bias": "adamw"}
  assert lab["pos_embedding"] == "embedding" and lab["final_norm"]["scale"] == "adamw"


def test_one_muon_update_is_orthogonalised_and_embeddings_get_adamw():
  c, model = _tiny_d20()
  params = _params(model)
  tx = optim.make_optimizer(c)
  rng = np.random.default_rng(0)
  grads = jax.tree_util.tree_map(lambda x: rng.standard_normal(x.shape, np.float32), params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # Muon: -lr * NS5(g). optax's quintic (3.4445, -4.775, 2.0315) maps the
  # singular values to about [0.7, 1.2] except the smallest few of a random
  # square matrix; the gradient's are spread over two orders of magnitude.
  s = (
    np.linalg.svd(np.asarray(updates["block0"]["attention"]["query"]["kernel"]), compute_uv=False)
    / c.optim.muon_lr
  )
  g = np.linalg.svd(np.asarray(grads["block0"]["attention"]["query"]["kernel"]), compute_uv=False)
  assert np.quantile(s, 0.1) > 0.6 and s.max() < 1.3, s
  assert s.max() / np.quantile(s, 0.1) < 0.25 * g.max() / np.quantile(g, 0.1)
  # AdamW's first step is -lr * sign(g) (bias-corrected m / sqrt(v)); the
  # token embedding and its moments are bfloat16 (8 bits of mantissa).
  assert params["token_embedding"]["embedding"].dtype == jnp.bfloat16
  for key, lr, rtol in (
    ("token_embedding", c.optim.embedding_lr, 1e-2),
    ("lm_head", c.optim.unembedding_lr, 2e-3),
  ):  # eps 1e-10
    u = np.asarray(jax.tree_util.tree_leaves(updates[key])[0], np.float32)
    g = np.asarray(jax.tree_util.tree_leaves(grads[key])[0], np.float32)
    np.testing.assert_allclose(u, -lr * np.sign(g), rtol=rtol, atol=1e-7)


def test_defaults_unchanged_by_the_new_keys():
  """A default GPT equals one with the new keys set to their defaults (parameters
  and logits bitwise), and a config without the keys resumes (no architecture diff)."""
  kw = dict(vocab_size=40, max_length=8, width=16, depth=2, num_heads=2, qk_norm=True)
  a = make_gpt(**kw)
  b = make_gpt(
    **kw,
    norm="layernorm",
    mlp_activation="gelu",
    qk_norm_type="layernorm",
    qk_scale=1.0,
    embed_norm=False,
  )
  assert a.spec == b.spec
  tokens = jnp.arange(8, dtype=jnp.int32)[None] % 40
  pa, pb = _params(a), _params(b)
  assert jax.tree_util.tree_structure(pa) == jax.tree_util.tree_structure(pb)
  assert "query_norm" in pa["block0"]["attention"] and "norm1" in pa["block0"]
  np.testing.assert_array_equal(
    a.apply({"params": pa}, tokens)[0], b.apply({"params": pb}, tokens)[0]
  )
  c = load("gpt_shakespeare")
  saved = c.to_dict()
  for key in ("norm", "mlp_activation", "qk_norm_type", "qk_scale", "embed_norm", "num_kv_heads"):
    del saved["model"][key]
  for key in ("optimizer", "muon_lr", "embedding_lr"):
    del saved["optim"][key]
  assert config_lib.architecture_diff(saved, c) == []


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("model.norm", "batchnorm", "model.norm='batchnorm'"),
    ("model.mlp_activation", "swish", "model.mlp_activation='swish'"),
    ("model.qk_norm_type", "l2", "model.qk_norm_type='l2'"),
    ("model.qk_scale", 0.0, "model.qk_scale=0.0"),
    ("model.num_kv_heads", 3, "model.num_kv_heads=3 must divide model.num_heads=10"),
    ("optim.optimizer", "sgd", "optim.optimizer='sgd'"),
    ("optim.muon_lr", -1.0, "optim.muon_lr=-1.0"),
  ],
)
def test_bad_new_keys_are_one_line_errors(key, value, message):
  c = load("gpt_d20")
  section, leaf = key.split(".")
  c[section][leaf] = value
  with pytest.raises(config_lib.ConfigError) as e:
    tasks.validate(c)
  assert message in str(e.value) and "\n" not in str(e.value)
