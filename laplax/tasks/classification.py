"""Supervised image classification (ViT): cross-entropy with label smoothing,
Mixup/CutMix (:func:`mixup_cutmix`), top-1 accuracy.

:class:`ClassificationTask` follows the :class:`~laplax.tasks.base.Task`
protocol; it is the ``"classification"`` entry of :data:`laplax.tasks.TASKS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.data.vision import images
from laplax.models import registry
from laplax.models import spec as spec_lib
from laplax.tasks.base import TaskBase, counted, model_spec


def mixup_cutmix(
  rng: jax.Array, images: jax.Array, targets: jax.Array, *, mixup: float, cutmix: float
):
  """Batch-level Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019).

  ``images [B, H, W, C]``, ``targets [B, num_classes]`` (probabilities). When
  both alphas are positive one of the two is chosen per batch with probability
  1/2 (as in DeiT). The batch is mixed with its reverse; for CutMix the target
  weight is the exact area ratio of the pasted box.
  """
  if mixup <= 0 and cutmix <= 0:
    return images, targets
  r_choice, r_lam, r_box = jax.random.split(rng, 3)
  use_cutmix = (
    jax.random.bernoulli(r_choice, 0.5) if mixup > 0 and cutmix > 0 else jnp.asarray(cutmix > 0)
  )
  alpha = jnp.where(use_cutmix, max(cutmix, 1e-6), max(mixup, 1e-6))
  lam = jax.random.beta(r_lam, alpha, alpha)
  h, w = images.shape[1:3]
  cut = jnp.sqrt(1.0 - lam)
  cy, cx = jax.random.uniform(r_box, (2,)) * jnp.array([h, w])
  y0 = jnp.clip(cy - cut * h / 2, 0, h).astype(jnp.int32)
  y1 = jnp.clip(cy + cut * h / 2, 0, h).astype(jnp.int32)
  x0 = jnp.clip(cx - cut * w / 2, 0, w).astype(jnp.int32)
  x1 = jnp.clip(cx + cut * w / 2, 0, w).astype(jnp.int32)
  ys, xs = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
  box = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
  box_lam = 1.0 - box.mean()
  lam = jnp.where(use_cutmix, box_lam, lam)
  flipped = images[::-1]
  mixed = jnp.where(
    use_cutmix,
    jnp.where(box[None, :, :, None], flipped, images),
    lam * images + (1 - lam) * flipped,
  )
  return mixed.astype(images.dtype), lam * targets + (1 - lam) * targets[::-1]


class ClassificationTask(TaskBase):
  """Supervised image classification (ViT / DeiT-3).

  Batches: ``{"image": float32 [B, H, W, C], "label": int32 [B]}``, eval batches
  also ``"mask": float32 [B]`` (1 = real example). Loss: softmax cross-entropy
  with label smoothing, or DeiT-3's binary cross-entropy (``loss.type =
  "sigmoid"``), after optional Mixup/CutMix.

  Args:
    config: the run's config.
    num_classes, image_shape: from the dataset (see :meth:`from_data`).
  """

  family = "vit"
  #: The model families it trains (``config.model.name``): those whose
  #: :attr:`~laplax.models.registry.Family.task` is ``"classification"``.
  families = registry.TrainedBy("classification")
  base_config = staticmethod(defaults.base_config)

  @classmethod
  def data_defaults(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The image pipeline's keys for dataset ``config.data.name``
    (:func:`laplax.data.vision.images.default_config`)."""
    return images.default_config(config.data.name)

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """The loss section: label smoothing in [0, 0.99], ``loss.type`` softmax or
    sigmoid, Mixup/CutMix alphas >= 0.

    Raises:
      ConfigError: the first bad key, with its fix.
    """
    config_lib.check_float(config, "loss.label_smoothing", 0.0, 0.99)
    config_lib.require(
      config.loss.type in ("softmax", "sigmoid"),
      f"config.loss.type={config.loss.type!r} is unknown; use 'softmax' or 'sigmoid'",
    )
    config_lib.check_float(config, "loss.mixup", 0.0)
    config_lib.check_float(config, "loss.cutmix", 0.0)

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    num_classes: int,
    image_shape: tuple[int, int, int],
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    self.config = config
    self.spec = model_spec(config, spec)
    self.num_classes = num_classes
    self.image_shape = tuple(image_shape)
    self.model = registry.get(config.model.name).model(self.spec, num_classes=num_classes)

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
      ConfigError: image size not divisible by the patch size.
    """
    del workdir
    images.prepare(config.data)
    info = images.info(config.data)
    config_lib.check_image_size(config, info.image_shape)
    return cls(config, info.num_classes, info.image_shape, spec=spec)

  def tokens_per_example(self) -> int:
    """The image's patches, plus the class token with ``model.pool='tok'``."""
    return patch_tokens(self.config, self.image_shape)

  def data_limits(self) -> list[tuple]:
    """The batch against the training split's images."""
    return image_split_limits(self.config)

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite, augmented training batches (a grain IterDataset)."""
    return images.train_dataset(
      self.config.data,
      batch_size=self.config.batch_size // process_count,
      seed=self.config.seed,
      process_index=process_index,
      process_count=process_count,
    )

  def eval_batches(self) -> Iterator[dict]:
    """Every example of the eval split once, with a ``mask`` for padding."""
    return images.eval_batches(self.config.data, batch_size=self.config.eval_batch_size)

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""
    return {
      "image": jax.ShapeDtypeStruct((batch_size,) + self.image_shape, jnp.float32),
      "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32),
    }

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters (float32 pytree) from ``rng``."""
    images = jnp.zeros((1,) + self.image_shape, jnp.float32)
    return self.model.init({"params": rng}, images)["params"]

  def loss(
    self,
    params: Any,
    batch: dict,
    rng: jax.Array,
    task_state: Any = None,
    step: jax.Array | None = None,
  ):
    """Training loss (float32 scalar) and ``(metrics, None)`` for one batch."""
    del task_state, step
    lc = self.config.loss
    r_mix, r_drop = jax.random.split(rng)
    targets = jax.nn.one_hot(batch["label"], self.num_classes)
    images, targets = mixup_cutmix(r_mix, batch["image"], targets, mixup=lc.mixup, cutmix=lc.cutmix)
    logits, _ = self.model.apply({"params": params}, images, train=True, rngs={"dropout": r_drop})
    logits = logits.astype(jnp.float32)
    if lc.label_smoothing:
      targets = optax.smooth_labels(targets, lc.label_smoothing)
    if lc.type == "sigmoid":
      loss = optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1).mean()
    else:
      loss = optax.softmax_cross_entropy(logits, targets).mean()
    accuracy = (logits.argmax(-1) == batch["label"]).mean()
    return loss, ({"loss": loss, "accuracy": accuracy}, None)

  def readout(self, state: Any) -> np.ndarray:
    """The classifier's rows ``[num_classes, width]`` (float32)."""
    return np.asarray(state.params["head"]["kernel"]).T

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Sums over the real examples of an eval batch: ``loss``, ``correct``, ``count``.

    The loss is the unsmoothed softmax cross-entropy (nats per example).
    """
    logits, _ = self.model.apply({"params": params}, batch["image"], train=False)
    logits = logits.astype(jnp.float32)
    mask = batch["mask"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    correct = (logits.argmax(-1) == batch["label"]).astype(jnp.float32)
    return {"loss": (loss * mask).sum(), "correct": (correct * mask).sum(), "count": mask.sum()}

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> ``{"accuracy", "loss", "num_examples"}``."""
    count = counted(sums, what="image")
    return {
      "accuracy": float(sums["correct"]) / count,
      "loss": float(sums["loss"]) / count,
      "num_examples": int(count),
    }


def patch_tokens(config: ml_collections.ConfigDict, image_shape) -> int:
  """A ViT's tokens for one image of ``image_shape`` ``(H, W, ...)``: its
  ``model.patch_size`` patches, plus the class token with ``model.pool='tok'``
  (a Swin: its first stage's patches)."""
  m = config.model
  h, w = image_shape[:2]
  return int((h // m.patch_size) * (w // m.patch_size) + (m.get("pool") == "tok"))


def image_split_limits(config: ml_collections.ConfigDict) -> list[tuple]:
  """``batch_size`` against the images of the prepared training split
  (:meth:`~laplax.tasks.base.TaskBase.data_limits` rows).

  Raises:
    DataError: the dataset cannot be read.
  """
  info = images.info(config.data)
  return [
    (
      "the training split",
      info.num_train,
      "images",
      config.data.train_split,
      "batch_size",
      config.batch_size,
    )
  ]
