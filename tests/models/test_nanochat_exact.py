"""nanochat's d20 exactly: forward, optimiser, schedule, size, and weights both ways.

The oracle is a PyTorch transcription of nanochat's forward written here from
its definition (nanochat/gpt.py of the first release; the authors' Laplacian
heads: the last ``k`` heads of a layer output ``v - A v``; ``n_kv_head``
key/value heads repeated to the query heads by ``repeat_kv``, i.e.
``repeat_interleave``, before both): RMSNorm with
PyTorch's default eps, the embedding normalised, rotary by ``-theta`` with
the float32-then-bfloat16 table and before the qk-norm, ReLU^2, the soft-cap
``15 tanh(logits / 15)``. A checkpoint directory (``model_<step>.pt``,
``meta_<step>.json``) of random weights goes through ``--from nanochat`` and
laplax's GPT gives the same logits to ``1e-5 * max|logits|``. Everything runs
in float32; the only bfloat16 values are nanochat's rotary table (stored in
bfloat16, multiplied in float32) and, in the round trip, a bfloat16 ``wte``
(kept bit for bit, and looked up into float32 on both sides).
"""

import importlib.util
import json
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from laplax import optim, rotary
from laplax.config import defaults
from laplax.convert import common, nanochat
from laplax.data.text import tokenizers
from laplax.data.text.nanochat_tokenizer import PICKLE_FILE, NanochatTokenizer
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT
from laplax.proj.nanochat.optim import first_release as nanochat_optim

from helpers.configs import load
from helpers.runs import ROOT

pytestmark = pytest.mark.skipif(
  not importlib.util.find_spec("torch"), reason="the oracle: pip install -r requirements-test.txt"
)
torch = F = None
SMALL = dict(sequence_len=64, vocab_size=300, n_layer=2, n_head=4, n_kv_head=4, n_embd=128)


@pytest.fixture(autouse=True, scope="module")
def _torch():
  global torch, F
  import torch as torch_module
  import torch.nn.functional as functional

  torch_module.set_num_threads(1)
  torch, F = torch_module, functional


# --------------------------------------------------------------------------- the oracle


def _rotary_torch(length, head_dim, base=10_000):
  """nanochat's table: float32 angles, cos/sin rounded to bfloat16."""
  channels = torch.arange(0, head_dim, 2, dtype=torch.float32)
  inv_freq = 1.0 / (base ** (channels / head_dim))
  angle = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
  return angle.cos().bfloat16(), angle.sin().bfloat16()


def torch_forward(sd, mc, idx):
  """nanochat's GPT forward (inference, no KV cache), float32, from ``sd``."""
  d, heads, depth, kv = mc["n_embd"], mc["n_head"], mc["n_layer"], mc["n_kv_head"]
  hd, (batch, length) = d // heads, idx.shape
  lap = mc.get("laplacian_heads", 0)
  counts = lap if isinstance(lap, list) else [lap] * depth
  cos, sin = (t[None, :, None, :] for t in _rotary_torch(length, hd))
  norm = lambda x: F.rms_norm(x, (x.size(-1),))

  def rotate(x):
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)

  w = lambda name: sd[name].float()
  x = norm(F.embedding(idx, w("transformer.wte.weight")))
  for i in range(depth):
    h = f"transformer.h.{i}."
    y = norm(x)
    q = F.linear(y, w(f"{h}attn.c_q.weight")).view(batch, length, heads, hd)
    k, v = (F.linear(y, w(f"{h}attn.c_{n}.weight")).view(batch, length, kv, hd) for n in "kv")
    q, k = norm(rotate(q)), norm(rotate(k))
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if counts[i]:  # the last k heads are Laplacian: v - A v
      split = heads - counts[i]
      a = torch.cat([a[:, :split], v[:, split:] - a[:, split:]], 1)
    x = x + F.linear(a.transpose(1, 2).reshape(batch, length, d), w(f"{h}attn.c_proj.weight"))
    y = F.relu(F.linear(norm(x), w(f"{h}mlp.c_fc.weight"))).square()
    x = x + F.linear(y, w(f"{h}mlp.c_proj.weight"))
  logits = F.linear(norm(x), w("lm_head.weight"))
  return 15 * torch.tanh(logits / 15)


def _state_dict(mc, seed=0, wte_dtype=None):
  """Random weights of nanochat's shapes: nanochat's init for the matrices,
  but ``lm_head`` and the output projections random too (std 0.5 for
  ``lm_head``, so the soft-cap bends the logits), ``wte`` N(0, 1)."""
  g = torch.Generator().manual_seed(seed)
  sd = {}
  for name, (out, inp) in nanochat.nanochat_shapes(mc).items():
    std = (
      1.0 if "wte" in name else 0.5 if "lm_head" in name else min(1, (out / inp) ** 0.5) / inp**0.5
    )
    sd[name] = torch.randn(out, inp, generator=g) * std
  if wte_dtype is not None:
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"].to(wte_dtype)
  return sd


def _checkpoint(path, mc, sd, step=100):
  os.makedirs(path, exist_ok=True)
  torch.save(sd, os.path.join(path, f"model_{step:06d}.pt"))
  with open(os.path.join(path, f"meta_{step:06d}.json"), "w") as f:
    json.dump({"step": step, "model_config": mc}, f)
  return str(path)


def _from_nanochat(model_dir, workdir, **kw):
  c = load("gpt_d20")
  common.plain_attention(c, [])
  nanochat.convert_from_nanochat(str(model_dir), c, str(workdir), **kw)
  config, spec, params, _ = common.read_workdir(str(workdir))
  return GPT(spec, config.data.vocab_size), common.to_layout(params, spec), spec, config


def _tokens(mc, seed=1):
  return np.random.default_rng(seed).integers(0, mc["vocab_size"], (2, mc["sequence_len"]))


@pytest.mark.parametrize(
  "laplacian_heads,n_kv_head",
  [(0, 4), (2, 4), ([1, 3], 4), ([1, 3], 2)],
  ids=["0", "2", "1-3", "1-3-gqa"],
)
def test_logits_equal_a_pytorch_nanochat_through_from_nanochat(
  tmp_path, laplacian_heads, n_kv_head, record_property
):
  """``n_kv_head=2``: grouped-query attention, 2 key/value heads for 4 heads."""
  mc = dict(SMALL, n_kv_head=n_kv_head)
  if laplacian_heads:
    mc["laplacian_heads"] = laplacian_heads
  sd = _state_dict(mc)
  model, params, spec, config = _from_nanochat(
    _checkpoint(tmp_path / "ckpt", mc, sd), tmp_path / "w"
  )
  want = laplacian_heads if isinstance(laplacian_heads, list) else [laplacian_heads] * 2
  assert spec.laplacian_array.sum(1).tolist() == want
  assert spec.attention.rope.rope_style == "nanochat" and spec.logit_softcap == 15.0
  assert config.model.embedding_dtype == "float32" and config.model.dtype == "float32"
  tokens = _tokens(mc)
  got = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t)[0])(params, tokens))
  with torch.no_grad():
    ref = torch_forward(sd, mc, torch.as_tensor(tokens)).numpy()
  err = float(np.abs(got - ref).max() / np.abs(ref).max())
  record_property("max_relative_difference", err)
  assert np.abs(ref).max() > 5  # the soft-cap is not in its linear range
  assert err < 1e-5, err
  if isinstance(laplacian_heads, list):  # KV-cache decoding: traced rotary positions
    dec = _decode(model, params, tokens[:1, :12])
    np.testing.assert_allclose(dec, ref[0, :12], atol=1e-5 * np.abs(ref).max())


def _decode(model, params, tokens):
  """Logits ``[length, vocab]`` of ``tokens [1, length]`` fed one at a time."""
  shapes = jax.eval_shape(
    lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, model.spec.max_length), jnp.int32), decode=True
    )
  )["cache"]
  cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  @jax.jit
  def step(params, cache, token):
    (logits, _), updated = model.apply(
      {"params": params, "cache": cache}, token, decode=True, mutable=["cache"]
    )
    return updated["cache"], logits[0, -1]

  out = []
  for t in range(tokens.shape[1]):
    cache, logits = step(params, cache, jnp.asarray(tokens[:, t : t + 1]))
    out.append(np.asarray(logits))
  return np.stack(out)


def test_round_trip_laplax_nanochat_laplax_is_bitwise(tmp_path):
  """bfloat16 ``wte`` (as nanochat keeps it) and per-layer Laplacian heads:
  --from, --to and --from again give the same tensors bit for bit."""
  mc = dict(SMALL, laplacian_heads=[0, 3])
  sd = _state_dict(mc, seed=2, wte_dtype=torch.bfloat16)
  src = _checkpoint(tmp_path / "ckpt", mc, sd, step=7)
  _, params, spec, config = _from_nanochat(src, tmp_path / "w1")
  assert config.model.embedding_dtype == "bfloat16"
  assert params["token_embedding"]["embedding"].dtype == ml_dtypes.bfloat16
  nanochat.convert_to_nanochat(str(tmp_path / "w1"), str(tmp_path / "out"))
  back = torch.load(tmp_path / "out" / "model_000000.pt", weights_only=True)
  meta = json.loads((tmp_path / "out" / "meta_000000.json").read_text())
  assert meta["model_config"] == mc
  assert set(back) == set(sd)
  for name, value in sd.items():
    assert back[name].dtype == value.dtype, name
    assert torch.equal(back[name], value), name
  _, params2, _, _ = _from_nanochat(tmp_path / "out", tmp_path / "w2")
  flat1, flat2 = common.flat(params), common.flat(params2)
  assert flat1.keys() == flat2.keys()
  for name in flat1:
    np.testing.assert_array_equal(
      np.asarray(flat1[name]).view(np.uint8), np.asarray(flat2[name]).view(np.uint8), err_msg=name
    )


def test_rotary_table_is_pytorch_s_for_d20():
  """The whole d20 table (20,480 positions x 64): at most a few entries one
  bfloat16 step from PyTorch's (float32 cos/sin rounded twice)."""
  cos, sin = _rotary_torch(20_480, 128)
  our_sin, our_cos = rotary.nanochat_table(20_480, 128)
  for ours, theirs in ((our_cos, cos), (our_sin, sin)):
    theirs = theirs.float().numpy()
    diff = np.abs(ours - theirs)
    assert (diff > 0).sum() <= 4, (diff > 0).sum()
    assert diff.max() <= 2.0**-8


# --------------------------------------------------------------------------- size, steps


def test_d20_has_560_988_160_parameters_and_21400_steps():
  c = load("gpt_d20")
  assert defaults.nanochat_num_params(1280, 20, 65536) == 560_988_160
  model = GPT(spec_lib.from_config(c.model), vocab_size=c.data.vocab_size)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
  assert sum(x.size for x in jax.tree_util.tree_leaves(shapes)) == 560_988_160
  assert shapes["params"]["token_embedding"]["embedding"].dtype == jnp.bfloat16
  assert c.total_steps == 21_400 == 20 * 560_988_160 // (256 * 2048)
  assert (c.model.width, c.model.depth, c.model.num_heads, c.model.max_length) == (
    1280,
    20,
    10,
    2048,
  )


def _tiny_params(d=8):
  return {
    "token_embedding": {"embedding": jnp.zeros((16, d), jnp.bfloat16)},
    "lm_head": {"kernel": jnp.zeros((d, 16))},
    "block0": {
      "attention": {"query": {"kernel": jnp.zeros((d, d))}},
      "mlp": {"fc1": {"kernel": jnp.zeros((d, 4 * d))}, "fc2": {"kernel": jnp.zeros((4 * d, d))}},
    },
  }


@pytest.mark.parametrize("step", [0, 1, 150, 299, 300, 17_119, 17_120, 17_121, 21_398, 21_399])
def test_d20_learning_rates_and_muon_momentum_follow_nanochat(step):
  """At update ``step`` of gpt_d20 (N = 21,400, warm-down W = 4,280), from zero
  moments: each group's update is ``-lr * lrm(step)`` times its direction,
  ``lrm = 1`` up to ``N - W`` then ``(N - step) / W``; Muon's buffer is
  ``(1 - mu) g`` with ``mu = 0.85 + 0.1 min(step / 300, 1)``."""
  c = load("gpt_d20")
  s = (1280 / 768) ** -0.5
  n, w = 21_400, 4_280
  lrm = 1.0 if step <= n - w else (n - step) / w
  mu = 0.85 + 0.10 * min(step / 300, 1)
  c.optim.grad_clip = None  # the clipping has its own test
  tx = optim.make_optimizer(c)
  params = _tiny_params()
  rng = np.random.default_rng(step)
  grads = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
  state = optax.tree_utils.tree_set(tx.init(params), count=jnp.asarray(step, jnp.int32))
  updates, new_state = tx.update(grads, state, params)  # eager: every bfloat16 rounding kept
  t = step + 1
  for key, base in (("lm_head", 0.004 * s), ("token_embedding", 0.2 * s)):
    g = np.asarray(jax.tree_util.tree_leaves(grads[key])[0], np.float64)
    m, v = 0.2 * g, 0.05 * g * g
    want = -base * lrm * np.sqrt(1 - 0.95**t) / (1 - 0.8**t) * m / (np.sqrt(v) + 1e-10)
    got = np.asarray(jax.tree_util.tree_leaves(updates[key])[0], np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2 if key == "token_embedding" else 1e-5)
  bufs = [
    b
    for b in jax.tree_util.tree_leaves(new_state)
    if getattr(b, "shape", ()) == (8, 8) and b.dtype == jnp.float32
  ]
  g = np.asarray(grads["block0"]["attention"]["query"]["kernel"])
  np.testing.assert_allclose(bufs[0], (1 - mu) * g, rtol=1e-5)
  # The Nesterov direction u = (1 - mu) g + mu buf with u rounded as the
  # transform rounds it (mu in float32, checked above): bfloat16
  # Newton-Schulz amplifies another rounding of u by up to 20% in an entry.
  mu32 = jnp.float32(mu)
  for name, shape in (("fc1", (8, 32)), ("fc2", (32, 8))):
    g = grads["block0"]["mlp"][name]["kernel"]
    u = (1.0 - mu32) * g + mu32 * ((1.0 - mu32) * g)
    aspect = max(1.0, shape[1] / shape[0]) ** 0.5  # sqrt(max(1, fan_out / fan_in))
    want = -0.02 * lrm * aspect * np.asarray(nanochat_optim.newton_schulz(u), np.float64)
    got = np.asarray(updates["block0"]["mlp"][name]["kernel"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_newton_schulz_adam_and_clipping_match_pytorch_transcriptions():
  """Newton-Schulz (bfloat16, both orientations) against nanochat/muon.py's
  algorithm in PyTorch, bit for bit (``c * A @ A`` is ``(c A) A``, each
  product rounded to bfloat16); the gradient clipping against
  ``torch.nn.utils.clip_grad_norm_``; three DistAdamW steps in float32."""
  a, b, c = nanochat_optim.NS_COEFFS
  rng = np.random.default_rng(0)
  for shape in ((24, 40), (40, 24), (32, 32)):  # Flax [fan_in, fan_out]
    g = rng.normal(size=shape).astype(np.float32)
    x = torch.from_numpy(g.T.copy()).bfloat16()  # PyTorch's [out, in]
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
      gram = x @ x.mT
      x = a * x + (b * gram + c * gram @ gram) @ x
    want = (x.mT if tall else x).float().numpy().T
    got = np.asarray(nanochat_optim.newton_schulz(jnp.asarray(g)), np.float32)
    np.testing.assert_array_equal(got, want)  # bit for bit on the CPU
  grads = [rng.normal(size=(5, 3)).astype(np.float32) * 3, rng.normal(size=(7,)).astype(np.float32)]
  tensors = [torch.from_numpy(x.copy()).requires_grad_() for x in grads]
  for t, x in zip(tensors, grads):
    t.grad = torch.from_numpy(x.copy())
  torch.nn.utils.clip_grad_norm_(tensors, 1.0)
  clipped, _ = nanochat_optim.clip_by_global_norm(1.0).update([jnp.asarray(x) for x in grads], None)
  for got, t in zip(clipped, tensors):
    np.testing.assert_allclose(np.asarray(got), t.grad.numpy(), rtol=1e-6)
  # A norm near 1e-6, where torch's "+ 1e-6" halves the coefficient.
  small = [x * 1e-7 for x in grads]
  for t, x in zip(tensors, small):
    t.grad = torch.from_numpy(x.copy())
  torch.nn.utils.clip_grad_norm_(tensors, 1e-7)
  clipped, _ = nanochat_optim.clip_by_global_norm(1e-7).update(
    [jnp.asarray(x) for x in small], None
  )
  for got, t in zip(clipped, tensors):
    np.testing.assert_allclose(np.asarray(got), t.grad.numpy(), rtol=1e-5)
  tx = nanochat_optim.scale_by_adam(0.8, 0.95, 1e-10)
  p = torch.zeros(6, dtype=torch.float64)
  m, v = torch.zeros_like(p), torch.zeros_like(p)
  state = tx.init(jnp.zeros(6))
  for step in range(1, 4):
    g = rng.normal(size=6)
    m.mul_(0.8).add_(torch.from_numpy(g), alpha=0.2)
    v.mul_(0.95).addcmul_(torch.from_numpy(g), torch.from_numpy(g), value=0.05)
    want = m / (v.sqrt() + 1e-10) * (1 - 0.95**step) ** 0.5 / (1 - 0.8**step)
    got, state = tx.update(jnp.asarray(g, jnp.float32), state)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


# --------------------------------------------------------------------------- the tokenizer


def _tokenizer():
  """nanochat's layout at a tiny size: the 256 bytes, two merges ("th", "the"),
  the nine special tokens at ids 258..266 (vocabulary 267)."""
  ranks = {bytes([i]): i for i in range(256)}
  ranks.update({b"th": 256, b"the": 257})
  return NanochatTokenizer.from_ranks(ranks)


class _Hostile:
  """A pickle that would create a directory when loaded by ``pickle.load``."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (os.mkdir, (self.path,))


def test_tokenizer_pickle_is_read_without_running_it(tmp_path):
  tok = _tokenizer()
  path = tok.save_nanochat(str(tmp_path))
  import tiktoken

  real = pickle.loads((tmp_path / PICKLE_FILE).read_bytes())  # what nanochat does with it
  assert isinstance(real, tiktoken.Encoding) and real.encode("the") == [257]
  tok.save(str(tmp_path / "t.json"))
  for source in (path, str(tmp_path / "t.json")):
    back = nanochat.read_tokenizer(source, 267)
    assert back.vocab_size == 267 and back.fingerprint == tok.fingerprint, source
    assert (
      back.encode("the them").tolist() == real.encode_ordinary("the them") == [257, 32, 257, 109]
    )
  with pytest.raises(common.ConvertError, match="has 267 tokens but the model's vocab_size is 300"):
    nanochat.read_tokenizer(path, 300)
  marker = tmp_path / "pwned"
  other = tiktoken.Encoding(
    name="x",
    pat_str=r"\p{L}+|\s+|.",
    mergeable_ranks=real._mergeable_ranks,
    special_tokens={"<|bos|>": 258, "<|user_start|>": 259},
  )
  for name, payload in (
    ("reduce", _Hostile(str(marker))),
    (
      "inside",
      {
        "name": "x",
        "pat_str": "",
        "mergeable_ranks": {},
        "special_tokens": {},
        "x": _Hostile(str(marker)),
      },
    ),
    ("by_name", "cl100k_base"),
    ("not_an_encoding", [1, 2]),
    ("other_special_tokens", other),
  ):
    bad = tmp_path / f"{name}.pkl"
    bad.write_bytes(pickle.dumps(payload))
    with pytest.raises(common.ConvertError) as e:
      nanochat.read_tokenizer(str(bad), 267)
    assert "\n" not in str(e.value) and str(bad) in str(e.value), name
    assert not marker.exists(), name
  assert "posix.mkdir" in str(
    pytest.raises(common.ConvertError, nanochat.read_tokenizer, str(tmp_path / "reduce.pkl")).value
  )


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "laplax.convert", *map(str, args)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )


@pytest.mark.slow
def test_cli_converts_with_the_tokenizer_and_refuses_a_hostile_pickle(tmp_path):
  """A hostile ``tokenizer.pkl`` through the CLI is one line, exit 2, nothing
  written and nothing run; ``--from nanochat`` finds the tokenizer in
  nanochat's layout and keeps it as the training pipeline's
  ``nanochat_tokenizer.json`` (the file eval.py and a resumed train.py read),
  ``--to nanochat`` writes the pickle back (in process)."""
  mc = dict(SMALL, vocab_size=267)
  tok = _tokenizer()
  src = _checkpoint(tmp_path / "base" / "base_checkpoints" / "d2", mc, _state_dict(mc))
  source_pkl = tok.save_nanochat(str(tmp_path / "base" / "tokenizer"))
  marker = tmp_path / "pwned"
  (tmp_path / "hostile.pkl").write_bytes(pickle.dumps(_Hostile(str(marker))))
  bad = _cli(
    "--from",
    "nanochat",
    "--model",
    src,
    "--workdir",
    tmp_path / "bad",
    "--tokenizer",
    tmp_path / "hostile.pkl",
  )
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
  assert "hostile.pkl" in bad.stderr and "Refused" in bad.stderr and "mkdir" in bad.stderr
  assert not marker.exists() and not (tmp_path / "bad").exists()
  _, _, _, config = _from_nanochat(src, tmp_path / "w")
  assert config.data.tokenizer == "nanochat" and config.data.vocab_size == 267
  with open(source_pkl, "rb") as f:
    source = pickle.load(f)  # our own file: the real tiktoken Encoding
  text = "the theme: 你好 <|bos|> 12345\r\n"
  converted = NanochatTokenizer.from_path(str(tmp_path / "w"))
  run_tok = tokenizers.load_tokenizer(config.data, str(tmp_path / "w"))  # as eval.py reads it
  for t in (converted, run_tok):
    assert t.vocab_size == 267 and t.encode(text).tolist() == source.encode_ordinary(text)
  nanochat.convert_to_nanochat(str(tmp_path / "w"), str(tmp_path / "out"))
  with open(tmp_path / "out" / PICKLE_FILE, "rb") as f:
    back = pickle.load(f)
  assert (back.name, back._pat_str, back._mergeable_ranks, back._special_tokens) == (
    source.name,
    source._pat_str,
    source._mergeable_ranks,
    source._special_tokens,
  )
  assert back.encode_ordinary(text) == source.encode_ordinary(text)
  with pytest.raises(common.ConvertError, match="exists"):
    nanochat.convert_to_nanochat(str(tmp_path / "w"), str(tmp_path / "out"))


@pytest.mark.slow
@pytest.mark.skipif(
  not all(importlib.util.find_spec(m) for m in ("gcsfs", "gcp_storage_emulator")),
  reason="needs gcsfs and gcp-storage-emulator (requirements-test.txt)",
)
def test_gs_workdir_keeps_the_tokenizer_and_goes_back_bitwise(tmp_path, monkeypatch):
  """--from nanochat onto a gs:// workdir (a GCS emulator) uploads the staged
  tokenizer with the checkpoint; --to nanochat of it writes the model file
  and pickle that --to nanochat of the same local conversion writes."""
  from laplax import store

  from helpers.gcs import start_emulator

  mc = dict(SMALL, vocab_size=267)
  src = _checkpoint(tmp_path / "base" / "base_checkpoints" / "d2", mc, _state_dict(mc))
  _tokenizer().save_nanochat(str(tmp_path / "base" / "tokenizer"))
  with start_emulator() as emu:
    for k, v in emu.env.items():
      monkeypatch.setenv(k, v)
    url = f"gs://{emu.bucket}/d2"
    _from_nanochat(src, tmp_path / "local")
    _from_nanochat(src, url)
    local_tok = (tmp_path / "local" / nanochat.TOKENIZER_FILE).read_bytes()
    assert store.read_bytes(f"{url}/{nanochat.TOKENIZER_FILE}") == local_tok
    nanochat.convert_to_nanochat(url, str(tmp_path / "out_gs"))
  nanochat.convert_to_nanochat(str(tmp_path / "local"), str(tmp_path / "out_local"))
  names = sorted(os.listdir(tmp_path / "out_local"))
  assert names == sorted(os.listdir(tmp_path / "out_gs")) and PICKLE_FILE in names
  for name in names:
    if name.endswith(".pt"):  # torch.save's archive holds a per-file record name
      a, b = (torch.load(tmp_path / d / name) for d in ("out_local", "out_gs"))
      assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    else:
      assert (tmp_path / "out_gs" / name).read_bytes() == (
        tmp_path / "out_local" / name
      ).read_bytes()
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
