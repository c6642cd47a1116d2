"""GPT: KV-cache decoding, causality, initialisation, sizes of the paper configs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.attention import MultiHeadAttention
from laplax.models import sampling
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT
from laplax.train import loop

from helpers.configs import load
from helpers.models import make_gpt

HEAD_MIXES = {"standard": 0, "laplacian": 4, "mixed": (1, 3)}


def tiny(laplacian, **kw):
  kw = dict(
    vocab_size=40,
    max_length=10,
    width=16,
    depth=2,
    num_heads=4,
    num_laplacian_heads=laplacian,
    **kw,
  )
  return make_gpt(**kw)


def init(model, seed=0):
  tokens = jnp.zeros((2, model.spec.max_length), jnp.int32)
  return model.init(jax.random.PRNGKey(seed), tokens)["params"]


@pytest.mark.slow
@pytest.mark.parametrize("posemb", ["learn", "rope"])
@pytest.mark.parametrize("mix", sorted(HEAD_MIXES))
def test_kv_cache_logits_equal_full_forward(mix, posemb):
  model = tiny(HEAD_MIXES[mix], posemb=posemb, qk_norm=True, spectral_lam=10.0)
  params = init(model)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, 40)
  full, _ = model.apply({"params": params}, tokens)
  cache = model.init(jax.random.PRNGKey(0), tokens, decode=True)["cache"]
  pieces = []
  for lo, hi in ((0, 4), (4, 5), (5, 6), (6, 10)):  # prefill, then chunks
    (logits, _), upd = model.apply(
      {"params": params, "cache": cache}, tokens[:, lo:hi], decode=True, mutable=["cache"]
    )
    cache = upd["cache"]
    pieces.append(logits)
  chex.assert_trees_all_close(jnp.concatenate(pieces, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("spectral", [None, 10.0])
@pytest.mark.parametrize("mix", sorted(HEAD_MIXES))
def test_causality(mix, spectral):
  model = tiny(HEAD_MIXES[mix], spectral_lam=spectral)
  params = init(model)
  a = jax.random.randint(jax.random.PRNGKey(2), (2, 10), 0, 40)
  t = 4
  b = a.at[:, t + 1 :].set((a[:, t + 1 :] + 7) % 40)
  la, oa = model.apply({"params": params}, a)
  lb, ob = model.apply({"params": params}, b)
  chex.assert_trees_all_equal(la[:, : t + 1], lb[:, : t + 1])
  for i in range(2):
    np.testing.assert_array_equal(
      oa[f"block{i}"]["sa"][:, : t + 1], ob[f"block{i}"]["sa"][:, : t + 1]
    )
  assert np.abs(la[:, t + 1 :] - lb[:, t + 1 :]).max() > 0


# --------------------------------------------------- grouped-query attention


def random_params(module, *args, seed=0, **kw):
  """Parameters of ``module.init(key, *args, **kw)`` filled with NumPy normals
  (std 0.5), shapes from ``eval_shape`` so that no initialiser is compiled."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args, **kw))
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
    lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes
  )


def test_one_key_value_head_per_head_is_the_model_without_num_kv_heads():
  """``num_kv_heads == num_heads`` (Laplacian heads, rotary, spectral
  conditioning): the same parameters and bitwise the same logits as the GPT
  without the key, and so for the attention layer given it directly."""
  kw = dict(posemb="rope", spectral_lam=10.0)
  a, b = tiny(HEAD_MIXES["mixed"], **kw), tiny(HEAD_MIXES["mixed"], num_kv_heads=4, **kw)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 10), 0, 40)
  params = random_params(a, tokens)
  chex.assert_trees_all_equal_shapes(params, random_params(b, tokens))
  logits = lambda m: jax.jit(lambda p, t: m.apply(p, t)[0])(params, tokens)
  chex.assert_trees_all_equal(logits(a), logits(b))
  mha = MultiHeadAttention(num_heads=4, num_laplacian_heads=2, spectral_lam=10.0)
  x = jax.random.normal(jax.random.PRNGKey(5), (2, 10, 16))
  p = random_params(mha, x)
  chex.assert_trees_all_equal_shapes(p, random_params(mha.clone(num_kv_heads=4), x))
  out = lambda m: jax.jit(lambda p, x: m.apply(p, x, is_causal=True))(p, x)
  chex.assert_trees_all_equal(out(mha), out(mha.clone(num_kv_heads=4)))


@pytest.mark.parametrize("kv", [2, 1])
def test_grouped_query_gpt_is_the_gpt_with_repeated_key_value_heads(kv):
  """A GPT with ``kv`` key/value heads for 4 query heads (the fork's value
  embeddings and gates, mixed Laplacian heads, rotary) computes what the GPT
  with one per head computes when query head ``h``'s columns of ``W_K, W_V``
  (biases, value-embedding table, gate) are those of key/value head ``h //
  (4 / kv)`` (nanochat's ``repeat_interleave``); its KV cache holds ``kv``
  heads."""
  kw = dict(posemb="rope", value_embeds=True, use_bias=True)
  gqa, mha = tiny((1, 3), num_kv_heads=kv, **kw), tiny((1, 3), **kw)
  tokens = jax.random.randint(jax.random.PRNGKey(7), (2, 10), 0, 40)
  params = random_params(gqa, tokens, seed=kv)
  group = 4 // kv

  def repeat(a):  # [..., kv * hd] -> [..., 4 * hd], head h from h // group
    a = np.asarray(a)
    if a.shape[-1] == kv:  # a gate: one column per key/value head
      return np.repeat(a, group, axis=-1)
    heads = a.reshape(*a.shape[:-1], kv, -1)
    return np.repeat(heads, group, axis=-2).reshape(*a.shape[:-1], -1)

  grouped = lambda path: any(
    str(getattr(k, "key", "")) in ("key", "value", "ve_gate")
    or str(getattr(k, "key", "")).startswith("value_embed")
    for k in path
  )
  expanded = jax.tree_util.tree_map_with_path(
    lambda path, a: repeat(a) if grouped(path) else a, params
  )
  chex.assert_trees_all_equal_shapes(expanded, random_params(mha, tokens))
  got = jax.jit(lambda p, t: gqa.apply(p, t)[0])(params, tokens)
  want = jax.jit(lambda p, t: mha.apply(p, t)[0])(expanded, tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()))
  cache = jax.eval_shape(lambda: gqa.init(jax.random.PRNGKey(0), tokens, decode=True))["cache"]
  assert cache["block0"]["attention"]["cached_key"].shape == (2, 10, kv, 4)


def test_laplacian_layer_output_at_token_zero_is_bias_only():
  """Token 0 attends only to itself, so (I - P) V is 0 there: the attention
  branch of an all-Laplacian layer is W_O's bias alone at position 0."""
  model = tiny(4)
  params = init(model)
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 10), 0, 40)
  _, out = model.apply({"params": params}, tokens)
  bias = params["block0"]["attention"]["out"]["bias"]
  np.testing.assert_allclose(out["block0"]["sa"][:, 0], jnp.broadcast_to(bias, (2, 16)), atol=1e-6)


def test_residual_projection_init_scale():
  model = make_gpt(vocab_size=64, max_length=16, width=256, depth=6, num_heads=4)
  params = init(model)
  target = 0.02 / np.sqrt(2 * 6)
  for name in ("out",):
    w = np.concatenate(
      [np.ravel(params[f"block{i}"]["attention"][name]["kernel"]) for i in range(6)]
    )
    assert abs(w.std() - target) / target < 0.05
  w = np.concatenate([np.ravel(params[f"block{i}"]["mlp"]["fc2"]["kernel"]) for i in range(6)])
  assert abs(w.std() - target) / target < 0.05
  q = np.ravel(params["block0"]["attention"]["query"]["kernel"])
  assert abs(q.std() - 0.02) / 0.02 < 0.05
  assert "lm_head" not in params  # tied


def closed_form_count(m, vocab):
  """Parameters of a GPT of config ``m`` from its architecture, by module:
  per block W_Q, W_K, W_V, W_O ``4 D^2`` and the MLP ``2 D M`` (plus biases
  ``4 D + M + D``), two norms (``2 D`` each with LayerNorm's scale and bias, 0
  for parameter-free RMSNorm); the token embedding ``V D``, a learned position
  table ``T D``, the final norm, an untied output layer ``D V``."""
  d, mlp, depth = m.width, m.mlp_dim, m.depth
  norm = 2 * d if m.norm == "layernorm" else 0
  block = 4 * d * d + 2 * d * mlp + norm * 2
  if m.use_bias:
    block += 4 * d + mlp + d
  total = depth * block + vocab * d + norm
  if m.posemb == "learn":
    total += m.max_length * d
  if not m.tie_embeddings:
    total += d * vocab
  return total


@pytest.mark.parametrize(
  "name,vocab,expected",
  [
    ("gpt2_124m", 50257, 124_439_808),  # GPT-2 small (tied, learned positions, biases)
    ("gpt_d20", 65536, 560_988_160),
  ],
)  # 20 x 12 x 1280^2 + 2 x 65536 x 1280
def test_paper_config_parameter_count(name, vocab, expected):
  """Exact counts (``jax.eval_shape``: nothing is allocated): a missing
  position table, one layer's attention or a bias changes them."""
  c = load(name)
  assert closed_form_count(c.model, vocab) == expected
  model = GPT(spec_lib.from_config(c.model), vocab_size=vocab)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
  n = sum(x.size for x in jax.tree_util.tree_leaves(shapes))
  assert n == expected
  per_block = [
    sum(x.size for x in jax.tree_util.tree_leaves(shapes["params"][f"block{i}"]))
    for i in range(c.model.depth)
  ]
  assert per_block == [per_block[0]] * c.model.depth  # every layer complete


@pytest.mark.slow
@pytest.mark.parametrize("name,vocab", [("gpt2_124m", 50257), ("gpt_d20", 65536)])
def test_paper_config_one_step_at_tiny_width(name, vocab):
  """The config's structure (rope / tying / biases / qk-norm / Laplacian heads)
  at tiny width and context: one train step runs and changes the parameters."""
  c = load(name)
  m = c.model
  m.width, m.depth, m.mlp_dim, m.max_length = 8 * m.num_heads, 2, 64, 16
  c.optim.warmup_steps = 0
  c.total_steps = 10

  class Tok:
    vocab_size, token_bytes = vocab, np.ones(vocab, np.int32)

  task = tasks.LanguageModelTask(c, Tok())
  tx = optim.make_optimizer(c)
  state = jax.jit(lambda: state_lib.init_state(task, tx, 0))()
  step = jax.jit(loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, 10)))
  batch = {"tokens": np.random.default_rng(0).integers(0, vocab, (2, 17)).astype(np.int32)}
  new, metrics = step(state, batch)
  # At initialisation the loss is close to ln(vocab).
  assert abs(float(metrics["loss"]) - np.log(vocab)) < 0.5
  delta = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), new.params, state.params)
  assert max(jax.tree_util.tree_leaves(delta)) > 0
  if c.model.kernel_init == "nanochat":
    # gpt_d20 (nanochat's init): lm_head is zero, so no gradient reaches the
    # rest at step 0 and lm_head alone moves (as in nanochat).
    moved = {k for k, v in common_flat(delta).items() if v > 0}
    assert moved == {"lm_head/kernel"}, moved


def common_flat(tree):
  """``{"a/b": leaf}`` of a nested dict."""
  from laplax.convert import common

  return common.flat(tree)


def test_greedy_generation_equals_argmax_of_full_forward():
  model = tiny((1, 3))
  params = init(model)
  # One compiled forward over the whole context (10): the model is causal, so
  # the logits at position len(seq) - 1 are those of the unpadded sequence.
  full = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])

  def last_argmax(seq):
    padded = np.zeros((1, 10), np.int32)
    padded[0, : len(seq)] = seq
    return int(jnp.argmax(full(params, padded)[0, len(seq) - 1]))

  prompt = np.array([3, 14, 15], np.int32)
  out = sampling.generate(model, params, prompt, max_new_tokens=5, temperature=0.0)
  assert out.shape == (5,)
  seq = list(prompt)
  for _ in range(5):
    seq.append(last_argmax(seq))
  np.testing.assert_array_equal(out, seq[3:])
  # Past the context (10) decoding slides: the cache restarts on the last 5
  # tokens, so token t is the argmax of a full forward pass over its window.
  long = sampling.generate(model, params, prompt, max_new_tokens=12, temperature=0.0)
  seq, window = list(prompt), list(prompt)
  for _ in range(12):
    if len(window) > 10:
      window = seq[-5:]
    nxt = last_argmax(window)
    seq.append(nxt)
    window = window + [nxt]
  np.testing.assert_array_equal(long, seq[3:])
  with pytest.raises(ValueError, match="context"):
    sampling.generate(model, params, np.arange(11) % 40, max_new_tokens=1)


def test_top_k_one_is_greedy():
  model = tiny(2)
  params = init(model)
  prompt = np.array([1, 2], np.int32)
  greedy = sampling.generate(model, params, prompt, max_new_tokens=6, temperature=0.0)
  top1 = sampling.generate(
    model, params, prompt, max_new_tokens=6, temperature=1.5, top_k=1, rng=jax.random.PRNGKey(7)
  )
  np.testing.assert_array_equal(greedy, top1)


def test_continuation_logprob_matches_log_softmax_sum():
  model = tiny((0, 2))
  params = init(model)
  context, cont = np.array([5, 6, 7], np.int32), np.array([8, 9], np.int32)
  got = sampling.continuation_logprob(model, params, context, cont)
  seq = jnp.asarray([5, 6, 7, 8])[None]
  logp = jax.nn.log_softmax(model.apply({"params": params}, seq)[0][0], -1)
  np.testing.assert_allclose(got, float(logp[2, 8] + logp[3, 9]), rtol=1e-5)
