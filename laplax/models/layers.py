"""Layers shared by every laplax model: MLP, LayerScale, DropPath, the pre-LN Block."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax.attention import MultiHeadAttention


class MLP(nn.Module):
  """Transformer MLP ``Dense(mlp_dim) -> GELU -> Dropout -> Dense(in)``.

  ``x [..., dim] -> [..., dim]``; matmuls in ``dtype``, parameters float32.
  """
  mlp_dim: int
  dropout: float = 0.0
  use_bias: bool = True
  dtype: Any = None
  kernel_init: Callable = nn.initializers.xavier_uniform()
  out_init: Callable = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """Applies the MLP to ``x [..., dim]``."""
    dim = x.shape[-1]
    x = nn.Dense(self.mlp_dim, dtype=self.dtype, use_bias=self.use_bias,
                 kernel_init=self.kernel_init,
                 bias_init=nn.initializers.normal(1e-6), name="fc1")(x)
    x = nn.gelu(x)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(dim, dtype=self.dtype, kernel_init=self.out_init,
                 use_bias=self.use_bias,
                 bias_init=nn.initializers.normal(1e-6), name="fc2")(x)
    return nn.Dropout(self.dropout)(x, deterministic=deterministic)


class LayerScale(nn.Module):
  """Per-channel scale ``gamma * x``, ``gamma [dim]`` initialised to ``init_value``.

  Touvron et al., "Going deeper with image transformers" (CaiT, 2021);
  DeiT-3 uses ``init_value = 1e-6`` for ViT-B. (Not named ``init``: that would
  shadow ``nn.Module.init``.)
  """
  init_value: float = 1e-6

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Scales the last axis of ``x``."""
    gamma = self.param("scale", nn.initializers.constant(self.init_value),
                       (x.shape[-1],), jnp.float32)
    return x * gamma.astype(x.dtype)


class DropPath(nn.Module):
  """Stochastic depth: drops the whole residual branch per example.

  Huang et al. 2016. ``x [batch, ...]``; kept examples are scaled by
  ``1 / (1 - rate)``. Uses the ``"dropout"`` RNG stream.
  """
  rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """Applies drop-path to ``x`` (identity when deterministic or rate 0)."""
    if deterministic or self.rate == 0.0:
      return x
    keep = 1.0 - self.rate
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = jax.random.bernoulli(self.make_rng("dropout"), keep, shape)
    return jnp.where(mask, x / keep, 0.0).astype(x.dtype)


class Block(nn.Module):
  """Pre-LN Transformer block with Laplacian heads and spectral conditioning.

  ``x [batch, length, dim] -> (x, out)`` where ``out`` holds the named
  intermediates ``"sa"`` (attention branch), ``"+sa"`` (residual after it),
  ``"mlp"`` and ``"+mlp"`` (= the block output), each ``[batch, length, dim]``,
  for analysis without a second forward path (big_vision convention).

  Attributes: see :class:`laplax.attention.MultiHeadAttention` for the
  attention ones; ``layerscale_init`` ``None`` disables LayerScale;
  ``drop_path`` is this block's stochastic-depth rate.
  """
  num_heads: int
  mlp_dim: int
  num_laplacian_heads: int = 0
  laplacian_mask: Sequence[bool] | None = None
  qk_norm: bool = False
  dropout: float = 0.0
  attention_dropout: float = 0.0
  drop_path: float = 0.0
  layerscale_init: float | None = None
  spectral_lam: float | None = None
  spectral_mode: str = "per_head"
  implementation: str | None = None
  use_bias: bool = True
  rope: bool = False
  dtype: Any = None
  kernel_init: Callable = nn.initializers.xavier_uniform()
  out_init: Callable = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None,
               is_causal: bool = False, deterministic: bool = True,
               decode: bool = False):
    """Applies the block; ``mask`` as in :func:`laplax.attention.attend`,
    ``decode`` as in :class:`laplax.attention.MultiHeadAttention`."""
    out = {}
    y = nn.LayerNorm(name="norm1", dtype=jnp.float32)(x).astype(x.dtype)
    y = MultiHeadAttention(
        num_heads=self.num_heads, num_laplacian_heads=self.num_laplacian_heads,
        laplacian_mask=self.laplacian_mask, qk_norm=self.qk_norm,
        attention_dropout=self.attention_dropout, dropout=self.dropout,
        spectral_lam=self.spectral_lam, spectral_mode=self.spectral_mode,
        implementation=self.implementation, use_bias=self.use_bias,
        rope=self.rope, dtype=self.dtype, kernel_init=self.kernel_init,
        out_init=self.out_init, name="attention")(
            y, mask=mask, is_causal=is_causal, deterministic=deterministic,
            decode=decode)
    if self.layerscale_init is not None:
      y = LayerScale(self.layerscale_init, name="ls1")(y)
    out["sa"] = y
    x = x + DropPath(self.drop_path)(y, deterministic)
    out["+sa"] = x
    y = nn.LayerNorm(name="norm2", dtype=jnp.float32)(x).astype(x.dtype)
    y = MLP(self.mlp_dim, dropout=self.dropout, use_bias=self.use_bias,
            dtype=self.dtype, kernel_init=self.kernel_init,
            out_init=self.out_init, name="mlp")(y, deterministic)
    if self.layerscale_init is not None:
      y = LayerScale(self.layerscale_init, name="ls2")(y)
    out["mlp"] = y
    x = x + DropPath(self.drop_path)(y, deterministic)
    out["+mlp"] = x
    return x, out


def per_layer(value: Any, depth: int, name: str) -> list:
  """Expands an int (same for every layer) or a per-layer list to ``depth`` items.

  Raises:
    ValueError: a list whose length is not ``depth``.
  """
  if isinstance(value, (list, tuple)):
    if len(value) != depth:
      raise ValueError(
          f"{name} has {len(value)} entries but the model has depth={depth}; "
          f"give one entry per layer or a single value")
    return list(value)
  return [value] * depth
