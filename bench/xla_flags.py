"""Train-step time of the default ViT and GPT under XLA CPU compiler options.

    python bench/xla_flags.py                                   # both defaults, every option set
    python bench/xla_flags.py --config configs/gpt_shakespeare.py --rounds 5 --steps 10
    python bench/xla_flags.py --only default,fast_math --json xla_flags.json

XLA reads ``XLA_FLAGS`` once, when its CPU client starts, so one process
cannot time two option sets. This benchmark starts one worker process per
option set (``--only`` picks some of :data:`OPTION_SETS`), each of which
builds the config's train step as ``bench/step_time.py`` does (the config
as it is, float32, one synthetic batch, the same initial parameters in
every worker), compiles it and takes ``--warmup`` steps. The parent then
times them round-robin: in each of ``--rounds`` rounds every worker in turn
(the first rotating) runs ``--steps`` steps while the others wait, so all
of them see the same machine. It prints the median ms/step, the speed-up
over ``default`` measured in this run (> 1: faster) and the training loss
after the last step, which tells whether an option changed the numerics
(every worker takes the same steps from the same parameters, so equal
options give bit-equal losses).

Run it on an idle machine: the ratios are only as good as the quiet.
Exits 2 with one line on a bad ``--only`` name or config path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The repository root, for ``bench.step_time`` (imported lazily: XLA reads
# XLA_FLAGS when JAX starts, so only the workers set theirs first).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # imports no JAX

# One option set a worker; ``default`` is XLA's defaults, as laplax runs it
# (in jaxlib 0.10.2 they hand YNNPACK single matmuls and the reductions).
OPTION_SETS = {
  "default": "",
  "fast_math": "--xla_cpu_enable_fast_math=true",
  "fast_math_approx": ("--xla_cpu_enable_fast_math=true --xla_cpu_fast_math_honor_functions=false"),
  "vector_width_512": "--xla_cpu_prefer_vector_width=512",
  "xnn_dot": "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
  "xnn_dot_eltwise": (
    "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE"
  ),
  "xnn_graph_greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
  "onednn": "--xla_cpu_use_onednn=true",
  "ynn_dot": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
  # YNNPACK for single matmuls only (XLA's own loops for the reductions).
  "ynn_individual_dot": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
  "ynn_off": "--xla_cpu_experimental_ynn_fusion_type=",  # no YNNPACK at all
  "ynn_dot_eltwise": (
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE"
  ),
  "ynn_dot_reduce": (
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE"
  ),
  "ynn_dot_512": (
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT "
    "--xla_cpu_prefer_vector_width=512"
  ),
  # Scheduling and fusion passes of XLA CPU (defaults: see XLA's debug_options_flags.cc).
  "concurrency_sched": "--xla_cpu_enable_concurrency_optimized_scheduler=true",
  "concurrency_sched_off": "--xla_cpu_enable_concurrency_optimized_scheduler=false",
  "ynn_dot_fast_math": (
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT --xla_cpu_enable_fast_math=true"
  ),
}


def worker(config_path: str, batch: int, warmup: int) -> None:
  """Builds and warms up the train step, then answers ``N`` lines on stdin
  with one JSON line (seconds for N steps, loss after them) on stdout."""
  import jax

  from bench import step_time

  config = common.load_config(config_path)
  if batch:
    config.batch_size = batch
  image_shape, num_classes = (28, 28, 1), 10
  step, state, _ = step_time.build(
    config, config.model.num_laplacian_heads, None, image_shape, num_classes
  )
  data = jax.device_put(step_time.synthetic_batch(config, image_shape, num_classes))
  for _ in range(warmup):
    state, m = step(state, data)
  jax.block_until_ready(m)
  print(json.dumps({"ready": True}), flush=True)
  for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
      state, m = step(state, data)
    loss = float(jax.block_until_ready(m)["loss"])
    print(json.dumps({"seconds": time.perf_counter() - t0, "loss": loss}), flush=True)


def start(name: str, config_path: str, args) -> subprocess.Popen:
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + OPTION_SETS[name]).strip()
  return subprocess.Popen(
    [
      sys.executable,
      os.path.abspath(__file__),
      "--worker",
      "--config",
      config_path,
      "--batch",
      str(args.batch),
      "--warmup",
      str(args.warmup),
    ],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
    env=env,
  )


def read(proc: subprocess.Popen, name: str) -> dict:
  line = proc.stdout.readline()
  if not line:
    raise SystemExit(
      f"error: the worker for {name} exited (code {proc.wait()}); "
      f"its option set may not be supported by this jaxlib"
    )
  return json.loads(line)


def bench(config_path: str, names: list[str], args) -> dict:
  """Times every option set on one config; prints and returns the results."""
  procs = {name: start(name, config_path, args) for name in names}
  for name, proc in procs.items():
    read(proc, name)
  times = {name: [] for name in names}
  losses = {}
  for r in range(args.rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      procs[name].stdin.write(f"{args.steps}\n")
      procs[name].stdin.flush()
      result = read(procs[name], name)
      times[name].append(result["seconds"] / args.steps)
      losses[name] = result["loss"]
  for proc in procs.values():
    proc.stdin.close()
    proc.wait()
  base = statistics.median(times[names[0]])
  print(
    f"\nconfig {config_path}{f', batch {args.batch}' if args.batch else ''}: "
    f"{args.rounds} rounds x {args.steps} steps, median ms/step; speed-up over "
    f"{names[0]} (> 1: faster); loss after {args.warmup + args.rounds * args.steps} steps"
  )
  print(f"{'option set':18s} {'ms/step':>9s} {'speed-up':>9s} {'loss':>12s}  XLA_FLAGS")
  for name in names:
    t = statistics.median(times[name])
    print(f"{name:18s} {t * 1e3:9.2f} {base / t:9.3f} {losses[name]:12.7f}  {OPTION_SETS[name]}")
  return {
    "config": config_path,
    "times": times,
    "losses": losses,
    "flags": {n: OPTION_SETS[n] for n in names},
  }


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument(
    "--config", action="append", help="config file (repeatable); default: the ViT and GPT defaults"
  )
  p.add_argument(
    "--only",
    default=",".join(OPTION_SETS),
    help=f"comma-separated subset of {','.join(OPTION_SETS)} (default: all; "
    f"the first is the reference of the speed-ups)",
  )
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3, help="steps each worker takes first (compiles)")
  p.add_argument("--batch", type=int, default=0, help="batch size (default: the config's)")
  p.add_argument("--json", metavar="FILE", help="also write every round's times as JSON")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    worker(args.config[0], args.batch, args.warmup)
    return
  names = [n for n in args.only.split(",") if n]
  bad = [n for n in names if n not in OPTION_SETS]
  if bad or not names:
    print(
      f"error: --only {args.only!r}: unknown option set {bad[0] if bad else ''!r}; "
      f"choose from {','.join(OPTION_SETS)}",
      file=sys.stderr,
    )
    sys.exit(2)
  from bench.step_time import DEFAULT_CONFIGS

  configs = args.config or list(DEFAULT_CONFIGS)
  missing = [c for c in configs if not os.path.isfile(c)]
  if missing:
    print(
      f"error: --config {missing[0]}: no such file; give a config file such as "
      f"{DEFAULT_CONFIGS[1]}",
      file=sys.stderr,
    )
    sys.exit(2)
  from bench import step_time

  for path in configs:  # refused here rather than as a worker's traceback
    config = common.load_config(path)
    if args.batch:
      config.batch_size = args.batch
    if step_time.batch_problem(config):
      print(f"error: --config {path}: {step_time.batch_problem(config)}", file=sys.stderr)
      sys.exit(2)
  results = [bench(c, names, args) for c in configs]
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {"command": " ".join(sys.argv), "load_average": os.getloadavg(), "results": results},
        f,
        indent=2,
      )


if __name__ == "__main__":
  main()
