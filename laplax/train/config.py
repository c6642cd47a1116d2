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
from laplax.data import multicrop
from laplax.data.errors import DataError
from laplax.models import spec as spec_lib

# Keys every config has (the documented contract of train.py).
REQUIRED = (
    "task", "seed", "batch_size", "total_steps", "log_every", "eval_every",
    "checkpoint_every", "model.num_heads", "model.num_laplacian_heads",
    "model.spectral.enabled", "model.spectral.lam", "model.spectral.mode",
    "data.data_dir", "data.source_dir")
# Model keys that decide the parameter tree: a workdir whose saved config
# differs in one of these belongs to another run.
ARCHITECTURE_KEYS = ("task", "model", "data.name", "data.image_size",
                     "data.tokenizer", "data.vocab_size", "data.multicrop.global_size",
                     "dino.out_dim", "dino.hidden_dim", "dino.bottleneck_dim",
                     "dino.head_layers")
# Keys under ARCHITECTURE_KEYS that leave the parameter tree as it is.
NOT_ARCHITECTURE_KEYS = ("model.remat",)


class ConfigError(ValueError):
  """A config that cannot run; the message is one line with the fix."""


def task_names() -> tuple[str, ...]:
  """The names of the tasks of the one registry, :data:`laplax.train.tasks.TASKS`."""
  from laplax.train import tasks  # pylint: disable=import-outside-toplevel
  return tuple(tasks.TASKS)


def _task_class(name: str):
  from laplax.train import tasks  # pylint: disable=import-outside-toplevel
  return tasks.TASKS[name]


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


def _require(cond: bool, message: str) -> None:
  if not cond:
    raise ConfigError(message)


def _int(config, key, minimum):
  value = get(config, key)
  _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
           f"config.{key}={value!r} must be an integer >= {minimum}")
  return value


def _float(config, key, minimum, maximum=float("inf"), open_min=False):
  value = get(config, key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  ok = ok and math.isfinite(value)
  ok = ok and (value > minimum if open_min else value >= minimum) and value <= maximum
  bound = f"> {minimum}" if open_min else f">= {minimum}"
  if maximum != float("inf"):
    bound += f" and <= {maximum}"
  _require(ok, f"config.{key}={value!r} must be a finite number {bound}")
  return value


def unknown_keys(config: ml_collections.ConfigDict) -> list[str]:
  """Dotted keys of ``config`` that no laplax config of its task has.

  The reference is the task's base config (``base_config`` of its class in
  :data:`laplax.train.tasks.TASKS`, from :mod:`laplax.train.defaults`), which
  holds every key the trainer reads; a language model on FineWeb-Edu
  (``data.name="fineweb_edu"``) also has the keys of
  :func:`laplax.data.fineweb.default_config`.
  """
  if config.get("task") not in task_names():
    return []
  known = utils.flatten_dotted(_task_class(config.task).base_config().to_dict(),
                               keep_empty=True)
  if config.task == "lm" and get(config, "data.name", "") == "fineweb_edu":
    from laplax.data import fineweb  # pylint: disable=import-outside-toplevel
    known.update(utils.flatten_dotted({"data": fineweb.default_config().to_dict()},
                                      keep_empty=True))
  if config.task == "lm" and get(config, "data.name", "") in ("chat_mid", "chat_sft"):
    from laplax.data import chat_mixture  # pylint: disable=import-outside-toplevel
    known.update(utils.flatten_dotted({"data": chat_mixture.default_config().to_dict()},
                                      keep_empty=True))
  sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
  return sorted(k for k in utils.flatten_dotted(config.to_dict(), keep_empty=True)
                if k not in known and k not in sections)


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None,
             strict_keys: bool = True) -> None:
  """Checks types, ranges and consistency of every key the trainer reads.

  With ``num_devices`` (the trainer passes ``jax.device_count()``, after the
  multi-process runtime started) the mesh is also checked against the devices
  and the batch, heads and MLP sizes against the mesh (:func:`validate_mesh`).
  With ``strict_keys`` (training; ``eval.py`` reads the configs of saved runs) a
  key that no config of the task has (:func:`unknown_keys`, e.g. a misspelt
  key in a config file) is an error.

  Raises:
    ConfigError: the first problem found, as one line naming the key and the fix.
  """
  for key in REQUIRED:
    try:
      get(config, key)
    except KeyError:
      raise ConfigError(f"config.{key} is missing; every laplax config defines it "
                        f"(see configs/vit_fashion_mnist.py)") from None
  _require(config.task in task_names(),
           f"config.task={config.task!r} is unknown; use one of {', '.join(task_names())}")
  if strict_keys:
    extra = unknown_keys(config)
    _require(not extra,
             f"config.{extra[0] if extra else ''} is not a key of a laplax "
             f"{config.task} config; check its spelling against "
             f"laplax/train/defaults.py" + (f" ({len(extra)} such keys)" if len(extra) > 1 else ""))
  family = _task_class(config.task).family
  _require(get(config, "model.name", None) == family,
           f"config.model.name={get(config, 'model.name', None)!r} does not fit "
           f"task {config.task!r}; use model.name={family!r}")
  for key in ("data.data_dir", "data.source_dir"):
    value = get(config, key)
    _require(isinstance(value, str) and value.strip() != "",
             f"config.{key}={value!r} must be a directory path; give a folder, "
             f"e.g. ~/tensorflow_datasets")
  _int(config, "seed", 0)
  _int(config, "batch_size", 1)
  _int(config, "total_steps", 0)
  for key in ("log_every", "eval_every", "checkpoint_every"):
    _int(config, key, 1)
  _int(config, "eval_batch_size", 1)
  init_from = get(config, "init_from", "") or ""
  _require(isinstance(init_from, str),
           f"config.init_from={init_from!r} must be the path of a laplax workdir")
  if init_from:
    _require(os.path.isdir(os.path.join(os.path.expanduser(init_from), "checkpoints")),
             f"config.init_from={init_from} is not a laplax workdir (no checkpoints/ "
             f"in it); give a train.py or laplax.convert --workdir")
  if get(config, "keep_checkpoints", None) is not None:
    _int(config, "keep_checkpoints", 1)
  verify = get(config, "checkpoint_verify", True)
  _require(isinstance(verify, bool),
           f"config.checkpoint_verify={verify!r} must be True or False")
  for key in ("data.crop_padding", "data.prefetch", "data.num_threads"):
    if get(config, key, None) is not None:
      _int(config, key, 0)
  exclude = get(config, "optim.weight_decay_exclude", ())
  _require(isinstance(exclude, (list, tuple)) and all(isinstance(p, str) for p in exclude),
           f"config.optim.weight_decay_exclude={exclude!r} must be a tuple of "
           f"parameter-name regexes")

  _validate_model(config)
  if config.task == "classification":
    _validate_classification(config)
  if config.task == "dino":
    _validate_dino(config)

  o = config.optim
  _float(config, "optim.lr", 0.0, open_min=True)
  _float(config, "optim.weight_decay", 0.0)
  _float(config, "optim.b1", 0.0, 1.0)
  _float(config, "optim.b2", 0.0, 1.0)
  _int(config, "optim.warmup_steps", 0)
  if o.grad_clip is not None:
    _float(config, "optim.grad_clip", 0.0, open_min=True)
  _float(config, "optim.min_lr_ratio", 0.0, 1.0)
  skip = get(config, "optim.skip_nonfinite", False)
  _require(isinstance(skip, bool),
           f"config.optim.skip_nonfinite={skip!r} must be True or False")
  for key in ("debug.nan_at_step", "debug.stall_at_step"):
    if get(config, key, None) is not None:
      _int(config, key, 1)
  if get(config, "optim.weight_decay_end", None) is not None:
    _float(config, "optim.weight_decay_end", 0.0)
  _validate_muon(config)
  _validate_memory(config)
  _validate_sharding(config)
  _validate_observability(config)
  if num_devices is not None:
    validate_mesh(config, num_devices)


def _validate_muon(config):
  """``optim.optimizer``, ``optim.schedule`` and the Muon / nanochat keys
  (missing keys: AdamW with warm-up + cosine, as before)."""
  name = get(config, "optim.optimizer", "adamw")
  _require(name in ("adamw", "muon", "nanochat"),
           f"config.optim.optimizer={name!r} is unknown; use 'adamw', 'muon' or 'nanochat'")
  schedule = get(config, "optim.schedule", "cosine")
  _require(schedule in ("cosine", "warmdown", "progress"),
           f"config.optim.schedule={schedule!r} is unknown; use 'cosine', 'warmdown' or "
           f"'progress'")
  if get(config, "optim.schedule_steps", None) is not None:
    _int(config, "optim.schedule_steps", 1)
  if get(config, "optim.warmdown_ratio", None) is not None:
    _float(config, "optim.warmdown_ratio", 0.0, 1.0)
  if get(config, "optim.adam_eps", None) is not None:
    _float(config, "optim.adam_eps", 0.0)
  if get(config, "optim.muon_momentum_start", None) is not None:
    _float(config, "optim.muon_momentum_start", 0.0, 1.0)
  if get(config, "optim.muon_momentum_ramp_steps", None) is not None:
    _int(config, "optim.muon_momentum_ramp_steps", 0)
  if get(config, "optim.muon_lr", None) is not None:
    _float(config, "optim.muon_lr", 0.0, open_min=True)
  if get(config, "optim.muon_momentum", None) is not None:
    _float(config, "optim.muon_momentum", 0.0, 1.0)
  if get(config, "optim.muon_weight_decay", None) is not None:
    _float(config, "optim.muon_weight_decay", 0.0)
  for key in ("optim.embedding_lr", "optim.unembedding_lr"):
    if get(config, key, None) is not None:
      _float(config, key, 0.0, open_min=True)


def _validate_memory(config):
  """``check_memory`` (missing: True), ``optim.grad_accum_steps`` (``None``
  means 1), ``optim.grad_accum_unroll``."""
  check_memory = get(config, "check_memory", True)
  _require(isinstance(check_memory, bool),
           f"config.check_memory={check_memory!r} must be True or False")
  unroll = get(config, "optim.grad_accum_unroll", False)
  _require(isinstance(unroll, bool),
           f"config.optim.grad_accum_unroll={unroll!r} must be True or False")
  if get(config, "optim.grad_accum_steps", None) is None:
    return
  accum = _int(config, "optim.grad_accum_steps", 1)
  _require(config.batch_size % accum == 0,
           f"config.batch_size={config.batch_size} is not divisible by "
           f"config.optim.grad_accum_steps={accum} (the global batch is cut into "
           f"that many micro-batches); use a multiple of {accum} or set "
           f"--config.optim.grad_accum_steps=1")


WANDB_MODES = ("online", "offline", "disabled")


def _validate_observability(config):
  """``profile.*``, ``wandb.*`` and the GPT's ``eval.sample_*`` (optional keys)."""
  for key, low, fix in (
      ("profile.start_step", 1, "the first traced training step (steps count from 1)"),
      ("profile.num_steps", 0, "the number of traced steps, 0 for no trace"),
      ("eval.sample_tokens", 0, "tokens sampled at each evaluation, 0 for none"),
      ("eval.sample_prompt_tokens", 1, "validation tokens that prompt the sample")):
    value = get(config, key, None)
    if value is None:  # a config saved before the key existed
      continue
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
             f"config.{key}={value!r} must be an integer >= {low}: {fix}")
  for key in ("project", "entity", "name"):
    value = get(config, f"wandb.{key}", None)
    _require(value is None or (isinstance(value, str) and value.strip()),
             f"config.wandb.{key}={value!r} must be a non-empty string (or unset)")
  mode = get(config, "wandb.mode", None)
  _require(mode is None or mode in WANDB_MODES,
           f"config.wandb.mode={mode!r} is unknown; use one of "
           f"{', '.join(map(repr, WANDB_MODES))} (or leave it unset)")


def _validate_sharding(config):
  """``mesh_shape``, ``sharding_rules``, ``distributed.*`` (optional keys)."""
  try:
    sharding.parse_mesh_shape(get(config, "mesh_shape", sharding.DEFAULT_MESH_SHAPE))
    sharding.parse_rules(get(config, "sharding_rules", None) or sharding.DEFAULT_RULES)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  dist = get(config, "distributed", None)
  if dist is None:
    return
  _require(isinstance(dist.get("enabled", False), bool),
           f"config.distributed.enabled={dist.get('enabled')!r} must be True or False")
  address = dist.get("coordinator_address", None)
  if address is None:
    return
  _require(isinstance(address, str) and address.rpartition(":")[2].isdigit(),
           f"config.distributed.coordinator_address={address!r} must be 'host:port'")
  num = dist.get("num_processes", None)
  pid = dist.get("process_id", None)
  _require(isinstance(num, int) and not isinstance(num, bool) and num >= 1
           and isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < num,
           f"config.distributed.num_processes={num!r} and process_id={pid!r} must be "
           f"integers with 0 <= process_id < num_processes when coordinator_address "
           f"is set")


def validate_mesh(config: ml_collections.ConfigDict, num_devices: int,
                  num_processes: int | None = None) -> tuple[int, int, int]:
  """Checks ``config.mesh_shape`` against the devices and the model and batch sizes.

  The mesh must use exactly ``num_devices`` devices; ``batch_size`` (per
  micro-batch with ``optim.grad_accum_steps``) must be divisible by the
  data-parallel size (the mesh axes of the logical axis ``batch``, by default
  ``data * fsdp``), which must be a multiple of the number of processes (each
  process loads its own rows); ``model.num_heads`` and ``model.mlp_dim`` must be
  divisible by the tensor-parallel size.

  Returns:
    The resolved mesh shape ``(data, fsdp, tensor)``.

  Raises:
    ConfigError: the first mismatch, as one line with the fix.
  """
  value = get(config, "mesh_shape", sharding.DEFAULT_MESH_SHAPE)
  try:
    shape = sharding.resolve_mesh_shape(value, num_devices)
  except ValueError as e:
    hint = ("; for N fake CPU devices set XLA_FLAGS=--xla_force_host_platform_"
            "device_count=N" if jax.default_backend() == "cpu" else "")
    raise ConfigError(f"config.{e}{hint}") from None
  rules = sharding.rules_from_config(config)
  shown = "(" + ",".join(map(str, shape)) + ")"
  dp = sharding.axis_size(shape, rules, "batch")
  accum = get(config, "optim.grad_accum_steps", 1) or 1
  per_step = config.batch_size // accum
  what = (f"the micro-batch batch_size/grad_accum_steps={per_step}" if accum > 1
          else f"config.batch_size={config.batch_size}")
  _require(per_step % dp == 0,
           f"{what} is not divisible by the data-parallel size {dp} (batch axes "
           f"{'*'.join(sharding.mesh_axes(rules, 'batch')) or 'none'} of mesh_shape="
           f"{shown}); choose a batch size that is a multiple of {dp * accum}")
  processes = jax.process_count() if num_processes is None else num_processes
  _require(dp % processes == 0,
           f"the data-parallel size {dp} of mesh_shape={shown} is not a multiple of "
           f"the {processes} processes; each process must hold its own rows of the "
           f"batch")
  model = spec_lib.from_config(config.model)   # mlp_dim None -> 4 * width
  sizes = {"num_heads": model.attention.num_heads, "mlp_dim": model.mlp_dim}
  for name, key in (("heads", "num_heads"), ("mlp", "mlp_dim")):
    tp = sharding.axis_size(shape, rules, name)
    size = sizes[key]
    _require(size % tp == 0,
             f"config.model.{key}={size} is not divisible by the tensor-parallel size "
             f"{tp} of mesh_shape={shown}; choose a mesh whose tensor size divides it")
  return shape


def _validate_model(config):
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
    _require(jax.default_backend() == "gpu",
             f"config.model.implementation='cudnn' needs an NVIDIA GPU but JAX runs "
             f"on {jax.default_backend()!r}; use 'xla'")
  image_size = get(config, "data.image_size", None)
  if m.name == "vit" and image_size is not None:
    _int(config, "data.image_size", 1)
    _require(image_size % m.patch_size == 0,
             f"config.data.image_size={image_size} is not divisible by "
             f"config.model.patch_size={m.patch_size}; change one of them")
  if config.get("task", None) != "dino":  # DINO's crops: after their own check
    _check_splash(config, model_spec)


def _check_splash(config, model_spec) -> None:
  """``model.implementation='splash'`` against the token counts known from
  the config (:func:`attention_lengths`)."""
  try:
    spec_lib.check_splash_lengths(model_spec, attention_lengths(config))
  except spec_lib.SpecError as e:
    raise ConfigError(f"config.{e}") from None


def attention_lengths(config: ml_collections.ConfigDict,
                      image_side: int | None = None) -> tuple[int, ...]:
  """Token counts the model's self-attention sees: the GPT's context
  (``model.max_length``); a ViT's patches of ``data.image_size`` (else of
  ``image_side``, the dataset's, when given) plus the class token with
  ``model.pool='tok'``; for DINO also the global and local crops. Counts
  that depend on an unknown image size are left out."""
  m = config.model
  if m.name == "gpt":
    return (int(m.max_length),)
  patches = lambda side: (int(side) // m.patch_size) ** 2 + (m.get("pool", "tok") == "tok")
  sides = [get(config, "data.image_size", None) or image_side]
  if config.get("task", None) == "dino":
    mc = config.data.multicrop
    sides = [mc.global_size] + ([mc.local_size] if mc.num_local else []) + sides
  return tuple(dict.fromkeys(patches(s) for s in sides if s))


def attention_kernel(config: ml_collections.ConfigDict, task: Any = None,
                     say: Any = None) -> str:
  """The name of the attention kernel(s) the run uses (``"xla"``,
  ``"splash"``, ``"cudnn"``, ``"splash+xla"``...): :func:`laplax.kernels.describe`
  of :func:`attention_lengths` (with ``task.image_shape`` when the task has
  one) on the current platform (inside :func:`laplax.sharding.context`: the
  mesh's). ``say``, if given, is called with the one line that says which
  kernel runs and why (``train.py`` prints it at the start)."""
  from laplax import kernels  # pylint: disable=import-outside-toplevel
  spec = spec_lib.from_config(config.model)
  side = (getattr(task, "image_shape", None) or (None,))[0]
  name, line = kernels.describe(spec.attention.implementation,
                                attention_lengths(config, side),
                                head_dim=spec.head_dim, dtype=spec.dtype)
  if say is not None:
    say(line)
  return name


def _validate_classification(config):
  """The loss section of a classification config."""
  _float(config, "loss.label_smoothing", 0.0, 0.99)
  _require(config.loss.type in ("softmax", "sigmoid"),
           f"config.loss.type={config.loss.type!r} is unknown; use 'softmax' or 'sigmoid'")
  _float(config, "loss.mixup", 0.0)
  _float(config, "loss.cutmix", 0.0)


def _validate_dino(config):
  """Multi-crop, head, temperatures and momenta of a DINO config."""
  patch = config.model.patch_size
  _require(config.model.pool == "tok",
           f"config.model.pool={config.model.pool!r}: DINO trains on the class "
           f"token; use model.pool='tok'")
  try:  # Every data.multicrop key; the one check lives with the pipeline.
    multicrop.check_multicrop(get(config, "data.multicrop"), patch_size=patch)
  except DataError as e:
    raise ConfigError(str(e)) from None
  _check_splash(config, spec_lib.from_config(config.model))

  _int(config, "dino.out_dim", 2)
  for key in ("hidden_dim", "bottleneck_dim", "head_layers"):
    _int(config, f"dino.{key}", 1)
  for key in ("student_temp", "warmup_teacher_temp", "teacher_temp"):
    _float(config, f"dino.{key}", 0.0, open_min=True)
  _float(config, "dino.momentum_teacher", 0.0, 1.0)
  _float(config, "dino.center_momentum", 0.0, 1.0)
  _int(config, "dino.warmup_teacher_temp_steps", 0)
  _int(config, "dino.freeze_last_layer_steps", 0)
  _int(config, "eval.knn_k", 1)
  _float(config, "eval.knn_temperature", 0.0, open_min=True)
  _int(config, "eval.pca_images", 0)
  _require(isinstance(get(config, "eval.linear_probe"), bool),
           f"config.eval.linear_probe={get(config, 'eval.linear_probe')!r} must be "
           f"True or False")
  validate_segmentation(config)


def validate_segmentation(config):
  """The ``eval.segmentation*`` keys of a DINO config (a run saved before they
  existed lacks them: eval.py then uses the defaults).

  Raises:
    ConfigError: the first bad key, with its fix.
  """
  from laplax.data import segmentation  # pylint: disable=import-outside-toplevel
  on = get(config, "eval.segmentation", None)
  _require(on is None or isinstance(on, bool),
           f"config.eval.segmentation={on!r} must be True or False")
  dataset = get(config, "eval.segmentation_dataset", None)
  if dataset is not None:
    _require(dataset in segmentation.DATASETS,
             f"config.eval.segmentation_dataset={dataset!r} is unknown; use one of "
             f"{', '.join(map(repr, segmentation.DATASETS))}")
    _require(dataset != segmentation.FASHION_CANVASES
             or segmentation.is_fashion_mnist(config.data),
             f"config.eval.segmentation_dataset='fashion_canvases' builds canvases from "
             f"the run's Fashion-MNIST images, but config.data.name={config.data.name!r}; "
             f"use 'auto' or 'scene_parse150'")
    directory = get(config, "eval.segmentation_dir", None)
    _require(dataset != segmentation.ADE20K or (isinstance(directory, str) and directory),
             "config.eval.segmentation_dataset='ade20k' reads ADEChallengeData2016 from a "
             "local directory; give --config.eval.segmentation_dir=DIR (images/ and "
             "annotations/ in it)")
  for key, low in (("segmentation_train_images", 2), ("segmentation_test_images", 1),
                   ("segmentation_steps", 1), ("segmentation_figure_images", 0),
                   ("segmentation_image_size", 0), ("segmentation_batch_size", 1),
                   ("segmentation_layers", 1)):
    if get(config, f"eval.{key}", None) is not None:
      _int(config, f"eval.{key}", low)
  size, p = get(config, "eval.segmentation_image_size", None), get(config, "model.patch_size", 1)
  _require(not size or not p or size % p == 0,
           f"config.eval.segmentation_image_size={size} is not divisible by "
           f"config.model.patch_size={p}; give a multiple of it (0: the backbone's size)")
  if get(config, "eval.segmentation_lr", None) is not None:
    _float(config, "eval.segmentation_lr", 0.0, open_min=True)
  layers = get(config, "eval.segmentation_layers", None)
  _require(layers is None or layers <= config.model.depth,
           f"config.eval.segmentation_layers={layers} is more than the model's "
           f"{config.model.depth} blocks")


def check_image_size(config: ml_collections.ConfigDict, image_shape) -> None:
  """Checks the data's image size ``(H, W, C)`` against ``model.patch_size``.

  Raises:
    ConfigError: height or width not divisible by the patch size.
  """
  h, w = image_shape[:2]
  p = config.model.patch_size
  _require(h % p == 0 and w % p == 0,
           f"image size {h}x{w} of dataset {config.data.name!r} is not divisible by "
           f"config.model.patch_size={p}; choose a patch size that divides it or "
           f"set config.data.image_size")


def architecture_diff(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """Dotted keys under :data:`ARCHITECTURE_KEYS` where ``saved`` and ``config`` differ.

  Keys in :data:`NOT_ARCHITECTURE_KEYS` (``model.remat``) are ignored, and so
  are ``model.spectral.*`` when spectral conditioning is off on both sides
  (the layout of a correction that is not applied changes nothing). A model
  key missing on one side has the model spec's default
  (:func:`laplax.models.spec.config_defaults`), so a run saved before a model
  option existed resumes with the option at its default.
  """
  a = utils.flatten_dotted(saved)
  b = utils.flatten_dotted(json.loads(config.to_json()))
  family = get(config, "model.name", None)
  if family in spec_lib.FAMILIES:
    defaults = utils.flatten_dotted({"model": spec_lib.config_defaults(family)})
    for k, v in defaults.items():
      a.setdefault(k, v)
      b.setdefault(k, v)
  keys = [k for k in sorted(set(a) | set(b))
          if any(k == p or k.startswith(p + ".") for p in ARCHITECTURE_KEYS)
          and k not in NOT_ARCHITECTURE_KEYS]
  if not a.get("model.spectral.enabled") and not b.get("model.spectral.enabled"):
    keys = [k for k in keys if not k.startswith("model.spectral.")]
  return [k for k in keys if a.get(k) != b.get(k)]
