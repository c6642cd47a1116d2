"""model.laplacian_mix="learned": alpha V + (1 - 2 alpha) P V with alpha = sigmoid(a)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention, optim
from laplax.analysis import report
from laplax.models import spec as spec_lib

from helpers.models import make_gpt, make_vit

KEY = jax.random.PRNGKey
IMAGES = jax.random.normal(KEY(1), (3, 8, 8, 1))
VIT = dict(patch_size=4, width=16, depth=2, mlp_dim=16, num_heads=2, num_laplacian_heads=(0, 1))


def _freeze(params, big=1e4):
  """The mix logits at +-big: alpha exactly 1 / 0 in float32."""

  def leaf(path, x):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    return jnp.sign(x) * big if name.endswith("laplacian_mix") else x

  return jax.tree_util.tree_map_with_path(leaf, params)


def _strip(params):
  """The same tree without the mix logits (the fixed model's parameters)."""
  if isinstance(params, dict):
    return {k: _strip(v) for k, v in params.items() if k != "laplacian_mix"}
  return params


def test_attend_mix_matches_numpy_formula():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 5, 3, 4)).astype(np.float32) for _ in range(3))
  alpha = np.array([0.0, 0.3, 1.0], np.float32)
  got = attention.attend(
    q, k, v, laplacian=np.zeros(3, bool), mix=alpha, implementation="reference"
  )
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  pv = np.einsum("bhqk,bkhd->bqhd", p, v)
  want = alpha[:, None] * v + (1 - 2 * alpha[:, None]) * pv
  np.testing.assert_allclose(got, want, atol=1e-5)
  # alpha 0 / 1 are the standard and the Laplacian head.
  fixed = attention.attend(q, k, v, laplacian=np.array([False, False, True]))
  np.testing.assert_allclose(
    np.asarray(got)[:, :, [0, 2]], np.asarray(fixed)[:, :, [0, 2]], atol=1e-6
  )


def test_learned_starts_at_the_fixed_pattern_without_weight_decay():
  model = make_vit(num_classes=3, laplacian_mix="learned", **VIT)
  params = model.init(KEY(0), IMAGES)["params"]
  alpha0 = jax.nn.sigmoid(params["block0"]["attention"]["laplacian_mix"])
  alpha1 = jax.nn.sigmoid(params["block1"]["attention"]["laplacian_mix"])
  np.testing.assert_allclose(alpha0, [1 / (1 + np.exp(4))] * 2, rtol=1e-5)
  np.testing.assert_allclose(alpha1, [1 / (1 + np.exp(4)), 1 / (1 + np.exp(-4))], rtol=1e-5)
  mask = optim.decay_mask(params)
  assert not mask["block0"]["attention"]["laplacian_mix"]
  assert mask["block0"]["attention"]["query"]["kernel"]


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_learned_frozen_at_0_1_equals_fixed_vit(scan):
  learned = make_vit(
    num_classes=3, laplacian_mix="learned", scan_layers=scan, head_init_zero=False, **VIT
  )
  fixed = make_vit(num_classes=3, scan_layers=scan, head_init_zero=False, **VIT)
  params = learned.init(KEY(0), IMAGES)["params"]
  y_learned, _ = learned.apply({"params": _freeze(params)}, IMAGES)
  y_fixed, _ = fixed.apply({"params": _strip(params)}, IMAGES)
  np.testing.assert_allclose(y_learned, y_fixed, atol=1e-6)
  # At initialisation (alpha 0.018 / 0.982) the two differ.
  y_init, _ = learned.apply({"params": params}, IMAGES)
  assert np.abs(np.asarray(y_init - y_fixed)).max() > 1e-6


@pytest.mark.slow
def test_learned_frozen_equals_fixed_gpt_with_kv_cache():
  kw = dict(max_length=8, width=16, depth=2, num_heads=2, num_laplacian_heads=(1, 2), posemb="rope")
  learned, fixed = make_gpt(20, laplacian_mix="learned", **kw), make_gpt(20, **kw)
  tokens = jax.random.randint(KEY(2), (2, 8), 0, 20)
  params = _freeze(learned.init(KEY(0), tokens)["params"])
  full, _ = learned.apply({"params": params}, tokens)
  want, _ = fixed.apply({"params": _strip(params)}, tokens)
  np.testing.assert_allclose(full, want, atol=1e-5)
  # Decoding with the KV cache gives the full forward pass's logits.
  cache = learned.init(KEY(0), jnp.zeros((2, 8), jnp.int32), decode=True)["cache"]
  (first, _), upd = learned.apply(
    {"params": params, "cache": cache}, tokens[:, :5], decode=True, mutable=["cache"]
  )
  (rest, _), _ = learned.apply(
    {"params": params, "cache": upd["cache"]}, tokens[:, 5:], decode=True, mutable=["cache"]
  )
  np.testing.assert_allclose(jnp.concatenate([first, rest], 1), full, atol=1e-4)


@pytest.mark.slow
def test_gradients_reach_the_mix_logits():
  model = make_vit(num_classes=3, laplacian_mix="learned", **VIT)
  params = model.init(KEY(0), IMAGES)["params"]
  params = jax.tree_util.tree_map(lambda x: x, params)
  params["head"]["kernel"] = jax.random.normal(KEY(3), params["head"]["kernel"].shape)
  loss = lambda p: (model.apply({"params": p}, IMAGES)[0] ** 2).sum()
  grads = jax.grad(loss)(params)
  for layer in ("block0", "block1"):
    g = np.asarray(grads[layer]["attention"]["laplacian_mix"])
    assert g.shape == (2,) and np.all(np.abs(g) > 0), g


def test_spec_and_analysis_report_the_alphas():
  with pytest.raises(spec_lib.SpecError, match="laplacian_mix='soft' is unknown"):
    spec_lib.build("vit", laplacian_mix="soft")
  model = make_vit(num_classes=3, laplacian_mix="learned", **VIT)
  params = model.init(KEY(0), IMAGES)["params"]
  batches = [
    {"image": np.asarray(IMAGES), "label": np.array([0, 1, 2]), "mask": np.ones(3, np.float32)}
  ]
  out = report.run_analysis(
    report.Target(model, params, "image", num_classes=3), batches, layers=[0, 1], jacobian_dim=0
  )
  np.testing.assert_allclose(
    out["layers"][1]["laplacian_alpha"], [1 / (1 + np.exp(4)), 1 / (1 + np.exp(-4))], rtol=1e-5
  )
  fixed = make_vit(num_classes=3, **VIT)
  out = report.run_analysis(
    report.Target(fixed, _strip(params), "image", num_classes=3),
    batches,
    layers=[0],
    jacobian_dim=0,
  )
  assert "laplacian_alpha" not in out["layers"][0]
