"""Train-step time of the default ViT and GPT with and without the two methods.

    python bench/step_time.py                       # ViT default and GPT default
    python bench/step_time.py --config configs/gpt_shakespeare.py --rounds 5 --steps 20

Builds each config's model and optimizer for five variants -- 0 Laplacian
heads (the baseline), all heads Laplacian, half of them, spectral
conditioning (lambda * I_k) with 0 Laplacian heads, and all Laplacian plus
spectral -- compiles each jitted train step, then times them interleaved over
``--rounds`` rounds of ``--steps`` steps on one synthetic batch, and prints the
median step time (and tokens/s for language models) of each and its ratio to
the baseline measured in this same run. Target: overhead <= 2%.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from laplax.train import loop, optim, tasks  # pylint: disable=wrong-import-position


def load_config(path: str):
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


class ShapeVocab:
  """The tokenizer fields a language-model task reads, without a corpus."""

  def __init__(self, vocab_size: int = 256):
    self.vocab_size = vocab_size
    self.token_bytes = np.ones(vocab_size, np.int32)


def make_task(config, image_shape, num_classes):
  """``config``'s task built from shapes alone (no dataset is opened); a
  language model gets the byte vocabulary or ``data.vocab_size`` for BPE."""
  if config.task == "lm":
    byte = config.data.get("tokenizer", "byte") == "byte"
    return tasks.LanguageModelTask(config, ShapeVocab(256 if byte else int(config.data.vocab_size)))
  return tasks.ClassificationTask(config, num_classes, image_shape)


def build(config, laplacian: int, spectral: bool, image_shape, num_classes):
  c = config.copy_and_resolve_references()
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral
  task = make_task(c, image_shape, num_classes)
  tx = optim.make_optimizer(c)
  step = jax.jit(loop.make_train_step(
      task, tx, optim.learning_rate_schedule(c.optim, c.total_steps)),
                 donate_argnums=0)
  state = jax.jit(lambda: loop.init_state(task, tx, c.seed))()
  return step, state


def bench(path: str, args) -> None:
  """Times the variants of one config and prints the table."""
  config = load_config(path)
  image_shape = tuple(int(s) for s in args.image_shape.split(","))
  heads = config.model.num_heads
  variants = {
      "baseline (0 Laplacian heads)": (0, False),
      f"all {heads} heads Laplacian": (heads, False),
      f"{heads // 2} of {heads} heads Laplacian": (heads // 2, False),
      "spectral lambda*I_k": (0, True),
      "all Laplacian + spectral": (heads, True),
  }
  rng = np.random.default_rng(0)
  b = config.batch_size
  if config.task == "lm":
    length = config.model.max_length
    batch = {"tokens": rng.integers(0, 256, (b, length + 1)).astype(np.int32)}
    tokens_per_step = b * length
  else:
    batch = {"image": rng.standard_normal((b,) + image_shape, np.float32),
             "label": rng.integers(0, args.num_classes, b).astype(np.int32)}
    tokens_per_step = None
  batch = jax.device_put(batch)
  runs = {}
  for name, (k, s) in variants.items():
    step, state = build(config, k, s, image_shape, args.num_classes)
    for _ in range(3):  # compile and warm up
      state, m = step(state, batch)
    jax.block_until_ready(m)
    runs[name] = [step, state, []]
  for _ in range(args.rounds):
    for name, run in runs.items():
      step, state, times = run
      t0 = time.perf_counter()
      for _ in range(args.steps):
        state, m = step(state, batch)
      jax.block_until_ready(m)
      times.append((time.perf_counter() - t0) / args.steps)
      run[1] = state
  base = statistics.median(runs["baseline (0 Laplacian heads)"][2])
  print(f"\nconfig {path}, batch {b}, backend {jax.default_backend()}, "
        f"{args.rounds} rounds x {args.steps} steps, median step time")
  print(f"{'variant':32s} {'ms/step':>9s} {'tokens/s':>9s} {'ratio':>7s}")
  for name, (_, _, times) in runs.items():
    t = statistics.median(times)
    tps = f"{tokens_per_step / t:9.0f}" if tokens_per_step else f"{'-':>9s}"
    print(f"{name:32s} {t * 1e3:9.2f} {tps} {t / base:7.3f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", action="append",
                      help="config file (repeatable); default: the ViT and GPT defaults")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--image-shape", default="28,28,1")
  parser.add_argument("--num-classes", type=int, default=10)
  args = parser.parse_args()
  for path in args.config or ["configs/vit_fashion_mnist.py", "configs/gpt_shakespeare.py"]:
    bench(path, args)


if __name__ == "__main__":
  main()
