"""DaViT (Ding et al. 2022, arXiv 2204.03645), as timm's ``DaVit``.

A stem (a 7 x 7 convolution of stride 4 on the image padded to a multiple of
4, and a LayerNorm), stages of dual blocks, each a spatial block (attention
within non-overlapping ``window_size x window_size`` windows, the grid
padded with zeros after the norm, no position bias) and a channel block
(channel group attention), each block preceded and followed by a
convolutional position encoding ``x + dwconv3x3(x)``; stages after the first
start with a LayerNorm and a 2 x 2 convolution of stride 2. The last stage's
tokens are averaged, normalised, and a linear head classifies (timm's
``NormMlpClassifierHead``). The stem's parameters are ``embedding`` and
``embedding_norm`` (the ViT's and Swin's names, which ``laplax.load`` reads).

Channel group attention (timm's ``ChannelAttention``): the channels are
split into ``num_heads`` groups of ``d = width / heads``; in each group the
``d`` channels are the tokens and the ``N = H W`` positions their features.
With ``q, k, v = x W_Q, x W_K, x W_V`` (``[N, d]`` per group), timm computes
``P = softmax(scale k^T v)`` (``[d, d]``, ``scale = d^-1/2``, softmax over
the last axis) and outputs ``(P q^T)^T``: in attention terms the queries are
``k^T``, the keys ``v^T`` and the values ``q^T``. A Laplacian group outputs
``(q^T - P q^T)^T``, i.e. ``q (I - P)^T``: ``I - P`` over the channel axis,
each channel minus the ``P``-weighted mean of its group's channels.
:func:`laplax.attention.attend` computes it with ``[batch, d, heads, N]``
operands, always on the XLA kernel (or the reference one; the fused kernels
do not take features of ``N`` dimensions).

The window attention is a :class:`laplax.attention.MultiHeadAttention`, the
channel one (:class:`ChannelAttention`) is composed of the same attention
parts (:mod:`laplax.attention`), so both of laplax's methods apply to all
of them: Laplacian heads (``num_laplacian_heads``, the
last ``k`` heads or groups of every block) and ``spectral`` on ``W_Q, W_K,
W_V`` (the parameters named as timm's fused ``qkv`` rows, whatever role the
channel attention gives them).

Reference code: ``timm/models/davit.py`` (``Stem``, ``Downsample``,
``ConvPosEnc``, ``SpatialBlock``, ``ChannelBlock``, ``ChannelAttention``,
``WindowAttention``); :mod:`laplax.convert.timm_davit` maps its weights.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import attention as attention_lib
from laplax import sharding, utils
from laplax.models import spec as spec_lib
from laplax.models.layers import attention_module, norm_layer
from laplax.models.registry import Family
from laplax.models.spec import MLP_ACTIVATIONS, spec_field
from laplax.models.staged import (
  StagedClassifier,
  StagedSpec,
  mlp_branch,
  residual,
  window_partition,
  window_reverse,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaViTSpec(StagedSpec):
  """A DaViT (Ding et al. 2022, arXiv 2204.03645; timm's ``DaVit``): a
  :class:`~laplax.models.staged.StagedSpec` of dual blocks.

  A dual block is a spatial block (window attention) then a channel block
  (channel group attention), so ``depth`` counts the attention blocks, ``2 *
  sum(stage_depths)``: block ``2 j`` is the spatial and ``2 j + 1`` the
  channel block of dual block ``j``, and the heads of a channel block are its
  channel groups. The stem is timm's (a 7 x 7 convolution of stride 4 and a
  LayerNorm); stages after the first start with a LayerNorm and a 2 x 2
  convolution of stride 2.

  Attributes:
    patch_size: the stem's stride in pixels (timm's ``Stem`` supports 4 only).
    stage_depths: dual blocks per stage.
    window_size: side of the spatial attention windows in tokens (a grid
      that is not a multiple is padded with zeros, as timm).
    drop_path: the deepest dual block's stochastic-depth rate (linear over
      dual blocks, the two blocks of one sharing it: timm's ``stagewise``).
  """

  BLOCKS = 2
  BLOCK_NOUN = "DaViT attention blocks"
  POSSESSIVE = "a DaViT's"

  patch_size: int = spec_field(4, "int", min=4, max=4)
  stage_depths: tuple = spec_field((1, 1), "ints")
  drop_path: float = spec_field(0.0, "float", max=0.99)
  # timm's DaViT: no LayerScale, the exact GELU, LayerNorms of eps 1e-5.
  mlp_activation: str = spec_field(
    "gelu_exact",
    "choice",
    choices=MLP_ACTIVATIONS,
  )


class ChannelAttention(nn.Module):
  """Channel group attention (timm's ``ChannelAttention``) with Laplacian groups.

  ``x [batch, length, model_dim] -> [batch, length, model_dim]``, composed
  of the attention parts of :mod:`laplax.attention` on the spec's
  attention settings: the parameters (``query``, ``key``, ``value``,
  ``out``) and spectral conditioning of :func:`~laplax.attention.project_qkv`
  and :func:`~laplax.attention.out_projection`; the attention runs over each
  group's ``d = model_dim / num_heads`` channels (module docstring): ``P =
  softmax(d^-1/2 k^T v)``, output ``(P q^T)^T``, or ``(q^T - P q^T)^T`` on a
  Laplacian group, by :func:`~laplax.attention.attend`;
  ``laplacian_mix="learned"`` mixes as there
  (:func:`~laplax.attention.laplacian_mix`).

  Attributes:
    spec: the model's :class:`DaViTSpec` (attention settings, dropout,
      biases, compute dtype, initialisers).
    num_heads: this stage's channel groups (``spec.attention.num_heads``
      replaced).
    laplacian_mask: this block's Laplacian groups (``num_heads`` booleans;
      ``None``: none).
  """

  spec: DaViTSpec
  num_heads: int
  laplacian_mask: tuple | None = None

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool = True):
    """Applies channel attention (``x`` float ``[batch, length, model_dim]``).

    Raises:
      ValueError: qk-norm, rotary or the Nystrom kernel in the spec (the
        spatial attentions take them, this one does not).
    """
    model = self.spec
    spec = dataclasses.replace(model.attention, num_heads=self.num_heads)
    if spec.qk_norm or spec.rope or spec.implementation == "nystrom":
      raise ValueError(
        "DaViT's channel attention takes no qk-norm, rotary or Nystrom kernel; turn them off "
        "(model.qk_norm=False, model.implementation='xla' or None)"
      )
    attention_lib.check_settings(spec, x.shape[-1])
    b, n, c = x.shape
    d = c // self.num_heads
    laplacian = attention_lib.laplacian_heads(self.num_heads, 0, self.laplacian_mask)
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
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    channels = lambda y: y.transpose(0, 3, 2, 1)  # [b, d, heads, n]: channels as tokens
    mix = attention_lib.laplacian_mix(self, spec, laplacian)
    y = attention_lib.attend(
      channels(k),
      channels(v),
      channels(q),
      laplacian=laplacian,
      implementation="reference" if spec.implementation == "reference" else "xla",
      scale=d**-0.5,
      dropout_rate=spec.attention_dropout,
      dropout_rng=attention_lib.attention_dropout_rng(self, spec, deterministic),
      mix=mix,
      xla_keep_probs=spec.xla_keep_probs,
    )
    y = channels(y).reshape(b, n, c)
    y = attention_lib.out_projection(
      y, c, dtype=model.compute_dtype(), use_bias=model.use_bias, out_init=out_init
    )
    return nn.Dropout(model.dropout)(y, deterministic=deterministic)


class ConvPosEnc(nn.Module):
  """``x + dwconv(x)``: a depthwise 3 x 3 convolution with bias, zero-padded
  (timm's ``ConvPosEnc``, ``act=False``); ``x [batch, H, W, C]``."""

  dtype: object = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Encodes ``x``."""
    c = x.shape[-1]
    y = nn.Conv(
      c,
      (3, 3),
      padding=((1, 1), (1, 1)),
      feature_group_count=c,
      dtype=self.dtype,
      name="proj",
      kernel_init=sharding.logical_init(
        nn.initializers.lecun_normal(), (None, None, None, "embed")
      ),
      bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
    )(x)
    return x + y.astype(x.dtype)


class DaViTBlock(nn.Module):
  """A spatial (``kind="spatial"``) or channel block of DaViT.

  ``x [batch, H, W, dim] -> (x, out)``: ``x = cpe1(x)``, ``x = x +
  attn(norm1(x))`` (window attention over ``window``-sized windows of the
  zero-padded grid, or channel attention), ``x = cpe2(x)``, ``x = x +
  mlp(norm2(x))``; ``out`` as :class:`laplax.models.layers.Block`'s
  (``"input"``, ``"sa"``, ``"+sa"``, ``"mlp"``, ``"+mlp"``, tokens
  flattened to ``[batch, H * W, dim]``; ``"input"`` after ``cpe1``).

  Attributes:
    spec: the model's :class:`DaViTSpec`.
    kind: ``"spatial"`` or ``"channel"``.
    num_heads: this stage's heads (channel groups).
    mlp_dim: this stage's MLP size.
    laplacian_mask: this block's Laplacian heads (``num_heads`` booleans).
    drop_path: this block's stochastic-depth rate.
  """

  spec: DaViTSpec
  kind: str
  num_heads: int
  mlp_dim: int
  laplacian_mask: tuple
  drop_path: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    """Applies the block."""
    spec = self.spec
    dtype = spec.compute_dtype()
    x = ConvPosEnc(dtype, name="cpe1")(x)
    b, h, w, c = x.shape
    out = {"input": x.reshape(b, h * w, c)}
    y = norm_layer(spec, "norm1")(x).astype(x.dtype)
    if self.kind == "spatial":
      ws = spec.window_size
      pad_h, pad_w = (-h) % ws, (-w) % ws
      y = jnp.pad(y, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
      windows = window_partition(y, (ws, ws))
      y = attention_module(spec, self.laplacian_mask, num_heads=self.num_heads, name="attention")(
        windows, deterministic=deterministic
      )
      y = window_reverse(y, (ws, ws), h + pad_h, w + pad_w)[:, :h, :w]
    else:
      y = ChannelAttention(spec, self.num_heads, self.laplacian_mask, name="attention")(
        y.reshape(b, h * w, c), deterministic=deterministic
      )
      y = y.reshape(b, h, w, c)
    kw = dict(drop_path=self.drop_path, deterministic=deterministic, out=out)
    x = residual(spec, x, y, scale="ls1", key="sa", **kw)
    x = ConvPosEnc(dtype, name="cpe2")(x)
    y = mlp_branch(spec, x, self.mlp_dim, deterministic)
    x = residual(spec, x, y, scale="ls2", key="mlp", **kw)
    return x, out


def _conv(features, kernel, stride, padding, dtype, name):
  return nn.Conv(
    features,
    (kernel, kernel),
    strides=stride,
    padding=padding,
    dtype=dtype,
    name=name,
    kernel_init=sharding.logical_init(nn.initializers.lecun_normal(), (None, None, None, "embed")),
    bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
  )


class DaViT(StagedClassifier):
  """DaViT classifier with Laplacian heads and spectral conditioning.

  ``images`` float ``[batch, height, width, channels]`` (any size: the stem
  and the downsamplings pad to their strides) -> ``(logits [batch,
  num_classes] float32, out)`` (:class:`~laplax.models.staged.StagedClassifier`):
  ``out["block{i}"]`` as :class:`DaViTBlock`'s, ``out["encoded"]`` the last
  stage's tokens and ``out["pre_logits"]`` their mean, normalised (timm's
  ``NormMlpClassifierHead``).

  Attributes:
    spec: the :class:`DaViTSpec`.
    num_classes: classifier outputs (0: the pooled features are returned).
    head_init_zero: zero-initialised classifier; else Xavier uniform.
  """

  spec: DaViTSpec

  def block_class(self) -> type:
    """:class:`DaViTBlock`."""
    return DaViTBlock

  def stem(self, images: jax.Array) -> jax.Array:
    """timm's ``Stem``: the image padded to a multiple of the stride, a 7 x 7
    convolution (``embedding``) and a LayerNorm (``embedding_norm``)."""
    spec = self.spec
    dtype = spec.compute_dtype()
    x = images.astype(dtype or images.dtype)
    p = spec.patch_size
    x = jnp.pad(x, ((0, 0), (0, (-x.shape[1]) % p), (0, (-x.shape[2]) % p), (0, 0)))
    x = _conv(spec.width, 7, p, ((3, 3), (3, 3)), dtype, "embedding")(x)
    return norm_layer(spec, "embedding_norm")(x).astype(x.dtype)

  def downsample(self, x: jax.Array, stage: int, width: int) -> jax.Array:
    """timm's ``Downsample``: a LayerNorm, zero padding to even sides, a 2 x 2
    convolution of stride 2 (``downsample{stage}_norm``, ``downsample{stage}``)."""
    x = norm_layer(self.spec, f"downsample{stage}_norm")(x).astype(x.dtype)
    x = jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, x.shape[2] % 2), (0, 0)))
    return _conv(width, 2, 2, "VALID", self.spec.compute_dtype(), f"downsample{stage}")(x)

  def block_options(self, grid: tuple[int, int], j: int) -> dict:
    """Spatial (even ``j``) and channel blocks in turn."""
    del grid
    return {"kind": "spatial" if j % 2 == 0 else "channel"}

  def pool(self, x: jax.Array, out: dict) -> jax.Array:
    """The mean over the grid, then ``encoder_norm``."""
    out["encoded"] = x.reshape(x.shape[0], -1, x.shape[-1])
    return norm_layer(self.spec, "encoder_norm")(x.mean(axis=(1, 2)))


def attention_lengths(config, image_side=None, crop_sides=()) -> tuple[int, ...]:
  """The tokens of a spatial window, ``window_size^2`` (the grid padded to
  whole windows; the channel attention runs XLA whatever its length)
  (:attr:`laplax.models.registry.Family.attention_lengths`)."""
  del image_side, crop_sides
  return (int(config.model.window_size) ** 2,)


def analytic_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`laplax.plan.flops.analytic_flops` of a DaViT: each kernel
  (convolutions included: their size is the multiply-adds per output
  position) on the positions of its stage (``ceil(grid_0 / 2^s)^2`` per
  image, the stem's output grid ``ceil(H / patch)``; the head on one), and
  per block ``12 N width_s`` per position (16 with remat) with ``N`` the
  window's ``window_size^2`` tokens in a spatial block (over the grid padded
  to whole windows) and the group's ``d = width_s / heads`` channels in a
  channel block."""
  spec = spec_lib.from_config(config.model)
  grids, grid = [], -(-task.image_shape[0] // spec.patch_size)
  for s in range(len(spec.stage_depths)):
    grid = grid if s == 0 else -(-grid // 2)
    grids.append(grid)
  stage_of = {"embedding": 0}
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    stage_of.update({f"block{i}": s for i in range(first, first + depth)})
    stage_of[f"downsample{s}"] = s
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for top, _, size in utils.matmul_kernels(params):
    count += size
    per_image += w * size * (1 if top == "head" else grids[stage_of[top]] ** 2)
  heads = spec.layer_heads()
  ws = spec.window_size
  for s, (first, depth, width, _) in enumerate(spec.stages()):
    padded = -(-grids[s] // ws) * ws
    for j in range(depth):
      if j % 2 == 0:  # spatial: windows of ws^2 tokens over the padded grid
        per_image += a * ws * ws * width * padded**2
      else:  # channel groups of d channels, over every position
        per_image += a * (width // heads[first + j]) * width * grids[s] ** 2
  return count, float(per_image * config.batch_size)


#: The DaViT family: ``config.model.name="davit"``, trained by the
#: classification task (any image size: its stem pads).
FAMILY = Family(
  name="davit",
  spec=DaViTSpec,
  model=DaViT,
  task="classification",
  attention_lengths=attention_lengths,
  flops=analytic_flops,
)
