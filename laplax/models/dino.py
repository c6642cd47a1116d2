"""DINO: self-distillation with no labels (Caron et al. 2021, "Emerging Properties
in Self-Supervised Vision Transformers").

The student and the teacher are the same network, a laplax
:class:`~laplax.models.vit.ViT` backbone (class-token features, any Laplacian
and spectral settings) followed by :class:`DINOHead`. The student sees every
crop; the teacher sees only the global crops and is an exponential moving
average of the student. This module holds the networks and the pure functions
of the method (loss, centre and teacher updates, collapse statistics); the
schedules and the training step live in ``laplax.tasks``.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax.models.vit import ViT


class DINOHead(nn.Module):
  """The DINO projection head (Caron et al. 2021, Sec. 3.1 and Appendix).

  ``num_layers`` Dense layers with GELU between them (``width -> hidden_dim
  -> ... -> bottleneck_dim``), L2 normalisation, then a weight-normalised
  linear layer without bias to ``out_dim`` whose columns have norm fixed to 1
  (``norm_last_layer=True`` in the reference code): its kernel ``v`` is a
  parameter and the layer computes ``x @ (v / ||v||_column)``.

  ``x`` float ``[..., width]`` -> float32 ``[..., out_dim]``.

  Attributes:
    out_dim: output dimension K (65536 for ImageNet in the paper).
    hidden_dim: width of the hidden layers (2048).
    bottleneck_dim: dimension before the L2 normalisation (256).
    num_layers: Dense layers before the normalisation (3).
  """

  out_dim: int
  hidden_dim: int = 2048
  bottleneck_dim: int = 256
  num_layers: int = 3

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.initializers.truncated_normal(0.02)
    x = x.astype(jnp.float32)
    for i in range(self.num_layers):
      last = i == self.num_layers - 1
      x = nn.Dense(
        self.bottleneck_dim if last else self.hidden_dim, kernel_init=init, name=f"mlp{i}"
      )(x)
      if not last:
        x = nn.gelu(x, approximate=False)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    v = self.param("last_layer", init, (self.bottleneck_dim, self.out_dim), jnp.float32)
    w = v / jnp.maximum(jnp.linalg.norm(v, axis=0, keepdims=True), 1e-12)
    return x @ w


class DINO(nn.Module):
  """Backbone + head over multi-crop views (the reference ``MultiCropWrapper``).

  ``global_crops`` float ``[G, B, H, W, C]`` and optional ``local_crops``
  float ``[L, B, h, w, C]`` (another resolution; the backbone resizes its
  position embedding to it) -> ``(logits float32 [G + L, B, out_dim],
  features float32 [G + L, B, width])``, the head outputs and the backbone's
  class-token features of every view, global views first.

  Attributes:
    backbone: a :class:`ViT` with ``num_classes=0`` (features only).
    head: the :class:`DINOHead`.
  """

  backbone: ViT
  head: DINOHead

  def __call__(
    self, global_crops: jax.Array, local_crops: jax.Array | None = None, *, train: bool = False
  ):
    views = [global_crops]
    if local_crops is not None and local_crops.shape[0]:
      views.append(local_crops)
    feats = []
    for crops in views:  # one backbone call per resolution
      n, b = crops.shape[:2]
      f, _ = self.backbone(crops.reshape((n * b,) + crops.shape[2:]), train=train)
      feats.append(f.astype(jnp.float32).reshape(n, b, -1))
    feats = jnp.concatenate(feats, axis=0)
    return self.head(feats), feats


def dino_loss(
  student_logits: jax.Array,
  teacher_logits: jax.Array,
  center: jax.Array,
  *,
  student_temp: float,
  teacher_temp: float | jax.Array,
) -> jax.Array:
  """The DINO cross-entropy over all pairs of different views (Eq. 3 of the paper).

  ``P_t = softmax((t - center) / teacher_temp)`` (centred, sharpened teacher,
  no gradient) and ``log P_s = log_softmax(s / student_temp)``; the loss is the
  mean over pairs (teacher view ``i`` of the G global views, student view
  ``v`` of all V views, ``v != i``) and over the batch of
  ``-sum_k P_t[i, k] log P_s[v, k]``.

  Args:
    student_logits: float ``[V, B, K]`` (global views first).
    teacher_logits: float ``[G, B, K]``, ``G <= V``.
    center: float32 ``[K]``.
    student_temp, teacher_temp: positive temperatures (0.1 and 0.04..0.07).

  Returns:
    float32 scalar.

  Raises:
    ValueError: fewer than two views in all, or more teacher than student views.
  """
  num_views, num_teacher = student_logits.shape[0], teacher_logits.shape[0]
  if num_views < 2 or num_teacher > num_views:
    raise ValueError(
      f"DINO needs >= 2 views and teacher views <= student views, got "
      f"{num_teacher} teacher and {num_views} student views"
    )
  q = jax.lax.stop_gradient(teacher_probs(teacher_logits, center, teacher_temp))
  log_p = jax.nn.log_softmax(student_logits.astype(jnp.float32) / student_temp, axis=-1)
  ce = -jnp.einsum("ibk,vbk->iv", q, log_p) / q.shape[1]  # [G, V], mean over batch
  pairs = jnp.arange(num_teacher)[:, None] != jnp.arange(num_views)[None, :]
  return jnp.sum(jnp.where(pairs, ce, 0.0)) / jnp.sum(pairs)


def teacher_probs(
  teacher_logits: jax.Array, center: jax.Array, teacher_temp: float | jax.Array
) -> jax.Array:
  """Centred and sharpened teacher distribution, float32 ``softmax((t - c) / T)``."""
  return jax.nn.softmax((teacher_logits.astype(jnp.float32) - center) / teacher_temp, axis=-1)


def update_center(center: jax.Array, teacher_logits: jax.Array, momentum: float) -> jax.Array:
  """Centre EMA (Eq. 4): ``m * c + (1 - m) * mean of the teacher logits``.

  ``center`` float32 ``[K]``; ``teacher_logits`` ``[..., K]`` (mean over every
  leading axis, i.e. over views and batch); ``momentum`` in [0, 1] (0.9).
  """
  batch_center = jnp.mean(teacher_logits.astype(jnp.float32).reshape(-1, center.shape[-1]), axis=0)
  return momentum * center + (1.0 - momentum) * batch_center


def update_teacher(teacher: Any, student: Any, momentum: float | jax.Array) -> Any:
  """Teacher EMA: ``theta_t <- m * theta_t + (1 - m) * theta_s`` leaf by leaf."""
  return jax.tree_util.tree_map(lambda t, s: momentum * t + (1.0 - momentum) * s, teacher, student)


def collapse_statistics(
  student_logits: jax.Array,
  teacher_logits: jax.Array,
  center: jax.Array,
  *,
  student_temp: float,
  teacher_temp: float | jax.Array,
) -> dict:
  """The collapse monitor of DINO's Sec. 5.3 (Fig. 7), float32 scalars, in nats.

  Returns:
    ``teacher_entropy``: mean over teacher views and examples of ``H(P_t)``;
    tends to ``log K`` when the outputs collapse to the uniform distribution.
    ``teacher_marginal_entropy``: ``H`` of the batch-mean ``P_t``; tends to 0
    when every example collapses onto the same dimension.
    ``kl_teacher_student``: mean over pairs of different views of
    ``KL(P_t || P_s)``; tends to 0 under either collapse (the paper's signal).
  """
  q = teacher_probs(teacher_logits, center, teacher_temp)  # [G, B, K]
  log_q = jnp.log(jnp.maximum(q, 1e-30))
  entropy = -jnp.sum(q * log_q, axis=-1)  # [G, B]
  mean_q = q.mean(axis=(0, 1))
  marginal = -jnp.sum(mean_q * jnp.log(jnp.maximum(mean_q, 1e-30)))
  log_p = jax.nn.log_softmax(student_logits.astype(jnp.float32) / student_temp, axis=-1)
  num_teacher, num_views = q.shape[0], log_p.shape[0]
  ce = -jnp.einsum("ibk,vbk->iv", q, log_p) / q.shape[1]
  kl = ce - entropy.mean(axis=1)[:, None]
  pairs = jnp.arange(num_teacher)[:, None] != jnp.arange(num_views)[None, :]
  return {
    "teacher_entropy": entropy.mean(),
    "teacher_marginal_entropy": marginal,
    "kl_teacher_student": jnp.sum(jnp.where(pairs, kl, 0.0)) / jnp.sum(pairs),
  }


def collapsed(
  stats: dict, out_dim: int, *, uniform_fraction: float = 0.9, kl_floor: float = 1e-3
) -> str | None:
  """Names the collapse the statistics of :func:`collapse_statistics` show, or None.

  ``"uniform"``: the mean teacher entropy exceeds ``uniform_fraction * log K``;
  ``"one dimension"``: the batch-mean teacher distribution has entropy below
  ``log 2`` (nearly one dimension used) while the KL is below ``kl_floor``.
  ``stats`` holds Python floats (logged values).
  """
  if stats["teacher_entropy"] > uniform_fraction * math.log(out_dim):
    return "uniform"
  if stats["teacher_marginal_entropy"] < math.log(2) and stats["kl_teacher_student"] < kl_floor:
    return "one dimension"
  return None
