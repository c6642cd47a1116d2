"""``model.loss_chunk``: the LM loss chunk by chunk (laplax.models.gpt.token_losses).

The chunked loss is the loss of the whole logits: checked against a NumPy
cross-entropy written from the definition (logits ``h W``, the soft-cap ``c
tanh(z / c)``, ``logsumexp - z[target]``) and against the unchunked model's
loss and gradients (float32 rounding: the ``lm_head`` gradient is summed over
the chunks). With chunking on, no float32 ``[batch, length, vocab]`` array
is in the traced step, forward or backward, and the compiled step needs less
than one such array fewer bytes of temporaries. Tiny models on the CPU.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import tasks
from laplax.models import spec as spec_lib
from laplax.models.gpt import token_losses

from helpers.configs import load
from helpers.models import make_gpt

VOCAB, LENGTH, BATCH = 64, 32, 3


def tiny(**kw):
  return make_gpt(
    vocab_size=VOCAB,
    max_length=LENGTH,
    width=16,
    depth=2,
    num_heads=2,
    posemb="rope",
    use_bias=False,
    **kw,
  )


def perturbed_params(model, seed=0):
  """Random parameters with every leaf (``lm_head`` too) moved off its init."""
  tokens = jnp.zeros((1, LENGTH), jnp.int32)
  params = model.init(jax.random.PRNGKey(seed), tokens)["params"]
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  leaves = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(tree, leaves)


def data(seed=2):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  return (
    jax.random.randint(k1, (BATCH, LENGTH), 0, VOCAB),
    jax.random.randint(k2, (BATCH, LENGTH), 0, VOCAB),
  )


def reference_losses(hidden, unembedding, targets, softcap):
  """Cross-entropy from the definition, float64 NumPy."""
  z = np.asarray(hidden, np.float64) @ np.asarray(unembedding, np.float64)
  if softcap is not None:
    z = softcap * np.tanh(z / softcap)
  top = z.max(-1, keepdims=True)
  lse = (top + np.log(np.exp(z - top).sum(-1, keepdims=True)))[..., 0]
  picked = np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0]
  return lse - picked


@pytest.mark.slow
@pytest.mark.parametrize("tie,softcap", [(False, 15.0), (True, None), (True, 2.0)])
def test_chunked_losses_equal_the_definition_and_the_unchunked_model(tie, softcap):
  whole = tiny(tie_embeddings=tie, logit_softcap=softcap)
  chunked = tiny(tie_embeddings=tie, logit_softcap=softcap, loss_chunk=8)
  params = perturbed_params(whole)
  tokens, targets = data()

  losses, out = jax.jit(lambda p: chunked.apply({"params": p}, tokens, targets=targets))(params)
  unembedding = params["token_embedding"]["embedding"].T if tie else params["lm_head"]["kernel"]
  expected = reference_losses(out["encoded"], unembedding, targets, softcap)
  assert losses.shape == (BATCH, LENGTH) and losses.dtype == jnp.float32
  np.testing.assert_allclose(losses, expected, rtol=2e-6, atol=2e-6)

  def loss_and_grads(model):
    f = lambda p: model.apply({"params": p}, tokens, targets=targets)[0].mean()
    return jax.jit(jax.value_and_grad(f))(params)

  (l0, g0), (l1, g1) = loss_and_grads(whole), loss_and_grads(chunked)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))


def test_token_losses_refuses_a_chunk_that_does_not_divide_the_length():
  with pytest.raises(ValueError, match="loss_chunk=5 must divide the sequence length 32"):
    token_losses(
      jnp.zeros((1, 32, 4)), jnp.zeros((4, 8)), jnp.zeros((1, 32), jnp.int32), softcap=None, chunk=5
    )
  with pytest.raises(spec_lib.SpecError, match=r"model.loss_chunk=5 must divide model.max_length"):
    tiny(loss_chunk=5)


def lm_task(loss_chunk, **model):
  config = load("gpt_shakespeare")
  config.model.max_length = LENGTH
  config.model.width, config.model.depth, config.model.num_heads = 16, 1, 2
  config.model.mlp_dim = 32
  config.model.logit_softcap = 15.0
  config.model.loss_chunk = loss_chunk
  for k, v in model.items():
    config.model[k] = v
  return tasks.task_class(config).from_shapes(config, vocab_size=VOCAB)


@pytest.mark.slow
def test_the_task_loss_with_chunks_is_the_loss_without_on_sft_targets():
  # SFT's targets: -1 where the assistant is not trained (left out of the mean).
  whole, chunked = lm_task(None), lm_task(8)
  params = perturbed_params(whole.model)
  tokens = jax.random.randint(jax.random.PRNGKey(3), (BATCH, LENGTH + 1), 0, VOCAB)
  targets = jnp.where(jnp.arange(LENGTH) % 3 == 0, -1, tokens[:, 1:])
  batch = {"tokens": tokens, "targets": targets}
  rng = jax.random.PRNGKey(0)

  def loss_and_grads(task, batch):
    f = lambda p: task.loss(p, batch, rng)[0]
    return jax.jit(jax.value_and_grad(f))(params)

  for b in (batch, {"tokens": tokens}):
    (l0, g0), (l1, g1) = loss_and_grads(whole, b), loss_and_grads(chunked, b)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    # Tolerance: of the largest gradient (some norm gains' are rounding noise, ~1e-9).
    scale = max(float(np.abs(e).max()) for e in jax.tree_util.tree_leaves(g0))
    for a, e in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
      np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6 * scale)
  mask = jnp.ones((BATCH, LENGTH)).at[:, :5].set(0.0)
  sums0 = jax.jit(whole.eval_sums)(params, {"tokens": tokens, "mask": mask})
  sums1 = jax.jit(chunked.eval_sums)(params, {"tokens": tokens, "mask": mask})
  for k in sums0:
    np.testing.assert_allclose(sums1[k], sums0[k], rtol=1e-6)


def shapes_in(jaxpr):
  """Every (shape, dtype) a jaxpr and its sub-jaxprs (scan, checkpoint) produce."""
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      yield tuple(v.aval.shape), str(v.aval.dtype)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from shapes_in(sub)


def test_no_float32_logits_of_the_whole_batch_when_chunked():
  vocab, length, batch = 4096, 128, 4
  sizes = dict(width=16, depth=1, mlp_dim=32, max_length=length)
  tokens = jnp.zeros((batch, length + 1), jnp.int32)
  full = (batch, length, vocab)
  temps = {}
  for chunk in (None, 16):
    config = load("gpt_shakespeare")
    config.model.num_heads = 2
    config.model.logit_softcap = 15.0
    config.model.loss_chunk = chunk
    for k, v in sizes.items():
      config.model[k] = v
    task = tasks.task_class(config).from_shapes(config, vocab_size=vocab)
    params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    step = jax.value_and_grad(
      lambda p, task=task: task.loss(p, {"tokens": tokens}, jax.random.PRNGKey(0))[0]
    )
    jaxpr = jax.make_jaxpr(step)(params).jaxpr
    f32 = "float32"
    found = {(s, d) for s, d in shapes_in(jaxpr) if s[-1:] == (vocab,) and d == f32}
    if chunk is None:
      assert (full, f32) in found
    else:
      assert all(np.prod(s) <= batch * chunk * vocab for s, _ in found), found
    temps[chunk] = jax.jit(step).lower(params).compile().memory_analysis().temp_size_in_bytes
  # The whole float32 logits are 8 MiB here; chunked, the step saves more than that.
  assert temps[None] - temps[16] > batch * length * vocab * 4, temps
