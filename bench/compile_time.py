"""Compile time of the train step with and without ``model.scan_layers``.

    python bench/compile_time.py                    # default ViT at depth 12
    python bench/compile_time.py --config configs/gpt_shakespeare.py --depth 12

Builds the config's model at ``--depth`` layers, then for the blocks looped
and under ``nn.scan`` traces and lowers the jitted train step on abstract
inputs (``jax.eval_shape`` of the state, the task's batch spec: nothing is
initialised) and compiles it, and prints both times and their ratio. One
run, no repetition: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from bench.common import load_config, make_task
from laplax import optim
from laplax import state as state_lib
from laplax.train import budget, loop


def compile_seconds(config, scan: bool, image_shape, num_classes) -> tuple[float, float]:
  """(trace + lower, compile) seconds of the train step of ``config``."""
  c = config.copy_and_resolve_references()
  c.model.scan_layers = scan
  task = make_task(c, image_shape, num_classes)
  tx = optim.make_optimizer(c)
  step = jax.jit(
    loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, c.total_steps)),
    donate_argnums=0,
  )
  state = state_lib.abstract_state(task, tx, c.seed)
  batch = task.batch_spec(c.batch_size)
  t0 = time.perf_counter()
  lowered = step.lower(state, batch, *budget.controls_spec(c))
  t1 = time.perf_counter()
  lowered.compile()
  return t1 - t0, time.perf_counter() - t1


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/vit_fashion_mnist.py")
  parser.add_argument("--depth", type=int, default=12)
  parser.add_argument("--remat", default="none")
  parser.add_argument("--image-shape", default="28,28,1")
  parser.add_argument("--num-classes", type=int, default=10)
  args = parser.parse_args()
  config = load_config(args.config)
  config.model.depth = args.depth
  config.model.remat = args.remat
  counts = config.model.num_laplacian_heads
  if isinstance(counts, (list, tuple)):  # one count per layer of the new depth
    config.model.num_laplacian_heads = [counts[i % len(counts)] for i in range(args.depth)]
  image_shape = tuple(int(s) for s in args.image_shape.split(","))
  times = {
    scan: compile_seconds(config, scan, image_shape, args.num_classes) for scan in (False, True)
  }
  print(
    f"config {args.config}, depth {args.depth}, remat {args.remat}, backend "
    f"{jax.default_backend()}: train step trace+lower / compile / total seconds"
  )
  for scan, (lower, comp) in times.items():
    name = "nn.scan over layers" if scan else "looped layers"
    print(f"{name:22s} {lower:7.2f} {comp:7.2f} {lower + comp:7.2f}")
  total = {scan: sum(t) for scan, t in times.items()}
  print(f"ratio scan / looped (total): {total[True] / total[False]:.3f}")


if __name__ == "__main__":
  main()
