"""Vision Transformer (Dosovitskiy et al. 2021) in the DeiT-3 form (Touvron et al. 2022).

Patch embedding, class token, learned or 2-D sin-cos position embedding,
pre-LN blocks with LayerScale and drop-path, optional qk-norm, and a linear
classifier on the class token (or the mean of the patch tokens). The model
takes its :class:`~laplax.models.vit.ViTSpec` whole.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.models import spec as spec_lib
from laplax.models.layers import EMBED_AXES, classifier_head, norm_layer, transformer_blocks
from laplax.models.registry import Family
from laplax.models.spec import TransformerSpec, spec_field


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTSpec(TransformerSpec):
  """A ViT (DeiT-3 form): patches, pooling, position embedding, drop-path.

  Attributes:
    patch_size: square patch side in pixels.
    pool: ``"tok"`` (class token) or ``"gap"`` (mean of the patch tokens).
    posemb: ``"learn"`` or ``"sincos2d"``.
    drop_path: the deepest block's stochastic-depth rate (linear in depth).
    fc_norm: the final norm after pooling instead of before it (timm's
      ``fc_norm``, the MAE / BEiT recipe for mean pooling).
  """

  patch_size: int = spec_field(4, "int", min=1)
  pool: str = spec_field("tok", "choice", choices=("tok", "gap"))
  posemb: str = spec_field("learn", "choice", choices=("learn", "sincos2d"))
  drop_path: float = spec_field(0.0, "float", max=0.99)
  fc_norm: bool = spec_field(False, "bool")

  def drop_path_rates(self) -> tuple[float, ...]:
    """``drop_path * i / (depth - 1)`` for block ``i`` (DeiT, Touvron et al. 2021)."""
    return tuple(self.drop_path * i / max(self.depth - 1, 1) for i in range(self.depth))


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
      f"{', '.join(VARIANTS)} (e.g. 'S/16')"
    )
  return dict(VARIANTS[size], patch_size=int(patch))


def posemb_sincos_2d(
  height: int, width: int, dim: int, temperature: float = 10_000.0
) -> np.ndarray:
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
  class token first when ``pool == "tok"``; before the norm with ``fc_norm``)
  and ``out["pre_logits"]`` (pooled, normalised).

  Attributes:
    spec: the :class:`~laplax.models.vit.ViTSpec` (sizes, Laplacian heads,
      attention and spectral settings, patch size, pooling, position
      embedding, drop-path, LayerScale, dtype, remat, scan).
    num_classes: classifier outputs (0 = no head; logits are the features).
    posemb_grid: ``(rows, cols)`` of patches the position embedding is made
      for (``None``: the grid of the input). An input with another grid gets
      the embedding resized bicubically to its grid, as DINO does for its
      small local crops (Caron et al. 2021, ``interpolate_pos_encoding``).
    head_init_zero: zero-initialised classifier (DeiT); else Xavier uniform.
  """

  spec: ViTSpec
  num_classes: int = 0
  posemb_grid: tuple[int, int] | None = None
  head_init_zero: bool = True

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    """Classifies ``images``; ``train`` enables dropout and drop-path.

    Raises:
      SpecError: an image size not divisible by the patch size
        (:func:`laplax.models.spec.patch_grid`; a ``ValueError``).
    """
    spec = self.spec
    out = {}
    h, w = images.shape[1], images.shape[2]
    p, width, dtype = spec.patch_size, spec.width, spec.compute_dtype()
    gh, gw = spec_lib.patch_grid(h, w, p)
    x = nn.Conv(
      width,
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
    x = x.reshape(x.shape[0], gh * gw, width)
    ph, pw = self.posemb_grid or (gh, gw)
    if spec.posemb == "learn":
      pos = self.param(
        "pos_embedding",
        sharding.logical_init(nn.initializers.normal(0.02), (None, "length", "embed")),
        (1, ph * pw, width),
        jnp.float32,
      )
    else:
      pos = jnp.asarray(posemb_sincos_2d(ph, pw, width))
    if (ph, pw) != (gh, gw):
      pos = jax.image.resize(
        pos.reshape(ph, pw, width), (gh, gw, width), method="bicubic", antialias=False
      ).reshape(1, gh * gw, width)
    x = x + pos.astype(x.dtype)
    if spec.pool == "tok":
      cls = self.param(
        "cls",
        sharding.logical_init(nn.initializers.normal(1e-6), (None, None, "embed")),
        (1, 1, width),
        jnp.float32,
      )
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (x.shape[0], 1, 1)), x], 1)
    x = nn.Dropout(spec.dropout)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, EMBED_AXES)

    x, blocks = transformer_blocks(x, spec, call=dict(deterministic=not train))
    out.update(blocks)
    if not spec.fc_norm:
      x = norm_layer(spec, "encoder_norm")(x)
    out["encoded"] = x
    x = x[:, 0] if spec.pool == "tok" else x.mean(axis=1)
    if spec.fc_norm:
      x = norm_layer(spec, "encoder_norm")(x)
    out["pre_logits"] = x
    x = classifier_head(x, self.num_classes, self.head_init_zero)
    out["logits"] = x
    return x, out


#: The ViT family: ``config.model.name="vit"``, trained by the classification
#: task; its attention sees the patches (and the class token), the default
#: rule of :func:`laplax.config.validation.attention_lengths`.
FAMILY = Family(name="vit", spec=ViTSpec, model=ViT, task="classification", image_patches=True)
