"""The classification task's losses and mixing against NumPy, and a short
ViT run that must beat chance.

References, written from the definitions (float64):

* softmax cross-entropy with label smoothing ``eps`` over ``K`` classes:
  targets ``(1 - eps) y + eps / K``, loss ``mean_b -sum_k t_k log softmax(z)_k``;
* DeiT-3's binary cross-entropy (Touvron et al. 2022): ``mean_b sum_k
  softplus(z_k) - t_k z_k`` (``= -t log sigmoid(z) - (1 - t) log(1 - sigmoid(z))``);
* Mixup (Zhang et al. 2018): ``x' = lam x + (1 - lam) x_rev``, ``lam ~
  Beta(a, a)``; CutMix (Yun et al. 2019): one box of the reversed batch pasted
  into every image, ``lam = 1 - box area / image area``; targets mixed with
  the same ``lam``; both alphas positive: one of the two per batch, each with
  probability 1/2 (DeiT).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from laplax import tasks
from laplax.tasks import classification

from helpers.classification import K, chance_threshold
from helpers.configs import load
from helpers.runs import CONFIG, TINY, read_metrics, run_in_process


def tiny_task(**loss):
  """A ViT task of 28 x 28 x 1 images, no dropout, with ``loss`` keys set."""
  c = load("vit_fashion_mnist")
  m = c.model
  m.width, m.depth, m.num_heads, m.mlp_dim, m.patch_size = 16, 1, 2, 16, 7
  m.num_laplacian_heads = 1
  m.dropout = 0.0
  for k, v in loss.items():
    c.loss[k] = v
  return tasks.ClassificationTask(c, K, (28, 28, 1))


def params_and_batch(task, seed=0, batch=6):
  """Initial parameters with a random head (the default head is zero, which
  makes every logit 0) and a random batch."""
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map(np.asarray, task.init(jax.random.PRNGKey(seed)))
  params["head"]["kernel"] = rng.normal(size=params["head"]["kernel"].shape).astype(np.float32)
  params["head"]["bias"] = rng.normal(size=K).astype(np.float32)
  images = rng.normal(size=(batch, 28, 28, 1)).astype(np.float32)
  labels = rng.integers(0, K, batch).astype(np.int32)
  return params, {"image": images, "label": labels}


def logits_of(task, params, images):
  out, _ = jax.jit(lambda p, x: task.model.apply({"params": p}, x, train=True))(
    params, jnp.asarray(images)
  )
  return np.asarray(out, np.float64)


def np_softmax_ce(z, t):
  logp = z - z.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  return float(np.mean(-(t * logp).sum(-1)))


def np_sigmoid_bce(z, t):
  return float(np.mean((np.logaddexp(0.0, z) - t * z).sum(-1)))


def np_smooth(t, eps):
  return (1 - eps) * t + eps / t.shape[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
  "kind,eps", [("softmax", 0.0), ("softmax", 0.1), ("sigmoid", 0.0), ("sigmoid", 0.1)]
)
def test_loss_matches_numpy(kind, eps):
  """Without mixing: the loss of the task's logits, from the definition."""
  task = tiny_task(type=kind, label_smoothing=eps, mixup=0.0, cutmix=0.0)
  params, batch = params_and_batch(task)
  loss, (metrics, _) = jax.jit(task.loss)(params, batch, jax.random.PRNGKey(1))
  z = logits_of(task, params, batch["image"])
  t = np_smooth(np.eye(K)[batch["label"]], eps)
  want = np_softmax_ce(z, t) if kind == "softmax" else np_sigmoid_bce(z, t)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(metrics["accuracy"]) == pytest.approx(np.mean(z.argmax(-1) == batch["label"]))
  if kind == "sigmoid":  # not the softmax loss under another name
    assert want != pytest.approx(np_softmax_ce(z, t), rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_loss_with_mixup_and_cutmix_matches_numpy(kind):
  """DeiT-3's recipe (Mixup 0.8, CutMix 1.0, smoothing 0.1): the loss is the
  NumPy loss of the logits of the mixed images against the mixed, then
  smoothed, targets (the mixing itself is checked below)."""
  task = tiny_task(type=kind, label_smoothing=0.1, mixup=0.8, cutmix=1.0)
  params, batch = params_and_batch(task, seed=2)
  rng = jax.random.PRNGKey(3)
  loss, _ = jax.jit(task.loss)(params, batch, rng)
  r_mix, _ = jax.random.split(rng)  # the loss's own split: (mixing, dropout)
  mix = jax.jit(lambda r, x, t: classification.mixup_cutmix(r, x, t, mixup=0.8, cutmix=1.0))
  images, targets = mix(r_mix, batch["image"], jax.nn.one_hot(batch["label"], K))
  z = logits_of(task, params, images)
  t = np_smooth(np.asarray(targets, np.float64), 0.1)
  want = np_softmax_ce(z, t) if kind == "softmax" else np_sigmoid_bce(z, t)
  assert float(loss) == pytest.approx(want, rel=1e-5)


def _mix_many(mixup, cutmix, n=400, batch=4, size=8):
  """``n`` draws of ``mixup_cutmix`` on one batch of distinct random images
  with labels ``0..batch-1``: ``(images, targets, mixed, mixed_targets)``."""
  rng = np.random.default_rng(4)
  images = rng.normal(size=(batch, size, size, 3)).astype(np.float32)
  targets = np.eye(K, dtype=np.float32)[np.arange(batch)]
  fn = jax.jit(
    jax.vmap(lambda r: classification.mixup_cutmix(r, images, targets, mixup=mixup, cutmix=cutmix))
  )
  mixed, mixed_t = fn(jax.random.split(jax.random.PRNGKey(5), n))
  return images, targets, np.asarray(mixed, np.float64), np.asarray(mixed_t, np.float64)


def _classify(images, targets, mixed, mixed_t):
  """For each draw: ``("mixup" | "cutmix", lam)`` after checking it against
  the NumPy definition of the one it is."""
  x, t, rev = images.astype(np.float64), targets.astype(np.float64), slice(None, None, -1)
  out = []
  for m, mt in zip(mixed, mixed_t):
    lam = mt[0, 0]  # the weight of image 0's own label
    np.testing.assert_allclose(mt, lam * t + (1 - lam) * t[rev], atol=1e-6)
    pasted = np.all((m == x[rev]) & (m != x), axis=-1)  # [batch, H, W]
    # (A box over the whole image and a Mixup of lam = 0 to float32 precision
    # are the same images: both pass the Mixup check.)
    if pasted.any() and not pasted.all() and np.array_equal(m[~pasted], x[~pasted]):
      # CutMix: one axis-aligned box, the same in every image.
      box = pasted[0]
      rows, cols = box.any(1), box.any(0)
      assert np.array_equal(box, np.outer(rows, cols))
      assert np.all(np.diff(np.flatnonzero(rows)) == 1) and np.all(
        np.diff(np.flatnonzero(cols)) == 1
      )
      assert all(np.array_equal(p, box) for p in pasted)
      assert lam == pytest.approx(1 - box.mean(), abs=1e-6)
      out.append(("cutmix", lam))
    else:
      np.testing.assert_allclose(m, lam * x + (1 - lam) * x[rev], rtol=1e-5, atol=1e-5)
      out.append(("mixup", lam))
  return out


def test_mixup_matches_numpy_and_lam_is_beta():
  """Mixup alone: every draw is ``lam x + (1 - lam) x_rev`` with the targets
  mixed alike, and the 400 ``lam`` follow Beta(0.8, 0.8) (Kolmogorov-Smirnov)."""
  draws = _classify(*_mix_many(0.8, 0.0))
  assert {kind for kind, _ in draws} == {"mixup"}
  lams = np.array([lam for _, lam in draws])
  assert scipy.stats.kstest(lams, scipy.stats.beta(0.8, 0.8).cdf).pvalue > 1e-3
  # Not another alpha: Beta(0.2, 0.2) puts far more mass near 0 and 1.
  assert scipy.stats.kstest(lams, scipy.stats.beta(0.2, 0.2).cdf).pvalue < 1e-6


def test_cutmix_matches_numpy_and_both_are_chosen_half_the_time():
  """CutMix alone: one box pasted into every image, targets weighted by the
  exact area; with both alphas, each of the two in about half of 400 draws
  (two-sided binomial test)."""
  draws = _classify(*_mix_many(0.0, 1.0))
  assert {kind for kind, _ in draws} == {"cutmix"} or all(
    lam == 1.0 for kind, lam in draws if kind == "mixup"
  )  # an empty box is no mixing
  both = _classify(*_mix_many(0.8, 1.0))
  cut = sum(kind == "cutmix" for kind, _ in both)
  assert scipy.stats.binomtest(cut, len(both), 0.5).pvalue > 1e-4


@pytest.mark.slow
def test_short_vit_run_with_deit3_loss_beats_chance(tmp_path, fmnist_data_dir, capfd):
  """A tiny ViT trained 150 steps of 32 images on Fashion-MNIST with DeiT-3's
  loss (sigmoid binary cross-entropy, Mixup 0.8 / CutMix 1.0, smoothing 0.1):
  its accuracy on 1000 test images must clear the accuracy a model at chance
  (10 %) exceeds with probability 1e-9 (0.162; measured 0.287). The softmax
  loss's run is test_train.py's first test."""
  workdir = tmp_path / "run"
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
      "--config.total_steps=150",
      "--config.eval_every=150",
      "--config.checkpoint_every=150",
      "--config.optim.lr=1e-2",
      "--config.loss.type=sigmoid",
      "--config.loss.label_smoothing=0.1",
      "--config.loss.mixup=0.8",
      "--config.loss.cutmix=1.0",
      "--config.data.eval_split=test[:1000]",
      "--config.eval_batch_size=1000",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  final = [m for m in read_metrics(workdir) if m["split"] == "eval"][-1]
  assert final["step"] == 150 and final["num_examples"] == 1000
  threshold = chance_threshold(1000)
  assert 0.16 < threshold < 0.17
  assert final["accuracy"] > threshold, (final, threshold)
  assert math.isfinite(final["loss"]) and final["loss"] < math.log(K)
