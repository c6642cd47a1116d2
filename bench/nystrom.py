"""Nystrom attention: its error against softmax as the landmarks grow, and its
cost against softmax's as the length grows.

    python bench/nystrom.py                       # both parts
    python bench/nystrom.py --part error --length 256
    python bench/nystrom.py --part cost --lengths 1024,2048,4096

Part ``error``: for random queries and keys correlated along the sequence
(cumulative sums of normal steps, scaled by ``1/sqrt(t)``; batch 2, 2 heads,
head_dim 16), the relative Frobenius error of a Laplacian head's ``V - P~ V``
against the exact ``V - P V`` (``laplax.attention.reference_attention``),
and the mean and largest ``|row sum of P~ - 1|`` (``P~ = kernel_1 pinv
kernel_2 kernel_3``, formed here only to measure it), per landmark count and
pseudo-inverse iteration count, the approximation used at every count (also
``m = length``).

Part ``cost``: the jitted forward and backward pass (``jax.grad`` of the sum
of squares) of one attention of batch 1, 2 heads of 32, softmax (the XLA
kernel) and Nystrom (64 landmarks), median seconds of ``--repeats`` runs and
the compiled step's temporary memory (XLA's ``memory_analysis``), per length,
with the fitted exponent of time ~ length^k over the lengths. Nothing is written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from laplax import attention
from laplax.kernels import nystrom


def _qkv(n, b=2, h=2, d=16, seed=0):
  r = np.random.default_rng(seed)
  q, k, v = (r.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3))
  scale = np.sqrt(np.arange(1, n + 1))[None, :, None, None]
  return jnp.asarray(np.cumsum(q, 1) / scale), jnp.asarray(np.cumsum(k, 1) / scale), jnp.asarray(v)


def _row_sums(q, k, m, iterations):
  """Row sums of ``P~`` (float32 ``[b, h, n]``): ``P~ 1`` through the kernel with V = 1."""
  ones = jnp.ones(q.shape[:3] + (1,), jnp.float32)
  return nystrom.nystrom_attention(
    q, k, ones, num_landmarks=m, pinv_iterations=iterations, exact_when_full=False
  )[..., 0]


def error_table(length: int) -> None:
  q, k, v = _qkv(length)
  exact, _ = attention.reference_attention(q, k, v)
  lap = v - exact
  landmarks = [
    m for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if length % m == 0 and m <= length
  ]
  print(f"length {length}: relative error of V - P~V; |row sum of P~ - 1| mean / max")
  print(f"{'landmarks':>9} {'iters':>5} {'error':>10} {'rowsum mean':>12} {'rowsum max':>11}")
  for iterations in (6, 20):
    for m in landmarks:
      pv = nystrom.nystrom_attention(
        q, k, v, num_landmarks=m, pinv_iterations=iterations, exact_when_full=False
      )
      err = float(jnp.linalg.norm((v - pv) - lap) / jnp.linalg.norm(lap))
      dev = jnp.abs(_row_sums(q, k, m, iterations) - 1.0)
      print(
        f"{m:>9} {iterations:>5} {err:>10.3e} {float(dev.mean()):>12.3e} {float(dev.max()):>11.3e}"
      )


def cost_table(lengths, repeats: int) -> None:
  print("length  softmax s  nystrom s  ratio  softmax temp MiB  nystrom temp MiB")
  times = {"softmax": [], "nystrom": []}
  for n in lengths:
    q, k, v = _qkv(n, b=1, h=2, d=32)
    row = []
    for name in ("softmax", "nystrom"):
      impl = "xla" if name == "softmax" else "nystrom"
      opts = nystrom.NystromSpec(num_landmarks=64) if name == "nystrom" else None

      def loss(q, k, v, impl=impl, opts=opts):
        out = attention.attend(
          q, k, v, laplacian=np.zeros(2, bool), implementation=impl, nystrom=opts
        )
        return jnp.sum(out**2)

      step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
      compiled = step.lower(q, k, v).compile()
      mem = compiled.memory_analysis()
      temp = getattr(mem, "temp_size_in_bytes", 0) / 2**20 if mem is not None else float("nan")
      jax.block_until_ready(compiled(q, k, v))
      runs = []
      for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(q, k, v))
        runs.append(time.perf_counter() - t)
      times[name].append(statistics.median(runs))
      row.append((times[name][-1], temp))
    (ts, ms), (tn, mn) = row
    print(f"{n:>6} {ts:>10.4f} {tn:>10.4f} {ts / tn:>6.2f} {ms:>17.1f} {mn:>17.1f}")
  x = np.log(np.asarray(lengths, float))
  for name, t in times.items():
    slope = np.polyfit(x, np.log(t), 1)[0]
    print(f"{name}: time ~ length^{slope:.2f} over {lengths[0]}..{lengths[-1]}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--part", default="both", choices=("error", "cost", "both"))
  p.add_argument("--length", type=int, default=256, help="length of the error part")
  p.add_argument("--lengths", default="1024,2048,4096,8192,16384")
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args(argv)
  try:
    lengths = [int(s) for s in a.lengths.split(",")]
  except ValueError:
    print(f"error: --lengths={a.lengths!r} must be comma-separated integers", file=sys.stderr)
    return 2
  if any(n % 64 for n in lengths) or a.length < 1:
    print("error: the cost lengths must be multiples of the 64 landmarks", file=sys.stderr)
    return 2
  if a.part in ("error", "both"):
    error_table(a.length)
  if a.part in ("cost", "both"):
    cost_table(lengths, a.repeats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
