"""What the staged (hierarchical) vision families share: their spec and classifier body.

A staged model (Swin, Liu et al. 2021; DaViT, Ding et al. 2022) runs stages
of blocks on a grid of tokens: stage ``s`` (0-based) has width ``width *
2^s``, ``num_heads * 2^s`` heads and MLP size ``mlp_dim * 2^s``, and every
stage after the first starts by halving the grid (a patch merging, a strided
convolution). :class:`StagedSpec` holds those fields and the per-block
arithmetic; :class:`StagedClassifier` is the classifier around the blocks
(stem, dropout, stages, pooling, head), whose family fills in the stem, the
downsampling, the block and the pooling. The families' modules
(:mod:`laplax.models.swin`, :mod:`laplax.models.davit`) hold the rest.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax

from laplax.models.layers import MLP, DropPath, LayerScale, classifier_head, norm_layer
from laplax.models.spec import (
  MLP_ACTIVATIONS,
  REMAT_POLICIES,
  SpecError,
  TransformerSpec,
  check_value,
  spec_field,
)


def window_partition(x: jax.Array, window: tuple[int, int]) -> jax.Array:
  """``[B, H, W, C] -> [B * windows, wh * ww, C]`` (JAX or NumPy; windows row-major per image;
  ``H``, ``W`` divisible by the window)."""
  b, h, w, c = x.shape
  wh, ww = window
  x = x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(-1, wh * ww, c)


def window_reverse(windows: jax.Array, window: tuple[int, int], h: int, w: int) -> jax.Array:
  """The inverse of :func:`window_partition`: ``[B * windows, wh * ww, C] -> [B, H, W, C]``."""
  wh, ww = window
  c = windows.shape[-1]
  x = windows.reshape(-1, h // wh, w // ww, wh, ww, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(-1, h, w, c)


def residual(spec, x, y, *, scale: str, drop_path: float, deterministic: bool, out: dict, key: str):
  """``x + drop_path(layerscale(y))`` of a staged block on the grid ``x [batch,
  H, W, C]``: the branch ``y`` scaled by the LayerScale ``scale`` (when
  ``spec.layerscale_init`` is set), recorded as ``out[key]`` and the sum as
  ``out["+" + key]`` (tokens flattened to ``[batch, H * W, C]``, as
  :class:`laplax.models.layers.Block`'s). Call it inside the block's
  ``nn.compact`` method: the modules are the block's."""
  b, h, w, c = x.shape
  if spec.layerscale_init is not None:
    y = LayerScale(spec.layerscale_init, name=scale)(y)
  out[key] = y.reshape(b, h * w, c)
  x = x + DropPath(drop_path)(y, deterministic)
  out["+" + key] = x.reshape(b, h * w, c)
  return x


def mlp_branch(spec, x, mlp_dim: int, deterministic: bool) -> jax.Array:
  """``mlp(norm2(x))`` of a staged block (the modules ``norm2`` and ``mlp``;
  ``x [batch, H, W, C]`` -> same shape). Call it inside the block's
  ``nn.compact`` method."""
  kernel_init, out_init = spec.inits()
  y = norm_layer(spec, "norm2")(x).astype(x.dtype)
  return MLP(
    mlp_dim,
    activation=spec.mlp_activation,
    dropout=spec.dropout,
    use_bias=spec.use_bias,
    dtype=spec.compute_dtype(),
    kernel_init=kernel_init,
    out_init=out_init,
    name="mlp",
  )(y, deterministic)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StagedSpec(TransformerSpec):
  """A staged model's spec: ``stage_depths[s]`` units of blocks in stage ``s``.

  A unit is ``BLOCKS`` attention blocks (a Swin block; DaViT's dual
  block, a spatial and a channel block), and ``depth`` counts the attention
  blocks, ``BLOCKS * sum(stage_depths)``; the Laplacian heads are one row per
  attention block of that block's heads (``num_laplacian_heads=k``: the last
  ``k`` of every block). No LayerScale, the exact GELU and LayerNorms of eps
  1e-5 by default (timm's Swin and DaViT).

  Attributes:
    patch_size: the stem's stride in pixels.
    stage_depths: units per stage.
    window_size: side of the attention windows in tokens.
    drop_path: the deepest unit's stochastic-depth rate (linear over units,
      the blocks of one unit sharing it).
  """

  #: Attention blocks per unit of ``stage_depths``.
  BLOCKS: ClassVar[int] = 1
  #: What ``depth`` counts, for the refusal ("Swin blocks").
  BLOCK_NOUN: ClassVar[str] = "blocks"
  #: The family in messages ("a Swin's").
  POSSESSIVE: ClassVar[str] = "a staged model's"

  patch_size: int = spec_field(4, "int", min=1)
  stage_depths: tuple = spec_field((2, 2), "ints")
  window_size: int = spec_field(7, "int", min=1)
  drop_path: float = spec_field(0.0, "float", max=0.99)
  layerscale_init: float | None = spec_field(None, "float", optional=True)
  mlp_activation: str = spec_field("gelu_exact", "choice", choices=MLP_ACTIVATIONS)
  norm_eps: float = spec_field(1e-5, "float", open_min=True, max=1.0)

  def __post_init__(self):
    check_value("stage_depths", self.stage_depths, {"check": "ints"})
    object.__setattr__(self, "stage_depths", tuple(int(d) for d in self.stage_depths))
    units = sum(self.stage_depths)
    if self.depth != self.BLOCKS * units:
      times = "" if self.BLOCKS == 1 else f"{self.BLOCKS} * "
      raise SpecError(
        f"model.depth={self.depth} must be the number of {self.BLOCK_NOUN}, "
        f"{times}sum(model.stage_depths={self.stage_depths})={self.BLOCKS * units}; set it so"
      )
    super().__post_init__()
    if self.scan_layers:
      raise SpecError(
        f"model.scan_layers=True: {self.POSSESSIVE} stages differ in width; use "
        f"model.scan_layers=False"
      )

  def layer_heads(self) -> tuple[int, ...]:
    """Heads of each attention block: ``num_heads * 2^s`` in stage ``s``."""
    return tuple(
      self.attention.num_heads * 2**s
      for s, d in enumerate(self.stage_depths)
      for _ in range(self.BLOCKS * d)
    )

  def stages(self) -> tuple[tuple[int, int, int, int], ...]:
    """``(first attention block, attention blocks, width, mlp_dim)`` of every stage."""
    out, first = [], 0
    for s, d in enumerate(self.stage_depths):
      out.append((first, self.BLOCKS * d, self.width * 2**s, self.mlp_dim * 2**s))
      first += self.BLOCKS * d
    return tuple(out)

  def drop_path_rates(self) -> tuple[float, ...]:
    """``drop_path * j / (units - 1)`` for the blocks of unit ``j`` (timm's
    linspace over the blocks, DaViT's ``stagewise`` over dual blocks)."""
    n = sum(self.stage_depths)
    return tuple(self.drop_path * (i // self.BLOCKS) / max(n - 1, 1) for i in range(self.depth))


class StagedClassifier(nn.Module):
  """A staged classifier: stem, dropout, the stages' blocks, pooling, linear head.

  ``images`` float ``[batch, height, width, channels]`` -> ``(logits [batch,
  num_classes] float32, out)``, ``out`` with ``out["block{i}"]`` (the
  block's, as :class:`laplax.models.layers.Block`'s), ``out["encoded"]``
  (the last stage's tokens ``[batch, tokens, width * 2^(stages-1)]``),
  ``out["pre_logits"]`` and ``out["logits"]``. A family defines
  :meth:`stem`, :meth:`downsample`, :meth:`block_options`, :meth:`pool` and
  :meth:`block_class`; the parameter names are the family's
  (``embedding``, ``block{i}``, ``head``...).

  Attributes:
    spec: the family's :class:`StagedSpec`.
    num_classes: classifier outputs (0: the pooled features are returned).
    head_init_zero: zero-initialised classifier; else Xavier uniform.
  """

  spec: StagedSpec
  num_classes: int = 0
  head_init_zero: bool = True

  def block_class(self) -> type:
    """The block module, built ``block(spec, num_heads=, mlp_dim=,
    laplacian_mask=, drop_path=, name=, **block_options)`` and called
    ``(x, deterministic) -> (x, out)``."""
    raise NotImplementedError

  def stem(self, images: jax.Array) -> jax.Array:
    """``images -> [batch, H, W, width]`` tokens of the first stage."""
    raise NotImplementedError

  def downsample(self, x: jax.Array, stage: int, width: int) -> jax.Array:
    """The grid of stage ``stage - 1`` halved to stage ``stage``'s, ``width`` wide."""
    raise NotImplementedError

  def block_options(self, grid: tuple[int, int], j: int) -> dict:
    """The family's block attributes of the ``j``-th block of a stage on ``grid``."""
    raise NotImplementedError

  def pool(self, x: jax.Array, out: dict) -> jax.Array:
    """The last stage's tokens ``[batch, H, W, C]`` -> ``[batch, C]``; sets ``out["encoded"]``."""
    raise NotImplementedError

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    """Classifies ``images``; ``train`` enables dropout and drop-path.

    Raises:
      SpecError: images the family's stem refuses (a size its patches do not divide).
    """
    spec = self.spec
    out = {}
    x = self.stem(images)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    rates = spec.drop_path_rates()
    block_cls = self.block_class()
    if spec.remat != "none":
      block_cls = nn.remat(block_cls, policy=REMAT_POLICIES[spec.remat], static_argnums=(2,))
    for s, (first, depth, width, mlp_dim) in enumerate(spec.stages()):
      if s:
        x = self.downsample(x, s, width)
      grid = x.shape[1:3]
      for j in range(depth):
        i = first + j
        x, out[f"block{i}"] = block_cls(
          spec,
          num_heads=spec.layer_heads()[i],
          mlp_dim=mlp_dim,
          laplacian_mask=spec.laplacian[i],
          drop_path=rates[i],
          name=f"block{i}",
          **self.block_options(grid, j),
        )(x, not train)
    x = self.pool(x, out)
    out["pre_logits"] = x
    x = classifier_head(x, self.num_classes, self.head_init_zero)
    out["logits"] = x
    return x, out
