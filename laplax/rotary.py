"""Rotary position embedding (Su et al. 2021, RoFormer eq. 34) in its two conventions.

Both rotate the half-split channel pairs ``(x_i, x_{i + head_dim/2})`` of a
token at position ``t`` by the angle ``t * theta^(-2i/head_dim)``, so a
rotated query and key meet through ``t_q - t_k`` only. They differ in
direction and in the table:

* ``"roformer"`` (laplax's default): turned by ``+angle``
  (``y1 = x1 cos - x2 sin``, ``y2 = x2 cos + x1 sin``); the table computed in
  float64 and rounded once to float32.
* ``"nanochat"`` (nanochat/gpt.py, ``apply_rotary_emb`` and
  ``_precompute_rotary_embeddings``): turned by ``-angle``
  (``y1 = x1 cos + x2 sin``, ``y2 = -x1 sin + x2 cos``); the table made as
  PyTorch makes it in float32 (``1 / base ** (arange(0, d, 2) / d)``, its
  outer product with the positions) and stored in bfloat16. The two
  conventions are one parametrisation up to a sign flip of the second half
  of every ``W_Q`` and ``W_K`` head, so weights only transfer with the
  convention they were trained in.

:func:`rotary` applies either; the attention
(:class:`laplax.attention.MultiHeadAttention`) picks the convention with
``rope_style`` and the base with ``rope_theta``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

STYLES = ("roformer", "nanochat")


def rotary_table(
  length: int, head_dim: int, theta: float = 10_000.0
) -> tuple[np.ndarray, np.ndarray]:
  """Sines and cosines of the rotary angles, ``(sin, cos)``, each float32
  ``[length, head_dim // 2]``.

  Row ``t`` holds ``t * theta^(-2i/head_dim)`` for ``i < head_dim / 2``
  (RoFormer eq. 34), computed in float64 with NumPy and rounded once, so a
  jitted model gets them as constants instead of evaluating ``sin``/``cos``
  in every fusion that reads them.
  """
  half = head_dim // 2
  freq = theta ** (-np.arange(half, dtype=np.float64) / half)
  angle = np.arange(length, dtype=np.float64)[:, None] * freq
  return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


def nanochat_table(
  length: int, head_dim: int, theta: float = 10_000.0
) -> tuple[np.ndarray, np.ndarray]:
  """nanochat's rotary table ``(sin, cos)``: bfloat16 values, returned as
  float32 ``[length, head_dim // 2]`` (exactly representable).

  As nanochat/gpt.py's ``_precompute_rotary_embeddings`` computes it in
  float32: ``inv_freq = 1 / theta ** (arange(0, head_dim, 2) / head_dim)``
  (the power rounded to float32, then a float32 division: PyTorch's values
  bit for bit), ``angle = outer(t, inv_freq)`` in float32, then ``cos`` and
  ``sin`` rounded to bfloat16. The cosines and sines are evaluated in float64
  and rounded to float32 first; on d20's 20,480 x 64 table 4 of the 2.6M
  entries then differ from PyTorch's float32 ``cos``/``sin`` by one bfloat16
  step (a double rounding), tests/test_nanochat_exact.py.
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
  """Rotary position embedding, half-split form, in the convention ``style``.

  Channel pairs ``(x_i, x_{i + head_dim/2})`` of a token at position ``t``
  are rotated by ``t * theta^(-2i/head_dim)`` (:data:`STYLES`: ``+`` that
  angle with :func:`rotary_table`, or ``-`` it with :func:`nanochat_table`),
  so the dot product of a rotated query and key depends on their positions
  only through ``t_q - t_k``. The rotation is computed in float32 and rounded
  once to ``x.dtype`` (nanochat under bfloat16 autocast rounds each product
  to bfloat16).

  Args:
    x: ``[batch, length, heads, head_dim]`` (``head_dim`` even).
    positions: int ``[batch, length]`` or ``[length]`` absolute positions,
      ``>= 0``. Concrete positions (NumPy, Python) index the table in NumPy;
      traced ones (a KV cache's offset) gather from a table of
      ``max_length`` rows.
    theta: base of the frequencies ``theta^(-2i/head_dim)``.
    max_length: rows of the table for traced ``positions`` (every position
      must be below it; the gather clamps the others).
    style: ``"roformer"`` or ``"nanochat"``.

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
