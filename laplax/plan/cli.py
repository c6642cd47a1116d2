"""``python -m laplax.plan``: the plan of a config on a machine (see :mod:`laplax.plan`).

python -m laplax.plan --config configs/gpt_d20.py --target v5e:4x4 [--json] [--compile]
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from laplax.cli import common as cli

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "Config file (get_config()), optionally FILE.py:arg, as train.py's.",
  flag_values=FLAGS,
  lock_config=True,
)
_TARGET = flags.DEFINE_string(
  "target",
  None,
  "The machine: v5e:AxB, v5p:AxBxC, gpu:NxH100 or gpu:HxNxH100 (H200 too).",
  flag_values=FLAGS,
)
_JSON = flags.DEFINE_bool("json", False, "Print the plan as one JSON object.", flag_values=FLAGS)
_COMPILE = flags.DEFINE_bool(
  "compile",
  False,
  "TPU targets: compile the sharded train step ahead of time for the slice "
  "(needs libtpu: pip install -r requirements-tpu.txt; minutes) and print its memory per chip.",
  flag_values=FLAGS,
)

GIB = 2.0**30


def _size(num_bytes: float) -> str:
  """``"1.50 GiB"``, or in MiB below 1 GiB."""
  return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / 2.0**20:.1f} MiB"


def _duration(seconds: float) -> str:
  """``"1.2 h"``, ``"3.40 s"``, ``"12.5 ms"`` or ``"80.1 us"``."""
  if seconds >= 3600:
    return f"{seconds / 3600:.1f} h"
  if seconds >= 1:
    return f"{seconds:.2f} s"
  if seconds >= 1e-3:
    return f"{seconds * 1e3:.1f} ms"
  return f"{seconds * 1e6:.1f} us"


def format_plan(plan: dict) -> str:
  """The plan as the lines ``python -m laplax.plan`` prints."""
  t, d = plan["target"], plan["data"]
  lines = [
    f"plan: {plan['config']} on {t['spec']}",
    f"  machine: {t['devices']} x {t['chip']} on {t['hosts']} host(s), "
    f"{t['devices_per_host']} a host; train.py runs one process a host",
  ]
  if plan["mesh"] is not None:
    m = plan["mesh"]
    shape = ", ".join(f"{k} {v}" for k, v in m["shape"].items())
    lines.append(
      f"  mesh: ({shape}); the batch is split over {'*'.join(m['batch_axes']) or 'none'}"
      f" = {d['data_parallel']}"
    )
  else:
    lines.append("  mesh: none (config.mesh_shape does not fit the devices)")
  lines.append(
    f"  data: global batch {d['global_batch']}, {d['per_host_batch']} a host, "
    f"{d['per_device_batch']} a device, in {d['micro_batches']} micro-batch(es) of "
    f"{d['per_device_micro_batch']} a device"
    + (f"; {d['tokens_per_example']} tokens an example" if d["tokens_per_example"] else "")
    + (f"; {d['streams']} streams" if d["streams"] else "")
  )
  if plan["flops_per_step"] is not None:
    b = plan["bound"]
    lines.append(
      f"  FLOPs a step (analytic): {plan['flops_per_step']:.3e}; parameters {plan['parameters']:,}"
    )
    lines.append(
      f"  step time >= {_duration(b['step_s'])} (a roofline bound, {b['limit']}-bound: "
      f"FLOPs at peak {_duration(b['flops_s'])}, HBM bytes {_size(b['bytes_per_chip'])} a chip "
      f"at peak {_duration(b['bytes_s'])})"
    )
    lines.append(
      f"  whole run ({plan['total_steps']:,} steps) >= {b['run_hours']:.3g} h, "
      f"{b['run_chip_hours']:.3g} chip-hours (bound)"
    )
    e = plan["memory_estimate"]
    lines.append(
      f"  memory a device (analytic estimate): {_size(e['total_bytes'])} of "
      f"{_size(e['device_bytes'])} (state {_size(e['state_bytes'])}, gradients "
      f"{_size(e['gradient_bytes'])}, activations {_size(e['activation_bytes'])}, logits "
      f"{_size(e['logit_bytes'])})" + ("" if e["fits"] else "; does NOT fit by this estimate")
    )
  compiled = plan.get("compiled")
  if compiled is not None:
    lines.append(f"  compiled memory a chip: {compiled}")
  lines.append(
    f"  {len(plan['refusals'])} refusal(s)"
    if plan["refusals"]
    else "  refusals: none, train.py accepts this config on this machine"
  )
  if plan.get("suggestion"):
    lines.append(
      f"  accepted on this machine with: {' '.join(plan['suggestion'])} (checked by the same "
      f"validation)"
    )
  return "\n".join(lines)


def main(guard) -> int:
  """Parses ``sys.argv``, prints the plan; 2 when the config is refused.

  Raises:
    cli.UsageError, ConfigError, TargetError: the user errors printed as one line.
  """
  del guard
  argv = sys.argv
  from laplax.plan import targets

  early = cli.flag_value(argv, "target")  # a bad machine is refused before the config loads
  if early is not None:
    targets.parse_target(early)
  cli.parse_flags(argv, FLAGS, help_module=sys.modules[__name__])
  if not _TARGET.value:
    raise cli.UsageError(f"--target is required, e.g. --target v5e:4x4 (one of {targets.EXAMPLES})")
  target = targets.parse_target(_TARGET.value)
  if not _COMPILE.value:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # shapes only: no accelerator is asked for
  config = cli.load_config_flag(flag_values=FLAGS, argv=argv)
  cli.model_from_init(config, argv)
  cli.apply_target_flops(config, argv)
  cli.quiet()
  from laplax.plan import aot, report

  spec = cli.flag_value(argv, "config") or ""
  plan = report.make_plan(config, target, spec)
  if _COMPILE.value or target.chip.platform == "tpu":
    plan["compiled"] = aot.compiled_memory(config, target, spec, _COMPILE.value, plan["refusals"])
  print(json.dumps(plan) if _JSON.value else format_plan(plan), flush=True)
  for problem in plan["refusals"]:
    print(f"error: {problem}", file=sys.stderr)
  return cli.USAGE_EXIT if plan["refusals"] else 0


def run_cli() -> None:
  """``python -m laplax.plan``: :func:`main` with its user errors as one
  stderr line and exit code 2."""
  cli.run(main, command="laplax.plan")
