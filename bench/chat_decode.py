"""Decode speed of the chat: laplax's KV-cache decoding against a PyTorch one, same weights.

    python bench/chat_decode.py                       # configs/gpt_shakespeare.py's GPT
    python bench/chat_decode.py --set model.width=256 --set model.depth=6 --prompt 100

The GPT of ``--config`` (random weights, a ``--vocab`` token vocabulary) is
decoded greedily by :func:`laplax.models.sampling.stream` (what
``python -m laplax.proj.nanochat.chat`` and ``eval.py --sample`` run: one compiled step per
shape bucket) and by a nanochat-style PyTorch decoder with a preallocated KV
cache (``nanochat/engine.py``'s ``KVCache``: the prompt in one forward, then
one token per forward) on :mod:`bench.peer_torch`'s GPT with the same weights
(:func:`peer_torch.load_laplax_params`). Both decode the same prompt of
``--prompt`` tokens for ``--tokens`` new tokens, ``--reps`` times after a
warm-up (laplax's compilation is timed apart). Printed in one run: the
time to first token (prompt in, first token out) and the decode tokens per
second of each, their ratios (PyTorch over laplax for the time, laplax over
PyTorch for the rate: above 1 is laplax faster), and whether the greedy tokens
agree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


def torch_decoder(peer, torch, F):
  """``decode(prompt [n] ints, new) -> (tokens, seconds to the first token)``,
  greedy, with a KV cache of the context's length (PyTorch, no grad)."""
  import peer_torch

  blocks = peer.blocks
  heads = blocks[0].attn.num_heads
  width = peer.wte.weight.shape[1]
  hd = width // heads
  max_length = peer.cos.shape[0] if peer.posemb != "learn" else peer.wpe.shape[0]

  def forward(tokens, start, cache):
    n = tokens.shape[1]
    x = peer.wte(tokens)
    rope = None
    if peer.posemb == "learn":
      x = x + peer.wpe[start : start + n]
    else:
      rope = (peer.cos[start : start + n], peer.sin[start : start + n])
    for block, (kc, vc) in zip(blocks, cache):
      a = block.attn
      y = block.norm1(x)
      q, k, v = (f(y).view(1, n, heads, hd).transpose(1, 2) for f in (a.c_q, a.c_k, a.c_v))
      if rope is not None:
        q, k = peer_torch.apply_rotary(q, *rope), peer_torch.apply_rotary(k, *rope)
      kc[:, :, start : start + n] = k
      vc[:, :, start : start + n] = v
      o = F.scaled_dot_product_attention(
        q, kc[:, :, : start + n], vc[:, :, : start + n], is_causal=n > 1
      )
      if a.num_laplacian:
        s = heads - a.num_laplacian
        o = torch.cat([o[:, :s], v[:, s:] - o[:, s:]], dim=1)
      x = x + a.proj(o.transpose(1, 2).reshape(1, n, width))
      x = x + block.fc2(block.act(block.fc1(block.norm2(x))))
    x = peer.ln_f(x[:, -1])
    return F.linear(x, peer.wte.weight) if peer.tie else peer.lm_head(x)

  def decode(prompt, new):
    with torch.no_grad():
      t0 = time.perf_counter()
      cache = [
        (torch.zeros(1, heads, max_length, hd), torch.zeros(1, heads, max_length, hd))
        for _ in blocks
      ]
      tokens = torch.as_tensor([list(prompt)])
      pos, out, first = 0, [], None
      for _ in range(new):
        logits = forward(tokens, pos, cache)
        pos += tokens.shape[1]
        nxt = int(logits.argmax(-1))
        if first is None:
          first = time.perf_counter() - t0
        out.append(nxt)
        tokens = torch.as_tensor([[nxt]])
    return out, first

  return decode


def laplax_decoder(model, params):
  """The same for :func:`laplax.models.sampling.stream` (greedy)."""
  import numpy as np

  from laplax.models import sampling

  def decode(prompt, new):
    t0 = time.perf_counter()
    out, first = [], None
    for token in sampling.stream(
      model, params, np.asarray(prompt), max_new_tokens=new, temperature=0.0, slide=False
    ):
      if first is None:
        first = time.perf_counter() - t0
      out.append(token)
    return out, first

  return decode


def timed(decode, prompt, new, reps):
  """``(tokens, median seconds to the first token, median decode tokens/s)``."""
  firsts, rates = [], []
  for _ in range(reps):
    t0 = time.perf_counter()
    tokens, first = decode(prompt, new)
    total = time.perf_counter() - t0
    firsts.append(first)
    rates.append((len(tokens) - 1) / (total - first))
  return tokens, statistics.median(firsts), statistics.median(rates)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument(
    "--config",
    default=os.path.join(os.path.dirname(__file__), "..", "configs", "gpt_shakespeare.py"),
  )
  p.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
  p.add_argument("--vocab", type=int, default=2048, help="vocabulary size (nanochat's tiny run)")
  p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
  p.add_argument("--tokens", type=int, default=40, help="new tokens per decode")
  p.add_argument("--reps", type=int, default=5, help="timed decodes of each")
  args = p.parse_args()
  config = common.load_config(args.config)
  for item in args.set:
    common.apply_override(config, item)
  if args.prompt + args.tokens > config.model.max_length:
    common.fail(
      f"--prompt {args.prompt} + --tokens {args.tokens} exceed the context "
      f"{config.model.max_length}; lower them or --set model.max_length=N"
    )

  import jax
  import jax.numpy as jnp
  import numpy as np
  import peer_torch
  import torch
  import torch.nn.functional as F

  from laplax.models import spec as spec_lib
  from laplax.models.gpt import GPT

  try:
    peer_torch.check_supported(config)
  except ValueError as e:
    common.fail(str(e))
  model = GPT(spec_lib.from_config(config.model), args.vocab)
  tokens = jnp.zeros((1, config.model.max_length), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
  peer = peer_torch.GPT(config.model, args.vocab).eval()
  peer_torch.load_laplax_params(peer, params)
  prompt = np.random.default_rng(0).integers(0, args.vocab, args.prompt).tolist()
  ours, theirs = laplax_decoder(model, params), torch_decoder(peer, torch, F)
  t0 = time.perf_counter()
  ours(prompt, args.tokens)  # compiles the prompt's bucket and the one-token step
  compile_s = time.perf_counter() - t0
  theirs(prompt, args.tokens)
  a, a_first, a_rate = timed(ours, prompt, args.tokens, args.reps)
  b, b_first, b_rate = timed(theirs, prompt, args.tokens, args.reps)
  agree = sum(x == y for x, y in zip(a, b))
  m = config.model
  print(
    f"GPT width {m.width}, depth {m.depth}, {m.num_heads} heads, context {m.max_length}, "
    f"vocab {args.vocab}; prompt {args.prompt} tokens, {args.tokens} new, median of {args.reps}; "
    f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)"
  )
  print(
    f"laplax : first token {1e3 * a_first:7.2f} ms, decode {a_rate:8.1f} tokens/s "
    f"(first call with compilation: {compile_s:.2f} s)"
  )
  print(f"PyTorch: first token {1e3 * b_first:7.2f} ms, decode {b_rate:8.1f} tokens/s")
  print(
    f"ratios : time to first token PyTorch/laplax {b_first / a_first:.2f}, "
    f"decode rate laplax/PyTorch {a_rate / b_rate:.2f}; greedy tokens agree {agree}/{len(a)}"
  )


if __name__ == "__main__":
  main()
