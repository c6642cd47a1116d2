"""Tasks: what the one training loop needs to know about a model and its loss.

A task builds its model from the config (through the model spec,
:func:`laplax.models.spec.from_config`), says what a batch looks like, and
gives the training loss and the evaluation. Every task follows the
:class:`~laplax.train.protocol.Task` protocol, so the loop calls the same
methods of every task. Adding a task is one class here and one entry in
:data:`TASKS`, the one task registry.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import utils
from laplax.data import images
from laplax.models import dino, spec as spec_lib
from laplax.models.gpt import GPT
from laplax.models.vit import ViT
from laplax.train import defaults, lm_eval, optim
from laplax.train.protocol import Task, TaskBase, with_debug_faults


def mixup_cutmix(rng: jax.Array, images: jax.Array, targets: jax.Array, *,
                 mixup: float, cutmix: float):
  """Batch-level Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019).

  ``images [B, H, W, C]``, ``targets [B, num_classes]`` (probabilities). When
  both alphas are positive one of the two is chosen per batch with probability
  1/2 (as in DeiT). The batch is mixed with its reverse; for CutMix the target
  weight is the exact area ratio of the pasted box.
  """
  if mixup <= 0 and cutmix <= 0:
    return images, targets
  r_choice, r_lam, r_box = jax.random.split(rng, 3)
  use_cutmix = (jax.random.bernoulli(r_choice, 0.5) if mixup > 0 and cutmix > 0
                else jnp.asarray(cutmix > 0))
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
  mixed = jnp.where(use_cutmix, jnp.where(box[None, :, :, None], flipped, images),
                    lam * images + (1 - lam) * flipped)
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
  base_config = staticmethod(defaults.base_config)

  def __init__(self, config: ml_collections.ConfigDict, num_classes: int,
               image_shape: tuple[int, int, int]):
    self.config = config
    self.num_classes = num_classes
    self.image_shape = tuple(image_shape)
    self.model = ViT(spec_lib.from_config(config.model), num_classes=num_classes)

  @classmethod
  def from_data(cls, config: ml_collections.ConfigDict, workdir: str | None):
    """Prepares the image dataset and builds the task (writes nothing in workdir).

    Raises:
      DataError: dataset missing or unreadable.
      ConfigError: image size not divisible by the patch size.
    """
    del workdir
    from laplax.train import config as config_lib  # pylint: disable=import-outside-toplevel
    images.prepare(config.data)
    info = images.info(config.data)
    config_lib.check_image_size(config, info.image_shape)
    return cls(config, info.num_classes, info.image_shape)

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite, augmented training batches (a grain IterDataset)."""
    return images.train_dataset(
        self.config.data, batch_size=self.config.batch_size // process_count,
        seed=self.config.seed, process_index=process_index,
        process_count=process_count)

  def eval_batches(self) -> Iterator[dict]:
    """Every example of the eval split once, with a ``mask`` for padding."""
    return images.eval_batches(self.config.data,
                               batch_size=self.config.eval_batch_size)

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""
    return {"image": jax.ShapeDtypeStruct((batch_size,) + self.image_shape, jnp.float32),
            "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters (float32 pytree) from ``rng``."""
    images = jnp.zeros((1,) + self.image_shape, jnp.float32)
    return self.model.init({"params": rng}, images)["params"]

  def loss(self, params: Any, batch: dict, rng: jax.Array, task_state: Any = None,
           step: jax.Array | None = None):
    """Training loss (float32 scalar) and ``(metrics, None)`` for one batch."""
    del task_state, step
    lc = self.config.loss
    r_mix, r_drop = jax.random.split(rng)
    targets = jax.nn.one_hot(batch["label"], self.num_classes)
    images, targets = mixup_cutmix(r_mix, batch["image"], targets,
                                   mixup=lc.mixup, cutmix=lc.cutmix)
    logits, _ = self.model.apply({"params": params}, images, train=True,
                                 rngs={"dropout": r_drop})
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
    return {"loss": (loss * mask).sum(), "correct": (correct * mask).sum(),
            "count": mask.sum()}

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> ``{"accuracy", "loss", "num_examples"}``."""
    count = float(sums["count"])
    return {"accuracy": float(sums["correct"]) / count,
            "loss": float(sums["loss"]) / count, "num_examples": int(count)}


class LanguageModelTask(TaskBase):
  """Causal language modelling (GPT) on a text corpus.

  Batches: ``{"tokens": int32 [B, max_length + 1]}``: the model reads
  ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``; eval batches also carry
  ``"mask": float32 [B, max_length]`` over target positions. Loss: mean
  next-token cross-entropy in nats. Evaluation reports ``loss``,
  ``perplexity = exp(loss)`` and ``bits_per_byte = sum(loss where bytes > 0)
  / ln 2 / sum(UTF-8 bytes of the target tokens)`` (nanochat's definition).

  Args:
    config: the run's config.
    tokenizer: from :func:`laplax.data.lm_input.prepare` (``vocab_size``, ``token_bytes``).
  """

  family = "gpt"
  base_config = staticmethod(defaults.gpt_base_config)
  text_samples = lm_eval.validation_samples  # the sample at each evaluation

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: Any):
    self.config = config
    self.tokenizer = tokenizer
    self.seq_len = config.model.max_length
    self.model = GPT(spec_lib.from_config(config.model), vocab_size=tokenizer.vocab_size)
    self.token_bytes = jnp.asarray(tokenizer.token_bytes, jnp.float32)
    self.zero_byte_tokens = bool((np.asarray(tokenizer.token_bytes) == 0).any())

  @classmethod
  def from_data(cls, config: ml_collections.ConfigDict, workdir: str | None):
    """Prepares corpus and tokenizer (a trained tokenizer is saved in ``workdir``).

    Raises:
      DataError: empty or too short corpus, unknown tokenizer.
    """
    from laplax.data import lm_input  # pylint: disable=import-outside-toplevel
    return cls(config, lm_input.prepare(config, workdir))

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite stream of training windows."""
    from laplax.data import lm_input  # pylint: disable=import-outside-toplevel
    return lm_input.train_dataset(self.config, self.tokenizer, process_index, process_count)

  def eval_batches(self) -> Iterator[dict]:
    """The validation split's windows (each target once)."""
    from laplax.data import lm_input  # pylint: disable=import-outside-toplevel
    return lm_input.eval_batches(self.config, self.tokenizer)

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch (SFT: also ``targets``)."""
    from laplax.data import lm_input  # pylint: disable=import-outside-toplevel
    spec = {"tokens": jax.ShapeDtypeStruct((batch_size, self.seq_len + 1), jnp.int32)}
    if lm_input.has_targets(self.config):
      spec["targets"] = jax.ShapeDtypeStruct((batch_size, self.seq_len), jnp.int32)
    return spec

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters (float32 pytree) from ``rng``."""
    tokens = jnp.zeros((1, self.seq_len), jnp.int32)
    return self.model.init({"params": rng}, tokens)["params"]

  def loss(self, params: Any, batch: dict, rng: jax.Array, task_state: Any = None,
           step: jax.Array | None = None):
    """Mean next-token cross-entropy (nats, float32) and ``(metrics, None)``.

    A batch with ``"targets"`` (int32 ``[B, max_length]``, SFT) is scored on
    those instead of ``tokens[:, 1:]``, the mean over the targets that are
    not -1 (PyTorch's ``cross_entropy(..., ignore_index=-1)``, nanochat's
    SFT loss; a batch without any gives 0, not NaN).
    """
    del task_state, step
    tokens = batch["tokens"]
    logits, _ = self.model.apply({"params": params}, tokens[:, :-1], train=True,
                                 rngs={"dropout": rng})
    if "targets" in batch:
      valid = batch["targets"] >= 0
      losses = optax.softmax_cross_entropy_with_integer_labels(
          logits, jnp.where(valid, batch["targets"], 0))
      loss = jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(valid.sum(), 1)
      return loss, ({"loss": loss}, None)
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits, tokens[:, 1:]).mean()
    return loss, ({"loss": loss}, None)

  def readout(self, state: Any) -> np.ndarray:
    """The unembedding ``[vocab_size, width]`` (float32): the token embedding
    when tied, else the output layer's kernel transposed."""
    if self.model.spec.tie_embeddings:
      return np.asarray(state.params["token_embedding"]["embedding"])
    return np.asarray(state.params["lm_head"]["kernel"]).T

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Masked sums: ``loss`` (nats), ``count`` (tokens), ``bytes`` (UTF-8 bytes)."""
    tokens, mask = batch["tokens"], batch["mask"]
    logits, _ = self.model.apply({"params": params}, tokens[:, :-1], train=False)
    targets = tokens[:, 1:]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    num_bytes = self.token_bytes[targets] * mask
    sums = {"loss": (loss * mask).sum(), "count": mask.sum(), "bytes": num_bytes.sum()}
    if self.zero_byte_tokens:  # left out of bits per byte (nanochat's special tokens)
      sums["byte_loss"] = (loss * mask * (num_bytes > 0)).sum()
    return sums

  @staticmethod
  def summarize(sums: dict) -> dict:
    """Eval sums -> ``{"loss", "perplexity", "bits_per_byte", "num_tokens"}``;
    ``bits_per_byte`` as nanochat's ``loss_eval.py`` (0-byte targets count
    neither loss nor bytes; without such tokens ``byte_loss`` is not summed)."""
    loss = float(sums["loss"]) / float(sums["count"])
    byte_loss = float(sums.get("byte_loss", sums["loss"]))
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)),
            "bits_per_byte": byte_loss / math.log(2) / float(sums["bytes"]),
            "num_tokens": int(sums["count"])}


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
  Evaluation (labels used only there): weighted k-NN (``eval.knn_k``,
  ``eval.knn_temperature``) on the teacher's class-token features of the
  train split, scored on the eval split (``knn_accuracy``).

  Args:
    config: the run's config.
    num_classes, image_shape: from the dataset (see :meth:`from_data`);
      ``num_classes`` is only for evaluation.
  """
  family = "vit"
  base_config = staticmethod(defaults.dino_base_config)
  batch_axis = 1  # examples are the second axis of the views [V, B, ...]

  def __init__(self, config: ml_collections.ConfigDict, num_classes: int,
               image_shape: tuple[int, int, int]):
    self.config = config
    self.num_classes = num_classes
    self.image_shape = tuple(image_shape)
    d, mc = config.dino, config.data.multicrop
    spec = spec_lib.from_config(config.model)
    grid = (mc.global_size // spec.patch_size,) * 2
    head = dino.DINOHead(out_dim=d.out_dim, hidden_dim=d.hidden_dim,
                         bottleneck_dim=d.bottleneck_dim, num_layers=d.head_layers)
    self.student = dino.DINO(backbone=ViT(spec, posemb_grid=grid), head=head)
    teacher_spec = dataclasses.replace(spec, drop_path=0.0)
    self.teacher = dino.DINO(backbone=ViT(teacher_spec, posemb_grid=grid), head=head)
    self.model = self.student
    self.teacher_temp = optax.linear_schedule(
        d.warmup_teacher_temp, d.teacher_temp, max(d.warmup_teacher_temp_steps, 1))
    self.momentum = optim.cosine_ramp(d.momentum_teacher, 1.0, config.total_steps)
    self.weight_decay = optim.weight_decay_schedule(config.optim, config.total_steps)
    self._embed = jax.jit(self._backbone_features)  # compiled once per task

  def _backbone_features(self, backbone_params: Any, images: jax.Array):
    """Class-token features ``[N, width]`` and final-norm patch tokens."""
    feats, out = self.teacher.backbone.apply({"params": backbone_params}, images,
                                             train=False)
    return feats, out["encoded"][:, 1:]

  @classmethod
  def from_data(cls, config: ml_collections.ConfigDict, workdir: str | None):
    """Prepares the image dataset and builds the task (writes nothing in workdir).

    Raises:
      DataError: dataset missing or unreadable.
    """
    del workdir
    images.prepare(config.data)
    info = images.info(config.data)
    return cls(config, info.num_classes, info.image_shape)

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """This process's infinite multi-crop batches (a grain IterDataset)."""
    return images.multicrop_train_dataset(
        self.config.data, self.config.data.multicrop,
        batch_size=self.config.batch_size // process_count, seed=self.config.seed,
        process_index=process_index, process_count=process_count)

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""
    mc, c = self.config.data.multicrop, self.image_shape[-1]
    return {
        "global": jax.ShapeDtypeStruct(
            (mc.num_global, batch_size, mc.global_size, mc.global_size, c), jnp.float32),
        "local": jax.ShapeDtypeStruct(
            (mc.num_local, batch_size, mc.local_size, mc.local_size, c), jnp.float32)}

  def init(self, rng: jax.Array) -> Any:
    """The student's initial parameters ``{"backbone", "head"}`` from ``rng``."""
    spec = self.batch_spec(1)
    crops = jnp.zeros(spec["global"].shape, jnp.float32)
    return self.student.init({"params": rng}, crops)["params"]

  def init_task_state(self, params: Any) -> dict:
    """The teacher starts as a copy of the student; the centre at 0."""
    return {"teacher": jax.tree_util.tree_map(jnp.array, params),
            "center": jnp.zeros((self.config.dino.out_dim,), jnp.float32)}

  def loss(self, params: Any, batch: dict, rng: jax.Array, task_state: dict,
           step: jax.Array):
    """DINO loss (float32) and ``(metrics, teacher logits [G, B, K])``.

    Metrics: ``loss``, the collapse monitor (``teacher_entropy``,
    ``teacher_marginal_entropy``, ``kl_teacher_student``, nats) and the
    schedules' values at ``step``.
    """
    d = self.config.dino
    teacher_logits, _ = self.teacher.apply({"params": task_state["teacher"]},
                                           batch["global"], train=False)
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    student_logits, _ = self.student.apply({"params": params}, batch["global"],
                                           batch["local"], train=True,
                                           rngs={"dropout": rng})
    temp = self.teacher_temp(step)
    loss = dino.dino_loss(student_logits, teacher_logits, task_state["center"],
                                student_temp=d.student_temp, teacher_temp=temp)
    stats = dino.collapse_statistics(
        student_logits, teacher_logits, task_state["center"],
        student_temp=d.student_temp, teacher_temp=temp)
    wd = self.weight_decay(step) if callable(self.weight_decay) else self.weight_decay
    metrics = dict(stats, loss=loss, teacher_temp=temp,
                   teacher_momentum=self.momentum(step), weight_decay=wd)
    return loss, (metrics, teacher_logits)

  def mask_updates(self, updates: Any, step: jax.Array) -> Any:
    """Zeroes the head's last layer updates during ``freeze_last_layer_steps``."""
    frozen = step < self.config.dino.freeze_last_layer_steps

    def mask(path, u):
      frozen_leaf = utils.path_str(path) == "head/last_layer"
      return jnp.where(frozen, jnp.zeros_like(u), u) if frozen_leaf else u
    return jax.tree_util.tree_map_with_path(mask, updates)

  def update_task_state(self, task_state: dict, params: Any,
                        teacher_logits: jax.Array, step: jax.Array) -> dict:
    """Teacher EMA with the updated student, then the centre EMA (Eq. 4)."""
    return {"teacher": dino.update_teacher(task_state["teacher"], params,
                                                 self.momentum(step)),
            "center": dino.update_center(task_state["center"], teacher_logits,
                                               self.config.dino.center_momentum)}

  def monitor(self, record: dict) -> str | None:
    """A warning line when the logged collapse statistics show a collapse."""
    kind = dino.collapsed(record, self.config.dino.out_dim)
    if kind is None:
      return None
    return (f"DINO outputs look collapsed ({kind}): teacher_entropy="
            f"{record['teacher_entropy']:.3f}, marginal="
            f"{record['teacher_marginal_entropy']:.3f}, kl="
            f"{record['kl_teacher_student']:.2e} nats")

  def eval_batches(self, split: str | None = None) -> Iterator[dict]:
    """Every image of ``split`` (default ``data.eval_split``) once, unaugmented,
    with its label and a ``mask`` for padding (labels are used only in evaluation)."""
    return images.eval_batches(self.config.data, batch_size=self.config.eval_batch_size,
                               **({"split": split} if split else {}))

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
    return (np.concatenate(feats).astype(np.float32), np.concatenate(labels),
            first, tokens)

  def segmentation_settings(self) -> dict:
    """The ``eval.segmentation*`` settings, defaults for keys the config lacks
    (a run saved before they existed); keys without the ``eval.`` prefix."""
    from laplax.train import dino_segmentation  # pylint: disable=import-outside-toplevel
    return dino_segmentation.settings(self.config)

  def segmentation_data(self):
    """The segmentation train/test images and masks of this run, or ``None``
    (:func:`laplax.train.dino_segmentation.load_data`).

    Raises:
      DataError: the data is not prepared, unreadable or does not fit the backbone.
      ConfigError: the image size is not divisible by the patch size.
    """
    from laplax.train import dino_segmentation  # pylint: disable=import-outside-toplevel
    return dino_segmentation.load_data(self.config, self.image_shape)

  def evaluate(self, state: Any, place=None, *, references: bool = False,
               figure: str | None = None, segmentation: bool = False,
               segmentation_figure: str | None = None, mesh=None) -> dict:
    """Frozen-feature evaluation of the teacher's class-token and patch features.

    Weighted k-NN (``knn_accuracy``; DINO's protocol, Wu et al. 2018) and, if
    ``eval.linear_probe``, a linear probe (``linear_probe_accuracy``), both
    fitted on the train split and scored on the eval split; labels are used
    only here. With ``segmentation`` (and ``eval.segmentation``), DINOv2's
    linear segmentation probe on the patch tokens
    (:func:`laplax.train.dino_segmentation.evaluate`) fitted on the
    segmentation train images and scored on the test images of
    :meth:`segmentation_data`.

    Args:
      state: a TrainState of this task (its ``task_state["teacher"]``).
      place: unused (the features are computed on the default device).
      references: also report ``raw_pixel_knn_accuracy``, the same k-NN on
        the normalised pixels (a reference that needs no network).
      figure: if given, a PNG path for the patch-feature PCA of the first
        ``eval.pca_images`` eval images (DINO's Fig. 1-style picture).
      segmentation: run the segmentation probe (``eval.py`` does; the
        evaluations during training do not).
      segmentation_figure: if given, a PNG path for the first
        ``eval.segmentation_figure_images`` segmentation test images with
        their true and predicted masks.
      mesh: a device mesh for the segmentation probe's batches (``eval.py``
        passes one over every device; default: the default device).

    Returns:
      ``{"knn_accuracy", "linear_probe_accuracy"?, "raw_pixel_knn_accuracy"?,
      "segmentation_*"?, "num_examples"}`` (accuracies and mIoU in [0, 1];
      eval split size; the segmentation keys, those of
      :func:`laplax.train.dino_segmentation.evaluate`, only when the probe ran).

    Raises:
      DataError, ConfigError: the segmentation data cannot be read (raised
        before anything is computed or written).
    """
    from laplax.analysis import probes  # pylint: disable=import-outside-toplevel
    del place
    seg = self.segmentation_data() if segmentation else None
    e, (_, teacher) = self.config.eval, self.backbone(state)
    knn = dict(num_classes=self.num_classes, k=e.knn_k, temperature=e.knn_temperature)
    train_x, train_y, _, _ = self.features(teacher, self.config.data.train_split)
    num_pca = e.pca_images if figure else 0
    test_x, test_y, shown, tokens = self.features(teacher, self.config.data.eval_split,
                                                  with_tokens=num_pca)
    out = {"knn_accuracy": float(probes.knn_accuracy(train_x, train_y, test_x, test_y,
                                                     **knn))}
    if e.linear_probe:
      probe = probes.linear_probe(train_x, train_y, test_x, test_y,
                                  num_classes=self.num_classes, seed=self.config.seed)
      out["linear_probe_accuracy"] = float(probe["accuracy"])
    if references:
      pixels = {}
      for split in (self.config.data.train_split, self.config.data.eval_split):
        pixels[split] = np.concatenate([
            b["image"][:int(b["mask"].sum())].reshape(int(b["mask"].sum()), -1)
            for b in self.eval_batches(split)])
      out["raw_pixel_knn_accuracy"] = float(probes.knn_accuracy(
          pixels[self.config.data.train_split], train_y,
          pixels[self.config.data.eval_split], test_y, **knn))
    if seg is not None:
      from laplax.train import dino_segmentation  # pylint: disable=import-outside-toplevel
      out.update(dino_segmentation.evaluate(self.config, self.teacher.backbone, teacher, seg,
                                            mesh=mesh, figure=segmentation_figure))
    if figure and num_pca:
      p = self.config.model.patch_size
      grid = (shown.shape[1] // p, shown.shape[2] // p)
      probes.save_pca_figure(figure, shown, probes.patch_pca_rgb(tokens, grid))
    out["num_examples"] = int(len(test_y))
    return out


#: ``config.task`` -> the task class that builds its model, loss and evaluation.
TASKS = {"classification": ClassificationTask, "lm": LanguageModelTask,
         "dino": DINOTask}


def make_task(config: ml_collections.ConfigDict, workdir: str | None) -> Task:
  """Prepares the data of ``config.task`` and returns the task object
  (wrapped by :func:`~laplax.train.protocol.with_debug_faults` for
  ``config.debug.nan_at_step`` and ``config.debug.stall_at_step``).

  Raises:
    DataError, ConfigError: one-line user errors.
  """
  task = TASKS[config.task].from_data(config, workdir)
  return with_debug_faults(task, config.get("debug", {}))
