"""Where a train step's time goes: a ``jax.profiler`` trace, summed by component.

    python bench/profile_step.py                      # ViT and GPT defaults
    python bench/profile_step.py --config configs/gpt_shakespeare.py --top 20
    python bench/profile_step.py --options '{"xla_cpu_prefer_vector_width": 512}'

Builds each config's train step as ``bench/step_time.py`` does (the config as
it is, float32, one synthetic batch, compiled with XLA's defaults unless
``--options`` gives a JSON dict of XLA compile options), runs ``--warmup`` steps, then traces ``--steps``
steps with ``jax.profiler`` (a Perfetto trace in a temporary directory) and
reads back the time of every executed XLA op (fusion, matmul, copy). Each
op is put in a component by the name JAX gave it when tracing (its
``op_name`` metadata in the compiled HLO):

- ``attention core``: ``Q K^T``, the mask, the softmax, ``P V`` and the
  Laplacian heads' ``V - P V`` (``dot`` for matmuls, ``other`` for the rest),
  forward and backward;
- ``attention projections``: the q, k, v (one ``qkv`` matmul) and out
  projections;
- ``mlp``: the two MLP matmuls (``dot``) and the activation and biases;
- ``norms``: LayerNorm / RMSNorm;
- ``outside the model``: ops of neither the forward nor the backward pass:
  the optimizer update (clipping, AdamW, the schedule), the metrics, the
  batch;
- ``rest``: embeddings, the head, the loss, and ops XLA made without a name
  (copies and broadcasts it inserted).

It prints ms/step and share per component, the sum of op time (the two
CPU threads can each run an op, so it can exceed the wall time), the wall
ms/step of the traced steps and, with ``--top N``, the N slowest ops. Op
time is a sum of durations, not a ratio measured against a baseline: it
shows where the time goes, and a change that removes work shows up in it,
but speed-ups are measured by ``bench/step_time.py``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from bench import common, step_time

PROJECTIONS = ("query", "key", "value", "qkv", "out")


def component(op_name: str) -> str:
  """The component of an op from its JAX ``op_name`` (see the module doc)."""
  dot = "dot" if "dot_general" in op_name else "other"
  if "/attention/" in op_name:
    if any(f"/attention/{p}/" in op_name for p in PROJECTIONS):
      return "attention projections"
    return f"attention core ({dot})"
  if "/mlp/" in op_name:
    return f"mlp ({dot})"
  if any("norm" in part for part in op_name.split("/")[:-1]):
    return "norms"
  if op_name and "jvp(" not in op_name and "transpose(" not in op_name:
    return "outside the model"
  return "rest"


def op_names(hlo_text: str) -> dict[str, str]:
  """``{instruction name: op_name}`` of the compiled HLO's instructions
  (``""`` for those without one)."""
  names = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
    if m:
      op = re.search(r'op_name="([^"]+)"', line)
      names[m.group(1)] = op.group(1) if op else ""
  return names


def profile(path: str, args) -> None:
  """Traces ``args.steps`` train steps of one config and prints the table."""
  config = common.load_config(path)
  for item in args.set:
    common.apply_override(config, item)
  image_shape = (28, 28, 1)
  options = {} if args.options is None else json.loads(args.options)
  spectral = config.model.spectral.mode if config.model.spectral.enabled else None
  step, state, _ = step_time.build(
    config, config.model.num_laplacian_heads, spectral, image_shape, 10, compiler_options=options
  )
  batch = jax.device_put(step_time.synthetic_batch(config, image_shape, 10))
  names = op_names(step.lower(state, batch).compile().as_text())
  for _ in range(args.warmup):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  with tempfile.TemporaryDirectory() as logdir:
    t0 = time.perf_counter()
    with jax.profiler.trace(logdir, create_perfetto_trace=True):
      for _ in range(args.steps):
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
    wall = (time.perf_counter() - t0) / args.steps
    trace = glob.glob(os.path.join(logdir, "**", "*perfetto_trace.json.gz"), recursive=True)[0]
    with gzip.open(trace) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_op = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in names:
      per_op[e["name"]] += e["dur"] / 1e3 / args.steps  # us -> ms per step
  per_component = collections.Counter()
  for name, ms in per_op.items():
    per_component[component(names[name])] += ms
  total = sum(per_component.values())
  print(f"\nconfig {path}: {args.steps} traced steps; XLA compile options {options}")
  print(f"{'component':28s} {'ms/step':>8s} {'share':>7s}")
  for name, ms in per_component.most_common():
    print(f"{name:28s} {ms:8.2f} {ms / total:7.1%}")
  print(f"{'sum of op time':28s} {total:8.2f}   (wall {wall * 1e3:.2f} ms/step, traced)")
  if args.top:
    print(f"\nslowest {args.top} ops (ms/step, op_name):")
    for name, ms in per_op.most_common(args.top):
      print(f"{ms:8.3f}  {name:28s} {names[name][-90:]}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config", action="append", help="config file (repeatable); default: the ViT and GPT defaults"
  )
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override, as in bench/step_time.py",
  )
  parser.add_argument("--steps", type=int, default=5, help="traced steps")
  parser.add_argument("--warmup", type=int, default=3, help="steps before the trace")
  parser.add_argument(
    "--options",
    default=None,
    metavar="JSON",
    help="XLA compile options, e.g. '{\"xla_cpu_prefer_vector_width\": 512}'",
  )
  parser.add_argument("--top", type=int, default=0, help="also list the N slowest ops")
  args = parser.parse_args()

  def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)

  if args.options is not None:
    try:
      options = json.loads(args.options)
    except ValueError:
      options = None
    if not isinstance(options, dict):
      fail(
        f"--options {args.options!r} is not a JSON object; give e.g. "
        "'{\"xla_cpu_prefer_vector_width\": 512}'"
      )
  if args.steps < 1 or args.warmup < 0:
    fail(
      f"--steps {args.steps} / --warmup {args.warmup}: trace at least 1 step "
      "after 0 or more warm-up steps"
    )
  paths = args.config or step_time.DEFAULT_CONFIGS
  for path in paths:
    if not os.path.isfile(path):
      fail(f"config {path} does not exist; give a configs/*.py file")
  for path in paths:
    profile(path, args)


if __name__ == "__main__":
  main()
