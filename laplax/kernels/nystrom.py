"""Nystrom attention (Xiong et al., "Nystromformer", AAAI 2021), linear in length.

Softmax attention ``P V`` with ``P = softmax(Q K^T * scale)`` is approximated
through ``m`` landmarks, the means of ``m`` contiguous segments of the queries
and of the keys (``Q~``, ``K~``, ``[m, head_dim]``)::

    P~ V = softmax(Q K~^T) pinv(softmax(Q~ K~^T)) (softmax(Q~ K^T) V)
            [n, m]          [m, m]                [m, n] [n, d]

with ``pinv`` the iterative Moore-Penrose pseudo-inverse of the paper's
eq. 12 (:func:`iterative_pinv`). Nothing of size ``[n, n]`` is formed in the
forward pass or in its autodiff backward pass (``tests/attention/test_nystrom.py``
reads the jaxpr of both). The definitions follow Hugging Face's
``NystromformerSelfAttention`` (``transformers/models/nystromformer``) and
the authors' ``LRA/code/attention_nystrom.py`` (``mlpen/Nystromformer``):

* queries and keys are each scaled by ``sqrt(scale)`` (``head_dim^-1/4``)
  before the segment means;
* with as many landmarks as tokens the exact softmax is used
  (``exact_when_full``, as both references do);
* a key-padding mask enters ``softmax(Q~ K^T)`` only (``nystrom_padding="keys"``,
  Hugging Face); ``nystrom_padding="zero"`` also zeroes the padded queries and keys
  before the landmarks are taken (the authors' LRA code);
* the optional depthwise convolution of the values along the length
  (:func:`depthwise_conv`, ``conv_kernel_size``) is a separate skip branch
  that :class:`laplax.attention.MultiHeadAttention` adds.

``P~`` is not row-stochastic: its rows need not sum to 1 nor be
non-negative, so a Laplacian head's ``V - P~ V`` is not exactly "each token
minus a weighted mean" (docs/nystrom.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from laplax.kernels.common import MASK_VALUE, repeat_kv

#: Initialisations of :func:`iterative_pinv`'s ``Z_0 = K^T / c``: "original"
#: (``c`` the largest column sum over the whole batch and all heads, what both
#: references run) or "exact" (``c = ||K||_1`` per example and head).
PINV_INITS = ("original", "exact")
#: How a key-padding mask enters (see the module docstring).
PADDINGS = ("keys", "zero")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NystromSpec:
  """The options of ``implementation="nystrom"`` under their config names
  (``model.num_landmarks``, ``model.pinv_iterations``, ``model.pinv_init``,
  ``model.nystrom_padding``, ``model.conv_kernel_size``): the ``nystrom``
  sub-spec of an attention spec (``laplax.models.spec.AttentionSpec.nystrom``,
  ``laplax.attention.MultiHeadAttention.nystrom``), passed whole from
  :func:`laplax.attention.attend` through :func:`laplax.kernels.attention`
  to :func:`nystrom_attention` (its keyword arguments of the same names) and
  to :func:`laplax.attention.nystrom_conv` (``conv_kernel_size``,
  ``nystrom_padding``). The fields' metadata gives their config checks (the
  model spec raises them, naming the key; they count where
  ``model.implementation`` is set); the kernel refuses bad values with a
  ValueError.

  Attributes:
    num_landmarks: ``m``, the segment-mean landmarks (dividing the length).
    pinv_iterations, pinv_init: :func:`iterative_pinv`'s.
    nystrom_padding: how a key-padding mask enters, one of :data:`PADDINGS`.
    conv_kernel_size: the depthwise convolution skip of the values
      (:func:`depthwise_conv`, odd); ``None``: none.
  """

  num_landmarks: int = dataclasses.field(
    default=64, metadata={"check": "int", "key": None, "min": 1}
  )
  pinv_iterations: int = dataclasses.field(
    default=6, metadata={"check": "int", "key": None, "min": 0}
  )
  pinv_init: str = dataclasses.field(
    default="original", metadata={"check": "choice", "key": None, "choices": PINV_INITS}
  )
  nystrom_padding: str = dataclasses.field(
    default="keys", metadata={"check": "choice", "key": None, "choices": PADDINGS}
  )
  conv_kernel_size: int | None = dataclasses.field(
    default=None, metadata={"check": "int", "key": None, "min": 1, "optional": True}
  )


def segment_means(x: jax.Array, num_landmarks: int) -> jax.Array:
  """Means of ``num_landmarks`` contiguous segments along the length.

  Args:
    x: ``[batch, heads, length, head_dim]``; ``length`` divisible by
      ``num_landmarks``.
    num_landmarks: ``m``.

  Returns:
    ``[batch, heads, m, head_dim]`` in ``x.dtype``.
  """
  b, h, n, d = x.shape
  return x.reshape(b, h, num_landmarks, n // num_landmarks, d).mean(axis=-2)


def iterative_pinv(mat: jax.Array, iterations: int = 6, init: str = "original") -> jax.Array:
  """Moore-Penrose pseudo-inverse by the iteration of Razavi et al. (2014), the
  Nystromformer's eq. 12: ``Z <- Z/4 (13 I - K Z (15 I - K Z (7 I - K Z)))``.

  Args:
    mat: float ``[batch, heads, m, m]`` with non-negative entries (a softmax).
    iterations: steps (6 in both references).
    init: one of :data:`PINV_INITS` (``Z_0 = mat^T / c``).

  Returns:
    ``[batch, heads, m, m]``, ``mat``'s dtype.

  Raises:
    ValueError: an unknown ``init``.
  """
  if init not in PINV_INITS:
    raise ValueError(f"pinv_init={init!r} is unknown; use one of {', '.join(PINV_INITS)}")
  eye = jnp.eye(mat.shape[-1], dtype=mat.dtype)
  col_sums = jnp.sum(mat, axis=-2)
  if init == "original":
    coeff = 1.0 / jnp.max(col_sums)
  else:
    coeff = 1.0 / jnp.max(col_sums, axis=-1)[..., None, None]
  z = coeff * jnp.swapaxes(mat, -1, -2)
  for _ in range(iterations):
    kz = mat @ z
    z = (0.25 * z) @ (13 * eye - kz @ (15 * eye - kz @ (7 * eye - kz)))
  return z


def depthwise_conv(value: jax.Array, weight: jax.Array) -> jax.Array:
  """Per-head convolution of the values along the length, zero-padded ("same").

  ``out[b, t, h, :] = sum_j weight[j, h] * value[b, t + j - k // 2, h, :]``: the
  ``nn.Conv2d(heads, heads, (k, 1), padding=(k // 2, 0), groups=heads,
  bias=False)`` of both references (its weight ``[h, 1, k, 1]`` is
  ``weight.T``). Linear in length.

  Args:
    value: ``[batch, length, heads, head_dim]``.
    weight: ``[k, heads]``, ``k`` odd.

  Returns:
    ``[batch, length, heads, head_dim]`` in ``value.dtype``.
  """
  b, n, h, d = value.shape
  k = weight.shape[0]
  rhs = jnp.repeat(weight.astype(value.dtype), d, axis=1)[:, None, :]  # [k, 1, h*d]
  out = jax.lax.conv_general_dilated(
    value.reshape(b, n, h * d),
    rhs,
    window_strides=(1,),
    padding=[(k // 2, k // 2)],
    dimension_numbers=("NWC", "WIO", "NWC"),
    feature_group_count=h * d,
  )
  return out.reshape(b, n, h, d)


def key_padding(mask: jax.Array | None, batch: int, kv_length: int) -> jax.Array | None:
  """A boolean mask broadcastable to ``[batch, heads, q, kv]`` as key padding
  ``[batch, kv]`` (True = a real key), or ``None``.

  Raises:
    ValueError: the mask varies over heads or queries (Nystrom attention
      takes key-padding masks only).
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask, bool)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  if mask.shape[1] != 1 or mask.shape[2] != 1:
    raise ValueError(
      f"Nystrom attention takes key-padding masks [batch, 1, 1, kv_length] only, got a mask "
      f"of shape {tuple(mask.shape)}; pass the padding of the keys"
    )
  return jnp.broadcast_to(mask[:, 0, 0, :], (batch, kv_length))


def nystrom_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  *,
  num_landmarks: int = 64,
  mask: jax.Array | None = None,
  scale: float | None = None,
  pinv_iterations: int = 6,
  pinv_init: str = "original",
  nystrom_padding: str = "keys",
  exact_when_full: bool = True,
) -> jax.Array:
  """``P~ V``, the Nystrom approximation of softmax attention (module docstring).

  Args:
    query: ``[batch, length, heads, head_dim]``.
    key, value: ``[batch, length, kv_heads, head_dim]`` (``kv_heads`` divides
      ``heads``; repeated for grouped-query attention).
    num_landmarks: ``m``, dividing ``length``.
    mask: bool key padding, broadcastable to ``[batch, 1, 1, length]`` (True =
      attend), or ``None``.
    scale: logit scale, default ``head_dim^-1/2``.
    pinv_iterations, pinv_init: :func:`iterative_pinv`'s.
    nystrom_padding: one of :data:`PADDINGS` (``model.nystrom_padding``).
    exact_when_full: ``m == length`` computes the exact softmax (both
      references); False runs the approximation there too.

  Returns:
    ``[batch, length, heads, head_dim]`` in ``value.dtype``; the softmaxes
    and the pseudo-inverse are float32.

  Raises:
    ValueError: lengths of queries and keys that differ, ``m`` not dividing
      the length, an unknown ``nystrom_padding`` or ``pinv_init``, or a mask other
      than key padding.
  """
  b, n, heads, d = query.shape
  if key.shape[1] != n:
    raise ValueError(
      f"Nystrom attention is self-attention: {n} queries but {key.shape[1]} keys "
      f"(no KV cache); use another implementation for decoding"
    )
  if not (isinstance(num_landmarks, int) and 1 <= num_landmarks <= n and n % num_landmarks == 0):
    raise ValueError(
      f"num_landmarks={num_landmarks!r} must divide the length {n} (segment means of "
      f"length / num_landmarks tokens); pad the sequence or change num_landmarks"
    )
  if nystrom_padding not in PADDINGS:
    raise ValueError(
      f"nystrom_padding={nystrom_padding!r} is unknown; use one of {', '.join(PADDINGS)}"
    )
  key, value = repeat_kv(key, heads), repeat_kv(value, heads)  # grouped-query attention
  keys_ok = key_padding(mask, b, n)
  scale = d**-0.5 if scale is None else scale
  f32 = jnp.float32
  root = f32(scale) ** 0.5
  q = jnp.swapaxes(query, 1, 2).astype(f32) * root  # [b, h, n, d]
  k = jnp.swapaxes(key, 1, 2).astype(f32) * root
  v = jnp.swapaxes(value, 1, 2).astype(f32)
  if keys_ok is not None and nystrom_padding == "zero":
    zero = keys_ok[:, None, :, None].astype(f32)
    q, k = q * zero, k * zero

  def masked(logits):
    if keys_ok is None:
      return logits
    return jnp.where(keys_ok[:, None, None, :], logits, f32(MASK_VALUE))

  if num_landmarks == n and exact_when_full:
    probs = jax.nn.softmax(masked(jnp.einsum("bhqd,bhkd->bhqk", q, k)), axis=-1)
    out = probs @ v
  else:
    q_land, k_land = segment_means(q, num_landmarks), segment_means(k, num_landmarks)
    kernel_1 = jax.nn.softmax(jnp.einsum("bhnd,bhmd->bhnm", q, k_land), axis=-1)
    kernel_2 = jax.nn.softmax(jnp.einsum("bhmd,bhld->bhml", q_land, k_land), axis=-1)
    kernel_3 = jax.nn.softmax(masked(jnp.einsum("bhmd,bhnd->bhmn", q_land, k)), axis=-1)
    inverse = iterative_pinv(kernel_2, pinv_iterations, pinv_init)
    out = (kernel_1 @ inverse) @ (kernel_3 @ v)
  return jnp.swapaxes(out, 1, 2).astype(value.dtype)
