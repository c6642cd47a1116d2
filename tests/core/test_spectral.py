"""Tests of laplax.spectral and of spectral conditioning inside the models
(Saratchandran & Lucey 2025, as laplax.spectral documents it:
``softmax(X (W_Q + C_Q) (W_K + C_K)^T X^T / sqrt(d)) X (W_V + C_V)``).

Closed forms are built with NumPy: ``full = lam * eye(D, H * dh)``;
``per_head`` = ``lam * eye(D, dh)`` in each head's block of columns;
``fused`` = the q, k or v third of ``lam * eye(D, 3 * H * dh)``;
``svd`` = ``U (s_max I) V^T`` from ``numpy.linalg.svd``.
"""

from __future__ import annotations

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from laplax import spectral
from laplax.attention import MultiHeadAttention, ProjectionDense

from helpers.models import make_vit

LAM = 10.0
MODES = ["per_head", "full", "fused", "svd"]
KEY = lambda seed: jax.random.key(seed, impl="rbg")  # fast to compile on CPU


def np_identity_correction(rows, cols, lam, mode, num_heads=1, target="q"):
  """``lam * I_k`` on the whole kernel (``full``), per head block, or the
  ``target`` third of the fused ``[D, 3 * cols]`` kernel's identity."""
  if mode == "full":
    return lam * np.eye(rows, cols)
  if mode == "fused":
    j = "qkv".index(target)
    return (lam * np.eye(rows, 3 * cols))[:, j * cols : (j + 1) * cols]
  dh = cols // num_heads
  c = np.zeros((rows, cols))
  for h in range(num_heads):
    c[:, h * dh : (h + 1) * dh] = lam * np.eye(rows, dh)
  return c


def np_svd_correction(w):
  u, s, vt = np.linalg.svd(np.asarray(w, np.float64), full_matrices=False)
  return s[0] * u @ vt


def np_correction(w, lam, mode, num_heads, target="q"):
  if mode == "svd":
    return np_svd_correction(w)
  return np_identity_correction(*w.shape, lam, mode, num_heads, target)


def np_cond(w):
  s = np.linalg.svd(np.asarray(w, np.float64), compute_uv=False)
  return s[0] / s[-1]


def random_matrix(rows, cols, seed, log10_cond=None):
  """Gaussian, or with singular values spread over ``log10_cond`` decades."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(rows, cols))
  if log10_cond is not None:
    u, _, vt = np.linalg.svd(w, full_matrices=False)
    s = np.logspace(0, -log10_cond, min(rows, cols))
    w = (u * s) @ vt
  return w.astype(np.float32)


# ------------------------------------------------------------------ correction

SHAPES = [(8, 8, 2), (8, 12, 3), (12, 8, 2), (6, 16, 4), (3, 8, 2), (5, 5, 1)]


@pytest.mark.parametrize("rows,cols,heads", SHAPES)
@pytest.mark.parametrize("mode", ["per_head", "full"])
@pytest.mark.parametrize("lam", [LAM, 0.5])
def test_identity_correction_closed_form(rows, cols, heads, mode, lam):
  c = spectral.correction((rows, cols), lam=lam, mode=mode, num_heads=heads)
  chex.assert_shape(c, (rows, cols))
  chex.assert_type(c, jnp.float32)
  want = np_identity_correction(rows, cols, lam, mode, heads)
  np.testing.assert_allclose(np.asarray(c), want, rtol=0, atol=0)
  # Every head block (per_head) or the whole kernel (full) holds
  # exactly k = min(rows, cols) entries equal to lam, the rest 0.
  blocks = np.split(np.asarray(c), heads if mode == "per_head" else 1, axis=1)
  for blk in blocks:
    assert (blk == lam).sum() == min(blk.shape)
    assert ((blk == 0) | (blk == lam)).all()


def test_per_head_with_one_head_is_full():
  np.testing.assert_array_equal(
    np.asarray(spectral.correction((6, 10), lam=LAM, mode="per_head")),
    np.asarray(spectral.correction((6, 10), lam=LAM, mode="full")),
  )


def test_per_head_differs_from_full_with_several_heads():
  a = spectral.correction((8, 8), lam=LAM, mode="per_head", num_heads=2)
  b = spectral.correction((8, 8), lam=LAM, mode="full")
  assert np.abs(np.asarray(a - b)).max() == LAM


@pytest.mark.parametrize("rows,cols", [(8, 8), (6, 10), (10, 6)])
@pytest.mark.parametrize("log10_cond", [None, 2, 4, 6])
def test_svd_correction_closed_form_and_bound(rows, cols, log10_cond):
  w = random_matrix(rows, cols, seed=rows * cols, log10_cond=log10_cond)
  c = spectral.correction(w.shape, lam=LAM, mode="svd", kernel=jnp.asarray(w))
  chex.assert_shape(c, w.shape)
  chex.assert_type(c, jnp.float32)
  s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
  kappa = np_cond(np.asarray(w) + np.asarray(c))
  # Theorem 3.5: kappa(W + C) <= 2, and exactly 2 s_max / (s_max + s_min).
  assert kappa <= 2.0 + 1e-4
  np.testing.assert_allclose(kappa, 2 * s[0] / (s[0] + s[-1]), rtol=1e-4)
  if log10_cond is not None:
    assert np_cond(w) > 10 ** (log10_cond - 0.01) > kappa
  # C = U (s_max I) V^T = s_max * (polar factor of W), unique for full rank.
  # The polar factor's float32 error grows like eps / s_min, so the elementwise
  # comparison is made where float32 determines it.
  if log10_cond is None or log10_cond <= 2:
    np.testing.assert_allclose(np.asarray(c), np_svd_correction(w), atol=1e-4, rtol=1e-4)
  # The lam argument plays no role in the svd mode.
  c2 = spectral.correction(w.shape, lam=0.1, mode="svd", kernel=jnp.asarray(w))
  np.testing.assert_array_equal(np.asarray(c), np.asarray(c2))


def test_svd_correction_bound_many_random_matrices():
  """Gaussian and badly conditioned matrices of many shapes: kappa(W + C) <= 2
  as computed by the library's own condition_number."""
  rng = np.random.default_rng(0)
  shapes = [(5, 5), (4, 7), (7, 4)]  # few shapes: few eager compilations
  for i in range(12):
    rows, cols = shapes[i % 3]
    w = random_matrix(rows, cols, seed=100 + i, log10_cond=None if i % 2 else rng.uniform(1, 6))
    wc = spectral.conditioned(jnp.asarray(w), lam=LAM, mode="svd")
    assert float(spectral.condition_number(wc)) <= 2.0 + 1e-4
    assert float(spectral.min_singular_value(wc)) >= float(
      np.linalg.svd(w, compute_uv=False)[0]
    ) * (1 - 1e-5)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(shape=(4, 4), mode="eye"), "unknown"),
    (dict(shape=(4, 4, 4), mode="full"), "2-D"),
    (dict(shape=(4, 6), mode="per_head", num_heads=4), "does not divide"),
    (dict(shape=(4, 6), mode="per_head", num_heads=0), "does not divide"),
    (dict(shape=(4, 6), mode="svd"), "needs the kernel"),
  ],
)
def test_correction_errors(kwargs, match):
  shape = kwargs.pop("shape")
  with pytest.raises(ValueError, match=match):
    spectral.correction(shape, lam=LAM, **kwargs)


# ------------------------------------------------------------------ conditioned


@pytest.mark.parametrize("mode", MODES)
def test_conditioned_is_w_plus_c(mode):
  w = random_matrix(6, 8, seed=1)
  got = spectral.conditioned(jnp.asarray(w), lam=LAM, mode=mode, num_heads=2)
  chex.assert_type(got, jnp.float32)
  np.testing.assert_allclose(
    np.asarray(got), w + np_correction(w, LAM, mode, 2), atol=2e-5, rtol=1e-5
  )


def test_conditioned_keeps_dtype():
  w = jnp.asarray(random_matrix(4, 4, seed=2), jnp.bfloat16)
  got = spectral.conditioned(w, lam=LAM, mode="full")
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(got, np.float32), np.asarray(w, np.float32) + LAM * np.eye(4), rtol=1e-2
  )


@pytest.mark.parametrize("mode", MODES)
def test_conditioned_gradient_is_baseline_gradient_at_w_plus_c(mode):
  """C is a constant: d f(W + C(W)) / dW = f'(W + C), also for svd."""
  w = jnp.asarray(random_matrix(6, 4, seed=3))
  x = jnp.asarray(np.random.default_rng(4).normal(size=(5, 6)), jnp.float32)
  f = lambda k: jnp.sum(jnp.tanh(x @ k) ** 2)
  g = jax.grad(lambda k: f(spectral.conditioned(k, lam=LAM, mode=mode, num_heads=2)))(w)
  c = np_correction(np.asarray(w), LAM, mode, 2).astype(np.float32)
  g_base = jax.grad(f)(w + c)
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_base), atol=1e-5, rtol=1e-4)
  assert float(jnp.abs(g).max()) > 1e-3


# ------------------------------------------------- condition_number / min sv


@pytest.mark.parametrize("rows,cols", [(5, 5), (4, 7), (7, 4)])
@pytest.mark.parametrize("log10_cond", [None, 3])
def test_condition_number_and_min_singular_value_match_numpy(rows, cols, log10_cond):
  w = random_matrix(rows, cols, seed=rows + 10 * cols, log10_cond=log10_cond)
  s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
  np.testing.assert_allclose(float(spectral.condition_number(w)), s[0] / s[-1], rtol=1e-4)
  np.testing.assert_allclose(float(spectral.min_singular_value(w)), s[-1], rtol=1e-4)
  np.testing.assert_allclose(np.asarray(spectral.singular_values(w)), s, rtol=1e-4, atol=1e-6)


def test_condition_number_invariants():
  # Orthogonal matrix: kappa = 1; scaled diagonal: kappa = max/min.
  q, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(6, 6)))
  np.testing.assert_allclose(float(spectral.condition_number(q)), 1.0, rtol=1e-5)
  d = np.diag([3.0, 0.5, 2.0]).astype(np.float32)
  np.testing.assert_allclose(float(spectral.condition_number(d)), 6.0, rtol=1e-6)
  np.testing.assert_allclose(float(spectral.min_singular_value(d)), 0.5, rtol=1e-6)
  # Identity correction with large lam: kappa(W + lam I) -> 1.
  w = random_matrix(6, 6, seed=6)
  k_small = float(spectral.condition_number(w))
  k_big = float(
    spectral.condition_number(spectral.conditioned(jnp.asarray(w), lam=1e3, mode="full"))
  )
  assert k_big < 1.01 < k_small


# ----------------------------------------------------------- inside the models

QKV = ("query", "key", "value")


def add_correction(params, lam, mode, num_heads, targets="qkv"):
  """``W + C`` on the q/k/v kernels of ``targets`` in a parameter tree (NumPy),
  the rest unchanged (the out projection is never corrected)."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  out, touched = {}, 0
  for path, leaf in flat.items():
    if path[-1] == "kernel" and len(path) >= 2 and path[-2] in QKV and path[-2][0] in targets:
      w = np.asarray(leaf)
      leaf = jnp.asarray(w + np_correction(w, lam, mode, num_heads, path[-2][0]), leaf.dtype)
      touched += 1
    out[path] = leaf
  return flax.traverse_util.unflatten_dict(out), touched


def random_params(module, seed, *args):
  """Normal-valued parameters with ``module``'s structure (no init compile)."""
  shapes = jax.eval_shape(module.init, KEY(0), *args)
  leaves, treedef = jax.tree.flatten(shapes)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
    treedef, [jnp.asarray(0.3 * rng.normal(size=l.shape), l.dtype) for l in leaves]
  )


def check_same_params_and_optimizer(base, cond, *args):
  """(a) identical parameter trees, shapes, dtypes and counts; (d) identical
  adamw states. Abstract evaluation: nothing is compiled."""
  p_base = jax.eval_shape(base.init, KEY(0), *args)
  p_cond = jax.eval_shape(cond.init, KEY(0), *args)
  chex.assert_trees_all_equal_structs(p_base, p_cond)
  chex.assert_trees_all_equal_shapes_and_dtypes(p_base, p_cond)
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))
  assert count(p_base) == count(p_cond) > 0
  opt = optax.adamw(1e-3, weight_decay=0.05)
  s_base, s_cond = jax.eval_shape(opt.init, p_base), jax.eval_shape(opt.init, p_cond)
  chex.assert_trees_all_equal_structs(s_base, s_cond)
  chex.assert_trees_all_equal_shapes_and_dtypes(s_base, s_cond)
  # Adam's two moments per parameter plus a step counter: nothing for C.
  assert count(s_base) == count(s_cond) == 2 * count(p_base) + 1


def test_correction_is_not_a_parameter():
  """Same key, same initial values; the parameter tree is kernel + bias."""
  x = jnp.ones((2, 6))
  base = ProjectionDense(8, num_heads=2)
  for mode in MODES:
    cond = ProjectionDense(8, num_heads=2, spectral_lam=LAM, spectral_mode=mode)
    p_base = base.init(KEY(3), x)
    p_cond = cond.init(KEY(3), x)
    chex.assert_trees_all_equal(p_base, p_cond)
    assert set(p_cond["params"]) == {"kernel", "bias"}
    assert not set(p_cond) - {"params"}  # no other collection (no buffer)


@pytest.mark.parametrize("mode", MODES)
def test_multi_head_attention_spectral(mode):
  """model_dim 8, 2 heads of 4 (the tiny ViT's attention, whose eagerly
  compiled ops it shares); per_head and full differ on these kernels."""
  heads, head_dim, dim = 2, 4, 8
  x = jnp.asarray(0.1 * np.random.default_rng(7).normal(size=(2, 5, dim)), jnp.float32)
  kw = dict(num_heads=heads, head_dim=head_dim, num_laplacian_heads=1)
  base = MultiHeadAttention(**kw)
  cond = MultiHeadAttention(**kw, spectral_lam=LAM, spectral_mode=mode)
  check_same_params_and_optimizer(base, cond, x)

  params = random_params(base, 8, x)
  params_c, touched = add_correction(params, LAM, mode, heads)
  assert touched == 3
  chex.assert_trees_all_equal(params["params"]["out"], params_c["params"]["out"])
  ct = jnp.asarray(np.random.default_rng(9).normal(size=(2, 5, dim)), jnp.float32)
  loss = lambda y: jnp.sum(y * ct)
  apply = lambda m, p: m.apply(p, x)
  check_forward_and_grad("mha", mode, base, cond, params, params_c, apply, loss)


# Tiny models: XLA's compile time dominates; compile with little optimisation.
FAST_COMPILE = {"xla_backend_optimization_level": 0}
_COMPILED = {}


def forward_and_grad(key, model, params, apply, loss):
  """Output and d loss / d params of ``model``; the compiled function is kept
  under ``key`` (the baseline's is shared by the three spectral modes)."""
  if key not in _COMPILED:

    def f(p):
      y = apply(model, p)
      return loss(y), y

    fn = lambda p: jax.value_and_grad(f, has_aux=True)(p)
    _COMPILED[key] = jax.jit(fn).lower(params).compile(FAST_COMPILE)
  (_, y), g = _COMPILED[key](params)
  return y, g


def check_forward_and_grad(name, mode, base, cond, params, params_c, apply, loss, grad=True):
  if grad:
    y_cond, g_cond = forward_and_grad((name, mode), cond, params, apply, loss)
    y_base_c, g_base_c = forward_and_grad((name, None), base, params_c, apply, loss)
    y_base, _ = forward_and_grad((name, None), base, params, apply, loss)
  else:  # forward only, eagerly (shares the op cache with the other tests)
    y_cond, y_base_c = apply(cond, params), apply(base, params_c)
    y_base = apply(base, params)
  # (b) forward of the conditioned model at W = baseline at W + C.
  np.testing.assert_allclose(np.asarray(y_cond), np.asarray(y_base_c), atol=1e-4, rtol=1e-4)
  # C matters ("fused" corrects W_Q only, which the output sees through P).
  assert np.abs(np.asarray(y_cond - y_base)).max() > (1e-5 if mode == "fused" else 1e-3)
  if not grad:
    return
  # (c) gradient w.r.t. W = baseline gradient at W + C, for every parameter.
  chex.assert_trees_all_close(g_cond, g_base_c, atol=1e-4, rtol=1e-3)
  flat = flax.traverse_util.flatten_dict(g_cond)
  for path, g in flat.items():
    if path[-1] == "kernel" and path[-2] in QKV:
      assert float(jnp.abs(g).max()) > 1e-4, path  # not vanishing


@pytest.mark.parametrize("mode", MODES)
def test_projection_dense_spectral_direct(mode):
  """``y = x (W + C) + b`` against NumPy; the out projection kernel is plain."""
  x = np.random.default_rng(10).normal(size=(3, 6)).astype(np.float32)
  dense = ProjectionDense(8, num_heads=2, spectral_lam=LAM, spectral_mode=mode)
  params = random_params(dense, 11, x)
  w = np.asarray(params["params"]["kernel"], np.float64)
  b = np.asarray(params["params"]["bias"], np.float64)
  want = x @ (w + np_correction(w, LAM, mode, 2)) + b
  np.testing.assert_allclose(np.asarray(dense.apply(params, x)), want, atol=1e-4, rtol=1e-5)


def tiny_vit(**kw):
  return make_vit(
    num_classes=3,
    patch_size=4,
    width=8,
    depth=1,
    mlp_dim=16,
    num_heads=2,
    num_laplacian_heads=1,
    head_init_zero=False,
    layerscale_init=0.5,
    **kw,
  )


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_vit_spectral(mode):
  images = jnp.asarray(np.random.default_rng(12).normal(size=(2, 8, 8, 3)), jnp.float32)
  labels = jnp.asarray([0, 2])
  base = tiny_vit()
  cond = tiny_vit(spectral_lam=LAM, spectral_mode=mode)
  check_same_params_and_optimizer(base, cond, images)
  params = random_params(base, 13, images)
  # A small LayerNorm gain keeps the lam = 10 logits out of saturation.
  params["params"]["block0"]["norm1"]["scale"] *= 0.2
  params_c, touched = add_correction(params, LAM, mode, 2)
  assert touched == 3
  chex.assert_trees_all_equal(
    params["params"]["block0"]["attention"]["out"], params_c["params"]["block0"]["attention"]["out"]
  )
  apply = lambda m, p: m.apply(p, images)[0]
  loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  # Gradients through a whole ViT compile slowly on CPU: (c) is checked here
  # for the default mode; MultiHeadAttention checks it for all three.
  check_forward_and_grad(
    "vit", mode, base, cond, params, params_c, apply, loss, grad=mode == "per_head"
  )


class CorrectionVariants(chex.TestCase):
  """``spectral.correction`` jitted and not: the closed forms of each layout."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_closed_forms(self):
    w = np.random.default_rng(3).normal(size=(8, 6)).astype(np.float32)
    full = self.variant(lambda: spectral.correction((8, 6), lam=LAM, mode="full"))()
    chex.assert_trees_all_close(full, LAM * np.eye(8, 6))
    per_head = self.variant(
      lambda: spectral.correction((8, 6), lam=LAM, mode="per_head", num_heads=2)
    )()
    chex.assert_trees_all_close(per_head, LAM * np.tile(np.eye(8, 3), (1, 2)))
    svd = self.variant(lambda k: spectral.correction((8, 6), lam=LAM, mode="svd", kernel=k))(w)
    s = np.linalg.svd(w + np.asarray(svd), compute_uv=False)
    s0 = np.linalg.svd(w, compute_uv=False)
    chex.assert_trees_all_close(s, s0 + s0[0], rtol=1e-4)  # W + C = U (S + s_max I) V^T


# ------------------------------------------------- layouts, targets, precision


@pytest.mark.parametrize("rows,heads,head_dim", [(8, 2, 4), (12, 2, 4), (6, 2, 4)])
@pytest.mark.parametrize("target", ["q", "k", "v"])
def test_fused_is_a_third_of_the_fused_identity(rows, heads, head_dim, target):
  """``"fused"``: the three corrections side by side are ``lam * eye(D, 3F)``:
  with ``F = D`` only ``W_Q`` is corrected, with ``F < D`` the identity spills
  into ``W_K`` (and ``W_V``), with ``F > D`` ``W_Q`` gets a partial identity."""
  cols = heads * head_dim
  parts = [
    np.asarray(spectral.correction((rows, cols), lam=LAM, mode="fused", target=t)) for t in "qkv"
  ]
  np.testing.assert_array_equal(np.concatenate(parts, 1), LAM * np.eye(rows, 3 * cols))
  got = np.asarray(spectral.correction((rows, cols), lam=LAM, mode="fused", target=target))
  np.testing.assert_array_equal(
    got, np_identity_correction(rows, cols, LAM, "fused", target=target)
  )
  nonzero = {t: bool(p.any()) for t, p in zip("qkv", parts)}
  assert nonzero == {"q": True, "k": rows > cols, "v": rows > 2 * cols}


@pytest.mark.parametrize("rows", [8, 20, 40])
def test_fused_under_grouped_query_attention_is_the_concatenation_s_identity(rows):
  """``W_Q`` of 16 columns, ``W_K, W_V`` of 8 (4 query heads, 2 key/value
  heads of 4): the three ``"fused"`` corrections side by side are ``lam *
  eye(D, 32)`` on ``[W_Q | W_K | W_V]`` (``W_K``'s from column 16, ``W_V``'s
  from 24), and :func:`identity_product` is ``x C`` for each."""
  fq, f = 16, 8
  parts = [
    np.asarray(
      spectral.correction(
        (rows, fq if t == "q" else f), lam=LAM, mode="fused", target=t, query_columns=fq
      )
    )
    for t in "qkv"
  ]
  np.testing.assert_array_equal(np.concatenate(parts, 1), LAM * np.eye(rows, fq + 2 * f))
  x = np.random.default_rng(43).normal(size=(2, 3, rows)).astype(np.float32)
  for t, c in zip("qkv", parts):
    got = spectral.identity_product(
      jnp.asarray(x), c.shape, lam=LAM, mode="fused", target=t, query_columns=fq
    )
    np.testing.assert_allclose(np.asarray(got), x @ c, rtol=1e-6, atol=1e-6)
  assert [bool(p.any()) for p in parts] == [True, rows > fq, rows > fq + f]


def test_full_conditions_every_head_block_and_the_kernel():
  """``"full"``: each head block is lam times a row-permuted rectangular identity
  (so ``lam * I`` with distinct input rows per head); ``"per_head"`` puts every
  head on rows ``0..d-1`` and the whole ``W + C`` is badly conditioned."""
  rows, heads, dh = 16, 4, 4
  full = np.asarray(spectral.correction((rows, heads * dh), lam=LAM, mode="full"))
  for h, blk in enumerate(np.split(full, heads, axis=1)):
    np.testing.assert_array_equal(blk.T @ blk, LAM**2 * np.eye(dh))
    assert set(np.flatnonzero(blk.any(1))) == set(range(h * dh, (h + 1) * dh))
  w = random_matrix(rows, heads * dh, seed=20) * 0.02
  assert np_cond(w + full) < 1.1
  per_head = np.asarray(
    spectral.correction((rows, heads * dh), lam=LAM, mode="per_head", num_heads=heads)
  )
  assert np.linalg.matrix_rank(per_head) == dh
  assert np_cond(w + per_head) > 100 * np_cond(w + full)
  for blk in np.split(w + per_head, heads, axis=1):
    assert np_cond(blk) < 1.1


def trained_kernels():
  """Kernels ``[8, 8]`` after 200 steps of gradient descent on a least-squares
  fit from strongly correlated inputs (NumPy; anisotropic, like trained
  projections and unlike a fresh initialisation)."""
  rng = np.random.default_rng(21)
  mix = rng.normal(size=(8, 8)) * np.logspace(0, -2, 8)[:, None]
  x = rng.normal(size=(256, 8)) @ mix
  kernels = []
  for seed in range(3):
    target = x @ rng.normal(size=(8, 8)) + 0.1 * rng.normal(size=(256, 8))
    w = 0.02 * np.random.default_rng(seed).normal(size=(8, 8))
    lr = 1.0 / np.linalg.eigvalsh(x.T @ x / len(x)).max()
    for _ in range(200):
      w -= lr * x.T @ (x @ w - target) / len(x)
    assert np_cond(w) > 10.0
    kernels.append(w.astype(np.float32))
  return kernels


def test_svd_head_blocks_are_conditioned_when_d_at_least_h_times_dh():
  """Theorem 3.5 on the whole kernel, ``D >= H d``: every head block's singular
  values interlace the kernel's, so each block of ``W + C`` has kappa <= 2 too
  -- on random, badly conditioned and trained kernels."""
  kernels = [random_matrix(8, 8, seed=s, log10_cond=c) for s, c in ((30, None), (31, 3), (32, 6))]
  kernels += [random_matrix(12, 8, seed=33, log10_cond=4)]  # D > H d
  kernels += trained_kernels()
  for w in kernels:
    wc = w.astype(np.float64) + np_svd_correction(w)
    assert np_cond(wc) <= 2.0 + 1e-6
    lib = np.asarray(spectral.conditioned(jnp.asarray(w), lam=LAM, mode="svd"))
    for blk, blk_lib in zip(np.split(wc, 2, axis=1), np.split(lib, 2, axis=1)):
      assert np_cond(blk) <= 2.0 + 1e-6
      assert np_cond(blk_lib) <= 2.0 + 1e-3


@pytest.mark.parametrize("mode", ["full", "per_head", "fused"])
@pytest.mark.parametrize("target", ["q", "k", "v"])
def test_identity_product_is_x_times_c(mode, target):
  x = np.random.default_rng(40).normal(size=(2, 3, 8)).astype(np.float32)
  for cols, heads in ((8, 2), (4, 2), (12, 3)):
    c = np_correction(np.zeros((8, cols)), LAM, mode, heads, target)
    got = spectral.identity_product(
      jnp.asarray(x), (8, cols), lam=LAM, mode=mode, num_heads=heads, target=target
    )
    chex.assert_type(got, jnp.float32)
    np.testing.assert_allclose(np.asarray(got), x @ c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_projection_float32_matches_w_plus_c(mode):
  """In float32 ``x W + x C`` equals the old ``x (W + C)`` to 1e-6."""
  x = np.random.default_rng(41).normal(size=(64, 32)).astype(np.float32)
  dense = ProjectionDense(
    32, num_heads=4, spectral_lam=LAM, spectral_mode=mode, spectral_target="q"
  )
  params = dense.init(KEY(5), x)
  w = params["params"]["kernel"]
  old = jnp.dot(x, spectral.conditioned(w, lam=LAM, mode=mode, num_heads=4))
  got = dense.apply(params, x)
  chex.assert_type(got, jnp.float32)
  scale = float(jnp.abs(old).max())
  np.testing.assert_allclose(np.asarray(got), np.asarray(old), atol=1e-6 * scale, rtol=0)


@pytest.mark.parametrize("mode", ["full", "per_head", "fused"])
def test_projection_bfloat16_keeps_w(mode):
  """bfloat16: the error against float64 ``x (W + C)`` stays at bfloat16
  rounding relative to ``|x W|`` (<= 1e-2); forming ``W + C`` in bfloat16, as
  before, rounds W's diagonal away and errs several times more."""
  rng = np.random.default_rng(42)
  dim = 128
  x = rng.normal(size=(256, dim)).astype(np.float32)
  dense = ProjectionDense(
    dim,
    num_heads=4,
    spectral_lam=LAM,
    spectral_mode=mode,
    spectral_target="q",
    use_bias=False,
    dtype=jnp.bfloat16,
  )
  w = (0.02 * rng.normal(size=(dim, dim))).astype(np.float32)
  params = {"params": {"kernel": jnp.asarray(w)}}
  w64, x64 = w.astype(np.float64), x.astype(np.float64)
  c = np_correction(w64, LAM, mode, 4, "q")
  want = x64 @ (w64 + c)
  xw = np.linalg.norm(x64 @ w64)
  got = np.asarray(dense.apply(params, x), np.float64)
  err = np.linalg.norm(got - want) / xw
  assert err <= 1e-2, err
  old = np.asarray(
    jnp.dot(
      jnp.asarray(x, jnp.bfloat16),
      (jnp.asarray(w) + jnp.asarray(c, jnp.float32)).astype(jnp.bfloat16),
    ),
    np.float64,
  )
  assert np.linalg.norm(old - want) / xw > 3 * err


@pytest.mark.parametrize("targets", ["q", "v", "qk"])
def test_targets_correct_only_those_projections(targets):
  """``spectral_targets``: the projections outside it are the baseline's; the
  output equals the baseline's at ``W + C`` on the targeted kernels only."""
  heads, dim = 2, 8
  x = jnp.asarray(0.3 * np.random.default_rng(43).normal(size=(2, 5, dim)), jnp.float32)
  base = MultiHeadAttention(num_heads=heads)
  cond = MultiHeadAttention(
    num_heads=heads, spectral_lam=LAM, spectral_mode="full", spectral_targets=targets
  )
  params = random_params(base, 44, x)
  params_c, touched = add_correction(params, LAM, "full", heads, targets)
  assert touched == len(targets)
  y_cond, y_ref = cond.apply(params, x), base.apply(params_c, x)
  np.testing.assert_allclose(np.asarray(y_cond), np.asarray(y_ref), atol=1e-4, rtol=1e-4)
  assert np.abs(np.asarray(y_cond - base.apply(params, x))).max() > 1e-3


@pytest.mark.parametrize(
  "value,ok",
  [("qkv", "qkv"), ("vq", "qv"), ("q,k", "qk"), ("", None), ("qq", None), ("x", None), (3, None)],
)
def test_check_targets(value, ok):
  if ok is None:
    with pytest.raises(ValueError, match="distinct letters of 'qkv'"):
      spectral.check_targets(value)
  else:
    assert spectral.check_targets(value) == ok


def test_old_workdirs_keep_per_head_and_resume_checks():
  """A saved config.json with ``mode: per_head`` (the old default) builds a
  per_head model; resuming it under the new default ``full`` is refused only
  when spectral conditioning is on (off, the layout changes nothing), and a
  config saved before ``targets`` existed means all three."""
  from laplax.config import validation as config_lib
  from laplax.config.defaults import base_config
  from laplax.models import spec as spec_lib

  new = base_config()
  saved = new.to_dict()
  saved["model"]["spectral"] = {"enabled": True, "lam": 10.0, "mode": "per_head"}
  built = spec_lib.from_config(saved["model"])
  assert built.attention.spectral.mode == "per_head"
  assert built.attention.spectral.targets == "qkv"
  new.model.spectral.enabled = True
  assert config_lib.architecture_diff(saved, new) == ["model.spectral.mode"]
  new.model.spectral.mode = "per_head"
  assert config_lib.architecture_diff(saved, new) == []
  saved["model"]["spectral"]["enabled"] = False
  new.model.spectral.enabled, new.model.spectral.mode = False, "full"
  assert config_lib.architecture_diff(saved, new) == []
