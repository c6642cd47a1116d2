"""Layers shared by every laplax model: MLP, LayerScale, DropPath, the pre-LN Block,
and :func:`transformer_blocks`, the stack of blocks (looped or ``nn.scan``-ned,
optionally rematerialised) that ViT and GPT share."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.attention import MultiHeadAttention, laplacian_heads

# Rematerialisation of each block (``model.remat``): name -> jax.checkpoint
# policy. "full" saves nothing inside a block (recomputes all of it in the
# backward pass); the others save the matmul outputs (all of them, or only
# those without batch dimensions, i.e. not attention's QK^T and PV).
REMAT_POLICIES = {
    "none": None,
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable":
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# With scan_layers=True the blocks are one module of this name whose
# parameters have a leading layer axis (``blocks/attention/query/kernel``
# is ``[depth, width, width]``).
SCANNED_BLOCKS = "blocks"
# Logical axes of the residual stream and of the MLP hidden layer (laplax.sharding).
EMBED_AXES = ("batch", "length", "embed")
MLP_AXES = ("batch", "length", "mlp")


class MLP(nn.Module):
  """Transformer MLP ``Dense(mlp_dim) -> GELU -> Dropout -> Dense(in)``.

  ``x [..., dim] -> [..., dim]``; matmuls in ``dtype``, parameters float32.
  Kernels have the logical axes ``("embed", "mlp")`` and ``("mlp", "embed")``.
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
    bias_init = nn.initializers.normal(1e-6)
    x = nn.Dense(self.mlp_dim, dtype=self.dtype, use_bias=self.use_bias,
                 kernel_init=sharding.logical_init(self.kernel_init, ("embed", "mlp")),
                 bias_init=sharding.logical_init(bias_init, ("mlp",)), name="fc1")(x)
    if x.ndim == len(MLP_AXES):
      x = nn.with_logical_constraint(x, MLP_AXES)
    x = nn.gelu(x)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(dim, dtype=self.dtype,
                 kernel_init=sharding.logical_init(self.out_init, ("mlp", "embed")),
                 use_bias=self.use_bias,
                 bias_init=sharding.logical_init(bias_init, ("embed",)), name="fc2")(x)
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
    gamma = self.param("scale", sharding.logical_init(
        nn.initializers.constant(self.init_value), ("embed",)), (x.shape[-1],), jnp.float32)
    return x * gamma.astype(x.dtype)


class DropPath(nn.Module):
  """Stochastic depth: drops the whole residual branch per example.

  Huang et al. 2016. ``x [batch, ...]``; kept examples are scaled by
  ``1 / (1 - rate)``. Uses the ``"dropout"`` RNG stream.
  """
  rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True,
               rate: jax.Array | None = None) -> jax.Array:
    """Applies drop-path to ``x`` (identity when deterministic or rate 0).

    ``rate`` (a float32 scalar, may be traced: the per-layer rate of scanned
    blocks) overrides the attribute.
    """
    if rate is None:
      if self.rate == 0.0:
        return x
      rate = self.rate
    if deterministic:
      return x
    keep = 1.0 - rate
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
               decode: bool = False, laplacian: jax.Array | None = None,
               drop_path: jax.Array | None = None):
    """Applies the block; ``mask`` as in :func:`laplax.attention.attend`,
    ``decode`` as in :class:`laplax.attention.MultiHeadAttention`.

    ``laplacian`` (bool ``[num_heads]``) and ``drop_path`` (float32 scalar)
    override the attributes with per-layer values that may be traced (the
    scanned inputs of :func:`transformer_blocks` with ``scan=True``).
    """
    out = {}
    norm = dict(dtype=jnp.float32, **sharding.layer_norm_inits("embed"))
    x = nn.with_logical_constraint(x, EMBED_AXES)
    y = nn.LayerNorm(name="norm1", **norm)(x).astype(x.dtype)
    y = MultiHeadAttention(
        num_heads=self.num_heads, num_laplacian_heads=self.num_laplacian_heads,
        laplacian_mask=self.laplacian_mask, qk_norm=self.qk_norm,
        attention_dropout=self.attention_dropout, dropout=self.dropout,
        spectral_lam=self.spectral_lam, spectral_mode=self.spectral_mode,
        implementation=self.implementation, use_bias=self.use_bias,
        rope=self.rope, dtype=self.dtype, kernel_init=self.kernel_init,
        out_init=self.out_init, name="attention")(
            y, mask=mask, is_causal=is_causal, deterministic=deterministic,
            decode=decode, laplacian=laplacian)
    if self.layerscale_init is not None:
      y = LayerScale(self.layerscale_init, name="ls1")(y)
    out["sa"] = y
    x = x + DropPath(self.drop_path)(y, deterministic, drop_path)
    out["+sa"] = x
    y = nn.LayerNorm(name="norm2", **norm)(x).astype(x.dtype)
    y = MLP(self.mlp_dim, dropout=self.dropout, use_bias=self.use_bias,
            dtype=self.dtype, kernel_init=self.kernel_init,
            out_init=self.out_init, name="mlp")(y, deterministic)
    if self.layerscale_init is not None:
      y = LayerScale(self.layerscale_init, name="ls2")(y)
    out["mlp"] = y
    x = x + DropPath(self.drop_path)(y, deterministic, drop_path)
    x = nn.with_logical_constraint(x, EMBED_AXES)
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


def remat_policy(name: str):
  """The ``jax.checkpoint`` policy of a :data:`REMAT_POLICIES` name.

  Raises:
    ValueError: an unknown name.
  """
  if name not in REMAT_POLICIES:
    raise ValueError(f"remat {name!r} is unknown; use one of "
                     f"{', '.join(REMAT_POLICIES)}")
  return REMAT_POLICIES[name]


def transformer_blocks(x: jax.Array, *, depth: int, num_heads: int,
                       num_laplacian_heads: int | Sequence[int] = 0,
                       laplacian_mask: Sequence[Sequence[bool]] | None = None,
                       drop_path: Sequence[float] | None = None,
                       remat: str = "none", scan: bool = False,
                       call: dict | None = None, **block) -> tuple[jax.Array, dict]:
  """Applies ``depth`` :class:`Block` s to ``x``, looped or under ``nn.scan``.

  Call it inside a ``@nn.compact`` method: the blocks become the caller's
  submodules, ``block0`` ... ``block{depth-1}``, or with ``scan`` one module
  :data:`SCANNED_BLOCKS` whose variables (parameters, and the KV cache when
  decoding) are stacked along a leading layer axis (logical axis name
  ``"layers"``). ``nn.scan`` traces and compiles one block instead of
  ``depth``. What differs between layers goes in as scanned inputs: the
  Laplacian heads of each layer (bool ``[depth, num_heads]``, unless every
  layer has the same) and the drop-path rates (float32 ``[depth]``, unless
  all equal); the parameters are initialised from per-layer RNGs.

  ``remat`` wraps each block in ``nn.remat`` with the named policy
  (:data:`REMAT_POLICIES`); it changes memory and compute, not the values
  nor the parameter names.

  Args:
    x: ``[batch, length, width]``.
    depth, num_heads: layers and heads per layer.
    num_laplacian_heads: an int (every layer) or a per-layer list.
    laplacian_mask: optional per-layer lists of per-head booleans.
    drop_path: per-layer stochastic-depth rates (``None``: 0 everywhere).
    remat: a :data:`REMAT_POLICIES` name.
    scan: run the blocks under ``nn.scan``.
    call: the Block call's keyword arguments (``mask``, ``is_causal``,
      ``deterministic``, ``decode``); Python values, closed over.
    **block: the :class:`Block` attributes every layer shares.

  Returns:
    ``(x [batch, length, width], {"block{i}": Block intermediates})``; with
    ``scan`` the intermediates are slices of the stacked scan outputs.

  Raises:
    ValueError: per-layer lists of the wrong length or an unknown ``remat``.
  """
  call = dict(call or {})
  policy = remat_policy(remat)
  counts = per_layer(num_laplacian_heads, depth, "num_laplacian_heads")
  masks = (per_layer(laplacian_mask, depth, "laplacian_mask")
           if laplacian_mask is not None else [None] * depth)
  rates = list(drop_path) if drop_path is not None else [0.0] * depth
  if len(rates) != depth:
    raise ValueError(f"drop_path has {len(rates)} rates but depth={depth}")

  def body(module, y, *layer):
    return module(y, **call, **(layer[0] if layer else {}))
  if remat != "none":
    body = nn.remat(body, policy=policy, prevent_cse=not scan)

  if not scan:
    outs = {}
    for i in range(depth):
      blk = Block(num_heads=num_heads, num_laplacian_heads=counts[i],
                  laplacian_mask=None if masks[i] is None else tuple(masks[i]),
                  drop_path=rates[i], name=f"block{i}", **block)
      x, outs[f"block{i}"] = body(blk, x)
    return x, outs

  heads = np.stack([laplacian_heads(num_heads, counts[i], masks[i]) for i in range(depth)])
  static, layer = {}, {}
  if (heads == heads[0]).all():
    static["laplacian_mask"] = tuple(bool(h) for h in heads[0])
  else:
    layer["laplacian"] = jnp.asarray(heads)
  if all(r == rates[0] for r in rates):
    static["drop_path"] = rates[0]
  else:
    layer["drop_path"] = jnp.asarray(rates, jnp.float32)
  scanned = nn.scan(body, variable_axes={True: 0},
                    split_rngs={"params": True, "dropout": True}, length=depth,
                    metadata_params={nn.PARTITION_NAME: "layers"})
  blk = Block(num_heads=num_heads, name=SCANNED_BLOCKS, **static, **block)
  x, outs = scanned(blk, x, layer)
  return x, {f"block{i}": jax.tree_util.tree_map(lambda a, i=i: a[i], outs)
             for i in range(depth)}
