"""Train-step time of the default ViT and GPT with and without the two methods.

    python bench/step_time.py                       # ViT default and GPT default
    python bench/step_time.py --config configs/gpt_shakespeare.py --rounds 5 --steps 20
    python bench/step_time.py --config configs/gpt_d20.py --batch 16 \
        --set model.implementation=cudnn --variants baseline,half --peak-tflops 989

Builds each config's model and optimizer for eight variants -- 0 Laplacian
heads (the baseline), all heads Laplacian, half of them, spectral
conditioning (lambda * I_k, the default ``full`` layout) with 0 Laplacian
heads, all Laplacian plus spectral, and the other spectral layouts
``per_head``, ``fused`` and ``svd`` -- compiles each jitted train step, then times them interleaved over
``--rounds`` rounds of ``--steps`` steps on one synthetic batch, and prints the
median step time (and tokens/s for language models) of each and its ratio to
the baseline measured in this same run. Target: overhead <= 2%.

``--set KEY=VALUE`` overrides config keys (as ``bench/compile_report.py``),
``--batch`` the batch size, ``--variants`` picks some of ``baseline``,
``all``, ``half``, ``spectral``, ``both``, ``per_head``, ``fused``, ``svd``. Each row also gives the model
TFLOP/s: the analytic train FLOPs per step of ``compile_report.analytic_flops``
(6 x matmul parameters x tokens + 12 x depth x length x width x tokens, 8 and
16 with ``model.remat``) over the step time; with ``--peak-tflops`` (the
accelerator's dense peak, e.g. 989 for bf16 on an H100/H200 SXM) also the
model FLOPs utilisation (MFU) = model TFLOP/s / peak.
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


def build(config, laplacian: int, spectral: str | None, image_shape, num_classes):
  """(jitted train step, state, analytic train FLOPs per step) of a variant;
  ``spectral`` is a ``model.spectral.mode`` or ``None`` (off)."""
  from bench import compile_report  # pylint: disable=import-outside-toplevel
  c = config.copy_and_resolve_references()
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral is not None
  if spectral is not None:
    c.model.spectral.mode = spectral
  task = make_task(c, image_shape, num_classes)
  tx = optim.make_optimizer(c)
  step = jax.jit(loop.make_train_step(
      task, tx, optim.learning_rate_schedule(c.optim, c.total_steps)),
                 donate_argnums=0)
  state = jax.jit(lambda: loop.init_state(task, tx, c.seed))()
  remat = c.model.get("remat", "none") not in (None, "none", False)
  _, flops = compile_report.analytic_flops(c, task, state.params, remat)
  return step, state, flops


VARIANTS = ("baseline", "all", "half", "spectral", "both", "per_head", "fused", "svd")


def bench(path: str, args) -> None:
  """Times the variants of one config and prints the table."""
  from bench import compile_report  # pylint: disable=import-outside-toplevel
  config = load_config(path)
  for item in args.set:
    compile_report.apply_override(config, item)
  if args.batch:
    config.batch_size = args.batch
  image_shape = tuple(int(s) for s in args.image_shape.split(","))
  heads = config.model.num_heads
  variants = {
      "baseline (0 Laplacian heads)": (0, None),
      f"all {heads} heads Laplacian": (heads, None),
      f"{heads // 2} of {heads} heads Laplacian": (heads // 2, None),
      "spectral lambda*I_k (full)": (0, "full"),
      "all Laplacian + spectral (full)": (heads, "full"),
      "spectral per_head": (0, "per_head"),
      "spectral fused": (0, "fused"),
      "spectral svd (Theorem 3.5)": (0, "svd"),
  }
  variants = {name: v for (name, v), key in zip(variants.items(), VARIANTS)
              if key in args.variants}
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
  for name, (k, s) in variants.items():  # s: spectral mode or None
    step, state, flops = build(config, k, s, image_shape, args.num_classes)
    for _ in range(3):  # compile and warm up
      state, m = step(state, batch)
    jax.block_until_ready(m)
    runs[name] = [step, state, [], flops]
  for _ in range(args.rounds):
    for name, run in runs.items():
      step, state, times, _ = run
      t0 = time.perf_counter()
      for _ in range(args.steps):
        state, m = step(state, batch)
      jax.block_until_ready(m)
      times.append((time.perf_counter() - t0) / args.steps)
      run[1] = state
  base = statistics.median(next(iter(runs.values()))[2])
  device = jax.devices()[0]
  print(f"\nconfig {path}, batch {b}, {device.platform} ({device.device_kind}), "
        f"{args.rounds} rounds x {args.steps} steps, median step time; "
        f"ratio to {next(iter(runs))}")
  if args.set:
    print("overrides: " + " ".join(args.set))
  print(f"{'variant':32s} {'ms/step':>9s} {'tokens/s':>10s} {'ratio':>7s} "
        f"{'TFLOP/s':>8s} {'MFU':>7s}")
  for name, (_, _, times, flops) in runs.items():
    t = statistics.median(times)
    tps = f"{tokens_per_step / t:10.0f}" if tokens_per_step else f"{'-':>10s}"
    mfu = f"{flops / t / 1e12 / args.peak_tflops:7.2%}" if args.peak_tflops else f"{'-':>7s}"
    print(f"{name:32s} {t * 1e3:9.2f} {tps} {t / base:7.3f} {flops / t / 1e12:8.2f} {mfu}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", action="append",
                      help="config file (repeatable); default: the ViT and GPT defaults")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--image-shape", default="28,28,1")
  parser.add_argument("--num-classes", type=int, default=10)
  parser.add_argument("--batch", type=int, default=None,
                      help="batch size (default: the config's)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key, e.g. model.dtype=bfloat16 (repeatable)")
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help="comma-separated subset of " + ",".join(VARIANTS))
  parser.add_argument("--peak-tflops", type=float, default=None,
                      help="dense peak TFLOP/s of the device, for MFU")
  args = parser.parse_args()
  args.variants = args.variants.split(",")
  unknown = sorted(set(args.variants) - set(VARIANTS))
  if unknown or not args.variants:
    parser.error(f"--variants {','.join(unknown)} unknown; use a subset of {','.join(VARIANTS)}")
  for path in args.config or ["configs/vit_fashion_mnist.py", "configs/gpt_shakespeare.py"]:
    bench(path, args)


if __name__ == "__main__":
  main()
