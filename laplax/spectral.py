"""Spectrally conditioned attention (Saratchandran & Lucey, NeurIPS 2025, arXiv 2603.07162).

The query, key and value projections compute ``x (W + C)`` instead of ``x W``,
where ``C`` is a fixed correction that is never trained:

* Theorem 3.8 (the practical method): ``C = lam * I_k``, the rectangular
  identity (ones on the main diagonal, ``k = min`` of the two dimensions),
  ``lam = 10`` in the paper. Two readings of ``I_k`` are implemented (METHODS.md
  leaves it open):

  - ``"per_head"`` (default): the kernel ``[model_dim, num_heads * head_dim]`` is
    ``num_heads`` blocks of ``[model_dim, head_dim]`` columns and each block gets
    its own ``lam * eye(model_dim, head_dim)``;
  - ``"full"``: ``lam * eye(model_dim, num_heads * head_dim)`` on the whole kernel.

* Theorem 3.5 (exact, expensive): ``"svd"``: ``C = U (sigma_max(W) I) V^T`` from
  the thin SVD ``W = U S V^T``, so that ``W + C = U (S + sigma_max I) V^T`` has
  condition number ``(2 sigma_max) / (sigma_min + sigma_max) <= 2``. ``C`` is
  recomputed from the current ``W`` in every forward pass and treated as a
  constant (``stop_gradient``), like the identity correction.

The correction adds no parameter, no optimizer state and no gradient memory: the
gradient with respect to ``W`` is the baseline's gradient at weights ``W + C``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("per_head", "full", "svd")


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(
        f"spectral mode {mode!r} is unknown; use one of {', '.join(MODES)}")


def correction(shape: Sequence[int], *, lam: float, mode: str = "per_head",
               num_heads: int = 1, kernel: jax.Array | None = None) -> jax.Array:
  """Returns the fixed correction ``C`` added to a projection kernel.

  Args:
    shape: ``(model_dim, num_heads * head_dim)`` of the kernel ``W``.
    lam: the scale ``lambda`` of ``lambda * I_k`` (Theorem 3.8; 10 in the
      paper). Ignored by ``"svd"``, whose scale is ``sigma_max(W)``.
    mode: ``"per_head"``, ``"full"`` or ``"svd"`` (see the module docstring).
    num_heads: number of column blocks for ``"per_head"``.
    kernel: the kernel ``W`` itself; required by ``"svd"`` only.

  Returns:
    float32 array of ``shape``: ``C``, with no gradient path to ``kernel``.

  Raises:
    ValueError: unknown mode, a shape that is not 2-D, ``num_heads`` that does
      not divide the columns, or ``"svd"`` without ``kernel``.
  """
  _check_mode(mode)
  if len(shape) != 2:
    raise ValueError(f"correction needs a 2-D kernel shape, got {tuple(shape)}")
  rows, cols = int(shape[0]), int(shape[1])
  if mode == "full":
    return jnp.asarray(lam * np.eye(rows, cols, dtype=np.float32))
  if mode == "per_head":
    if num_heads < 1 or cols % num_heads:
      raise ValueError(
          f"num_heads={num_heads} does not divide the {cols} kernel columns")
    block = np.eye(rows, cols // num_heads, dtype=np.float32)
    return jnp.asarray(lam * np.tile(block, (1, num_heads)))
  if kernel is None:
    raise ValueError("spectral mode 'svd' needs the kernel to decompose")
  w = jax.lax.stop_gradient(jnp.asarray(kernel, jnp.float32))
  u, s, vt = jnp.linalg.svd(w, full_matrices=False)
  return (s[0] * u) @ vt


def conditioned(kernel: jax.Array, *, lam: float, mode: str = "per_head",
                num_heads: int = 1) -> jax.Array:
  """Returns the effective kernel ``W + C`` (same shape and dtype as ``kernel``).

  Args:
    kernel: ``[model_dim, num_heads * head_dim]`` projection kernel ``W``.
    lam, mode, num_heads: as in :func:`correction`.

  Raises:
    ValueError: as :func:`correction`.
  """
  c = correction(kernel.shape, lam=lam, mode=mode, num_heads=num_heads,
                 kernel=kernel if mode == "svd" else None)
  return (kernel + c.astype(kernel.dtype)).astype(kernel.dtype)


def singular_values(kernel: jax.Array) -> jax.Array:
  """Singular values of a 2-D ``kernel``, descending, float32 ``[min(shape)]``."""
  return jnp.linalg.svd(jnp.asarray(kernel, jnp.float32), compute_uv=False)


def condition_number(kernel: jax.Array) -> jax.Array:
  """``kappa(W) = sigma_max / sigma_min`` of a 2-D ``kernel`` (float32 scalar).

  Uses all ``min(shape)`` singular values, as the paper's ``kappa`` of a
  rectangular matrix; ``inf`` for a rank-deficient kernel.
  """
  s = singular_values(kernel)
  return s[0] / s[-1]


def min_singular_value(kernel: jax.Array) -> jax.Array:
  """Smallest of the ``min(shape)`` singular values of a 2-D ``kernel`` (float32)."""
  return singular_values(kernel)[-1]
