"""Spectrally conditioned attention (Saratchandran & Lucey, NeurIPS 2025, arXiv 2603.07162).

The query, key and value projections compute ``x (W + C)`` instead of ``x W``,
where ``C`` is a fixed correction that is never trained. A projection kernel
is ``W [D, H * d]`` (Flax ``[in, out]``: ``D`` the model width, ``H`` heads of
``d`` columns each; a PyTorch ``nn.Linear`` weight is its transpose and gives
the same map).

* Theorem 3.8 (the practical method): ``C = lam * I_k``, a rectangular
  identity (``k = min`` of the two dimensions), ``lam = 10`` in the paper. The
  paper does not say how ``I_k`` is laid out on a multi-head kernel; the
  layouts (``mode``):

  - ``"full"`` (default): ``lam * eye(D, H*d)`` on the whole kernel. Head
    ``h``'s block ``[D, d]`` carries its identity on input rows ``h*d ..
    h*d+d-1``: every head block is ``lam`` times a row-permuted rectangular
    identity, so it conditions each head *and* the whole kernel, and different
    heads start on different input channels. It is what separate
    ``Linear(D, D)`` projections plus ``lam * I`` give (BERT, Nystromformer,
    the models the paper lists), hence the default.
  - ``"per_head"``: every head block gets its own ``lam * eye(D, d)``, so all
    heads sit on the same input rows ``0 .. d-1``: the heads start identical,
    the attention branch reads only ``d`` of the ``D`` channels, and the whole
    kernel's condition number gets worse (``C`` has rank ``d``).
  - ``"fused"``: ``lam * eye(D, 3*H*d)`` on the concatenated kernel ``[W_Q |
    W_K | W_V]``, which is what ``lam * I`` on timm's fused ``qkv =
    Linear(D, 3D)`` weight gives. When ``H*d = D`` the identity lands on the
    query columns only (``W_K`` and ``W_V`` get nothing); when ``H*d < D`` it
    spills into the key columns. This is an *inference* from the codebases the
    paper's ViT/DeiT/Swin/XCiT results were trained with (timm), not the
    paper's text: no code was released.

* Theorem 3.5 (exact, expensive): ``"svd"``: ``C = U (sigma_max(W) I) V^T``
  from the thin SVD ``W = U S V^T``, so that ``W + C = U (S + sigma_max I)
  V^T`` has condition number ``(2 sigma_max) / (sigma_min + sigma_max) <= 2``.
  When ``D >= H*d`` every head block of ``W + C`` then has condition number
  ``<= 2`` as well: the singular values of a column block interlace those of
  the whole matrix, so they lie in ``[sigma_min(W + C), sigma_max(W + C)]``.
  ``C`` is recomputed from the current ``W`` in every forward pass and treated
  as a constant (``stop_gradient``), like the identity correction.

``targets`` (a subset of ``"qkv"``) says which of ``W_Q, W_K, W_V`` are
corrected (``"fused"`` reads it too: a projection outside ``targets`` gets no
slice of the fused identity).

Precision: below float32 :func:`project` computes ``x W + x C`` with ``x C``
taken as ``lam`` times a zero-padded slice of ``x`` (no matmul, no ``W +
C``). Forming ``W + C`` in bfloat16 would round away ``W``'s diagonal (the
bfloat16 spacing near 10 is 0.0625; the entries of ``W`` are about 0.02),
i.e. freeze it in the forward pass. In float32 one ``W + C`` kernel loses
nothing and is used.

The correction adds no parameter, no optimizer state and no gradient memory: the
gradient with respect to ``W`` is the baseline's gradient at weights ``W + C``.

See docs/methods.md for both methods, their config keys and laplax's choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The layouts of the correction (``model.spectral.mode``), see :func:`correction`.
MODES = ("full", "per_head", "fused", "svd")
DEFAULT_MODE = "full"
# Which projections a correction applies to, in the order of the fused kernel.
TARGETS = "qkv"


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"spectral mode {mode!r} is unknown; use one of {', '.join(MODES)}")


def check_targets(targets: Any) -> str:
  """``targets`` as a string of distinct letters of ``"qkv"`` in that order.

  Args:
    targets: a string such as ``"qkv"``, ``"q"``, ``"qk"`` (commas allowed:
      ``"q,v"``) or a sequence of the letters.

  Raises:
    ValueError: empty, a letter other than ``q``, ``k``, ``v``, or a repeat.
  """
  letters = (
    list(targets.replace(",", ""))
    if isinstance(targets, str)
    else list(targets)
    if isinstance(targets, (list, tuple))
    else None
  )
  if not letters or any(t not in TARGETS for t in letters) or len(set(letters)) != len(letters):
    raise ValueError(
      f"spectral targets {targets!r} must be distinct letters of 'qkv' (e.g. 'qkv', 'q', 'qk', 'v')"
    )
  return "".join(t for t in TARGETS if t in letters)


def _shape(shape: Sequence[int], mode: str, num_heads: int, target: str) -> tuple[int, int]:
  """Checks the arguments shared by :func:`correction` and :func:`identity_product`."""
  _check_mode(mode)
  if len(shape) != 2:
    raise ValueError(f"correction needs a 2-D kernel shape, got {tuple(shape)}")
  rows, cols = int(shape[0]), int(shape[1])
  if mode == "per_head" and (num_heads < 1 or cols % num_heads):
    raise ValueError(f"num_heads={num_heads} does not divide the {cols} kernel columns")
  if mode == "fused" and (not isinstance(target, str) or target not in TARGETS or len(target) != 1):
    raise ValueError(f"spectral mode 'fused' needs target 'q', 'k' or 'v', got {target!r}")
  return rows, cols


def _identity_layout(
  rows: int, cols: int, mode: str, num_heads: int, target: str
) -> tuple[int, int, int]:
  """``(offset, width, repeats)`` of an identity correction: column ``c`` of each
  of the ``repeats`` column groups of ``width`` has ``lam`` at row ``offset +
  (c mod width)`` when that row exists (``"full"``: one group at offset 0;
  ``"per_head"``: ``num_heads`` groups at offset 0; ``"fused"``: one group at
  offset ``j * cols`` for the ``j``-th of ``q, k, v``)."""
  if mode == "per_head":
    return 0, cols // num_heads, num_heads
  if mode == "fused":
    return TARGETS.index(target) * cols, cols, 1
  return 0, cols, 1


def correction(
  shape: Sequence[int],
  *,
  lam: float,
  mode: str = DEFAULT_MODE,
  num_heads: int = 1,
  kernel: jax.Array | None = None,
  target: str = "q",
) -> jax.Array:
  """Returns the fixed correction ``C`` added to one projection kernel.

  Closed forms (``W [D, F]``, ``F = num_heads * d``; see the module docstring):
  ``"full"``: ``lam * eye(D, F)``; ``"per_head"``: ``lam * [eye(D, d)] *
  num_heads`` (tiled along the columns); ``"fused"``: columns ``j*F .. j*F +
  F - 1`` of ``lam * eye(D, 3F)`` for the ``j``-th of ``target`` in ``q, k,
  v``; ``"svd"``: ``sigma_max(W) U V^T`` (Theorem 3.5).

  Args:
    shape: ``(D, num_heads * head_dim)`` of the kernel ``W``.
    lam: the scale ``lambda`` of ``lambda * I_k`` (Theorem 3.8; 10 in the
      paper). Ignored by ``"svd"``, whose scale is ``sigma_max(W)``.
    mode: one of :data:`MODES`.
    num_heads: number of column blocks for ``"per_head"``.
    kernel: the kernel ``W`` itself; required by ``"svd"`` only.
    target: ``"q"``, ``"k"`` or ``"v"``: which slice of the fused identity
      (``"fused"`` only).

  Returns:
    float32 array of ``shape``: ``C``, with no gradient path to ``kernel``.

  Raises:
    ValueError: unknown mode, a shape that is not 2-D, ``num_heads`` that does
      not divide the columns, ``"fused"`` without a valid target, or ``"svd"``
      without ``kernel``.
  """
  rows, cols = _shape(shape, mode, num_heads, target)
  if mode == "svd":
    if kernel is None:
      raise ValueError("spectral mode 'svd' needs the kernel to decompose")
    w = jax.lax.stop_gradient(jnp.asarray(kernel, jnp.float32))
    u, s, vt = jnp.linalg.svd(w, full_matrices=False)
    return (s[0] * u) @ vt
  offset, width, repeats = _identity_layout(rows, cols, mode, num_heads, target)
  block = np.eye(rows, width, k=-offset, dtype=np.float32)
  return jnp.asarray(lam * np.tile(block, (1, repeats)))


def identity_product(
  x: jax.Array,
  shape: Sequence[int],
  *,
  lam: float,
  mode: str = DEFAULT_MODE,
  num_heads: int = 1,
  target: str = "q",
) -> jax.Array:
  """``x C`` for an identity correction, without a matmul: ``lam`` times a
  zero-padded (and, for ``"per_head"``, tiled) slice of ``x``.

  Args:
    x: ``[..., D]`` inputs (any float dtype).
    shape, lam, mode, num_heads, target: as in :func:`correction`; ``mode`` is
      ``"full"``, ``"per_head"`` or ``"fused"``.

  Returns:
    float32 ``[..., F]``, equal to ``x @ correction(shape, ...)``.

  Raises:
    ValueError: as :func:`correction`, or ``"svd"`` (not an identity) or an
      ``x`` whose last axis is not ``D``.
  """
  rows, cols = _shape(shape, mode, num_heads, target)
  if mode == "svd":
    raise ValueError("identity_product needs an identity mode, not 'svd'")
  if x.shape[-1] != rows:
    raise ValueError(f"x has {x.shape[-1]} features but the kernel has {rows} rows")
  offset, width, repeats = _identity_layout(rows, cols, mode, num_heads, target)
  part = x[..., offset : min(rows, offset + width)].astype(jnp.float32)
  pad = width - part.shape[-1]
  if pad:
    part = jnp.pad(part, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
  if repeats > 1:
    part = jnp.tile(part, (1,) * (x.ndim - 1) + (repeats,))
  return lam * part


def project(
  x: jax.Array,
  kernel: jax.Array,
  *,
  lam: float,
  mode: str = DEFAULT_MODE,
  num_heads: int = 1,
  target: str = "q",
  dtype: Any = None,
) -> jax.Array:
  """``x (W + C)``, exact at every compute dtype (``x W + x C`` below float32).

  ``x W`` is a matmul in ``dtype`` with float32 accumulation; ``x C`` is
  :func:`identity_product` in float32; the sum is float32, so ``W``'s
  contribution survives beside ``lam * x`` (forming ``W + C`` in bfloat16
  would round ``W``'s diagonal away). For ``"svd"`` ``C`` is a dense matrix of
  the same scale as ``W`` (``sigma_max(C) = sigma_max(W)``) and ``W + C`` is
  cast to ``dtype`` as one kernel; in float32 too, where ``W + C`` loses
  nothing (spacing 1e-6 near 10), so the slice form is used only below
  float32.

  Args:
    x: ``[..., D]`` inputs.
    kernel: float32 ``[D, F]`` kernel ``W``.
    lam, mode, num_heads, target: as in :func:`correction`.
    dtype: matmul dtype (default ``x.dtype``).

  Returns:
    float32 ``[..., F]``.

  Raises:
    ValueError: as :func:`correction`.
  """
  dtype = dtype or x.dtype
  if mode == "svd" or jnp.dtype(dtype) == jnp.float32:
    # float32 holds W's entries beside lam (spacing 1e-6 near 10): one kernel.
    # (The slice form below also mis-partitioned on a (2, 2, 2) data/fsdp/
    # tensor CPU mesh in the "full" layout -- tests/test_sharding.py -- while
    # this form is exact there; the low-precision path is not yet checked on
    # tensor-parallel meshes.)
    kernel = conditioned(kernel, lam=lam, mode=mode, num_heads=num_heads, target=target)
    y = jnp.dot(x.astype(dtype), kernel.astype(dtype))
    return y.astype(jnp.float32)
  y = jnp.dot(x.astype(dtype), kernel.astype(dtype), preferred_element_type=jnp.float32)
  return y + identity_product(
    x, kernel.shape, lam=lam, mode=mode, num_heads=num_heads, target=target
  )


def conditioned(
  kernel: jax.Array, *, lam: float, mode: str = DEFAULT_MODE, num_heads: int = 1, target: str = "q"
) -> jax.Array:
  """Returns the effective kernel ``W + C`` (same shape and dtype as ``kernel``).

  For analysis and tests; the forward pass uses :func:`project`.

  Args:
    kernel: ``[model_dim, num_heads * head_dim]`` projection kernel ``W``.
    lam, mode, num_heads, target: as in :func:`correction`.

  Raises:
    ValueError: as :func:`correction`.
  """
  c = correction(
    kernel.shape,
    lam=lam,
    mode=mode,
    num_heads=num_heads,
    kernel=kernel if mode == "svd" else None,
    target=target,
  )
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
