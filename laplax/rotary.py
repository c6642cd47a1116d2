"""Rotary position embedding (Su et al. 2021, RoFormer eq. 34) in its two conventions.

Half-split pairs ``(x_i, x_{i + head_dim/2})`` at position ``t`` turn by ``t *
theta^(-2i/head_dim)``: ``"roformer"`` by ``+angle`` with a float64 table rounded to
float32; ``"nanochat"`` (nanochat/gpt.py, ``apply_rotary_emb``) by ``-angle`` with
PyTorch's float32 table stored in bfloat16. The two differ by a sign flip of the
second half of every ``W_Q``, ``W_K`` head, so weights transfer only within one.

:class:`RotarySpec` is the rotary sub-spec of an attention spec (its
``rope``; ``None`` where the rotary is off).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

STYLES = ("roformer", "nanochat")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RotarySpec:
  """The rotary options under their config names (``model.rope_theta``,
  ``model.rope_style``): the ``rope`` sub-spec of an attention spec
  (``laplax.models.spec.AttentionSpec.rope``,
  ``laplax.attention.MultiHeadAttention.rope``; ``None`` there = no rotary),
  passed whole to :func:`laplax.attention.norm_and_rotate`, which calls
  :func:`rotary` with them. The fields' metadata gives their config checks
  (the model spec raises them, naming the key).

  Attributes:
    rope_theta: the rotary base (10,000 as nanochat's first release; a
      later nanochat uses 100,000).
    rope_style: the convention, one of :data:`STYLES`.
  """

  rope_theta: float = dataclasses.field(
    default=10_000.0, metadata={"check": "float", "key": None, "open_min": True}
  )
  rope_style: str = dataclasses.field(
    default="roformer", metadata={"check": "choice", "key": None, "choices": STYLES}
  )


def rotary_table(
  length: int, head_dim: int, theta: float = 10_000.0
) -> tuple[np.ndarray, np.ndarray]:
  """``(sin, cos)`` of ``t * theta^(-2i/head_dim)``, each float32 ``[length, head_dim // 2]``.

  Computed in float64 with NumPy and rounded once: jitted models get constants.
  """
  half = head_dim // 2
  freq = theta ** (-np.arange(half, dtype=np.float64) / half)
  angle = np.arange(length, dtype=np.float64)[:, None] * freq
  return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


def nanochat_table(
  length: int, head_dim: int, theta: float = 10_000.0
) -> tuple[np.ndarray, np.ndarray]:
  """nanochat's rotary ``(sin, cos)``: bfloat16 values as float32 ``[length, head_dim // 2]``.

  As ``_precompute_rotary_embeddings`` of nanochat/gpt.py: ``inv_freq = 1 / theta **
  (arange(0, head_dim, 2) / head_dim)`` in float32, ``outer(t, inv_freq)``, then
  ``cos``/``sin`` rounded to bfloat16 (via float64 -> float32: 4 of d20's 2.6M entries
  differ from PyTorch's by one bfloat16 step).
  """
  channels = np.arange(0, head_dim, 2, dtype=np.float32)
  power = np.float64(theta) ** (channels / np.float32(head_dim)).astype(np.float64)
  inv_freq = np.float32(1.0) / power.astype(np.float32)
  angle = np.outer(np.arange(length, dtype=np.float32), inv_freq).astype(np.float32)
  angle = angle.astype(np.float64)
  as_bf16 = lambda a: a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
  return as_bf16(np.sin(angle)), as_bf16(np.cos(angle))


def rotary(
  x: jax.Array,
  positions: Any,
  theta: float = 10_000.0,
  max_length: int | None = None,
  style: str = "roformer",
) -> jax.Array:
  """Rotary position embedding, half-split form, in the convention ``style`` (:data:`STYLES`).

  Computed in float32, rounded once to ``x.dtype``.

  Args:
    x: ``[batch, length, heads, head_dim]`` (``head_dim`` even).
    positions: int ``[batch, length]`` or ``[length]``, ``>= 0``; concrete ones index
      the table in NumPy, traced ones gather from ``max_length`` rows (clamped).
    theta: base of the frequencies; style: ``"roformer"`` or ``"nanochat"``.

  Returns:
    ``x`` rotated, same shape and dtype.

  Raises:
    ValueError: traced ``positions`` without ``max_length``, or an unknown style.
  """
  if style not in STYLES:
    raise ValueError(f"rotary style {style!r} is unknown; use one of {', '.join(STYLES)}")
  table = nanochat_table if style == "nanochat" else rotary_table
  try:
    positions = np.asarray(positions, dtype=np.int64)
    sin, cos = table(int(positions.max(initial=0)) + 1, x.shape[-1], theta)
    sin, cos = sin[positions], cos[positions]
  except jax.errors.TracerArrayConversionError:
    if max_length is None:
      raise ValueError(
        "rotary got traced positions without max_length; pass "
        "max_length, the number of positions the table must cover"
      ) from None
    sin, cos = table(max_length, x.shape[-1], theta)
    sin = jnp.take(sin, positions, axis=0, mode="clip")
    cos = jnp.take(cos, positions, axis=0, mode="clip")
  sin, cos = sin[..., None, :], cos[..., None, :]  # broadcast over heads
  if style == "nanochat":
    sin = -sin  # turned by -angle
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)
