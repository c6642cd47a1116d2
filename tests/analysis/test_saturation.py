"""Saturation diagnostics of ``eval.py --analysis``: attention self-weight, head
similarity, per-head gradient norms of ``W_Q, W_K``, and the analysis of a
step-0 checkpoint.

References (NumPy float64, explicit loops over counted queries):

* self-weight: ``mean_t p_tt`` per head.
* head similarity: ``mean_t <p^a_t, p^b_t> / (||p^a_t|| ||p^b_t||)``.
* gradient norms: ``jax.grad`` of the loss on the full parameter tree, then
  the Frobenius norm of head ``h``'s columns ``h*d : (h+1)*d`` of the kernel.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from laplax.analysis import capture, conditioning, report, summary
from laplax.models.layers import SCANNED_BLOCKS

from helpers.models import make_gpt, make_vit
from helpers.runs import CONFIG, TINY, run_in_process


def random_probs(rng, b, h, t, causal=False):
  logits = rng.normal(scale=2.0, size=(b, h, t, t))
  if causal:
    logits = np.where(np.tri(t, dtype=bool), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


def np_self_weight(p, mask):
  b, h, t, _ = p.shape
  rows = [(i, q) for i in range(b) for q in range(t) if mask[i, q]]
  return np.array([np.mean([p[i, a, q, q] for i, q in rows]) for a in range(h)])


def np_similarity(p, mask):
  b, h, t, _ = p.shape
  rows = [(i, q) for i in range(b) for q in range(t) if mask[i, q]]
  out = np.zeros((h, h))
  for a in range(h):
    for c in range(h):
      out[a, c] = np.mean(
        [
          p[i, a, q] @ p[i, c, q] / np.linalg.norm(p[i, a, q]) / np.linalg.norm(p[i, c, q])
          for i, q in rows
        ]
      )
  return out


def test_self_weight_identity_uniform_reference_and_mask():
  t = 6
  eye = jnp.broadcast_to(jnp.eye(t), (2, 3, t, t))
  s, n = conditioning.attention_self_weight(eye)
  np.testing.assert_allclose(np.asarray(s) / n, 1.0, rtol=1e-7)
  assert float(n) == 2 * t
  s, n = conditioning.attention_self_weight(jnp.full((2, 3, t, t), 1.0 / t))
  np.testing.assert_allclose(np.asarray(s) / n, 1.0 / t, rtol=1e-6)

  rng = np.random.default_rng(0)
  for causal in (False, True):  # a causal P keeps p_tt on the diagonal
    p = random_probs(rng, 3, 2, t, causal=causal)
    mask = rng.integers(0, 2, size=(3, t)).astype(np.float32)
    mask[0, 0] = 1
    s, n = jax.jit(conditioning.attention_self_weight)(jnp.asarray(p, jnp.float32), mask)
    assert float(n) == mask.sum()
    np.testing.assert_allclose(np.asarray(s) / float(n), np_self_weight(p, mask), rtol=1e-5)
  # Masked queries do not count: making them self-attend changes nothing.
  p2 = p.copy()
  for i, q in zip(*np.nonzero(mask == 0)):
    p2[i, :, q] = np.eye(t)[q]
  s2, _ = conditioning.attention_self_weight(jnp.asarray(p2, jnp.float32), mask)
  np.testing.assert_allclose(np.asarray(s2), np.asarray(s), rtol=1e-6)
  # Queries that are the last T_q keys: their own key is t + T_k - T_q.
  s, n = conditioning.attention_self_weight(jnp.asarray(np.eye(t)[None, None, 2:]))
  assert float(s[0]) / float(n) == 1.0


def test_head_similarity_identical_orthogonal_reference_and_mask():
  t = 5
  eye = np.eye(t)
  same = jnp.asarray(np.broadcast_to(eye, (2, 2, t, t)))
  sim, n = conditioning.attention_head_similarity(same)
  np.testing.assert_allclose(np.asarray(sim) / n, np.ones((2, 2)), rtol=1e-6)
  # One-hot rows on different keys (head 1 looks at the next token): 0 off the diagonal.
  ortho = jnp.asarray(np.stack([eye, np.roll(eye, 1, axis=1)])[None])
  sim, n = conditioning.attention_head_similarity(ortho)
  np.testing.assert_allclose(np.asarray(sim) / n, np.eye(2), atol=1e-7)
  # Uniform rows against one-hot rows: cos = (1/T) / (1/sqrt(T)) = 1/sqrt(T).
  mixed = jnp.asarray(np.stack([eye, np.full((t, t), 1.0 / t)])[None])
  sim, n = conditioning.attention_head_similarity(mixed)
  assert float(sim[0, 1]) / float(n) == pytest.approx(1 / math.sqrt(t), rel=1e-6)

  rng = np.random.default_rng(1)
  p = random_probs(rng, 3, 3, t, causal=True)
  mask = rng.integers(0, 2, size=(3, t)).astype(np.float32)
  mask[1, 2] = 1
  sim, n = jax.jit(conditioning.attention_head_similarity)(jnp.asarray(p, jnp.float32), mask)
  assert float(n) == mask.sum()
  got = np.asarray(sim) / float(n)
  np.testing.assert_allclose(got, np_similarity(p, mask), rtol=1e-5)
  np.testing.assert_allclose(got, got.T, rtol=1e-6)
  # Masked queries do not count: making every head alike there changes nothing.
  p2 = p.copy()
  for i, q in zip(*np.nonzero(mask == 0)):
    p2[i, :, q] = p[i, 0, q]
  sim2, _ = conditioning.attention_head_similarity(jnp.asarray(p2, jnp.float32), mask)
  np.testing.assert_allclose(np.asarray(sim2), np.asarray(sim), rtol=1e-6)


def test_saturation_accumulators_reject_bad_shapes():
  with pytest.raises(ValueError, match="T_q <= T_k"):
    conditioning.attention_self_weight(jnp.ones((1, 1, 3, 2)))
  with pytest.raises(ValueError, match="batch, heads"):
    conditioning.attention_head_similarity(jnp.ones((3, 3)))
  with pytest.raises(ValueError, match="query_mask"):
    conditioning.attention_self_weight(jnp.ones((2, 1, 3, 3)), jnp.ones((2, 4)))


def column_block_norms(kernel_grad, heads):
  g = np.asarray(kernel_grad, np.float64)
  d = g.shape[1] // heads
  return [float(np.sqrt(np.sum(g[:, h * d : (h + 1) * d] ** 2))) for h in range(heads)]


@pytest.mark.slow
def test_run_analysis_vit_gradient_norms_and_attention_statistics():
  # Scanned layers (the harder layout); a random head, else the backbone's
  # gradient is exactly 0 (zero-initialised classifier).
  model = make_vit(
    num_classes=3,
    patch_size=7,
    width=16,
    depth=2,
    mlp_dim=16,
    num_heads=2,
    num_laplacian_heads=(0, 1),
    scan_layers=True,
    head_init_zero=False,
  )
  rng = np.random.default_rng(0)
  images = rng.normal(size=(6, 14, 14, 1)).astype(np.float32)
  labels = rng.integers(0, 3, size=6).astype(np.int32)
  mask = np.array([1, 1, 1, 1, 0, 0], np.float32)  # two padded examples
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])["params"]

  def loss_fn(p, batch):
    logits, _ = model.apply({"params": p}, batch["image"], train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

  target = report.Target(model, params, "image", loss_fn=loss_fn)
  a = report.run_analysis(
    target,
    [{"image": images, "label": labels, "mask": mask}],
    layers=[0, 1],
    batch_size=8,
    jacobian_dim=0,
  )

  real = mask != 0
  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(
    params, {"image": images[real], "label": labels[real]}
  )
  assert a["gradient_batch"] == {"loss": pytest.approx(float(loss), rel=1e-6), "num_sequences": 4}
  forward = jax.jit(functools.partial(capture.analysis_apply, model))
  _, inter = forward(params, jnp.asarray(images))
  qmask = np.repeat(mask[:, None], 5, 1)  # 4 patches + class token
  for entry in a["layers"]:
    layer = entry["layer"]
    kernels = grads[SCANNED_BLOCKS]["attention"]  # stacked [depth, ...]
    ref = {name: column_block_norms(kernels[name]["kernel"][layer], 2) for name in ("query", "key")}
    assert entry["gradient_norms"]["query"] == pytest.approx(ref["query"], rel=1e-5)
    assert entry["gradient_norms"]["key"] == pytest.approx(ref["key"], rel=1e-5)
    assert min(ref["query"]) > 0
    p = np.asarray(capture.attention_weights(inter, layer), np.float64)
    np.testing.assert_allclose(entry["attention_self_weight"], np_self_weight(p, qmask), rtol=1e-5)
    sim = np_similarity(p, qmask)
    np.testing.assert_allclose(entry["attention_head_similarity"], sim, rtol=1e-5)
    assert entry["attention_head_similarity_mean"] == pytest.approx(sim[0, 1], rel=1e-5)
  s = summary.summary(a)
  assert s["self_weight"][0] == pytest.approx(np.mean(a["layers"][0]["attention_self_weight"]))
  assert s["grad_k"][1] == pytest.approx(np.mean(a["layers"][1]["gradient_norms"]["key"]))


@pytest.mark.slow
def test_run_analysis_gpt_gradient_uses_unpadded_windows_one_head():
  model = make_gpt(
    vocab_size=11,
    max_length=8,
    width=16,
    depth=1,
    num_heads=1,
    num_laplacian_heads=0,
    posemb="rope",
  )
  tokens = np.random.default_rng(2).integers(0, 11, size=(3, 9)).astype(np.int32)
  mask = np.ones((3, 8), np.float32)
  mask[2, 5:] = 0  # the last window is padded: the training loss has no mask
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:1, :-1])["params"]

  def loss_fn(p, batch):
    logits, _ = model.apply({"params": p}, batch["tokens"][:, :-1], train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()

  a = report.run_analysis(
    report.Target(model, params, "lm", loss_fn=loss_fn),
    [{"tokens": tokens, "mask": mask}],
    layers=[0],
    jacobian_dim=0,
  )
  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params, {"tokens": tokens[:2]})
  assert a["gradient_batch"]["num_sequences"] == 2
  assert a["gradient_batch"]["loss"] == pytest.approx(float(loss), rel=1e-6)
  entry = a["layers"][0]
  attn = grads["block0"]["attention"]
  assert entry["gradient_norms"]["query"] == pytest.approx(
    column_block_norms(attn["query"]["kernel"], 1), rel=1e-5
  )
  assert entry["gradient_norms"]["key"] == pytest.approx(
    column_block_norms(attn["key"]["kernel"], 1), rel=1e-5
  )
  assert entry["attention_head_similarity"] == [[pytest.approx(1.0, rel=1e-6)]]
  assert entry["attention_head_similarity_mean"] is None  # one head: no pairs
  forward = jax.jit(functools.partial(capture.analysis_apply, model))
  _, inter = forward(params, jnp.asarray(tokens[:, :-1]))
  p = np.asarray(capture.attention_weights(inter, 0), np.float64)
  np.testing.assert_allclose(entry["attention_self_weight"], np_self_weight(p, mask), rtol=1e-5)


@pytest.mark.slow
def test_eval_analysis_of_a_step_0_checkpoint(tmp_path, fmnist_data_dir, capfd):
  """train.py --config.total_steps=0 saves step 0, which eval.py --analysis reads."""
  workdir = tmp_path / "init"
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
      "--config.total_steps=0",
      "--config.data.eval_split=test[:64]",
      "--config.eval_batch_size=64",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_in_process(
    ["eval.py", "--workdir", str(workdir), "--analysis", "--analysis_jacobian_dim=0"], capfd
  )
  assert r.returncode == 0, r.stderr[-3000:]
  a = json.loads((workdir / "analysis.json").read_text())
  assert a["step"] == 0 and a["num_sequences"] == 64
  # At initialisation the classifier is zero: uniform logits, loss log(10)
  # (label smoothing and Mixup do not change it; float32 means over the batch),
  # and no gradient reaches W_Q, W_K.
  assert a["gradient_batch"] == {"loss": pytest.approx(math.log(10), rel=1e-5), "num_sequences": 64}
  entry = a["layers"][0]
  assert entry["gradient_norms"] == {"query": [0.0, 0.0], "key": [0.0, 0.0]}
  # Not saturated without spectral conditioning (uniform over 17 tokens: 0.059).
  assert all(0 < w < 0.2 for w in entry["attention_self_weight"])
  assert entry["attention_head_similarity"][0][0] == pytest.approx(1.0, rel=1e-6)
  assert "self_weight=" in r.stdout and "head_similarity=" in r.stdout
