"""Ahead-of-time lowering of a config's sharded train step for a device slice.

    lowered, info = lower_train_step(config, devices)   # abstract inputs: nothing allocated
    compiled = lowered.compile()                        # compiled.memory_analysis()

The devices may be fake CPU devices or a TPU slice's from
``jax.experimental.topologies.get_topology_desc`` (libtpu installed: ``pip
install -r requirements-tpu.txt``, ``jax[tpu]``: the same ``jaxlib`` as the
CPU install plus the ``libtpu`` plugin, so both live in one environment; with
libtpu there JAX starts its TPU backend first unless ``JAX_PLATFORMS=cpu``).
``bench/compile_report.py`` reports with it and ``python -m laplax.plan
--compile`` prints the compiled memory per chip of a TPU target.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shlex

#: The install line of the optional TPU compiler (requirements-tpu.txt).
INSTALL = "pip install -r requirements-tpu.txt"


def task_from_shapes(config):
  """``config``'s task built from shapes alone, no dataset opened: images of
  :func:`laplax.plan.report.image_shape`, classes of
  :func:`laplax.plan.report.num_classes` (DINO: its global crops)."""
  from laplax import tasks
  from laplax.plan import report

  return tasks.TASKS[config.task].from_shapes(
    config, image_shape=report.image_shape(config), num_classes=report.num_classes(config)
  )


def abstract_mesh(mesh_shape, devices):
  """A ``jax.sharding.AbstractMesh`` of ``mesh_shape`` over abstract ``devices``
  (``bench/program_fingerprint.py``'s ``abstract_tpu_devices``), the axes of
  :func:`laplax.sharding.make_mesh`.

  Raises:
    ValueError: a shape that does not fit the devices.
  """
  import jax

  from laplax import sharding

  shape = sharding.resolve_mesh_shape(mesh_shape, len(devices))
  return jax.sharding.AbstractMesh(
    tuple(shape),
    sharding.AXES,
    axis_types=(jax.sharding.AxisType.Auto,) * len(sharding.AXES),
    abstract_device=devices[0],
  )


@contextlib.contextmanager
def abstract_mesh_context(mesh, rules):
  """:func:`laplax.sharding.context` for an abstract mesh (``jax.set_mesh``
  takes concrete meshes only)."""
  import flax.linen as nn
  import jax

  with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
    yield


def lower_train_step(config, devices, task=None):
  """Lowers the jitted, sharded train step of ``config`` for ``devices`` from
  ``jax.ShapeDtypeStruct`` inputs carrying their shardings (``config.mesh_shape``
  resolved over the devices, the config's sharding rules).

  ``devices`` may be concrete (fake CPU devices, a TPU topology's) or
  ``jax.sharding.AbstractDevice`` s of a TPU: then the step is lowered for
  ``"tpu"`` over an abstract mesh, without a TPU backend (no compile possible;
  what ``bench/program_fingerprint.py`` hashes).

  Returns:
    ``(lowered, info)``: the ``jax.stages.Lowered`` step and a dict with
    ``mesh`` (``jax.sharding.Mesh`` or ``AbstractMesh``), ``task``, ``state``
    (the abstract TrainState), ``kernel`` (the attention kernel's name on those
    devices).
  """
  import jax

  from laplax import optim, sharding
  from laplax import state as state_lib
  from laplax.config import validation
  from laplax.train import budget, loop

  abstract = isinstance(devices[0], jax.sharding.AbstractDevice)
  rules = sharding.rules_from_config(config)
  if abstract:
    mesh = abstract_mesh(config.mesh_shape, devices)
    context = abstract_mesh_context(mesh, rules)
  else:
    mesh = sharding.make_mesh(config.mesh_shape, devices)
    context = sharding.context(mesh, rules)
  task = task_from_shapes(config) if task is None else task
  tx = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(config.optim, config.total_steps)
  with context:
    kernel = validation.attention_kernel(config, task)  # on the slice's platform
    state_sharding = state_lib.abstract_and_shardings(task, tx, config.seed, mesh, rules)[1]
    state = state_lib.sharded_abstract_state(task, tx, config.seed, state_sharding)
    batch_sharding = loop.batch_shardings(task, mesh, rules)
    batch = {
      k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k])
      for k, v in task.batch_spec(config.batch_size).items()
    }
    step = loop.jit_train_step(task, tx, schedule, state_sharding, batch_sharding)
    traced = step.trace(state, batch, *budget.controls_spec(config))
    lowered = traced.lower(lowering_platforms=("tpu",) if abstract else None)
  return lowered, {"mesh": mesh, "task": task, "state": state, "kernel": kernel}


def peak_bytes(memory) -> int:
  """A compiled step's peak bytes per device from ``compiled.memory_analysis()``:
  arguments + outputs - donated in place + temporaries."""
  return int(
    memory.argument_size_in_bytes
    + memory.output_size_in_bytes
    - memory.alias_size_in_bytes
    + memory.temp_size_in_bytes
  )


def tpu_topology(target) -> str | None:
  """libtpu's topology name of a TPU target (``v5e:4x4``), else None."""
  if target.chip.platform != "tpu":
    return None
  return target.spec.strip().lower()


def libtpu_available() -> bool:
  """Whether ``libtpu`` can be imported (without importing it)."""
  return importlib.util.find_spec("libtpu") is not None


def compile_command(spec: str, target, argv_overrides=()) -> str:
  """The one command that compiles ``spec`` for ``target``."""
  extra = "".join(f" {shlex.quote(a)}" for a in argv_overrides)
  return (
    f"{INSTALL} && python -m laplax.plan --config {shlex.quote(spec)} "
    f"--target {target.spec} --compile{extra}"
  )


def compiled_memory(config, target, spec: str, wanted: bool, refusals, overrides=()) -> str:
  """One line: the compiled train step's memory per chip of a TPU target
  (``wanted``, libtpu importable, no refusals), else why it was not compiled
  and the command that compiles it."""
  command = compile_command(spec, target, overrides)
  if target.chip.platform != "tpu":
    return (
      "not compiled: ahead-of-time compilation is for TPU targets (libtpu); the estimate stands"
    )
  if not wanted:
    return f"not compiled (the figure above is an estimate); to compile: {command}"
  if not libtpu_available():
    return f"not compiled: libtpu is not installed here; run: {command}"
  if refusals:
    return "not compiled: the config is refused on this target (see the errors)"
  import jax
  from jax.experimental import topologies

  devices = list(
    topologies.get_topology_desc(platform="tpu", topology_name=tpu_topology(target)).devices
  )
  lowered, info = lower_train_step(config, devices)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return f"does NOT fit (compiled): {str(e).splitlines()[0][:200]}"
  peak = peak_bytes(compiled.memory_analysis())
  fits = "fits" if peak <= target.chip.memory else "does NOT fit"
  return (
    f"{peak / 2.0**30:.2f} GiB of {target.chip.memory / 2.0**30:.0f} GiB ({fits}; compiled "
    f"for {len(devices)} x {devices[0].device_kind}, attention {info['kernel']})"
  )
