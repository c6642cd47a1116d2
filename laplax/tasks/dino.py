"""DINO self-distillation (Caron et al. 2021): the student/teacher loss, the
teacher's EMA and centring, and the teacher's features that the evaluators
of the backbone read (k-NN, linear probe, segmentation:
:mod:`laplax.evaluators.registry`).

:class:`DINOTask` follows the :class:`~laplax.tasks.base.Task` protocol; it
is the ``"dino"`` entry of :data:`laplax.tasks.TASKS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import optim, utils
from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.data.errors import DataError
from laplax.data.vision import images, multicrop
from laplax.models import dino
from laplax.models import spec as spec_lib
from laplax.models.vit import ViT
from laplax.tasks import classification
from laplax.tasks.base import TaskBase, model_spec


class DINOTask(TaskBase):
  """Self-supervised DINO (Caron et al. 2021) on images, without labels.

  Batches: ``{"global": float32 [G, B, H, W, C], "local": float32 [L, B, h, w,
  C]}`` (multi-crop views, see ``images.multicrop_train_dataset``). The trained
  parameters are the student's (``{"backbone", "head"}``); the task state is
  ``{"teacher": the teacher's parameters, "center": float32 [out_dim]}``.
  Schedules (per step): teacher temperature linear from
  ``dino.warmup_teacher_temp`` to ``dino.teacher_temp`` over
  ``dino.warmup_teacher_temp_steps``, then constant; teacher momentum a
  half-cosine from ``dino.momentum_teacher`` to 1 over ``total_steps``; the
  last head layer frozen for the first ``dino.freeze_last_layer_steps``.
  Evaluation (labels used only there): the evaluators of ``config.evals``
  (k-NN, linear probe, raw-pixel k-NN, segmentation probe, patch PCA;
  :mod:`laplax.evaluators.probes`, :mod:`laplax.evaluators.dino_segmentation`)
  on the teacher's features
  (:meth:`features`).

  Args:
    config: the run's config.
    num_classes, image_shape: from the dataset (see :meth:`from_data`);
      ``num_classes`` is only for evaluation.
  """

  family = "vit"
  base_config = staticmethod(defaults.dino_base_config)
  analysis_loss_unavailable = (
    "DINO's loss needs multi-crop training views and the teacher; the eval split has single images"
  )

  @classmethod
  def data_defaults(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The image pipeline's keys for dataset ``config.data.name``
    (:func:`laplax.data.vision.images.default_config`) with its multi-crop views
    (:func:`laplax.data.vision.multicrop.default_multicrop_config`)."""
    data = images.default_config(config.data.name)
    data.multicrop = multicrop.default_multicrop_config(config.data.name)
    return data

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Multi-crop (:func:`laplax.data.vision.multicrop.check_multicrop`), head,
    temperatures, momenta and the k-NN and PCA settings of a DINO config
    (the segmentation probe checks its own: :mod:`laplax.evaluators.registry`).

    Raises:
      ConfigError: the first bad key, with its fix.
    """
    config_lib.require(
      config.model.pool == "tok",
      f"config.model.pool={config.model.pool!r}: DINO trains on the class "
      f"token; use model.pool='tok'",
    )
    try:  # Every data.multicrop key; the one check lives with the pipeline.
      multicrop.check_multicrop(
        config_lib.get(config, "data.multicrop"), patch_size=config.model.patch_size
      )
    except DataError as e:
      raise config_lib.ConfigError(str(e)) from None
    config_lib.check_int(config, "dino.out_dim", 2)
    for key in ("hidden_dim", "bottleneck_dim", "head_layers"):
      config_lib.check_int(config, f"dino.{key}", 1)
    for key in ("student_temp", "warmup_teacher_temp", "teacher_temp"):
      config_lib.check_float(config, f"dino.{key}", 0.0, open_min=True)
    config_lib.check_float(config, "dino.momentum_teacher", 0.0, 1.0)
    config_lib.check_float(config, "dino.center_momentum", 0.0, 1.0)
    config_lib.check_int(config, "dino.warmup_teacher_temp_steps", 0)
    config_lib.check_int(config, "dino.freeze_last_layer_steps", 0)

  @classmethod
  def upgrade_saved(cls, config: ml_collections.ConfigDict) -> None:
    """A config without ``evals`` (a run saved before it existed) gets it
    from the switches it replaced (:meth:`saved_evals`), which are then
    dropped. A config with both keeps them, for validation to refuse
    (:data:`laplax.config.validation.REPLACED_KEYS`)."""
    if "evals" in config:
      return
    config.evals = cls.saved_evals(config)
    for key in ("linear_probe", "segmentation"):
      if key in config.get("eval", {}):
        del config.eval[key]

  @classmethod
  def saved_evals(cls, config: ml_collections.ConfigDict) -> str:
    """``config.evals`` for a run saved before the key existed: every DINO
    evaluator but those its switches turned off (``eval.linear_probe=False``,
    ``eval.segmentation=False``, the keys ``evals`` replaced)."""
    e = config.get("eval", {})
    off = {
      name
      for name, key in (("linear_probe", "linear_probe"), ("segmentation", "segmentation"))
      if e.get(key) is False
    }
    return ",".join(n for n in cls.base_config().evals.split(",") if n not in off)

  @classmethod
  def attention_lengths(
    cls, config: ml_collections.ConfigDict, image_side: int | None = None
  ) -> tuple[int, ...]:
    """The global and local crops' token counts, then the evaluation images'
    (:func:`laplax.config.validation.attention_lengths`)."""
    mc = config.data.multicrop
    crops = (mc.global_size,) + ((mc.local_size,) if mc.num_local else ())
    return config_lib.attention_lengths(config, image_side, crops)

  batch_axis = 1  # examples are the second axis of the views [V, B, ...]

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    num_classes: int,
    image_shape: tuple[int, int, int],
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    self.config = config
    self.spec = spec = model_spec(config, spec)
    self.num_classes = num_classes
    self.image_shape = tuple(image_shape)
    d, mc = config.dino, config.data.multicrop
    grid = (mc.global_size // spec.patch_size,) * 2
    head = dino.DINOHead(
      out_dim=d.out_dim,
      hidden_dim=d.hidden_dim,
      bottleneck_dim=d.bottleneck_dim,
      num_layers=d.head_layers,
    )
    self.student = dino.DINO(backbone=ViT(spec, posemb_grid=grid), head=head)
    teacher_spec = dataclasses.replace(spec, drop_path=0.0)
    self.teacher = dino.DINO(backbone=ViT(teacher_spec, posemb_grid=grid), head=head)
    self.model = self.student
    self.teacher_temp = optax.linear_schedule(
      d.warmup_teacher_temp, d.teacher_temp, max(d.warmup_teacher_temp_steps, 1)
    )
    self.momentum = optim.cosine_ramp(d.momentum_teacher, 1.0, config.total_steps)
    self.weight_decay = optim.weight_decay_schedule(config.optim, config.total_steps)
    self._embed = jax.jit(self._backbone_features)  # compiled once per task

  def _backbone_features(self, backbone_params: Any, images: jax.Array):
    """Class-token features ``[N, width]`` and final-norm patch tokens."""
    feats, out = self.teacher.backbone.apply({"params": backbone_params}, images, train=False)
    return feats, out["encoded"][:, 1:]

  @classmethod
  def from_data(
    cls,
    config: ml_collections.ConfigDict,
    workdir: str | None,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    """Prepares the image dataset and builds the task (writes nothing in workdir).

    Raises:
      DataError: dataset missing or unreadable.
    """
    del workdir
    images.prepare(config.data)
    info = images.info(config.data)
    return cls(config, info.num_classes, info.image_shape, spec=spec)

  def tokens_per_example(self) -> int:
    """All of the student's views: ``num_global`` global and ``num_local``
    local crops, each its patches plus the class token."""
    mc = self.config.data.multicrop
    return mc.num_global * classification.patch_tokens(
      self.config, (mc.global_size,) * 2
    ) + mc.num_local * classification.patch_tokens(self.config, (mc.local_size,) * 2)

  def data_limits(self) -> list[tuple]:
    """The batch and the k-NN bank against the training split, the PCA
    figure's images against the evaluation split."""
    info = images.info(self.config.data)
    e, train = self.config.eval, self.config.data.train_split
    return classification.image_split_limits(self.config) + [
      (
        "the k-NN bank (the training split)",
        info.num_train,
        "images",
        train,
        "eval.knn_k",
        e.knn_k,
      ),
      (
        "the evaluation split",
        info.num_eval,
        "images",
        self.config.data.eval_split,
        "eval.pca_images",
        e.pca_images,
      ),
    ]

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite multi-crop batches (a grain IterDataset)."""
    return images.multicrop_train_dataset(
      self.config.data,
      self.config.data.multicrop,
      batch_size=self.config.batch_size // process_count,
      seed=self.config.seed,
      process_index=process_index,
      process_count=process_count,
    )

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""
    mc, c = self.config.data.multicrop, self.image_shape[-1]
    return {
      "global": jax.ShapeDtypeStruct(
        (mc.num_global, batch_size, mc.global_size, mc.global_size, c), jnp.float32
      ),
      "local": jax.ShapeDtypeStruct(
        (mc.num_local, batch_size, mc.local_size, mc.local_size, c), jnp.float32
      ),
    }

  def init(self, rng: jax.Array) -> Any:
    """The student's initial parameters ``{"backbone", "head"}`` from ``rng``."""
    spec = self.batch_spec(1)
    crops = jnp.zeros(spec["global"].shape, jnp.float32)
    return self.student.init({"params": rng}, crops)["params"]

  def init_task_state(self, params: Any) -> dict:
    """The teacher starts as a copy of the student; the centre at 0."""
    return {
      "teacher": jax.tree_util.tree_map(jnp.array, params),
      "center": jnp.zeros((self.config.dino.out_dim,), jnp.float32),
    }

  def loss(self, params: Any, batch: dict, rng: jax.Array, task_state: dict, step: jax.Array):
    """DINO loss (float32) and ``(metrics, teacher logits [G, B, K])``.

    Metrics: ``loss``, the collapse monitor (``teacher_entropy``,
    ``teacher_marginal_entropy``, ``kl_teacher_student``, nats) and the
    schedules' values at ``step``.
    """
    d = self.config.dino
    teacher_logits, _ = self.teacher.apply(
      {"params": task_state["teacher"]}, batch["global"], train=False
    )
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    student_logits, _ = self.student.apply(
      {"params": params}, batch["global"], batch["local"], train=True, rngs={"dropout": rng}
    )
    temp = self.teacher_temp(step)
    loss = dino.dino_loss(
      student_logits,
      teacher_logits,
      task_state["center"],
      student_temp=d.student_temp,
      teacher_temp=temp,
    )
    stats = dino.collapse_statistics(
      student_logits,
      teacher_logits,
      task_state["center"],
      student_temp=d.student_temp,
      teacher_temp=temp,
    )
    wd = self.weight_decay(step) if callable(self.weight_decay) else self.weight_decay
    metrics = dict(
      stats, loss=loss, teacher_temp=temp, teacher_momentum=self.momentum(step), weight_decay=wd
    )
    return loss, (metrics, teacher_logits)

  def mask_updates(self, updates: Any, step: jax.Array) -> Any:
    """Zeroes the head's last layer updates during ``freeze_last_layer_steps``."""
    frozen = step < self.config.dino.freeze_last_layer_steps

    def mask(path, u):
      frozen_leaf = utils.path_str(path) == "head/last_layer"
      return jnp.where(frozen, jnp.zeros_like(u), u) if frozen_leaf else u

    return jax.tree_util.tree_map_with_path(mask, updates)

  def update_task_state(
    self, task_state: dict, params: Any, teacher_logits: jax.Array, step: jax.Array
  ) -> dict:
    """Teacher EMA with the updated student, then the centre EMA (Eq. 4)."""
    return {
      "teacher": dino.update_teacher(task_state["teacher"], params, self.momentum(step)),
      "center": dino.update_center(
        task_state["center"], teacher_logits, self.config.dino.center_momentum
      ),
    }

  def monitor(self, record: dict) -> str | None:
    """A warning line when the logged collapse statistics show a collapse."""
    kind = dino.collapsed(record, self.config.dino.out_dim)
    if kind is None:
      return None
    return (
      f"DINO outputs look collapsed ({kind}): teacher_entropy="
      f"{record['teacher_entropy']:.3f}, marginal="
      f"{record['teacher_marginal_entropy']:.3f}, kl="
      f"{record['kl_teacher_student']:.2e} nats"
    )

  def eval_batches(self, split: str | None = None) -> Iterator[dict]:
    """Every image of ``split`` (default ``data.eval_split``) once, unaugmented,
    with its label and a ``mask`` for padding (labels are used only in evaluation)."""
    return images.eval_batches(
      self.config.data,
      batch_size=self.config.eval_batch_size,
      **({"split": split} if split else {}),
    )

  def backbone(self, state: Any) -> tuple[nn.Module, Any]:
    """The teacher's backbone (the network DINO evaluates) and its parameters."""
    return self.teacher.backbone, state.task_state["teacher"]["backbone"]

  def features(self, params: Any, split: str, *, with_tokens: int = 0):
    """Class-token features of every image of ``split`` (no augmentation).

    ``params`` are the backbone's (see :meth:`backbone`).

    Returns:
      ``(features float32 [N, width], labels int32 [N], images, tokens)``:
      ``images`` float32 ``[with_tokens, H, W, C]`` and the final-norm patch
      tokens float32 ``[with_tokens, patches, width]`` of the first
      ``with_tokens`` images (``None`` if 0).
    """
    feats, labels, first, tokens = [], [], None, None
    for batch in self.eval_batches(split):
      f, t = self._embed(params, batch["image"])
      n = int(batch["mask"].sum())
      feats.append(jax.device_get(f)[:n])
      labels.append(batch["label"][:n])
      if with_tokens and first is None:
        first = batch["image"][:with_tokens]
        tokens = jax.device_get(t)[:with_tokens]
    return (np.concatenate(feats).astype(np.float32), np.concatenate(labels), first, tokens)
