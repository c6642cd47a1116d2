"""Will it fit? The checks of a run against its data and its machine, before step 1.

Three checks, each one line (:class:`FitError`, a
:class:`~laplax.config.validation.ConfigError`: the CLIs print it and exit 2):

- :func:`check_data` (after the data is prepared, before anything is written):
  a training batch larger than the split it draws from (``batch_size``
  against the images of ``data.train_split``, or the windows of a text
  split), DINO's ``eval.knn_k`` above its k-NN bank (the train split) and
  ``eval.pca_images`` above the eval split. An evaluation batch larger than
  its split only pads, so the data pipelines cut it to the split
  (``laplax.data.vision.images.eval_batches``, ``laplax.data.text.corpus.eval_batches``); a
  context longer than a text split is refused where the tokens are counted
  (``laplax.data.text.corpus.prepare``).
- :func:`check_memory` (``config.check_memory``, default True), before the
  first step and before anything is written: first a lower bound that needs
  no compilation (the per-device bytes of the parameters and optimizer state
  from ``jax.eval_shape``, the input batch, and the activations of one
  micro-batch that the backward pass surely keeps, :func:`kept_per_token`),
  so that a model or batch far too large is refused in seconds instead of
  being compiled for minutes; then the compiled train step's
  ``memory_analysis()`` (arguments + outputs - donated + temporaries, per
  device), the figure XLA allocates. Both are
  compared with what the device has (:func:`available_bytes`: on a CPU the
  host's available RAM, shared by its CPU devices; on a GPU or TPU the
  allocator's ``bytes_limit`` less what is in use). The compiled executable
  is the one the loop then runs (JAX caches it), so the check adds no compile
  (``bench/fit_cost.py`` measures it). The memory figures are per device;
  they do not count what the host needs besides (the data pipeline's
  buffers), nor the evaluation, which runs on its own batches.
- :func:`out_of_memory`: an XLA ``RESOURCE_EXHAUSTED`` during a step (what
  the estimate could not foresee) as one line with the same levers.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import ml_collections
import numpy as np

from laplax.config import run as run_lib
from laplax.config.validation import ConfigError
from laplax.train import budget

GIB = 2.0**30
SKIP = "--config.check_memory=False skips this check"


class FitError(ConfigError):
  """A run that does not fit its data or its machine; one line with the fix."""


def levers(config: ml_collections.ConfigDict) -> str:
  """What makes a train step smaller, with the config's current values."""
  accum = config.optim.grad_accum_steps or 1  # None: 1
  return (
    f"lower config.batch_size (now {config.batch_size}), raise "
    f"config.optim.grad_accum_steps (now {accum}), set config.model.remat=full "
    f"(now {config.model.remat}) or spread the run over more "
    f"devices (config.mesh_shape with an fsdp axis)"
  )


# --------------------------------------------------------------------------
# The data.


def _refuse(what: str, size: int, unit: str, split: str, key: str, value: int) -> None:
  raise FitError(
    f"config.{key}={value} is larger than the {size} {unit} of {what} "
    f"({split!r}); lower --config.{key} to at most {size} or use a "
    f"larger split"
  )


def check_data(task: Any) -> None:
  """Checks the batch and evaluation sizes against the prepared splits
  (each task's :meth:`~laplax.tasks.base.TaskBase.data_limits`).

  Raises:
    FitError: the first size that exceeds its split (naming the split's size
      and the key to change).
    DataError: the data cannot be read.
  """
  for what, size, unit, split, key, value in task.data_limits():
    if value > size:
      _refuse(what, size, unit, split, key, value)


# --------------------------------------------------------------------------
# The machine.


def _meminfo_available() -> int | None:
  """``MemAvailable`` of ``/proc/meminfo`` in bytes, less by a cgroup (v2)
  limit of this process when that leaves less; ``None`` off Linux."""
  try:
    with open("/proc/meminfo") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
    available = int(fields["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None
  try:
    with open("/sys/fs/cgroup/memory.max") as f:
      limit = f.read().strip()
    with open("/sys/fs/cgroup/memory.current") as f:
      used = int(f.read().strip())
    if limit.isdigit():
      available = min(available, int(limit) - used)
  except (OSError, ValueError):
    pass
  return available


def available_bytes(device: jax.Device | None = None) -> tuple[int | None, str]:
  """``(bytes one device may use, a phrase saying whose they are)``.

  CPU: the host's available memory (:func:`_meminfo_available`) divided by
  the local CPU devices (they share it). GPU/TPU: ``memory_stats()``'s
  ``bytes_limit`` less ``bytes_in_use``. ``None`` when unknown.
  """
  device = device or jax.local_devices()[0]
  if device.platform == "cpu":
    total = _meminfo_available()
    if total is None:
      return None, "of the host"
    n = jax.local_device_count()
    if n > 1:
      return total // n, (
        f"that each of this host's {n} CPU devices has (of {total / GIB:.1f} GiB available)"
      )
    return total, "that this host has available"
  try:
    stats = device.memory_stats() or {}
  except Exception:
    stats = {}
  limit = stats.get("bytes_limit")
  if not limit:
    return None, f"of the {device.device_kind}"
  free = int(limit) - int(stats.get("bytes_in_use", 0))
  return free, f"free on the {device.device_kind} (of {int(limit) / GIB:.1f} GiB)"


def _per_device_bytes(tree: Any, shardings: Any) -> int:
  """Bytes of one device's shard of every leaf of ``tree``."""
  total = 0
  for x, s in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)):
    shape = s.shard_shape(x.shape) if s is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return int(total)


def kept_per_token(config: ml_collections.ConfigDict, platform: str) -> int:
  """Activations per token and layer that the backward pass surely keeps.

  With ``model.remat`` ``none`` on a CPU (whose XLA compiler recomputes
  nothing): the block's input, ``Q``, ``K``, ``V``, the heads' output before
  ``W_O`` (``5 x width``) and the MLP's hidden pre-activation (``mlp_dim``),
  all outputs or inputs of matmuls. Otherwise (a remat policy; a GPU or TPU
  compiler may rematerialise by itself) only the block's input, ``width``.
  """
  m = config.model
  width = int(m.width)
  if m.remat in (None, "none") and platform == "cpu":
    return 5 * width + int(m.mlp_dim or 4 * width)  # None: 4 * width
  return width


def lower_bound(
  config: ml_collections.ConfigDict,
  task: Any,
  abstract: Any,
  shardings: Any,
  batch_sharding: dict,
  platform: str = "cpu",
) -> dict:
  """A lower bound of one device's memory for a train step, without compiling.

  Returns ``{"state", "batch", "activations", "total"}`` in bytes: the
  TrainState's shard (parameters, optimizer state, task state), the input
  batch's shard, and for the examples of one micro-batch on this device
  ``tokens x depth x`` :func:`kept_per_token` values of the compute dtype.
  """
  state = _per_device_bytes(abstract, shardings)
  spec = task.batch_spec(config.batch_size)
  batch = _per_device_bytes(spec, [batch_sharding[k] for k in spec])
  accum = config.optim.grad_accum_steps or 1  # None: 1
  examples = max(
    config.batch_size // accum // _batch_shards(spec, batch_sharding, task.batch_axis), 1
  )
  itemsize = 2 if config.model.dtype == "bfloat16" else 4
  activations = (
    examples
    * task.tokens_per_example()
    * int(config.model.depth)
    * kept_per_token(config, platform)
    * itemsize
  )
  return {
    "state": state,
    "batch": batch,
    "activations": activations,
    "total": state + batch + activations,
  }


def _batch_shards(spec: dict, batch_sharding: dict, axis: int) -> int:
  """Into how many pieces the mesh cuts the batch axis."""
  key = next(iter(spec))
  shape = spec[key].shape
  return max(shape[axis] // max(batch_sharding[key].shard_shape(shape)[axis], 1), 1)


def _refuse_memory(config, detail: str, have: int, where: str) -> None:
  raise FitError(
    f"the train step needs {detail} per device, more than the "
    f"{have / GIB:.1f} GiB {where}; {levers(config)}; {SKIP}"
  )


def check_memory(
  run: run_lib.RunSpec | ml_collections.ConfigDict,
  task: Any,
  train_step: Any,
  abstract: Any,
  shardings: Any,
  batch_sharding: dict,
) -> None:
  """Refuses a train step that cannot fit the device (see the module
  docstring); compiles ``train_step`` (a jitted ``(state, batch)`` function,
  or ``(state, batch, controls)``: :func:`laplax.train.budget.controls_spec`)
  for the abstract state and batch. Nothing when ``config.check_memory`` is
  False. ``run``: the run spec (the trainer's) or its config.

  Raises:
    FitError: the lower bound or the compiled step's memory exceeds what the
      device has, or the compiler ran out of memory.
  """
  config = run_lib.config_of(run)
  if not config.check_memory:
    return
  device = jax.local_devices()[0]
  have, where = available_bytes(device)
  bound = lower_bound(config, task, abstract, shardings, batch_sharding, device.platform)
  if have is not None and bound["total"] > have:
    _refuse_memory(
      config,
      f"at least {bound['total'] / GIB:.1f} GiB (parameters and optimizer "
      f"state {bound['state'] / GIB:.1f} GiB, input batch "
      f"{bound['batch'] / GIB:.1f} GiB, activations at least "
      f"{bound['activations'] / GIB:.1f} GiB)",
      have,
      where,
    )
  state = jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )
  spec = task.batch_spec(config.batch_size)
  batch = {
    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k]) for k, v in spec.items()
  }
  try:
    compiled = train_step.lower(state, batch, *budget.controls_spec(run)).compile()
  except Exception as e:
    message = out_of_memory(e, config)
    if message is None:
      raise
    raise FitError(message) from None
  mem = compiled.memory_analysis()
  if have is None or mem is None:
    return
  peak = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )
  if peak > have:
    _refuse_memory(
      config,
      f"{peak / GIB:.1f} GiB as compiled (arguments "
      f"{mem.argument_size_in_bytes / GIB:.1f} GiB, temporaries "
      f"{mem.temp_size_in_bytes / GIB:.1f} GiB)",
      have,
      where,
    )


def out_of_memory(
  error: BaseException, config: ml_collections.ConfigDict | None = None
) -> str | None:
  """The one-line message for an XLA ``RESOURCE_EXHAUSTED`` (device memory;
  not a full disk, which tensorstore also reports so), else ``None``; with
  the run's ``config`` the levers name its values (:func:`levers`)."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text or "os_error" in text:
    return None
  first = next((l.strip() for l in text.splitlines() if "RESOURCE_EXHAUSTED" in l), "")
  how = (
    levers(config)
    if config is not None
    else (
      "lower config.batch_size, raise config.optim.grad_accum_steps, set "
      "config.model.remat=full or spread the run over more devices"
    )
  )
  return f"out of device memory ({first[:200]}); {how}"
