"""Theorem 3.4 of Saratchandran & Lucey (2025) measured as stated: the Jacobian
of one head ``softmax(X W_Q W_K^T X^T * scale) X W_V`` with respect to the
weights ``(W_Q, W_K, W_V)``, against float64 finite differences and autodiff,
and the bound against the measured condition number on random heads.

The bound and each of its terms are checked against :func:`np_theorem_3_4`, a
NumPy transcription of the definitions in ``docs/methods.md`` (``kappa(A) =
sigma_max / sigma_min``; ``kappa(L)`` from the eigenvalues of the whole
``[T^2, T^2]`` matrix ``blockdiag_t(Diag(p_t) - p_t p_t^T)``), and against
closed forms: two-token rows, uniform and causal-uniform attention, identity
weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.analysis import conditioning

from helpers.theorem import assert_terms_match, np_condition, np_kappa_l, np_theorem_3_4


def np_head(x, wq, wk, wv, causal=False, scale=None):
  """float64 reference of one head."""
  scale = wq.shape[1] ** -0.5 if scale is None else scale
  logits = (x @ wq) @ (x @ wk).T * scale
  if causal:
    logits = np.where(np.tri(len(x), dtype=bool), logits, -np.inf)
  p = np.exp(logits - logits.max(1, keepdims=True))
  return (p / p.sum(1, keepdims=True)) @ (x @ wv)


def np_weight_jacobian(x, ws, causal=False, scale=1.0, h=1e-30):
  """The head's Jacobian in ``(W_Q, W_K, W_V)`` by complex-step differentiation
  (exact to rounding: ``Im f(w + i h) / h``), columns ``[vec W_Q | vec W_K | vec W_V]``."""
  cols = []
  for i, w in enumerate(ws):
    for idx in np.ndindex(w.shape):
      step = [v.astype(complex) for v in ws]
      step[i][idx] += 1j * h
      logits = (x @ step[0]) @ (x @ step[1]).T * scale
      visible = np.tri(len(x), dtype=bool) if causal else np.ones(logits.shape, bool)
      e = np.exp(logits - np.where(visible, logits.real, -np.inf).max(1, keepdims=True))
      e = e * visible
      cols.append(((e / e.sum(1, keepdims=True)) @ (x @ step[2])).imag.ravel() / h)
  return np.stack(cols, 1)


def approx_kappa(kappa):
  """``kappa`` up to the rounding of a float64 condition number (relative
  ``64 eps kappa``: the smallest singular value's absolute error is of order
  ``eps sigma_max``)."""
  return pytest.approx(kappa, rel=1e-9 + 64 * np.finfo(np.float64).eps * kappa)


def finite_difference_weight_jacobian(x, ws, causal, scale, h=1e-6):
  """Central differences in float64, columns ``[vec W_Q | vec W_K | vec W_V]``."""
  cols = []
  for i, w in enumerate(ws):
    for idx in np.ndindex(w.shape):
      up, down = [v.copy() for v in ws], [v.copy() for v in ws]
      up[i][idx] += h
      down[i][idx] -= h
      cols.append(
        ((np_head(x, *up, causal, scale) - np_head(x, *down, causal, scale)) / (2 * h)).ravel()
      )
  return np.stack(cols, 1)


def random_head(rng, t, dim, d, std=1.0):
  x = rng.normal(size=(t, dim))
  return x, [std * rng.normal(size=(dim, d)) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_weight_jacobian_matches_finite_differences(causal, scale):
  x, ws = random_head(np.random.default_rng(0), 4, 6, 3)
  jac = conditioning.weight_jacobian_matrix(x, *ws, causal=causal, scale=scale)
  fd = finite_difference_weight_jacobian(x, ws, causal, scale)
  assert jac.shape == (4 * 3, 3 * 6 * 3) and jac.dtype == np.float64
  np.testing.assert_allclose(jac, fd, atol=1e-7, rtol=1e-6)
  got = conditioning.weight_jacobian_condition(x, *ws, causal=causal, scale=scale)
  s = np.linalg.svd(fd, compute_uv=False)
  assert got["condition_number"] == pytest.approx(s[0] / s[-1], rel=1e-3)
  assert got["numerical_rank"] == 12 and got["shape"] == [12, 54]


def test_weight_jacobian_matches_autodiff():
  """An independent check: ``jax.jacrev`` of the float32 head in its weights."""
  x, ws = random_head(np.random.default_rng(1), 5, 8, 2, std=0.5)
  f = lambda wq, wk, wv: conditioning.single_head_attention(x, wq, wk, wv)
  parts = jax.jacrev(f, argnums=(0, 1, 2))(*(jnp.asarray(w, jnp.float32) for w in ws))
  auto = np.concatenate([np.asarray(p, np.float64).reshape(10, -1) for p in parts], 1)
  np.testing.assert_allclose(
    conditioning.weight_jacobian_matrix(x, *ws), auto, atol=1e-5, rtol=1e-4
  )


def test_logit_scale_is_a_column_scaling():
  """laplax's head (logits / sqrt(d)) at W_Q is the paper's at W_Q / sqrt(d),
  its Jacobian that one's with the W_Q columns scaled: the condition numbers
  differ by at most sqrt(d), and the scaled-logit bound is the unscaled bound
  at W_Q / sqrt(d)."""
  rng = np.random.default_rng(2)
  for _ in range(10):
    x, (wq, wk, wv) = random_head(rng, 4, 8, 4)
    s = 4**-0.5
    j = conditioning.weight_jacobian_matrix(x, wq, wk, wv)
    j_paper = conditioning.weight_jacobian_matrix(x, s * wq, wk, wv, scale=1.0)
    cols = np.ones(j.shape[1])
    cols[: wq.size] = s
    np.testing.assert_allclose(j, j_paper * cols, atol=1e-12, rtol=1e-9)
    out = conditioning.head_conditioning(x, wq, wk, wv)
    k_paper = conditioning.weight_jacobian_condition(x, s * wq, wk, wv, scale=1.0)
    assert out["weight_condition_number"] <= 2.0 * k_paper["condition_number"] + 1e-9
    assert out["theorem_3_4_scaled_logits"]["bound"] == pytest.approx(
      conditioning.theorem_3_4_bound(x, s * wq, wk, wv, scale=1.0)["bound"], rel=1e-9
    )


def test_bound_holds_on_random_heads_with_at_most_d_tokens():
  """100 random heads with T <= D tokens, causal and not, weights of std 0.1-2:
  wherever the weight Jacobian is numerically of full rank, the bound
  (unscaled logits, as stated) is never below its measured condition number.
  The exceptions are saturated heads: a row of P one-hot to float64 precision
  makes ``L_t = 0``, the W_Q / W_K columns vanish and the Jacobian is singular
  in floating point, while ``kappa(L)`` read on the numerical range of L stays
  finite."""
  rng = np.random.default_rng(3)
  checked = 0
  for i in range(100):
    dim = int(rng.integers(3, 9))
    t, d = int(rng.integers(2, dim + 1)), int(rng.integers(1, 5))
    x, ws = random_head(rng, t, dim, d, std=float(rng.choice([0.1, 0.5, 1.0, 2.0])))
    causal = bool(i % 2)
    out = conditioning.head_conditioning(x, *ws, causal=causal)
    # Both sides against NumPy: the terms from their definitions, the measured
    # condition number from a complex-step Jacobian.
    assert_terms_match(out["theorem_3_4"], np_theorem_3_4(x, *ws, causal))
    assert_terms_match(
      out["theorem_3_4_scaled_logits"], np_theorem_3_4(x, *ws, causal, scale=d**-0.5)
    )
    measured = np_condition(np_weight_jacobian(x, ws, causal))
    assert out["bound_holds"] == (
      out["theorem_3_4"]["bound"] >= out["weight_condition_number_unscaled"]
    )
    if out["weight_numerical_rank"] < min(out["weight_jacobian_shape"]):
      assert out["weight_condition_number_unscaled"] > 1e12 and measured > 1e12  # saturated
      continue
    checked += 1
    assert out["weight_condition_number_unscaled"] == approx_kappa(measured)
    assert out["weight_condition_number"] == approx_kappa(
      np_condition(np_weight_jacobian(x, ws, causal, scale=d**-0.5))
    )
    assert out["bound_holds"] and out["theorem_3_4"]["bound"] >= measured, (i, t, dim, d)
  assert checked >= 85  # 89 of 100 with this seed


def test_bound_on_a_saturated_head_is_vacuous():
  """Weights of std 5 on two causal tokens: P = [[1, 0], [1 - e, e]] with e
  about 1e-23, the Jacobian loses the W_Q / W_K directions (rank d_v of 2
  d_v), and the bound holds only through ``kappa(softmax) = 2 / e`` to
  leading order (``sigma_min(P) = det P / sigma_max(P)``, ``det P = e``,
  ``sigma_max(P) = sqrt(2)``): astronomically large. Row 0 is one-hot,
  ``L_0 = 0``, so ``kappa(L)`` is row 1's alone, 1."""
  x, ws = random_head(np.random.default_rng(3), 2, 6, 4, std=5.0)
  out = conditioning.head_conditioning(x, *ws, causal=True)
  assert out["weight_numerical_rank"] == 4
  assert out["weight_condition_number_unscaled"] > 1e12
  logits = (x @ ws[0]) @ (x @ ws[1]).T
  e = 1.0 / (1.0 + np.exp(logits[1, 0] - logits[1, 1]))
  assert e < 1e-20
  terms = out["theorem_3_4"]
  assert terms["kappa_softmax"] == pytest.approx(2.0 / e, rel=1e-6)
  assert terms["kappa_l"] == 1.0
  assert_terms_match(terms, np_theorem_3_4(x, *ws, causal=True))
  assert out["bound_holds"] == (terms["bound"] >= out["weight_condition_number_unscaled"])


def test_bound_fails_when_tokens_exceed_width():
  """T > D: ``P X`` has rank D < T, the weight Jacobian ``[T d, 3 D d]`` is
  rank-deficient (condition number ~1/eps or inf) while every term of the
  bound stays finite: the theorem needs X of full row rank."""
  x, ws = random_head(np.random.default_rng(4), 8, 3, 4)
  out = conditioning.head_conditioning(x, *ws)
  assert out["weight_numerical_rank"] < 8 * 4
  assert np.isfinite(out["theorem_3_4"]["bound"])
  assert not out["bound_holds"]


def test_softmax_jacobian_condition_closed_forms():
  """``kappa(L)`` on rows whose eigenvalues are known: a two-token row ``(a,
  1 - a)`` has ``L_t`` eigenvalues ``{0, 2 a (1 - a)}``; a uniform row over
  ``m`` keys has ``1/m`` (``m - 1`` times) and 0; a one-hot row has only 0."""
  a, b = 0.5, 0.1
  assert conditioning.softmax_jacobian_condition([[a, 1 - a], [b, 1 - b]]) == pytest.approx(
    (a * (1 - a)) / (b * (1 - b)), rel=1e-12
  )
  for t in (2, 3, 7):
    uniform = np.full((t, t), 1.0 / t)
    assert conditioning.softmax_jacobian_condition(uniform) == pytest.approx(1.0, rel=1e-9)
    # Causal-uniform rows: row t spreads over t + 1 keys; row 0 is one-hot.
    causal = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    assert conditioning.softmax_jacobian_condition(causal) == pytest.approx(t / 2, rel=1e-9)
  assert conditioning.softmax_jacobian_condition(np.eye(3)) == np.inf
  rng = np.random.default_rng(8)
  for t in (2, 4, 6):
    p = rng.dirichlet(np.full(t, 0.7), size=t)
    assert conditioning.softmax_jacobian_condition(p) == pytest.approx(np_kappa_l(p), rel=1e-9)


def test_bound_with_identity_weights_closed_form():
  """``X = [diag(s_1, s_2) | 0]``, ``W_Q = W_K = W_V = I``: the logits are
  ``diag(s_t^2)``, so row ``t`` of P is ``(a_t, 1 - a_t)`` (or reversed) with
  ``a_t = sigmoid(s_t^2)``; every weight has ``kappa = 1``, ``kappa(X) =
  s_1 / s_2``, ``kappa(L) = max / min of a_t (1 - a_t)``, and ``kappa(P)``
  from the 2 x 2 singular values ``sqrt((F^2 +- sqrt(F^4 - 4 det^2)) / 2)``."""
  s1, s2 = 2.0, 1.0
  x = np.array([[s1, 0.0, 0.0], [0.0, s2, 0.0]])
  eye = np.eye(3)
  a1, a2 = 1 / (1 + np.exp(-(s1**2))), 1 / (1 + np.exp(-(s2**2)))
  det, frob2 = a1 + a2 - 1, a1**2 + (1 - a1) ** 2 + a2**2 + (1 - a2) ** 2
  root = np.sqrt(frob2**2 - 4 * det**2)
  kappa_p = np.sqrt((frob2 + root) / (frob2 - root))
  v1, v2 = a1 * (1 - a1), a2 * (1 - a2)
  kappa_l = max(v1, v2) / min(v1, v2)
  want = {
    "kappa_x": s1 / s2,
    "kappa_l": kappa_l,
    "kappa_softmax": kappa_p,
    "kappa_wq": 1.0,
    "kappa_wk": 1.0,
    "kappa_wv": 1.0,
    "bound": (s1 / s2) ** 3 * kappa_l * 1.0 * (1.0 + 1.0) + (s1 / s2) * kappa_p,
  }
  assert_terms_match(conditioning.theorem_3_4_bound(x, eye, eye, eye, scale=1.0), want)
  # laplax's default logit scale 1/sqrt(d) = 1/sqrt(3): the same with s_t^2 / sqrt(3).
  assert_terms_match(
    conditioning.theorem_3_4_bound(x, eye, eye, eye),
    np_theorem_3_4(x, eye, eye, eye, scale=3**-0.5),
  )


def test_bound_with_uniform_attention_closed_form():
  """Queries orthogonal to the input (``X W_Q = 0``) make every logit 0: P is
  uniform (rank 1: ``kappa(softmax) = inf``, ``kappa(L) = 1``) and, causal,
  uniform over the visible keys: ``kappa(L) = T / 2`` (rows over 2..T keys)
  and ``kappa(softmax)`` that of ``tril(1) / (1..T)``."""
  t, dim, d = 4, 6, 2
  rng = np.random.default_rng(9)
  s = np.array([1.0, 2.0, 3.0, 4.0])
  x = np.concatenate([np.diag(s), np.zeros((t, dim - t))], 1)
  wq = np.concatenate([np.zeros((t, d)), rng.normal(size=(dim - t, d))])
  wk, wv = rng.normal(size=(dim, d)), rng.normal(size=(dim, 3))
  kq, kk, kv = (np.linalg.cond(w) for w in (wq, wk, wv))
  causal_p = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
  kappa_p = np.linalg.cond(causal_p)
  want = {
    "kappa_x": 4.0,
    "kappa_l": t / 2,
    "kappa_softmax": kappa_p,
    "kappa_wq": kq,
    "kappa_wk": kk,
    "kappa_wv": kv,
    "bound": 4.0**3 * (t / 2) * kv * (kq + kk) + 4.0 * kappa_p,
  }
  assert_terms_match(conditioning.theorem_3_4_bound(x, wq, wk, wv, causal=True, scale=1.0), want)
  full = conditioning.theorem_3_4_bound(x, wq, wk, wv, scale=1.0)
  assert full["kappa_l"] == pytest.approx(1.0, rel=1e-9)
  assert full["kappa_softmax"] > 1e15 and full["bound"] > 1e15  # rank-1 P: inf up to rounding


@pytest.mark.parametrize("causal", [False, True])
def test_head_conditioning_against_numpy(causal):
  """``head_conditioning`` against the complex-step Jacobian (both logit
  scales) and the transcribed bound, on heads with ``T <= D``."""
  rng = np.random.default_rng(10)
  for t, dim, d in ((3, 5, 2), (4, 4, 3), (5, 8, 4)):
    x, ws = random_head(rng, t, dim, d, std=0.7)
    out = conditioning.head_conditioning(x, *ws, causal=causal)
    unscaled = np_weight_jacobian(x, ws, causal)
    assert out["weight_condition_number_unscaled"] == approx_kappa(np_condition(unscaled))
    assert out["weight_condition_number"] == approx_kappa(
      np_condition(np_weight_jacobian(x, ws, causal, scale=d**-0.5))
    )
    assert out["weight_jacobian_shape"] == list(unscaled.shape)
    assert out["weight_numerical_rank"] == np.linalg.matrix_rank(unscaled) == t * d
    assert_terms_match(out["theorem_3_4"], np_theorem_3_4(x, *ws, causal))
    assert_terms_match(
      out["theorem_3_4_scaled_logits"], np_theorem_3_4(x, *ws, causal, scale=d**-0.5)
    )
    assert out["bound_holds"] is True
