"""Tests of laplax.attention: Laplacian heads (Zhang & Papyan 2026; laplax/attention.py).

Every numeric expectation comes from ``np_attention``, a float64 NumPy
evaluation of the formula (Zhang & Papyan 2026, as laplax.attention.attend documents it): per head
``P = softmax(Q K^T / sqrt(d_head) + mask)``, standard heads ``P V``,
Laplacian heads ``V - P V``, grouped-query attention repeating ``K, V`` to the
query heads first.
"""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.attention import MultiHeadAttention, attend, laplacian_heads, reference_attention

from helpers.attention import np_attention

IMPLS = [None, "xla", "reference"]
# The attention shapes of the tiny models (2 heads of 4), so that the eagerly
# compiled ops are shared with the MultiHeadAttention and ViT tests.
B, T, N, D = 2, 5, 2, 4
# Keys for dropout: the "rbg" PRNG compiles much faster on CPU than threefry.
KEY = lambda seed: jax.random.key(seed, impl="rbg")
TOL = dict(atol=1e-5, rtol=1e-5)

HEADS = {
  "mixed": np.array([False, True]),
  "standard": np.zeros(N, bool),
  "laplacian": np.ones(N, bool),
}


# ----------------------------------------------------------------- reference


def qkv(seed=0, t=T, n=N, nkv=N, d=D, b=B, tq=None):
  rng = np.random.default_rng(seed)
  tq = t if tq is None else tq
  q = rng.normal(size=(b, tq, n, d)).astype(np.float32)
  k = rng.normal(size=(b, t, nkv, d)).astype(np.float32)
  v = rng.normal(size=(b, t, nkv, d)).astype(np.float32)
  return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


def key_padding(lengths, t=T):
  """``[batch, 1, 1, t]`` bool: True for the first ``lengths[b]`` keys."""
  return (np.arange(t)[None, :] < np.asarray(lengths)[:, None])[:, None, None]


MASKS = {
  "none": (None, False),
  "causal": (None, True),
  "padding": (key_padding([T, 3]), False),
  "padding+causal": (key_padding([T, 3]), True),
}
_m = np.random.default_rng(123).random((B, 1, T, T)) < 0.6
_m[..., np.arange(T), np.arange(T)] = True  # every row keeps at least itself
MASKS["arbitrary"] = (_m, False)  # a general [batch, 1, q, k] mask


# ------------------------------------------------- attend vs the NumPy formula


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_attend_matches_numpy_formula(impl, heads, mask_name):
  q, k, v = qkv(seed=1)
  mask, causal = MASKS[mask_name]
  lap = HEADS[heads]
  out = attend(
    q,
    k,
    v,
    laplacian=lap,
    mask=None if mask is None else jnp.asarray(mask),
    is_causal=causal,
    implementation=impl,
  )
  chex.assert_shape(out, (B, T, N, D))
  chex.assert_type(out, jnp.float32)
  want = np_attention(q, k, v, lap, mask=mask, causal=causal)
  np.testing.assert_allclose(np.asarray(out), want, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_are_finite(impl):
  """Left padding + causal leaves query 0 of example 1 with no key at all;
  example 0 has every key padded. Output stays finite everywhere, the other
  rows follow the formula and the empty rows follow the uniform convention."""
  q, k, v = qkv(seed=2)
  lap = HEADS["mixed"]
  mask = np.zeros((B, 1, 1, T), bool)
  mask[1, ..., 2:] = True  # example 1: keys 0, 1 are padding
  for causal in (False, True):
    out = attend(
      q, k, v, laplacian=lap, mask=jnp.asarray(mask), is_causal=causal, implementation=impl
    )
    chex.assert_tree_all_finite(out)
    want = np_attention(q, k, v, lap, mask=mask, causal=causal)
    np.testing.assert_allclose(np.asarray(out), want, **TOL)
    # Example 1, query 0 under causal: only key 0 is causal, and it is padding.
    if causal:
      vv = np.asarray(v[1], np.float64)
      mean = vv.mean(0)  # uniform average over all keys
      np.testing.assert_allclose(np.asarray(out[1, 0, 0]), mean[0], **TOL)
      np.testing.assert_allclose(np.asarray(out[1, 0, 1]), vv[0, 1] - mean[1], **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_are_finite_in_bfloat16(impl):
  """The same masks with bfloat16 inputs (``model.dtype=bfloat16``): the
  large finite negative fill and the float32 softmax keep every output
  finite, bfloat16, and within bfloat16 rounding of the float64 formula."""
  q, k, v = (a.astype(jnp.bfloat16) for a in qkv(seed=2))
  lap = HEADS["mixed"]
  mask = np.zeros((B, 1, 1, T), bool)
  mask[1, ..., 2:] = True
  for causal in (False, True):
    out = attend(
      q, k, v, laplacian=lap, mask=jnp.asarray(mask), is_causal=causal, implementation=impl
    )
    assert out.dtype == jnp.bfloat16
    chex.assert_tree_all_finite(out)
    want = np_attention(
      *(np.asarray(a, np.float32) for a in (q, k, v)), lap, mask=mask, causal=causal
    )
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention(impl, causal):
  """4 query heads over 2 kv heads: kv head h // 2 serves query head h and
  the Laplacian ``V`` is the repeated value."""
  q, k, v = qkv(seed=3, n=4, nkv=2)
  lap = np.array([False, True, True, False])  # each kv group: one of each kind
  mask = key_padding([T, 4])
  out = attend(
    q, k, v, laplacian=lap, mask=jnp.asarray(mask), is_causal=causal, implementation=impl
  )
  want = np_attention(q, k, v, lap, mask=mask, causal=causal)
  np.testing.assert_allclose(np.asarray(out), want, **TOL)
  # Same as explicitly repeating K and V to the query heads.
  rep = attend(
    q,
    jnp.repeat(k, 2, axis=2),
    jnp.repeat(v, 2, axis=2),
    laplacian=lap,
    mask=jnp.asarray(mask),
    is_causal=causal,
    implementation=impl,
  )
  np.testing.assert_allclose(np.asarray(out), np.asarray(rep), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_kv_cache_chunk_equals_full_sequence(impl):
  """Queries for the last 2 positions against all 5 keys, with the chunk's own
  values as ``residual_value``, equal the last 2 rows of full attention."""
  q, k, v = qkv(seed=4)
  lap = HEADS["mixed"]
  full = attend(q, k, v, laplacian=lap, is_causal=True, implementation=impl)
  chunk = attend(
    q[:, 3:], k, v, laplacian=lap, is_causal=True, implementation=impl, residual_value=v[:, 3:]
  )
  np.testing.assert_allclose(np.asarray(chunk), np.asarray(full[:, 3:]), **TOL)
  want = np_attention(q[:, 3:], k, v, lap, causal=True, residual_value=v[:, 3:])
  np.testing.assert_allclose(np.asarray(chunk), want, **TOL)


def test_traced_laplacian_mask_matches_static():
  q, k, v = qkv(seed=5)
  lap = HEADS["mixed"]
  f = jax.jit(lambda l, q, k, v: attend(q, k, v, laplacian=l, is_causal=True))
  traced = f(jnp.asarray(lap), q, k, v)
  np.testing.assert_allclose(np.asarray(traced), np_attention(q, k, v, lap, causal=True), **TOL)


def test_scale_argument():
  q, k, v = qkv(seed=6)
  lap = HEADS["mixed"]
  out = attend(q, k, v, laplacian=lap, scale=0.5)
  # scale s on Q K^T equals the default 1/sqrt(D) with Q rescaled.
  want = np_attention(q * (0.5 * np.sqrt(D)), k, v, lap)
  np.testing.assert_allclose(np.asarray(out), want, **TOL)


# ----------------------------------------------------------------- gradients


# (All-standard heads are the plain ``P V`` of the fused kernel.)
GRAD_CASES = [("mixed", N), ("mixed", 1), ("laplacian", N)]


def test_gradients_default_equal_reference():
  """d/dq, d/dk, d/dv of <attend(q, k, v), ct> agree between the default
  (laplax.kernels) path and the materialising reference, for mixed and
  Laplacian heads, with and without grouped-query attention (one compile)."""
  mask = jnp.asarray(key_padding([T, 3]))
  ct = jnp.asarray(np.random.default_rng(8).normal(size=(B, T, N, D)), jnp.float32)
  inputs = [qkv(seed=7 + i, nkv=nkv) for i, (_, nkv) in enumerate(GRAD_CASES)]

  def grad(impl, lap, q, k, v):
    def f(q, k, v):
      out = attend(q, k, v, laplacian=lap, mask=mask, is_causal=True, implementation=impl)
      return jnp.sum(out * ct)

    return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

  @jax.jit
  def all_grads(inputs):
    return [
      (grad(None, HEADS[h], *x), grad("reference", HEADS[h], *x))
      for (h, _), x in zip(GRAD_CASES, inputs)
    ]

  for (heads, nkv), (g_default, g_ref) in zip(GRAD_CASES, all_grads(inputs)):
    chex.assert_trees_all_close(
      g_default, g_ref, atol=1e-5, rtol=1e-5, custom_message=f"{heads}, kv heads {nkv}"
    )
    # Not trivially zero.
    assert all(float(jnp.abs(g).max()) > 1e-3 for g in g_ref)
    # Closed form for the value gradient of a Laplacian head without GQA:
    # d<ct, v - P v>/dv = ct - P^T ct.
    if nkv == N:
      i = GRAD_CASES.index((heads, nkv))
      q, k, v = inputs[i]
      _, p = np_attention(
        q, k, v, HEADS[heads], mask=np.asarray(mask), causal=True, return_weights=True
      )
      c = np.asarray(ct, np.float64)
      ptc = np.einsum("bhqk,bqhd->bkhd", p, c)
      want_dv = np.where(HEADS[heads][:, None], c - ptc, ptc)
      np.testing.assert_allclose(np.asarray(g_default[2]), want_dv, **TOL)


# ------------------------------------------------------------------- causality


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_token0_laplacian_output_is_exactly_zero(impl):
  q, k, v = qkv(seed=9)
  lap = HEADS["mixed"]
  out = np.asarray(attend(q, k, v, laplacian=lap, is_causal=True, implementation=impl))
  np.testing.assert_array_equal(out[:, 0][:, lap], 0.0)
  # The standard heads at token 0 return v_0 itself, so they are not zero.
  np.testing.assert_allclose(out[:, 0][:, ~lap], np.asarray(v[:, 0])[:, ~lap], **TOL)
  assert np.all(np.abs(out[:, 1:][:, :, lap]).max(axis=(0, 1)) > 0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("t", [0, 2])
def test_causal_future_tokens_do_not_leak(impl, heads, t):
  q, k, v = qkv(seed=10)
  lap = HEADS[heads]
  rng = np.random.default_rng(11)
  noise = [jnp.asarray(rng.normal(size=a.shape).astype(np.float32)) for a in (q, k, v)]
  later = (jnp.arange(T) > t)[None, :, None, None]
  q2, k2, v2 = (jnp.where(later, a + n, a) for a, n in zip((q, k, v), noise))
  out1 = np.asarray(attend(q, k, v, laplacian=lap, is_causal=True, implementation=impl))
  out2 = np.asarray(attend(q2, k2, v2, laplacian=lap, is_causal=True, implementation=impl))
  np.testing.assert_allclose(out2[:, : t + 1], out1[:, : t + 1], atol=1e-6, rtol=0)
  assert np.abs(out2[:, t + 1 :] - out1[:, t + 1 :]).max() > 1e-2
  # Without the causal mask the change does leak into earlier positions.
  nc1 = attend(q, k, v, laplacian=lap, implementation=impl)
  nc2 = attend(q2, k2, v2, laplacian=lap, implementation=impl)
  assert np.abs(np.asarray(nc2[:, : t + 1] - nc1[:, : t + 1])).max() > 1e-3


# -------------------------------------------------- Laplacian = V - standard


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_laplacian_is_v_minus_standard(impl, causal):
  q, k, v = qkv(seed=12)
  mask = jnp.asarray(key_padding([T, 4]))
  std = attend(
    q, k, v, laplacian=HEADS["standard"], mask=mask, is_causal=causal, implementation=impl
  )
  lap = attend(
    q, k, v, laplacian=HEADS["laplacian"], mask=mask, is_causal=causal, implementation=impl
  )
  mixed = attend(
    q, k, v, laplacian=HEADS["mixed"], mask=mask, is_causal=causal, implementation=impl
  )
  np.testing.assert_allclose(np.asarray(lap), np.asarray(v - std), atol=1e-6, rtol=0)
  sel = HEADS["mixed"]
  np.testing.assert_allclose(
    np.asarray(mixed)[:, :, sel], np.asarray(lap)[:, :, sel], atol=1e-6, rtol=0
  )
  np.testing.assert_allclose(
    np.asarray(mixed)[:, :, ~sel], np.asarray(std)[:, :, ~sel], atol=1e-6, rtol=0
  )


@pytest.mark.parametrize("impl", [None, "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_return_weights_row_stochastic_softmax(impl, causal):
  q, k, v = qkv(seed=13)
  lap = HEADS["mixed"]
  mask = key_padding([T, 3])
  out, probs = attend(
    q,
    k,
    v,
    laplacian=lap,
    mask=jnp.asarray(mask),
    is_causal=causal,
    implementation=impl,
    return_weights=True,
  )
  chex.assert_shape(probs, (B, N, T, T))
  chex.assert_type(probs, jnp.float32)
  probs = np.asarray(probs)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  assert probs.min() >= 0.0
  want_out, want_p = np_attention(q, k, v, lap, mask=mask, causal=causal, return_weights=True)
  np.testing.assert_allclose(probs, want_p, **TOL)
  np.testing.assert_allclose(np.asarray(out), want_out, **TOL)
  # Masked keys get exactly zero weight.
  np.testing.assert_array_equal(probs[1, :, :, 3:], 0.0)
  if causal:
    np.testing.assert_array_equal(
      probs[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]], 0.0
    )
  # The output is built from these weights: V - P V and P V per head.
  vv = np.asarray(v, np.float64)
  pv = np.einsum("bhqk,bkhd->bqhd", probs, vv)
  np.testing.assert_allclose(np.asarray(out), np.where(lap[:, None], vv - pv, pv), **TOL)


def test_reference_attention_returns_pv_and_p():
  q, k, v = qkv(seed=14, n=4, nkv=2)
  pv, p = reference_attention(q, k, v, is_causal=True)
  _, want_p = np_attention(q, k, v, np.zeros(4, bool), causal=True, return_weights=True)
  want_pv = np_attention(q, k, v, np.zeros(4, bool), causal=True)
  np.testing.assert_allclose(np.asarray(p), want_p, **TOL)
  np.testing.assert_allclose(np.asarray(pv), want_pv, **TOL)


def test_attention_dropout_acts_on_p_before_laplacian():
  """With attention dropout the Laplacian output is ``V - P_drop V`` for the
  same dropped ``P`` a standard head uses; rate 0.5 doubles the kept entries."""
  q, k, v = qkv(seed=15)
  lap = HEADS["mixed"]
  rng = KEY(0)
  out, p_drop = attend(
    q, k, v, laplacian=lap, dropout_rate=0.5, dropout_rng=rng, return_weights=True
  )
  p_drop = np.asarray(p_drop)
  _, p = np_attention(q, k, v, lap, return_weights=True)
  kept = p_drop != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(p_drop[kept], 2.0 * p[kept], rtol=1e-5)
  vv = np.asarray(v, np.float64)
  pv = np.einsum("bhqk,bkhd->bqhd", p_drop, vv)
  np.testing.assert_allclose(np.asarray(out), np.where(lap[:, None], vv - pv, pv), **TOL)
  # Same rng, any implementation choice: identical dropped output.
  out2 = attend(q, k, v, laplacian=lap, dropout_rate=0.5, dropout_rng=rng, implementation="xla")
  np.testing.assert_allclose(np.asarray(out2), np.asarray(out), atol=1e-6)


def test_attend_errors():
  q, k, v = qkv(seed=16)
  with pytest.raises(ValueError, match="unknown"):
    attend(q, k, v, laplacian=HEADS["mixed"], implementation="flash")
  with pytest.raises(ValueError, match="one boolean per query head"):
    attend(q, k, v, laplacian=np.zeros(N + 1, bool))
  with pytest.raises(ValueError, match="residual_value"):
    attend(q[:, :2], k, v, laplacian=HEADS["mixed"], is_causal=True)
  with pytest.raises(ValueError, match="reference"):
    attend(q, k, v, laplacian=HEADS["mixed"], implementation="xla", return_weights=True)
  # All-standard heads never need the residual value.
  out = attend(q[:, :2], k, v, laplacian=HEADS["standard"])
  np.testing.assert_allclose(
    np.asarray(out), np_attention(q[:, :2], k, v, HEADS["standard"]), **TOL
  )


# ------------------------------------------------------------ laplacian_heads


@pytest.mark.parametrize("num_heads", [1, 6, 10])
def test_laplacian_heads_last_k(num_heads):
  for k in range(num_heads + 1):
    got = laplacian_heads(num_heads, k)
    assert got.dtype == bool and got.shape == (num_heads,)
    want = np.array([False] * (num_heads - k) + [True] * k)
    np.testing.assert_array_equal(got, want)
    assert got.sum() == k
    # The Laplacian heads form a suffix.
    if k:
      assert got[num_heads - k :].all() and not got[: num_heads - k].any()


def test_laplacian_heads_default_is_all_standard():
  np.testing.assert_array_equal(laplacian_heads(5), np.zeros(5, bool))


def test_laplacian_heads_explicit_mask_overrides_count():
  mask = [True, False, True, False, False, True]
  got = laplacian_heads(6, num_laplacian_heads=2, mask=mask)
  np.testing.assert_array_equal(got, np.array(mask))
  assert got.dtype == bool
  got = laplacian_heads(3, mask=np.array([0, 1, 0]))
  np.testing.assert_array_equal(got, [False, True, False])


@pytest.mark.parametrize("k", [7, 100, -1])
def test_laplacian_heads_count_out_of_range(k):
  with pytest.raises(ValueError, match=r"num_laplacian_heads=.*num_heads=6"):
    laplacian_heads(6, k)


@pytest.mark.parametrize("mask", [[True] * 5, [True] * 7, []])
def test_laplacian_heads_wrong_mask_length(mask):
  with pytest.raises(ValueError, match=rf"{len(mask)} entries.*num_heads=6"):
    laplacian_heads(6, mask=mask)


# ----------------------------------------------------------- MultiHeadAttention


def _np_mha(
  params, x, lap, *, causal=False, head_dim, num_heads, num_kv_heads=None, corrections=None
):
  """The layer in float64: ``x (W + C) + b`` per projection (``corrections``:
  projection name -> ``C``, default none), ``num_kv_heads`` key/value heads."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
  x = np.asarray(x, np.float64)
  kv = num_heads if num_kv_heads is None else num_kv_heads

  def proj(name, heads):
    y = x @ (p[name]["kernel"] + (corrections or {}).get(name, 0.0)) + p[name]["bias"]
    return y.reshape(*x.shape[:-1], heads, head_dim)

  q, k, v = proj("query", num_heads), proj("key", kv), proj("value", kv)
  y = np_attention(q, k, v, lap, causal=causal)
  y = y.reshape(*x.shape[:-1], num_heads * head_dim)
  return y @ p["out"]["kernel"] + p["out"]["bias"]


def _random_params(module, x, seed):
  """Parameters of ``module`` filled with NumPy normals (biases non-zero);
  shapes from ``eval_shape`` so that no initialiser is compiled."""
  shapes = jax.eval_shape(module.init, KEY(0), x)
  leaves, treedef = jax.tree.flatten(shapes)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
    treedef, [jnp.asarray(0.4 * rng.normal(size=l.shape), l.dtype) for l in leaves]
  )


@pytest.mark.parametrize("num_laplacian_heads", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_numpy(num_laplacian_heads, causal):
  model_dim, heads, head_dim = 8, 2, 4  # the tiny ViT's attention shapes
  mha = MultiHeadAttention(
    num_heads=heads, head_dim=head_dim, num_laplacian_heads=num_laplacian_heads
  )
  x = jnp.asarray(np.random.default_rng(17).normal(size=(B, T, model_dim)), jnp.float32)
  params = _random_params(mha, x, 18)
  chex.assert_shape(params["params"]["query"]["kernel"], (model_dim, heads * head_dim))
  chex.assert_shape(params["params"]["out"]["kernel"], (heads * head_dim, model_dim))
  out = mha.apply(params, x, is_causal=causal)
  chex.assert_shape(out, (B, T, model_dim))
  lap = laplacian_heads(heads, num_laplacian_heads)
  want = _np_mha(params, x, lap, causal=causal, head_dim=head_dim, num_heads=heads)
  np.testing.assert_allclose(np.asarray(out), want, atol=1e-4, rtol=1e-5)


def _np_identity(rows, cols, lam, mode, heads, offset):
  """``lam I_k`` on a ``[rows, cols]`` kernel of ``heads`` column blocks, as
  laplax.spectral defines the layouts: ``full`` ``lam eye(rows, cols)``;
  ``per_head`` ``lam eye(rows, cols / heads)`` in each block; ``fused`` the
  columns from ``offset`` of ``lam eye(rows, offset + cols)`` (the kernel's
  place in ``[W_Q | W_K | W_V]``)."""
  if mode == "full":
    return lam * np.eye(rows, cols)
  if mode == "per_head":
    return np.tile(lam * np.eye(rows, cols // heads), (1, heads))
  return (lam * np.eye(rows, offset + cols))[:, offset:]


@pytest.mark.parametrize("mode", [None, "full", "per_head", "fused"])
def test_grouped_query_attention_layer_with_spectral_conditioning_matches_numpy(mode):
  """4 query heads of 4 over 2 key/value heads (``num_kv_heads=2``), model dim
  32: ``W_K, W_V`` are ``[32, 8]``; conditioned, each projection is ``x (W +
  C)`` with ``C`` of its own shape (``full``: ``lam eye(32, 8)`` for ``W_K,
  W_V``; ``per_head``: one ``lam eye(32, 4)`` per key/value head; ``fused``:
  ``W_K``'s columns 16-23 and ``W_V``'s 24-31 of ``lam eye(32, 32)``); query
  head ``h`` attends with key/value head ``h // 2`` and a Laplacian head
  subtracts its values. Float32 (q, then k and v stacked in one matmul) and
  the analysis' separate projections (a mutable ``"intermediates"``) alike."""
  dim, heads, kv, hd, lam = 32, 4, 2, 4, 0.7
  lap = (False, True, True, False)  # one of each kind on each key/value head
  mha = MultiHeadAttention(
    num_heads=heads,
    num_kv_heads=kv,
    head_dim=hd,
    laplacian_mask=lap,
    spectral_lam=lam if mode else None,
    spectral_mode=mode or "full",
  )
  x = jnp.asarray(np.random.default_rng(30).normal(size=(B, T, dim)), jnp.float32)
  params = _random_params(mha, x, 31)
  chex.assert_shape(params["params"]["key"]["kernel"], (dim, kv * hd))
  corrections = {}
  if mode:
    fq, f = heads * hd, kv * hd
    for name, n, offset in (("query", heads, 0), ("key", kv, fq), ("value", kv, fq + f)):
      corrections[name] = _np_identity(dim, n * hd, lam, mode, n, offset)
  want = _np_mha(
    params,
    x,
    np.array(lap),
    causal=True,
    head_dim=hd,
    num_heads=heads,
    num_kv_heads=kv,
    corrections=corrections,
  )
  out = mha.apply(params, x, is_causal=True)
  apart, _ = mha.apply(params, x, is_causal=True, mutable=["intermediates"])
  for got in (out, apart):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-5)


def test_multi_head_attention_laplacian_mask_equals_count():
  x = jnp.asarray(np.random.default_rng(19).normal(size=(B, T, 8)), jnp.float32)
  by_count = MultiHeadAttention(num_heads=2, num_laplacian_heads=1)
  by_mask = MultiHeadAttention(num_heads=2, laplacian_mask=(False, True))
  other = MultiHeadAttention(num_heads=2, laplacian_mask=(True, False))
  params = _random_params(by_count, x, 20)
  a, b, c = (m.apply(params, x) for m in (by_count, by_mask, other))
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
  assert np.abs(np.asarray(c - a)).max() > 1e-3


def test_multi_head_attention_causal_and_dropout_determinism():
  x = jnp.asarray(np.random.default_rng(21).normal(size=(B, T, 8)), jnp.float32)
  mha = MultiHeadAttention(num_heads=2, num_laplacian_heads=1, attention_dropout=0.5, dropout=0.5)
  plain = MultiHeadAttention(num_heads=2, num_laplacian_heads=1)
  params = _random_params(mha, x, 22)

  ev = mha.apply(params, x, is_causal=True)
  ev_plain = plain.apply(params, x, is_causal=True)
  tr = mha.apply(params, x, is_causal=True, deterministic=False, rngs={"dropout": KEY(1)})
  # Causal: changing the last token leaves earlier outputs unchanged.
  x2 = x.at[:, -1].add(1.0)
  ev2 = mha.apply(params, x2, is_causal=True)
  np.testing.assert_allclose(np.asarray(ev), np.asarray(ev_plain), atol=1e-6)
  assert np.abs(np.asarray(tr - ev)).max() > 1e-3
  np.testing.assert_allclose(np.asarray(ev2[:, :-1]), np.asarray(ev[:, :-1]), atol=1e-6)


# ------------------------------------------------------------- chex variants


class AttendVariants(chex.TestCase):
  """``attend`` jitted and not against the NumPy formula ``V - P V`` / ``P V``."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy_reference(self):
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(2, 6, 4, 8)).astype(np.float32) for _ in range(3))
    laplacian = np.array([False, True, False, True])
    for causal in (False, True):
      got = self.variant(
        lambda q, k, v, c=causal: attend(q, k, v, laplacian=laplacian, is_causal=c)
      )(q, k, v)
      logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
      if causal:
        logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
      p = np.exp(logits - logits.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      pv = np.einsum("bhqk,bkhd->bqhd", p, v)
      want = np.where(laplacian[:, None], v - pv, pv)
      chex.assert_trees_all_close(got, want, atol=1e-5)


@pytest.mark.parametrize(
  "settings, message",
  [
    (dict(num_heads=0), "num_heads=0 must be an integer >= 1"),
    (dict(num_heads=4, spectral_lam=10.0, spectral_targets="qx"), "distinct letters of 'qkv'"),
    (dict(num_heads=4, spectral_lam=10.0, spectral_targets=""), "distinct letters of 'qkv'"),
    (dict(num_heads=4, qk_norm=True, qk_norm_type="bogus"), "qk_norm_type='bogus' is unknown"),
    (dict(num_heads=4, rope=True), "rope needs an even head dimension, got 15"),
    (dict(num_heads=4, num_kv_heads=3), "num_kv_heads=3 must divide num_heads=4"),
  ],
)
def test_direct_use_refuses_settings_a_spec_would_refuse(settings, message):
  """MultiHeadAttention used on its own (README's "Use it in your own model")
  names the bad setting instead of computing something else or failing deep
  inside (model dim 60: 4 heads of 15)."""
  x = jnp.zeros((1, 5, 60))
  with pytest.raises(ValueError, match=re.escape(message)):
    MultiHeadAttention(**settings).init(jax.random.PRNGKey(0), x)


# ------------------------------------------------- the XLA kernel's own VJP


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_xla_kernel_vjp_equals_autodiff_of_reference(dtype):
  """The default kernel's hand-written backward pass (laplax.kernels, from the
  saved P) gives the gradients that autodiff of the materialising reference
  gives: without a mask, with an arbitrary mask, causally with fewer
  queries than keys (a KV-cache chunk), and with a query whose keys are all
  masked (its q gradient is exactly 0: its output, the mean of v, does not
  depend on q) and an explicit scale, all in one compile; bfloat16 to its
  precision."""
  rng = np.random.default_rng(11)
  empty_row = np.array(MASKS["arbitrary"][0])
  empty_row[0, 0, 1, :] = False  # query 1 of example 0 may attend to nothing
  cases = [
    dict(mask=None, is_causal=False, tq=T, scale=None),
    dict(mask=jnp.asarray(MASKS["arbitrary"][0]), is_causal=False, tq=T, scale=None),
    dict(mask=None, is_causal=True, tq=3, scale=None),
    dict(mask=jnp.asarray(empty_row), is_causal=True, tq=T, scale=0.37),
  ]
  inputs = [
    tuple(jnp.asarray(a, dtype) for a in qkv(seed=20 + i, tq=c["tq"]))
    + (jnp.asarray(rng.normal(size=(B, c["tq"], N, D)), jnp.float32),)
    for i, c in enumerate(cases)
  ]

  def grads(impl, case, q, k, v, ct):
    def f(q, k, v):
      out = attend(
        q,
        k,
        v,
        laplacian=np.zeros(N, bool),
        mask=case["mask"],
        is_causal=case["is_causal"],
        implementation=impl,
        scale=case["scale"],
      )
      return jnp.sum(out.astype(jnp.float32) * ct)

    return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

  @jax.jit
  def all_grads(inputs):
    return [(grads("xla", c, *x), grads("reference", c, *x)) for c, x in zip(cases, inputs)]

  tol = TOL if dtype == jnp.float32 else dict(atol=3e-2, rtol=3e-2)
  for case, (g_xla, g_ref) in zip(cases, all_grads(inputs)):
    assert all(g.dtype == dtype for g in g_xla)
    assert all(float(jnp.abs(g.astype(jnp.float32)).max()) > 1e-3 for g in g_ref)
    chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), g_xla),
      jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), g_ref),
      custom_message=f"{case['is_causal']=}, mask {case['mask'] is not None}",
      **tol,
    )
    if case["scale"] is not None:  # the fully masked query row
      assert float(jnp.abs(g_xla[0][0, 1].astype(jnp.float32)).max()) == 0.0


# ------------------------------------------------------------------- rotary


def test_rotary_matches_numpy_rotation_and_is_relative():
  """rotary() rotates the pair (x_i, x_{i+d/2}) of a token at position t by
  t * theta^(-2i/d) (RoFormer eq. 34), and so q.k after rotation depends on
  the positions only through their difference."""
  from laplax.attention import rotary

  rng = np.random.default_rng(3)
  d, length = 8, 6
  x = rng.normal(size=(2, length, 3, d)).astype(np.float32)
  pos = np.array([0, 1, 2, 5, 9, 40])
  got = np.asarray(rotary(jnp.asarray(x), pos))
  angle = pos[:, None] * 10_000.0 ** (-np.arange(d // 2) / (d // 2))
  c, s = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
  x1, x2 = x[..., : d // 2], x[..., d // 2 :]
  want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  # <R_a q, R_b k> = <R_{a+7} q, R_{b+7} k>.
  q, k = jnp.asarray(x[:, :1]), jnp.asarray(x[:, 1:2])
  dot = lambda a, b: float(jnp.sum(rotary(q, np.array([a])) * rotary(k, np.array([b]))))
  np.testing.assert_allclose(dot(2, 5), dot(9, 12), rtol=1e-4)


def test_rotary_traced_positions_gather_the_same_table():
  """Traced positions (a KV cache's offset) read the NumPy table of
  max_length rows and equal concrete positions bit for bit; without
  max_length they are refused."""
  from laplax.attention import rotary

  x = jnp.asarray(np.random.default_rng(4).normal(size=(1, 3, 2, 8)), jnp.float32)
  traced = jax.jit(lambda x, s: rotary(x, s + jnp.arange(3), max_length=16))(x, 5)
  np.testing.assert_array_equal(np.asarray(traced), np.asarray(rotary(x, np.arange(5, 8))))
  with pytest.raises(ValueError, match="traced positions without max_length"):
    jax.jit(lambda x, s: rotary(x, s + jnp.arange(3)))(x, 5)
