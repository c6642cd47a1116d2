"""Tests of laplax.models.vit (and the Block / DropPath / LayerScale it uses).

The models are tiny (8 x 8 images, patch 4, width 8, 2 heads of 4) and are run
eagerly: the op-by-op executables are shared by all the configurations, which
is much cheaper on CPU than compiling every configuration.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.models import spec as spec_lib
from laplax.models.layers import DropPath, LayerScale
from laplax.models.vit import VARIANTS, decode_variant, posemb_sincos_2d

from helpers.models import make_vit

KEY = lambda seed: jax.random.key(seed, impl="rbg")  # fast to compile on CPU
BATCH, IMG, PATCH, WIDTH, HEADS, MLP, CLASSES = 2, 8, 4, 8, 2, 16, 3
TOKENS = (IMG // PATCH) ** 2


def vit(**kw):
  cfg = dict(
    num_classes=CLASSES,
    patch_size=PATCH,
    width=WIDTH,
    depth=2,
    mlp_dim=MLP,
    num_heads=HEADS,
    head_init_zero=False,
  )
  cfg.update(kw)
  return make_vit(**cfg)


def random_params(model, seed=0, images=None):
  """Normal-valued parameters with ``model``'s structure (no init compile)."""
  images = IMAGES if images is None else images
  shapes = jax.eval_shape(lambda k: model.init(k, images), KEY(0))
  leaves, treedef = jax.tree.flatten(shapes)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
    treedef, [jnp.asarray(0.5 * rng.normal(size=l.shape), l.dtype) for l in leaves]
  )


IMAGES = jnp.asarray(np.random.default_rng(0).normal(size=(BATCH, IMG, IMG, 3)), jnp.float32)


def np_layernorm(x, scale, bias, eps=1e-6):
  x = np.asarray(x, np.float64)
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * np.asarray(scale) + np.asarray(bias)


def initial_values(model, select):
  """``select(params)`` of a real initialisation. Only the selected leaves are
  returned, so XLA drops the other initialisers and compiles in a blink."""
  return jax.jit(lambda k: select(model.init(k, IMAGES)["params"]))(KEY(0))


# --------------------------------------------------------------------- shapes


@pytest.mark.parametrize("posemb", ["learn", "sincos2d"])
def test_output_shapes_and_intermediates(posemb):
  model = vit(posemb=posemb, num_laplacian_heads=[0, 1])
  params = random_params(model, 1)
  logits, out = model.apply(params, IMAGES)
  n = TOKENS + 1
  chex.assert_shape(logits, (BATCH, CLASSES))
  chex.assert_type(logits, jnp.float32)
  chex.assert_shape(out["encoded"], (BATCH, n, WIDTH))
  chex.assert_shape(out["pre_logits"], (BATCH, WIDTH))
  for i in range(2):
    for name in ("sa", "+sa", "mlp", "+mlp"):
      chex.assert_shape(out[f"block{i}"][name], (BATCH, n, WIDTH))
  chex.assert_tree_all_finite((logits, out))
  # The intermediates obey the pre-LN residual structure.
  for i in range(2):
    blk = out[f"block{i}"]
    np.testing.assert_allclose(blk["+mlp"], blk["+sa"] + blk["mlp"], atol=1e-5)
  np.testing.assert_allclose(
    out["block1"]["+sa"], out["block0"]["+mlp"] + out["block1"]["sa"], atol=1e-5
  )
  p = params["params"]
  enc = np_layernorm(out["block1"]["+mlp"], p["encoder_norm"]["scale"], p["encoder_norm"]["bias"])
  np.testing.assert_allclose(out["encoded"], enc, atol=1e-4, rtol=1e-4)
  # Class-token pooling, then the linear head.
  np.testing.assert_allclose(out["pre_logits"], enc[:, 0], atol=1e-4, rtol=1e-4)
  want = enc[:, 0] @ np.asarray(p["head"]["kernel"]) + np.asarray(p["head"]["bias"])
  np.testing.assert_allclose(logits, want, atol=1e-4, rtol=1e-4)
  assert ("pos_embedding" in p) == (posemb == "learn")


@pytest.mark.parametrize("size", [(8, 8), (8, 12), (16, 4)])
def test_gap_pool_and_image_shapes(size):
  """Shapes by abstract evaluation: no class token with ``pool="gap"``; the
  token count follows the patch grid."""
  images = jax.ShapeDtypeStruct((3, *size, 3), jnp.float32)
  for pool in ("gap", "tok"):
    model = vit(pool=pool)
    params = jax.eval_shape(model.init, KEY(0), images)
    logits, out = jax.eval_shape(model.apply, params, images)
    n = (size[0] // PATCH) * (size[1] // PATCH) + (pool == "tok")
    assert logits.shape == (3, CLASSES)
    assert out["encoded"].shape == (3, n, WIDTH)
    assert out["pre_logits"].shape == (3, WIDTH)
    assert ("cls" in params["params"]) == (pool == "tok")
    assert params["params"]["pos_embedding"].shape == (1, n - (pool == "tok"), WIDTH)


def test_num_classes_zero_returns_features():
  model = vit(num_classes=0)
  params = random_params(model, 2)
  feats, out = model.apply(params, IMAGES)
  chex.assert_shape(feats, (BATCH, WIDTH))
  np.testing.assert_array_equal(feats, out["pre_logits"])
  assert "head" not in params["params"]


def test_initialisation():
  """LayerScale gains start at ``layerscale_init``; the zero-initialised head
  (``head_init_zero``) gives zero logits; the class token starts near 0."""
  model = vit(layerscale_init=0.25, head_init_zero=True)
  init = initial_values(
    model,
    lambda p: (
      [p[f"block{i}"][n]["scale"] for i in range(2) for n in ("ls1", "ls2")],
      p["head"],
      p["cls"],
    ),
  )
  scales, head, cls = init
  for scale in scales:
    np.testing.assert_array_equal(scale, np.full(WIDTH, 0.25, np.float32))
  np.testing.assert_array_equal(head["kernel"], 0.0)
  np.testing.assert_array_equal(head["bias"], 0.0)
  assert np.abs(np.asarray(cls)).max() < 1e-4
  # With those head values the logits are zero whatever the rest is.
  params = random_params(model, 2)
  params["params"]["head"] = head
  logits, out = model.apply(params, IMAGES)
  np.testing.assert_array_equal(logits, 0.0)
  assert np.abs(np.asarray(out["pre_logits"])).max() > 0
  # LayerScale multiplies the branch: doubling the gain doubles "sa".
  params["params"]["block0"]["ls1"]["scale"] = 2 * params["params"]["block0"]["ls1"]["scale"]
  _, out2 = model.apply(params, IMAGES)
  np.testing.assert_allclose(out2["block0"]["sa"], 2 * out["block0"]["sa"], rtol=1e-5, atol=1e-6)
  # Without LayerScale there are no gains.
  shapes = jax.eval_shape(lambda k: vit().init(k, IMAGES), KEY(0))
  assert "ls1" not in shapes["params"]["block0"]
  # A random head init when asked for.
  head = initial_values(vit(head_init_zero=False), lambda p: p["head"])
  assert np.abs(np.asarray(head["kernel"])).max() > 0


def test_layerscale_module():
  x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 3, 5)), jnp.float32)
  for init in (1e-6, 0.5):
    params = LayerScale(init).init(KEY(0), x)
    np.testing.assert_array_equal(params["params"]["scale"], np.full(5, init, np.float32))
    np.testing.assert_allclose(
      LayerScale(init).apply(params, x), np.asarray(x) * np.float32(init), rtol=1e-6
    )


# ------------------------------------------------------------------- variants


@pytest.mark.parametrize(
  "variant,want",
  [
    # width, depth, mlp_dim, heads of ViT-Ti/S/B/L (Dosovitskiy et al.;
    # Touvron et al., DeiT).
    ("Ti/16", (192, 12, 768, 3, 16)),
    ("S/16", (384, 12, 1536, 6, 16)),
    ("B/32", (768, 12, 3072, 12, 32)),
    ("L/14", (1024, 24, 4096, 16, 14)),
  ],
)
def test_decode_variant(variant, want):
  got = decode_variant(variant)
  keys = ("width", "depth", "mlp_dim", "num_heads", "patch_size")
  assert set(got) == set(keys)
  assert tuple(got[k] for k in keys) == want
  assert got["width"] == got["num_heads"] * 64  # head_dim 64 in every size
  assert got["mlp_dim"] == 4 * got["width"]


@pytest.mark.parametrize("bad", ["X/16", "S16", "S/", "S/abc", "", "/16", "s/16", "S/16/2"])
def test_decode_variant_errors(bad):
  with pytest.raises(ValueError, match="SIZE/PATCH"):
    decode_variant(bad)


def test_parameter_count_closed_form():
  """ViT-S/16 on 32 x 32 images, 10 classes, counted abstractly."""
  cfg = decode_variant("S/16")
  model = make_vit(num_classes=10, **cfg)
  images = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
  shapes = jax.eval_shape(lambda k, x: model.init(k, x), KEY(0), images)
  count = sum(x.size for x in jax.tree.leaves(shapes))
  w, m, p, n = cfg["width"], cfg["mlp_dim"], cfg["patch_size"], (32 // 16) ** 2
  block = (
    3 * (w * w + w)
    + (w * w + w)  # q, k, v, out
    + 2 * (2 * w)  # two LayerNorms
    + (w * m + m)
    + (m * w + w)
  )  # MLP
  want = (
    (p * p * 3 * w + w)
    + n * w
    + w  # patch embedding, posemb, cls
    + cfg["depth"] * block
    + 2 * w  # blocks, final norm
    + (w * 10 + 10)
  )  # head
  assert count == want


# ------------------------------------------------------ Laplacian head layout


@pytest.mark.subprocess
def test_per_layer_counts_match_masks_and_ints():
  params = random_params(vit(), 4)
  run = lambda **kw: vit(**kw).apply(params, IMAGES)
  y_02, out_02 = run(num_laplacian_heads=[0, 2])
  y_mask, _ = run(laplacian_mask=[[False, False], [True, True]])
  np.testing.assert_allclose(y_mask, y_02, atol=1e-6)
  # The explicit mask overrides the count.
  y_mask2, _ = run(num_laplacian_heads=1, laplacian_mask=[(False, False), (True, True)])
  np.testing.assert_allclose(y_mask2, y_02, atol=1e-6)
  # An int is the same count for every layer.
  y_2, _ = run(num_laplacian_heads=2)
  y_22, _ = run(num_laplacian_heads=[2, 2])
  y_all, _ = run(laplacian_mask=[[True, True]] * 2)
  np.testing.assert_allclose(y_22, y_2, atol=1e-6)
  np.testing.assert_allclose(y_all, y_2, atol=1e-6)
  # Last-k convention: count 1 = mask (False, True), not (True, False).
  y_1, _ = run(num_laplacian_heads=1)
  y_ft, _ = run(laplacian_mask=[[False, True]] * 2)
  y_tf, _ = run(laplacian_mask=[[True, False]] * 2)
  np.testing.assert_allclose(y_ft, y_1, atol=1e-6)
  assert np.abs(np.asarray(y_tf - y_1)).max() > 1e-4
  # Counts go to the right layer: [0, 2] has a standard first block.
  y_00, out_00 = run(num_laplacian_heads=[0, 0])
  np.testing.assert_allclose(out_02["block0"]["sa"], out_00["block0"]["sa"], atol=1e-6)
  assert np.abs(np.asarray(out_02["block1"]["sa"] - out_00["block1"]["sa"])).max() > 1e-4
  # Sanity: all heads Laplacian vs none changes the logits.
  assert np.abs(np.asarray(y_2 - y_00)).max() > 1e-4


def test_per_layer_errors():
  init = lambda **kw: jax.eval_shape(lambda k: vit(**kw).init(k, IMAGES), KEY(0))
  msg = r"{} has {} entries.*depth=2"
  with pytest.raises(ValueError, match=msg.format("num_laplacian_heads", 1)):
    init(num_laplacian_heads=[1])
  with pytest.raises(ValueError, match=msg.format("num_laplacian_heads", 3)):
    init(num_laplacian_heads=[1, 1, 1])
  with pytest.raises(ValueError, match=r"laplacian_mask must be depth=2 lists"):
    init(laplacian_mask=[[True, False]] * 3)
  with pytest.raises(ValueError, match=r"num_heads=2"):
    init(laplacian_mask=[[True], [True, False]])
  with pytest.raises(ValueError, match=r"num_heads=2"):
    init(num_laplacian_heads=[0, 3])
  np.testing.assert_array_equal(spec_lib.laplacian_mask(3, 2, 1), [[False, False, True]] * 2)
  np.testing.assert_array_equal(
    spec_lib.laplacian_mask(2, 2, (1, 2)), [[False, True], [True, True]]
  )


@pytest.mark.parametrize("size", [(10, 8), (8, 6), (9, 9)])
def test_image_size_not_divisible_by_patch(size):
  images = jnp.zeros((1, *size, 3))
  with pytest.raises(ValueError, match="not divisible by patch_size=4"):
    jax.eval_shape(lambda k: vit().init(k, images), KEY(0))


def test_bad_posemb_and_pool():
  with pytest.raises(ValueError, match="posemb"):
    jax.eval_shape(lambda k: vit(posemb="rope").init(k, IMAGES), KEY(0))
  with pytest.raises(ValueError, match="pool"):
    jax.eval_shape(lambda k: vit(pool="max").init(k, IMAGES), KEY(0))


# ------------------------------------------------------------ sincos posemb


@pytest.mark.parametrize("h,w,dim", [(2, 3, 8), (3, 2, 12), (1, 1, 4)])
def test_posemb_sincos_2d(h, w, dim):
  pe = posemb_sincos_2d(h, w, dim)
  assert pe.shape == (1, h * w, dim) and pe.dtype == np.float32
  q = dim // 4
  want = np.zeros((h * w, dim))
  for r in range(h):
    for c in range(w):
      for j in range(q):
        omega = 10_000.0 ** (-j / max(q - 1, 1))
        t = r * w + c  # row-major patch order
        want[t, j] = np.sin(c * omega)
        want[t, q + j] = np.cos(c * omega)
        want[t, 2 * q + j] = np.sin(r * omega)
        want[t, 3 * q + j] = np.cos(r * omega)
  np.testing.assert_allclose(pe[0], want, atol=1e-6)


def test_posemb_sincos_2d_temperature_and_errors():
  pe = posemb_sincos_2d(2, 2, 8, temperature=100.0)
  # Last frequency is 1 / temperature: x = 1 gives sin(1 / 100).
  np.testing.assert_allclose(pe[0, 1, 1], np.sin(1 / 100.0), rtol=1e-6)
  with pytest.raises(ValueError, match="% 4"):
    posemb_sincos_2d(2, 2, 6)


def test_sincos_posemb_is_added():
  """Shifting patch embeddings by the sincos table equals the learned-posemb
  model whose table is that same sincos table."""
  learned, fixed = vit(posemb="learn"), vit(posemb="sincos2d")
  params = random_params(learned, 7)
  params["params"]["pos_embedding"] = jnp.asarray(
    posemb_sincos_2d(IMG // PATCH, IMG // PATCH, WIDTH)
  )
  p_fixed = {"params": {k: v for k, v in params["params"].items() if k != "pos_embedding"}}
  y1, _ = learned.apply(params, IMAGES)
  y2, _ = fixed.apply(p_fixed, IMAGES)
  np.testing.assert_allclose(y2, y1, atol=1e-5)


# -------------------------------------------------- dropout and drop-path


def test_dropout_and_drop_path_only_with_train():
  noisy = vit(drop_path=0.5, dropout=0.3, num_laplacian_heads=1)
  clean = vit(num_laplacian_heads=1)
  params = random_params(clean, 8)
  ev1, _ = noisy.apply(params, IMAGES, rngs={"dropout": KEY(1)})
  ev2, _ = noisy.apply(params, IMAGES, rngs={"dropout": KEY(2)})
  ev_clean, _ = clean.apply(params, IMAGES)
  np.testing.assert_array_equal(ev1, ev2)
  np.testing.assert_allclose(ev1, ev_clean, atol=1e-6)
  ev_default, _ = noisy.apply(params, IMAGES)  # eval needs no rng at all
  np.testing.assert_array_equal(ev_default, ev1)
  tr1, _ = noisy.apply(params, IMAGES, train=True, rngs={"dropout": KEY(1)})
  tr1b, _ = noisy.apply(params, IMAGES, train=True, rngs={"dropout": KEY(1)})
  tr2, _ = noisy.apply(params, IMAGES, train=True, rngs={"dropout": KEY(2)})
  np.testing.assert_array_equal(tr1, tr1b)  # same rng, same noise
  assert np.abs(np.asarray(tr1 - ev1)).max() > 1e-4
  assert np.abs(np.asarray(tr1 - tr2)).max() > 1e-4
  # Without any rate, train=True is the eval function.
  tr_clean, _ = clean.apply(params, IMAGES, train=True, rngs={"dropout": KEY(1)})
  np.testing.assert_allclose(tr_clean, ev_clean, atol=1e-6)


def test_drop_path_rates_increase_linearly():
  """The first block has rate 0, the last ``drop_path``: with dropout off,
  train=True changes only the last block (rate 0.99 drops almost surely)."""
  model = vit(drop_path=0.99, depth=2)
  params = random_params(model, 9)
  _, ev = model.apply(params, IMAGES)
  _, tr = model.apply(params, IMAGES, train=True, rngs={"dropout": KEY(3)})
  np.testing.assert_allclose(tr["block0"]["+mlp"], ev["block0"]["+mlp"], atol=1e-6)
  assert np.abs(np.asarray(tr["block1"]["+mlp"] - ev["block1"]["+mlp"])).max() > 1e-3


def test_drop_path_module():
  x = jnp.asarray(np.random.default_rng(10).normal(size=(16, 3, 4)) + 5.0, jnp.float32)
  dp = DropPath(0.5)
  np.testing.assert_array_equal(dp.apply({}, x), x)  # deterministic default
  y = np.asarray(dp.apply({}, x, False, rngs={"dropout": KEY(4)}))
  xs = np.asarray(x)
  kept = np.array([np.allclose(y[i], xs[i] / 0.5) for i in range(16)])
  dropped = np.array([np.all(y[i] == 0) for i in range(16)])
  assert np.all(kept ^ dropped)  # whole example kept (scaled) or dropped
  assert kept.any() and dropped.any()
  np.testing.assert_array_equal(DropPath(0.0).apply({}, x, False), x)


# ------------------------------------------------------ other configurations


def test_implementation_reference_equals_default():
  params = random_params(vit(), 11)
  y_default, _ = vit(num_laplacian_heads=[1, 2]).apply(params, IMAGES)
  y_ref, _ = vit(num_laplacian_heads=[1, 2], implementation="reference").apply(params, IMAGES)
  np.testing.assert_allclose(y_ref, y_default, atol=1e-5, rtol=1e-5)


def test_qk_norm_parameters_and_effect():
  model = vit(qk_norm=True)
  params = random_params(model, 12)
  attn = params["params"]["block0"]["attention"]
  chex.assert_shape(attn["query_norm"]["scale"], (WIDTH // HEADS,))
  chex.assert_shape(attn["key_norm"]["scale"], (WIDTH // HEADS,))
  y, _ = model.apply(params, IMAGES)
  chex.assert_tree_all_finite(y)
  # The norms are used: changing the query norm's gain changes the output.
  params["params"]["block0"]["attention"]["query_norm"]["scale"] *= 3.0
  y2, _ = model.apply(params, IMAGES)
  assert np.abs(np.asarray(y2 - y)).max() > 1e-5


def test_variants_table_is_consistent():
  for size, cfg in VARIANTS.items():
    assert decode_variant(f"{size}/8") == dict(cfg, patch_size=8)
