"""Attention kernels (``P V`` of softmax attention) and which one runs where.

* :func:`~laplax.kernels.xla.xla_attention` (``"xla"``): XLA ops with a
  hand-written backward pass; runs everywhere, forms the ``[length,
  length]`` logits.
* :func:`~laplax.kernels.splash.splash_attention` (``"splash"``): the Pallas
  flash kernel of TPUs (interpret mode elsewhere); lengths that are multiples
  of 128.
* ``"cudnn"``: cuDNN's fused flash kernel through
  ``jax.nn.dot_product_attention`` (NVIDIA GPUs, bfloat16 or float16).

``implementation=None`` follows the platform compiled for
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

from laplax.kernels import splash, xla
from laplax.kernels.splash import splash_attention
from laplax.kernels.xla import MASK_VALUE, xla_attention

__all__ = [
  "MASK_VALUE",
  "xla_attention",
  "splash_attention",
  "target_platform",
  "choose",
  "describe",
]

# Whether the XLA kernel keeps the float32 P for its backward pass: None keeps
# it on a CPU only (the fastest there; off the CPU P is computed again);
# True or False forces it everywhere (bench/compile_report.py --xla-keeps-p
# measures what keeping it would cost on a TPU slice).
XLA_KEEPS_P: bool | None = None
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
  bias: bool = False,
) -> tuple[str, str | None]:
  """The kernel that runs, and why the default fell back to XLA (or ``None``).

  Args:
    implementation: the requested kernel; a name other than ``None`` is
      returned as it is (its own checks raise).
    q_length, kv_length, head_dim: the attention's shape.
    dtype: the dtype of the queries.
    mask_shape: the shape of a boolean mask, or ``None`` (splash takes only
      key-padding masks ``[batch, 1, 1, kv_length]``).
    platform: default :func:`target_platform`.
    bias: the logits get an additive bias (Swin's relative position bias),
      which only the XLA kernel takes.

  Returns:
    ``(kernel, reason)``: ``kernel`` one of ``"xla"``, ``"splash"``,
    ``"cudnn"``, ``"reference"``; ``reason`` a phrase when ``None`` chose
    ``"xla"`` on a platform that has a fused kernel.
  """
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
    causal = jnp.asarray(xla._causal(q_length, kv_length))[None, None]
    mask = causal if mask is None else jnp.logical_and(mask, causal)
    is_causal = False
  return jax.nn.dot_product_attention(
    query, key, value, mask=mask, scale=scale, is_causal=is_causal, implementation="cudnn"
  )


def attention(
  query,
  key,
  value,
  *,
  mask,
  is_causal: bool,
  scale: float,
  implementation: str | None,
  bias=None,
):
  """``P V`` by the kernel :func:`choose` picks (``"reference"`` excepted:
  :func:`laplax.attention.attend` runs that one).

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key, value: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads``
      dividing ``heads``.
    mask: bool broadcastable to ``[batch, heads, q_length, kv_length]`` or
      ``None`` (True = attend).
    is_causal, scale: causal attention (queries aligned to the last keys),
      logit scale; Python values.
    implementation: ``None``, ``"xla"``, ``"cudnn"`` or ``"splash"``.
    bias: an additive float bias of the logits broadcastable to ``[batch,
      heads, q_length, kv_length]`` (Swin's relative position bias), or
      ``None``. Only the XLA kernel takes one: ``None`` then runs XLA.

  Returns:
    ``[batch, q_length, heads, head_dim]`` in ``value.dtype``.

  Raises:
    ValueError: splash with lengths that are not multiples of 128 or a mask
      other than a key-padding mask, or a ``bias`` with ``"cudnn"`` or
      ``"splash"`` (one line with the fix).
  """
  if bias is not None and implementation in ("cudnn", "splash"):
    raise ValueError(
      f"implementation={implementation!r} takes no additive attention bias (a relative "
      f"position bias); use implementation='xla' or None"
    )
  mask_shape = None
  if mask is not None:
    mask = jnp.asarray(mask, bool)
    mask_shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
  platform = target_platform()
  if bias is not None:  # the fused kernels take none: XLA
    implementation = "xla"
  kernel, _ = choose(
    implementation,
    q_length=query.shape[1],
    kv_length=key.shape[1],
    head_dim=query.shape[-1],
    dtype=query.dtype,
    mask_shape=mask_shape,
    platform=platform,
  )
  if kernel == "cudnn":
    return _cudnn(query, key, value, mask, is_causal, scale)
  if kernel == "splash":
    return splash_attention(query, key, value, mask, is_causal, scale, platform)
  heads = query.shape[-2]
  if key.shape[-2] != heads:  # grouped-query attention
    key = jnp.repeat(key, heads // key.shape[-2], axis=-2)
    value = jnp.repeat(value, heads // value.shape[-2], axis=-2)
  # On a CPU the backward pass reuses the saved float32 P (fastest there); on
  # an accelerator it computes P again instead of keeping [batch, heads, q, kv].
  keep = platform == "cpu" if XLA_KEEPS_P is None else XLA_KEEPS_P
  return xla_attention(query, key, value, mask, is_causal, scale, keep_probs=keep, bias=bias)
