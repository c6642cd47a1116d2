"""The ``segmentation`` evaluator of a DINO run: DINOv2's linear probe on the teacher.

Oquab et al. 2023, arXiv 2304.07193, section 7.4 (the ``BNHead`` of its
mmsegmentation configs): the last ``eval.segmentation_layers`` blocks' patch tokens,
each through the final norm, concatenated (1: "linear"; 4: "+ms" without
multi-scale testing), then
:func:`laplax.evaluators.linear_segmentation.linear_segmentation_probe`. Settings
``config.eval.segmentation*`` (:data:`DEFAULTS`; docs/dino.md). With a ``mesh``
batches are split over its data axes (:func:`laplax.sharding.whole_batch`). Memory:
the train features on the host, ``N (S/p)^2 D L`` float32.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from laplax import sharding
from laplax.config import validation as config_lib
from laplax.data.vision import segmentation
from laplax.evaluators import linear_segmentation as seg_lib
from laplax.evaluators.base import EVAL, Context, Evaluator

#: The ``eval.segmentation*`` settings and their defaults. The probe is
#: DINOv2's linear protocol on the frozen teacher's final-norm patch tokens
#: (:mod:`laplax.evaluators.linear_segmentation`). ``segmentation_dataset``:
#: "auto" (the run's own masks, e.g. fashion_mosaic; Fashion-MNIST canvases for
#: a Fashion-MNIST run; else skipped), "fashion_canvases", "ade20k"
#: (ADEChallengeData2016's 150 classes, unpacked in ``segmentation_dir``) or
#: "scene_parse150" (TFDS's builder in ``data.data_dir``, whose masks are the
#: 100 instance categories; :mod:`laplax.data.vision.segmentation`). Images and
#: labels at ``segmentation_image_size`` px (0: the backbone's input size). It
#: fits on the first ``segmentation_train_images`` of the train split in
#: ``segmentation_steps`` AdamW steps of ``segmentation_batch_size`` images from
#: ``segmentation_lr``, on the last ``segmentation_layers`` blocks' tokens,
#: scores the first ``segmentation_test_images`` of the eval split and draws
#: ``segmentation_figure_images`` of them.
DEFAULTS = {
  "segmentation_dataset": "auto",
  "segmentation_dir": "",
  "segmentation_image_size": 0,
  "segmentation_train_images": 500,
  "segmentation_test_images": 200,
  "segmentation_steps": 300,
  "segmentation_batch_size": 64,
  "segmentation_lr": 0.05,
  "segmentation_layers": 1,
  "segmentation_figure_images": 6,
}
#: File name of the segmentation probe's picture (``segmentation``).
SEGMENTATION_FIGURE = "segmentation.png"


def settings(config) -> dict:
  """The ``eval.segmentation*`` settings of ``config``, keys without ``eval.``."""
  given = config.eval if "eval" in config else {}
  return {k: given[k] if k in given else v for k, v in DEFAULTS.items()}


def image_size(config, image_shape) -> int:
  """``eval.segmentation_image_size``, or the backbone's input side when it is 0.

  Raises:
    ConfigError: not divisible by ``model.patch_size``.
  """
  size = int(settings(config)["segmentation_image_size"] or image_shape[0])
  config_lib.check_patches(
    config,
    size,
    size,
    f"the segmentation images' size {size} px",
    "set config.eval.segmentation_image_size (or config.data.image_size) to a multiple of it",
  )
  return size


def load_data(config, image_shape):
  """The segmentation data of a run (:func:`laplax.data.vision.segmentation.resolve`), or ``None``.

  ``None`` when ``"auto"`` finds nothing to evaluate on.

  Raises:
    DataError: not prepared, unreadable, malformed or not fitting the backbone.
    ConfigError: the image size is not divisible by the patch size.
  """
  from laplax.data.vision import segmentation

  s = settings(config)
  source = segmentation.resolve(config.data, s["segmentation_dataset"])
  if source is None:
    return None
  return segmentation.load(
    config.data,
    source,
    num_train=s["segmentation_train_images"],
    num_test=s["segmentation_test_images"],
    image_size=image_size(config, image_shape),
    channels=int(image_shape[-1]),
    directory=s["segmentation_dir"],
  )


def _final_norm(spec, norm_params, x):
  """The backbone's final norm (``encoder_norm``) applied to tokens ``x``."""
  from laplax.models import layers

  if spec.fc_norm:  # "encoded" is then before the norm: so are the others
    return x.astype(jnp.float32)
  if spec.norm == "rmsnorm":
    return layers.RMSNorm().apply({}, x)
  return nn.LayerNorm(dtype=jnp.float32, epsilon=spec.norm_eps).apply({"params": norm_params}, x)


def feature_fn(backbone: nn.Module, num_layers: int):
  """A jitted ``(params, images [B, S, S, C]) -> float32 [B, S/p, S/p, D L]``.

  Patch tokens of the last ``num_layers`` blocks through the final norm, earliest first.
  """
  spec = backbone.spec

  def features(params, images):
    _, out = backbone.apply({"params": params}, images, train=False)
    if num_layers == 1:
      tokens = out["encoded"].astype(jnp.float32)
    else:
      tokens = jnp.concatenate(
        [
          _final_norm(spec, params.get("encoder_norm", {}), out[f"block{i}"]["+mlp"])
          for i in range(spec.depth - num_layers, spec.depth)
        ],
        axis=-1,
      )
    first = 1 if spec.pool == "tok" else 0
    b, g = images.shape[0], images.shape[1] // spec.patch_size
    return tokens[:, first:].reshape(b, g, images.shape[2] // spec.patch_size, -1)

  return jax.jit(features)


def patch_features(
  fn,
  params,
  images: np.ndarray,
  batch_size: int,
  *,
  place=None,
  progress: bool = False,
  desc: str = "features",
) -> np.ndarray:
  """:func:`feature_fn` over ``images [N, S, S, C]`` in padded batches: float32 ``[N, h, w, F]`` on the host."""
  import tqdm

  out = []
  for i in tqdm.tqdm(
    range(0, len(images), batch_size),
    desc=desc,
    unit="batch",
    leave=False,
    disable=not progress,
    mininterval=1.0,
  ):
    chunk = images[i : i + batch_size]
    padded = np.pad(chunk, ((0, batch_size - len(chunk)),) + ((0, 0),) * 3)
    x = place({"image": padded})["image"] if place is not None else padded
    out.append(np.asarray(jax.device_get(fn(params, x)), np.float32)[: len(chunk)])
  return np.concatenate(out)


def evaluate(
  config,
  backbone: nn.Module,
  params: Any,
  seg,
  *,
  mesh=None,
  figure: str | None = None,
  progress: bool = True,
) -> dict:
  """Fits and scores the linear segmentation probe on ``seg`` (:func:`load_data`).

  Args:
    config: the run's config (``eval.segmentation*``, ``eval_batch_size``, ``seed``).
    backbone, params: the frozen teacher backbone and its parameters.
    seg: a :class:`laplax.data.vision.segmentation.SegmentationData`.
    mesh: a device mesh for the batches (default: one device).
    figure: PNG path for the first ``eval.segmentation_figure_images`` test images.
    progress: progress bars.

  Returns:
    ``{"segmentation_miou", "segmentation_pixel_accuracy", "segmentation_iou" (per
    class, ``None`` where absent), "segmentation_dataset", "segmentation_num_classes",
    "segmentation_image_size", "segmentation_train_images",
    "segmentation_test_images", "segmentation_layers"}``.
  """
  s = settings(config)
  place = None
  if mesh is not None:
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = jax.device_put(params, replicated)

    def place(batch):
      return sharding.whole_batch(batch, mesh, sharding.DEFAULT_RULES)

  fn = feature_fn(backbone, int(s["segmentation_layers"]))
  batch = int(config.eval_batch_size)
  train = patch_features(
    fn,
    params,
    seg.train_images,
    batch,
    place=place,
    progress=progress,
    desc="segmentation train features",
  )
  test = patch_features(
    fn,
    params,
    seg.test_images,
    batch,
    place=place,
    progress=progress,
    desc="segmentation test features",
  )
  shown = min(int(s["segmentation_figure_images"]), len(seg.test_images))
  result = seg_lib.linear_segmentation_probe(
    train,
    seg.train_masks,
    test,
    seg.test_masks,
    num_classes=seg.num_classes,
    steps=int(s["segmentation_steps"]),
    lr=float(s["segmentation_lr"]),
    batch_size=int(s["segmentation_batch_size"]),
    seed=int(config.seed),
    place=place,
    progress=progress,
    keep_predictions=shown,
  )
  if figure and shown:
    seg_lib.save_segmentation_figure(
      figure,
      seg.test_images[:shown],
      seg.test_masks[:shown],
      result["predictions"],
      seg.num_classes,
      title=f"linear probe on {seg.name}: mIoU {result['miou']:.3f}",
    )
  return {
    "segmentation_miou": float(result["miou"]),
    "segmentation_pixel_accuracy": float(result["pixel_accuracy"]),
    "segmentation_iou": result["iou"],
    "segmentation_dataset": seg.name,
    "segmentation_num_classes": int(seg.num_classes),
    "segmentation_image_size": int(seg.test_masks.shape[1]),
    "segmentation_train_images": int(len(seg.train_masks)),
    "segmentation_test_images": int(len(seg.test_masks)),
    "segmentation_layers": int(s["segmentation_layers"]),
  }


def validate(config: ml_collections.ConfigDict) -> None:
  """The ``eval.segmentation*`` keys of a DINO config.

  Raises:
    ConfigError: the first bad key, with its fix.
  """
  e = config.eval
  dataset = e.segmentation_dataset
  config_lib.require(
    dataset in segmentation.DATASETS,
    f"config.eval.segmentation_dataset={dataset!r} is unknown; use one of "
    f"{', '.join(map(repr, segmentation.DATASETS))}",
  )
  config_lib.require(
    dataset != segmentation.FASHION_CANVASES or segmentation.is_fashion_mnist(config.data),
    f"config.eval.segmentation_dataset='fashion_canvases' builds canvases from "
    f"the run's Fashion-MNIST images, but config.data.name={config.data.name!r}; "
    f"use 'auto' or 'scene_parse150'",
  )
  directory = e.segmentation_dir
  config_lib.require(
    dataset != segmentation.ADE20K or (isinstance(directory, str) and directory),
    "config.eval.segmentation_dataset='ade20k' reads ADEChallengeData2016 from a "
    "local directory; give --config.eval.segmentation_dir=DIR (images/ and "
    "annotations/ in it)",
  )
  for key, low in (
    ("segmentation_train_images", 2),
    ("segmentation_test_images", 1),
    ("segmentation_steps", 1),
    ("segmentation_figure_images", 0),
    ("segmentation_image_size", 0),
    ("segmentation_batch_size", 1),
    ("segmentation_layers", 1),
  ):
    config_lib.check_int(config, f"eval.{key}", low)
  size = e.segmentation_image_size
  if size:  # 0: the backbone's size
    config_lib.check_patches(
      config,
      size,
      size,
      f"config.eval.segmentation_image_size={size}",
      "give a multiple of it (0: the backbone's size)",
    )
  config_lib.check_float(config, "eval.segmentation_lr", 0.0, open_min=True)
  config_lib.require(
    e.segmentation_layers <= config.model.depth,
    f"config.eval.segmentation_layers={e.segmentation_layers} is more than the "
    f"model's {config.model.depth} blocks",
  )


class Segmentation(Evaluator):
  """``segmentation``: :func:`evaluate` on the run's masks, split over ``ctx.mesh``.

  Draws :data:`SEGMENTATION_FIGURE` in ``ctx.out_dir``; nothing when "auto" finds no
  masks.
  """

  name = "segmentation"
  stages = (EVAL,)
  tasks = ("dino",)
  defaults = DEFAULTS

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """The ``eval.segmentation*`` keys (:func:`validate`)."""
    validate(config)

  def prepare(self) -> None:
    """Reads the segmentation images and masks (:func:`load_data`).

    Raises:
      DataError, ConfigError: as :func:`load_data`.
    """
    self.data = load_data(self.config, self.task.image_shape)

  def run(self, state: Any, ctx: Context) -> dict:
    shown = settings(self.config)["segmentation_figure_images"]
    if self.data is None:
      ctx.say(
        f"no segmentation probe: {self.config.data.name} has no masks and is not "
        f"Fashion-MNIST; add --config.eval.segmentation_dataset=ade20k "
        f"--config.eval.segmentation_dir=DIR (ADEChallengeData2016 unpacked in DIR)"
      )
      return {}
    figure = os.path.join(ctx.out_dir, SEGMENTATION_FIGURE) if ctx.out_dir else None
    _, params = self.task.backbone(state)
    out = evaluate(
      self.config, self.task.teacher.backbone, params, self.data, mesh=ctx.mesh, figure=figure
    )
    ctx.say(
      f"linear segmentation probe on {out['segmentation_dataset']}: mIoU "
      f"{out['segmentation_miou']:.4f}"
      + (f"; masks of {shown} test images: {figure}" if shown and figure else "")
    )
    if shown and figure:
      ctx.figures.append(figure)
    return out
