"""The Laplacian authors' nanochat fork (yuchongzhang/nanochat 1f70b557): its GPT exactly.

The oracle is a PyTorch transcription of the fork's ``GPT.forward``
(nanochat/gpt.py at that commit, inference without a KV cache): the
embedding normed, the previous-token smear, per block ``resid_lambdas[i] x +
x0_lambdas[i] x0``, value embeddings on alternating layers (the last
included) added to ``v`` through ``3 sigmoid(ve_gate(x[..., :12]))`` (one
gate per key/value head), rotary (base 100,000, ``-theta``, before the
qk-norm), ``q, k`` x 1.2, grouped-query attention (``n_kv_head`` key/value
heads ``repeat_interleave``'d to the query heads), causal attention with the
sliding window of the layer (``SSSL``: query ``i`` sees key ``j`` iff ``0 <=
i - j <= window``, nanochat's flash_attention.py fallback), the last ``k``
heads Laplacian (``v - A v``, ``v`` the repeated values), ReLU^2, the backout
of block ``n_layer // 2`` before the final norm, ``lm_head`` over the padded
vocabulary cut back, the soft-cap 15. Every scalar, gate and table is random
(none at its initial value), the windows are shorter than the sequence, and
the checkpoint the test writes in the fork's format goes through ``--from
nanochat``; everything is float32 but the rotary table, bfloat16 as the fork
keeps it on a GPU (COMPUTE_DTYPE).
"""

import importlib.util
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import utils
from laplax.convert import common, nanochat
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT

from helpers.configs import load

pytestmark = pytest.mark.skipif(
  not importlib.util.find_spec("torch"), reason="the oracle: pip install -r requirements-test.txt"
)
torch = F = None
# 512 tokens of context give a short window of 128 (ceil(512 / 4 / 128) * 128);
# the tests run 160 tokens, so the S layers see only part of the sequence.
FORK = dict(
  sequence_len=512,
  vocab_size=100,
  n_layer=4,
  n_head=4,
  n_kv_head=4,
  n_embd=64,
  use_ve=True,
  use_resid_lambdas=True,
  use_x0=True,
  use_smear=True,
  use_backout=True,
  window_pattern="SSSL",
  laplacian_heads=[0, 1, 4, 2],
)
LENGTH = 160


@pytest.fixture(autouse=True, scope="module")
def _torch():
  global torch, F
  import torch as torch_module
  import torch.nn.functional as functional

  torch_module.set_num_threads(1)
  torch, F = torch_module, functional


def fork_forward(sd, mc, idx):
  """The fork's GPT forward (no KV cache), float32, from its state dict ``sd``."""
  d, heads, depth, vocab = mc["n_embd"], mc["n_head"], mc["n_layer"], mc["vocab_size"]
  hd, (batch, length), kv = d // heads, idx.shape, mc["n_kv_head"]
  channels = torch.arange(0, hd, 2, dtype=torch.float32)
  angle = torch.outer(torch.arange(length, dtype=torch.float32), 1.0 / (100000 ** (channels / hd)))
  cos, sin = (t.bfloat16()[None, :, None, :] for t in (angle.cos(), angle.sin()))
  norm = lambda x: F.rms_norm(x, (x.size(-1),))
  pattern, long = mc["window_pattern"], mc["sequence_len"]
  short = -(-long // 4 // 128) * 128
  windows = [short if pattern[i % len(pattern)] == "S" else long for i in range(depth)]
  windows[-1] = long
  w = lambda name: sd[name].float()

  def rotate(x):
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)

  x = norm(F.embedding(idx, w("transformer.wte.weight")))
  if mc["use_smear"]:
    gate = w("smear_lambda") * torch.sigmoid(F.linear(x[:, 1:, :24], w("smear_gate.weight")))
    x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
  x0, x_backout = x, None
  pos = torch.arange(length)
  for i in range(depth):
    if mc["use_resid_lambdas"]:
      x = w("resid_lambdas")[i] * x
    if mc["use_x0"]:
      x = x + w("x0_lambdas")[i] * x0
    h = f"transformer.h.{i}."
    y = norm(x)
    q = F.linear(y, w(f"{h}attn.c_q.weight")).view(batch, length, heads, hd)
    k, v = (F.linear(y, w(f"{h}attn.c_{n}.weight")).view(batch, length, kv, hd) for n in "kv")
    if f"value_embeds.{i}.weight" in sd:
      ve = F.embedding(idx, w(f"value_embeds.{i}.weight")).view(batch, length, kv, hd)
      gate = 3 * torch.sigmoid(F.linear(y[..., :12], w(f"{h}attn.ve_gate.weight")))
      v = v + gate.unsqueeze(-1) * ve
    q, k = norm(rotate(q)) * 1.2, norm(rotate(k)) * 1.2
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # grouped-query attention: query head h uses key/value head h // (heads / kv)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    diff = pos[:, None] - pos[None, :]
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=(diff >= 0) & (diff <= windows[i]))
    n = mc["laplacian_heads"][i]
    if n:
      a = torch.cat([a[:, : heads - n], v[:, heads - n :] - a[:, heads - n :]], 1)
    x = x + F.linear(a.transpose(1, 2).reshape(batch, length, d), w(f"{h}attn.c_proj.weight"))
    x = x + F.linear(
      F.relu(F.linear(norm(x), w(f"{h}mlp.c_fc.weight"))).square(), w(f"{h}mlp.c_proj.weight")
    )
    if mc["use_backout"] and i == depth // 2:
      x_backout = x
  if x_backout is not None:
    x = x - w("backout_lambda") * x_backout
  logits = F.linear(norm(x), w("lm_head.weight"))[..., :vocab].float()
  return 15 * torch.tanh(logits / 15)


def fork_state_dict(mc, seed=0):
  """Random weights of the fork's shapes: every matrix, table, gate and scalar
  random (``lm_head`` std 0.5 so the soft-cap bends; scalars away from their
  initial values), ``c_proj`` non-zero."""
  g = torch.Generator().manual_seed(seed)
  sd = {}
  for name, shape in nanochat.nanochat_shapes(mc).items():
    if len(shape) == 1:
      sd[name] = 0.5 + 0.5 * torch.rand(shape, generator=g)
      continue
    fan_in = shape[1]
    std = (
      0.8 if "wte" in name or "value_embeds" in name else 0.5 if "lm_head" in name else fan_in**-0.5
    )
    if "ve_gate" in name or "smear_gate" in name:
      std = 1.0  # gates far from sigmoid(0)
    sd[name] = torch.randn(*shape, generator=g) * std
  return sd


def write_checkpoint(path, mc, sd, step=7):
  os.makedirs(path, exist_ok=True)
  torch.save(sd, os.path.join(path, f"model_{step:06d}.pt"))
  with open(os.path.join(path, f"meta_{step:06d}.json"), "w") as f:
    json.dump({"step": step, "model_config": mc, "model_tag": "d4"}, f, indent=2)
  return str(path)


def from_fork(model_dir, workdir):
  c = load("gpt_d20")
  common.plain_attention(c, [])
  nanochat.convert_from_nanochat(str(model_dir), c, str(workdir))
  config, spec, params, _ = common.read_workdir(str(workdir))
  return GPT(spec, config.data.vocab_size), common.to_layout(params, spec), spec


def _tokens(mc, seed=1):
  return np.random.default_rng(seed).integers(0, mc["vocab_size"], (2, LENGTH))


@pytest.mark.parametrize(
  "switches",
  [
    {},
    dict(use_ve=False, use_smear=False),
    dict(use_resid_lambdas=False, use_x0=False, use_backout=False),
    dict(n_kv_head=2),
  ],
  ids=["all", "no-ve-no-smear", "no-lambdas-no-backout", "gqa"],
)
def test_fork_logits_equal_a_pytorch_transcription_through_from_nanochat(tmp_path, switches):
  """``gqa``: 2 key/value heads for the 4 query heads (narrower ``c_k``,
  ``c_v``, value embeddings and gates), everything else as ``all``."""
  mc = {**FORK, **switches}
  sd = fork_state_dict(mc)
  model, params, spec = from_fork(write_checkpoint(tmp_path / "ckpt", mc, sd), tmp_path / "wd")
  assert spec.windows() == (128, 128, 128, None) and spec.attention.qk_scale == 1.2
  assert spec.kv_heads == mc["n_kv_head"]
  assert spec.padded_vocab(mc["vocab_size"]) == 128
  idx = _tokens(mc)
  with torch.no_grad():
    want = fork_forward(sd, mc, torch.from_numpy(idx)).numpy()
  got = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t)[0])(params, idx))
  assert got.shape == want.shape == (2, LENGTH, mc["vocab_size"])
  scale = np.abs(want).max()
  assert np.abs(got - want).max() <= 1e-5 * scale, np.abs(got - want).max() / scale
  if not switches:  # laplax.load: the vocabulary, not the padded table's rows
    import laplax

    run = laplax.load(str(tmp_path / "wd"))
    loaded = jax.jit(lambda p, t: run.model.apply({"params": p}, t)[0])(run.params, idx)
    np.testing.assert_array_equal(np.asarray(loaded), got)
  # the window matters here: the S layers differ from full attention
  with torch.no_grad():
    full = fork_forward(sd, {**mc, "window_pattern": "L"}, torch.from_numpy(idx)).numpy()
  assert np.abs(full - want).max() > 1e-3 * scale


@pytest.mark.slow
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_fork_decoding_with_the_kv_cache_equals_the_full_forward(tmp_path, n_kv_head):
  """The cache holds the key/value heads only (``[batch, length, n_kv_head, hd]``)."""
  mc = dict(FORK, n_kv_head=n_kv_head)
  sd = fork_state_dict(mc, seed=3)
  model, params, _ = from_fork(write_checkpoint(tmp_path / "ckpt", mc, sd), tmp_path / "wd")
  idx = jnp.asarray(_tokens(mc, seed=2))
  full = jax.jit(lambda p, t: model.apply({"params": p}, t)[0])(params, idx)
  cache = jax.eval_shape(
    lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((2, LENGTH), jnp.int32), decode=True)
  )["cache"]
  assert cache["block0"]["attention"]["cached_key"].shape == (2, LENGTH, n_kv_head, 16)
  cache = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), cache)
  step = jax.jit(
    lambda p, c, t: model.apply({"params": p, "cache": c}, t, decode=True, mutable=["cache"])
  )
  parts = []
  for a, b in [(0, 150), (150, 151), (151, LENGTH)]:
    (logits, _), mutated = step(params, cache, idx[:, a:b])
    cache = mutated["cache"]
    parts.append(logits)
  err = np.abs(np.concatenate(parts, 1) - np.asarray(full)).max()
  assert err <= 1e-5 * np.abs(np.asarray(full)).max()


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_fork_round_trip_is_bitwise_and_writes_the_fork_s_model_config(tmp_path, n_kv_head):
  mc = dict(FORK, n_kv_head=n_kv_head)
  sd = fork_state_dict(mc, seed=5)
  for name in ("transformer.wte.weight", "value_embeds.1.weight", "value_embeds.3.weight"):
    sd[name] = sd[name].bfloat16()  # the fork keeps them in bfloat16
  src = write_checkpoint(tmp_path / "ckpt", mc, sd)
  _, _, spec = from_fork(src, tmp_path / "wd")
  assert spec.kv_heads == n_kv_head
  nanochat.convert_to_nanochat(str(tmp_path / "wd"), str(tmp_path / "back"))
  back = torch.load(tmp_path / "back" / "model_000000.pt", weights_only=True)
  assert sorted(back) == sorted(sd)
  for name, t in sd.items():
    assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
  with open(tmp_path / "back" / "meta_000000.json") as f:
    assert json.load(f)["model_config"] == mc


def test_n_kv_head_that_does_not_divide_n_head_is_refused_in_one_line(tmp_path):
  mc = dict(FORK, n_kv_head=3)
  os.makedirs(tmp_path / "ckpt")
  (tmp_path / "ckpt" / "model_000007.pt").write_bytes(b"")
  with open(tmp_path / "ckpt" / "meta_000007.json", "w") as f:
    json.dump({"step": 7, "model_config": mc}, f)
  with pytest.raises(common.ConvertError) as e:
    from_fork(tmp_path / "ckpt", tmp_path / "wd")
  assert "n_kv_head=3 must divide n_head=4" in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "wd").exists()


def test_fork_init_is_the_fork_s(tmp_path):
  """The fork's init_weights: scalars at their formulas, gates in U(0, 0.02),
  matrices uniform with the fork's bounds, output projections zero."""
  c = load("gpt_d20")
  m = c.model
  m.width, m.depth, m.num_heads, m.mlp_dim, m.max_length = 64, 4, 4, 256, 512
  m.num_laplacian_heads = 1
  from laplax.config import defaults

  defaults.nanochat_fork_model(c)
  spec = spec_lib.from_config(m)
  init = jax.jit(lambda k: GPT(spec, 100).init(k, jnp.zeros((1, 8), jnp.int32)))
  params = init(jax.random.PRNGKey(0))["params"]
  i = np.arange(4) / 3
  np.testing.assert_allclose(params["resid_lambdas"], 1.15 - 0.10 * i, rtol=1e-6)
  np.testing.assert_allclose(params["x0_lambdas"], 0.20 - 0.15 * i, rtol=1e-6)
  assert float(params["smear_lambda"][0]) == 0.0 and float(
    params["backout_lambda"][0]
  ) == np.float32(0.2)
  s = (3 / 64) ** 0.5
  q = np.asarray(params["block0"]["attention"]["query"]["kernel"])
  fc = np.asarray(params["block0"]["mlp"]["fc1"]["kernel"])
  assert 0.9 * s < np.abs(q).max() <= s and 0.9 * 0.4 * s < np.abs(fc).max() <= 0.4 * s
  assert not np.any(params["block0"]["attention"]["out"]["kernel"])
  assert not np.any(params["block0"]["mlp"]["fc2"]["kernel"])
  gate = np.asarray(params["block1"]["attention"]["ve_gate"]["kernel"])
  assert gate.min() >= 0 and gate.max() <= 0.02 and "ve_gate" not in params["block0"]["attention"]
  assert params["token_embedding"]["embedding"].shape == (128, 64)
  assert abs(float(np.std(params["token_embedding"]["embedding"])) - 0.8) < 0.05
  assert abs(float(np.std(params["lm_head"]["kernel"])) - 0.001) < 1e-4


def test_a_window_without_causal_attention_is_refused_in_one_line():
  from laplax.attention import MultiHeadAttention

  mha = MultiHeadAttention(num_heads=2, window=4, implementation="xla")
  x = jnp.zeros((1, 16, 8))
  with pytest.raises(ValueError, match="sliding window .* needs causal attention") as e:
    mha.init(jax.random.PRNGKey(0), x, is_causal=False)
  assert "\n" not in str(e.value)


def test_recipe_nanochat_fork_is_the_fork_s_d20_and_its_horizon():
  """d20 of the fork: 896,533,746 parameters (the fork's num_scaling_params
  total, NANOCHAT-fork's shapes), 4,980 updates of 2^20 tokens, SSSL windows of 512."""
  c = load("gpt_d20", "recipe=nanochat-fork,laplacian=2")
  spec = spec_lib.from_config(c.model)
  assert (spec.width, spec.num_heads, spec.depth, c.data.vocab_size) == (1280, 10, 20, 32768)
  assert spec.windows() == tuple(None if i % 4 == 3 else 512 for i in range(20))
  assert c.total_steps == 4980 and c.batch_size * spec.max_length == 2**20
  shapes = jax.eval_shape(
    lambda: GPT(spec, c.data.vocab_size).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  )["params"]
  total = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
  # wte + lm_head + 10 value embeddings (32768 x 1280 each), 20 x 12 x 1280^2 in the
  # blocks, 10 gates of 12 x 10, 20 + 20 lambdas, the smear gate (24), 3 scalars
  want = 12 * 32768 * 1280 + 20 * 12 * 1280**2 + 10 * 120 + 40 + 24 + 2
  assert total == want == 896_533_746
  assert abs(c.optim.muon_lr - 0.02 * 2**0.5) < 1e-12
  assert (
    abs(c.optim.embedding_lr - 0.32863) < 1e-5 and abs(c.optim.unembedding_lr - 0.008764) < 1e-6
  )
  assert spec_lib.from_config(load("gpt_d20", "recipe=nanochat-fork,depth=12").model).width == 768
  with pytest.raises(ValueError, match="recipe="):
    load("gpt_d20", "recipe=other")


# --------------------------------------------------------------------------- MuonAdamW

POLAR = [
  (8.156554524902461, -22.48329292557795, 15.878769915207462),
  (4.042929935166739, -2.808917465908714, 0.5000178451051316),
  (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
  (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
  (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def torch_adamw(p, grad, state, lr, b1, b2, eps, wd):
  """optim.py's adamw_step_fused (float32)."""
  state["step"] = state.get("step", 0) + 1
  m, v = state.setdefault("m", torch.zeros_like(p)), state.setdefault("v", torch.zeros_like(p))
  p.mul_(1 - lr * wd)
  m.lerp_(grad, 1 - b1)
  v.lerp_(grad.square(), 1 - b2)
  bias1, bias2 = 1 - b1 ** state["step"], 1 - b2 ** state["step"]
  p.add_(m / ((v / bias2).sqrt() + eps), alpha=-lr / bias1)


def torch_muon(p, grad, state, momentum, lr, wd, beta2=0.9):
  """optim.py's muon_step_fused for one [out, in] matrix, COMPUTE_DTYPE float32."""
  buf = state.setdefault("buf", torch.zeros_like(p))
  red = -1 if p.size(-2) >= p.size(-1) else -2
  shape = (p.size(0), 1) if red == -1 else (1, p.size(1))
  buf2 = state.setdefault("buf2", torch.zeros(shape))
  buf.lerp_(grad, 1 - momentum)
  g = grad.clone().lerp_(buf, momentum)
  x = g
  target = x.norm(dim=(-2, -1), keepdim=True) / (x.size(-2) ** 0.5)
  x = x * (target / x.norm(dim=-1, keepdim=True).clamp_min(1e-6))
  x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
  for a, b, c in POLAR:
    if g.size(-2) > g.size(-1):
      A = x.mT @ x
      x = a * x + x @ (b * A + c * (A @ A))
    else:
      A = x @ x.mT
      x = a * x + (b * A + c * (A @ A)) @ x
  g = x * (min(g.size(-2), g.size(-1)) ** 0.5 / x.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6))
  v_mean = g.square().mean(dim=red, keepdim=True)
  size = g.size(red)
  v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * size).sqrt()
  buf2.lerp_(v_mean, 1 - beta2)
  step = buf2.clamp_min(1e-10).rsqrt()
  v_norm_new = ((v_mean * size) * step.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
  g = g * (step * (v_norm / v_norm_new.clamp_min(1e-10)))
  lr = lr * max(1.0, p.size(-2) / p.size(-1)) ** 0.5
  p.sub_(lr * g + lr * wd * p * ((g * p) >= 0))


def fork_momentum_transcribed(it, total, ratio):
  """base_train.py's get_muon_momentum."""
  warmdown = round(ratio * total)
  start = total - warmdown
  if it < 400:
    return (1 - it / 400) * 0.85 + it / 400 * 0.97
  if it >= start:
    progress = (it - start) / warmdown
    return 0.97 * (1 - progress) + 0.90 * progress
  return 0.97


def test_muon_momentum_schedule_is_base_train_s():
  from laplax.proj.nanochat.optim import fork as nanochat_fork

  for it in (0, 1, 399, 400, 1000, 1749, 1750, 1751, 4979):
    got = float(nanochat_fork.fork_momentum(it, 4980, 0.65))
    assert abs(got - fork_momentum_transcribed(it, 4980, 0.65)) < 1e-6, it


@pytest.mark.slow
def test_muon_adamw_steps_equal_a_pytorch_transcription_of_optim_py():
  """Seven updates across the warm-up and into the warm-down (N = 10): every
  group of the fork's setup_optimizer, base_train's rate, momentum and decay
  schedules; float32 Muon (the fork's COMPUTE_DTYPE off a GPU)."""
  import ml_collections

  from laplax.proj.nanochat.optim import fork as nanochat_fork

  rng = np.random.default_rng(0)
  r = lambda *s: rng.standard_normal(s).astype(np.float32)
  params = {
    "block0": {"attention": {"query": {"kernel": r(8, 16)}, "ve_gate": {"kernel": r(12, 2)}}},
    "block1": {"mlp": {"fc1": {"kernel": r(8, 32)}}},
    "token_embedding": {"embedding": r(20, 8)},
    "value_embed1": {"embedding": r(20, 8)},
    "lm_head": {"kernel": r(8, 20)},
    "resid_lambdas": r(2),
    "x0_lambdas": r(2),
    "smear_gate": {"kernel": r(24, 1)},
    "smear_lambda": r(1),
    "backout_lambda": r(1),
  }
  o = ml_collections.ConfigDict(
    dict(
      muon_lr=0.03,
      embedding_lr=0.3,
      unembedding_lr=0.008,
      lr=0.7,
      muon_weight_decay=0.1,
      warmup_steps=2,
      warmdown_ratio=0.5,
      min_lr_ratio=0.05,
    )
  )
  total = 10
  tx = nanochat_fork.nanochat_fork(o, total, muon_dtype=jnp.float32)
  grads = [jax.tree_util.tree_map(lambda p: r(*p.shape), params) for _ in range(7)]
  state, ours = tx.init(params), params
  for g in grads:
    upd, state = tx.update(g, state, ours)
    ours = jax.tree_util.tree_map(lambda p, u: p + u, ours, upd)
  # the oracle: PyTorch [out, in] weights, the fork's groups
  flat = lambda t: {
    "/".join(map(str, utils.path_keys(k))): v for k, v in jax.tree_util.tree_leaves_with_path(t)
  }
  kernel = lambda name: name.endswith("kernel")
  tp = {n: torch.tensor(v.T.copy() if kernel(n) else v) for n, v in flat(params).items()}
  groups = {
    "lm_head/kernel": ("adamw", 0.008, 0.8, 0.96, 0.01),
    "token_embedding/embedding": ("adamw", 0.3, 0.8, 0.995, 0.001),
    "value_embed1/embedding": ("adamw", 0.15, 0.8, 0.995, 0.01),
    "resid_lambdas": ("adamw", 0.007, 0.8, 0.95, 0.05),
    "x0_lambdas": ("adamw", 0.7, 0.96, 0.95, 0.0),
    "smear_gate/kernel": ("adamw", 0.2, 0.8, 0.95, 0.0),
    "smear_lambda": ("adamw", 0.2, 0.8, 0.95, 0.0),
    "backout_lambda": ("adamw", 0.2, 0.8, 0.95, 0.0),
  }
  states = {n: {} for n in tp}
  warmdown = round(0.5 * total)
  for it, g in enumerate(grads):
    lrm = (
      (it + 1) / 2
      if it < 2
      else 1.0
      if it <= total - warmdown
      else ((total - it) / warmdown + (1 - (total - it) / warmdown) * 0.05)
    )
    mom = fork_momentum_transcribed(it, total, 0.5)
    wd = 0.1 * 0.5 * (1 + math.cos(math.pi * it / total))
    for n, gv in flat(g).items():
      grad = torch.tensor(gv.T.copy() if kernel(n) else gv)
      if n in groups:
        _, lr, b1, b2, decay = groups[n]
        torch_adamw(tp[n], grad, states[n], lr * lrm, b1, b2, 1e-10, decay)
      else:
        torch_muon(tp[n], grad, states[n], mom, 0.03 * lrm, wd)
  for n, v in flat(ours).items():
    want = tp[n].numpy()
    want = want.T if kernel(n) else want
    np.testing.assert_allclose(np.asarray(v), want, rtol=2e-5, atol=2e-6, err_msg=n)
  assert not np.allclose(
    np.asarray(ours["block0"]["attention"]["query"]["kernel"]),
    params["block0"]["attention"]["query"]["kernel"],
  )


@pytest.mark.slow
def test_recipe_trains_with_the_fork_s_optimiser():
  """The fork recipe at depth 2 (width 128, one head of 128) learns a repeated
  sequence with make_optimizer's MuonAdamW: every parameter gets a group."""
  import optax

  from laplax import optim
  from laplax.proj.nanochat.optim import fork as nanochat_fork

  c = load("gpt_d20", "recipe=nanochat-fork,depth=2,laplacian=1")
  c.model.max_length, c.model.dtype, c.model.embedding_dtype = 64, "float32", "float32"
  c.data.vocab_size, c.total_steps = 50, 30
  spec = spec_lib.from_config(c.model)
  model = GPT(spec, c.data.vocab_size)
  tokens = jnp.asarray(np.tile(np.random.default_rng(0).integers(0, 50, 16), 5)[None, :65])
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
  tx = optim.make_optimizer(c)
  assert set(jax.tree_util.tree_leaves(nanochat_fork.fork_labels(params))) == {
    "muon",
    "wte",
    "value_embeds",
    "lm_head",
    "resid",
    "x0",
    "smear",
  }

  def loss_fn(p):
    logits, _ = model.apply({"params": p}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(p, s):
    loss, g = jax.value_and_grad(loss_fn)(p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

  state, losses = tx.init(params), []
  for _ in range(30):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[0] > 3.5 and losses[-1] < 0.5 * losses[0], losses


def test_the_laplacian_sweep_grid_plans_and_validates(tmp_path):
  """runs/laplacian_sweep.sh's grid as a laplax.sweep: depth 12/16/20 x
  Laplacian heads 0/1/2/4 x seeds 1-3, each at its compute-optimal horizon."""
  from laplax import sweep

  grid = sweep.parse_grid([":depth=12,16,20", ":laplacian=0,1,2,4"])
  runs = sweep.plan(
    "configs/gpt_d20.py:recipe=nanochat-fork", grid, [1, 2, 3], [], str(tmp_path / "sweep")
  )
  assert len(runs) == 36 and runs[0].name == "depth=12,laplacian=0,seed=1"
  configs = sweep.check_runs([r for r in runs if r.seed == 1 and r.cell[1][1] == "4"])
  steps = {name.split(",")[0]: c.total_steps for name, c in configs.items()}
  from laplax.config import defaults

  assert steps == {f"depth={d}": defaults.nanochat_fork_horizon(d)["steps"] for d in (12, 16, 20)}
  assert steps["depth=12"] == 2520 and steps["depth=20"] == 4980
