"""Tests of laplax.analysis (geometry, conditioning, capture, report, plots, compare)
and of ``eval.py --analysis`` / ``python -m laplax.analysis.compare``.

References are NumPy float64 transcriptions of the definitions in laplax/analysis/geometry.py's docstring on all
tokens at once:

* ANOVA: ``total = 1/N sum ||h - mu_G||^2``, ``within_sequence = 1/N sum ||h -
  mu_s||^2``, ``between_sequence = 1/N sum_s n_s ||mu_s - mu_G||^2``, split into
  ``within_class = 1/N sum_s n_s ||mu_s - m_c||^2`` and ``between_class = 1/N
  sum_c N_c ||m_c - mu_G||^2``.
* NC on sequence means: ``Sigma_W``, ``Sigma_B`` (Papyan et al. 2020), ``nc1 =
  tr(Sigma_W pinv(Sigma_B)) / C``, cosines of centred class means, ``nc3``,
  CDNV (Galanti et al. 2022) by explicit loops over class pairs.
* A simplex ETF ``M = sqrt(C/(C-1)) (I - 11^T/C) U^T`` has equal norms and
  pairwise cosines ``-1/(C-1)``: equinorm, equiangularity, max-angle 0.
* Spectrum: ``np.linalg.svd`` of the centred token matrix.
* Jacobian: central finite differences of a float64 NumPy attention head.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.analysis import capture, compare, conditioning, geometry, report, summary

from helpers.models import make_gpt, make_vit
from helpers.runs import CONFIG, ROOT, TINY, run_in_process
from helpers.theorem import assert_terms_match, np_theorem_3_4

# ------------------------------------------------------------ NumPy reference


def etf(num_classes, dim, rng, scale=3.0):
  """Rows of a simplex ETF ``[C, D]`` (unit-free scale), embedded by an orthonormal U."""
  u, _ = np.linalg.qr(rng.normal(size=(dim, num_classes)))
  m = np.eye(num_classes) - 1.0 / num_classes
  return scale * np.sqrt(num_classes / (num_classes - 1)) * m @ u.T


def reference(tokens, mask, labels, num_classes, classifier=None):
  """All-at-once float64 geometry of ``tokens [B, T, D]`` (``mask [B, T]``)."""
  x = np.asarray(tokens, np.float64)
  m = np.asarray(mask, bool)
  keep = m.any(1)
  x, m, labels = x[keep], m[keep], np.asarray(labels)[keep]
  flat = x[m]
  n = len(flat)
  mu = flat.mean(0)
  n_s = m.sum(1)
  seq = np.stack([x[i][m[i]].mean(0) for i in range(len(x))])
  out = {
    "total": np.sum((flat - mu) ** 2) / n,
    "within_sequence": sum(np.sum((x[i][m[i]] - seq[i]) ** 2) for i in range(len(x))) / n,
    "between_sequence": np.sum(n_s[:, None] * (seq - mu) ** 2) / n,
  }
  classes = np.unique(labels)
  tok_mean = {c: flat[np.repeat(labels, n_s) == c].mean(0) for c in classes}
  out["within_class"] = (
    sum(n_s[i] * np.sum((seq[i] - tok_mean[labels[i]]) ** 2) for i in range(len(x))) / n
  )
  out["between_class"] = (
    sum(np.sum(np.repeat(labels, n_s) == c) * np.sum((tok_mean[c] - mu) ** 2) for c in classes) / n
  )
  out["singular_values"] = np.linalg.svd(flat - mu, compute_uv=False)
  # Neural collapse on sequence means.
  means = np.stack([seq[labels == c].mean(0) for c in classes])
  g = seq.mean(0)
  centred = means - g
  dev = seq - means[np.searchsorted(classes, labels)]
  sigma_w = dev.T @ dev / len(seq)
  sigma_b = centred.T @ centred / len(classes)
  out["nc1"] = np.trace(sigma_w @ np.linalg.pinv(sigma_b, rcond=1e-10, hermitian=True)) / len(
    classes
  )
  norms = np.linalg.norm(centred, axis=1)
  out["equinorm"] = norms.std() / norms.mean()
  cos = [
    centred[a] @ centred[b] / norms[a] / norms[b]
    for a in range(len(classes))
    for b in range(len(classes))
    if a != b
  ]
  out["equiangularity"] = np.std(cos)
  out["max_angle"] = np.mean(np.abs(np.asarray(cos) + 1.0 / (len(classes) - 1)))
  var = [np.mean(np.sum((seq[labels == c] - means[i]) ** 2, 1)) for i, c in enumerate(classes)]
  out["cdnv"] = np.mean(
    [
      (var[a] + var[b]) / 2 / np.sum((means[a] - means[b]) ** 2)
      for a in range(len(classes))
      for b in range(a + 1, len(classes))
    ]
  )
  if classifier is not None:
    w = np.asarray(classifier)[classes]
    out["nc3"] = np.sum((centred / np.linalg.norm(centred) - w / np.linalg.norm(w)) ** 2)
  return out


def random_batch(rng, b=6, t=5, d=4, classes=3, offset=50.0):
  tokens = rng.normal(size=(b, t, d)) * rng.uniform(0.5, 2.0, size=(1, 1, d)) + offset
  tokens += rng.normal(size=(b, 1, d))  # sequences differ
  mask = rng.random((b, t)) < 0.8
  mask[:, 0] = True
  labels = rng.integers(0, classes, size=b)
  return tokens, mask, labels


# ------------------------------------------------------------ geometry


def test_simplex_etf_has_zero_nc1_equiangularity_max_angle():
  rng = np.random.default_rng(0)
  c, d, t = 5, 8, 3
  means = etf(c, d, rng) + 7.0  # any global offset
  labels = np.repeat(np.arange(c), 4)
  # Tokens vary within each sequence, but every sequence mean is its class mean.
  wiggle = rng.normal(size=(len(labels), t, d))
  wiggle -= wiggle.mean(1, keepdims=True)
  tokens = means[labels][:, None, :] + wiggle
  acc = geometry.GeometryAccumulator(d, num_classes=c)
  acc.update(tokens, labels=labels)
  classifier = etf(c, d, np.random.default_rng(0), scale=0.5)  # same directions, other scale
  out = acc.finalize(classifier=classifier)["classes"]
  assert out["num_classes"] == c
  for key in ("nc1", "equinorm", "equiangularity", "max_angle", "cdnv", "nc3"):
    assert abs(out[key]) < 1e-9, (key, out[key])
  # Small within-class noise: NC1 small, still positive.
  noisy = tokens + 1e-3 * rng.normal(size=(len(labels), 1, d))
  acc = geometry.GeometryAccumulator(d, num_classes=c)
  acc.update(noisy, labels=labels)
  nc1 = acc.finalize()["classes"]["nc1"]
  assert 0 < nc1 < 1e-5


@pytest.mark.parametrize("rank", [1, 3, 7])
def test_rank_r_token_matrix_needs_r_components(rank):
  rng = np.random.default_rng(rank)
  n, d = 60, 12
  a = rng.normal(size=(n, rank))
  q, _ = np.linalg.qr(a - a.mean(0))  # orthonormal, zero-mean columns
  v, _ = np.linalg.qr(rng.normal(size=(d, rank)))
  tokens = (5.0 * q @ v.T + rng.normal(size=d)).reshape(6, 10, d)
  acc = geometry.GeometryAccumulator(d)
  for i in range(0, 6, 4):  # streamed in two batches
    acc.update(tokens[i : i + 4])
  out = acc.finalize()
  assert out["components_99"] == rank
  np.testing.assert_allclose(out["singular_values"][:rank], 5.0, rtol=1e-9)
  assert max(out["singular_values"][rank:], default=0.0) < 1e-6
  assert geometry.components_for(np.array([10.0, 1.5, 0.1]), 0.99) == 2


def test_per_sequence_components_are_the_mean_of_each_sequences_own_pca():
  """Each sequence's count from np.linalg.svd of its own centred tokens, averaged;
  sequences of given ranks, one masked to one token (no variance: left out)."""
  rng = np.random.default_rng(5)
  d, length, ranks = 12, 20, [1, 4, 2, 9, 3]
  tokens = np.stack(
    [
      rng.normal(size=(length, r)) @ rng.normal(size=(r, d)) * (1 + s) + rng.normal(size=d)
      for s, r in enumerate(ranks)
    ]
  )
  tokens[2] += 1e-3 * rng.normal(size=(length, d))  # full rank, 99% still in 2
  mask = np.ones((len(ranks), length))
  mask[3, 1:] = 0
  mask[4, 15:] = 0

  def count(x):
    sv = np.linalg.svd(x - x.mean(0), compute_uv=False)
    cum = np.cumsum(sv**2) / np.sum(sv**2)
    return int(np.argmax(cum >= 0.99) + 1)

  want = [count(tokens[s][mask[s] > 0]) for s in (0, 1, 2, 4)]
  assert want == [1, 4, 2, 3]
  acc = geometry.GeometryAccumulator(d)
  acc.update(tokens[:2], mask=mask[:2])
  acc.update(tokens[2:], mask=mask[2:])  # streamed
  out = acc.finalize()
  assert out["components_99_per_sequence"] == pytest.approx(np.mean(want), abs=1e-12)
  assert out["sequences_with_variance"] == 4
  # The all-token PCA is another number: the sequences span more directions together.
  assert out["components_99"] > max(want)
  assert summary.summary({"layers": [dict(out, layer=0)]})["components_99_per_sequence"] == [
    np.mean(want)
  ]


def test_anova_parts_add_up_and_match_reference():
  rng = np.random.default_rng(1)
  tokens, mask, labels = random_batch(rng, b=9, t=7, d=5, classes=3, offset=1e3)
  acc = geometry.GeometryAccumulator(5, num_classes=3)
  acc.update(tokens, mask=mask, labels=labels)
  out = acc.finalize()
  a, f = out["anova"], out["fractions"]
  assert a["within_sequence"] + a["between_sequence"] == pytest.approx(a["total"], rel=1e-6)
  # The fractions the paper reads: within + between-sequence = 1 to 1e-6.
  assert f["within_sequence"] + f["between_sequence"] == pytest.approx(1.0, abs=1e-6)
  assert f["between_class"] == pytest.approx(a["between_class"] / a["total"], rel=1e-12)
  assert 0 < f["within_class"] < 1 and 0 < f["between_class"] < 1
  assert a["within_class"] + a["between_class"] == pytest.approx(a["between_sequence"], rel=1e-6)
  ref = reference(tokens, mask, labels, 3)
  for key in a:
    assert a[key] == pytest.approx(ref[key], rel=1e-8), key


def test_streamed_statistics_equal_all_at_once_reference():
  rng = np.random.default_rng(2)
  b, t, d, c = 23, 6, 5, 4
  tokens, mask, labels = random_batch(rng, b=b, t=t, d=d, classes=c, offset=200.0)
  mask[3] = False  # a sequence without tokens is skipped
  classifier = rng.normal(size=(c, d))
  acc = geometry.GeometryAccumulator(d, num_classes=c)
  for start in (0, 5, 6, 14):  # uneven batches
    stop = {0: 5, 5: 6, 6: 14, 14: b}[start]
    acc.update(tokens[start:stop], mask=mask[start:stop], labels=labels[start:stop])
  streamed = acc.finalize(classifier=classifier)
  once = geometry.GeometryAccumulator(d, num_classes=c)
  once.update(tokens, mask=mask, labels=labels)
  once = once.finalize(classifier=classifier)
  ref = reference(tokens, mask, labels, c, classifier)
  assert streamed["num_sequences"] == b - 1 and streamed["num_tokens"] == mask.sum()
  for key in ("total", "within_sequence", "between_sequence", "within_class", "between_class"):
    assert streamed["anova"][key] == pytest.approx(ref[key], rel=1e-9), key
    assert streamed["anova"][key] == pytest.approx(once["anova"][key], rel=1e-12), key
  np.testing.assert_allclose(streamed["singular_values"], ref["singular_values"], rtol=1e-8)
  for key in ("nc1", "equinorm", "equiangularity", "max_angle", "cdnv", "nc3"):
    assert streamed["classes"][key] == pytest.approx(ref[key], rel=1e-8), key
    assert streamed["classes"][key] == pytest.approx(once["classes"][key], rel=1e-10), key


def test_token_classes_cdnv_streamed_equals_reference():
  rng = np.random.default_rng(3)
  tokens = rng.normal(size=(8, 9, 3)) + 10.0
  mask = np.ones((8, 9), bool)
  mask[-1, 4:] = False
  ids = rng.integers(0, 5, size=(8, 9))
  acc = geometry.GeometryAccumulator(3, num_token_classes=5)
  for i in range(0, 8, 3):
    acc.update(tokens[i : i + 3], mask=mask[i : i + 3], token_labels=ids[i : i + 3])
  out = acc.finalize()["token_classes"]
  x, y = tokens[mask], ids[mask]
  means = np.stack([x[y == k].mean(0) for k in range(5)])
  var = [np.mean(np.sum((x[y == k] - means[k]) ** 2, 1)) for k in range(5)]
  cdnv = np.mean(
    [
      (var[a] + var[b]) / 2 / np.sum((means[a] - means[b]) ** 2)
      for a in range(5)
      for b in range(a + 1, 5)
    ]
  )
  assert out["cdnv"] == pytest.approx(cdnv, rel=1e-8)
  assert out["num_examples"] == mask.sum() and out["num_classes"] == 5


def test_accumulator_memory_is_independent_of_token_count():
  d, c, v = 6, 3, 11
  acc = geometry.GeometryAccumulator(d, num_classes=c, num_token_classes=v)
  rng = np.random.default_rng(4)
  for _ in range(5):
    acc.update(
      rng.normal(size=(20, 30, d)),
      labels=rng.integers(0, c, 20),
      token_labels=rng.integers(0, v, (20, 30)),
    )
  words = sum(a.size for a in vars(acc).values() if isinstance(a, np.ndarray))
  # Documented bound: D^2 + 2D (+ D^2 + C(2D + 3)) (+ V(D + 2)) float64 words.
  assert words == d * d + 2 * d + d * d + c * (2 * d + 3) + v * (d + 2)


def test_accumulator_rejects_bad_input():
  acc = geometry.GeometryAccumulator(4, num_classes=2)
  with pytest.raises(ValueError, match="labels are required"):
    acc.update(np.zeros((2, 3, 4)))
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    acc.update(np.zeros((2, 3, 4)), labels=np.array([0, 2]))
  with pytest.raises(ValueError, match="tokens must be"):
    acc.update(np.zeros((2, 3, 5)), labels=np.array([0, 1]))
  with pytest.raises(ValueError, match="no tokens"):
    geometry.GeometryAccumulator(4).finalize()


# ------------------------------------------------------------ conditioning


def test_svd_correction_condition_number_at_most_two():
  rng = np.random.default_rng(5)
  for shape in [(8, 8), (16, 8), (8, 16), (32, 32)]:
    w = rng.normal(size=shape) @ np.diag(np.logspace(0, -4, shape[1]))  # ill-conditioned
    out = conditioning.kernel_conditioning(w, num_heads=2, mode="svd")
    assert out["raw"]["condition_number"] == pytest.approx(np.linalg.cond(w), rel=1e-3)
    assert out["raw"]["condition_number"] > 100
    assert out["corrected"]["condition_number"] <= 2.0 + 1e-5
  # lambda * I_k per head: each head block becomes well conditioned.
  w = 0.02 * rng.normal(size=(16, 16))
  out = conditioning.kernel_conditioning(w, num_heads=4, lam=10.0, mode="per_head")
  assert max(out["corrected"]["head_condition_number"]) < 1.05
  assert out["corrected"]["head_min_singular_value"][0] > 9.0


def np_head(x, wq, wk, wv):
  logits = (x @ wq) @ (x @ wk).T / np.sqrt(wq.shape[1])
  p = np.exp(logits - logits.max(1, keepdims=True))
  return (p / p.sum(1, keepdims=True)) @ (x @ wv)


def finite_difference_jacobian(f, x, eps=1e-6):
  cols = []
  for i in range(x.size):
    e = np.zeros(x.size)
    e[i] = eps
    cols.append((f(x + e.reshape(x.shape)) - f(x - e.reshape(x.shape))).ravel() / (2 * eps))
  return np.stack(cols, 1)


def test_jacobian_condition_matches_finite_differences():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(4, 3))
  wq, wk, wv = (rng.normal(size=(3, 3)) for _ in range(3))
  fd = finite_difference_jacobian(lambda z: np_head(z, wq, wk, wv), x)
  jac = conditioning.jacobian_matrix(
    conditioning.single_head_attention, x, *(jnp.asarray(w, jnp.float32) for w in (wq, wk, wv))
  )
  np.testing.assert_allclose(jac, fd, atol=2e-5 * np.abs(fd).max())
  got = conditioning.jacobian_condition(
    conditioning.single_head_attention, x, *(jnp.asarray(w, jnp.float32) for w in (wq, wk, wv))
  )
  assert got["condition_number"] == pytest.approx(np.linalg.cond(fd), rel=1e-3)
  # Theorem 3.4's bound is reported beside it with its terms.
  bound = conditioning.theorem_3_4_bound(x, wq, wk, wv)
  assert bound["kappa_wq"] == pytest.approx(np.linalg.cond(wq), rel=1e-4)
  # Each term and the bound against the NumPy transcription of their definitions.
  assert_terms_match(bound, np_theorem_3_4(x, wq, wk, wv, scale=3**-0.5))


def test_attention_block_jacobian_matches_finite_differences():
  """The model's own attention block (rebuilt by capture), float32 central differences.

  The block's Jacobian is ill-conditioned (about 1e4 at initialisation), beyond
  what float32 differences resolve in sigma_min, so the matrix and sigma_max
  are compared; the condition number is checked against float64 differences
  in the single-head test above.
  """
  model = make_vit(
    num_classes=0, patch_size=7, width=8, depth=1, mlp_dim=8, num_heads=2, pool="gap"
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 14, 14, 1)))["params"]
  module, kwargs = capture.attention_module(model, 0)
  attn = capture.attention_params(params, 0)
  fn = report._block_fn(module, False, tuple(bool(b) for b in kwargs["laplacian"]))
  jitted = jax.jit(fn)
  f = lambda y: np.asarray(jitted(jnp.asarray(y, jnp.float32), attn), np.float64)
  y = np.random.default_rng(7).normal(size=(4, 8))
  fd = finite_difference_jacobian(f, y, eps=1e-2)
  jac = conditioning.jacobian_matrix(fn, y, attn)
  np.testing.assert_allclose(jac, fd, atol=1e-3 * np.abs(fd).max())
  got = conditioning.jacobian_condition(fn, y, attn)
  assert got["shape"] == [32, 32]
  assert got["sigma_max"] == pytest.approx(np.linalg.norm(fd, 2), rel=1e-3)
  assert got["condition_number"] == pytest.approx(np.linalg.cond(jac), rel=1e-6)


def test_attention_entropy_uniform_and_one_hot():
  t = 5
  uniform = jnp.full((2, 3, t, t), 1.0 / t)
  ent, top, count = conditioning.attention_entropy(uniform)
  np.testing.assert_allclose(np.asarray(ent) / count, np.log(t), rtol=1e-6)
  assert float(top) / float(count) == pytest.approx(np.log(t), rel=1e-6)
  one_hot = jnp.broadcast_to(jnp.eye(t), (2, 3, t, t))
  ent, top, count = conditioning.attention_entropy(one_hot, causal=True)
  np.testing.assert_allclose(np.asarray(ent), 0.0, atol=1e-6)
  assert float(top) / float(count) == pytest.approx(np.mean(np.log(np.arange(1, t + 1))))


# ------------------------------------------------------------ capture and report


def tiny_vit(scan):
  return make_vit(
    num_classes=3,
    patch_size=7,
    width=16,
    depth=2,
    mlp_dim=16,
    num_heads=2,
    num_laplacian_heads=(0, 1),
    spectral_lam=10.0,
    scan_layers=scan,
  )


def test_sow_is_a_no_op_unless_intermediates_are_mutable():
  model = tiny_vit(False)
  x = jnp.zeros((2, 14, 14, 1))
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)["params"]
  plain = jax.make_jaxpr(lambda p: model.apply({"params": p}, x))(params)
  sown = jax.make_jaxpr(lambda p: model.apply({"params": p}, x, mutable=["intermediates"]))(params)
  # The training/eval path traces no second attention and returns no collection;
  # with "intermediates" mutable each layer adds the reference P [B, H, T, T].
  assert len(plain.eqns) < len(sown.eqns)
  shapes = jax.eval_shape(
    lambda p: model.apply({"params": p}, x, mutable=["intermediates"]), params
  )
  assert len(jax.tree_util.tree_leaves(plain.out_avals)) == len(
    jax.tree_util.tree_leaves(shapes[0])
  )
  p = capture.attention_weights(shapes[1]["intermediates"], 1)
  assert p.shape == (2, 2, 5, 5) and p.dtype == jnp.float32


def image_batches(rng, n, batch):
  images = rng.normal(size=(n, 14, 14, 1)).astype(np.float32)
  labels = rng.integers(0, 3, size=n).astype(np.int32)
  for i in range(0, n, batch):
    part, lab = images[i : i + batch], labels[i : i + batch]
    mask = np.ones(len(part), np.float32)
    if len(part) < batch:  # padded like images.eval_batches
      pad = batch - len(part)
      part = np.concatenate([part, np.zeros((pad, 14, 14, 1), np.float32)])
      lab = np.concatenate([lab, np.zeros(pad, np.int32)])
      mask = np.concatenate([mask, np.zeros(pad, np.float32)])
    yield {"image": part, "label": lab, "mask": mask}


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_run_analysis_vit_streams_and_rebuilds_blocks(scan):
  model = tiny_vit(scan)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 14, 14, 1)))["params"]
  target = report.Target(
    model,
    params,
    "image",
    num_classes=3,
    classifier=np.asarray(params["head"]["kernel"]).T,
    spectral={"enabled": True, "lam": 10.0, "mode": "per_head"},
  )
  a = report.run_analysis(
    target,
    image_batches(np.random.default_rng(0), 11, 8),
    layers=[0, 1],
    batch_size=3,
    max_examples=10,
  )
  assert a["num_sequences"] == 10 and a["num_tokens"] == 10 * 5
  b = report.run_analysis(
    target,
    image_batches(np.random.default_rng(0), 11, 4),
    layers=[0, 1],
    batch_size=3,
    max_examples=10,
    jacobian_dim=0,
  )
  # Other batches (so other chunks and padding) give the same statistics.
  assert b["layers"][1]["anova"] == pytest.approx(a["layers"][1]["anova"], rel=1e-6)
  assert b["layers"][1]["classes"] == pytest.approx(a["layers"][1]["classes"], rel=1e-6)
  for entry in a["layers"]:
    assert 0 < min(entry["attention_entropy"])
    assert max(entry["attention_entropy"]) <= entry["attention_entropy_uniform"] + 1e-5
  for entry in a["layers"]:
    anova = entry["anova"]
    assert anova["within_sequence"] + anova["between_sequence"] == pytest.approx(
      anova["total"], rel=1e-6
    )
    assert entry["jacobian"]["block_check"] < 1e-5
    assert len(entry["jacobian"]["heads"]) == 2
    assert entry["weights"]["query"]["effective"] == "corrected"
    assert len(entry["attention_entropy"]) == 2
    assert entry["classes"]["num_classes"] == 3
  assert a["features"]["classes"]["nc3"] is None  # zero-initialised head: undefined
  json.dumps(a, allow_nan=False)


def np_smoothing_cosine(o, w, x, mask):
  """NumPy float64 reference: per head, the mean over counted tokens of
  cos(o_h W_h, x - mu_s), tokens with a zero vector left out."""
  o, w, x, m = (np.asarray(a, np.float64) for a in (o, w, x, mask))
  mu = (x * m[..., None]).sum(1, keepdims=True) / m.sum(1)[:, None, None]
  dev = x - mu
  out = []
  for h in range(w.shape[0]):
    vals = []
    for b in range(x.shape[0]):
      for t in range(x.shape[1]):
        c = o[b, t, h] @ w[h]
        if m[b, t] and np.linalg.norm(c) > 0 and np.linalg.norm(dev[b, t]) > 0:
          vals.append(c @ dev[b, t] / (np.linalg.norm(c) * np.linalg.norm(dev[b, t])))
    out.append(np.mean(vals) if vals else None)
  return out


def test_smoothing_cosine_is_minus_one_for_the_negative_deviation_and_matches_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 5, 4))
  mask = np.ones((3, 5))
  mask[2, 3:] = 0
  mu = (x * mask[..., None]).sum(1, keepdims=True) / mask.sum(1)[:, None, None]
  dev = x - mu
  eye = np.stack([np.eye(4), 2.5 * np.eye(4)])  # two heads, W_h = I and 2.5 I
  o = np.stack([-dev, 0.3 * dev], axis=2)  # head 0 smooths exactly, head 1 sharpens
  total, count = geometry.smoothing_cosine_sums(o, eye, x, mask)
  np.testing.assert_allclose(np.asarray(total) / np.asarray(count), [-1.0, 1.0], atol=1e-6)
  assert np.asarray(count).tolist() == [13.0, 13.0]  # the 2 padded tokens are not counted
  # Random heads against the NumPy formula; a head whose output is zero at
  # some tokens (a causal Laplacian head at token 0) leaves them out.
  o = rng.normal(size=(3, 5, 2, 3))
  o[:, 0, 1] = 0.0
  w = rng.normal(size=(2, 3, 4))
  total, count = geometry.smoothing_cosine_sums(o, w, x, mask)
  np.testing.assert_allclose(
    np.asarray(total) / np.asarray(count), np_smoothing_cosine(o, w, x, mask), atol=1e-5
  )
  assert np.asarray(count).tolist() == [13.0, 10.0]


@pytest.mark.slow
def test_head_contributions_add_up_to_the_attention_branch():
  """sum_h o_h W_O[h] * gamma + gamma * b = the block's attention branch, so
  the smoothing cosine reads what each head adds to the residual stream; the
  analysis reports it per head and averaged over the spec's Laplacian heads."""
  model = make_vit(
    num_classes=3,
    patch_size=7,
    width=16,
    depth=2,
    num_heads=2,
    mlp_dim=16,
    num_laplacian_heads=1,
    layerscale_init=0.5,
    pool="gap",
  )
  images = jax.random.normal(jax.random.PRNGKey(3), (4, 14, 14, 1))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])["params"]
  params = jax.tree_util.tree_map(
    lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(a.size), a.shape), params
  )  # LayerScale and biases off their init
  out, inter = capture.analysis_apply(model, params, images)
  for i in range(2):
    o = capture.head_outputs(inter, i)
    w = capture.head_out_kernels(params, i, 2)
    gamma = params[f"block{i}"]["ls1"]["scale"]
    branch = (
      jnp.einsum("bthd,hdD->btD", o, w) + gamma * params[f"block{i}"]["attention"]["out"]["bias"]
    )
    np.testing.assert_allclose(branch, out[f"block{i}"]["sa"], atol=1e-5)
    np.testing.assert_allclose(
      out[f"block{i}"]["input"] + out[f"block{i}"]["sa"], out[f"block{i}"]["+sa"], atol=1e-6
    )
  target = report.Target(model, params, "image", num_classes=3)
  a = report.run_analysis(
    target,
    image_batches(np.random.default_rng(0), 6, 3),
    layers=[0, 1],
    batch_size=4,
    jacobian_dim=0,
  )
  out, inter = capture.analysis_apply(
    model,
    params,
    jnp.asarray(
      np.concatenate([b["image"] for b in image_batches(np.random.default_rng(0), 6, 3)])
    ),
  )
  for i, entry in enumerate(a["layers"]):
    expected = np_smoothing_cosine(
      capture.head_outputs(inter, i),
      capture.head_out_kernels(params, i, 2),
      out[f"block{i}"]["input"],
      np.ones((6, 4)),
    )
    np.testing.assert_allclose(entry["head_smoothing_cosine"], expected, atol=1e-5)
    assert entry["laplacian_smoothing_cosine"] == pytest.approx(expected[1], abs=1e-5)  # last head
    assert entry["standard_smoothing_cosine"] == pytest.approx(expected[0], abs=1e-5)
  assert summary.summary(a)["laplacian_smoothing"] == [
    e["laplacian_smoothing_cosine"] for e in a["layers"]
  ]


@pytest.mark.slow
def test_run_analysis_gpt_next_token_classes():
  model = make_gpt(
    vocab_size=11,
    max_length=8,
    width=16,
    depth=2,
    num_heads=2,
    num_laplacian_heads=1,
    posemb="rope",
    scan_layers=True,
  )
  tokens = np.random.default_rng(1).integers(0, 11, size=(5, 9)).astype(np.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:1, :-1])["params"]
  mask = np.ones((5, 8), np.float32)
  mask[-1, 3:] = 0
  target = report.Target(
    model,
    params,
    "lm",
    vocab_size=11,
    token_classifier=np.asarray(params["token_embedding"]["embedding"]),
  )
  a = report.run_analysis(
    target, [{"tokens": tokens, "mask": mask}], layers=[1], batch_size=2, jacobian_dim=16 * 4
  )
  entry = a["layers"][0]
  assert a["num_tokens"] == mask.sum() and a["causal"]
  assert entry["token_classes"]["num_examples"] == mask.sum()
  assert entry["token_classes"]["cdnv"] > 0
  assert entry["jacobian"]["tokens"] == 4 and entry["jacobian"]["block_check"] < 1e-5
  assert a["features"]["token_classes"]["nc3"] is not None
  assert summary.summary(a)["cdnv"] == [entry["token_classes"]["cdnv"]]
  # No Target.loss_fn: no gradient norms, and the reason says why.
  assert a["gradient_batch"] is None and entry["gradient_norms"] is None
  assert "loss_fn" in entry["gradient_norms_reason"]
  assert summary.summary(a)["grad_q"] == [None]


def test_grouped_query_attention_is_refused_in_one_line():
  """The per-head sections would cut ``W_K, W_V`` into query heads: a GPT with
  2 key/value heads for 4 heads is refused before anything runs."""
  model = make_gpt(vocab_size=11, max_length=8, width=16, depth=1, num_heads=4, num_kv_heads=2)
  target = report.Target(model, {}, "lm", vocab_size=11)
  with pytest.raises(report.AnalysisError) as e:
    report.run_analysis(target, [], layers=[0])
  assert "model.num_kv_heads=2 for 4 heads" in str(e.value) and "\n" not in str(e.value)


def test_parse_layers():
  assert report.parse_layers(None, 4) == [0, 1, 2, 3]
  assert report.parse_layers("3, 0,-1", 4) == [0, 3]
  with pytest.raises(ValueError, match="does not exist"):
    report.parse_layers("4", 4)
  with pytest.raises(ValueError, match="not a layer index"):
    report.parse_layers("a", 4)


# ------------------------------------------------------------ CLIs


def one_line_error(r):
  assert r.returncode == 2, (r.stdout[-1500:], r.stderr[-1500:])
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
  return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fmnist_data_dir):
  """A tiny ViT trained for 2 steps, evaluated on 256 test images."""
  workdir = tmp_path_factory.mktemp("analysis") / "run"
  r = run_in_process(
    [
      "train.py",
      "--config",
      CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={fmnist_data_dir}",
    ]
    + TINY
    + [
      "--config.total_steps=2",
      "--config.eval_every=2",
      "--config.checkpoint_every=2",
      "--config.data.eval_split=test[:256]",
    ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_eval_analysis_writes_json_and_plots_then_compare(trained, tmp_path, capfd):
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(trained),
      "--analysis",
      "--analysis_examples=200",
      "--analysis_batch_size=128",
      "--analysis_jacobian_dim=512",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  a = json.loads((trained / "analysis.json").read_text())
  assert a["task"] == "classification" and a["step"] == 2
  assert a["num_sequences"] == 200 and [e["layer"] for e in a["layers"]] == [0]
  entry = a["layers"][0]
  assert entry["classes"]["num_classes"] == 10 and entry["components_99"] >= 1
  assert entry["jacobian"]["block_check"] < 1e-5
  assert a["features"]["classes"]["nc3"] is not None
  # The gradient of the training loss on the first chunk (128 images); after
  # 2 steps the classifier is no longer zero, so it reaches W_Q and W_K.
  assert a["gradient_batch"]["num_sequences"] == 128
  grads = entry["gradient_norms"]["query"] + entry["gradient_norms"]["key"]
  assert len(grads) == 4 and all(0 < g < 1e3 for g in grads)
  assert len(entry["attention_self_weight"]) == 2
  assert 0 <= entry["attention_head_similarity_mean"] <= 1
  for name in ("variance", "spectra", "conditioning", "collapse"):
    assert (trained / f"analysis_{name}.png").stat().st_size > 1000
  assert "layer 0:" in r.stdout and "grad_q=" in r.stdout
  assert not (trained / "eval.json").exists()  # --analysis replaces the evaluation

  # python -m laplax.analysis.compare RUN OTHER --out FILE (in-process: same main()).
  other = tmp_path / "other"
  other.mkdir()
  shutil.copy(trained / "analysis.json", other / "analysis.json")
  out = tmp_path / "cmp.png"
  assert compare.main([str(trained), str(other), "--out", str(out)]) == 0
  assert out.stat().st_size > 1000
  printed = capfd.readouterr().out
  assert "| layer | run | other |" in printed and "### NC1" in printed
  with pytest.raises(SystemExit) as e:
    compare.main([str(trained), str(tmp_path / "missing")])
  assert e.value.code == 2
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "has no analysis.json" in err[0]


@pytest.mark.slow
def test_eval_analysis_bad_input_one_line_exit_2(trained, tmp_path, capfd):
  # A layer index that does not exist (the tiny model has depth 1).
  r = run_in_process(
    ["eval.py", "--workdir", str(trained), "--analysis", "--analysis_layers=0,1"], capfd
  )
  assert "layer 1 does not exist" in one_line_error(r)
  # A workdir without a checkpoint.
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(trained / "config.json", empty / "config.json")
  r = run_in_process(["eval.py", "--workdir", str(empty), "--analysis"], capfd)
  assert "no checkpoint" in one_line_error(r)
  # A language-model run has no sequence labels for class statistics.
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  try:
    import gpt_shakespeare
  finally:
    sys.path.pop(0)
  lm = tmp_path / "lm"
  lm.mkdir()
  (lm / "config.json").write_text(json.dumps(gpt_shakespeare.get_config().to_dict()))
  r = run_in_process(
    ["eval.py", "--workdir", str(lm), "--analysis", "--analysis_classes=yes"], capfd
  )
  assert "per-sequence labels" in one_line_error(r)
