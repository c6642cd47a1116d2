"""Linear semantic segmentation on frozen patch features, and a Fashion-MNIST proxy task.

The dense evaluation of self-supervised ViTs that the Laplacian-heads paper
reports for DINO (ADE20K linear mIoU) follows DINOv2's "linear" protocol
(Oquab et al. 2023, arXiv 2304.07193, section 7.4): a linear layer on the
frozen patch tokens predicts class logits per patch, the logits are
bilinearly upsampled to the label resolution, and the layer is trained with
pixel-wise softmax cross-entropy; the score is the mean intersection over
union (mIoU).

* :func:`confusion` / :func:`miou`: the confusion matrix over pixels and
  ``IoU_c = TP_c / (TP_c + FP_c + FN_c)``, averaged over the classes whose
  union is not empty (as mmsegmentation's ``nanmean``); pixels labelled
  below 0 are ignored.
* :func:`linear_segmentation_probe`: that linear probe (features
  standardised with the train patches' mean and std; AdamW, cosine decay,
  minibatches of images drawn with replacement; one jitted call).
* :func:`fashion_canvases`: the offline proxy for a segmentation dataset:
  canvases with 2-4 Fashion-MNIST garments pasted at random positions, each
  pixel labelled with its garment's class + 1 (a later garment covers an
  earlier one where its pixels are on) or 0, background (11 classes).
  Deterministic under the seed. The TFDS dataset ``fashion_mosaic``
  (:mod:`laplax.data.builders.fashion_mosaic`) stores such canvases.
* :func:`save_segmentation_figure`: test images, their true and predicted
  masks, as a PNG (``eval.py`` writes ``segmentation.png`` for DINO runs).
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

BACKGROUND = 0
# Fashion-MNIST pixels at or below this (of 255) are background.
GARMENT_THRESHOLD = 10


def confusion(predicted, target, num_classes: int) -> np.ndarray:
  """The ``[num_classes, num_classes]`` int64 confusion matrix (rows: target).

  Args:
    predicted: int ``[...]`` class ids in ``[0, num_classes)``.
    target: int, the same shape; values below 0 are ignored.
    num_classes: number of classes, ``>= 1``.

  Raises:
    ValueError: different shapes, or ids outside ``[0, num_classes)``.
  """
  p, t = np.asarray(predicted).ravel(), np.asarray(target).ravel()
  if np.shape(predicted) != np.shape(target):
    raise ValueError(f"predicted {np.shape(predicted)} and target {np.shape(target)} "
                     f"must have the same shape")
  keep = t >= 0
  p, t = p[keep].astype(np.int64), t[keep].astype(np.int64)
  if p.size and (p.min() < 0 or p.max() >= num_classes or t.max() >= num_classes):
    raise ValueError(f"class ids must be in [0, {num_classes})")
  return np.bincount(t * num_classes + p, minlength=num_classes ** 2).reshape(
      num_classes, num_classes)


def miou(matrix: np.ndarray) -> dict:
  """Mean IoU of a confusion matrix (rows: target, columns: prediction).

  Returns:
    A dict: ``miou`` (float, the mean over the classes with a non-empty
    union; ``nan`` if none), ``iou`` (a list with one float per class,
    ``None`` where the union is empty) and ``pixel_accuracy`` (float).
  """
  m = np.asarray(matrix, np.float64)
  tp = np.diag(m)
  union = m.sum(0) + m.sum(1) - tp
  iou = [float(a / u) if u > 0 else None for a, u in zip(tp, union)]
  present = [v for v in iou if v is not None]
  total = m.sum()
  return {"miou": float(np.mean(present)) if present else float("nan"), "iou": iou,
          "pixel_accuracy": float(tp.sum() / total) if total else float("nan")}


@functools.partial(jax.jit, static_argnames="size")
def _upsampled_logits(params, patches, mean, std, size):
  x = (patches - mean) / std
  logits = x @ params["w"] + params["b"]  # [N, h, w, C]
  return jax.image.resize(logits, (logits.shape[0],) + tuple(size) + logits.shape[-1:],
                          method="bilinear")


def _train(x, masks, mean, std, lr, weight_decay, key, *, num_classes: int, steps: int,
           batch_size: int):
  """AdamW on pixel-wise cross-entropy of the upsampled logits; the parameters."""
  n, _, _, d = x.shape
  size = masks.shape[1:]
  params = {"w": jnp.zeros((d, num_classes), jnp.float32),
            "b": jnp.zeros((num_classes,), jnp.float32)}
  tx = optax.adamw(optax.cosine_decay_schedule(lr, steps), weight_decay=weight_decay,
                   mask={"w": True, "b": False})

  def loss_fn(p, xb, yb):
    logits = jax.image.resize((xb @ p["w"] + p["b"]),
                              (xb.shape[0],) + size + (num_classes,), method="bilinear")
    valid = yb >= 0
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(yb, 0))
    return jnp.sum(ce * valid) / jnp.maximum(valid.sum(), 1)

  def step(carry, t):
    p, s = carry
    idx = jax.random.randint(jax.random.fold_in(key, t), (batch_size,), 0, n)
    grads = jax.grad(loss_fn)(p, (x[idx] - mean) / std, masks[idx])
    updates, s = tx.update(grads, s, p)
    return (optax.apply_updates(p, updates), s), None

  (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(steps))
  return params


def linear_segmentation_probe(train_patches, train_masks, test_patches, test_masks, *,
                              num_classes: int, steps: int = 500, lr: float = 0.05,
                              weight_decay: float = 1e-4, batch_size: int = 64,
                              seed: int = 0) -> dict:
  """DINOv2's linear segmentation protocol on frozen patch features.

  Args:
    train_patches: float ``[N, h, w, D]`` patch features (a grid of ``h x w``
      patches per image).
    train_masks: int ``[N, H, W]`` pixel labels in ``[0, num_classes)`` (below
      0: ignored).
    test_patches: float ``[M, h, w, D]``.
    test_masks: int ``[M, H, W]``.
    num_classes: ``>= 2``.
    steps, lr, weight_decay, batch_size, seed: the AdamW run (cosine decay from
      ``lr``; ``batch_size`` images per step, drawn with replacement under
      ``seed``; ``W`` and ``b`` start at zero).

  Returns:
    :func:`miou` of the test predictions (argmax of the upsampled logits)
    plus ``"predictions"``: int32 ``[M, H, W]``.

  Raises:
    ValueError: shapes that do not fit, non-finite features, labels outside
      ``[0, num_classes)``, or bad optimiser settings.
  """
  x = np.asarray(train_patches, np.float32)
  x_test = np.asarray(test_patches, np.float32)
  y, y_test = np.asarray(train_masks), np.asarray(test_masks)
  if (x.ndim != 4 or x_test.ndim != 4 or x.shape[3] != x_test.shape[3]
      or y.shape[:1] != x.shape[:1] or y_test.shape[:1] != x_test.shape[:1]
      or y.ndim != 3 or y_test.shape[1:] != y.shape[1:]):
    raise ValueError(f"patches [N, h, w, D] and masks [N, H, W] do not fit: {x.shape}, "
                     f"{y.shape}, {x_test.shape}, {y_test.shape}")
  if not (np.isfinite(x).all() and np.isfinite(x_test).all()):
    raise ValueError("patch features contain NaN or inf")
  if num_classes < 2 or max(y.max(initial=0), y_test.max(initial=0)) >= num_classes:
    raise ValueError(f"labels must be in [0, num_classes={num_classes}) with num_classes >= 2")
  if steps < 1 or batch_size < 1 or not lr > 0 or not math.isfinite(lr) or weight_decay < 0:
    raise ValueError(f"need steps >= 1, batch_size >= 1, lr > 0, weight_decay >= 0; got "
                     f"{steps}, {batch_size}, {lr}, {weight_decay}")
  flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
  mean, std = flat.mean(0), flat.std(0)
  std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
  mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  train = jax.jit(_train, static_argnames=("num_classes", "steps", "batch_size"))
  params = train(jnp.asarray(x), jnp.asarray(y, jnp.int32), mean, std, jnp.float32(lr),
                 jnp.float32(weight_decay), jax.random.key(int(seed)),
                 num_classes=int(num_classes), steps=int(steps),
                 batch_size=int(min(batch_size, len(x))))
  predictions = np.concatenate([
      np.asarray(jnp.argmax(_upsampled_logits(params, jnp.asarray(x_test[i:i + 256]), mean,
                                              std, tuple(y_test.shape[1:])), -1), np.int32)
      for i in range(0, len(x_test), 256)]) if len(x_test) else np.zeros(y_test.shape, np.int32)
  result = miou(confusion(predictions, y_test, num_classes))
  result["predictions"] = predictions
  return result


def fashion_canvases(images, labels, num_canvases: int, *, canvas_size: int = 56,
                     min_items: int = 2, max_items: int = 4, seed: int = 0):
  """Canvases of pasted Fashion-MNIST garments with per-pixel labels.

  Each canvas draws ``k`` in ``[min_items, max_items]`` garments (with
  replacement) from ``images`` and pastes each at a uniformly random top-left
  corner; a garment's pixels above :data:`GARMENT_THRESHOLD` overwrite the
  canvas and take its label + 1, the rest stays background (0).

  Args:
    images: uint8 ``[N, 28, 28]`` (or ``[N, 28, 28, 1]``).
    labels: int ``[N]`` in ``[0, 10)``.
    num_canvases: how many to build.
    canvas_size: side in pixels, ``>= 28``.
    min_items, max_items: garments per canvas, ``1 <= min_items <= max_items``.
    seed: everything random comes from ``numpy.random.default_rng(seed)``.

  Returns:
    ``(canvases uint8 [M, S, S, 1], masks int32 [M, S, S])`` with 11 classes
    (0 background, ``c + 1`` garment class ``c``).

  Raises:
    ValueError: bad shapes or settings.
  """
  images = np.asarray(images)
  if images.ndim == 4 and images.shape[-1] == 1:
    images = images[..., 0]
  labels = np.asarray(labels)
  if images.ndim != 3 or labels.shape != images.shape[:1] or not len(images):
    raise ValueError(f"images [N, h, w] and labels [N] do not fit: {images.shape}, "
                     f"{labels.shape}")
  h, w = images.shape[1:]
  if canvas_size < max(h, w) or not 1 <= min_items <= max_items or num_canvases < 0:
    raise ValueError(f"need canvas_size >= {max(h, w)} and 1 <= min_items <= max_items; got "
                     f"{canvas_size}, {min_items}, {max_items}")
  rng = np.random.default_rng(seed)
  canvases = np.zeros((num_canvases, canvas_size, canvas_size), np.uint8)
  masks = np.full((num_canvases, canvas_size, canvas_size), BACKGROUND, np.int32)
  for m in range(num_canvases):
    for i in rng.integers(0, len(images), size=rng.integers(min_items, max_items + 1)):
      top, left = rng.integers(0, canvas_size - h + 1), rng.integers(0, canvas_size - w + 1)
      on = images[i] > GARMENT_THRESHOLD
      canvases[m, top:top + h, left:left + w][on] = images[i][on]
      masks[m, top:top + h, left:left + w][on] = int(labels[i]) + 1
  return canvases[..., None], masks


def save_segmentation_figure(path, images, masks, predictions, num_classes: int, *,
                             title: str = "") -> str:
  """Writes a PNG of ``B`` columns: an image, its true mask, the predicted mask.

  Each image is min-max scaled on its own (grey images in grey); class ``c``
  gets the same colour in both masks (matplotlib's ``tab20`` for up to 20
  classes, else ``nipy_spectral``), ignored pixels (below 0) are white.
  Masks are drawn at their own resolution, stretched over the image's area.

  Args:
    path: file name of the PNG (parent directories are created).
    images: float ``[B, H, W, C]`` with ``C`` 1 or 3, any range.
    masks: int ``[B, h, w]`` true classes (below 0: ignored).
    predictions: int ``[B, h, w]`` predicted classes.
    num_classes: number of classes, ``>= 1`` (fixes the colours).
    title: figure title.

  Returns:
    ``path``.

  Raises:
    ValueError: shapes that do not fit, ``B = 0`` or non-finite images.
  """
  images, masks, predictions = (np.asarray(images), np.asarray(masks),
                                np.asarray(predictions))
  if (images.ndim != 4 or images.shape[-1] not in (1, 3) or masks.ndim != 3
      or predictions.shape != masks.shape or len(images) != len(masks) or not len(images)):
    raise ValueError(f"need images [B, H, W, 1 or 3] and masks, predictions [B, h, w] "
                     f"with B >= 1; got {images.shape}, {masks.shape}, {predictions.shape}")
  if not np.isfinite(images).all():
    raise ValueError("images contains NaN or inf")
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  n = max(int(num_classes), 1)
  base = plt.get_cmap("tab20" if n <= 20 else "nipy_spectral")
  cmap = colors.ListedColormap([base(i / max(n - 1, 1)) if n > 20 else base(i)
                                for i in range(n)]).with_extremes(under="white")
  b = len(images)
  fig, axes = plt.subplots(3, b, figsize=(1.6 * b, 5.0), squeeze=False)
  for i in range(b):
    x = images[i].astype(np.float64)
    x = (x - x.min()) / (x.max() - x.min()) if x.max() > x.min() else np.zeros_like(x)
    axes[0, i].imshow(x[..., 0] if x.shape[-1] == 1 else x, cmap="gray", vmin=0, vmax=1,
                      interpolation="nearest")
    for row, m in ((1, masks[i]), (2, predictions[i])):
      axes[row, i].imshow(np.where(m < 0, -1, m), cmap=cmap, vmin=-0.5, vmax=n - 0.5,
                          interpolation="nearest")
  for row, name in enumerate(("image", "true mask", "predicted")):
    axes[row, 0].set_ylabel(name)
  for ax in axes.ravel():
    ax.set_xticks([])
    ax.set_yticks([])
  if title:
    fig.suptitle(title, fontsize=9)
  os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
