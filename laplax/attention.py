"""Attention with Laplacian heads (Zhang & Papyan, arXiv 2602.09297).

A standard head updates the residual stream with ``P V``, where
``P = softmax(Q K^T / sqrt(head_dim) + mask)`` is row-stochastic. A
*Laplacian head* uses the random-walk graph Laplacian ``I - P`` instead::

    X <- X + sum_{i in A} P_i X W_Vi W_Oi + sum_{i in L} (I - P_i) X W_Vi W_Oi

so its output before the output projection is ``V_i - P_i V_i``. It is taken
from the same ``P V`` a standard head computes, so any fused kernel serves both
kinds of head and no ``[length, length]`` tensor is formed.

:func:`attend` takes the heads' outputs from the ``P V`` of
:func:`laplax.kernels.attention`, the one seam where the kernel is chosen
(``"xla"``, ``"cudnn"``, ``"splash"``, the materialising ``"reference"``;
``None`` chooses by platform); :class:`MultiHeadAttention` holds the
projections, qk-norm, rotary, dropout and the spectral conditioning of
:mod:`laplax.spectral`.

It is composed of public parts that take the attention spec whole (a
``laplax.models.spec.AttentionSpec`` or a :class:`MultiHeadAttention`: the
same field names): :func:`check_settings`, :func:`project_qkv` (the
projection with its spectral correction), :func:`value_embed_gate`,
:func:`norm_and_rotate` (qk-norm and rotary), :func:`laplacian_mix`,
:func:`attention_dropout_rng`, :func:`attend`, :func:`nystrom_conv` and
:func:`out_projection`. Other attentions (DaViT's channel attention, XCiT's
cross-covariance and class attention) compose the same parts
(docs/architecture.md, "Attention parts").

See docs/methods.md for both methods, their config keys and laplax's choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import kernels, sharding, spectral
from laplax.kernels import (
  IMPLEMENTATIONS,
  causal_mask,
  nystrom,
  reference_attention,
  repeat_kv,
  window_mask,
)
from laplax.kernels.nystrom import NystromSpec
from laplax.rotary import STYLES as ROPE_STYLES  # noqa: F401  (re-exported)
from laplax.rotary import RotarySpec, rotary, rotary_table  # noqa: F401  (rotary_table re-exported)

# Logical axes of queries, keys, values and head outputs (laplax.sharding).
HEADS_AXES = ("batch", "length", "heads", "head_dim")
LAPLACIAN_MIXES = ("fixed", "learned")
# Kinds of qk-norm: Flax's learnable LayerNorm (DeiT-3) or the parameter-free
# RMSNorm of nanochat/gpt.py (:func:`rms_norm`).
QK_NORM_TYPES = ("layernorm", "rmsnorm")
# The learned mix starts at alpha = sigmoid(+-4): 0.982 on the heads the
# config marks Laplacian, 0.018 on the others.
LAPLACIAN_MIX_INIT = 4.0
# The channels of the block input the fork's value-embedding gate reads.
VE_GATE_CHANNELS = 12


@dataclasses.dataclass(frozen=True, kw_only=True)
class QKNormSpec:
  """The qk-norm under its config name (``model.qk_norm_type``): the
  ``qk_norm`` sub-spec of an attention spec
  (``laplax.models.spec.AttentionSpec.qk_norm``,
  :attr:`MultiHeadAttention.qk_norm`; ``None`` there = no qk-norm, the
  config's ``model.qk_norm=False``), read whole by :func:`norm_and_rotate`.
  The field's metadata gives its config check (the model spec raises it,
  naming the key).

  Attributes:
    qk_norm_type: ``"layernorm"`` (learnable ``query_norm`` / ``key_norm``,
      DeiT-3) or ``"rmsnorm"`` (:func:`rms_norm`, no parameters;
      nanochat/gpt.py), one of :data:`QK_NORM_TYPES`.
  """

  qk_norm_type: str = dataclasses.field(
    default="layernorm", metadata={"check": "choice", "key": None, "choices": QK_NORM_TYPES}
  )


def laplacian_heads(
  num_heads: int, num_laplacian_heads: int = 0, mask: Sequence[bool] | None = None
) -> np.ndarray:
  """Which heads of a layer are Laplacian, as a bool array ``[num_heads]``.

  Args:
    num_heads: heads in the layer.
    num_laplacian_heads: ``k``: the *last* ``k`` heads are Laplacian, as in the
      reference runs ("ViT-S-5L" = 5 of 6).
    mask: explicit per-head booleans; overrides ``num_laplacian_heads``.

  Raises:
    ValueError: ``k`` outside ``[0, num_heads]`` or a mask of the wrong length.
  """
  if mask is not None:
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (num_heads,):
      raise ValueError(
        f"laplacian head mask has {mask.size} entries but the layer has "
        f"num_heads={num_heads}; give one boolean per head"
      )
    return mask
  k = int(num_laplacian_heads)
  if not 0 <= k <= num_heads:
    raise ValueError(
      f"num_laplacian_heads={k} is outside 0..num_heads={num_heads}; "
      f"choose at most num_heads Laplacian heads"
    )
  return np.arange(num_heads) >= num_heads - k


def attend(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  *,
  laplacian: Any,
  mask: jax.Array | None = None,
  is_causal: bool = False,
  implementation: str | None = None,
  scale: float | None = None,
  dropout_rate: float = 0.0,
  dropout_rng: jax.Array | None = None,
  residual_value: jax.Array | None = None,
  return_weights: bool = False,
  mix: jax.Array | None = None,
  xla_keep_probs: bool | None = None,
  nystrom: Any = None,
  bias: jax.Array | None = None,
  window: int | None = None,
):
  """Multi-head attention where some heads are Laplacian (``V - P V``).

  Standard heads return ``P_i V_i``, Laplacian heads ``V_i - P_i V_i``
  (Zhang & Papyan 2026, the update ``sum_A P X W_V W_O + sum_L (I - P) X W_V W_O``),
  both from one ``P V`` computation: :func:`laplax.kernels.xla.xla_attention`
  (XLA ops with a hand-written VJP) for ``"xla"``, the fused kernels (no
  ``[length, length]`` tensor) ``jax.nn.dot_product_attention`` for
  ``"cudnn"`` and :func:`laplax.kernels.splash.splash_attention` for ``"splash"``,
  or :func:`reference_attention`; ``None`` lets :func:`laplax.kernels.choose`
  pick by platform and shape. In causal attention token ``t``'s Laplacian
  output is ``v_t - sum_{j<=t} p_tj v_j``, so token 0's is exactly 0.

  Args:
    query: ``[batch, q_length, num_heads, head_dim]``.
    key, value: ``[batch, kv_length, num_kv_heads, head_dim]``.
    laplacian: bool per head, ``[num_heads]`` (see :func:`laplacian_heads`).
    mask: bool, broadcastable to ``[batch, num_heads, q_length, kv_length]``,
      True = attend.
    is_causal: causal attention (queries aligned to the last keys).
    implementation: ``None`` (by platform: splash on TPU, cuDNN on NVIDIA
      GPUs in bfloat16/float16, else XLA; XLA where the shape does not suit
      the fused kernel), ``"xla"`` (:func:`laplax.kernels.xla.xla_attention`),
      ``"cudnn"`` (fused flash attention, NVIDIA GPUs only), ``"splash"``
      (Pallas splash attention: TPU, interpret mode elsewhere; lengths that
      are multiples of 128, no dropout) or ``"reference"`` (materialises ``P``).
    scale: logit scale, default ``1 / sqrt(head_dim)``.
    dropout_rate, dropout_rng: attention dropout on ``P``; when active it needs
      ``P`` and therefore runs the reference implementation.
    residual_value: the values at the query positions, ``[batch, q_length,
      num_kv_heads, head_dim]``, the ``V`` of ``V - P V``. Defaults to ``value``,
      which requires ``q_length == kv_length``; with a KV cache pass the current
      chunk's values.
    return_weights: also return ``P`` (``"reference"`` only).
    mix: optional float ``[num_heads]`` ``alpha`` (may be traced): head ``i``
      outputs ``alpha_i V_i + (1 - 2 alpha_i) P_i V_i`` instead, so ``alpha =
      0`` is a standard head and ``alpha = 1`` a Laplacian head exactly (the
      learned mix, :class:`MultiHeadAttention` with ``laplacian_mix=
      "learned"``); ``laplacian`` is then only checked for its shape.
    xla_keep_probs: whether the XLA kernel keeps the float32 ``P`` for its
      backward pass (``None``: on a CPU only; :func:`laplax.kernels.attention`).
    nystrom: the options of ``"nystrom"``, a
      :class:`laplax.kernels.nystrom.NystromSpec` (``None``: its defaults;
      :func:`laplax.kernels.nystrom.nystrom_attention`, ``P~ V`` in place of
      ``P V``, so a Laplacian head is ``V - P~ V``; no attention dropout, no
      causal mask, key-padding masks only).
    bias: optional float additive bias of the logits, broadcastable to
      ``[batch, num_heads, q_length, kv_length]``: ``P = softmax(scale Q K^T
      + bias + mask)`` (Swin's learned relative position bias plus its
      shifted-window mask of -100, Liu et al. 2021, eq. 4). Differentiable.
      The reference and XLA kernels take it; ``None`` runs XLA, ``"cudnn"``
      and ``"splash"`` refuse it.
    window: a causal sliding window (``is_causal`` only): query ``p`` sees
      key ``j`` iff ``0 <= p - j <= window`` (:func:`laplax.kernels.attention`;
      splash skips the blocks outside it).

  Returns:
    ``[batch, q_length, num_heads, head_dim]`` in ``value.dtype``; with
    ``return_weights`` the pair ``(output, P)``, ``P`` float32
    ``[batch, num_heads, q_length, kv_length]``.

  Raises:
    ValueError: unknown implementation, ``laplacian`` of the wrong length,
      missing ``residual_value`` when lengths differ, ``return_weights``
      with a fused implementation, or what splash cannot take (lengths,
      dropout, masks other than key padding).
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"attention implementation {implementation!r} is unknown; use one of "
      f"'xla', 'cudnn', 'splash', 'reference', 'nystrom' or None"
    )
  num_heads = query.shape[-2]
  try:
    laplacian_np = np.asarray(laplacian, dtype=bool)
  except jax.errors.TracerArrayConversionError:  # traced: decided at run time
    laplacian_np = None
  if np.shape(laplacian) != (num_heads,):
    raise ValueError(
      f"laplacian has shape {np.shape(laplacian)}; expected ({num_heads},), "
      f"one boolean per query head"
    )
  pv, weights = kernels.attention(
    query,
    key,
    value,
    mask=mask,
    is_causal=is_causal,
    scale=scale,
    implementation=implementation,
    dropout_rate=dropout_rate,
    dropout_rng=dropout_rng,
    return_weights=return_weights,
    xla_keep_probs=xla_keep_probs,
    bias=bias,
    nystrom=nystrom,
    window=window,
  )
  out = _laplacian_outputs(pv, laplacian, laplacian_np, residual_value, value, query.shape[1], mix)
  return (out, weights) if return_weights else out


def _laplacian_outputs(pv, laplacian, laplacian_np, residual_value, value, q_length, mix):
  """The heads' outputs of :func:`attend` from ``pv [batch, q_length, heads,
  head_dim]``: ``P V`` (standard heads), ``V - P V`` (Laplacian heads, where
  ``laplacian``; ``laplacian_np`` is its NumPy value or ``None`` when
  traced), or ``alpha V + (1 - 2 alpha) P V`` with ``alpha = mix``. ``V`` is
  ``residual_value``, default ``value``; its grouped heads are repeated."""
  num_heads = pv.shape[-2]
  if mix is None and laplacian_np is not None and not laplacian_np.any():
    return pv
  if residual_value is None:
    if q_length != value.shape[1]:
      raise ValueError(
        "Laplacian heads need the values at the query positions: pass "
        "residual_value when q_length != kv_length (e.g. with a KV cache)"
      )
    residual_value = value
  residual_value = repeat_kv(residual_value, num_heads)
  if mix is not None:
    alpha = jnp.asarray(mix, jnp.float32)[:, None]
    return (
      alpha * residual_value.astype(jnp.float32) + (1.0 - 2.0 * alpha) * pv.astype(jnp.float32)
    ).astype(pv.dtype)
  lap_out = (residual_value - pv).astype(pv.dtype)
  if laplacian_np is not None and laplacian_np.all():
    return lap_out
  return jnp.where(jnp.asarray(laplacian, dtype=bool)[:, None], lap_out, pv)


class ProjectionDense(nn.Module):
  """Dense projection ``y = x (W + C) + b`` with an optional spectral correction.

  ``C`` is :func:`laplax.spectral.correction` and is a constant: the parameter
  tree (``kernel [in, features]``, ``bias [features]``) is the baseline's, and
  ``dW`` is the baseline gradient at weights ``W + C``. With the correction
  the output is :func:`laplax.spectral.project` (one ``W + C`` kernel in
  float32, ``x W + x C`` with ``x C`` a slice of ``x`` below it), returned
  in float32; without it, ``x W`` in ``dtype``.

  Attributes:
    features: output dimension (``num_heads * head_dim``).
    num_heads: column blocks for the ``"per_head"`` correction (the
      key/value heads for ``W_K, W_V``).
    spectral_lam: ``lambda``; ``None`` disables the correction.
    spectral_mode: one of :data:`laplax.spectral.MODES`.
    spectral_target: ``"q"``, ``"k"`` or ``"v"``: which projection this is
      (the slice of the ``"fused"`` identity it gets).
    query_columns: the columns of ``W_Q`` where they differ from
      ``features`` (grouped-query ``W_K, W_V``; the ``"fused"`` offset,
      :func:`laplax.spectral.correction`); ``None``: ``features``.
    axes: logical axis names of the kernel ``(in, out)`` (the bias has the
      second); see :mod:`laplax.sharding`.
  """

  features: int
  num_heads: int = 1
  use_bias: bool = True
  spectral_lam: float | None = None
  spectral_mode: str = spectral.DEFAULT_MODE
  spectral_target: str = "q"
  query_columns: int | None = None
  dtype: Any = None
  kernel_init: Callable = nn.initializers.xavier_uniform()
  axes: tuple[str | None, str | None] = ("embed", "heads")

  @nn.compact
  def weights(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
    """The parameters ``(kernel [in_features, features], bias [features] or
    None)``, float32, created on first use: what :class:`MultiHeadAttention`
    stacks to project q, k and v with one matmul."""
    kernel = self.param(
      "kernel",
      sharding.logical_init(self.kernel_init, self.axes),
      (in_features, self.features),
      jnp.float32,
    )
    bias = None
    if self.use_bias:
      bias = self.param(
        "bias",
        sharding.logical_init(nn.initializers.zeros, self.axes[1:]),
        (self.features,),
        jnp.float32,
      )
    return kernel, bias

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x [..., in] -> [..., features]``: float32 with the correction, else in
    ``dtype`` (default ``x.dtype``)."""
    kernel, bias = self.weights(x.shape[-1])
    dtype = self.dtype or x.dtype
    if self.spectral_lam is not None:
      y = spectral.project(
        x,
        kernel,
        lam=self.spectral_lam,
        mode=self.spectral_mode,
        num_heads=self.num_heads,
        target=self.spectral_target,
        query_columns=self.query_columns,
        dtype=dtype,
      )
    else:
      y = jnp.dot(x.astype(dtype), kernel.astype(dtype))
    if bias is not None:
      y = y + bias.astype(y.dtype)
    return y


def rms_norm(x: jax.Array, eps: float | None = None) -> jax.Array:
  """Parameter-free RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps)``.

  The ``norm`` of nanochat/gpt.py (``F.rms_norm`` without a weight). Its
  ``eps`` defaults to the machine epsilon of the float32 compute type,
  ``2^-23``, whatever the input's dtype: PyTorch's default is that of its
  float32 "opmath" type for bfloat16 inputs too. Computed in float32.

  Args:
    x: ``[..., dim]``, any float dtype.
    eps: added to the mean square; ``None``: ``finfo(float32).eps`` (as torch).

  Returns:
    float32 ``[..., dim]`` (the callers cast back to their compute dtype).
  """
  eps = float(jnp.finfo(jnp.float32).eps) if eps is None else eps
  y = x.astype(jnp.float32)
  return y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + eps)


# The attention parts. Each takes the attention spec whole: a
# ``laplax.models.spec.AttentionSpec`` or a :class:`MultiHeadAttention` (its
# attributes carry the same names and the same sub-specs: ``qk_norm``
# :class:`QKNormSpec`, ``rope`` :class:`~laplax.rotary.RotarySpec`, ``nystrom``
# :class:`~laplax.kernels.nystrom.NystromSpec`, each ``None`` where off but
# ``nystrom``), read by field name, never renamed. The
# parts that create parameters are plain functions called inside the owning
# module's compact method, so the parameters are that module's (``query``,
# ``key``, ``value``, ``query_norm``, ``laplacian_mix``, ...), whatever module
# composes them (docs/architecture.md, "Attention parts").


def check_settings(
  spec: Any, model_dim: int, *, num_kv_heads: int | None = None, head_dim: int | None = None
) -> None:
  """Refuses settings of the attention spec ``spec`` that no attention can run.

  Args:
    spec: the attention spec (``num_heads``, its ``spectral``, ``qk_norm``
      and ``rope`` sub-specs).
    model_dim: the width of the input.
    num_kv_heads: key/value heads (``None``: one per head).
    head_dim: per-head dimension (``None``: ``model_dim // num_heads``).

  Raises:
    ValueError: ``num_heads`` < 1, ``num_kv_heads`` not dividing it,
      ``spectral.targets`` (with spectral conditioning on) not distinct letters
      of ``"qkv"``, an unknown ``qk_norm_type``, or ``rope`` with an odd head
      dimension; the message names the setting and the fix.
  """
  if spec.num_heads < 1:
    raise ValueError(f"num_heads={spec.num_heads!r} must be an integer >= 1")
  kv = num_kv_heads
  if kv is not None and not (isinstance(kv, int) and kv >= 1 and spec.num_heads % kv == 0):
    raise ValueError(
      f"num_kv_heads={kv!r} must divide num_heads={spec.num_heads} (each key/value head "
      f"serves num_heads / num_kv_heads query heads); use a divisor or None"
    )
  sp = spec.spectral
  targets = None if sp is None else sp.targets
  if (
    sp is not None
    and sp.lam
    and (
      not targets
      or len(set(targets)) != len(targets)
      or any(t not in spectral.TARGETS for t in targets)
    )
  ):
    raise ValueError(
      f"spectral_targets={targets!r} must be distinct letters of "
      f"{spectral.TARGETS!r}, e.g. 'qkv' or 'qk'"
    )
  if spec.qk_norm is not None and spec.qk_norm.qk_norm_type not in QK_NORM_TYPES:
    raise ValueError(
      f"qk_norm_type={spec.qk_norm.qk_norm_type!r} is unknown; use one of "
      f"{', '.join(QK_NORM_TYPES)}"
    )
  head_dim = head_dim or model_dim // spec.num_heads
  if spec.rope is not None and head_dim % 2:
    raise ValueError(
      f"rope needs an even head dimension, got {head_dim} "
      f"(model dim {model_dim}, num_heads {spec.num_heads}); "
      f"set head_dim or num_heads so that it is even"
    )


def project_qkv(
  spec: Any,
  x: jax.Array,
  *,
  head_dim: int,
  dtype: Any,
  kv_heads: int | None = None,
  use_bias: bool = True,
  kernel_init: Callable = nn.initializers.xavier_uniform(),
  fuse: bool = True,
):
  """The projection with its spectral correction: ``q, k, v`` of ``x``.

  Call it inside a compact method: the three :class:`ProjectionDense` are
  the caller's submodules ``query``, ``key`` and ``value`` (``kernel
  [model_dim, heads * head_dim]``, ``bias``), whose ``W_Q, W_K, W_V`` the
  spec's ``spectral`` sub-spec (:class:`~laplax.spectral.SpectralSpec`:
  ``lam``, ``mode``, ``targets``; ``None``: none) conditions (:func:`laplax.spectral.correction`). Where the correction is
  off or the compute is float32 (and ``fuse``), one matmul with the three
  effective kernels stacked ``[model_dim, 3, features]`` (under grouped-query
  attention q alone, then k and v stacked), the same parameters and
  products; else each projection apart (each adds its ``x C`` in float32).

  Args:
    spec: the attention spec (``num_heads`` and ``spectral``).
    x: ``[batch, length, model_dim]``.
    head_dim: per-head dimension.
    dtype: compute dtype of the matmuls.
    kv_heads: key/value heads (``None``: ``num_heads``).
    use_bias, kernel_init: the projections' biases and kernel initialiser.
    fuse: allow the stacked matmul (False: apart, as analysis wants for
      ``capture_intermediates``).

  Returns:
    ``q [batch, length, num_heads, head_dim]``, ``k, v [batch, length,
    kv_heads, head_dim]``, float32 where corrected, else ``dtype``.
  """
  model_dim = x.shape[-1]
  kv_heads = spec.num_heads if kv_heads is None else kv_heads
  heads_of = {"q": spec.num_heads, "k": kv_heads, "v": kv_heads}
  sp = spec.spectral
  lam, mode = (None, spectral.DEFAULT_MODE) if sp is None else (sp.lam, sp.mode)
  targets = "" if sp is None else sp.targets

  def projection(name, target):
    return ProjectionDense(
      heads_of[target] * head_dim,
      num_heads=heads_of[target],
      use_bias=use_bias,
      spectral_lam=lam if target in targets else None,
      spectral_mode=mode,
      spectral_target=target,
      query_columns=spec.num_heads * head_dim,
      dtype=dtype,
      kernel_init=kernel_init,
      name=name,
    )

  def heads(y, target):
    y = y.reshape(*x.shape[:-1], heads_of[target], head_dim)
    return nn.with_logical_constraint(y, HEADS_AXES)

  names = (("query", "q"), ("key", "k"), ("value", "v"))
  if not (fuse and (lam is None or jnp.dtype(dtype) == jnp.float32)):
    return tuple(heads(projection(n, t)(x), t) for n, t in names)
  # One matmul for q, k and v: the three kernels stacked [in, 3, features]
  # (a new axis, so a "heads"-sharded kernel stays sharded), the same
  # parameters and products as three ProjectionDense calls (in float32 a
  # corrected one multiplies by W + C, spectral.project's float32 form).
  # With grouped-query attention k and v are narrower than q: q alone, then
  # k and v stacked.
  layers = {t: projection(n, t) for n, t in names}
  weights = {t: layers[t].weights(model_dim) for _, t in names}
  groups = ["qkv"] if kv_heads == spec.num_heads else ["q", "kv"]
  out = {}
  with jax.named_scope("qkv"):  # the ops' name in profiles (bench/profile_step.py)
    for group in groups:
      kernels = [
        spectral.conditioned(
          weights[t][0],
          lam=lam,
          mode=mode,
          num_heads=heads_of[t],
          target=t,
          query_columns=layers[t].query_columns,
        )
        if lam is not None and t in targets
        else weights[t][0]
        for t in group
      ]
      kernel = jnp.stack(kernels, axis=1).astype(dtype)
      y = jnp.einsum("...i,itf->...tf", x.astype(dtype), kernel)
      if use_bias:
        y = y + jnp.stack([weights[t][1] for t in group]).astype(dtype)
      out.update({t: heads(y[..., i, :], t) for i, t in enumerate(group)})
  return out["q"], out["k"], out["v"]


def value_embed_gate(
  x: jax.Array, v: jax.Array, value_embed: jax.Array | None, *, kv_heads: int, dtype: Any
) -> jax.Array:
  """The fork's gated value embedding: ``v + 3 sigmoid(ve_gate(x[..., :12])) value_embed``.

  yuchongzhang/nanochat 1f70b557, nanochat/gpt.py ``CausalSelfAttention``:
  one gate per key/value head, the caller's submodule ``ve_gate`` (``kernel
  [12, kv_heads]``, U(0, 0.02), no bias; call it inside a compact method).

  Args:
    x: the block input ``[batch, length, model_dim]`` (its first
      :data:`VE_GATE_CHANNELS` channels feed the gate).
    v: values ``[batch, length, kv_heads, head_dim]``.
    value_embed: ``[batch, length, kv_heads * head_dim]`` or ``None`` (then
      ``v`` is returned).
    kv_heads: key/value heads; dtype: the gate's compute dtype.

  Returns:
    ``[batch, length, kv_heads, head_dim]`` in ``v.dtype``.
  """
  if value_embed is None:
    return v
  gate = nn.Dense(
    kv_heads,
    use_bias=False,
    dtype=dtype,
    kernel_init=sharding.logical_init(
      lambda key, shape, dt=jnp.float32: jax.random.uniform(key, shape, dt, 0.0, 0.02),
      (None, "heads"),
    ),
    name="ve_gate",
  )(x[..., :VE_GATE_CHANNELS].astype(dtype))
  ve = value_embed.astype(v.dtype).reshape(v.shape)
  return v + (3.0 * jax.nn.sigmoid(gate))[..., None].astype(v.dtype) * ve


def norm_and_rotate(spec: Any, q: jax.Array, k: jax.Array, positions, max_length=None):
  """``q, k`` after the spec's qk-norm, ``qk_scale`` and rotary.

  The order follows ``rope.rope_style``: ``"nanochat"`` rotates first (as
  nanochat/gpt.py), ``"roformer"`` after the norm. The ``"layernorm"``
  qk-norm is the caller's float32 ``nn.LayerNorm`` submodules ``query_norm``
  and ``key_norm`` (call it inside a compact method); ``"rmsnorm"`` is
  :func:`rms_norm`, parameter-free.

  Args:
    spec: the attention spec: its ``qk_norm`` (:class:`QKNormSpec` or
      ``None``), ``qk_scale`` and ``rope`` (:class:`~laplax.rotary.RotarySpec`
      or ``None``).
    q, k: ``[batch, length, heads, head_dim]``.
    positions: int ``[length]`` (traced when decoding).
    max_length: the rotary table's length (a KV cache's), ``None``: the input's.

  Returns:
    ``(q, k)``, same shapes; float32 after a qk-norm.
  """
  rope, qk_norm = spec.rope, spec.qk_norm
  rotate = lambda y: rotary(
    y, positions, rope.rope_theta, max_length=max_length, style=rope.rope_style
  )
  rope_first = rope is not None and rope.rope_style == "nanochat"
  if rope_first:  # nanochat/gpt.py: rotary, then the qk-norm
    q, k = rotate(q), rotate(k)
  if qk_norm is not None and qk_norm.qk_norm_type == "rmsnorm":
    q, k = rms_norm(q), rms_norm(k)
  elif qk_norm is not None:
    norm = dict(dtype=jnp.float32, **sharding.layer_norm_inits("head_dim"))
    q = nn.LayerNorm(name="query_norm", **norm)(q)
    k = nn.LayerNorm(name="key_norm", **norm)(k)
  if spec.qk_scale != 1.0:
    q, k = q * spec.qk_scale, k * spec.qk_scale
  if rope is not None and not rope_first:
    q, k = rotate(q), rotate(k)
  return q, k


def laplacian_mix(module: nn.Module, spec: Any, laplacian) -> jax.Array | None:
  """The Laplacian mix of the spec's ``laplacian_mix``: ``alpha`` for :func:`attend`.

  ``"fixed"``: ``None`` (the heads of ``laplacian`` output ``V - P V``, the
  others ``P V``). ``"learned"``: ``alpha = sigmoid(a)``, float32
  ``[num_heads]``, with ``a`` the parameter ``laplacian_mix [num_heads]`` of
  ``module`` (call it inside ``module``'s compact method), initialised at
  ``+-LAPLACIAN_MIX_INIT`` on the heads ``laplacian`` marks Laplacian or not.

  Args:
    module: the attention module that owns the parameter.
    spec: the attention spec (``laplacian_mix``, ``num_heads``).
    laplacian: bool ``[num_heads]`` (may be traced).

  Raises:
    ValueError: an unknown ``laplacian_mix``.
  """
  if spec.laplacian_mix == "fixed":
    return None
  if spec.laplacian_mix != "learned":
    raise ValueError(
      f"laplacian_mix={spec.laplacian_mix!r} is unknown; use one of {', '.join(LAPLACIAN_MIXES)}"
    )
  pattern = jnp.asarray(laplacian, jnp.float32)
  logits = module.param(
    "laplacian_mix",
    sharding.logical_init(
      lambda rng, shape: LAPLACIAN_MIX_INIT * (2.0 * pattern - 1.0), ("heads",)
    ),
    (spec.num_heads,),
  )
  return jax.nn.sigmoid(logits)


def attention_dropout_rng(module: nn.Module, spec: Any, deterministic: bool) -> jax.Array | None:
  """The ``"dropout"`` RNG of the spec's ``attention_dropout`` on ``P``, or
  ``None`` when it is off (``deterministic`` or a rate of 0)."""
  if deterministic or spec.attention_dropout <= 0.0:
    return None
  return module.make_rng("dropout")


def nystrom_conv(module: nn.Module, spec: Any, v: jax.Array, mask: jax.Array | None) -> jax.Array:
  """The depthwise convolution skip of the values of ``implementation="nystrom"``.

  :func:`laplax.kernels.nystrom.depthwise_conv` of ``v`` with the parameter
  ``nystrom_conv [nystrom.conv_kernel_size, num_heads]`` of ``module`` (call it
  inside ``module``'s compact method), PyTorch's ``Conv2d`` initialisation
  ``U(+-1/sqrt(k))``. With ``nystrom_padding="zero"`` the padded values are
  zeroed first (the authors' LRA code).

  Args:
    module: the attention module that owns the parameter.
    spec: the attention spec (``num_heads`` and its ``nystrom``
      sub-spec: ``conv_kernel_size``, ``nystrom_padding``).
    v: values ``[batch, length, kv_heads, head_dim]``.
    mask: the key-padding mask of :func:`attend`, or ``None``.

  Returns:
    ``[batch, length, num_heads, head_dim]``.

  Raises:
    ValueError: an even ``conv_kernel_size``.
  """
  k = spec.nystrom.conv_kernel_size
  if k % 2 == 0:
    raise ValueError(f"conv_kernel_size={k} must be odd (a 'same' convolution); use {k + 1}")
  bound = k**-0.5
  weight = module.param(
    "nystrom_conv",
    sharding.logical_init(
      lambda rng, shape: jax.random.uniform(rng, shape, jnp.float32, -bound, bound),
      (None, "heads"),
    ),
    (k, spec.num_heads),
  )
  v = repeat_kv(v, spec.num_heads)
  keys_ok = nystrom.key_padding(mask, v.shape[0], v.shape[1])
  if keys_ok is not None and spec.nystrom.nystrom_padding == "zero":
    v = v * keys_ok[:, :, None, None].astype(v.dtype)
  return nystrom.depthwise_conv(v, weight)


def out_projection(
  y: jax.Array,
  model_dim: int,
  *,
  dtype: Any = None,
  use_bias: bool = True,
  out_init: Callable = nn.initializers.xavier_uniform(),
) -> jax.Array:
  """``W_O``: the heads' outputs ``y [..., heads * head_dim] -> [..., model_dim]``,
  the caller's :class:`ProjectionDense` submodule ``out`` (never spectrally
  corrected; call it inside a compact method), compute in ``dtype``
  (default ``y.dtype``)."""
  return ProjectionDense(
    model_dim,
    dtype=dtype,
    kernel_init=out_init,
    use_bias=use_bias,
    axes=("heads", "embed"),
    name="out",
  )(y)


class MultiHeadAttention(nn.Module):
  """Self-attention with Laplacian heads and spectrally conditioned projections.

  Input ``x [batch, length, model_dim]`` -> output ``[batch, length, model_dim]``.
  ``W_Q`` is ``[model_dim, num_heads * head_dim]``, ``W_K, W_V`` ``[model_dim,
  kv_heads * head_dim]`` (plus the fixed correction ``C`` when
  ``spectral_lam`` is set), ``W_O`` is ``[num_heads * head_dim, model_dim]``
  and is never corrected. q, k and v come from one matmul with the three
  (effective) kernels stacked (``[model_dim, 3, num_heads * head_dim]``; under
  grouped-query attention q alone and k, v stacked), the parameters staying
  three ``ProjectionDense`` trees; spectral conditioning below float32 runs
  them apart (each adds its ``x C`` in float32), and so does analysis (a
  mutable ``"intermediates"`` collection), so that ``capture_intermediates``
  records each projection's output.

  Grouped-query attention (Ainslie et al. 2023; nanochat/gpt.py's
  ``n_kv_head``): query head ``h`` attends with key/value head ``h //
  (num_heads / kv_heads)``, and a Laplacian head subtracts that head's ``v``
  (the repeat of :func:`laplax.kernels.common.repeat_kv`, nanochat's
  ``repeat_interleave``).

  With ``decode=True`` the keys and values are appended to a KV cache (the
  ``"cache"`` collection, ``[batch, max_length, kv_heads, head_dim]``, created by
  an ``init`` with ``decode=True`` on a ``[batch, max_length, model_dim]``
  input); the chunk attends causally to everything cached so far and the
  Laplacian heads use the chunk's own values, so the result equals the full
  causal forward pass.

  For analysis, when the ``"intermediates"`` collection is mutable (and not
  decoding), the attention matrix ``P`` (float32 ``[batch, num_heads, length,
  length]``, before dropout) is also sown as ``"attention_weights"``, computed
  again by :func:`reference_attention`, and each head's output before ``W_O``
  (``[batch, length, num_heads, head_dim]``, the compute dtype; ``V - PV`` for
  a Laplacian head) as ``"head_outputs"``. Otherwise nothing is traced:
  training and evaluation are unchanged.

  Attributes:
    num_heads: attention (query) heads.
    num_kv_heads: key/value heads, a divisor of ``num_heads`` (grouped-query
      attention); ``None``: ``num_heads``. :attr:`kv_heads` is the number.
    head_dim: per-head dimension; default ``model_dim // num_heads``.
    num_laplacian_heads: the last ``k`` heads use ``I - P``.
    laplacian_mask: explicit per-head booleans (overrides the count).
    qk_norm: normalise queries and keys over ``head_dim`` (DeiT-3 recipe):
      True, False or the sub-spec :class:`QKNormSpec` itself (what the
      models pass, ``None`` = off); after construction always the sub-spec
      or ``None`` (:meth:`__post_init__`).
    qk_norm_type: with ``qk_norm=True``, ``"layernorm"`` (learnable
      ``query_norm`` / ``key_norm``) or ``"rmsnorm"`` (:func:`rms_norm`, no
      parameters; nanochat/gpt.py): the :class:`QKNormSpec` built.
    qk_scale: factor on ``q`` and on ``k`` after the qk-norm (a later
      nanochat: 1.2 each, so the logits are ``1.44 q.k / sqrt(head_dim)``
      with the kernel's default scale); 1.0 multiplies nothing.
    attention_dropout: dropout on ``P`` (forces the reference kernel).
    dropout: dropout on the output projection.
    spectral_lam, spectral_mode: spectral conditioning (``None`` = off),
      where ``spectral`` is not given.
    spectral_targets: which of ``W_Q, W_K, W_V`` are corrected (a string of
      ``"qkv"`` letters). The corrected projections are summed in float32
      (:class:`ProjectionDense`); qk-norm and rotary then see them in float32
      and the attention kernel in ``dtype``.
    implementation: kernel for :func:`attend` (decoding with the KV cache
      runs XLA's instead of splash).
    xla_keep_probs: whether the XLA kernel keeps the float32 ``P`` for the
      backward pass (``None``: on a CPU only; memory, never values).
    laplacian_mix: ``"fixed"`` (the heads marked Laplacian output ``V - P V``,
      the others ``P V``) or ``"learned"``: head ``i`` outputs ``alpha_i V +
      (1 - 2 alpha_i) P V`` with ``alpha_i = sigmoid(a_i)`` and ``a`` a
      parameter ``laplacian_mix [num_heads]`` initialised at the fixed pattern
      (``+LAPLACIAN_MIX_INIT`` on the Laplacian heads, ``-`` on the others;
      alpha 0.982 / 0.018). A vector, so no weight decay reaches it. Zhang &
      Papyan call their fixed choice of heads likely suboptimal; this lets a
      run learn the mix.
    use_bias: biases on the q/k/v/out projections.
    rope: rotary position embedding on queries and keys
      (:func:`laplax.rotary.rotary`): True, False or the sub-spec
      :class:`~laplax.rotary.RotarySpec` itself (what the models pass,
      ``None`` = off); after construction always the sub-spec or ``None``.
    rope_theta, rope_style: with ``rope=True``, the base (10,000; the later
      nanochat's 100,000 is an option) and ``"roformer"`` (``+angle``,
      float32 table, after the qk-norm) or ``"nanochat"`` (``-angle``,
      bfloat16 table, before the qk-norm, as nanochat/gpt.py): the
      :class:`~laplax.rotary.RotarySpec` built.
    dtype: compute dtype of the matmuls (parameters stay float32).
    kernel_init: initialiser of ``W_Q, W_K, W_V``.
    out_init: initialiser of ``W_O`` (GPT uses a depth-scaled normal).
    num_landmarks, pinv_iterations, pinv_init, nystrom_padding: the options of
      ``implementation="nystrom"`` (:func:`laplax.kernels.nystrom.nystrom_attention`,
      the same names), where ``nystrom`` is not given.
    conv_kernel_size: with ``"nystrom"``, the depthwise convolution of the
      values (:func:`laplax.kernels.nystrom.depthwise_conv`, parameter
      ``nystrom_conv [k, num_heads]``) added to every head's output, Laplacian
      or not (a skip branch beside ``P~ V``); ``None``: none.
    window: a causal sliding window: query ``i`` sees key ``j`` iff ``0 <= i
      - j <= window`` (the fork's ``window_size=(window, 0)``, nanochat's
      flash_attention.py), as a mask through :func:`attend`; ``None``: full.
      ``implementation="splash"`` and ``"nystrom"`` refuse it.
    nystrom: the sub-spec :class:`~laplax.kernels.nystrom.NystromSpec` of
      the Nystrom options (what the models pass); ``None``: built from the
      five attributes above.
    spectral: the sub-spec :class:`~laplax.spectral.SpectralSpec` of the
      spectral conditioning (what the models pass); ``None``: built from
      ``spectral_lam``, ``spectral_mode``, ``spectral_targets`` where
      ``spectral_lam`` is set, else off. Where a sub-spec is given
      (``qk_norm``, ``rope``, ``nystrom``, ``spectral``), the flat
      attributes it stands for are not read.
  """

  num_heads: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  num_laplacian_heads: int = 0
  laplacian_mask: Sequence[bool] | None = None
  qk_norm: bool | QKNormSpec | None = False
  qk_norm_type: str = "layernorm"
  qk_scale: float = 1.0
  attention_dropout: float = 0.0
  dropout: float = 0.0
  spectral_lam: float | None = None
  spectral_mode: str = spectral.DEFAULT_MODE
  spectral_targets: str = spectral.TARGETS
  implementation: str | None = None
  xla_keep_probs: bool | None = None
  laplacian_mix: str = "fixed"
  use_bias: bool = True
  rope: bool | RotarySpec | None = False
  rope_theta: float = 10_000.0
  rope_style: str = "roformer"
  dtype: Any = None
  kernel_init: Callable = nn.initializers.xavier_uniform()
  out_init: Callable = nn.initializers.xavier_uniform()
  num_landmarks: int = 64
  pinv_iterations: int = 6
  pinv_init: str = "original"
  nystrom_padding: str = "keys"
  conv_kernel_size: int | None = None
  window: int | None = None
  nystrom: NystromSpec | None = None
  spectral: spectral.SpectralSpec | None = None

  def __post_init__(self):
    """Makes ``qk_norm``, ``rope``, ``nystrom`` and ``spectral`` the
    sub-specs the attention parts read (:class:`QKNormSpec`,
    :class:`~laplax.rotary.RotarySpec`, :class:`~laplax.spectral.SpectralSpec`
    or ``None``; :class:`~laplax.kernels.nystrom.NystromSpec`), built from
    the flat keyword arguments where a bool or ``None`` was passed; a
    sub-spec passed is kept as it is (so a ``clone`` keeps them)."""
    if not isinstance(self.qk_norm, QKNormSpec):
      qk_norm = QKNormSpec(qk_norm_type=self.qk_norm_type) if self.qk_norm else None
      object.__setattr__(self, "qk_norm", qk_norm)
    if not isinstance(self.rope, RotarySpec):
      rope = RotarySpec(rope_theta=self.rope_theta, rope_style=self.rope_style)
      object.__setattr__(self, "rope", rope if self.rope else None)
    if self.nystrom is None:
      options = NystromSpec(
        num_landmarks=self.num_landmarks,
        pinv_iterations=self.pinv_iterations,
        pinv_init=self.pinv_init,
        nystrom_padding=self.nystrom_padding,
        conv_kernel_size=self.conv_kernel_size,
      )
      object.__setattr__(self, "nystrom", options)
    if self.spectral is None and self.spectral_lam is not None:
      conditioning = spectral.SpectralSpec(
        lam=self.spectral_lam, mode=self.spectral_mode, targets=self.spectral_targets
      )
      object.__setattr__(self, "spectral", conditioning)
    super().__post_init__()

  @property
  def kv_heads(self) -> int:
    """Key/value heads: ``num_kv_heads``, or ``num_heads`` when it is ``None``."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    is_causal: bool = False,
    deterministic: bool = True,
    decode: bool = False,
    laplacian: jax.Array | None = None,
    bias: jax.Array | None = None,
    value_embed: jax.Array | None = None,
  ):
    """Applies attention; ``mask`` broadcasts to ``[batch, heads, length, length]``.

    ``laplacian`` (bool ``[num_heads]``, may be traced, e.g. a scanned
    per-layer input) overrides ``num_laplacian_heads`` / ``laplacian_mask``.
    ``bias`` (float, broadcastable to ``[batch, heads, length, length]``) is
    added to the logits (:func:`attend`; not with ``decode``).
    ``value_embed`` ``[batch, length, kv_heads * head_dim]`` (the fork's
    value embedding of the tokens) is added to the values as ``v + 3
    sigmoid(ve_gate(x[..., :12])) ve``, one gate per key/value head
    (parameter ``ve_gate/kernel [12, kv_heads]``, U(0, 0.02);
    yuchongzhang/nanochat 1f70b557, nanochat/gpt.py ``CausalSelfAttention``),
    before the rotary.
    """
    if bias is not None and decode:
      raise ValueError("an additive attention bias is not supported with decode=True")
    check_settings(self, x.shape[-1], num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)
    head_dim = self.head_dim or x.shape[-1] // self.num_heads
    if laplacian is None:
      laplacian = laplacian_heads(self.num_heads, self.num_laplacian_heads, self.laplacian_mask)
    dtype = self.dtype or x.dtype
    # Project (spectrally conditioned W_Q, W_K, W_V), then norm and rotate.
    q, k, v = project_qkv(
      self,
      x,
      head_dim=head_dim,
      dtype=dtype,
      kv_heads=self.kv_heads,
      use_bias=self.use_bias,
      kernel_init=self.kernel_init,
      fuse=not self.is_mutable_collection("intermediates"),  # analysis: apart
    )
    v = value_embed_gate(x, v, value_embed, kv_heads=self.kv_heads, dtype=dtype)
    cache = self._cache(k, v, dtype) if decode else None
    start = 0 if cache is None or cache["init"] else cache["index"].value
    max_length = None if cache is None else cache["key"].value.shape[1]
    q, k = norm_and_rotate(self, q, k, start + np.arange(x.shape[1]), max_length)
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    # Attend: P V by the kernel, V - P V on the Laplacian heads (or the mix).
    dropout_rng = attention_dropout_rng(self, self, deterministic)
    heads = dict(
      laplacian=laplacian, mix=laplacian_mix(self, self, laplacian), dropout_rng=dropout_rng
    )
    if cache is not None and not cache["init"]:
      y = self._attend_cached(q, k, v, cache, start, mask, **heads)
    else:
      y = self._attend(q, k, v, mask, is_causal, bias, **heads)
    # Combine the heads: W_O, then dropout.
    y = nn.with_logical_constraint(y, HEADS_AXES)
    y = y.reshape(*x.shape[:-1], self.num_heads * head_dim)
    y = out_projection(
      y, x.shape[-1], dtype=self.dtype, use_bias=self.use_bias, out_init=self.out_init
    )
    return nn.Dropout(self.dropout)(y, deterministic=deterministic)

  def _cache(self, k, v, dtype) -> dict:
    """The KV cache's variables ``key``, ``value`` (``[batch, max_length,
    kv_heads, head_dim]``: the key/value heads only) and ``index`` (int32,
    the next position), and ``init``: whether this call creates them (an
    ``init``, which writes nothing)."""
    init = not self.has_variable("cache", "cached_key")
    return dict(
      init=init,
      key=self.variable("cache", "cached_key", jnp.zeros, k.shape, dtype),
      value=self.variable("cache", "cached_value", jnp.zeros, v.shape, dtype),
      index=self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32)),
    )

  def _attend(self, q, k, v, mask, is_causal, bias, *, laplacian, mix, dropout_rng):
    """:func:`attend` on the chunk itself (with the sliding ``window`` as a
    mask, the additive ``bias``, Nystrom's options and its convolution skip);
    for analysis (a mutable ``"intermediates"``) also sows ``P`` and the
    heads' outputs.

    Raises:
      ValueError: a sliding window without causal attention or with
        ``"nystrom"``.
    """
    window = self.window if self.window is not None and self.window < k.shape[1] - 1 else None
    y = attend(
      q,
      k,
      v,
      laplacian=laplacian,
      mask=mask,
      is_causal=is_causal,
      implementation=self.implementation,
      dropout_rate=self.attention_dropout,
      dropout_rng=dropout_rng,
      mix=mix,
      xla_keep_probs=self.xla_keep_probs,
      nystrom=self.nystrom if self.implementation == "nystrom" else None,
      bias=bias,
      window=window,
    )
    if self.implementation == "nystrom" and self.nystrom.conv_kernel_size:
      y = y + nystrom_conv(self, self, v, mask)
    if self.is_mutable_collection("intermediates"):  # analysis only
      if window is not None:
        local = window_mask(np.arange(q.shape[1]), k.shape[1], window)[None, None]
        mask = local if mask is None else jnp.logical_and(mask, local)
      _, weights = reference_attention(q, k, v, mask=mask, is_causal=is_causal, bias=bias)
      self.sow("intermediates", "attention_weights", weights)
      self.sow("intermediates", "head_outputs", y)
    return y

  def _attend_cached(self, q, k, v, cache, start, mask, *, laplacian, mix, dropout_rng):
    """Writes the chunk's ``k, v`` into the KV ``cache`` at ``start`` and
    attends to everything cached so far (causally, within the sliding
    ``window`` if set, the chunk's own values for the Laplacian heads; XLA's
    kernel where splash was asked for)."""
    length, max_length = q.shape[1], cache["key"].value.shape[1]
    cache["key"].value = jax.lax.dynamic_update_slice(cache["key"].value, k, (0, start, 0, 0))
    cache["value"].value = jax.lax.dynamic_update_slice(cache["value"].value, v, (0, start, 0, 0))
    cache["index"].value = start + length
    visible = causal_mask(length, max_length, start)
    if self.window is not None:
      positions = start + np.arange(length)
      visible = jnp.logical_and(visible, window_mask(positions, max_length, self.window))
    visible = visible[None, None]
    return attend(
      q,
      cache["key"].value,
      cache["value"].value,
      laplacian=laplacian,
      mask=visible if mask is None else jnp.logical_and(mask, visible),
      implementation="xla" if self.implementation == "splash" else self.implementation,
      residual_value=v,
      dropout_rate=self.attention_dropout,
      dropout_rng=dropout_rng,
      mix=mix,
      xla_keep_probs=self.xla_keep_probs,
    )
