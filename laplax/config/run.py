"""The run spec: a training config checked once, section by section, into typed values.

:func:`build` reads a complete ``ConfigDict`` (a ``configs/*.py`` file with its
``--config.KEY=VALUE`` overrides, :mod:`laplax.tasks.schema` filled in) and
returns a frozen :class:`RunSpec`: the model spec
(:func:`laplax.models.spec.from_config`, built here and nowhere else on the
training path) and one section type per part of the run --
:class:`Schedule` (steps, cadences, checkpoints), :class:`Optim` (optimiser,
learning-rate schedule, accumulation, budgets), :class:`Mesh` (devices and
processes), :class:`Evaluation` (``config.evals``) and
:class:`Observability` (profiler, W&B). Each section's ``from_config`` holds its
checks and raises the first problem as one
:class:`~laplax.config.validation.ConfigError` line; the data section and the
task's own sections stay in the ``ConfigDict`` (``RunSpec.config``), checked by
the task (``task_class.validate``).

``train.py`` and ``eval.py`` build it once (:func:`laplax.tasks.validate`, in
:func:`laplax.train.loop.setup`, after the multi-process runtime started: the
mesh is checked against the devices) and pass it down: the task takes its
model spec, the loop its mesh. The ConfigDict stays the user's format and what
a workdir saves (``config.json``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections

from laplax import sharding
from laplax.config import defaults
from laplax.config.validation import (
  REPLACED_KEYS,
  ConfigError,
  check_evals,
  check_float,
  check_int,
  check_model,
  get,
  require,
  require_keys,
  unknown_keys,
  validate_mesh,
)
from laplax.models import spec as spec_lib

WANDB_MODES = ("online", "offline", "disabled")
OPTIMIZERS = ("adamw", "muon", "nanochat", "nanochat-fork")
SCHEDULES = ("cosine", "warmdown", "progress", "triangle", "onecycle")


def _optional(config: ml_collections.ConfigDict, key: str, check, *bounds) -> Any:
  """``check(config, key, *bounds)`` when ``config.KEY`` is set (not ``None``),
  else ``None``; the key may be missing (a data set's or a task's key)."""
  if get(config, key, None) is None:
    return None
  return check(config, key, *bounds)


def _bool(config: ml_collections.ConfigDict, key: str) -> bool:
  """``config.KEY`` is ``True`` or ``False``, else :class:`ConfigError`."""
  value = get(config, key)
  require(isinstance(value, bool), f"config.{key}={value!r} must be True or False")
  return value


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How long the run trains and how often it logs, evaluates and saves."""

  seed: int
  batch_size: int
  total_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int
  eval_batch_size: int
  init_from: str  # "" for none
  keep_checkpoints: int | None  # None: all
  checkpoint_verify: bool

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Schedule:
    """The top-level keys of the schedule; ``init_from`` must be a workdir
    (local or ``gs://``) with ``checkpoints/``.

    Raises:
      ConfigError: the first bad key, as one line with the fix.
    """
    ints = {
      "seed": check_int(config, "seed", 0),
      "batch_size": check_int(config, "batch_size", 1),
      "total_steps": check_int(config, "total_steps", 0),
      **{k: check_int(config, k, 1) for k in ("log_every", "eval_every", "checkpoint_every")},
      "eval_batch_size": check_int(config, "eval_batch_size", 1),
    }
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
    keep = None
    if config.keep_checkpoints is not None:
      keep = check_int(config, "keep_checkpoints", 1)
    verify = config.checkpoint_verify
    require(isinstance(verify, bool), f"config.checkpoint_verify={verify!r} must be True or False")
    return cls(**ints, init_from=init_from, keep_checkpoints=keep, checkpoint_verify=verify)


@dataclasses.dataclass(frozen=True)
class Optim:
  """The optimiser, its learning-rate schedule, gradient accumulation and the
  budgets (wall time, batch-size ramp); ``None`` where a number is optional
  (:mod:`laplax.optim` reads the same keys)."""

  optimizer: str
  schedule: str
  lr: float
  weight_decay: float
  b1: float
  b2: float
  warmup_steps: int
  grad_clip: float | None
  min_lr_ratio: float
  skip_nonfinite: bool
  weight_decay_exclude: tuple[str, ...]
  weight_decay_end: float | None
  eps: float | None
  schedule_steps: int | None
  warmdown_ratio: float | None
  adam_eps: float | None
  muon_momentum_start: float | None
  muon_momentum_ramp_steps: int | None
  muon_lr: float | None
  muon_momentum: float | None
  muon_weight_decay: float | None
  embedding_lr: float | None
  unembedding_lr: float | None
  grad_accum_steps: int  # None in the config: 1
  grad_accum_unroll: bool
  budget_hours: float | None
  batch_size_ramp: float

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Optim:
    """``config.optim`` (and ``batch_size``, which the accumulation divides).

    Raises:
      ConfigError: the first bad key, as one line with the fix.
    """
    o = config.optim
    exclude = o.weight_decay_exclude
    require(
      isinstance(exclude, (list, tuple)) and all(isinstance(p, str) for p in exclude),
      f"config.optim.weight_decay_exclude={exclude!r} must be a tuple of parameter-name regexes",
    )
    values = dict(
      lr=check_float(config, "optim.lr", 0.0, open_min=True),
      weight_decay=check_float(config, "optim.weight_decay", 0.0),
      b1=check_float(config, "optim.b1", 0.0, 1.0),
      b2=check_float(config, "optim.b2", 0.0, 1.0),
      warmup_steps=check_int(config, "optim.warmup_steps", 0),
    )
    grad_clip = None
    if o.grad_clip is not None:
      grad_clip = check_float(config, "optim.grad_clip", 0.0, open_min=True)
    values.update(
      grad_clip=grad_clip,
      min_lr_ratio=check_float(config, "optim.min_lr_ratio", 0.0, 1.0),
      skip_nonfinite=_bool(config, "optim.skip_nonfinite"),
      weight_decay_end=_optional(config, "optim.weight_decay_end", check_float, 0.0),
      **_optimizer_keys(config),
      **_accumulation(config),
    )
    return cls(weight_decay_exclude=tuple(exclude), **values, **_budgets(config))


def _optimizer_keys(config: ml_collections.ConfigDict) -> dict:
  """``optim.optimizer``, ``optim.schedule`` and the Muon / nanochat keys."""
  name = config.optim.optimizer
  require(
    name in OPTIMIZERS,
    f"config.optim.optimizer={name!r} is unknown; use 'adamw', 'muon', 'nanochat' or "
    f"'nanochat-fork'",
  )
  schedule = config.optim.schedule
  require(
    schedule in SCHEDULES,
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
  rate = lambda key: _optional(config, f"optim.{key}", check_float, 0.0, float("inf"), True)
  return dict(
    optimizer=name,
    schedule=schedule,
    eps=rate("eps"),
    schedule_steps=_optional(config, "optim.schedule_steps", check_int, 1),
    warmdown_ratio=_optional(config, "optim.warmdown_ratio", check_float, 0.0, 1.0),
    adam_eps=_optional(config, "optim.adam_eps", check_float, 0.0),
    muon_momentum_start=_optional(config, "optim.muon_momentum_start", check_float, 0.0, 1.0),
    muon_momentum_ramp_steps=_optional(config, "optim.muon_momentum_ramp_steps", check_int, 0),
    muon_lr=rate("muon_lr"),
    muon_momentum=_optional(config, "optim.muon_momentum", check_float, 0.0, 1.0),
    muon_weight_decay=_optional(config, "optim.muon_weight_decay", check_float, 0.0),
    embedding_lr=rate("embedding_lr"),
    unembedding_lr=rate("unembedding_lr"),
  )


def _accumulation(config: ml_collections.ConfigDict) -> dict:
  """``optim.grad_accum_unroll`` and ``optim.grad_accum_steps`` (``None``: 1),
  which must divide ``batch_size``."""
  unroll = _bool(config, "optim.grad_accum_unroll")
  if config.optim.grad_accum_steps is None:
    return dict(grad_accum_unroll=unroll, grad_accum_steps=1)
  accum = check_int(config, "optim.grad_accum_steps", 1)
  require(
    config.batch_size % accum == 0,
    f"config.batch_size={config.batch_size} is not divisible by "
    f"config.optim.grad_accum_steps={accum} (the global batch is cut into "
    f"that many micro-batches); use a multiple of {accum} or set "
    f"--config.optim.grad_accum_steps=1",
  )
  return dict(grad_accum_unroll=unroll, grad_accum_steps=accum)


def _budgets(config: ml_collections.ConfigDict) -> dict:
  """``optim.budget_hours`` (AdamW only) and ``optim.batch_size_ramp`` (in
  ``[0, 1)``, with micro-batches to grow by)."""
  o = config.optim
  hours = None
  if o.budget_hours is not None:
    hours = check_float(config, "optim.budget_hours", 0.0, open_min=True)
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
  return dict(budget_hours=hours, batch_size_ramp=ramp)


def check_target_flops(config: ml_collections.ConfigDict) -> None:
  """``target_flops`` (language models) is positive and buys at least one step.

  Raises:
    ConfigError: not a positive number, or a budget of 0 updates.
  """
  if "target_flops" not in config or config.target_flops is None:
    return
  flops = check_float(config, "target_flops", 0.0, open_min=True)
  if config.total_steps == 0:
    per_token = defaults.gpt_flops_per_token(config)
    per_step = per_token * config.batch_size * config.model.max_length
    raise ConfigError(
      f"config.target_flops={flops:g} is less than half a step of {per_step:.4g} FLOPs "
      f"(batch_size x max_length tokens x {per_token:,} FLOPs "
      f"a token), so the run would train 0 updates; raise it or lower config.batch_size"
    )


@dataclasses.dataclass(frozen=True)
class Mesh:
  """The device mesh and the processes: ``mesh_shape`` as given (``-1``
  resolves on the devices: :func:`laplax.sharding.resolve_mesh_shape`), the
  logical axis rules, and ``distributed.*``."""

  mesh_shape: Any
  rules: tuple
  distributed: bool
  coordinator_address: str | None
  num_processes: int | None
  process_id: int | None

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Mesh:
    """``mesh_shape``, ``sharding_rules``, ``distributed.*``.

    Raises:
      ConfigError: the first bad key, as one line with the fix.
    """
    try:
      sharding.parse_mesh_shape(config.mesh_shape)
      rules = sharding.parse_rules(config.sharding_rules or sharding.DEFAULT_RULES)
    except ValueError as e:
      raise ConfigError(f"config.{e}") from None
    dist = config.distributed
    enabled = _bool(config, "distributed.enabled")
    address = dist.coordinator_address
    num = dist.num_processes
    pid = dist.process_id
    if address is not None:
      require(
        isinstance(address, str) and address.rpartition(":")[2].isdigit(),
        f"config.distributed.coordinator_address={address!r} must be 'host:port'",
      )
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
    return cls(config.mesh_shape, rules, enabled, address, num, pid)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """The evaluators of ``config.evals``, in order (their names are checked
  against the task by :func:`laplax.evaluators.registry.validate`, their
  ``eval.*`` settings by the evaluators)."""

  evals: tuple[str, ...]

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Evaluation:
    """The form of ``config.evals`` (:func:`~laplax.config.validation.check_evals`).

    Raises:
      ConfigError: not a string, no name, or a name twice.
    """
    return cls(check_evals(config.evals, None, config.task))


@dataclasses.dataclass(frozen=True)
class Observability:
  """The profiler trace (``profile.*``; ``None``: the key is not there) and the
  Weights & Biases run (``wandb.*``; ``None``: unset)."""

  profile_start_step: int | None
  profile_num_steps: int | None
  wandb_project: str | None
  wandb_entity: str | None
  wandb_name: str | None
  wandb_mode: str | None

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Observability:
    """``profile.*`` and ``wandb.*``.

    Raises:
      ConfigError: the first bad key, as one line with the fix.
    """
    profile = {}
    for key, low, fix in (
      ("start_step", 1, "the first traced training step (steps count from 1)"),
      ("num_steps", 0, "the number of traced steps, 0 for no trace"),
    ):
      value = profile[key] = get(config, f"profile.{key}", None)
      require(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= low),
        f"config.profile.{key}={value!r} must be an integer >= {low}: {fix}",
      )
    wandb = {}
    for key in ("project", "entity", "name"):
      value = wandb[key] = get(config, f"wandb.{key}")
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
    return cls(
      profile["start_step"],
      profile["num_steps"],
      wandb["project"],
      wandb["entity"],
      wandb["name"],
      mode,
    )


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A checked run: the typed sections and the ``ConfigDict`` they came from.

  ``config`` is the complete config (its data section and the task's own
  sections are read from it; a workdir saves it as ``config.json``); ``task``
  is the class of ``config.task``; ``model`` the model spec.
  """

  config: ml_collections.ConfigDict
  task: type
  model: spec_lib.TransformerSpec
  schedule: Schedule
  optim: Optim
  mesh: Mesh
  evaluation: Evaluation
  observability: Observability

  @property
  def data(self) -> ml_collections.ConfigDict:
    """``config.data``: the data set's keys (checked by the task and its data source)."""
    return self.config.data


#: The typed sections of a run spec, by field name (:func:`section`).
SECTIONS = {
  "schedule": Schedule,
  "optim": Optim,
  "mesh": Mesh,
  "evaluation": Evaluation,
  "observability": Observability,
}


def section(run: RunSpec | ml_collections.ConfigDict, name: str) -> Any:
  """The section ``name`` of :data:`SECTIONS` of ``run``: the run spec's own,
  or, for a ``ConfigDict`` (the public functions that users and tests call
  with a config), built from it by the section's ``from_config``.

  Raises:
    ConfigError: a ``ConfigDict`` whose section does not check.
  """
  if isinstance(run, RunSpec):
    return getattr(run, name)
  return SECTIONS[name].from_config(run)


def config_of(run: RunSpec | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The ``ConfigDict`` of ``run``: the run spec's ``config``, or ``run`` itself."""
  return run.config if isinstance(run, RunSpec) else run


def build(
  config: ml_collections.ConfigDict,
  num_devices: int | None = None,
  strict_keys: bool = True,
  *,
  task_class: Any,
  num_processes: int | None = None,
  platform: str | None = None,
) -> RunSpec:
  """Checks every key the trainer reads and returns the :class:`RunSpec`.

  ``task_class`` is the class of ``config.task`` (callers go through
  :func:`laplax.tasks.validate`, which looks it up in the registry): its
  ``validate(config)`` checks the task's own sections, its ``known_keys`` and
  ``attention_lengths`` say which keys exist and which token counts the
  attention sees.

  With ``num_devices`` (the trainer passes ``jax.device_count()``, after the
  multi-process runtime started) the mesh is also checked against the devices
  and the batch, heads and MLP sizes against the mesh
  (:func:`~laplax.config.validation.validate_mesh`). With ``strict_keys``
  (training; ``eval.py`` reads the configs of saved runs) a key that no config
  of the task has (a misspelt key in a config file) is an error.
  ``num_processes`` and ``platform`` (``"tpu"``, ``"gpu"``, ``"cpu"``) stand
  for ``jax.process_count()`` and ``jax.default_backend()``: ``python -m
  laplax.plan`` checks a config for a machine it does not run on.

  Raises:
    ConfigError: the first problem found, as one line naming the key and the fix.
  """
  _check_identity(config, task_class, strict_keys)
  schedule = Schedule.from_config(config)
  for key in ("data.crop_padding", "data.prefetch", "data.num_threads"):
    _optional(config, key, check_int, 0)  # optional: some data sets have not these keys
  evaluation = Evaluation.from_config(config)
  model = check_model(config, platform or jax.default_backend())
  task_class.validate(config)
  try:
    spec_lib.check_splash_lengths(model, task_class.attention_lengths(config))
  except spec_lib.SpecError as e:
    raise ConfigError(f"config.{e}") from None
  for key in ("debug.nan_at_step", "debug.stall_at_step"):
    _optional(config, key, check_int, 1)
  require(
    isinstance(config.check_memory, bool),
    f"config.check_memory={config.check_memory!r} must be True or False",
  )
  optim = Optim.from_config(config)
  check_target_flops(config)
  mesh = Mesh.from_config(config)
  observability = Observability.from_config(config)
  if num_devices is not None:
    validate_mesh(config, num_devices, num_processes, platform=platform, model=model)
  return RunSpec(config, task_class, model, schedule, optim, mesh, evaluation, observability)


def _check_identity(config: ml_collections.ConfigDict, task_class: Any, strict_keys: bool) -> None:
  """What the run is: the required keys, the data set's name, no unknown key
  (with ``strict_keys``), a model family the task trains, the data folders."""
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
