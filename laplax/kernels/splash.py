"""Splash attention: the Pallas flash-attention kernel of TPUs, behind laplax's seam.

:func:`splash_attention` computes the same ``P V`` as
:func:`laplax.kernels.xla.xla_attention` (softmax attention, Vaswani et al.
2017, eq. 1) with ``jax.experimental.pallas.ops.tpu.splash_attention``
(``make_splash_mha``, the mask classes of ``splash_attention_mask``; the
kernel MaxText trains with on TPUs). Like FlashAttention (Dao et al. 2022) it
works on blocks of queries and keys and keeps only the per-row log-sum-exp
for the backward pass, so no ``[length, length]`` array is formed or saved.
:func:`laplax.attention.attend` takes Laplacian heads (``V - P V``) and the
learned mix from its ``P V`` exactly as from the other kernels.

What it does around the kernel:

* the logit scale is applied to the queries (the kernel has none), in
  float32, then rounded to the input dtype;
* causal attention is a ``CausalMask`` (queries aligned to the last keys),
  a causal sliding window a ``LocalMask`` with ``window_size=(window, 0)``,
  full attention a ``FullMask``; a key-padding mask becomes segment ids;
* grouped-query heads go to the kernel as they are (it maps each query head
  to its key/value head);
* under a mesh (:func:`laplax.sharding.context`, or any ``jax.set_mesh``)
  the kernel runs inside ``jax.shard_map``: Mosaic kernels cannot be
  partitioned automatically. The batch is split over the mesh axes the
  sharding rules give ``"batch"``, the heads over those of ``"heads"``;
* off a TPU it runs in Pallas interpret mode (slow; for tests and for
  checking values on a CPU).

The lengths must be multiples of :data:`BLOCK` (:func:`unsupported` says so
in one line); the block sizes are the largest of 512, 256, 128 that divide
them (:func:`block_sizes`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec as P

from laplax import sharding
from laplax.kernels.common import repeat_kv

# The kernel's key blocks are multiples of the TPU's 128 lanes; laplax uses
# the same granule for the query blocks.
BLOCK = 128
BLOCK_CHOICES = (512, 256, 128)


def unsupported(
  q_length: int, kv_length: int, *, dropout: float = 0.0, return_weights: bool = False
) -> str | None:
  """Why splash attention cannot take these settings, or ``None`` if it can.

  The reason is one line ending with the fix, e.g. ``"splash attention needs
  lengths that are multiples of 128, got 17 queries and 17 keys; use
  implementation='xla' or a multiple of 128 tokens"``.
  """
  if q_length % BLOCK or kv_length % BLOCK:
    return (
      f"splash attention needs lengths that are multiples of {BLOCK}, got "
      f"{q_length} queries and {kv_length} keys; use implementation='xla' "
      f"or a token count that is a multiple of {BLOCK}"
    )
  if dropout > 0.0:
    return (
      f"splash attention has no attention dropout (attention_dropout="
      f"{dropout}); set it to 0 or use implementation='reference'"
    )
  if return_weights:
    return (
      "splash attention does not form P, so it cannot return the attention "
      "weights; use implementation='reference'"
    )
  return None


def block_sizes(q_length: int, kv_length: int) -> sk.BlockSizes:
  """The kernel's block sizes: for the queries and the keys, forward and both
  backward kernels, the largest of :data:`BLOCK_CHOICES` dividing the length
  (512 is MaxText's default; longer blocks mean fewer grid steps, a larger
  block of VMEM)."""
  bq = next(b for b in BLOCK_CHOICES if q_length % b == 0)
  bkv = next(b for b in BLOCK_CHOICES if kv_length % b == 0)
  return sk.BlockSizes(
    block_q=bq,
    block_kv=bkv,
    block_kv_compute=bkv,
    block_q_dkv=bq,
    block_kv_dkv=bkv,
    block_kv_dkv_compute=bkv,
    block_q_dq=bq,
    block_kv_dq=bkv,
  )


def _kernel(
  heads: int, q_length: int, kv_length: int, is_causal: bool, window: int | None, interpret: bool
):
  """The splash kernel of one example: ``q [heads, q_length, head_dim]``,
  ``k, v [kv_heads, kv_length, head_dim]``, made while tracing (its block
  maps become constants of the traced function; the kernel library caches
  the NumPy work per mask). ``window`` (causal only): query ``i`` sees key
  ``j`` iff ``0 <= i + kv_length - q_length - j <= window``; the blocks
  wholly outside it are skipped."""
  shape = (q_length, kv_length)
  offset = kv_length - q_length
  if window is not None:
    mask = sm.LocalMask(shape, window_size=(window, 0), offset=offset)
  elif is_causal:
    mask = sm.CausalMask(shape, offset=offset)
  else:
    mask = sm.FullMask(shape)
  return sk.make_splash_mha(
    sm.MultiHeadMask([mask] * heads),
    block_sizes=block_sizes(q_length, kv_length),
    head_shards=1,
    q_seq_shards=1,
    interpret=interpret,
  )


def segment_ids(mask, batch: int, q_length: int, kv_length: int):
  """Segment ids ``(q [batch, q_length], kv [batch, kv_length])`` int32 of a
  key-padding mask: bool broadcastable to ``[batch, heads, q_length,
  kv_length]`` whose head and query axes have size 1 (True = attend). Every
  query gets id 1, the keys it may attend to 1, the others 0. An example
  with no key to attend to (all 0) has no defined output here, where the
  XLA kernel gives uniform weights: such a row is padding either way.

  Raises:
    ValueError: a mask that differs between heads or queries (splash takes
      such masks only as its own mask classes).
  """
  mask = jnp.asarray(mask, bool)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  if mask.shape[1] != 1 or mask.shape[2] != 1:
    raise ValueError(
      f"splash attention takes a key-padding mask of shape [batch, 1, 1, "
      f"kv_length], got {mask.shape}; use implementation='xla' for other masks"
    )
  kv = jnp.broadcast_to(mask[:, 0, 0, :], (batch, kv_length)).astype(jnp.int32)
  return jnp.ones((batch, q_length), jnp.int32), kv


def _local(q, k, v, q_ids, kv_ids, *, is_causal: bool, window: int | None, interpret: bool):
  """The kernel on one device's share: heads-major ``q [batch, heads, q, d]``,
  ``k, v [batch, kv_heads, kv, d]``, optional segment ids ``[batch, q]``,
  ``[batch, kv]``; returns ``[batch, heads, q, d]``."""
  kernel = _kernel(q.shape[1], q.shape[2], k.shape[2], is_causal, window, interpret)
  if q_ids is None:
    return jax.vmap(kernel)(q, k, v)
  return jax.vmap(lambda q, k, v, a, b: kernel(q, k, v, segment_ids=sk.SegmentIds(a, b)))(
    q, k, v, q_ids, kv_ids
  )


def _mesh_split(mesh, size: int, axes: tuple[str, ...]):
  """The ``PartitionSpec`` entry splitting a dimension of ``size`` over the
  mesh ``axes`` that have more than one device, or ``None`` when they do not
  divide it (the kernel then sees the whole dimension on every device)."""
  axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
  shards = int(np.prod([mesh.shape[a] for a in axes]))
  if not axes or size % shards:
    return None
  return axes[0] if len(axes) == 1 else axes


def splash_attention(
  query,
  key,
  value,
  mask,
  is_causal: bool,
  scale: float,
  platform: str,
  window: int | None = None,
):
  """``P V`` of softmax attention by the splash kernel.

  Args:
    query: ``[batch, q_length, heads, head_dim]`` (float32 or bfloat16).
    key, value: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads``
      dividing ``heads`` (grouped-query attention).
    mask: ``None`` or a key-padding mask, bool broadcastable to ``[batch,
      1, 1, kv_length]`` (True = attend; :func:`segment_ids`).
    is_causal: causal attention, the queries the last ``q_length`` keys.
    scale: logit scale (Python float).
    platform: the platform compiled for (``"tpu"`` runs the Mosaic kernel,
      anything else Pallas's interpret mode).
    window: with ``is_causal``, a sliding window: query ``i`` sees the keys
      ``j`` with ``0 <= i + kv_length - q_length - j <= window``
      (``LocalMask``); ``None``: every earlier key.

  Returns:
    ``[batch, q_length, heads, head_dim]`` in ``value.dtype``.

  Raises:
    ValueError: lengths that are not multiples of :data:`BLOCK`, or a mask
      :func:`segment_ids` cannot take.
  """
  batch, q_length, heads, _ = query.shape
  kv_length = key.shape[1]
  reason = unsupported(q_length, kv_length)
  if reason:
    raise ValueError(reason)
  ids = (None, None) if mask is None else segment_ids(mask, batch, q_length, kv_length)
  q = (query.astype(jnp.float32) * jnp.float32(scale)).astype(query.dtype)
  to_heads = lambda x: jnp.swapaxes(x, 1, 2)
  q, k, v = to_heads(q), to_heads(key), to_heads(value.astype(query.dtype))
  if window is not None and not is_causal:
    raise ValueError("splash attention takes a sliding window with causal attention only")
  local = functools.partial(
    _local,
    is_causal=bool(is_causal),
    window=None if window is None else int(window),
    interpret=platform != "tpu",
  )
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return to_heads(local(q, k, v, *ids)).astype(value.dtype)
  rules = nn.get_logical_axis_rules() or sharding.DEFAULT_RULES
  rows = _mesh_split(mesh, batch, sharding.mesh_axes(rules, "batch"))
  cols = _mesh_split(mesh, heads, sharding.mesh_axes(rules, "heads"))
  if (
    cols is not None
    and k.shape[1] != heads
    and _mesh_split(mesh, k.shape[1], sharding.mesh_axes(rules, "heads")) is None
  ):
    # Grouped heads that the tensor axis does not divide: one per query head.
    k, v = repeat_kv(k, heads, axis=1), repeat_kv(v, heads, axis=1)
  spec, id_spec = P(rows, cols, None, None), P(rows, None)
  if mask is None:
    run = lambda q, k, v: local(q, k, v, None, None)
    specs, args = (spec,) * 3, (q, k, v)
  else:
    run, specs, args = local, (spec,) * 3 + (id_spec,) * 2, (q, k, v, *ids)
  out = jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)(*args)
  return to_heads(out).astype(value.dtype)
