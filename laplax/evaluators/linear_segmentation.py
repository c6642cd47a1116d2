"""Linear semantic segmentation on frozen patch features.

DINOv2's "linear" protocol (Oquab et al. 2023, arXiv 2304.07193, section 7.4): a
linear layer on frozen patch tokens, logits upsampled bilinearly to the labels,
pixel-wise softmax cross-entropy; scored by mIoU. Pixels labelled below 0 are
ignored throughout.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax


def confusion(predicted, target, num_classes: int) -> np.ndarray:
  """The ``[num_classes, num_classes]`` int64 confusion matrix (rows: target).

  ``predicted`` int ``[...]`` in ``[0, num_classes)``; ``target`` int, same shape.

  Raises:
    ValueError: different shapes, or ids outside ``[0, num_classes)``.
  """
  p, t = np.asarray(predicted).ravel(), np.asarray(target).ravel()
  if np.shape(predicted) != np.shape(target):
    raise ValueError(
      f"predicted {np.shape(predicted)} and target {np.shape(target)} must have the same shape"
    )
  keep = t >= 0
  p, t = p[keep].astype(np.int64), t[keep].astype(np.int64)
  if p.size and (p.min() < 0 or p.max() >= num_classes or t.max() >= num_classes):
    raise ValueError(f"class ids must be in [0, {num_classes})")
  return np.bincount(t * num_classes + p, minlength=num_classes**2).reshape(
    num_classes, num_classes
  )


def miou(matrix: np.ndarray) -> dict:
  """Mean IoU ``TP / (TP + FP + FN)`` of a confusion matrix (rows: target).

  Returns ``{"miou": mean over classes with a non-empty union (mmsegmentation's
  nanmean; nan if none), "iou": [float or None per class], "pixel_accuracy"}``.
  """
  m = np.asarray(matrix, np.float64)
  tp = np.diag(m)
  union = m.sum(0) + m.sum(1) - tp
  iou = [float(a / u) if u > 0 else None for a, u in zip(tp, union)]
  present = [v for v in iou if v is not None]
  total = m.sum()
  return {
    "miou": float(np.mean(present)) if present else float("nan"),
    "iou": iou,
    "pixel_accuracy": float(tp.sum() / total) if total else float("nan"),
  }


def standardisation(x, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel float32 ``(mean [D], std [D])`` of ``x [N, h, w, D]`` over all patches.

  DINOv2's BatchNorm with the train set's statistics frozen (float64 sums over
  ``chunk`` images; a constant channel gets std 1).
  """
  d = x.shape[-1]
  count = float(np.prod(x.shape[:-1]))
  total = np.zeros(d)
  for i in range(0, len(x), chunk):
    total += np.asarray(x[i : i + chunk], np.float64).reshape(-1, d).sum(0)
  mean = total / max(count, 1.0)
  squares = np.zeros(d)
  for i in range(0, len(x), chunk):
    squares += ((np.asarray(x[i : i + chunk], np.float64).reshape(-1, d) - mean) ** 2).sum(0)
  std = np.sqrt(squares / max(count, 1.0))
  std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
  return mean.astype(np.float32), std.astype(np.float32)


def upsampled_logits(params, patches, mean, std, size):
  """``patches [B, h, w, D]`` -> float32 logits ``[B, H, W, C]``, ``(H, W) = size``.

  ``((patches - mean) / std) W + b``, then ``jax.image.resize`` (bilinear, half-pixel
  centres, as PyTorch's ``align_corners=False``).
  """
  logits = ((patches - mean) / std) @ params["w"] + params["b"]
  return jax.image.resize(
    logits, (logits.shape[0],) + tuple(size) + logits.shape[-1:], method="bilinear"
  )


def _loss(params, x, y, mean, std):
  """Mean pixel-wise softmax cross-entropy over the labelled (``y >= 0``) pixels."""
  logits = upsampled_logits(params, x, mean, std, y.shape[1:])
  valid = y >= 0
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(y, 0))
  return jnp.sum(ce * valid) / jnp.maximum(valid.sum(), 1)


def _optimizer(lr, weight_decay, steps: int):
  """AdamW with a cosine decay from ``lr`` to 0, decay on ``W`` only."""
  return optax.adamw(
    optax.cosine_decay_schedule(lr, steps), weight_decay=weight_decay, mask={"w": True, "b": False}
  )


@functools.partial(jax.jit, static_argnames="steps")
def _step(params, opt_state, x, y, mean, std, lr, weight_decay, *, steps: int):
  """One AdamW step of the head on a batch; the new ``(params, opt_state)``."""
  tx = _optimizer(lr, weight_decay, steps)
  grads = jax.grad(_loss)(params, x, y, mean, std)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


@functools.partial(jax.jit, static_argnames="num_classes")
def _predict(params, x, y, mean, std, *, num_classes: int):
  """Argmax classes int32 ``[B, H, W]`` and the batch's confusion counts
  int32 ``[C * C]`` (row = label; pixels with ``y < 0`` left out)."""
  predicted = jnp.argmax(upsampled_logits(params, x, mean, std, y.shape[1:]), -1)
  valid = y >= 0
  index = jnp.where(valid, y, 0) * num_classes + predicted
  counts = jnp.bincount(
    index.ravel(), weights=valid.ravel().astype(jnp.int32), length=num_classes * num_classes
  )
  return predicted.astype(jnp.int32), counts.astype(jnp.int32)


def _check_probe_inputs(
  x, y, x_test, y_test, num_classes, steps, batch_size, lr, weight_decay
) -> None:
  """ValueError for inputs :func:`linear_segmentation_probe` cannot take."""
  if (
    x.ndim != 4
    or x_test.ndim != 4
    or x.shape[3] != x_test.shape[3]
    or y.shape[:1] != x.shape[:1]
    or y_test.shape[:1] != x_test.shape[:1]
    or y.ndim != 3
    or y_test.shape[1:] != y.shape[1:]
    or not len(x)
  ):
    raise ValueError(
      f"patches [N, h, w, D] and masks [N, H, W] (N >= 1) do not fit: "
      f"{x.shape}, {y.shape}, {x_test.shape}, {y_test.shape}"
    )
  if not (np.isfinite(x).all() and np.isfinite(x_test).all()):
    raise ValueError("patch features contain NaN or inf")
  if num_classes < 2 or max(y.max(initial=0), y_test.max(initial=0)) >= num_classes:
    raise ValueError(f"labels must be in [0, num_classes={num_classes}) with num_classes >= 2")
  if steps < 1 or batch_size < 1 or not lr > 0 or not math.isfinite(lr) or weight_decay < 0:
    raise ValueError(
      f"need steps >= 1, batch_size >= 1, lr > 0, weight_decay >= 0; got "
      f"{steps}, {batch_size}, {lr}, {weight_decay}"
    )


def _put(place, batch: dict) -> dict:
  """``batch`` on the devices: ``place(batch)`` (e.g. split over a mesh), else as is."""
  return place(batch) if place is not None else {k: jnp.asarray(v) for k, v in batch.items()}


def linear_segmentation_probe(
  train_patches,
  train_masks,
  test_patches,
  test_masks,
  *,
  num_classes: int,
  steps: int = 500,
  lr: float = 0.05,
  weight_decay: float = 1e-4,
  batch_size: int = 64,
  seed: int = 0,
  place=None,
  progress: bool = False,
  keep_predictions: int | None = None,
) -> dict:
  """DINOv2's linear segmentation protocol on frozen patch features.

  :func:`standardisation` (DINOv2's BNHead), a linear layer from zero,
  :func:`upsampled_logits`, pixel-wise cross-entropy; AdamW with cosine decay from
  ``lr``, ``steps`` batches of ``batch_size`` images drawn with replacement under
  ``fold_in(key(seed), t)``. Test images in padded batches; :func:`miou` of the
  summed confusion matrix.

  Args:
    train_patches: float ``[N, h, w, D]`` NumPy (kept on the host), ``N >= 1``.
    train_masks: int ``[N, H, W]`` in ``[0, num_classes)``.
    test_patches: float ``[M, h, w, D]``; test_masks: int ``[M, H, W]``.
    num_classes: ``>= 2``; steps, lr, weight_decay, batch_size, seed: the AdamW run.
    place: maps a batch ``{"x", "y"}`` to device arrays (e.g.
      ``laplax.sharding.whole_batch``); default: the default device.
    progress: tqdm bars; keep_predictions: first test images returned (default all).

  Returns:
    :func:`miou` plus ``"predictions"``: int32 ``[min(M, keep_predictions), H, W]``.

  Raises:
    ValueError: shapes that do not fit, non-finite features, labels out of range, or
      bad optimiser settings.
  """
  import tqdm

  x, x_test = np.asarray(train_patches, np.float32), np.asarray(test_patches, np.float32)
  y = np.asarray(train_masks).astype(np.int32)
  y_test = np.asarray(test_masks).astype(np.int32)
  _check_probe_inputs(x, y, x_test, y_test, num_classes, steps, batch_size, lr, weight_decay)
  mean, std = (jnp.asarray(a) for a in standardisation(x))
  b, d = int(min(batch_size, len(x))), x.shape[-1]
  params = {
    "w": jnp.zeros((d, num_classes), jnp.float32),
    "b": jnp.zeros((num_classes,), jnp.float32),
  }
  opt_state = _optimizer(lr, weight_decay, steps).init(params)
  key = jax.random.key(int(seed))
  draws = np.asarray(
    jax.vmap(lambda t: jax.random.randint(jax.random.fold_in(key, t), (b,), 0, len(x)))(
      jnp.arange(int(steps))
    )
  )
  for idx in tqdm.tqdm(
    draws,
    desc="segmentation probe",
    unit="step",
    leave=False,
    disable=not progress,
    mininterval=1.0,
  ):
    batch = _put(place, {"x": x[idx], "y": y[idx]})
    params, opt_state = _step(
      params,
      opt_state,
      batch["x"],
      batch["y"],
      mean,
      std,
      jnp.float32(lr),
      jnp.float32(weight_decay),
      steps=int(steps),
    )
  keep = len(x_test) if keep_predictions is None else min(int(keep_predictions), len(x_test))
  counts = np.zeros(num_classes * num_classes, np.int64)
  kept = []
  for i in tqdm.tqdm(
    range(0, len(x_test), b),
    desc="segmentation test",
    unit="batch",
    leave=False,
    disable=not progress,
    mininterval=1.0,
  ):
    n = min(b, len(x_test) - i)
    xb = np.zeros((b,) + x_test.shape[1:], np.float32)
    yb = np.full((b,) + y_test.shape[1:], -1, np.int32)
    xb[:n], yb[:n] = x_test[i : i + n], y_test[i : i + n]
    batch = _put(place, {"x": xb, "y": yb})
    predicted, c = _predict(params, batch["x"], batch["y"], mean, std, num_classes=int(num_classes))
    counts += np.asarray(jax.device_get(c), np.int64)
    if i < keep:
      kept.append(np.asarray(jax.device_get(predicted))[: min(n, keep - i)])
  result = miou(counts.reshape(num_classes, num_classes))
  result["predictions"] = (
    np.concatenate(kept) if kept else np.zeros((0,) + y_test.shape[1:], np.int32)
  )
  return result


def save_segmentation_figure(
  path, images, masks, predictions, num_classes: int, *, title: str = ""
) -> str:
  """Writes a PNG of ``B`` columns: an image, its true mask, the predicted mask.

  Images min-max scaled each; one colour per class (``tab20`` up to 20 classes, else
  ``nipy_spectral``), ignored pixels white. Parent directories are created.

  Args:
    images: float ``[B, H, W, C]``, ``C`` 1 or 3; masks, predictions: int ``[B, h, w]``.
    num_classes: ``>= 1`` (fixes the colours); title: figure title.

  Returns:
    ``path``.

  Raises:
    ValueError: shapes that do not fit, ``B = 0`` or non-finite images.
  """
  images, masks, predictions = (np.asarray(images), np.asarray(masks), np.asarray(predictions))
  if (
    images.ndim != 4
    or images.shape[-1] not in (1, 3)
    or masks.ndim != 3
    or predictions.shape != masks.shape
    or len(images) != len(masks)
    or not len(images)
  ):
    raise ValueError(
      f"need images [B, H, W, 1 or 3] and masks, predictions [B, h, w] "
      f"with B >= 1; got {images.shape}, {masks.shape}, {predictions.shape}"
    )
  if not np.isfinite(images).all():
    raise ValueError("images contains NaN or inf")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib import colors

  n = max(int(num_classes), 1)
  base = plt.get_cmap("tab20" if n <= 20 else "nipy_spectral")
  cmap = colors.ListedColormap(
    [base(i / max(n - 1, 1)) if n > 20 else base(i) for i in range(n)]
  ).with_extremes(under="white")
  b = len(images)
  fig, axes = plt.subplots(3, b, figsize=(1.6 * b, 5.0), squeeze=False)
  for i in range(b):
    x = images[i].astype(np.float64)
    x = (x - x.min()) / (x.max() - x.min()) if x.max() > x.min() else np.zeros_like(x)
    axes[0, i].imshow(
      x[..., 0] if x.shape[-1] == 1 else x, cmap="gray", vmin=0, vmax=1, interpolation="nearest"
    )
    for row, m in ((1, masks[i]), (2, predictions[i])):
      axes[row, i].imshow(
        np.where(m < 0, -1, m), cmap=cmap, vmin=-0.5, vmax=n - 0.5, interpolation="nearest"
      )
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
