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
``--rounds`` rounds of ``--steps`` steps on one synthetic batch (the first
variant rotating each round), and prints the
median step time (and tokens/s for language models) of each and its ratio to
the baseline measured in this same run. Target: overhead <= 2%.

``--set KEY=VALUE`` overrides config keys (as ``bench/compile_report.py``),
``--batch`` the batch size, ``--variants`` picks some of ``baseline``,
``all``, ``half``, ``spectral``, ``both``, ``per_head``, ``fused``, ``svd``. Each row also gives the model
TFLOP/s: the analytic train FLOPs per step of ``common.analytic_flops``
(6 x matmul parameters x tokens + 12 x depth x length x width x tokens, 8 and
16 with ``model.remat``) over the step time; with ``--peak-tflops`` (the
accelerator's dense peak, e.g. 989 for bf16 on an H100/H200 SXM) also the
model FLOPs utilisation (MFU) = model TFLOP/s / peak.

``--peer`` compares laplax with the same model in PyTorch instead
(``bench/peer_torch.py``; needs ``requirements-bench.txt``)::

    python bench/step_time.py --peer                       # both defaults
    python bench/step_time.py --peer --rounds 2 --steps 3 --json peer.json

For each config (as it is: its own Laplacian heads, batch, float32) it builds
the laplax train step, the PyTorch peer in eager mode and under
``torch.compile`` (the model's forward and backward; the fused AdamW step
and the clipping run eagerly), all from the same initial parameters and with
the same learning-rate schedule, then times them round-robin (the starting
candidate rotates each round) over ``--rounds`` rounds of ``--steps`` steps
after ``--warmup`` steps each, with a float32 ``jnp.dot`` of two
``--peak-size`` square matrices (and a ``torch.mm`` of the same, for
reference) timed in every round. PyTorch gets as many threads as the CPUs
this process may use, which is what XLA's CPU client sizes its pool by. It
prints the median ms/step, tokens/s (images/s for a ViT), the ratio
laplax/peer of throughputs (> 1: laplax is faster), the model GFLOP/s and the
MFU: the analytic train FLOPs of ``common.analytic_flops`` (6 x
matmul parameters x tokens + 12 x depth x length x width x tokens: forward
plus backward = 3 x the forward matmul FLOPs, attention's ``Q K^T`` and ``P
V`` included, causal attention counted in full) over the step time, divided
by the median measured ``jnp.dot`` FLOP/s. The last step's loss of each
candidate is printed too: after the same steps from the same weights they
should agree to a few decimals, a check that the three train the same model.
``--json FILE`` also writes the results, the machine (CPU model, cores,
load average before and after, versions) and the command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from bench.common import analytic_flops, apply_override, fail, load_config, make_task
from laplax import (
  optim,
  tasks,
)
from laplax import state as state_lib
from laplax.train import loop


def build(
  config,
  laplacian: int,
  spectral: str | None,
  image_shape,
  num_classes,
  compiler_options: dict | None = None,
):
  """(jitted train step, state, analytic train FLOPs per step) of a variant;
  ``spectral`` is a ``model.spectral.mode`` or ``None`` (off);
  ``compiler_options``: XLA compile options of the step (default XLA's)."""
  c = config.copy_and_resolve_references()
  # The speed of the whole batch's step, by steps (no batch-size ramp, no
  # wall-time budget: the step then takes no controls).
  c.optim.batch_size_ramp, c.optim.budget_hours = 0.0, None
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral is not None
  if spectral is not None:
    c.model.spectral.mode = spectral
  task = make_task(c, image_shape, num_classes)
  tx = optim.make_optimizer(c)
  step = jax.jit(
    loop.make_train_step(task, tx, optim.learning_rate_schedule(c.optim, c.total_steps)),
    donate_argnums=0,
    compiler_options=compiler_options,
  )
  state = jax.jit(lambda: state_lib.init_state(task, tx, c.seed))()
  remat = c.model.get("remat", "none") not in (None, "none", False)
  _, flops = analytic_flops(c, task, state.params, remat)
  return step, state, flops


def stepper(step, state, batch):
  """A function that runs one more ``step(state, batch)`` on the kept state and
  returns its metrics (a jitted train step as a round-robin candidate)."""
  kept = [state]

  def run():
    kept[0], metrics = step(kept[0], batch)
    return metrics

  return run


def round_robin(candidates: dict, rounds: int, steps: int, after_round=None):
  """Times ``candidates`` (``{name: function running one step}``) in turns:
  ``rounds`` rounds of ``steps`` calls each, the first candidate rotating
  each round, ``after_round()`` (if given) after every round.

  Returns:
    ``({name: [seconds per step, one per round]}, {name: last call's output})``.
  """
  times, last = {name: [] for name in candidates}, {}
  names = list(candidates)
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      t0 = time.perf_counter()
      for _ in range(steps):
        last[name] = candidates[name]()
      jax.block_until_ready(last[name])
      times[name].append((time.perf_counter() - t0) / steps)
    if after_round is not None:
      after_round()
  return times, last


def batch_problem(config) -> str | None:
  """One line saying why ``config.batch_size`` cannot be cut into its
  ``optim.grad_accum_steps`` micro-batches, with the fix; None if it can."""
  accum = config.optim.get("grad_accum_steps", 1) or 1
  if config.batch_size < 1 or config.batch_size % accum:
    return (
      f"batch size {config.batch_size} is not a positive multiple of the config's "
      f"optim.grad_accum_steps={accum}; pass --batch with a multiple of {accum}, or "
      f"--set optim.grad_accum_steps=1"
    )
  return None


DEFAULT_CONFIGS = ("configs/vit_fashion_mnist.py", "configs/gpt_shakespeare.py")
VARIANTS = ("baseline", "all", "half", "spectral", "both", "per_head", "fused", "svd")


def bench(path: str, args) -> None:
  """Times the variants of one config and prints the table."""
  config = load_config(path)
  for item in args.set:
    apply_override(config, item)
  if args.batch:
    config.batch_size = args.batch
  if batch_problem(config):
    fail(batch_problem(config))
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
  variants = {name: v for (name, v), key in zip(variants.items(), VARIANTS) if key in args.variants}
  rng = np.random.default_rng(0)
  b = config.batch_size
  if tasks.is_language_model(config):
    length = config.model.max_length
    batch = {"tokens": rng.integers(0, 256, (b, length + 1)).astype(np.int32)}
    tokens_per_step = b * length
  else:
    batch = {
      "image": rng.standard_normal((b,) + image_shape, np.float32),
      "label": rng.integers(0, args.num_classes, b).astype(np.int32),
    }
    tokens_per_step = None
  batch = jax.device_put(batch)
  candidates, flops = {}, {}
  for name, (k, s) in variants.items():  # s: spectral mode or None
    step, state, flops[name] = build(config, k, s, image_shape, args.num_classes)
    for _ in range(3):  # compile and warm up
      state, m = step(state, batch)
    jax.block_until_ready(m)
    candidates[name] = stepper(step, state, batch)
  times, _ = round_robin(candidates, args.rounds, args.steps)
  base = statistics.median(next(iter(times.values())))
  device = jax.devices()[0]
  print(
    f"\nconfig {path}, batch {b}, {device.platform} ({device.device_kind}), "
    f"{args.rounds} rounds x {args.steps} steps, median step time; "
    f"ratio to {next(iter(times))}"
  )
  if args.set:
    print("overrides: " + " ".join(args.set))
  print(
    f"{'variant':32s} {'ms/step':>9s} {'tokens/s':>10s} {'ratio':>7s} {'TFLOP/s':>8s} {'MFU':>7s}"
  )
  for name, ts in times.items():
    t, f = statistics.median(ts), flops[name]
    tps = f"{tokens_per_step / t:10.0f}" if tokens_per_step else f"{'-':>10s}"
    mfu = f"{f / t / 1e12 / args.peak_tflops:7.2%}" if args.peak_tflops else f"{'-':>7s}"
    print(f"{name:32s} {t * 1e3:9.2f} {tps} {t / base:7.3f} {f / t / 1e12:8.2f} {mfu}")


def synthetic_batch(config, image_shape, num_classes, seed: int = 0) -> dict:
  """One random training batch of ``config`` (NumPy): ``tokens`` or ``image``/``label``."""
  rng = np.random.default_rng(seed)
  b = config.batch_size
  if tasks.is_language_model(config):
    return {"tokens": rng.integers(0, 256, (b, config.model.max_length + 1)).astype(np.int32)}
  return {
    "image": rng.standard_normal((b,) + image_shape, np.float32),
    "label": rng.integers(0, num_classes, b).astype(np.int32),
  }


def machine() -> dict:
  """What the numbers were measured on: CPU, cores, load, versions."""
  import platform

  import torch

  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(
        (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
      )
  except OSError:
    pass
  device = jax.devices()[0]
  return {
    "cpu": cpu,
    "cpu_count": os.cpu_count(),
    "usable_cpus": len(os.sched_getaffinity(0)),
    "load_average": list(os.getloadavg()),
    "platform": platform.platform(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jax_device": f"{device.platform} ({device.device_kind})",
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
  }


class MatmulPeak:
  """FLOP/s of a float32 ``[n, n] @ [n, n]`` in JAX (``jnp.dot``) and in torch."""

  def __init__(self, n: int, reps: int = 3):
    import torch

    self.n, self.reps, self.torch = n, reps, torch
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
    self.dot = jax.jit(jax.numpy.dot)
    self.a, self.b = jax.device_put(a), jax.device_put(b)
    self.ta, self.tb = torch.from_numpy(a), torch.from_numpy(b)
    self.times = {"jnp.dot": [], "torch.mm": []}
    self.run()  # compile and warm up
    self.times = {"jnp.dot": [], "torch.mm": []}

  def run(self) -> None:
    """Times ``reps`` products of each kind once (appends the FLOP/s)."""
    flops = 2.0 * self.n**3 * self.reps
    t0 = time.perf_counter()
    for _ in range(self.reps):
      out = self.dot(self.a, self.b)
    jax.block_until_ready(out)
    self.times["jnp.dot"].append(flops / (time.perf_counter() - t0))
    t0 = time.perf_counter()
    for _ in range(self.reps):
      self.torch.mm(self.ta, self.tb)
    self.times["torch.mm"].append(flops / (time.perf_counter() - t0))


def build_peers(config, params, batch, modes, schedule, grad_accum_steps: int = 1):
  """``{name: [step function, model]}`` of the PyTorch peers in ``modes``
  (``eager``, ``compile``), each from laplax's initial ``params``, each
  step accumulating over ``grad_accum_steps`` micro-batches."""
  import torch

  from bench import peer_torch

  args = peer_torch.torch_batch(batch)
  peers = {}
  for mode in modes:
    model = peer_torch.from_config(
      config, image_shape=batch["image"].shape[1:] if "image" in batch else (28, 28, 1)
    )
    peer_torch.load_laplax_params(model, params)
    opt = peer_torch.make_optimizer(model, config)
    loss_fn = torch.compile(model) if mode == "compile" else model
    count = [0]

    def step(model=model, opt=opt, loss_fn=loss_fn, count=count):
      for group in opt.param_groups:  # laplax's schedule, precomputed
        group["lr"] = float(schedule[min(count[0], len(schedule) - 1)])
      count[0] += 1
      return peer_torch.train_step(
        loss_fn, model, opt, config.optim.grad_clip, args, grad_accum_steps
      )

    peers["PyTorch eager" if mode == "eager" else "torch.compile"] = [step, model]
  return peers


def bench_peer(path: str, args) -> dict:
  """Times laplax against the PyTorch peers on one config; prints and returns the results."""
  import torch

  from bench import peer_torch

  config = load_config(path)
  for item in args.set:
    apply_override(config, item)
  if args.batch:
    config.batch_size = args.batch
  peer_torch.check_supported(config)
  if config.batch_size % args.peer_grad_accum:
    raise ValueError(
      f"--peer-grad-accum {args.peer_grad_accum} does not divide the batch "
      f"size {config.batch_size}; choose a divisor"
    )
  image_shape = tuple(int(s) for s in args.image_shape.split(","))
  batch_np = synthetic_batch(config, image_shape, args.num_classes)
  k = config.model.num_laplacian_heads
  step, state, flops = build(config, k, None, image_shape, args.num_classes)
  params = jax.device_get(state.params)
  total = args.warmup + args.rounds * args.steps
  schedule = np.asarray(
    jax.vmap(optim.learning_rate_schedule(config.optim, config.total_steps))(np.arange(total))
  )
  peers = build_peers(config, params, batch_np, args.peer_modes, schedule, args.peer_grad_accum)
  batch = jax.device_put(batch_np)
  laplax_step = stepper(step, state, batch)
  candidates = {
    "laplax (JAX)": lambda: laplax_step()["loss"],
    **{n: p[0] for n, p in peers.items()},
  }
  for fn in candidates.values():  # compile and warm up
    for _ in range(args.warmup):
      out = fn()
    jax.block_until_ready(out)
  peak = MatmulPeak(args.peak_size)
  times, losses = round_robin(candidates, args.rounds, args.steps, after_round=peak.run)
  return report_peer(path, config, flops, times, losses, peak, torch.get_num_threads(), args)


def report_peer(path, config, flops, times, losses, peak, threads, args) -> dict:
  """Prints the table of :func:`bench_peer` and returns its JSON record."""
  lm = tasks.is_language_model(config)
  b = config.batch_size
  per_step = b * config.model.max_length if lm else b
  unit = "tokens/s" if lm else "images/s"
  peak_flops = statistics.median(peak.times["jnp.dot"])
  torch_peak = statistics.median(peak.times["torch.mm"])
  heads = config.model.num_heads
  print(
    f"\nconfig {path}: {'GPT' if lm else 'ViT'}, batch {b}"
    + (f" x {config.model.max_length} tokens" if lm else "")
    + f", {config.model.num_laplacian_heads} of {heads} heads Laplacian, float32; "
    f"{args.rounds} rounds x {args.steps} steps after {args.warmup} warm-up steps, "
    f"medians; threads: XLA {len(os.sched_getaffinity(0))} (the usable CPUs), "
    f"torch {threads}"
  )
  accum = config.optim.get("grad_accum_steps", 1) or 1
  print(
    f"gradient over micro-batches: laplax {accum}"
    + (" (unrolled)" if accum > 1 and config.optim.get("grad_accum_unroll") else "")
    + f" (optim.grad_accum_steps), PyTorch {args.peer_grad_accum} (--peer-grad-accum)"
  )
  if args.set:
    print("overrides: " + " ".join(args.set))
  print(
    f"float32 matmul peak ({args.peak_size}x{args.peak_size}, median of rounds): "
    f"jnp.dot {peak_flops / 1e9:.1f} GFLOP/s (the MFU's denominator), "
    f"torch.mm {torch_peak / 1e9:.1f} GFLOP/s"
  )
  print(
    f"model FLOPs per train step (3 x forward matmuls, attention included): {flops / 1e9:.3f} GFLOP"
  )
  print(
    f"{'candidate':16s} {'ms/step':>9s} {unit:>10s} {'laplax/peer':>12s} "
    f"{'GFLOP/s':>8s} {'MFU':>7s} {'last loss':>10s}"
  )
  base = statistics.median(times["laplax (JAX)"])
  rows = {}
  for name, ts in times.items():
    t = statistics.median(ts)
    ratio = base and t / base
    loss = float(losses[name])
    rows[name] = {
      "ms_per_step": t * 1e3,
      unit.replace("/", "_per_"): per_step / t,
      "laplax_over_peer": None if name.startswith("laplax") else ratio,
      "gflops_per_s": flops / t / 1e9,
      "mfu": flops / t / peak_flops,
      "last_loss": loss,
      "ms_per_step_rounds": [x * 1e3 for x in ts],
    }
    shown = f"{'-':>12s}" if name.startswith("laplax") else f"{ratio:12.3f}"
    print(
      f"{name:16s} {t * 1e3:9.2f} {per_step / t:10.0f} {shown} "
      f"{flops / t / 1e9:8.2f} {flops / t / peak_flops:7.1%} {loss:10.5f}"
    )
  return {
    "config": path,
    "overrides": list(args.set),
    "model": "gpt" if lm else "vit",
    "batch_size": b,
    "unit": unit,
    "items_per_step": per_step,
    "num_laplacian_heads": config.model.num_laplacian_heads,
    "num_heads": heads,
    "flops_per_step": flops,
    "rounds": args.rounds,
    "steps": args.steps,
    "warmup": args.warmup,
    "torch_threads": threads,
    "grad_accum_steps": {
      "laplax": config.optim.get("grad_accum_steps", 1) or 1,
      "laplax_unrolled": bool(config.optim.get("grad_accum_unroll")),
      "peer": args.peer_grad_accum,
    },
    "matmul_peak_flops": {
      "size": args.peak_size,
      "jnp.dot_median": peak_flops,
      "jnp.dot_max": max(peak.times["jnp.dot"]),
      "torch.mm_median": torch_peak,
    },
    "candidates": rows,
  }


def run_peer(args) -> None:
  """``--peer``: every config against PyTorch; ``--json`` written at the end."""
  import datetime
  import json

  try:
    import torch
  except ImportError:
    fail("--peer needs PyTorch: pip install -r requirements-bench.txt")
  if args.json:
    folder = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
      fail(f"--json {args.json}: {folder} is not a writable directory; choose another file")
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  before = machine()
  results = []
  for path in args.config or DEFAULT_CONFIGS:
    try:
      results.append(bench_peer(path, args))
    except ValueError as e:
      fail(str(e).splitlines()[0])
  if args.json:
    record = {
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
      "machine": dict(before, load_average_after=list(os.getloadavg())),
      "results": results,
    }
    with open(args.json, "w") as f:
      json.dump(record, f, indent=1)
    print(f"wrote {args.json}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config", action="append", help="config file (repeatable); default: the ViT and GPT defaults"
  )
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--image-shape", default="28,28,1")
  parser.add_argument("--num-classes", type=int, default=10)
  parser.add_argument("--batch", type=int, default=None, help="batch size (default: the config's)")
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config key, e.g. model.dtype=bfloat16 (repeatable)",
  )
  parser.add_argument(
    "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
  )
  parser.add_argument(
    "--peak-tflops", type=float, default=None, help="dense peak TFLOP/s of the device, for MFU"
  )
  parser.add_argument(
    "--peer",
    action="store_true",
    help="time laplax against the same model in PyTorch, eager and "
    "torch.compile (needs requirements-bench.txt); --variants is unused",
  )
  parser.add_argument(
    "--peer-modes",
    default="eager,compile",
    help="with --peer: comma-separated subset of eager,compile",
  )
  parser.add_argument(
    "--peer-grad-accum",
    type=int,
    default=1,
    metavar="N",
    help="with --peer: micro-batches of the PyTorch step (default 1, "
    "the whole batch; laplax uses the config's optim.grad_accum_steps)",
  )
  parser.add_argument(
    "--warmup", type=int, default=3, help="with --peer: warm-up steps of each candidate (compiles)"
  )
  parser.add_argument(
    "--peak-size",
    type=int,
    default=2048,
    help="with --peer: side of the square float32 matmul timed for the peak",
  )
  parser.add_argument(
    "--json",
    default=None,
    metavar="FILE",
    help="with --peer: also write the results and the machine as JSON",
  )
  args = parser.parse_args()
  if args.peer:
    args.peer_modes = args.peer_modes.split(",")
    if not args.peer_modes or set(args.peer_modes) - {"eager", "compile"}:
      fail(f"--peer-modes {','.join(args.peer_modes)}: use a subset of eager,compile")
    if min(args.rounds, args.steps, args.warmup, args.peak_size, args.peer_grad_accum) < 1:
      fail("--rounds, --steps, --warmup, --peak-size and --peer-grad-accum must be >= 1")
    run_peer(args)
    return
  if args.json:
    fail("--json needs --peer")
  args.variants = args.variants.split(",")
  unknown = sorted(set(args.variants) - set(VARIANTS))
  if unknown or not args.variants:
    parser.error(f"--variants {','.join(unknown)} unknown; use a subset of {','.join(VARIANTS)}")
  for path in args.config or DEFAULT_CONFIGS:
    bench(path, args)


if __name__ == "__main__":
  main()
