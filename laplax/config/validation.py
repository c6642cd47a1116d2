"""Validation of a training ConfigDict, before anything is compiled, prepared or written.

Every problem is reported as one :class:`ConfigError` whose message is a single
line saying what is wrong and how to fix it; the CLIs print it and exit 2.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import ml_collections

from laplax import sharding, utils
from laplax.config import defaults
from laplax.errors import UserError
from laplax.models import registry
from laplax.models import spec as spec_lib

# Keys every config has (the documented contract of train.py).
REQUIRED = (
  "task",
  "seed",
  "batch_size",
  "total_steps",
  "log_every",
  "eval_every",
  "checkpoint_every",
  "model.num_heads",
  "model.num_laplacian_heads",
  "model.spectral.enabled",
  "model.spectral.lam",
  "model.spectral.mode",
  "data.data_dir",
  "data.source_dir",
)
# Model keys that decide the parameter tree: a workdir whose saved config
# differs in one of these belongs to another run.
ARCHITECTURE_KEYS = (
  "task",
  "model",
  "data.name",
  "data.image_size",
  "data.tokenizer",
  "data.vocab_size",
  "data.multicrop.global_size",
  "dino.out_dim",
  "dino.hidden_dim",
  "dino.bottleneck_dim",
  "dino.head_layers",
)
# Keys under ARCHITECTURE_KEYS that leave the parameter tree as it is.
NOT_ARCHITECTURE_KEYS = ("model.remat", "model.loss_chunk")


class ConfigError(UserError, ValueError):
  """A config that cannot run; the message is one line with the fix."""


def get(config: ml_collections.ConfigDict, dotted: str, default: Any = KeyError):
  """Returns ``config.a.b`` for ``"a.b"``; ``default`` (or KeyError) if missing."""
  node = config
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      if default is KeyError:
        raise KeyError(dotted)
      return default
    node = node[part]
  return node


def require(cond: bool, message: str) -> None:
  """Raises :class:`ConfigError` with ``message`` (one line) unless ``cond``."""
  if not cond:
    raise ConfigError(message)


def check_int(config, key, minimum):
  """``config.KEY`` (dotted) is an integer (not a bool) >= ``minimum``, else :class:`ConfigError`."""
  value = get(config, key)
  require(
    isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
    f"config.{key}={value!r} must be an integer >= {minimum}",
  )
  return value


def check_float(config, key, minimum, maximum=float("inf"), open_min=False):
  """``config.KEY`` (dotted) is a finite number in ``[minimum, maximum]``
  (``(minimum, maximum]`` with ``open_min``), else :class:`ConfigError`."""
  value = get(config, key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  ok = ok and math.isfinite(value)
  ok = ok and (value > minimum if open_min else value >= minimum) and value <= maximum
  bound = f"> {minimum}" if open_min else f">= {minimum}"
  if maximum != float("inf"):
    bound += f" and <= {maximum}"
  require(ok, f"config.{key}={value!r} must be a finite number {bound}")
  return value


def unknown_keys(config: ml_collections.ConfigDict, task_class: Any) -> list[str]:
  """Dotted keys of ``config`` that no laplax config of its task has.

  The reference is ``task_class.known_keys(config)`` (the task's base config
  from :mod:`laplax.config.defaults`, which holds every key the trainer
  reads, and what its data source adds).
  """
  known = task_class.known_keys(config)
  sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
  return sorted(
    k
    for k in utils.flatten_dotted(config.to_dict(), keep_empty=True)
    if k not in known and k not in sections
  )


#: Keys that config.evals replaced -> how to say the same now (a run saved
#: with them is read as it was: :meth:`laplax.tasks.base.TaskBase.saved_evals`).
REPLACED_KEYS = {
  "eval.linear_probe": "to turn the probe off, leave linear_probe out of it, e.g. "
  "--config.evals=knn,raw_pixel_knn,segmentation,patch_pca",
  "eval.segmentation": "to turn the probe off, leave segmentation out of it, e.g. "
  "--config.evals=knn,linear_probe,raw_pixel_knn,patch_pca",
}


def require_keys(config: ml_collections.ConfigDict) -> None:
  """Every key of :data:`REQUIRED` is there.

  Raises:
    ConfigError: the first missing key.
  """
  for key in REQUIRED:
    try:
      get(config, key)
    except KeyError:
      raise ConfigError(
        f"config.{key} is missing; every laplax config defines it "
        f"(see configs/vit_fashion_mnist.py)"
      ) from None


def validate(
  config: ml_collections.ConfigDict,
  num_devices: int | None = None,
  strict_keys: bool = True,
  *,
  task_class: Any,
  num_processes: int | None = None,
  platform: str | None = None,
) -> None:
  """Checks types, ranges and consistency of every key the trainer reads.

  ``task_class`` is the class of ``config.task`` (callers go through
  :func:`laplax.tasks.validate`, which looks it up in the registry): its
  ``validate(config)`` checks the task's own sections, its ``known_keys`` and
  ``attention_lengths`` say which keys exist and which token counts the
  attention sees.

  With ``num_devices`` (the trainer passes ``jax.device_count()``, after the
  multi-process runtime started) the mesh is also checked against the devices
  and the batch, heads and MLP sizes against the mesh (:func:`validate_mesh`).
  With ``strict_keys`` (training; ``eval.py`` reads the configs of saved runs) a
  key that no config of the task has (:func:`unknown_keys`, e.g. a misspelt
  key in a config file) is an error. ``num_processes`` and ``platform``
  (``"tpu"``, ``"gpu"``, ``"cpu"``) stand for ``jax.process_count()`` and
  ``jax.default_backend()``: ``python -m laplax.plan`` checks a config for a
  machine it does not run on.

  Raises:
    ConfigError: the first problem found, as one line naming the key and the fix.
  """
  require_keys(config)
  name = get(config, "data.name", None)  # the task's data table is that data set's
  require(
    isinstance(name, str) and name.strip() != "",
    f"config.data.name={name!r} must name a data set, e.g. 'fashion_mnist_idx' or 'text_corpus'",
  )
  if strict_keys:
    extra = unknown_keys(config, task_class)
    require(
      not (extra and extra[0] in REPLACED_KEYS),
      f"config.{extra[0] if extra else ''} was replaced by config.evals; "
      f"{REPLACED_KEYS.get(extra[0] if extra else '')}",
    )
    require(
      not extra,
      f"config.{extra[0] if extra else ''} is not a key of a laplax "
      f"{config.task} config; check its spelling against "
      f"laplax/config/defaults.py" + (f" ({len(extra)} such keys)" if len(extra) > 1 else ""),
    )
  families = getattr(task_class, "families", (task_class.family,))
  require(
    get(config, "model.name") in families,
    f"config.model.name={get(config, 'model.name')!r} does not fit "
    f"task {config.task!r}; use model.name=" + " or ".join(repr(f) for f in families),
  )
  for key in ("data.data_dir", "data.source_dir"):
    value = get(config, key)
    require(
      isinstance(value, str) and value.strip() != "",
      f"config.{key}={value!r} must be a directory path; give a folder, e.g. ~/tensorflow_datasets",
    )
  check_int(config, "seed", 0)
  check_int(config, "batch_size", 1)
  check_int(config, "total_steps", 0)
  for key in ("log_every", "eval_every", "checkpoint_every"):
    check_int(config, key, 1)
  check_int(config, "eval_batch_size", 1)
  init_from = config.init_from or ""
  require(
    isinstance(init_from, str),
    f"config.init_from={init_from!r} must be the path of a laplax workdir",
  )
  if init_from:
    from laplax import store  # gs:// workdirs too

    require(
      store.isdir(os.path.join(os.path.expanduser(init_from), "checkpoints")),
      f"config.init_from={init_from} is not a laplax workdir (no checkpoints/ "
      f"in it); give a train.py or laplax.convert --workdir",
    )
  if config.keep_checkpoints is not None:
    check_int(config, "keep_checkpoints", 1)
  verify = config.checkpoint_verify
  require(isinstance(verify, bool), f"config.checkpoint_verify={verify!r} must be True or False")
  for key in ("data.crop_padding", "data.prefetch", "data.num_threads"):
    if get(config, key, None) is not None:  # optional: some data sets have not these keys
      check_int(config, key, 0)
  exclude = config.optim.weight_decay_exclude
  require(
    isinstance(exclude, (list, tuple)) and all(isinstance(p, str) for p in exclude),
    f"config.optim.weight_decay_exclude={exclude!r} must be a tuple of parameter-name regexes",
  )

  _validate_evals(config, task_class)
  model_spec = _validate_model(config, platform or jax.default_backend())
  task_class.validate(config)
  _check_splash(config, model_spec, task_class)

  o = config.optim
  check_float(config, "optim.lr", 0.0, open_min=True)
  check_float(config, "optim.weight_decay", 0.0)
  check_float(config, "optim.b1", 0.0, 1.0)
  check_float(config, "optim.b2", 0.0, 1.0)
  check_int(config, "optim.warmup_steps", 0)
  if o.grad_clip is not None:
    check_float(config, "optim.grad_clip", 0.0, open_min=True)
  check_float(config, "optim.min_lr_ratio", 0.0, 1.0)
  skip = config.optim.skip_nonfinite
  require(isinstance(skip, bool), f"config.optim.skip_nonfinite={skip!r} must be True or False")
  for key in ("debug.nan_at_step", "debug.stall_at_step"):
    if get(config, key) is not None:
      check_int(config, key, 1)
  if get(config, "optim.weight_decay_end", None) is not None:  # optional: DINO's key
    check_float(config, "optim.weight_decay_end", 0.0)
  _validate_muon(config)
  _validate_memory(config)
  _validate_budgets(config)
  _validate_sharding(config)
  _validate_observability(config)
  if num_devices is not None:
    validate_mesh(config, num_devices, num_processes, platform=platform)


def _validate_evals(config, task_class):
  """The form of ``config.evals`` (:func:`check_evals`); the names are
  checked against the task by :func:`laplax.evaluators.registry.validate`,
  where the evaluators declare their tasks."""
  del task_class
  check_evals(config.evals, None, config.task)


def split_evals(evals: str) -> tuple[str, ...]:
  """The names of a comma-separated evaluator list, in order (blanks dropped)."""
  return tuple(n.strip() for n in str(evals).split(",") if n.strip())


def check_evals(evals: Any, known: tuple[str, ...] | None, task: str) -> tuple[str, ...]:
  """The names of ``evals`` (``config.evals``, or ``Loaded.evaluate``'s
  argument): at least one, each among ``known`` (the evaluators of the task,
  :func:`laplax.evaluators.registry.accepted`; ``None``: any name), none twice.

  Raises:
    ConfigError: the first problem, naming the evaluators ``task`` has.
  """
  example = ",".join(known) if known else "NAME,NAME"
  require(
    isinstance(evals, str),
    f"config.evals={evals!r} must be comma-separated evaluator names, e.g. {example!r}",
  )
  names = split_evals(evals)
  require(
    names,
    f"config.evals={evals!r} names no evaluator, so nothing would be "
    f"evaluated (eval.py would write an eval.json without results); name "
    f"at least one, e.g. --config.evals={example.split(',')[0]}",
  )
  for name in names if known is not None else ():
    require(
      name in known,
      f"config.evals names {name!r}, not an evaluator of a "
      f"{task} run; use some of {', '.join(known)}",
    )
  require(len(set(names)) == len(names), f"config.evals={evals!r} names an evaluator twice")
  return names


def _validate_muon(config):
  """``optim.optimizer``, ``optim.schedule`` and the Muon / nanochat keys
  (``None`` where a number is optional)."""
  name = config.optim.optimizer
  require(
    name in ("adamw", "muon", "nanochat", "nanochat-fork"),
    f"config.optim.optimizer={name!r} is unknown; use 'adamw', 'muon', 'nanochat' or "
    f"'nanochat-fork'",
  )
  schedule = config.optim.schedule
  require(
    schedule in ("cosine", "warmdown", "progress", "triangle", "onecycle"),
    f"config.optim.schedule={schedule!r} is unknown; use 'cosine', 'warmdown', 'progress', "
    f"'triangle' or 'onecycle'",
  )
  if schedule == "onecycle":  # torch's OneCycleLR, AdamW's beta1 cycled (laplax.optim)
    steps, warmup = config.optim.schedule_steps or config.total_steps, config.optim.warmup_steps
    require(
      name == "adamw" and config.optim.budget_hours is None,
      "config.optim.schedule='onecycle' cycles AdamW's beta1 by steps; use it with "
      "optim.optimizer='adamw' and without optim.budget_hours",
    )
    require(
      min(warmup, steps) != 1,
      f"config.optim.warmup_steps={warmup} must not be 1 (of {steps} steps) with "
      "optim.schedule='onecycle': torch's OneCycleLR divides by pct_start * steps - 1 = 0",
    )
  if get(config, "optim.eps", None) is not None:
    check_float(config, "optim.eps", 0.0, open_min=True)
  if get(config, "optim.schedule_steps") is not None:
    check_int(config, "optim.schedule_steps", 1)
  if get(config, "optim.warmdown_ratio") is not None:
    check_float(config, "optim.warmdown_ratio", 0.0, 1.0)
  if get(config, "optim.adam_eps") is not None:
    check_float(config, "optim.adam_eps", 0.0)
  if get(config, "optim.muon_momentum_start") is not None:
    check_float(config, "optim.muon_momentum_start", 0.0, 1.0)
  if get(config, "optim.muon_momentum_ramp_steps") is not None:
    check_int(config, "optim.muon_momentum_ramp_steps", 0)
  if get(config, "optim.muon_lr") is not None:
    check_float(config, "optim.muon_lr", 0.0, open_min=True)
  if get(config, "optim.muon_momentum") is not None:
    check_float(config, "optim.muon_momentum", 0.0, 1.0)
  if get(config, "optim.muon_weight_decay") is not None:
    check_float(config, "optim.muon_weight_decay", 0.0)
  for key in ("optim.embedding_lr", "optim.unembedding_lr"):
    if get(config, key) is not None:
      check_float(config, key, 0.0, open_min=True)


def _validate_memory(config):
  """``check_memory``, ``optim.grad_accum_steps`` (``None`` means 1),
  ``optim.grad_accum_unroll``."""
  check_memory = config.check_memory
  require(
    isinstance(check_memory, bool), f"config.check_memory={check_memory!r} must be True or False"
  )
  unroll = config.optim.grad_accum_unroll
  require(
    isinstance(unroll, bool), f"config.optim.grad_accum_unroll={unroll!r} must be True or False"
  )
  if config.optim.grad_accum_steps is None:
    return
  accum = check_int(config, "optim.grad_accum_steps", 1)
  require(
    config.batch_size % accum == 0,
    f"config.batch_size={config.batch_size} is not divisible by "
    f"config.optim.grad_accum_steps={accum} (the global batch is cut into "
    f"that many micro-batches); use a multiple of {accum} or set "
    f"--config.optim.grad_accum_steps=1",
  )


def _validate_budgets(config):
  """How long a run trains and on how big a batch: ``target_flops`` (language
  models), ``optim.budget_hours`` and ``optim.batch_size_ramp``."""
  if "target_flops" in config and config.target_flops is not None:
    flops = check_float(config, "target_flops", 0.0, open_min=True)
    if config.total_steps == 0:
      per_step = defaults.gpt_flops_per_token(config) * config.batch_size * config.model.max_length
      raise ConfigError(
        f"config.target_flops={flops:g} is less than half a step of {per_step:.4g} FLOPs "
        f"(batch_size x max_length tokens x {defaults.gpt_flops_per_token(config):,} FLOPs "
        f"a token), so the run would train 0 updates; raise it or lower config.batch_size"
      )
  o = config.optim
  if o.budget_hours is not None:
    check_float(config, "optim.budget_hours", 0.0, open_min=True)
    require(
      o.optimizer == "adamw",
      f"config.optim.budget_hours={o.budget_hours} schedules by wall time only "
      f"optim.optimizer='adamw' (now {o.optimizer!r}); use adamw or leave "
      f"budget_hours unset and bound the run by total_steps",
    )
  ramp = check_float(config, "optim.batch_size_ramp", 0.0, 1.0)
  require(
    ramp < 1.0,
    "config.optim.batch_size_ramp=1.0 must be below 1: the fraction of the budget "
    "over which the batch grows to batch_size (cramming's bert-o4: 0.6); 0 is off",
  )
  require(
    ramp == 0.0 or (o.grad_accum_steps or 1) > 1,
    f"config.optim.batch_size_ramp={ramp} grows the batch by accumulating "
    f"micro-batches of batch_size / optim.grad_accum_steps examples; set "
    f"config.optim.grad_accum_steps above 1 (the micro-batches of the full batch)",
  )


WANDB_MODES = ("online", "offline", "disabled")


def _validate_observability(config):
  """``profile.*`` and ``wandb.*`` (the evaluators check their ``eval.*``)."""
  for key, low, fix in (
    ("profile.start_step", 1, "the first traced training step (steps count from 1)"),
    ("profile.num_steps", 0, "the number of traced steps, 0 for no trace"),
  ):
    value = get(config, key, None)
    if value is None:
      continue
    require(
      isinstance(value, int) and not isinstance(value, bool) and value >= low,
      f"config.{key}={value!r} must be an integer >= {low}: {fix}",
    )
  for key in ("project", "entity", "name"):
    value = get(config, f"wandb.{key}")
    require(
      value is None or (isinstance(value, str) and value.strip()),
      f"config.wandb.{key}={value!r} must be a non-empty string (or unset)",
    )
  mode = config.wandb.mode
  require(
    mode is None or mode in WANDB_MODES,
    f"config.wandb.mode={mode!r} is unknown; use one of "
    f"{', '.join(map(repr, WANDB_MODES))} (or leave it unset)",
  )


def _validate_sharding(config):
  """``mesh_shape``, ``sharding_rules``, ``distributed.*``."""
  try:
    sharding.parse_mesh_shape(config.mesh_shape)
    sharding.parse_rules(config.sharding_rules or sharding.DEFAULT_RULES)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  dist = config.distributed
  require(
    isinstance(dist.enabled, bool),
    f"config.distributed.enabled={dist.enabled!r} must be True or False",
  )
  address = dist.coordinator_address
  if address is None:
    return
  require(
    isinstance(address, str) and address.rpartition(":")[2].isdigit(),
    f"config.distributed.coordinator_address={address!r} must be 'host:port'",
  )
  num = dist.num_processes
  pid = dist.process_id
  require(
    isinstance(num, int)
    and not isinstance(num, bool)
    and num >= 1
    and isinstance(pid, int)
    and not isinstance(pid, bool)
    and 0 <= pid < num,
    f"config.distributed.num_processes={num!r} and process_id={pid!r} must be "
    f"integers with 0 <= process_id < num_processes when coordinator_address "
    f"is set",
  )


def validate_mesh(
  config: ml_collections.ConfigDict,
  num_devices: int,
  num_processes: int | None = None,
  *,
  platform: str | None = None,
) -> tuple[int, int, int]:
  """Checks ``config.mesh_shape`` against the devices and the model and batch sizes.

  The mesh must use exactly ``num_devices`` devices; ``batch_size`` (per
  micro-batch with ``optim.grad_accum_steps``) must be divisible by the
  data-parallel size (the mesh axes of the logical axis ``batch``, by default
  ``data * fsdp``), which must be a multiple of the number of processes (each
  process loads its own rows); ``model.num_heads`` and ``model.mlp_dim`` must be
  divisible by the tensor-parallel size. :func:`mesh_problems` lists every
  mismatch; this raises the first.

  Returns:
    The resolved mesh shape ``(data, fsdp, tensor)``.

  Raises:
    ConfigError: the first mismatch, as one line with the fix.
  """
  shape, problems = mesh_problems(config, num_devices, num_processes, platform=platform)
  require(not problems, problems[0] if problems else "")
  return shape


def mesh_problems(
  config: ml_collections.ConfigDict,
  num_devices: int,
  num_processes: int | None = None,
  *,
  platform: str | None = None,
) -> tuple[tuple[int, int, int] | None, list[str]]:
  """``(mesh shape, problems)``: the resolved ``(data, fsdp, tensor)`` of
  ``config.mesh_shape`` on ``num_devices`` devices (``None`` if it does not
  resolve) and every rule of :func:`validate_mesh` it breaks, each one line
  naming the key and the fix. ``num_processes`` defaults to
  ``jax.process_count()``, ``platform`` to ``jax.default_backend()`` (on a
  CPU the fix of a mesh that does not fit names the fake CPU devices)."""
  try:
    shape = sharding.resolve_mesh_shape(config.mesh_shape, num_devices)
  except ValueError as e:
    hint = (
      "; for N fake CPU devices set XLA_FLAGS=--xla_force_host_platform_device_count=N"
      if (platform or jax.default_backend()) == "cpu"
      else ""
    )
    return None, [f"config.{e}{hint}"]
  problems = []
  rules = sharding.rules_from_config(config)
  shown = "(" + ",".join(map(str, shape)) + ")"
  dp = sharding.axis_size(shape, rules, "batch")
  accum = config.optim.grad_accum_steps or 1  # None: 1
  per_step = config.batch_size // accum
  what = (
    f"the micro-batch batch_size/grad_accum_steps={per_step}"
    if accum > 1
    else f"config.batch_size={config.batch_size}"
  )
  if per_step % dp:
    problems.append(
      f"{what} is not divisible by the data-parallel size {dp} (batch axes "
      f"{'*'.join(sharding.mesh_axes(rules, 'batch')) or 'none'} of mesh_shape="
      f"{shown}); choose a batch size that is a multiple of {dp * accum}"
    )
  processes = jax.process_count() if num_processes is None else num_processes
  if dp % processes:
    problems.append(
      f"the data-parallel size {dp} of mesh_shape={shown} is not a multiple of "
      f"the {processes} processes; each process must hold its own rows of the "
      f"batch"
    )
  model = spec_lib.from_config(config.model)  # mlp_dim None -> 4 * width
  sizes = {"num_heads": model.attention.num_heads, "mlp_dim": model.mlp_dim}
  for name, key in (("heads", "num_heads"), ("mlp", "mlp_dim")):
    tp = sharding.axis_size(shape, rules, name)
    size = sizes[key]
    if size % tp:
      problems.append(
        f"config.model.{key}={size} is not divisible by the tensor-parallel size "
        f"{tp} of mesh_shape={shown}; choose a mesh whose tensor size divides it"
      )
  return shape, problems


def _validate_model(config, platform: str):
  """The model section: every field of the model spec
  (:func:`laplax.models.spec.from_config`: types, ranges, heads vs width,
  Laplacian heads vs heads, qk-norm, spectral, rotary), then what the spec
  cannot know (the backend for cuDNN, the image size for the patches, the
  token counts splash needs)."""
  m = config.model
  try:
    model_spec = spec_lib.from_config(m)
  except spec_lib.SpecError as e:
    raise ConfigError(f"config.{e}") from None
  if model_spec.attention.implementation == "cudnn":
    require(
      platform == "gpu",
      f"config.model.implementation='cudnn' needs an NVIDIA GPU but JAX runs "
      f"on {platform!r}; use 'xla'",
    )
  image_size = get(config, "data.image_size", None)  # optional: an image data set's key
  family = registry.get(m.name)  # from_config above refused an unknown name
  if family.image_patches and image_size is not None:
    check_int(config, "data.image_size", 1)
    check_patches(
      config, image_size, image_size, f"config.data.image_size={image_size}", "change one of them"
    )
  return model_spec


def _check_splash(config, model_spec, task_class) -> None:
  """``model.implementation='splash'`` against the token counts known from
  the config (the task's ``attention_lengths``)."""
  try:
    spec_lib.check_splash_lengths(model_spec, task_class.attention_lengths(config))
  except spec_lib.SpecError as e:
    raise ConfigError(f"config.{e}") from None


def attention_lengths(
  config: ml_collections.ConfigDict, image_side: int | None = None, crop_sides: tuple[int, ...] = ()
) -> tuple[int, ...]:
  """Token counts the model's self-attention sees: the family's own rule when
  it has one (:attr:`laplax.models.registry.Family.attention_lengths`: a
  GPT's context ``model.max_length``, a Swin's windows), else a ViT's patches
  of ``data.image_size`` (else of ``image_side``, the dataset's, when given)
  plus the class token with ``model.pool='tok'``, and those of the
  ``crop_sides`` a task adds (DINO's global and local crops come first).
  Counts that depend on an unknown image size are left out."""
  m = config.model
  family = registry.find(m.name)
  if family is not None and family.attention_lengths is not None:
    return family.attention_lengths(config, image_side, crop_sides)
  patches = lambda side: (int(side) // m.patch_size) ** 2 + (m.pool == "tok")
  sides = list(crop_sides) + [
    get(config, "data.image_size", None)  # images only
    or image_side
  ]
  return tuple(dict.fromkeys(patches(s) for s in sides if s))


def attention_kernel(config: ml_collections.ConfigDict, task: Any = None, say: Any = None) -> str:
  """The name of the attention kernel(s) the run uses (``"xla"``,
  ``"splash"``, ``"cudnn"``, ``"splash+xla"``...): :func:`laplax.kernels.describe`
  of the task's ``attention_lengths`` (with ``task.image_shape`` when the task has
  one) on the current platform (inside :func:`laplax.sharding.context`: the
  mesh's). ``say``, if given, is called with the one line that says which
  kernel runs and why (``train.py`` prints it at the start)."""
  from laplax import kernels

  spec = spec_lib.from_config(config.model)
  side = (getattr(task, "image_shape", None) or (None,))[0]
  name, line = kernels.describe(
    spec.attention.implementation,
    task.attention_lengths(config, side),
    head_dim=spec.head_dim,
    dtype=spec.dtype,
    bias=getattr(registry.find(config.model.name), "relative_bias", False),  # XLA takes it
  )
  if say is not None:
    say(line)
  return name


def check_patches(
  config: ml_collections.ConfigDict, height: int, width: int, what: str, fix: str
) -> None:
  """Images of ``height x width`` px against ``config.model.patch_size``
  (:func:`laplax.models.spec.patch_grid`, the one statement of the rule);
  ``what`` names the images (the key that sets them), ``fix`` how to mend it.

  Raises:
    ConfigError: "WHAT is not divisible by config.model.patch_size=P; FIX".
  """
  p = config.model.patch_size
  try:
    spec_lib.patch_grid(height, width, p)
  except spec_lib.SpecError:
    raise ConfigError(f"{what} is not divisible by config.model.patch_size={p}; {fix}") from None


def check_image_size(config: ml_collections.ConfigDict, image_shape) -> None:
  """Checks the data's image size ``(H, W, C)`` against ``model.patch_size``
  (:func:`check_patches`).

  Raises:
    ConfigError: height or width not divisible by the patch size.
  """
  h, w = image_shape[:2]
  check_patches(
    config,
    h,
    w,
    f"image size {h}x{w} of dataset {config.data.name!r}",
    "choose a patch size that divides it or set config.data.image_size",
  )


def architecture_diff(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """Dotted keys under :data:`ARCHITECTURE_KEYS` where ``saved`` and ``config`` differ.

  Keys in :data:`NOT_ARCHITECTURE_KEYS` (``model.remat``, ``model.loss_chunk``) are ignored, and so
  are ``model.spectral.*`` when spectral conditioning is off on both sides
  (the layout of a correction that is not applied changes nothing). A model
  key missing on one side has the model spec's default
  (:func:`laplax.models.spec.config_defaults`), so a run saved before a model
  option existed resumes with the option at its default.
  """
  a = utils.flatten_dotted(saved)
  b = utils.flatten_dotted(json.loads(config.to_json()))
  family = config.model.name
  if family in spec_lib.FAMILIES:
    defaults = utils.flatten_dotted({"model": spec_lib.config_defaults(family)})
    for k, v in defaults.items():
      a.setdefault(k, v)
      b.setdefault(k, v)
  keys = [
    k
    for k in sorted(set(a) | set(b))
    if any(k == p or k.startswith(p + ".") for p in ARCHITECTURE_KEYS)
    and k not in NOT_ARCHITECTURE_KEYS
  ]
  if not a.get("model.spectral.enabled") and not b.get("model.spectral.enabled"):
    keys = [k for k in keys if not k.startswith("model.spectral.")]
  return [k for k in keys if a.get(k) != b.get(k)]
