"""Vision Transformer (Dosovitskiy et al. 2021) in the DeiT-3 form (Touvron et al. 2022).

Patch embedding, class token, learned or 2-D sin-cos position embedding,
pre-LN blocks with LayerScale and drop-path, optional qk-norm, and a linear
classifier on the class token (or the mean of the patch tokens). Every block
takes its Laplacian head count and the spectral conditioning settings.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.models.layers import EMBED_AXES, transformer_blocks

# width, depth, mlp_dim, num_heads (ViT / DeiT naming).
VARIANTS = {
    "Ti": dict(width=192, depth=12, mlp_dim=768, num_heads=3),
    "S": dict(width=384, depth=12, mlp_dim=1536, num_heads=6),
    "B": dict(width=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": dict(width=1024, depth=24, mlp_dim=4096, num_heads=16),
}


def decode_variant(variant: str) -> dict:
  """``"S/16"`` -> ``dict(width, depth, mlp_dim, num_heads, patch_size)``.

  Raises:
    ValueError: an unknown size or a malformed string.
  """
  size, _, patch = variant.partition("/")
  if size not in VARIANTS or not patch.isdigit():
    raise ValueError(
        f"ViT variant {variant!r} is not of the form SIZE/PATCH with SIZE in "
        f"{', '.join(VARIANTS)} (e.g. 'S/16')")
  return dict(VARIANTS[size], patch_size=int(patch))


def posemb_sincos_2d(height: int, width: int, dim: int,
                     temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sin-cos position embedding (MoCo v3), float32 ``[1, h*w, dim]``.

  Raises:
    ValueError: ``dim`` not divisible by 4.
  """
  if dim % 4:
    raise ValueError(f"sincos2d position embedding needs width % 4 == 0, got {dim}")
  y, x = np.mgrid[:height, :width]
  omega = 1.0 / temperature ** (np.arange(dim // 4) / (dim // 4 - 1 or 1))
  y = y.reshape(-1)[:, None] * omega[None]
  x = x.reshape(-1)[:, None] * omega[None]
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return pe[None].astype(np.float32)


class ViT(nn.Module):
  """ViT classifier with Laplacian heads and spectral conditioning.

  ``images`` float ``[batch, height, width, channels]`` ->
  ``(logits [batch, num_classes] float32, out)``, where ``out`` has the block
  intermediates ``out["block{i}"]`` (see :class:`~laplax.models.layers.Block`),
  ``out["encoded"]`` (final-norm tokens ``[batch, 1 + patches, width]`` with the
  class token first when ``pool == "tok"``) and ``out["pre_logits"]``.

  Attributes:
    num_classes: classifier outputs (0 = no head; logits are the features).
    patch_size, width, depth, mlp_dim, num_heads: the architecture.
    num_laplacian_heads: an int for every layer or a per-layer list (last k
      heads of each layer are Laplacian).
    laplacian_mask: optional per-layer list of per-head booleans.
    qk_norm, dropout, attention_dropout: see ``MultiHeadAttention``.
    drop_path: maximum stochastic-depth rate, linearly increasing with depth.
    layerscale_init: LayerScale initial value (``None`` = no LayerScale).
    posemb: ``"learn"`` or ``"sincos2d"``.
    posemb_grid: ``(rows, cols)`` of patches the position embedding is made
      for (``None``: the grid of the input). An input with another grid gets
      the embedding resized bicubically to its grid, as DINO does for its
      small local crops (Caron et al. 2021, ``interpolate_pos_encoding``).
    pool: ``"tok"`` (class token) or ``"gap"`` (mean of patch tokens).
    spectral_lam, spectral_mode: spectral conditioning (``None`` = off).
    implementation: attention kernel.
    dtype: compute dtype (parameters float32; logits float32).
    remat: rematerialisation of each block, a name of
      :data:`~laplax.models.layers.REMAT_POLICIES` (same values, same
      parameters; less activation memory, more compute).
    scan_layers: run the blocks under ``nn.scan`` (parameters stacked under
      ``blocks`` with a leading layer axis; one block to compile); see
      :func:`~laplax.models.layers.transformer_blocks`.
  """
  num_classes: int
  patch_size: int = 16
  width: int = 384
  depth: int = 12
  mlp_dim: int = 1536
  num_heads: int = 6
  num_laplacian_heads: int | Sequence[int] = 0
  laplacian_mask: Sequence[Sequence[bool]] | None = None
  qk_norm: bool = False
  dropout: float = 0.0
  attention_dropout: float = 0.0
  drop_path: float = 0.0
  layerscale_init: float | None = None
  posemb: str = "learn"
  posemb_grid: tuple[int, int] | None = None
  pool: str = "tok"
  spectral_lam: float | None = None
  spectral_mode: str = "per_head"
  implementation: str | None = None
  head_init_zero: bool = True
  dtype: Any = None
  remat: str = "none"
  scan_layers: bool = False

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    """Classifies ``images``; ``train`` enables dropout and drop-path."""
    out = {}
    h, w = images.shape[1], images.shape[2]
    if h % self.patch_size or w % self.patch_size:
      raise ValueError(
          f"image size {h}x{w} is not divisible by patch_size={self.patch_size}")
    x = nn.Conv(self.width, (self.patch_size,) * 2, strides=self.patch_size,
                padding="VALID", dtype=self.dtype, name="embedding",
                kernel_init=sharding.logical_init(nn.initializers.lecun_normal(),
                                                  (None, None, None, "embed")),
                bias_init=sharding.logical_init(nn.initializers.zeros, ("embed",)))(
                    images.astype(self.dtype or images.dtype))
    gh, gw = h // self.patch_size, w // self.patch_size
    x = x.reshape(x.shape[0], gh * gw, self.width)
    ph, pw = self.posemb_grid or (gh, gw)
    if self.posemb == "learn":
      pos = self.param("pos_embedding", sharding.logical_init(
          nn.initializers.normal(0.02), (None, "length", "embed")),
                       (1, ph * pw, self.width), jnp.float32)
    elif self.posemb == "sincos2d":
      pos = jnp.asarray(posemb_sincos_2d(ph, pw, self.width))
    else:
      raise ValueError(f"posemb {self.posemb!r} is unknown; use 'learn' or 'sincos2d'")
    if (ph, pw) != (gh, gw):
      pos = jax.image.resize(pos.reshape(ph, pw, self.width), (gh, gw, self.width),
                             method="bicubic", antialias=False).reshape(
                                 1, gh * gw, self.width)
    x = x + pos.astype(x.dtype)
    if self.pool == "tok":
      cls = self.param("cls", sharding.logical_init(nn.initializers.normal(1e-6),
                                                    (None, None, "embed")),
                       (1, 1, self.width), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (x.shape[0], 1, 1)), x], 1)
    elif self.pool != "gap":
      raise ValueError(f"pool {self.pool!r} is unknown; use 'tok' or 'gap'")
    x = nn.Dropout(self.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)

    x, blocks = transformer_blocks(
        x, depth=self.depth, num_heads=self.num_heads,
        num_laplacian_heads=self.num_laplacian_heads,
        laplacian_mask=self.laplacian_mask,
        drop_path=[self.drop_path * i / max(self.depth - 1, 1)
                   for i in range(self.depth)],
        remat=self.remat, scan=self.scan_layers,
        call=dict(deterministic=not train), mlp_dim=self.mlp_dim,
        qk_norm=self.qk_norm, dropout=self.dropout,
        attention_dropout=self.attention_dropout,
        layerscale_init=self.layerscale_init, spectral_lam=self.spectral_lam,
        spectral_mode=self.spectral_mode, implementation=self.implementation,
        dtype=self.dtype)
    out.update(blocks)
    x = nn.LayerNorm(name="encoder_norm", dtype=jnp.float32,
                     **sharding.layer_norm_inits("embed"))(x)
    out["encoded"] = x
    x = x[:, 0] if self.pool == "tok" else x.mean(axis=1)
    out["pre_logits"] = x
    if self.num_classes:
      init = nn.initializers.zeros if self.head_init_zero else nn.initializers.xavier_uniform()
      x = nn.Dense(self.num_classes, dtype=jnp.float32, name="head",
                   kernel_init=sharding.logical_init(init, ("embed", "classes")),
                   bias_init=sharding.logical_init(nn.initializers.zeros, ("classes",)))(x)
    out["logits"] = x
    return x, out
