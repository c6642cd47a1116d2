"""XCiT (El-Nouby et al. 2021, arXiv 2106.09681), as timm's ``Xcit``.

A convolutional patch embedding (``log2(patch_size)`` 3 x 3 convolutions of
stride 2 and padding 1, each followed by a BatchNorm, a GELU between two; the
first is ``embedding``, the parameter ``laplax.load`` reads the channels
from), the Fourier position encoding (sin/cos features of the normalised row
and column, projected to the width: ``pos_embedding``), XCA blocks, then the
class token and the class-attention blocks, a final LayerNorm and a linear
head on the class token. Every block has LayerScales (``eta``).

* XCA block (timm's ``XCABlock``): ``x += gamma1 * XCA(norm1(x))``, ``x +=
  gamma3 * LPI(norm3(x))`` (the local patch interaction: a depthwise 3 x 3
  convolution, GELU, BatchNorm, a depthwise 3 x 3 convolution, on the token
  grid), ``x += gamma2 * MLP(norm2(x))``, each branch with drop-path.
* Class-attention block (timm's ``ClassAttentionBlock``, CaiT's): ``n =
  norm1(x)``; the class token gets ``gamma1 * CA(n)``, the patch tokens
  ``gamma1 * n`` (timm's concatenation); then the class token (every token
  with ``tokens_norm``) is normalised by ``norm2``, and the class token gets
  ``gamma2 * MLP`` of it while the patch tokens are added to themselves
  (timm's ``x_res + cat([cls, x[:, 1:]])``, kept for exactness).

**Cross-covariance attention** (:class:`XCA`, timm's ``XCA``): with ``q, k, v
= x W_Q, x W_K, x W_V`` split into heads of ``d`` channels, each of a head's
channels is a token whose features are its values at the ``N`` positions:
``q`` and ``k`` are L2-normalised over the ``N`` positions, ``P =
softmax(tau q^T k)`` (``[d, d]`` per head, softmax over the last axis, ``tau``
the learned per-head ``temperature``) and the output is ``P v^T`` back in
``[N, d]``. A Laplacian head outputs ``v^T - P v^T``: ``I - P`` over the
channel axis, each channel minus the ``P``-weighted mean of its head's
channels. :func:`laplax.attention.attend` computes it with ``[batch, d,
heads, N]`` operands (queries ``tau q^T``, keys ``k^T``, values ``v^T``,
``scale`` 1), always on the XLA kernel (or the reference one: the fused
kernels do not take features of ``N`` dimensions).

**Class attention** (:class:`ClassAttention`, timm's ``ClassAttn``): softmax
attention of the class token's query alone over every token (``scale
d^-1/2``); a Laplacian head outputs ``v_cls - P v``.

Both are composed of the attention parts of :mod:`laplax.attention` (as
:class:`laplax.attention.MultiHeadAttention` is), so both methods apply to every attention of the model: Laplacian heads (the last
``k`` heads of every block, or ``model.laplacian_mask`` per block) and
``spectral`` on ``W_Q, W_K, W_V`` (``query``, ``key``, ``value``: timm's
fused ``qkv`` rows in an XCA, its ``q``, ``k``, ``v`` in a class attention).

**BatchNorm.** timm's XCiT has BatchNorms in the patch embedding and in every
LPI. Here they are always in their inference form (PyTorch's ``eval()``):
``(x - mean) / sqrt(var + 1e-5) * scale + bias`` with the running statistics
``mean`` and ``var`` parameters whose gradient is stopped, so training never
changes them (they have no gradient, and as vectors no weight decay). A
converted timm model keeps timm's statistics (a frozen BatchNorm, as in
fine-tuning for detection); a model trained from scratch here keeps ``mean =
0, var = 1``, so its BatchNorms are learned per-channel affine maps, not
timm's training-mode BatchNorm (batch statistics). Batch statistics would
need a mutable collection the training loop does not carry.

Reference code: ``timm/models/xcit.py`` (``ConvPatchEmbed``,
``PositionalEncodingFourier``, ``LPI``, ``XCA``, ``XCABlock``,
``ClassAttentionBlock``) and ``timm/models/cait.py`` (``ClassAttn``);
:mod:`laplax.convert.timm_xcit` maps its weights.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import attention as attention_lib
from laplax import sharding, utils
from laplax.kernels import reference_attention
from laplax.models import spec as spec_lib
from laplax.models.layers import (
  MLP,
  DropPath,
  LayerScale,
  classifier_head,
  gelu_exact,
  norm_layer,
)
from laplax.models.registry import Family
from laplax.models.spec import (
  MLP_ACTIVATIONS,
  REMAT_POLICIES,
  SpecError,
  TransformerSpec,
  spec_field,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class XCiTSpec(TransformerSpec):
  """An XCiT (El-Nouby et al. 2021, arXiv 2106.09681; timm's ``Xcit``).

  A convolutional patch embedding (``log2(patch_size)`` 3 x 3 convolutions of
  stride 2, each followed by a BatchNorm, GELUs between them), the Fourier
  position encoding, ``depth - cls_attn_layers`` XCA blocks (cross-covariance
  attention over each head's channels, a local patch interaction, an MLP),
  then ``cls_attn_layers`` class-attention blocks (only the class token
  queries), a final LayerNorm and a linear head on the class token.
  ``depth`` counts every attention block, the class-attention ones
  included (as DaViT's counts its spatial and channel blocks): blocks
  ``0 .. depth - cls_attn_layers - 1`` are XCA blocks and the last
  ``cls_attn_layers`` class-attention blocks, and the Laplacian heads are one
  row per block (``num_laplacian_heads=k``: the last ``k`` heads of every
  one). timm's XCiT-M24 is ``depth=26, cls_attn_layers=2``.

  Attributes:
    patch_size: the patch embedding's total stride, a power of two (timm's
      ``ConvPatchEmbed`` has 16, four convolutions of widths ``width / 8,
      width / 4, width / 2, width``, and 8, three; 4 and 2 continue the
      scheme with two and one).
    cls_attn_layers: the class-attention blocks (at least 1).
    tokens_norm: the class-attention blocks normalise every token before
      their MLP (timm's ``tokens_norm``), not only the class token.
    use_pos_embed: add the Fourier position encoding (timm's ``use_pos_embed``).
    drop_path: the XCA blocks' stochastic-depth rate, the same in every one
      (timm's XCiT is not linear in depth; its class-attention blocks have none).
    layerscale_init: ``eta``, the initial value of the blocks' LayerScales
      (``gamma1``, ``gamma3``, ``gamma2``; always present in an XCiT).
  """

  patch_size: int = spec_field(16, "int", min=2)
  cls_attn_layers: int = spec_field(2, "int", min=1)
  tokens_norm: bool = spec_field(False, "bool")
  use_pos_embed: bool = spec_field(True, "bool")
  drop_path: float = spec_field(0.0, "float", max=0.99)
  # timm's XCiT: LayerScale (eta) in every block, the exact GELU, LayerNorms
  # of eps 1e-6, Linear weights initialised normal 0.02 (truncated there).
  layerscale_init: float = spec_field(1.0, "float")
  mlp_activation: str = spec_field(
    "gelu_exact",
    "choice",
    choices=MLP_ACTIVATIONS,
  )
  kernel_init: str = "normal"

  def __post_init__(self):
    super().__post_init__()
    p, implementation = self.patch_size, self.attention.implementation
    if p & (p - 1) or self.width % (p // 2):
      raise SpecError(
        f"model.patch_size={p} must be a power of two (timm: 8, 16) whose half divides model.width"
      )
    if self.depth <= self.cls_attn_layers:
      raise SpecError(
        f"model.depth={self.depth} counts the XCA and the class-attention blocks: more than "
        f"model.cls_attn_layers={self.cls_attn_layers}"
      )
    if self.scan_layers:
      raise SpecError("model.scan_layers=True: XCiT's blocks differ; use model.scan_layers=False")
    if self.attention.qk_norm:
      raise SpecError("model.qk_norm=True: XCiT's attentions have none; use model.qk_norm=False")
    if implementation in ("cudnn", "splash", "nystrom"):
      raise SpecError(
        f"model.implementation={implementation!r}: XCiT's attentions run XLA; use 'xla' or None"
      )

  @property
  def xca_depth(self) -> int:
    """The XCA blocks, ``depth - cls_attn_layers``."""
    return self.depth - self.cls_attn_layers

  def patch_widths(self) -> tuple[int, ...]:
    """Output channels of the patch embedding's convolutions: ``width / 2^j``
    for ``j = log2(patch_size) - 1 .. 0``."""
    n = max(self.patch_size.bit_length() - 1, 1)
    return tuple(self.width // 2**j for j in range(n - 1, -1, -1))

  def drop_path_rates(self) -> tuple[float, ...]:
    """``drop_path`` for every XCA block, 0 for the class-attention blocks (timm)."""
    return (self.drop_path,) * self.xca_depth + (0.0,) * self.cls_attn_layers


#: PyTorch ``BatchNorm2d``'s epsilon (timm's XCiT keeps the default).
BN_EPS = 1e-5
#: ``torch.nn.functional.normalize``'s epsilon: ``x / max(||x||, eps)``.
NORMALIZE_EPS = 1e-12
#: timm's ``PositionalEncodingFourier``: features per axis and the base.
FOURIER_DIM = 32
FOURIER_TEMPERATURE = 10_000.0


def fourier_features(
  height: int, width: int, dim: int = FOURIER_DIM, temperature: float = FOURIER_TEMPERATURE
) -> np.ndarray:
  """The Fourier features of timm's ``PositionalEncodingFourier`` before its
  projection, float32 ``[height * width, 2 * dim]`` (row-major positions).

  Row ``i`` (1-based) is ``y = 2 pi i / (height + 1e-6)`` and column ``j`` is
  ``x = 2 pi j / (width + 1e-6)``; with ``w_m = temperature^(2 floor(m / 2) /
  dim)`` the features are ``sin(y / w_m)`` for even ``m`` and ``cos(y /
  w_m)`` for odd ``m`` (``m = 0 .. dim - 1``), then the same of ``x``.
  """
  f32 = np.float32
  eps, scale = f32(1e-6), f32(2 * math.pi)
  y = np.repeat(np.arange(1, height + 1, dtype=f32)[:, None], width, 1)
  x = np.repeat(np.arange(1, width + 1, dtype=f32)[None, :], height, 0)
  y = y / (y[-1:, :] + eps) * scale
  x = x / (x[:, -1:] + eps) * scale
  m = np.arange(dim, dtype=f32)
  w = f32(temperature) ** (f32(2) * np.floor(m / f32(2)) / f32(dim))

  def features(a):
    a = a[..., None] / w
    return np.stack([np.sin(a[..., 0::2]), np.cos(a[..., 1::2])], -1).reshape(height, width, dim)

  out = np.concatenate([features(y), features(x)], -1)
  return out.reshape(height * width, 2 * dim).astype(f32)


def l2_normalize(y: jax.Array, axis: int) -> jax.Array:
  """``y / max(||y||, 1e-12)`` along ``axis`` (``F.normalize``), in float32;
  the gradient is finite where the norm is 0."""
  y = y.astype(jnp.float32)
  squares = jnp.sum(y * y, axis=axis, keepdims=True)
  return y * jax.lax.rsqrt(jnp.maximum(squares, NORMALIZE_EPS**2))


class BatchNorm(nn.Module):
  """A BatchNorm in its inference form over the last axis (module docstring):
  ``(x - mean) / sqrt(var + epsilon) * scale + bias``, computed in float32.

  Parameters ``scale``, ``bias`` (init 1, 0), ``mean``, ``var`` (init 0, 1;
  the running statistics, their gradient stopped). ``x [..., C]`` -> same
  shape and dtype.
  """

  epsilon: float = BN_EPS

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalises ``x`` with the stored statistics."""
    c = x.shape[-1]

    def param(name, value):
      init = sharding.logical_init(nn.initializers.constant(value), ("embed",))
      return self.param(name, init, (c,), jnp.float32)

    scale, bias = param("scale", 1.0), param("bias", 0.0)
    mean = jax.lax.stop_gradient(param("mean", 0.0))
    var = jax.lax.stop_gradient(param("var", 1.0))
    y = (x.astype(jnp.float32) - mean) * (jax.lax.rsqrt(var + self.epsilon) * scale) + bias
    return y.astype(x.dtype)


def _refuse(spec: spec_lib.AttentionSpec, is_causal: bool, what: str) -> None:
  """The settings XCiT's attentions do not take (ValueError naming them; the
  model spec refuses its own, :class:`XCiTSpec`)."""
  if (
    spec.qk_norm or spec.rope or is_causal or spec.implementation in ("nystrom", "cudnn", "splash")
  ):
    raise ValueError(
      f"XCiT's {what} takes no qk-norm, rotary, causal mask or "
      f"cudnn/splash/Nystrom kernel; turn them off"
    )


def _kernel(spec: spec_lib.AttentionSpec) -> str:
  """The kernel of XCiT's attentions: the reference one if asked for, else XLA."""
  return "reference" if spec.implementation == "reference" else "xla"


class XCA(nn.Module):
  """Cross-covariance attention (timm's ``XCA``) with Laplacian heads.

  ``x [batch, N, model_dim] -> [batch, N, model_dim]``, composed of the
  attention parts of :mod:`laplax.attention` on the spec's attention
  settings: parameters ``query``, ``key``, ``value`` (with their spectral
  conditioning, :func:`~laplax.attention.project_qkv`) and ``out``
  (:func:`~laplax.attention.out_projection`), plus ``temperature
  [num_heads]`` (init 1; timm's ``[heads, 1, 1]``). Per head (module
  docstring) ``P = softmax(tau q^T k)`` over the ``d`` channels, ``q`` and
  ``k`` L2-normalised over the ``N`` tokens; the output is ``P v^T``, or
  ``v^T - P v^T`` on a Laplacian head (:func:`~laplax.attention.attend`).
  ``laplacian_mix="learned"`` mixes as there. For analysis (a mutable
  ``"intermediates"``) ``P`` (float32 ``[batch, heads, d, d]``) is sown as
  ``"attention_weights"`` and the heads' outputs (``[batch, N, heads, d]``)
  as ``"head_outputs"``.

  Attributes:
    spec: the model's :class:`XCiTSpec` (attention settings, dropout,
      biases, compute dtype, initialisers).
    laplacian_mask: this block's Laplacian heads (``num_heads`` booleans;
      ``None``: none).
  """

  spec: XCiTSpec
  laplacian_mask: tuple | None = None

  @nn.compact
  def __call__(  # noqa: D417
    self,
    x: jax.Array,
    *,
    deterministic: bool = True,
    is_causal: bool = False,
    laplacian: jax.Array | None = None,
    **unused,
  ):
    """Applies XCA (``x`` float ``[batch, N, model_dim]``; ``laplacian``, bool
    ``[num_heads]``, overrides the attributes' Laplacian heads).

    Raises:
      ValueError: qk-norm, rotary, a causal mask or a fused/Nystrom kernel.
    """
    model, spec = self.spec, self.spec.attention
    _refuse(spec, is_causal, "cross-covariance attention")
    attention_lib.check_settings(spec, x.shape[-1])
    b, n, c = x.shape
    d = c // spec.num_heads
    if laplacian is None:
      laplacian = attention_lib.laplacian_heads(spec.num_heads, 0, self.laplacian_mask)
    dtype = model.compute_dtype() or x.dtype
    kernel_init, out_init = model.inits()
    q, k, v = attention_lib.project_qkv(  # [b, n, heads, d]
      spec,
      x,
      head_dim=d,
      dtype=dtype,
      use_bias=model.use_bias,
      kernel_init=kernel_init,
      fuse=not self.is_mutable_collection("intermediates"),
    )
    temperature = self.param(
      "temperature",
      sharding.logical_init(nn.initializers.ones, ("heads",)),
      (spec.num_heads,),
      jnp.float32,
    )
    q = l2_normalize(q, axis=1) * temperature[:, None]
    k = l2_normalize(k, axis=1)
    channels = lambda y: y.transpose(0, 3, 2, 1)  # [b, d, heads, n]: channels as tokens
    q, k, v = (channels(t).astype(dtype) for t in (q, k, v))
    dropout_rng = attention_lib.attention_dropout_rng(self, spec, deterministic)
    y = attention_lib.attend(
      q,
      k,
      v,
      laplacian=laplacian,
      implementation=_kernel(spec),
      scale=1.0,
      dropout_rate=spec.attention_dropout,
      dropout_rng=dropout_rng,
      mix=attention_lib.laplacian_mix(self, spec, laplacian),
      xla_keep_probs=spec.xla_keep_probs,
    )
    y = channels(y)  # [b, n, heads, d]
    if self.is_mutable_collection("intermediates"):  # analysis only
      _, weights = reference_attention(q, k, v, scale=1.0)
      self.sow("intermediates", "attention_weights", weights)
      self.sow("intermediates", "head_outputs", y)
    y = attention_lib.out_projection(
      y.reshape(b, n, c), c, dtype=model.compute_dtype(), use_bias=model.use_bias, out_init=out_init
    )
    return nn.Dropout(model.dropout)(y, deterministic=deterministic)


class ClassAttention(nn.Module):
  """Class attention (timm's ``ClassAttn``, CaiT's) with Laplacian heads.

  ``x [batch, 1 + N, model_dim]`` (the class token first) -> the class
  token's update ``[batch, 1, model_dim]``: its query alone attends to every
  token, ``P = softmax(d^-1/2 q_cls k^T)``, output ``P v``, or ``v_cls - P v``
  on a Laplacian head (:func:`~laplax.attention.attend`). Parameters
  ``query``, ``key``, ``value``, ``out`` (the query projects the class token
  only; :class:`~laplax.attention.ProjectionDense` with the spec's spectral
  conditioning); attributes and refusals as :class:`XCA`'s.
  For analysis ``P`` is sown with the class token's key moved last
  (``[batch, heads, 1, 1 + N]``: the convention of
  :func:`laplax.analysis.conditioning.attention_self_weight` for fewer queries
  than keys) and the heads' outputs as ``[batch, 1 + N, heads, d]``, zero
  but for the class token.
  """

  spec: XCiTSpec
  laplacian_mask: tuple | None = None

  @nn.compact
  def __call__(  # noqa: D417
    self,
    x: jax.Array,
    *,
    deterministic: bool = True,
    is_causal: bool = False,
    laplacian: jax.Array | None = None,
    **unused,
  ):
    """Applies class attention (``x`` float ``[batch, 1 + N, model_dim]``).

    Raises:
      ValueError: as :class:`XCA`.
    """
    model, spec = self.spec, self.spec.attention
    _refuse(spec, is_causal, "class attention")
    attention_lib.check_settings(spec, x.shape[-1])
    b, n, c = x.shape
    d = c // spec.num_heads
    if laplacian is None:
      laplacian = attention_lib.laplacian_heads(spec.num_heads, 0, self.laplacian_mask)
    dtype = model.compute_dtype() or x.dtype
    kernel_init, out_init = model.inits()

    def project(name, target, y):
      lam = spec.spectral_lam if target in spec.spectral_targets else None
      y = attention_lib.ProjectionDense(
        c,
        num_heads=spec.num_heads,
        use_bias=model.use_bias,
        spectral_lam=lam,
        spectral_mode=spec.spectral_mode,
        spectral_target=target,
        dtype=model.compute_dtype(),
        kernel_init=kernel_init,
        name=name,
      )(y)
      return y.reshape(b, y.shape[1], spec.num_heads, d).astype(dtype)

    q = project("query", "q", x[:, :1])
    k = project("key", "k", x)
    v = project("value", "v", x)
    dropout_rng = attention_lib.attention_dropout_rng(self, spec, deterministic)
    y = attention_lib.attend(
      q,
      k,
      v,
      laplacian=laplacian,
      implementation=_kernel(spec),
      dropout_rate=spec.attention_dropout,
      dropout_rng=dropout_rng,
      residual_value=v[:, :1],
      mix=attention_lib.laplacian_mix(self, spec, laplacian),
      xla_keep_probs=spec.xla_keep_probs,
    )  # [b, 1, heads, d]
    if self.is_mutable_collection("intermediates"):  # analysis only
      _, weights = reference_attention(q, k, v)
      self.sow("intermediates", "attention_weights", jnp.roll(weights, -1, axis=-1))
      rest = jnp.zeros((b, n - 1) + y.shape[2:], y.dtype)
      self.sow("intermediates", "head_outputs", jnp.concatenate([y, rest], 1))
    y = attention_lib.out_projection(
      y.reshape(b, 1, c), c, dtype=model.compute_dtype(), use_bias=model.use_bias, out_init=out_init
    )
    return nn.Dropout(model.dropout)(y, deterministic=deterministic)


def block_attention(spec: XCiTSpec, layer: int) -> nn.Module:
  """Block ``layer``'s attention module (:class:`XCA` or :class:`ClassAttention`)
  with its Laplacian heads."""
  module = XCA if layer < spec.xca_depth else ClassAttention
  return module(spec, spec.laplacian[layer])


def _conv(features, stride, dtype, name, *, depthwise=False, use_bias=True):
  """A 3 x 3 convolution with padding 1 (depthwise: one filter per channel)."""
  return nn.Conv(
    features,
    (3, 3),
    strides=stride,
    padding=((1, 1), (1, 1)),
    feature_group_count=features if depthwise else 1,
    use_bias=use_bias,
    dtype=dtype,
    name=name,
    kernel_init=sharding.logical_init(nn.initializers.lecun_normal(), (None, None, None, "embed")),
    bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
  )


class LPI(nn.Module):
  """Local patch interaction (timm's ``LPI``): depthwise 3 x 3 convolution
  (``conv1``), exact GELU, :class:`BatchNorm` (``bn``), depthwise 3 x 3
  convolution (``conv2``); ``x [batch, H, W, C]`` -> same shape."""

  dtype: Any = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Mixes each channel over its 3 x 3 neighbourhood, twice."""
    c = x.shape[-1]
    x = _conv(c, 1, self.dtype, "conv1", depthwise=True)(x)
    x = BatchNorm(name="bn")(gelu_exact(x))
    return _conv(c, 1, self.dtype, "conv2", depthwise=True)(x)


def _mlp(spec: XCiTSpec) -> MLP:
  kernel_init, out_init = spec.inits()
  return MLP(
    spec.mlp_dim,
    activation=spec.mlp_activation,
    dropout=spec.dropout,
    use_bias=spec.use_bias,
    dtype=spec.compute_dtype(),
    kernel_init=kernel_init,
    out_init=out_init,
    name="mlp",
  )


class XCABlock(nn.Module):
  """An XCA block (timm's ``XCABlock``).

  ``x [batch, N, dim] -> (x, out)``: ``x += gamma1 XCA(norm1(x))``, ``x +=
  gamma3 LPI(norm3(x))`` on the ``grid``, ``x += gamma2 MLP(norm2(x))``,
  each branch with drop-path; ``out`` as :class:`laplax.models.layers.Block`'s
  (``"input"``, ``"sa"``, ``"+sa"``, ``"mlp"``, ``"+mlp"``) plus ``"lpi"``
  and ``"+lpi"``.

  Attributes:
    spec: the model's :class:`XCiTSpec`.
    grid: ``(H, W)`` of the ``N = H W`` tokens.
    laplacian_mask: this block's Laplacian heads (``num_heads`` booleans).
    drop_path: this block's stochastic-depth rate.
  """

  spec: XCiTSpec
  grid: tuple
  laplacian_mask: tuple
  drop_path: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    """Applies the block."""
    spec = self.spec
    b, n, c = x.shape
    out = {"input": x}
    branches = (("sa", "norm1", "ls1"), ("lpi", "norm3", "ls3"), ("mlp", "norm2", "ls2"))
    for name, norm, scale in branches:
      y = norm_layer(spec, norm)(x).astype(x.dtype)
      if name == "sa":
        y = XCA(spec, self.laplacian_mask, name="attention")(y, deterministic=deterministic)
      elif name == "lpi":
        y = LPI(spec.compute_dtype(), name="lpi")(y.reshape(b, *self.grid, c)).reshape(b, n, c)
      else:
        y = _mlp(spec)(y, deterministic)
      y = LayerScale(spec.layerscale_init, name=scale)(y)
      out[name] = y
      x = x + DropPath(self.drop_path)(y, deterministic)
      out["+" + name] = x
    return x, out


class ClassAttentionBlock(nn.Module):
  """A class-attention block (timm's ``ClassAttentionBlock``; module docstring).

  ``x [batch, 1 + N, dim]`` (class token first) ``-> (x, out)``, ``out`` as
  :class:`XCABlock`'s without the LPI entries (``"sa"`` is the whole
  ``gamma1`` branch: the class token's attention, the patch tokens' ``norm1``).
  No drop-path (timm gives these blocks none).

  Attributes:
    spec: the model's :class:`XCiTSpec`.
    laplacian_mask: this block's Laplacian heads (``num_heads`` booleans).
  """

  spec: XCiTSpec
  laplacian_mask: tuple

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    """Applies the block."""
    spec = self.spec
    out = {"input": x}
    y = norm_layer(spec, "norm1")(x).astype(x.dtype)
    cls = ClassAttention(spec, self.laplacian_mask, name="attention")(
      y, deterministic=deterministic
    )
    y = LayerScale(spec.layerscale_init, name="ls1")(
      jnp.concatenate([cls.astype(x.dtype), y[:, 1:]], 1)
    )
    out["sa"] = y
    x = x + y
    out["+sa"] = x
    norm2 = norm_layer(spec, "norm2")
    if spec.tokens_norm:
      x = norm2(x).astype(x.dtype)
    else:
      x = jnp.concatenate([norm2(x[:, :1]).astype(x.dtype), x[:, 1:]], 1)
    y = LayerScale(spec.layerscale_init, name="ls2")(_mlp(spec)(x[:, :1], deterministic))
    y = jnp.concatenate([y.astype(x.dtype), x[:, 1:]], 1)
    out["mlp"] = y
    x = x + y
    out["+mlp"] = x
    return x, out


class XCiT(nn.Module):
  """XCiT classifier with Laplacian heads and spectral conditioning.

  ``images`` float ``[batch, height, width, channels]`` (any size: each
  stride-2 convolution gives ``ceil(side / 2)``) -> ``(logits [batch,
  num_classes] float32, out)``, ``out`` with ``out["block{i}"]`` (see
  :class:`XCABlock` and :class:`ClassAttentionBlock`), ``out["encoded"]``
  (the final-norm tokens ``[batch, 1 + N, width]``, class token first) and
  ``out["pre_logits"]`` (its class token).

  Attributes:
    spec: the :class:`XCiTSpec`.
    num_classes: classifier outputs (0: the class token's features are returned).
    head_init_zero: zero-initialised classifier; else Xavier uniform.
  """

  spec: XCiTSpec
  num_classes: int = 0
  head_init_zero: bool = True

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    """Classifies ``images``; ``train`` enables dropout and drop-path."""
    spec = self.spec
    out = {}
    dtype = spec.compute_dtype()
    x = images.astype(dtype or images.dtype)
    for i, width in enumerate(spec.patch_widths()):
      if i:
        x = gelu_exact(x)
      name = f"embedding{i or ''}"
      x = _conv(width, 2, dtype, name, use_bias=False)(x)
      x = BatchNorm(name=f"{name}_bn")(x)
    b, h, w, c = x.shape
    x = x.reshape(b, h * w, c)
    if spec.use_pos_embed:
      pos = nn.Dense(
        c,
        dtype=dtype,
        name="pos_embedding",
        kernel_init=sharding.logical_init(nn.initializers.normal(0.02), (None, "embed")),
        bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
      )(jnp.asarray(fourier_features(h, w)))
      x = x + pos[None].astype(x.dtype)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    rates = spec.drop_path_rates()
    xca_cls, ca_cls = XCABlock, ClassAttentionBlock
    if spec.remat != "none":
      policy = REMAT_POLICIES[spec.remat]
      xca_cls = nn.remat(XCABlock, policy=policy, static_argnums=(2,))
      ca_cls = nn.remat(ClassAttentionBlock, policy=policy, static_argnums=(2,))
    for i in range(spec.xca_depth):
      x, out[f"block{i}"] = xca_cls(
        spec,
        grid=(h, w),
        laplacian_mask=spec.laplacian[i],
        drop_path=rates[i],
        name=f"block{i}",
      )(x, not train)
    cls = self.param(
      "cls",
      sharding.logical_init(nn.initializers.normal(0.02), (None, None, "embed")),
      (1, 1, c),
      jnp.float32,
    )
    x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (b, 1, 1)), x], 1)
    for i in range(spec.xca_depth, spec.depth):
      x, out[f"block{i}"] = ca_cls(spec, laplacian_mask=spec.laplacian[i], name=f"block{i}")(
        x, not train
      )
    x = norm_layer(spec, "encoder_norm")(x)
    out["encoded"] = x
    x = x[:, 0]
    out["pre_logits"] = x
    x = classifier_head(x, self.num_classes, self.head_init_zero)
    out["logits"] = x
    return x, out


def capture_attention(spec: XCiTSpec, layer: int) -> tuple[nn.Module, str]:
  """Layer ``layer``'s attention for the analysis: :func:`block_attention`
  with the reference kernel in float32, and why Theorem 3.4's per-head
  section does not apply (:attr:`laplax.models.registry.Family.capture`)."""
  reference = dataclasses.replace(spec.attention, implementation="reference")
  module = block_attention(dataclasses.replace(spec, attention=reference, dtype="float32"), layer)
  reason = (
    "XCiT's attention is not softmax attention over tokens (XCA attends over each "
    "head's channels, class attention has one query); Theorem 3.4's per-head "
    "bound is not measured"
  )
  return module, reason


def attention_lengths(config, image_side=None, crop_sides=()) -> tuple[int, ...]:
  """None: its attentions are over channels and of one class query, on XLA
  always (the spec refuses the fused kernels)
  (:attr:`laplax.models.registry.Family.attention_lengths`)."""
  del config, image_side, crop_sides
  return ()


def analytic_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`laplax.plan.flops.analytic_flops` of an XCiT: the convolutional
  patch embedding on its output grids (``ceil(H / 2^(k+1))^2`` for the
  ``k``-th convolution), the XCA blocks' kernels on the ``N`` patch tokens
  with ``12 d width`` per token for the attention over each head's ``d``
  channels, the class-attention blocks' query, output and MLP on the class
  token alone and their keys and values on the ``N + 1`` tokens (``12 (N +
  1) width`` for the one query), the head on one token (16 for 12 with
  remat). The position encoding's projection, computed once per step, is
  left out."""
  spec = spec_lib.from_config(config.model)
  size = task.image_shape[0]
  grids = []
  for _ in spec.patch_widths():
    size = -(-size // 2)
    grids.append(size)
  n = grids[-1] ** 2
  xca = spec.depth - spec.cls_attn_layers
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for top, name, size in utils.matmul_kernels(params):
    if top in ("pos_embedding", "cls"):
      continue
    count += size
    if top.startswith("embedding"):
      tokens = grids[int(top[len("embedding") :] or 0)] ** 2
    elif top == "head":
      tokens = 1
    elif int(top[len("block") :]) < xca:
      tokens = n
    else:
      tokens = n + 1 if "/key/" in name or "/value/" in name else 1
    per_image += w * size * tokens
  d = spec.width // spec.num_heads
  per_image += a * xca * d * spec.width * n + a * spec.cls_attn_layers * (n + 1) * spec.width
  return count, float(per_image * config.batch_size)


#: The XCiT family: ``config.model.name="xcit"``, trained by the
#: classification task; the analysis captures its own attention modules.
FAMILY = Family(
  name="xcit",
  spec=XCiTSpec,
  model=XCiT,
  task="classification",
  attention_lengths=attention_lengths,
  flops=analytic_flops,
  capture=capture_attention,
)
