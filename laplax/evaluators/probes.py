"""Frozen-feature evaluations of self-supervised (DINO) models: the evaluators ``knn``,
``linear_probe``, ``raw_pixel_knn`` and ``patch_pca`` and their mathematics.

Sources: DINO's weighted k-NN and linear evaluation (Caron et al., ICCV 2021,
arXiv 2104.14294, section 4.1; the k-NN of Wu et al., CVPR 2018) and the patch-PCA
figure of DINOv2 (Oquab et al. 2023, arXiv 2304.07193, figure 1; its second,
foreground-only PCA is not done). NumPy or JAX arrays in, NumPy values out.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from PIL import Image

from laplax.config import validation as config_lib
from laplax.evaluators.base import EVAL, Context, Evaluator
from laplax.tasks.base import Task


def _features(x, name: str) -> np.ndarray:
  """``x`` as a finite float32 ``[n, d]`` array, or ValueError."""
  x = np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"{name} must be 2-D [n, dim], got shape {x.shape}")
  if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
    raise ValueError(f"{name} must be numeric, got dtype {x.dtype}")
  x = x.astype(np.float32)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{name} contains NaN or inf")
  return x


def _labels(y, n: int, num_classes: int, name: str) -> np.ndarray:
  """``y`` as int32 ``[n]`` with values in ``[0, num_classes)``, or ValueError."""
  y = np.asarray(y)
  if y.ndim != 1 or y.shape[0] != n:
    raise ValueError(f"{name} must have shape ({n},), got {y.shape}")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"{name} must be integers, got dtype {y.dtype}")
  if n and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"{name} must lie in [0, {num_classes}), got values in [{y.min()}, {y.max()}]")
  return y.astype(np.int32)


def _check_dims(train: np.ndarray, test: np.ndarray) -> None:
  if train.shape[1] != test.shape[1]:
    raise ValueError(
      f"train features have dim {train.shape[1]} but test features have dim {test.shape[1]}"
    )


def _check_num_classes(num_classes, minimum: int) -> int:
  if (
    isinstance(num_classes, bool)
    or not isinstance(num_classes, (int, np.integer))
    or num_classes < minimum
  ):
    raise ValueError(f"num_classes must be an integer >= {minimum}, got {num_classes!r}")
  return int(num_classes)


# --------------------------------------------------------------------------- k-NN


def _l2_normalize(x: jax.Array) -> jax.Array:
  """Rows of ``x`` divided by their L2 norm (zero rows stay zero)."""
  norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
  return x / jnp.maximum(norm, 1e-12)


@functools.partial(jax.jit, static_argnames=("k", "num_classes"))
def _knn_chunks(train, train_labels, test_chunks, temperature, *, k: int, num_classes: int):
  """Predictions ``int32 [n_chunks, chunk]`` for ``test_chunks [n_chunks, chunk, D]``."""
  train = _l2_normalize(train)

  def one_chunk(test):
    sims = _l2_normalize(test) @ train.T  # [chunk, N]
    top_sims, top_idx = jax.lax.top_k(sims, k)  # [chunk, k], descending
    # exp(sim / T) up to a per-row factor exp(-max / T), which leaves the
    # argmax unchanged and keeps small temperatures finite. (The max is a
    # reduction, not ``top_sims[:, :1]``: a second slice of the sort output
    # stops XLA:CPU from rewriting the sort into its fast TopK, 50x slower.)
    weights = jnp.exp((top_sims - jnp.max(top_sims, axis=1, keepdims=True)) / temperature)
    votes = jax.nn.one_hot(train_labels[top_idx], num_classes, dtype=weights.dtype)
    votes = jnp.einsum("ck,ckn->cn", weights, votes)  # [chunk, num_classes]
    return jnp.argmax(votes, axis=-1).astype(jnp.int32)

  return jax.lax.map(one_chunk, test_chunks)


def knn_predict(
  train_features,
  train_labels,
  test_features,
  *,
  num_classes: int,
  k: int = 20,
  temperature: float = 0.07,
  chunk_size: int = 1024,
) -> np.ndarray:
  """Weighted k-NN classification of frozen features (DINO, Caron et al. 2021).

  L2-normalised features; the ``k`` train features of highest cosine similarity
  ``s_j`` each add ``exp(s_j / temperature)`` to their label's score; the largest
  score wins (smallest label on a tie). One jitted call over chunks of
  ``chunk_size`` test rows: memory ``O(chunk_size * N)``.

  Args:
    train_features: float ``[N, D]``; train_labels: int ``[N]`` in ``[0, num_classes)``.
    test_features: float ``[M, D]``.
    num_classes: number of classes (keyword only).
    k: neighbours, ``1 <= k <= N`` (DINO: 20).
    temperature: ``T > 0`` (DINO: 0.07); ``T -> inf`` is the plain majority vote.
    chunk_size: test rows per chunk, ``>= 1``.

  Returns:
    int32 ``[M]`` predicted labels.

  Raises:
    ValueError: features not 2-D, not finite or of different dims; labels of the wrong
      shape, type or range; ``k`` outside ``[1, N]``; ``temperature <= 0``;
      ``chunk_size < 1``.
  """
  num_classes = _check_num_classes(num_classes, 1)
  train = _features(train_features, "train_features")
  test = _features(test_features, "test_features")
  _check_dims(train, test)
  n = train.shape[0]
  labels = _labels(train_labels, n, num_classes, "train_labels")
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
    raise ValueError(f"k must be an integer in [1, {n}] (the train set size), got {k!r}")
  if not temperature > 0 or not math.isfinite(temperature):
    raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
  if (
    isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
  ):
    raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
  m = test.shape[0]
  if m == 0:
    return np.zeros((0,), np.int32)
  chunk = min(int(chunk_size), m)
  n_chunks = -(-m // chunk)
  padded = np.zeros((n_chunks * chunk, test.shape[1]), np.float32)
  padded[:m] = test
  preds = _knn_chunks(
    jnp.asarray(train),
    jnp.asarray(labels),
    jnp.asarray(padded.reshape(n_chunks, chunk, -1)),
    jnp.float32(temperature),
    k=int(k),
    num_classes=num_classes,
  )
  return np.asarray(preds).reshape(-1)[:m].astype(np.int32)


def knn_accuracy(train_features, train_labels, test_features, test_labels, **kw) -> float:
  """Top-1 accuracy of :func:`knn_predict` on ``test_labels`` (int ``[M]``).

  ``**kw`` go to :func:`knn_predict` (``num_classes`` required). Returns a Python
  float in ``[0, 1]`` (``nan`` for an empty test set).

  Raises:
    ValueError: as :func:`knn_predict`, or ``test_labels`` of the wrong shape or range.
  """
  if "num_classes" not in kw:
    raise ValueError("knn_accuracy needs the keyword argument num_classes")
  preds = knn_predict(train_features, train_labels, test_features, **kw)
  y = _labels(test_labels, preds.shape[0], int(kw["num_classes"]), "test_labels")
  return float(np.mean(preds == y)) if y.size else float("nan")


# ------------------------------------------------------------------ linear probe


@functools.partial(jax.jit, static_argnames=("num_classes", "steps", "batch_size"))
def _train_linear(
  x,
  y,
  x_test,
  y_test,
  mean,
  std,
  lr,
  weight_decay,
  key,
  *,
  num_classes: int,
  steps: int,
  batch_size: int,
):
  """Trains ``softmax(x W + b)`` and returns ``(accuracy, train_accuracy, loss)``."""
  x = (x - mean) / std
  x_test = (x_test - mean) / std
  n, d = x.shape
  params = {
    "w": jnp.zeros((d, num_classes), jnp.float32),
    "b": jnp.zeros((num_classes,), jnp.float32),
  }
  schedule = optax.cosine_decay_schedule(lr, steps)
  tx = optax.adamw(schedule, weight_decay=weight_decay, mask={"w": True, "b": False})
  opt_state = tx.init(params)

  def loss_fn(p, xb, yb):
    logits = xb @ p["w"] + p["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  def step(carry, t):
    p, s = carry
    idx = jax.random.randint(jax.random.fold_in(key, t), (batch_size,), 0, n)
    grads = jax.grad(loss_fn)(p, x[idx], y[idx])
    updates, s = tx.update(grads, s, p)
    return (optax.apply_updates(p, updates), s), None

  (params, _), _ = jax.lax.scan(step, (params, opt_state), jnp.arange(steps))

  def accuracy(xs, ys):
    return jnp.mean(jnp.argmax(xs @ params["w"] + params["b"], -1) == ys)

  return accuracy(x_test, y_test), accuracy(x, y), loss_fn(params, x, y)


def linear_probe(
  train_features,
  train_labels,
  test_features,
  test_labels,
  *,
  num_classes: int,
  steps: int = 1000,
  lr: float = 0.02,
  weight_decay: float = 1e-4,
  batch_size: int = 1024,
  seed: int = 0,
) -> dict:
  """Linear evaluation: multinomial logistic regression on frozen features (DINO, sec. 4.1).

  Features standardised with the train mean and std (a constant feature gets std 1);
  ``logits = x W + b`` from zero, mean softmax cross-entropy, AdamW (decay on ``W``
  only) with cosine decay from ``lr`` to 0 over ``steps`` minibatches of
  ``batch_size`` rows drawn with replacement. Deterministic under ``seed``; one
  jitted call.

  Args:
    train_features: float ``[N, D]``; train_labels: int ``[N]``.
    test_features: float ``[M, D]``; test_labels: int ``[M]``.
    num_classes: ``>= 2``; steps: ``>= 1``; lr: ``> 0``; weight_decay: ``>= 0``.
    batch_size: rows per step, ``>= 1`` (capped at ``N``); seed: minibatch draws.

  Returns:
    Python floats: ``accuracy`` (``nan`` for ``M = 0``), ``train_accuracy``, ``loss``
    (final mean train cross-entropy, without weight decay).

  Raises:
    ValueError: features not 2-D, not finite, of different dims or an empty train set;
      labels of the wrong shape, type or range; or a setting out of range.
  """
  num_classes = _check_num_classes(num_classes, 2)
  x = _features(train_features, "train_features")
  x_test = _features(test_features, "test_features")
  _check_dims(x, x_test)
  if x.shape[0] == 0:
    raise ValueError("linear_probe needs at least one train example")
  y = _labels(train_labels, x.shape[0], num_classes, "train_labels")
  y_test = _labels(test_labels, x_test.shape[0], num_classes, "test_labels")
  for name, value in (("steps", steps), ("batch_size", batch_size)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  if not lr > 0 or not math.isfinite(lr):
    raise ValueError(f"lr must be finite and > 0, got {lr!r}")
  if not weight_decay >= 0 or not math.isfinite(weight_decay):
    raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay!r}")
  x64 = x.astype(np.float64)
  mean = x64.mean(axis=0)
  std = x64.std(axis=0)
  std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
  acc, train_acc, loss = _train_linear(
    jnp.asarray(x),
    jnp.asarray(y),
    jnp.asarray(x_test),
    jnp.asarray(y_test),
    jnp.asarray(mean, jnp.float32),
    jnp.asarray(std, jnp.float32),
    jnp.float32(lr),
    jnp.float32(weight_decay),
    jax.random.key(int(seed)),
    num_classes=num_classes,
    steps=int(steps),
    batch_size=int(min(batch_size, x.shape[0])),
  )
  return {
    "accuracy": float(acc) if x_test.shape[0] else float("nan"),
    "train_accuracy": float(train_acc),
    "loss": float(loss),
  }


# ------------------------------------------------------------ patch PCA figure


def patch_pca_rgb(patch_tokens, grid: Sequence[int]) -> np.ndarray:
  """Patch tokens to an RGB map by PCA (DINO's qualitative figure).

  The pooled, centred patch vectors projected on the first three principal
  components (float64; each sign makes its largest loading positive), min-max scaled
  to ``0..255`` over all patches (a constant projection maps to 0) as R, G, B.

  Args:
    patch_tokens: float ``[B, gh * gw, D]`` without the class token, row-major.
    grid: ``(gh, gw)``.

  Returns:
    uint8 ``[B, gh, gw, 3]``.

  Raises:
    ValueError: tokens not 3-D or not finite, ``D < 3``, or a grid that is not two
      positive integers matching the number of tokens.
  """
  tokens = np.asarray(patch_tokens)
  if tokens.ndim != 3:
    raise ValueError(f"patch_tokens must be 3-D [B, gh*gw, D], got shape {tokens.shape}")
  grid = tuple(grid)
  if len(grid) != 2 or any(
    isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1 for g in grid
  ):
    raise ValueError(f"grid must be two positive integers (gh, gw), got {grid!r}")
  gh, gw = int(grid[0]), int(grid[1])
  b, t, d = tokens.shape
  if gh * gw != t:
    raise ValueError(f"grid {gh}x{gw} = {gh * gw} patches but patch_tokens has {t}")
  if d < 3:
    raise ValueError(f"patch_tokens need dim D >= 3 for three components, got {d}")
  if b == 0:
    return np.zeros((0, gh, gw, 3), np.uint8)
  x = tokens.reshape(b * t, d).astype(np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError("patch_tokens contains NaN or inf")
  x = x - x.mean(axis=0)
  eigvals, eigvecs = np.linalg.eigh(x.T @ x)  # ascending
  comps = eigvecs[:, ::-1][:, :3]  # [D, 3], descending
  pivot = np.argmax(np.abs(comps), axis=0)
  comps = comps * np.where(comps[pivot, np.arange(3)] < 0, -1.0, 1.0)
  proj = x @ comps  # [B*T, 3]
  lo, hi = proj.min(axis=0), proj.max(axis=0)
  span = hi - lo
  # A component without spread (relative to the largest) maps to 0.
  flat = span <= 1e-12 * max(float(span.max()), 1e-300)
  scaled = np.where(flat, 0.0, (proj - lo) / np.where(flat, 1.0, span) * 255.0)
  rgb = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
  return rgb.reshape(b, gh, gw, 3)


def _to_uint8_image(image: np.ndarray) -> np.ndarray:
  """``[H, W, C]`` of any range to uint8 ``[H, W, 3]`` by per-image min-max."""
  image = image.astype(np.float64)
  lo, hi = image.min(), image.max()
  scaled = (image - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(image)
  out = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
  return np.repeat(out, 3, axis=-1) if out.shape[-1] == 1 else out


def save_pca_figure(path, images, rgb, *, margin: int = 4, min_tile: int = 112) -> None:
  """Writes a PNG: the images on top, their PCA maps (:func:`patch_pca_rgb`) below.

  Images min-max scaled each; maps upsampled by nearest neighbour; tiles enlarged by
  ``s = ceil(min_tile / min(H, W))``; the PNG is ``B W s + (B + 1) margin`` by
  ``2 H s + 3 margin`` pixels. Parent directories are created.

  Args:
    path: the PNG; images: float ``[B, H, W, C]``, ``C`` 1 or 3, any range.
    rgb: uint8 ``[B, gh, gw, 3]``; margin: white pixels, ``>= 0``; min_tile: ``>= 1``.

  Raises:
    ValueError: images not ``[B, H, W, 1 or 3]`` or not finite, ``rgb`` not
      ``[B, gh, gw, 3]``, different batch sizes, ``B = 0``, or a bad margin/tile.
  """
  images = np.asarray(images)
  rgb = np.asarray(rgb)
  if images.ndim != 4 or images.shape[-1] not in (1, 3):
    raise ValueError(f"images must be [B, H, W, 1 or 3], got shape {images.shape}")
  if rgb.ndim != 4 or rgb.shape[-1] != 3:
    raise ValueError(f"rgb must be [B, gh, gw, 3], got shape {rgb.shape}")
  if images.shape[0] != rgb.shape[0]:
    raise ValueError(f"images hold {images.shape[0]} images but rgb holds {rgb.shape[0]} maps")
  b, h, w, _ = images.shape
  if b == 0 or h == 0 or w == 0 or rgb.shape[1] == 0 or rgb.shape[2] == 0:
    raise ValueError(f"nothing to draw: images {images.shape}, rgb {rgb.shape}")
  if not np.all(np.isfinite(images)):
    raise ValueError("images contains NaN or inf")
  if margin < 0 or min_tile < 1:
    raise ValueError(f"need margin >= 0 and min_tile >= 1, got {margin}, {min_tile}")
  if rgb.dtype != np.uint8:
    rgb = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
  s = max(1, math.ceil(min_tile / min(h, w)))
  th, tw = h * s, w * s
  canvas = np.full((2 * th + 3 * margin, b * tw + (b + 1) * margin, 3), 255, np.uint8)
  gh, gw = rgb.shape[1:3]
  rows = np.arange(th) // s * gh // h  # nearest neighbour to H x W, then x s
  cols = np.arange(tw) // s * gw // w
  for i in range(b):
    x0 = margin + i * (tw + margin)
    image = np.repeat(np.repeat(_to_uint8_image(images[i]), s, 0), s, 1)
    canvas[margin : margin + th, x0 : x0 + tw] = image
    canvas[2 * margin + th : 2 * margin + 2 * th, x0 : x0 + tw] = rgb[i][rows][:, cols]
  os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
  Image.fromarray(canvas, "RGB").save(path, format="PNG")


#: File name of the patch-feature PCA picture (``patch_pca``).
PCA_FIGURE = "patch_pca.png"
#: The k-NN settings of ``knn`` and ``raw_pixel_knn`` (DINO's k and T).
KNN_DEFAULTS = {"knn_k": 20, "knn_temperature": 0.07}


def teacher_features(task: Task, state: Any, ctx: Context, split: str):
  """The DINO teacher's class-token features of ``split``, once per round in ``ctx.cache``.

  :meth:`laplax.tasks.dino.DINOTask.features`; the eval split's carry the patch tokens
  of its first ``ctx.tokens`` images.
  """
  key = ("teacher_features", split)
  if key not in ctx.cache:
    _, params = task.backbone(state)
    tokens = ctx.tokens if split == task.config.data.eval_split else 0
    ctx.cache[key] = task.features(params, split, with_tokens=tokens)
  return ctx.cache[key]


class _KNNSettings(Evaluator):
  """The k-NN settings ``eval.knn_k`` (>= 1) and ``eval.knn_temperature`` (> 0)."""

  tasks = ("dino",)
  defaults = KNN_DEFAULTS

  @classmethod
  def validate(cls, config) -> None:
    """Raises ConfigError: ``knn_k`` < 1 or ``knn_temperature`` <= 0."""
    config_lib.check_int(config, "eval.knn_k", 1)
    config_lib.check_float(config, "eval.knn_temperature", 0.0, open_min=True)


class KNN(_KNNSettings):
  """``knn``: DINO's weighted k-NN on the teacher's class-token features (train -> eval split).

  Settings ``eval.knn_k``, ``eval.knn_temperature``; writes ``knn_accuracy`` in [0, 1]
  and ``num_examples``.
  """

  name = "knn"

  def run(self, state: Any, ctx: Context) -> dict:
    data, e = self.config.data, self.settings
    train_x, train_y, _, _ = teacher_features(self.task, state, ctx, data.train_split)
    test_x, test_y, _, _ = teacher_features(self.task, state, ctx, data.eval_split)
    accuracy = knn_accuracy(
      train_x,
      train_y,
      test_x,
      test_y,
      num_classes=self.task.num_classes,
      k=e["knn_k"],
      temperature=e["knn_temperature"],
    )
    return {"knn_accuracy": float(accuracy), "num_examples": int(len(test_y))}


class LinearProbe(Evaluator):
  """``linear_probe``: :func:`linear_probe` on the teacher's class-token features.

  Seeded with ``config.seed``; writes ``linear_probe_accuracy`` in [0, 1].
  """

  name = "linear_probe"
  tasks = ("dino",)

  def run(self, state: Any, ctx: Context) -> dict:
    data = self.config.data
    train_x, train_y, _, _ = teacher_features(self.task, state, ctx, data.train_split)
    test_x, test_y, _, _ = teacher_features(self.task, state, ctx, data.eval_split)
    probe = linear_probe(
      train_x, train_y, test_x, test_y, num_classes=self.task.num_classes, seed=self.config.seed
    )
    return {"linear_probe_accuracy": float(probe["accuracy"])}


class RawPixelKNN(_KNNSettings):
  """``raw_pixel_knn``: ``knn`` on the normalised pixels; ``raw_pixel_knn_accuracy`` in [0, 1]."""

  name = "raw_pixel_knn"
  stages = (EVAL,)

  def run(self, state: Any, ctx: Context) -> dict:
    del state, ctx  # the pixels, no network
    data, e = self.config.data, self.settings
    pixels, labels = {}, {}
    for split in (data.train_split, data.eval_split):
      rows, ys = [], []
      for b in self.task.eval_batches(split):
        n = int(b["mask"].sum())
        rows.append(b["image"][:n].reshape(n, -1))
        ys.append(b["label"][:n])
      pixels[split], labels[split] = np.concatenate(rows), np.concatenate(ys)
    accuracy = knn_accuracy(
      pixels[data.train_split],
      labels[data.train_split],
      pixels[data.eval_split],
      labels[data.eval_split],
      num_classes=self.task.num_classes,
      k=e["knn_k"],
      temperature=e["knn_temperature"],
    )
    return {"raw_pixel_knn_accuracy": float(accuracy)}


class PatchPCA(Evaluator):
  """``patch_pca``: :func:`patch_pca_rgb` of the first ``eval.pca_images`` eval images.

  Written to :data:`PCA_FIGURE` in ``ctx.out_dir``; no numbers.
  """

  name = "patch_pca"
  stages = (EVAL,)
  tasks = ("dino",)
  defaults = {"pca_images": 8}

  @classmethod
  def validate(cls, config) -> None:
    """Raises ConfigError: ``eval.pca_images`` < 0."""
    config_lib.check_int(config, "eval.pca_images", 0)

  def tokens_wanted(self, ctx: Context) -> int:
    """``eval.pca_images`` when there is a directory for the figure."""
    return int(self.settings["pca_images"]) if ctx.out_dir is not None else 0

  def run(self, state: Any, ctx: Context) -> dict:
    num = self.tokens_wanted(ctx)
    if not num:
      return {}
    _, _, shown, tokens = teacher_features(self.task, state, ctx, self.config.data.eval_split)
    p = self.config.model.patch_size
    figure = os.path.join(ctx.out_dir, PCA_FIGURE)
    save_pca_figure(
      figure, shown, patch_pca_rgb(tokens, (shown.shape[1] // p, shown.shape[2] // p))
    )
    ctx.figures.append(figure)
    ctx.say(f"patch-feature PCA of {num} test images: {figure}")
    return {}
