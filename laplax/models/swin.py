"""Swin Transformer v1 (Liu et al. 2021, arXiv 2103.14030), as timm's ``SwinTransformer``.

A patch embedding (a strided convolution and a LayerNorm), stages of blocks
whose attention is restricted to non-overlapping windows of
``window_size x window_size`` tokens, with every second block's windows
shifted by half a window (``jnp.roll``) and the tokens that the roll brought
together from far apart masked off; each window's logits get a learned
relative position bias ``B[h, i, j] = table[index(i - j), h]`` (Liu et al.,
eq. 4). Stages after the first start with a patch merging. The last stage's
tokens are normalised and averaged; a linear head classifies.

Every attention is :class:`laplax.attention.MultiHeadAttention` on the
windows (a window is a batch element), with the relative position bias and
the shift mask passed to :func:`laplax.attention.attend` as one additive bias
(``-100`` on masked pairs, as timm), so both of laplax's methods apply as in
the ViT: Laplacian heads output ``V - P V`` within each window
(``num_laplacian_heads``, the last ``k`` heads of every block) and
``spectral`` corrects ``W_Q, W_K, W_V`` of every block. The attention runs
on the XLA kernel (the fused kernels take no additive bias).

Reference code: ``timm/models/swin_transformer.py`` (``WindowAttention``,
``SwinTransformerBlock``, ``PatchMerging``, ``get_relative_position_index``,
``get_attn_mask``); :mod:`laplax.convert.timm_swin` maps its weights.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding, utils
from laplax.models import spec as spec_lib
from laplax.models.layers import attention_module, norm_layer
from laplax.models.registry import Family
from laplax.models.spec import MLP_ACTIVATIONS, SpecError, spec_field
from laplax.models.staged import (
  StagedClassifier,
  StagedSpec,
  mlp_branch,
  residual,
  window_partition,
  window_reverse,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwinSpec(StagedSpec):
  """A Swin Transformer v1 (Liu et al. 2021; timm's ``SwinTransformer``): a
  :class:`~laplax.models.staged.StagedSpec` of one block a unit.

  Every Swin of the paper and of timm doubles width and heads a stage; stages
  after the first start with a patch merging (2x2 neighbours concatenated,
  LayerNorm, a linear map to twice the width without bias). ``depth`` is the
  number of blocks, ``sum(stage_depths)``.

  Attributes:
    patch_size: square patch side in pixels (the patch embedding's stride).
    stage_depths: blocks per stage.
    window_size: side of the attention windows in tokens (a stage whose grid
      is not larger than it attends over its whole grid, unshifted, as timm).
    drop_path: the deepest block's stochastic-depth rate (linear over blocks).
  """

  BLOCKS = 1
  BLOCK_NOUN = "Swin blocks"
  POSSESSIVE = "a Swin's"

  drop_path: float = spec_field(0.0, "float", max=0.99)
  # timm's Swin: no LayerScale, the exact GELU, nn.LayerNorm's eps 1e-5.
  mlp_activation: str = spec_field(
    "gelu_exact",
    "choice",
    choices=MLP_ACTIVATIONS,
  )

  def __post_init__(self):
    super().__post_init__()
    if self.attention.implementation in ("cudnn", "splash"):
      raise SpecError(
        f"model.implementation={self.attention.implementation!r}: a Swin's attention has a "
        f"relative position bias, which only the XLA kernel takes; use 'xla' or None"
      )


#: timm's value of the masked logits of shifted windows (added, not -inf).
SHIFT_MASK_VALUE = -100.0


def relative_position_index(window: tuple[int, int]) -> np.ndarray:
  """int ``[N, N]``, ``N = wh * ww``: the row of the bias table of each pair of
  a window's tokens, ``(dy + wh - 1) * (2 ww - 1) + dx + ww - 1`` for the
  offset ``(dy, dx)`` of token ``i`` from token ``j`` (timm's
  ``get_relative_position_index``)."""
  wh, ww = window
  coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)
  rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
  return (rel[..., 0] + wh - 1) * (2 * ww - 1) + rel[..., 1] + ww - 1


def shift_mask(
  height: int, width: int, window: tuple[int, int], shift: tuple[int, int]
) -> np.ndarray:
  """float32 ``[windows, N, N]``: 0 where two tokens of a shifted window come
  from the same region of the (padded) ``height x width`` grid, else
  :data:`SHIFT_MASK_VALUE` (timm's ``get_attn_mask``: the grid cut into 3 x 3
  regions at ``-window`` and ``-shift``)."""
  img = np.zeros((1, height, width, 1), np.float32)
  cnt = 0
  for hs in (slice(0, -window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None)):
    for ws in (slice(0, -window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None)):
      img[:, hs, ws, :] = cnt
      cnt += 1
  regions = window_partition(img, window)[..., 0]  # NumPy in, NumPy out
  diff = regions[:, None, :] - regions[:, :, None]
  return np.where(diff != 0, SHIFT_MASK_VALUE, 0.0).astype(np.float32)


def stage_window(grid: tuple[int, int], window_size: int) -> tuple[tuple, tuple]:
  """``(window, shift)`` of a stage with token grid ``grid``: a side not
  larger than ``window_size`` is one window, unshifted (timm's
  ``_calc_window_shift``); else ``window_size`` and half of it."""
  window = tuple(g if g <= window_size else window_size for g in grid)
  shift = tuple(0 if g <= window_size else window_size // 2 for g in grid)
  return window, shift


class SwinBlock(nn.Module):
  """One Swin block: ``x + attn(norm1(x))`` over (shifted) windows, then the MLP.

  ``x [batch, height, width, dim] -> (x, out)``, ``out`` as
  :class:`laplax.models.layers.Block`'s (``"input"``, ``"sa"``, ``"+sa"``,
  ``"mlp"``, ``"+mlp"``, tokens flattened to ``[batch, height * width, dim]``).

  Attributes:
    spec: the model's :class:`SwinSpec`.
    num_heads: this stage's heads.
    mlp_dim: this stage's MLP size.
    window, shift: ``(rows, cols)`` of the windows and of the shift (0: none).
    laplacian_mask: this block's Laplacian heads (``num_heads`` booleans).
    drop_path: this block's stochastic-depth rate.
  """

  spec: SwinSpec
  num_heads: int
  mlp_dim: int
  window: tuple[int, int]
  shift: tuple[int, int]
  laplacian_mask: tuple
  drop_path: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    """Applies the block."""
    spec = self.spec
    b, h, w, c = x.shape
    wh, ww = self.window
    shifted = any(self.shift)
    out = {"input": x.reshape(b, h * w, c)}
    y = norm_layer(spec, "norm1")(x).astype(x.dtype)
    if shifted:
      y = jnp.roll(y, (-self.shift[0], -self.shift[1]), axis=(1, 2))
    pad_h, pad_w = (-h) % wh, (-w) % ww
    if pad_h or pad_w:  # timm pads after the norm: the padding tokens are zeros
      y = jnp.pad(y, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    hp, wp = h + pad_h, w + pad_w
    windows = window_partition(y, self.window)
    n = wh * ww
    table = self.param(
      "relative_position_bias",
      sharding.logical_init(nn.initializers.normal(0.02), (None, "heads")),
      ((2 * wh - 1) * (2 * ww - 1), self.num_heads),
      jnp.float32,
    )
    index = relative_position_index(self.window).reshape(-1)
    bias = table[index].reshape(n, n, self.num_heads).transpose(2, 0, 1)[None]
    if shifted:
      mask = jnp.asarray(shift_mask(hp, wp, self.window, self.shift))
      num_windows = mask.shape[0]
      bias = bias[:, None] + mask[None, :, None]  # [1, windows, heads, N, N]
      bias = jnp.broadcast_to(bias, (b, num_windows, self.num_heads, n, n))
      bias = bias.reshape(b * num_windows, self.num_heads, n, n)
    y = attention_module(spec, self.laplacian_mask, num_heads=self.num_heads, name="attention")(
      windows, bias=bias, deterministic=deterministic
    )
    y = window_reverse(y, self.window, hp, wp)[:, :h, :w]
    if shifted:
      y = jnp.roll(y, self.shift, axis=(1, 2))
    kw = dict(drop_path=self.drop_path, deterministic=deterministic, out=out)
    x = residual(spec, x, y, scale="ls1", key="sa", **kw)
    y = mlp_branch(spec, x, self.mlp_dim, deterministic)
    x = residual(spec, x, y, scale="ls2", key="mlp", **kw)
    return x, out


class PatchMerging(nn.Module):
  """2x2 neighbouring tokens concatenated (timm's order), LayerNorm, linear map.

  ``[batch, H, W, C] -> [batch, ceil(H/2), ceil(W/2), features]`` (odd sides
  padded with zeros); the map has no bias (timm's ``PatchMerging``).
  """

  spec: SwinSpec
  features: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Merges ``x``."""
    b, h, w, c = x.shape
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    h, w = x.shape[1], x.shape[2]
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 4, 2, 5)
    x = x.reshape(b, h // 2, w // 2, 4 * c)
    x = norm_layer(self.spec, "norm")(x).astype(x.dtype)
    kernel_init, _ = self.spec.inits()
    return nn.Dense(
      self.features,
      use_bias=False,
      dtype=self.spec.compute_dtype(),
      kernel_init=sharding.logical_init(kernel_init, (None, "embed")),
      name="reduction",
    )(x)


class Swin(StagedClassifier):
  """Swin classifier with Laplacian heads and spectral conditioning.

  ``images`` float ``[batch, height, width, channels]`` -> ``(logits [batch,
  num_classes] float32, out)`` (:class:`~laplax.models.staged.StagedClassifier`):
  ``out["block{i}"]`` as :class:`SwinBlock`'s, ``out["encoded"]`` the last
  stage's normalised tokens and ``out["pre_logits"]`` their mean. The patch
  embedding is a strided convolution and a LayerNorm (``embedding``,
  ``embedding_norm``), the stages after the first start with a
  :class:`PatchMerging` (``merge{s}``).

  Attributes:
    spec: the :class:`SwinSpec`.
    num_classes: classifier outputs (0: the pooled features are returned).
    head_init_zero: zero-initialised classifier; else Xavier uniform.
  """

  spec: SwinSpec

  def block_class(self) -> type:
    """:class:`SwinBlock`."""
    return SwinBlock

  def stem(self, images: jax.Array) -> jax.Array:
    """The patch embedding of ``images``.

    Raises:
      SpecError: an image size not divisible by the patch size.
    """
    spec = self.spec
    p, dtype = spec.patch_size, spec.compute_dtype()
    spec_lib.patch_grid(images.shape[1], images.shape[2], p)
    x = nn.Conv(
      spec.width,
      (p, p),
      strides=p,
      padding="VALID",
      dtype=dtype,
      name="embedding",
      kernel_init=sharding.logical_init(
        nn.initializers.lecun_normal(), (None, None, None, "embed")
      ),
      bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)),
    )(images.astype(dtype or images.dtype))
    return norm_layer(spec, "embedding_norm")(x).astype(x.dtype)

  def downsample(self, x: jax.Array, stage: int, width: int) -> jax.Array:
    """:class:`PatchMerging` ``merge{stage}``."""
    return PatchMerging(self.spec, width, name=f"merge{stage}")(x)

  def block_options(self, grid: tuple[int, int], j: int) -> dict:
    """The stage's windows (:func:`stage_window`), every second block shifted."""
    window, shift = stage_window(grid, self.spec.window_size)
    return {"window": window, "shift": shift if j % 2 else (0, 0)}

  def pool(self, x: jax.Array, out: dict) -> jax.Array:
    """``encoder_norm``, then the mean over the grid."""
    x = norm_layer(self.spec, "encoder_norm")(x)
    out["encoded"] = x.reshape(x.shape[0], -1, x.shape[-1])
    return x.mean(axis=(1, 2))


def attention_lengths(config, image_side=None, crop_sides=()) -> tuple[int, ...]:
  """The tokens of a window in each stage (a stage's grid when it is smaller),
  for images of ``data.image_size`` (else ``image_side``; none known: ``()``)
  (:attr:`laplax.models.registry.Family.attention_lengths`)."""
  del crop_sides
  m = config.model
  data = config.get("data") or {}
  side = data.get("image_size", None) or image_side
  if not side:
    return ()
  grid, out = int(side) // m.patch_size, []
  for s in range(len(m.stage_depths)):
    if s:
      grid = (grid + 1) // 2
    window = stage_window((grid, grid), m.window_size)[0]
    out.append(window[0] * window[1])
  return tuple(dict.fromkeys(out))


def analytic_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`laplax.plan.flops.analytic_flops` of a Swin: each weight matmul on
  the tokens of its stage (``(grid / 2^s)^2`` per image; a patch merging on
  its output grid, the patch embedding on the first), and per block ``Q K^T``
  and ``P V`` over windows of ``N`` tokens: ``12 N width_s`` per token (16
  with remat)."""
  spec = spec_lib.from_config(config.model)
  grids, grid = [], task.image_shape[0] // spec.patch_size
  for s in range(len(spec.stage_depths)):
    grid = grid if s == 0 else (grid + 1) // 2
    grids.append(grid)
  stage_of = {}
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    for i in range(first, first + depth):
      stage_of[f"block{i}"] = s
    stage_of[f"merge{s}"] = s
  stage_of["embedding"] = 0
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for top, name, size in utils.matmul_kernels(params):
    if "relative_position_bias" in name:
      continue
    count += size
    tokens = 1 if top == "head" else grids[stage_of[top]] ** 2
    per_image += w * size * tokens
  for s, (_, depth, width, _) in enumerate(spec.stages()):
    window = stage_window((grids[s], grids[s]), spec.window_size)[0]
    per_image += depth * a * window[0] * window[1] * width * grids[s] ** 2
  return count, float(per_image * config.batch_size)


#: The Swin family: ``config.model.name="swin"``, trained by the
#: classification task; its windows' relative position bias runs on XLA.
FAMILY = Family(
  name="swin",
  spec=SwinSpec,
  model=Swin,
  task="classification",
  attention_lengths=attention_lengths,
  relative_bias=True,
  image_patches=True,
  flops=analytic_flops,
)
