"""Masked-LM pre-training (laplax/tasks/mlm.py): the masking rules, the sparse
loss against a NumPy cross-entropy, cramming's triangle schedule, and a
resumed run that is bitwise the uninterrupted one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import optim
from laplax.tasks import mlm

from helpers.configs import load
from helpers.resume import TEXT, assert_bitwise_equal, saved_state

V = 300


def _tokens(batch=64, length=40, seed=0):
  rs = np.random.RandomState(seed)
  tokens = rs.randint(mlm.NUM_SPECIAL, V, (batch, length)).astype(np.int32)
  valid = np.ones_like(tokens, bool)
  valid[:, 0] = False  # [CLS]
  valid[1, 30:] = False  # padding
  return tokens, valid


def test_cramming_rule_masks_a_fixed_count_80_10_10_in_order():
  tokens, valid = _tokens()
  p = 0.25
  inputs, positions, targets, weights = jax.device_get(
    mlm.mask_tokens(
      jax.random.PRNGKey(3), tokens, valid, rule="cramming", probability=p, vocab_size=V
    )
  )
  n = round(p * tokens.shape[1])
  assert positions.shape == (64, n) and weights.all()  # every row has n valid tokens
  for b in range(64):
    pos = positions[b]
    assert len(set(pos)) == n and valid[b, pos].all()
    np.testing.assert_array_equal(targets[b], tokens[b, pos])
    n_mask, n_rand = round(0.8 * n), round(0.9 * n)
    assert (inputs[b, pos[:n_mask]] == mlm.MASK_ID).all()
    assert (inputs[b, pos[n_mask:n_rand]] >= mlm.NUM_SPECIAL).all()
    np.testing.assert_array_equal(inputs[b, pos[n_rand:]], tokens[b, pos[n_rand:]])
    untouched = np.setdiff1d(np.arange(tokens.shape[1]), pos)
    np.testing.assert_array_equal(inputs[b, untouched], tokens[b, untouched])
  # The positions are uniform over the valid ones: column 0 is never drawn,
  # every other column about n / 39 of the time.
  counts = np.bincount(positions[2:].ravel(), minlength=40)
  assert counts[0] == 0 and abs(counts[1:].mean() - 62 * n / 39) < 1e-9


def test_bert_rule_frequencies():
  tokens, valid = _tokens(batch=400, length=100)
  inputs, positions, targets, weights = jax.device_get(
    mlm.mask_tokens(
      jax.random.PRNGKey(0), tokens, valid, rule="bert", probability=0.15, vocab_size=V
    )
  )
  chosen = weights > 0
  assert not chosen[~valid].any()
  np.testing.assert_array_equal(targets, tokens)
  rate = chosen.sum() / valid.sum()
  masked = (inputs == mlm.MASK_ID) & chosen
  kept = (inputs == tokens) & chosen
  # Binomial standard errors: 0.15 of ~39,600 tokens, then 0.8 / 0.1 of ~5,900.
  assert abs(rate - 0.15) < 0.006
  assert abs(masked.sum() / chosen.sum() - 0.8) < 0.02
  assert abs(kept.sum() / chosen.sum() - 0.1 - 0.9 / V) < 0.015
  np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])


def _tiny(tmp_path, corpus_dir, **extra):
  c = load("bert_cramming")
  c.model.update(width=32, depth=2, num_heads=2, mlp_dim=64, max_length=32, num_laplacian_heads=1)
  c.model.spectral.enabled = True
  c.data.update(source_dir=str(corpus_dir), data_dir=str(tmp_path / "tfds"), vocab_size=120)
  c.update(batch_size=4, eval_batch_size=8, log_every=2, eval_every=1000, checkpoint_every=4)
  c.optim.schedule_steps = 8  # the same schedule for the 8-step run and the 4 + 4
  c.update(extra)
  return c


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("sonnets")
  for i, name in enumerate(("a", "b", "c")):
    (d / f"{name}.txt").write_text((TEXT[i:] + TEXT[:i]) * 40)
  return d


@pytest.mark.slow
def test_sparse_loss_is_the_numpy_cross_entropy_of_the_masked_tokens(tmp_path, corpus_dir):
  config = _tiny(tmp_path, corpus_dir)
  task = mlm.MaskedLMTask.from_data(config, str(tmp_path))
  params = task.init(jax.random.PRNGKey(0))
  batch = next(iter(task.train_dataset()))
  rng = jax.random.PRNGKey(5)
  loss, (metrics, _) = task.loss(params, batch, rng)
  tokens = jnp.asarray(batch["tokens"])  # packed as cramming: no [CLS]
  inputs, positions, targets, weights = mlm.mask_tokens(
    rng,
    tokens,
    tokens >= mlm.NUM_SPECIAL,
    rule="cramming",
    probability=config.mlm.probability,
    vocab_size=task.vocab_size,
  )
  dense, _ = task.model.apply({"params": params}, inputs)  # every position, eval mode
  dense = np.asarray(dense, np.float64)
  pos, tgt = np.asarray(positions), np.asarray(targets)
  picked = np.take_along_axis(dense, pos[..., None], axis=1)
  logz = np.log(np.exp(picked - picked.max(-1, keepdims=True)).sum(-1)) + picked.max(-1)
  want = (logz - np.take_along_axis(picked, tgt[..., None], -1)[..., 0]).mean()
  assert np.asarray(weights).all()
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)  # no dropout in the tiny config
  assert 0.0 <= float(metrics["mlm_accuracy"]) <= 1.0


def test_triangle_schedule_is_crammings():
  o = load("bert_cramming").optim
  f = optim.learning_rate_schedule(o, 1000)
  for s in (0, 100, 750, 900, 1000):
    want = min(0.25 + s * 0.75 / 0.75 / 1000, 1 / 0.25 - s / (1000 * 0.25))
    np.testing.assert_allclose(float(f(s)), o.lr * want, rtol=1e-6)


@pytest.mark.slow
def test_pretraining_resumes_bitwise(tmp_path, corpus_dir):
  from laplax.train import loop

  # One trained WordPiece for both runs (its training breaks tied counts in
  # hash-map order, so two trainings may differ; a run reuses its own file).
  tokenizer = mlm.MaskedLMTask.from_data(_tiny(tmp_path, corpus_dir), None).tokenizer
  full, half = tmp_path / "full", tmp_path / "half"
  for d in (full, half):
    tokenizer.save(str(d / "tokenizer.json"))
  loop.train_and_evaluate(_tiny(tmp_path, corpus_dir, total_steps=8), str(full))
  loop.train_and_evaluate(_tiny(tmp_path, corpus_dir, total_steps=4), str(half))
  resumed = _tiny(tmp_path, corpus_dir, total_steps=8)
  loop.train_and_evaluate(resumed, str(half))
  step_a, a = saved_state(str(full))
  step_b, b = saved_state(str(half))
  assert step_a == step_b == 8
  assert_bitwise_equal(a, b)
