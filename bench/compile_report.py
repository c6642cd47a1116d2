"""Ahead-of-time compilation of a config's train step for a device slice.

    python bench/compile_report.py --cpu-devices 8                 # fake CPU devices
    python bench/compile_report.py --topology v5e:16x16            # needs libtpu
    python bench/compile_report.py --topology v5e:4x4 --config configs/gpt_d20.py \
        --mesh "(1,16,1)" --set model.remat=full

Lowers and compiles the jitted, sharded train step of each ``--config``
(default: ``configs/deit3_imagenet.py`` at its batch of 2048 and
``configs/gpt_d20.py``) for the devices of a TPU slice
(``jax.experimental.topologies.get_topology_desc``; install the optional
extra with ``pip install -r requirements-tpu.txt``) or for ``--cpu-devices``
fake CPU devices, from ``jax.ShapeDtypeStruct`` inputs that carry their
shardings: nothing is allocated and no data is read. For each config it prints
the mesh, the per-device memory of the compiled program
(``compiled.memory_analysis()``: arguments, outputs, temporaries, the state
donated in place) and the FLOPs per step (``compiled.cost_analysis()``, per
device and times the number of devices) next to the analytic count

    6 x (matmul parameters) x tokens + 12 x depth x length x width x tokens

(forward and backward of every weight matmul plus the ``Q K^T`` and ``P V``
products; with ``model.remat`` another forward is added: 8 instead of 6 and
16 instead of 12). Memory and FLOPs are per step of ``batch_size`` examples.
The attention kernel the config gets on those devices is printed with them
(``model.implementation`` unset: splash on a TPU slice where the token
count allows it, see ``laplax.kernels``); a Pallas kernel is a custom call
whose FLOPs ``cost_analysis()`` may leave out.

``--json`` prints one JSON object per config instead (JSON Lines on
stdout; ``bench/aot_tables.py`` builds the docs' table from them): the keys
of :data:`JSON_KEYS`, bytes and FLOPs as numbers, ``fits`` false with the
compiler's ``error`` line when the step does not fit the devices (the memory
and FLOP keys are then ``null``).

``--fingerprint`` (with ``--topology``) lowers the train step for the
slice's TPU without compiling it and without libtpu (an abstract mesh,
``bench/program_fingerprint.py``) and prints one JSON object per config,
``{"config", "overrides", "topology", "fingerprint", "lower_s"}``: the hash
of its StableHLO without source locations, which ``bench/aot_tables.py``
compares to tell which rows of the docs' table a change recompiles.

``--segmentation-eval`` compiles a DINO config's segmentation evaluation
instead (``bench/segmentation_compile.py``; default config
``configs/dino_vits16_imagenet.py``).

Errors: an unknown topology name or a missing libtpu, and meshes that do not
fit the devices or the batch, print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import program_fingerprint
from bench.common import analytic_flops, apply_override, fail, load_config, size

DEFAULT_CONFIGS = ("configs/deit3_imagenet.py", "configs/gpt_d20.py")
# The keys of each ``--json`` record (bytes are per device; FLOPs per step).
JSON_KEYS = (
  "config",
  "overrides",
  "platform",
  "device_kind",
  "num_devices",
  "topology",
  "mesh",
  "batch_size",
  "dtype",
  "remat",
  "grad_accum_steps",
  "loss_chunk",
  "attention_kernel",
  "parameters",
  "fits",
  "error",
  "argument_bytes",
  "output_bytes",
  "alias_bytes",
  "temp_bytes",
  "peak_bytes",
  "flops_per_device",
  "flops_total",
  "analytic_flops",
  "while_loops",
  "lower_s",
  "compile_s",
  "jax_version",
  "libtpu_version",
)


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  where = p.add_mutually_exclusive_group()
  where.add_argument(
    "--topology", help="TPU slice, e.g. v5e:4x4, v5e:16x16, v4:2x2x2 (needs libtpu)"
  )
  where.add_argument(
    "--cpu-devices",
    type=int,
    default=None,
    help="number of fake CPU devices (default 8 when no --topology)",
  )
  p.add_argument(
    "--config",
    action="append",
    help="config file[:args] (repeatable; default: deit3_imagenet and gpt_d20)",
  )
  p.add_argument(
    "--mesh",
    default=None,
    help="mesh_shape over (data, fsdp, tensor), e.g. '(1,16,1)'; default: all FSDP",
  )
  p.add_argument(
    "--batch", type=int, default=None, help="global batch size (default: the config's)"
  )
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override, e.g. model.remat=full (repeatable)",
  )
  p.add_argument(
    "--fingerprint",
    action="store_true",
    help="with --topology: print the fingerprint of the step lowered for that TPU "
    "(no compile, no libtpu; bench/program_fingerprint.py)",
  )
  p.add_argument(
    "--segmentation-eval",
    action="store_true",
    help="compile a DINO config's segmentation evaluation (eval.py's linear "
    "probe; bench/segmentation_compile.py) instead of its train step",
  )
  p.add_argument(
    "--xla-keeps-p",
    action="store_true",
    help="laplax's XLA attention kernel keeps the float32 P for the backward "
    "pass on any platform (as on a CPU), to measure what that costs "
    "(the same as --set model.xla_keep_probs=True)",
  )
  p.add_argument(
    "--json",
    action="store_true",
    help="one JSON object per config on stdout (the keys of JSON_KEYS) instead of the text",
  )
  return p.parse_args(argv)


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


IMAGENET_CLASSES = 1000


def make_task(config):
  """The config's task built from shapes alone (no dataset is opened):
  :func:`laplax.plan.aot.task_from_shapes` (images of ``data.image_size``, RGB,
  else 28 x 28 x 1; DINO its global crops'; ImageNet's 1000 classes,
  CIFAR-100's 100, else 10; sequence tasks their lengths)."""
  from laplax import tasks
  from laplax.plan import aot

  if tasks.task_class(config) is None:
    fail(f"task {config.task!r} is unknown; use one of {', '.join(tasks.task_names())}")
  return aot.task_from_shapes(config)


def report(spec: str, devices, args) -> None:
  """Compiles ``spec``'s train step for ``devices`` and prints the figures."""
  import jax

  from laplax import sharding, tasks
  from laplax.config import validation as config_lib
  from laplax.plan import aot

  config = load_config(spec)
  if args.xla_keeps_p:
    config.model.xla_keep_probs = True
  for item in args.set:
    apply_override(config, item)
  if args.batch:
    config.batch_size = args.batch
  try:
    mesh_arg = args.mesh or "(1,-1,1)"
    try:
      config.mesh_shape = sharding.parse_mesh_shape(mesh_arg)
    except ValueError:
      fail(
        f"--mesh {mesh_arg!r} must be 3 integers (data, fsdp, tensor), each >= 1 "
        f"except at most one -1 for the remaining devices, e.g. '(2,4,1)'"
      )
    tasks.validate(config, len(devices))
  except (config_lib.ConfigError, ValueError) as e:
    fail(str(e).splitlines()[0])
  t0 = time.time()
  lowered, info = aot.lower_train_step(config, devices, make_task(config))
  mesh, task, state, kernel = info["mesh"], info["task"], info["state"], info["kernel"]
  t1 = time.time()
  if args.fingerprint:
    overrides = list(args.set) + ([f"batch_size={args.batch}"] if args.batch else [])
    found = dict(config=spec, overrides=overrides, topology=args.topology)
    found.update(fingerprint=program_fingerprint.fingerprint(lowered), lower_s=round(t1 - t0, 1))
    print(json.dumps(found), flush=True)
    return
  n = len(devices)
  record = dict.fromkeys(JSON_KEYS)
  record.update(
    config=spec,
    overrides=list(args.set) + ([f"batch_size={args.batch}"] if args.batch else []),
    platform=devices[0].platform,
    device_kind=devices[0].device_kind,
    num_devices=n,
    topology=args.topology,
    mesh=list(mesh.shape.values()),
    batch_size=int(config.batch_size),
    dtype=str(config.model.dtype),
    remat=str(config.model.get("remat", "none")),
    grad_accum_steps=int(config.optim.get("grad_accum_steps", 1)),
    loss_chunk=config.model.get("loss_chunk", None),
    attention_kernel=str(kernel),
    parameters=int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
    lower_s=round(t1 - t0, 1),
    jax_version=jax.__version__,
    libtpu_version=_version("libtpu"),
  )
  remat = config.model.get("remat", "none") not in (None, "none")
  # before the compile, so that a config the formula cannot count fails in seconds
  num_matmul, analytic = analytic_flops(config, task, state.params, remat)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    record.update(
      fits=False, error=str(e).splitlines()[0][:300], compile_s=round(time.time() - t1, 1)
    )
    if args.json:
      print(json.dumps(record), flush=True)
      return
    print(
      f"\n== {spec}  ({devices[0].device_kind} x {n}, mesh (data, fsdp, "
      f"tensor) = {tuple(mesh.shape.values())}, batch {config.batch_size}, remat "
      f"{config.model.get('remat', 'none')}, grad_accum_steps "
      f"{config.optim.get('grad_accum_steps', 1)}, attention {kernel})\n   does not fit: "
      f"{record['error']}"
    )
    return
  t2 = time.time()

  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops_device = float(cost.get("flops", float("nan")))
  num_params = record["parameters"]
  peak = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )
  loops = len(re.findall(r"\swhile\(", compiled.as_text() or ""))
  record.update(
    fits=True,
    argument_bytes=int(mem.argument_size_in_bytes),
    output_bytes=int(mem.output_size_in_bytes),
    alias_bytes=int(mem.alias_size_in_bytes),
    temp_bytes=int(mem.temp_size_in_bytes),
    peak_bytes=int(peak),
    flops_per_device=flops_device,
    flops_total=flops_device * n,
    analytic_flops=float(analytic),
    while_loops=loops,
    compile_s=round(t2 - t1, 1),
  )
  if args.json:
    print(json.dumps(record), flush=True)
    return
  print(
    f"\n== {spec}  ({devices[0].device_kind} x {n}, mesh (data, fsdp, tensor) = "
    f"{tuple(mesh.shape.values())})"
  )
  print(
    f"   parameters {num_params:,} ({num_matmul / 1e6:.1f}M in matmuls); "
    f"batch {config.batch_size}; dtype {config.model.dtype}; remat "
    f"{config.model.get('remat', 'none')}; scan_layers {config.model.get('scan_layers', False)}; "
    f"grad_accum_steps {config.optim.get('grad_accum_steps', 1)}; loss_chunk "
    f"{config.model.get('loss_chunk', None)}; attention kernel {kernel}"
  )
  print(f"   lower {t1 - t0:.1f} s, compile {t2 - t1:.1f} s")
  print(
    f"   per-device memory: arguments {size(mem.argument_size_in_bytes)}, "
    f"outputs {size(mem.output_size_in_bytes)} (donated in place "
    f"{size(mem.alias_size_in_bytes)}), temporaries "
    f"{size(mem.temp_size_in_bytes)} -> peak about {size(peak)}"
  )
  print(
    f"   FLOPs per step: {flops_device:.3e} per device, {flops_device * n:.3e} in all; "
    f"analytic {analytic:.3e}; ratio compiled/analytic {flops_device * n / analytic:.3f}"
  )
  if loops:
    print(
      f"   the compiled program has {loops} while loop(s); cost_analysis() counts "
      f"a loop body once, so the compiled FLOPs may undercount"
    )


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.topology is None:
    count = 8 if args.cpu_devices is None else args.cpu_devices
    if count < 1:
      fail(f"--cpu-devices={count} must be >= 1")
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.fingerprint:
    os.environ["JAX_PLATFORMS"] = "cpu"  # lowered for --topology's TPU without its backend
  import jax

  if args.fingerprint:
    if args.topology is None or args.segmentation_eval:
      fail("--fingerprint lowers a train step for a TPU slice: give --topology, e.g. v5e:4x4")
    try:
      devices = program_fingerprint.abstract_tpu_devices(args.topology)
    except ValueError as e:
      fail(str(e))
  elif args.topology is not None:
    try:
      import libtpu  # noqa: F401  (only whether it imports)
    except ImportError:
      fail("--topology needs libtpu: pip install -r requirements-tpu.txt (or use --cpu-devices N)")
    from jax.experimental import topologies

    try:
      devices = list(
        topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices
      )
    except Exception as e:
      fail(
        f"--topology {args.topology!r} is not a TPU slice libtpu knows "
        f"({str(e).splitlines()[0][:120]}); use e.g. v5e:4x4, v5e:16x16, v4:2x2x2"
      )
  else:
    devices = jax.devices()
  if args.segmentation_eval:
    if args.json:
      fail("--json reports train steps; drop it with --segmentation-eval")
    from bench import segmentation_compile

    for spec in args.config or ["configs/dino_vits16_imagenet.py"]:
      segmentation_compile.report(spec, devices, args)
    return
  for spec in args.config or DEFAULT_CONFIGS:
    report(spec, devices, args)


if __name__ == "__main__":
  main()
