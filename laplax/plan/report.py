"""The plan of a config on a target: layout, data split, refusals, bound, memory.

:func:`make_plan` builds it from the config and the target alone: the task
from shapes (no data read), the train state's shapes by ``jax.eval_shape``
(nothing allocated), the validation the trainer runs, with the target's
device and process counts and platform standing for this machine's.
"""

from __future__ import annotations

import copy
import math

import jax
import ml_collections

from laplax import optim, sharding, tasks
from laplax import state as state_lib
from laplax.config import validation
from laplax.data.errors import DataError
from laplax.errors import UserError
from laplax.models import spec as spec_lib
from laplax.plan import flops as flops_lib
from laplax.plan import memory as memory_lib
from laplax.plan import roofline
from laplax.plan.targets import Target

#: Classes of the image data sets, by a part of ``data.name`` (else 10).
CLASSES = (("imagenet", 1000), ("cifar100", 100))
#: Data sets read as streams (``data.streams``): nanochat's FineWeb-Edu and
#: its mid-training mixture.
STREAMED = ("fineweb_edu", "chat_mid")


def image_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """``(H, W, C)`` of an image config: ``data.image_size`` RGB (DINO: its
  global crops'), else Fashion-MNIST's 28 x 28 x 1."""
  data = config.data
  side = data.get("image_size", None)
  if config.task == "dino" and "multicrop" in data:
    side = data.multicrop.global_size
  return (int(side), int(side), 3) if side else (28, 28, 1)


def num_classes(config: ml_collections.ConfigDict) -> int:
  """The image data set's classes (:data:`CLASSES`; else 10)."""
  name = str(config.data.name)
  return next((n for part, n in CLASSES if part in name), 10)


def refusals(config: ml_collections.ConfigDict, target: Target) -> tuple[tuple | None, list[str]]:
  """``(mesh shape, problems)``: every check ``train.py`` runs before it
  starts, for the target's devices, processes and platform: the config
  (:func:`laplax.tasks.validate`, its first problem), the mesh against the
  devices, processes, batch and model (every problem,
  :func:`laplax.config.validation.mesh_problems`), the evaluators, and a
  streamed data set's ``data.streams`` against the processes."""
  problems = []
  try:
    tasks.validate(config, None, strict_keys=True, platform=target.chip.platform)
    from laplax.evaluators import registry

    registry.validate(config)
  except UserError as e:
    problems.append(str(e).splitlines()[0])
  try:
    shape, more = validation.mesh_problems(
      config, target.num_devices, target.num_hosts, platform=target.chip.platform
    )
  except UserError as e:  # a model section the first check refused already
    shape, more = None, [] if problems else [str(e).splitlines()[0]]
  problems += more
  if config.data.name in STREAMED:
    from laplax.data.text import fineweb

    try:
      fineweb.geometry(config.data, config.batch_size, target.num_hosts)
    except DataError as e:
      problems.append(str(e).splitlines()[0])
  return shape, problems


def suggest(config: ml_collections.ConfigDict, target: Target) -> list[str] | None:
  """``--config.KEY=VALUE`` overrides under which a refused config passes
  :func:`refusals` on ``target``, or None: the first that works of fewer
  micro-batches (``optim.grad_accum_steps``: each is then bigger) and a
  ``tensor`` axis within a host (``mesh_shape=(D,1,T)``: the batch split
  over fewer devices), the config's own values first."""
  accum = int(config.optim.grad_accum_steps or 1)
  accums = [accum] + [a for a in range(accum - 1, 0, -1) if accum % a == 0]
  tensors = [t for t in range(1, target.per_host + 1) if target.per_host % t == 0]
  for a in accums:
    for t in tensors:
      keys = []
      trial = copy.deepcopy(config)
      if a != accum:
        trial.optim.grad_accum_steps = a
        keys.append(f"--config.optim.grad_accum_steps={a}")
      if t > 1:
        trial.mesh_shape = (target.num_devices // t, 1, t)
        keys.append(f'--config.mesh_shape="({target.num_devices // t},1,{t})"')
      if keys and not refusals(trial, target)[1]:
        return keys
  return None


def make_plan(config: ml_collections.ConfigDict, target: Target, spec: str = "") -> dict:
  """The plan of ``config`` (from ``spec``, the ``--config`` value) on
  ``target``, a JSON-ready dict: ``target`` (chip, devices, hosts), ``mesh``
  (``None`` when ``mesh_shape`` does not fit the devices), ``data`` (the
  split), ``refusals`` (one line each), ``suggestion`` (the overrides of
  :func:`suggest`, or ``None``), ``total_steps``, ``parameters``,
  ``flops_per_step``, ``bound`` (:mod:`laplax.plan.roofline`, seconds and
  hours) and ``memory_estimate`` (:mod:`laplax.plan.memory`, bytes) (see
  :mod:`laplax.plan`). A refused config whose task cannot be built has no
  FLOPs, bound or memory (``None``)."""
  shape, problems = refusals(config, target)
  accum = int(config.optim.grad_accum_steps or 1)
  hosts, n = target.num_hosts, target.num_devices
  plan = {
    "config": spec,
    "target": {
      "spec": target.spec,
      "chip": target.chip.name,
      "platform": target.chip.platform,
      "devices": n,
      "hosts": hosts,
      "devices_per_host": target.per_host,
    },
    "mesh": None,
    "data": _data_split(config, shape, hosts, accum),
    "refusals": problems,
    "total_steps": int(config.total_steps),
    "parameters": None,
    "flops_per_step": None,
    "bound": None,
    "memory_estimate": None,
    "suggestion": suggest(config, target) if problems else None,
  }
  if shape is not None:
    rules = sharding.rules_from_config(config)
    plan["mesh"] = {
      "shape": dict(zip(sharding.AXES, shape)),
      "batch_axes": list(sharding.mesh_axes(rules, "batch")),
    }
  if not problems:
    _analytic(plan, config, target, shape, accum)
    return plan
  try:  # the figures of a refused config, where it can be built at all
    _analytic(plan, config, target, shape or (n, 1, 1), accum)
  except Exception:  # noqa: BLE001  (the refusals say what is wrong)
    pass
  return plan


def _data_split(config, shape, hosts: int, accum: int) -> dict:
  """Global, per-host and per-device rows, micro-batches, streams."""
  batch = int(config.batch_size)
  dp = sharding.axis_size(shape, sharding.rules_from_config(config), "batch") if shape else None
  split = {
    "global_batch": batch,
    "per_host_batch": batch / hosts if batch % hosts else batch // hosts,
    "data_parallel": dp,
    "per_device_batch": (batch // dp if dp and batch % dp == 0 else (batch / dp if dp else None)),
    "micro_batches": accum,
    "per_device_micro_batch": (batch / accum / dp) if dp else None,
    "tokens_per_example": None,
    "streams": config.data.streams if config.data.name in STREAMED else None,
  }
  value = split["per_device_micro_batch"]
  if value is not None and float(value).is_integer():
    split["per_device_micro_batch"] = int(value)
  return split


def _analytic(plan: dict, config, target: Target, shape, accum: int) -> None:
  """Fills the FLOPs, the roofline bound and the memory estimate."""
  task = tasks.TASKS[config.task].from_shapes(
    config, image_shape=image_shape(config), num_classes=num_classes(config)
  )
  tx = optim.make_optimizer(config)
  state = state_lib.abstract_state(task, tx, config.seed)
  remat = spec_lib.from_config(config.model).remat != "none"
  _, step_flops = flops_lib.analytic_flops(config, task, state.params, remat)
  plan["data"]["tokens_per_example"] = int(task.tokens_per_example())
  plan["flops_per_step"] = float(step_flops)
  _, fsdp, tensor = shape
  params = memory_lib.tree_bytes(state.params)
  bound = roofline.step_bound(
    step_flops,
    target.num_devices,
    target.chip,
    param_bytes=params,
    state_bytes=memory_lib.tree_bytes(state),
    micro_batches=accum,
    fsdp=fsdp,
    tensor=tensor,
  )
  steps = int(config.total_steps)
  plan["parameters"] = int(sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
  plan["bound"] = {
    "step_s": bound.step_s,
    "flops_s": bound.flops_s,
    "bytes_s": bound.bytes_s,
    "bytes_per_chip": bound.bytes_per_chip,
    "limit": bound.limit,
    "run_hours": bound.step_s * steps / 3600,
    "run_chip_hours": bound.step_s * steps * target.num_devices / 3600,
  }
  dp = plan["data"]["data_parallel"] or target.num_devices
  rows = max(1, math.ceil(config.batch_size / accum / dp))
  est = memory_lib.estimate(config, task, state, rows=rows, fsdp=fsdp, tensor=tensor)
  plan["memory_estimate"] = {
    "state_bytes": est.state,
    "gradient_bytes": est.gradients,
    "activation_bytes": est.activations,
    "logit_bytes": est.logits,
    "total_bytes": est.total,
    "device_bytes": target.chip.memory,
    "fits": est.total <= target.chip.memory,
  }
