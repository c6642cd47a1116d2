"""Attention kernels (``P V`` of softmax attention) and which one runs where.

* :func:`~laplax.kernels.xla.xla_attention` (``"xla"``): XLA ops with a
  hand-written backward pass; runs everywhere, forms the ``[length,
  length]`` logits.
* :func:`~laplax.kernels.splash.splash_attention` (``"splash"``): the Pallas
  flash kernel of TPUs (interpret mode elsewhere); lengths that are multiples
  of 128.
* ``"cudnn"``: cuDNN's fused flash kernel through
  ``jax.nn.dot_product_attention`` (NVIDIA GPUs, bfloat16 or float16).
* :func:`~laplax.kernels.reference.reference_attention` (``"reference"``):
  the definition, materialising ``P``; it alone returns ``P`` and takes
  attention dropout, so those requests run it.
* :func:`~laplax.kernels.nystrom.nystrom_attention` (``"nystrom"``): the
  Nystrom approximation ``P~ V``, linear in length; only when requested
  (no causal mask, no bias, key-padding masks only).

:func:`attention` is the one dispatch: :func:`choose` names the kernel, it
runs it. ``implementation=None`` follows the platform compiled for
(:func:`target_platform`) through :func:`choose`: splash on a TPU, cuDNN on
an NVIDIA GPU for bfloat16/float16 inputs, the XLA kernel on a CPU (and on
a GPU in float32). Where the fused kernel does not suit the shape (the
default ViT's 17 tokens, a KV cache's one new token) it falls back to the
XLA kernel: never an error. :func:`describe` is the one line a run prints
at its start and the name ``metrics.jsonl`` and ``eval.json`` record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax.kernels import nystrom as nystrom_lib
from laplax.kernels import splash
from laplax.kernels.common import MASK_VALUE, causal_mask, combine_masks, repeat_kv, window_mask
from laplax.kernels.reference import reference_attention
from laplax.kernels.splash import splash_attention
from laplax.kernels.xla import xla_attention

__all__ = [
  "IMPLEMENTATIONS",
  "MASK_VALUE",
  "attention",
  "causal_mask",
  "choose",
  "combine_masks",
  "describe",
  "reference_attention",
  "repeat_kv",
  "splash_attention",
  "target_platform",
  "window_mask",
  "xla_attention",
]

#: The values of ``implementation`` (``None``: by platform and shape).
IMPLEMENTATIONS = (None, "xla", "cudnn", "splash", "reference", "nystrom")
# cuDNN's fused attention (through jax.nn.dot_product_attention): the dtypes
# and largest head dimension laplax sends it by default.
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128


def target_platform() -> str:
  """``"cpu"``, ``"gpu"`` or ``"tpu"``: the platform of the current mesh's
  devices (:func:`laplax.sharding.context`; also an ahead-of-time compile
  for a TPU topology on a CPU machine), else JAX's default backend."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  platform = device.platform if device is not None else jax.default_backend()
  return "gpu" if platform in ("cuda", "rocm") else platform


def _cudnn_unsupported(head_dim: int, dtype: Any) -> str | None:
  """Why the default does not send this shape to cuDNN, or ``None``."""
  name = jnp.dtype(dtype).name
  if name not in CUDNN_DTYPES:
    return f"cuDNN's fused kernel takes bfloat16/float16, the model computes in {name}"
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return (
      f"cuDNN's fused kernel takes head dimensions that are multiples of 8 "
      f"up to {CUDNN_MAX_HEAD_DIM}, got {head_dim}"
    )
  return None


def choose(
  implementation: str | None,
  *,
  q_length: int,
  kv_length: int,
  head_dim: int,
  dtype: Any,
  mask_shape: Sequence[int] | None = None,
  platform: str | None = None,
  dropout: float = 0.0,
  return_weights: bool = False,
  bias: bool = False,
) -> tuple[str, str | None]:
  """The kernel that runs, and why the default fell back to XLA (or ``None``).

  Args:
    implementation: the requested kernel; a name other than ``None`` is
      returned as it is (its own checks raise), except that attention
      dropout and ``return_weights`` run ``"reference"`` (``"nystrom"``
      ignores dropout and refuses ``return_weights``).
    q_length, kv_length, head_dim: the attention's shape.
    dtype: the dtype of the queries.
    mask_shape: the shape of a boolean mask, or ``None`` (splash takes only
      key-padding masks ``[batch, 1, 1, kv_length]``).
    platform: default :func:`target_platform`.
    dropout: the attention dropout rate in force (0: none).
    return_weights: ``P`` is wanted (only the reference kernel forms it).
    bias: the logits get an additive bias (Swin's relative position bias),
      which only the XLA and reference kernels take.

  Returns:
    ``(kernel, reason)``: ``kernel`` one of ``"xla"``, ``"splash"``,
    ``"cudnn"``, ``"reference"``, ``"nystrom"``; ``reason`` a phrase when ``None`` chose
    ``"xla"`` on a platform that has a fused kernel.

  Raises:
    ValueError: ``return_weights`` with a fused or XLA implementation, or
      ``"splash"`` with dropout (one line with the fix).
  """
  if implementation == "nystrom":
    if return_weights:
      raise ValueError("implementation='nystrom' has no return_weights; use 'reference'")
    return "nystrom", None
  if (
    implementation == "reference" or return_weights or (dropout > 0 and implementation != "splash")
  ):
    if return_weights and implementation not in (None, "reference"):
      raise ValueError("return_weights needs implementation='reference'")
    return "reference", None
  if implementation == "splash" and dropout > 0:
    raise ValueError(splash.unsupported(q_length, kv_length, dropout=dropout) or "no dropout")
  if implementation is not None:
    return implementation, None
  platform = platform or target_platform()
  reason = None
  if bias and platform in ("tpu", "gpu"):
    return "xla", "the fused kernels take no additive attention bias (a relative position bias)"
  if platform == "tpu":
    reason = splash.unsupported(q_length, kv_length)
    if (
      reason is None
      and mask_shape is not None
      and (len(mask_shape) == 4 and (mask_shape[1] != 1 or mask_shape[2] != 1))
    ):
      reason = "splash attention takes key-padding masks only"
    if reason is None:
      return "splash", None
  elif platform == "gpu":
    reason = _cudnn_unsupported(head_dim, dtype)
    if reason is None:
      return "cudnn", None
  return "xla", None if reason is None else reason.split(";")[0]


def describe(
  implementation: str | None,
  lengths: Sequence[int],
  *,
  head_dim: int,
  dtype: Any,
  platform: str | None = None,
  bias: bool = False,
) -> tuple[str, str]:
  """``(name, line)``: the kernel of a model whose attention sees token counts
  ``lengths`` (self-attention), and one line saying which kernel runs and why.

  ``name`` is one kernel name, or several joined by ``"+"`` when the lengths
  choose differently (DINO's global and local crops). Example line:
  ``"attention kernel: xla on tpu (the default falls back: splash attention
  needs lengths that are multiples of 128, got 17 queries and 17 keys)"``.
  ``bias``: the attention has an additive bias (a Swin's), see :func:`choose`.
  """
  platform = platform or target_platform()
  chosen = {}
  for n in dict.fromkeys(lengths):
    chosen[n] = choose(
      implementation,
      q_length=n,
      kv_length=n,
      head_dim=head_dim,
      dtype=dtype,
      platform=platform,
      bias=bias,
    )
  names = list(dict.fromkeys(kernel for kernel, _ in chosen.values())) or ["xla"]
  how = "requested" if implementation is not None else "the default"
  line = f"attention kernel: {'+'.join(names)} on {platform} ({how}"
  if len(names) > 1:
    line += "; " + ", ".join(f"{k} for {n} tokens" for n, (k, _) in chosen.items())
  reasons = list(dict.fromkeys(r for _, r in chosen.values() if r))
  if reasons:
    line += "; falls back to xla: " + "; ".join(reasons)
  if implementation == "splash" and platform != "tpu":
    line += "; Pallas interpret mode, slow off a TPU"
  return "+".join(names), line + ")"


def _cudnn(query, key, value, mask, is_causal: bool, scale: float):
  """``jax.nn.dot_product_attention(implementation="cudnn")`` with laplax's
  conventions: a mask broadcast to ``[batch, heads, q, kv]``, causal queries
  aligned to the last keys."""
  heads, q_length, kv_length = query.shape[2], query.shape[1], key.shape[1]
  if mask is not None:
    mask = jnp.broadcast_to(mask, (query.shape[0], heads, q_length, kv_length))
  if is_causal and q_length != kv_length:
    mask, is_causal = jnp.asarray(combine_masks(mask, True, q_length, kv_length)), False
  return jax.nn.dot_product_attention(
    query, key, value, mask=mask, scale=scale, is_causal=is_causal, implementation="cudnn"
  )


def attention(
  query,
  key,
  value,
  *,
  mask=None,
  is_causal: bool = False,
  scale: float | None = None,
  implementation: str | None = None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  return_weights: bool = False,
  xla_keep_probs: bool | None = None,
  bias=None,
  nystrom: nystrom_lib.NystromSpec | None = None,
  window: int | None = None,
):
  """``(P V, P or None)`` by the kernel :func:`choose` picks: the one seam
  where :func:`laplax.attention.attend` meets the kernels.

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key, value: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads``
      dividing ``heads`` (grouped-query attention: :func:`repeat_kv`, or the
      kernel's own grouping).
    mask: bool broadcastable to ``[batch, heads, q_length, kv_length]`` or
      ``None`` (True = attend).
    is_causal: causal attention (queries aligned to the last keys).
    scale: logit scale, default ``1 / sqrt(head_dim)``.
    implementation: one of :data:`IMPLEMENTATIONS`.
    dropout_rate, dropout_rng: attention dropout on ``P``, active when both
      are set (runs the reference kernel; splash refuses it, Nystrom ignores
      it).
    return_weights: also return ``P`` (runs the reference kernel).
    xla_keep_probs: whether the XLA kernel keeps the float32 ``P`` for its
      backward pass (``model.xla_keep_probs``); ``None``: on a CPU only (the fastest there; elsewhere
      ``P`` is computed again instead of kept, ``bench/compile_report.py
      --xla-keeps-p`` measures the difference).
    bias: an additive float bias of the logits broadcastable to ``[batch,
      heads, q_length, kv_length]`` (Swin's relative position bias), or
      ``None``. The XLA and reference kernels take one: ``None`` then runs
      XLA (or the reference kernel where dropout or ``P`` is asked for).
    nystrom: the options of ``"nystrom"``
      (:class:`laplax.kernels.nystrom.NystromSpec`, passed to
      :func:`laplax.kernels.nystrom.nystrom_attention` under the same
      names); ``None``: its defaults.
    window: a causal sliding window, or ``None``: the query at position
      ``p`` (aligned to the last keys) sees key ``j`` iff ``0 <= p - j <=
      window`` (nanochat's ``window_size=(window, 0)``). Splash takes it as
      its own ``LocalMask`` (no ``[q_length, kv_length]`` array); the other
      kernels as a mask (:func:`window_mask`).

  Returns:
    ``(pv, weights)``: ``pv`` ``[batch, q_length, heads, head_dim]`` in
    ``value.dtype``; ``weights`` float32 ``[batch, heads, q_length,
    kv_length]`` from the reference kernel, else ``None``.

  Raises:
    ValueError: what :func:`choose` refuses; splash with lengths that are not
      multiples of 128 or a mask other than a key-padding mask; a ``bias``
      with ``"cudnn"`` or ``"splash"``; ``"nystrom"`` with a causal mask, a
      bias or ``return_weights``; a ``window`` without ``is_causal`` (one line
      with the fix).
  """
  if window is not None and window >= key.shape[1] - 1:
    window = None  # every earlier key is in the window
  if window is not None and (not is_causal or implementation == "nystrom"):
    raise ValueError(
      f"a sliding window (model.window_pattern) needs causal attention with "
      f"implementation 'xla', 'cudnn', 'splash', 'reference' or None, not "
      f"{implementation!r} (is_causal={is_causal})"
    )
  if bias is not None and implementation in ("cudnn", "splash"):
    raise ValueError(
      f"implementation={implementation!r} takes no additive attention bias (a relative "
      f"position bias); use implementation='xla' or None"
    )
  if implementation == "nystrom":
    if is_causal or return_weights or bias is not None:
      raise ValueError(
        "implementation='nystrom' has no causal mask, no additive bias and no return_weights"
      )
    options = nystrom or nystrom_lib.NystromSpec()
    pv = nystrom_lib.nystrom_attention(
      query,
      key,
      value,
      mask=mask,
      scale=scale,
      num_landmarks=options.num_landmarks,
      pinv_iterations=options.pinv_iterations,
      pinv_init=options.pinv_init,
      nystrom_padding=options.nystrom_padding,
    )
    return pv, None
  use_dropout = dropout_rate > 0.0 and dropout_rng is not None
  mask_shape = None
  if mask is not None:
    mask_shape = (1,) * (4 - np.ndim(mask)) + tuple(np.shape(mask))
  platform = target_platform()
  kernel, _ = choose(
    implementation,
    q_length=query.shape[1],
    kv_length=key.shape[1],
    head_dim=query.shape[-1],
    dtype=query.dtype,
    mask_shape=mask_shape,
    platform=platform,
    dropout=dropout_rate if use_dropout else 0.0,
    return_weights=return_weights,
    bias=bias is not None,
  )
  if window is not None and kernel != "splash":
    q_length, kv_length = query.shape[1], key.shape[1]
    positions = np.arange(kv_length - q_length, kv_length)  # causal: the last keys
    local = window_mask(positions, kv_length, window)[None, None]
    mask = local if mask is None else jnp.logical_and(mask, local)
  if kernel == "reference":
    return reference_attention(
      query,
      key,
      value,
      mask=mask,
      is_causal=is_causal,
      scale=scale,
      dropout_rate=dropout_rate if use_dropout else 0.0,
      dropout_rng=dropout_rng,
      bias=bias,
    )
  mask = None if mask is None else jnp.asarray(mask, bool)
  is_causal = bool(is_causal)
  scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
  if kernel == "cudnn":
    return _cudnn(query, key, value, mask, is_causal, scale), None
  if kernel == "splash":
    return splash_attention(query, key, value, mask, is_causal, scale, platform, window), None
  heads = query.shape[-2]
  keep = platform == "cpu" if xla_keep_probs is None else bool(xla_keep_probs)
  pv = xla_attention(
    query,
    repeat_kv(key, heads),
    repeat_kv(value, heads),
    mask,
    is_causal,
    scale,
    keep_probs=keep,
    bias=bias,
  )
  return pv, None
