"""Does the train step fit the CPU's cache? Memory bandwidth by array size, and
step time by number of micro-batches.

    python bench/cache_blocking.py                  # both default configs
    python bench/cache_blocking.py --config configs/gpt_shakespeare.py --accum 1,2,4

Part 1 times a jitted elementwise ``x * 2 + 1`` on float32 arrays of 2 to 128
MiB (``--sizes``) and prints the read+write bandwidth in GB/s: on a CPU it
falls by several times once the array outgrows the last-level cache. Part 2
builds each config's train step (its model and optimizer, one synthetic
batch, float32) once per ``optim.grad_accum_steps`` in ``--accum`` (the
batch cut into that many micro-batches, the gradient their mean: the same
update) and per ``optim.grad_accum_unroll`` (the micro-batch loop rolled, a
while loop in XLA, or unrolled), compiles each (the compile seconds are
printed), and times them round-robin over ``--rounds`` rounds of ``--steps``
steps, the first candidate rotating each round. It prints the median ms per
step, the speed-up over the first count of ``--accum`` (default 1: the
whole batch) measured in the same run and the loss
after the last step (equal to a few digits: the same training). Micro-batch
counts that do not divide the batch are skipped. Nothing is written.

Errors (an unknown config, a bad list, no count dividing the batch) print one
``error:`` line and exit 2.
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

from bench import step_time
from bench.common import apply_override, fail, load_config


def bandwidth(sizes_mib: list[int], reps: int = 20, rounds: int = 5) -> None:
  """Prints the GB/s of ``x * 2 + 1`` (one read, one write) per array size."""
  print(f"{'array (MiB)':>12s} {'us':>10s} {'GB/s':>7s}")
  f = jax.jit(lambda x: x * 2.0 + 1.0)
  for mib in sizes_mib:
    x = jnp.asarray(np.random.default_rng(0).standard_normal(mib << 18, np.float32))
    jax.block_until_ready(f(x))
    times = []
    for _ in range(rounds):
      t0 = time.perf_counter()
      for _ in range(reps):
        out = f(x)
      jax.block_until_ready(out)
      times.append((time.perf_counter() - t0) / reps)
    t = statistics.median(times)
    print(f"{mib:12d} {t * 1e6:10.1f} {2 * x.nbytes / t / 1e9:7.1f}")


def micro_batches(path: str, accum: list[int], args) -> None:
  """Times one config's train step per micro-batch count and loop form."""
  config = load_config(path)
  for item in args.set:
    apply_override(config, item)
  if config.batch_size < 1:
    fail(f"batch_size={config.batch_size} must be >= 1")
  image_shape = (28, 28, 1)
  batch = jax.device_put(step_time.synthetic_batch(config, image_shape, 10))
  candidates, compile_seconds = {}, {}
  for n in dict.fromkeys(accum):  # in order, each once
    if config.batch_size % n:
      print(f"skipped: {n} micro-batches do not divide batch_size={config.batch_size}")
      continue
    for unroll in (False,) if n == 1 else (False, True):
      c = config.copy_and_resolve_references()
      c.optim.grad_accum_steps, c.optim.grad_accum_unroll = n, unroll
      step, state, _ = step_time.build(
        c,
        c.model.num_laplacian_heads,
        c.model.spectral.mode if c.model.spectral.enabled else None,
        image_shape,
        10,
      )
      t0 = time.perf_counter()
      step = step.lower(state, batch).compile()
      seconds = time.perf_counter() - t0
      for _ in range(args.warmup):
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      name = f"{n} x {config.batch_size // n}" + (" unrolled" if unroll else "")
      candidates[name], compile_seconds[name] = step_time.stepper(step, state, batch), seconds
  if not candidates:
    fail(f"no micro-batch count in --accum divides batch_size={config.batch_size}")
  times, metrics = step_time.round_robin(candidates, args.rounds, args.steps)
  first = next(iter(times))
  base = statistics.median(times[first])
  print(
    f"\nconfig {path}, batch {config.batch_size}: {args.rounds} rounds x {args.steps} "
    f"steps, median; speed-up over {first}"
  )
  print(f"{'micro-batches':24s} {'ms/step':>9s} {'speed-up':>9s} {'compile s':>10s} {'loss':>12s}")
  for name, ts in times.items():
    t = statistics.median(ts)
    print(
      f"{name:24s} {t * 1e3:9.2f} {base / t:9.3f} {compile_seconds[name]:10.1f} "
      f"{float(metrics[name]['loss']):12.7f}"
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config", action="append", help="config file (repeatable; default: the ViT and GPT defaults)"
  )
  parser.add_argument(
    "--accum", default="1,2,4,8", help="micro-batch counts, comma-separated (default 1,2,4,8)"
  )
  parser.add_argument(
    "--sizes",
    default="2,8,32,128",
    help="array sizes in MiB for the bandwidth part; empty: skip it",
  )
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=2, help="steps before timing (>= 1)")
  parser.add_argument(
    "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
  )
  args = parser.parse_args()
  try:
    accum = [int(a) for a in args.accum.split(",")]
    sizes = [int(s) for s in args.sizes.split(",") if s]
  except ValueError:
    fail(
      f"--accum {args.accum!r} / --sizes {args.sizes!r} must be comma-separated "
      f"integers, e.g. --accum 1,2,4"
    )
  if not accum or min(accum) < 1 or min(sizes, default=1) < 1:
    fail("--accum and --sizes take integers >= 1")
  if min(args.rounds, args.steps, args.warmup) < 1:
    fail("--rounds, --steps and --warmup must be >= 1")
  paths = args.config or list(step_time.DEFAULT_CONFIGS)
  for path in paths:
    if not os.path.isfile(path):
      fail(f"no config file {path}; pass e.g. --config configs/vit_fashion_mnist.py")
  device = jax.devices()[0]
  print(f"{device.platform} ({device.device_kind}), {len(os.sched_getaffinity(0))} usable CPUs")
  if sizes:
    bandwidth(sizes)
  for path in paths:
    micro_batches(path, accum, args)


if __name__ == "__main__":
  main()
