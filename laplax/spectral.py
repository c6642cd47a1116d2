"""Spectrally conditioned attention (Saratchandran & Lucey, NeurIPS 2025, arXiv 2603.07162).

The query, key and value projections compute ``x (W + C)`` with ``W [D, H * d]``
(Flax ``[in, out]``) and a fixed, untrained correction ``C``:

* Theorem 3.8: ``C = lam * I_k`` (``lam = 10`` in the paper), laid out by ``mode``:
  ``"full"`` (default) ``lam * eye(D, H*d)``; ``"per_head"`` ``lam * eye(D, d)`` per
  head block; ``"fused"`` ``lam * eye(D, 3*H*d)`` on ``[W_Q | W_K | W_V]`` (timm's
  fused ``qkv``; an inference, no code was released). With grouped-query attention
  ``W_K, W_V`` are ``[D, KV * d]`` and ``"fused"`` is ``lam * eye(D, (H + 2 KV) d)``
  on the same concatenation (``query_columns``).
* Theorem 3.5: ``"svd"``, ``C = sigma_max(W) U V^T`` from ``W = U S V^T``, so
  ``kappa(W + C) <= 2``; recomputed every forward pass under ``stop_gradient``.

``targets`` (a subset of ``"qkv"``) picks the corrected projections. Below float32
:func:`project` adds ``x C`` as a slice of ``x``, since ``W + C`` in bfloat16 would
round ``W`` away. No parameter, optimizer state or gradient memory is added. The
layouts and laplax's choices: docs/methods.md, "Spectrally conditioned attention".
:class:`SpectralSpec` is these settings as the ``spectral`` sub-spec of an
attention spec (``None`` there = off).
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpectralSpec:
  """The fixed correction ``C`` of ``W_Q, W_K, W_V`` under its config names
  (``model.spectral.lam``, ``.mode``, ``.targets``): the ``spectral``
  sub-spec of an attention spec (``laplax.models.spec.AttentionSpec.spectral``,
  ``laplax.attention.MultiHeadAttention.spectral``; ``None`` there = off),
  read whole by :func:`laplax.attention.project_qkv`. The fields' metadata
  gives their config checks (the model spec raises them, naming the key).

  Attributes:
    lam: ``lambda`` of ``lambda * I_k`` (Theorem 3.8; 10 in the paper).
    mode: layout of ``I_k`` or the SVD correction (:data:`MODES`; ``"full"``
      by default).
    targets: which of ``W_Q, W_K, W_V`` are corrected, letters of ``"qkv"``
      (stored in that order where they are valid, :func:`check_targets`;
      ``"q"`` or ``"v"`` for ablations).
  """

  lam: float = dataclasses.field(default=10.0, metadata={"check": "float", "key": "spectral.lam"})
  mode: str = dataclasses.field(
    default=DEFAULT_MODE, metadata={"check": "choice", "key": "spectral.mode", "choices": MODES}
  )
  targets: str = dataclasses.field(
    default=TARGETS, metadata={"check": "targets", "key": "spectral.targets"}
  )

  def __post_init__(self):
    try:
      object.__setattr__(self, "targets", check_targets(self.targets))
    except ValueError:  # left as given: the spec or the attention refuses it, naming the key
      pass


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"spectral mode {mode!r} is unknown; use one of {', '.join(MODES)}")


def check_targets(targets: Any) -> str:
  """``targets`` (``"qkv"``, ``"q,v"`` or a sequence of letters) as distinct letters of ``"qkv"`` in order.

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
  rows: int, cols: int, mode: str, num_heads: int, target: str, query_columns: int | None
) -> tuple[int, int, int]:
  """``(offset, width, repeats)`` of an identity correction.

  Column ``c`` of each of ``repeats`` groups of ``width`` has ``lam`` at row ``offset +
  (c mod width)`` when it exists (``"fused"``: the columns of ``[W_Q | W_K | W_V]``
  before ``target``'s, ``0``, ``Fq`` or ``Fq + cols`` with ``Fq = query_columns``,
  default ``cols``).
  """
  if mode == "per_head":
    return 0, cols // num_heads, num_heads
  if mode == "fused":
    fq = cols if query_columns is None else query_columns
    return {"q": 0, "k": fq, "v": fq + cols}[target], cols, 1
  return 0, cols, 1


def correction(
  shape: Sequence[int],
  *,
  lam: float,
  mode: str = DEFAULT_MODE,
  num_heads: int = 1,
  kernel: jax.Array | None = None,
  target: str = "q",
  query_columns: int | None = None,
) -> jax.Array:
  """The fixed correction ``C`` added to one projection kernel.

  With ``W [D, F]``, ``F = num_heads * d``: ``"full"`` ``lam * eye(D, F)``;
  ``"per_head"`` ``lam * [eye(D, d)] * num_heads``; ``"fused"`` columns ``j*F ..
  j*F + F - 1`` of ``lam * eye(D, 3F)`` for the ``j``-th of ``target``; ``"svd"``
  ``sigma_max(W) U V^T`` (``lam`` ignored; ``kernel`` required). Under
  grouped-query attention (``W_K, W_V`` of ``F`` columns, ``W_Q`` of ``Fq``)
  ``"fused"`` is ``target``'s columns of ``lam * eye(D, Fq + 2F)`` on ``[W_Q |
  W_K | W_V]``: from ``Fq`` for ``"k"``, from ``Fq + F`` for ``"v"``.

  Args:
    shape: ``(D, num_heads * head_dim)``; lam: ``lambda`` (Theorem 3.8).
    mode: one of :data:`MODES`; num_heads: column blocks for ``"per_head"``
      (the key/value heads for ``W_K, W_V`` under grouped-query attention).
    kernel: ``W`` (``"svd"`` only); target: ``"q"``, ``"k"`` or ``"v"`` (``"fused"`` only).
    query_columns: ``Fq``, the columns of ``W_Q`` when they differ from this
      kernel's (``"fused"`` only; ``None``: ``F``).

  Returns:
    float32 array of ``shape``, with no gradient path to ``kernel``.

  Raises:
    ValueError: unknown mode, a shape not 2-D, ``num_heads`` not dividing the columns,
      ``"fused"`` without a valid target, or ``"svd"`` without ``kernel``.
  """
  rows, cols = _shape(shape, mode, num_heads, target)
  if mode == "svd":
    if kernel is None:
      raise ValueError("spectral mode 'svd' needs the kernel to decompose")
    w = jax.lax.stop_gradient(jnp.asarray(kernel, jnp.float32))
    u, s, vt = jnp.linalg.svd(w, full_matrices=False)
    return (s[0] * u) @ vt
  offset, width, repeats = _identity_layout(rows, cols, mode, num_heads, target, query_columns)
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
  query_columns: int | None = None,
) -> jax.Array:
  """``x C`` of an identity correction without a matmul: ``lam`` times a padded slice of ``x``.

  ``x`` ``[..., D]`` (any float dtype); the rest as :func:`correction`. Returns float32
  ``[..., F]``, equal to ``x @ correction(...)``.

  Raises:
    ValueError: as :func:`correction`, ``"svd"``, or a last axis that is not ``D``.
  """
  rows, cols = _shape(shape, mode, num_heads, target)
  if mode == "svd":
    raise ValueError("identity_product needs an identity mode, not 'svd'")
  if x.shape[-1] != rows:
    raise ValueError(f"x has {x.shape[-1]} features but the kernel has {rows} rows")
  offset, width, repeats = _identity_layout(rows, cols, mode, num_heads, target, query_columns)
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
  query_columns: int | None = None,
  dtype: Any = None,
) -> jax.Array:
  """``x (W + C)``, exact at every compute dtype (``x W + x C`` below float32).

  ``x W`` in ``dtype`` (default ``x.dtype``) with float32 accumulation plus
  :func:`identity_product` in float32; ``"svd"`` and float32 use one ``W + C`` kernel.
  ``x`` ``[..., D]``; ``kernel`` float32 ``[D, F]``. Returns float32 ``[..., F]``.

  Raises:
    ValueError: as :func:`correction`.
  """
  dtype = dtype or x.dtype
  if mode == "svd" or jnp.dtype(dtype) == jnp.float32:
    # float32 holds W's entries beside lam (spacing 1e-6 near 10): one kernel.
    # (The slice form below also mis-partitioned on a (2, 2, 2) data/fsdp/
    # tensor CPU mesh in the "full" layout -- tests/train/test_sharding.py -- while
    # this form is exact there; the low-precision path is not yet checked on
    # tensor-parallel meshes.)
    kernel = conditioned(
      kernel,
      lam=lam,
      mode=mode,
      num_heads=num_heads,
      target=target,
      query_columns=query_columns,
    )
    y = jnp.dot(x.astype(dtype), kernel.astype(dtype))
    return y.astype(jnp.float32)
  y = jnp.dot(x.astype(dtype), kernel.astype(dtype), preferred_element_type=jnp.float32)
  return y + identity_product(
    x,
    kernel.shape,
    lam=lam,
    mode=mode,
    num_heads=num_heads,
    target=target,
    query_columns=query_columns,
  )


def conditioned(
  kernel: jax.Array,
  *,
  lam: float,
  mode: str = DEFAULT_MODE,
  num_heads: int = 1,
  target: str = "q",
  query_columns: int | None = None,
) -> jax.Array:
  """The effective kernel ``W + C`` (shape and dtype of ``kernel``), for analysis and tests.

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
    query_columns=query_columns,
  )
  return (kernel + c.astype(kernel.dtype)).astype(kernel.dtype)


def singular_values(kernel: jax.Array) -> jax.Array:
  """Singular values of a 2-D ``kernel``, descending, float32 ``[min(shape)]``."""
  return jnp.linalg.svd(jnp.asarray(kernel, jnp.float32), compute_uv=False)


def condition_number(kernel: jax.Array) -> jax.Array:
  """``kappa(W) = sigma_max / sigma_min`` over all ``min(shape)`` singular values (float32; ``inf`` if rank-deficient)."""
  s = singular_values(kernel)
  return s[0] / s[-1]


def min_singular_value(kernel: jax.Array) -> jax.Array:
  """Smallest of the ``min(shape)`` singular values of a 2-D ``kernel`` (float32)."""
  return singular_values(kernel)[-1]
