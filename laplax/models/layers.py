"""Layers shared by every laplax model: MLP, LayerScale, DropPath, the pre-LN Block,
the vision models' :func:`classifier_head`, and :func:`transformer_blocks`, the stack of blocks (looped or ``nn.scan``-ned,
optionally rematerialised) that ViT and GPT share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import sharding
from laplax.attention import MultiHeadAttention, rms_norm
from laplax.models.spec import REMAT_POLICIES, TransformerSpec

#: With scan_layers=True the blocks are one module of this name whose
#: parameters have a leading layer axis (``blocks/attention/query/kernel``
#: is ``[depth, width, width]``).
SCANNED_BLOCKS = "blocks"
# Logical axes of the residual stream and of the MLP hidden layer (laplax.sharding).
EMBED_AXES = ("batch", "length", "embed")
MLP_AXES = ("batch", "length", "mlp")


def relu2(x: jax.Array) -> jax.Array:
  """ReLU squared, ``max(x, 0)^2`` (the MLP of nanochat/gpt.py); same shape and dtype."""
  return jnp.square(nn.relu(x))


_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2 / pi)
_GELU_CUBIC = 0.044715


def _gelu_tanh_forward(x):
  """``x * 0.5 * (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``:
  the expression of ``jax.nn.gelu(approximate=True)``, op for op."""
  cdf = 0.5 * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * (x**3))))
  return x * cdf


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
  """GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. 3; GPT-2's
  ``gelu_new``): ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

  Same shape and dtype as ``x``; the forward pass is
  ``jax.nn.gelu(approximate=True)``'s. The backward pass is written out,
  ``g * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))``
  with ``t = tanh(u)`` recomputed from ``x``: one elementwise pass that keeps
  only ``x``, where autodiff keeps and rereads the intermediates (docs/benchmarks.md,
  "Where the step's time goes, and what changed").
  """
  return _gelu_tanh_forward(x)


def _gelu_fwd(x):
  return _gelu_tanh_forward(x), x


def _gelu_bwd(x, g):
  t = jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * (x**3)))
  du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * (x * x))
  return (g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def gelu_exact(x: jax.Array) -> jax.Array:
  """GELU in its exact erf form, ``x * Phi(x)`` (PyTorch's ``nn.GELU()``, timm's ViTs)."""
  return nn.gelu(x, approximate=False)


def gelu_glu(x: jax.Array) -> jax.Array:
  """Gated GELU (Shazeer 2020, "GLU Variants Improve Transformer"), cramming's
  ``GELUglu``: ``x [..., 2n]`` split into halves ``(value, gate)``, returns
  ``gelu_exact(gate) * value`` ``[..., n]`` (the order of cramming's ``GLU``:
  ``x, gate = inputs.chunk(2, dim=-1)``). Same dtype as ``x``."""
  value, gate = jnp.split(x, 2, axis=-1)
  return gelu_exact(gate) * value


# ``model.mlp_activation`` -> function. "gelu" is :func:`gelu`, ``nn.gelu``'s default, the
# tanh approximation (what laplax's MLP has always used; GPT-2's ``gelu_new``).
ACTIVATIONS = {"gelu": gelu, "gelu_exact": gelu_exact, "relu2": relu2, "gelu_glu": gelu_glu}


class RMSNorm(nn.Module):
  """Parameter-free RMSNorm (:func:`laplax.attention.rms_norm`) as a module.

  A module (with no variables) rather than a bare function so that it has a
  name: the analysis captures a block's ``norm1`` output by module name.
  ``x [..., dim] -> float32 [..., dim]``.
  """

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalises the last axis of ``x``."""
    return rms_norm(x)


def norm_layer(spec: TransformerSpec, name: str) -> Callable[[jax.Array], jax.Array]:
  """The norm ``spec.norm`` names, as a function ``x [..., dim] -> float32 [..., dim]``.

  A submodule called ``name`` (call this inside a compact method):
  ``"layernorm"``: a learnable float32 ``nn.LayerNorm`` with ``epsilon =
  spec.norm_eps``; ``"rmsnorm"``:
  :class:`RMSNorm`, no parameters (nanochat/gpt.py).
  """
  if spec.norm == "rmsnorm":
    return RMSNorm(name=name)
  return nn.LayerNorm(
    name=name, dtype=jnp.float32, epsilon=spec.norm_eps, **sharding.layer_norm_inits("embed")
  )


def classifier_head(x: jax.Array, num_classes: int, zero_init: bool) -> jax.Array:
  """The linear classifier of the vision models (timm's ``head``): pooled
  features ``x [batch, dim]`` -> logits ``[batch, num_classes]`` float32, or
  ``x`` unchanged when ``num_classes`` is 0.

  Called inside a model's ``nn.compact`` method, the ``nn.Dense`` it creates
  is that model's submodule ``head`` (parameters ``head/kernel [dim,
  num_classes]``, logical axes ``("embed", "classes")``, and ``head/bias``,
  zeros), as the converters and checkpoints name it. The kernel starts at
  zero when ``zero_init`` (big_vision's ``head_zeroinit``), else Xavier
  uniform."""
  if not num_classes:
    return x
  init = nn.initializers.zeros if zero_init else nn.initializers.xavier_uniform()
  return nn.Dense(
    num_classes,
    dtype=jnp.float32,
    name="head",
    kernel_init=sharding.logical_init(init, ("embed", "classes")),
    bias_init=sharding.logical_init(nn.initializers.zeros, ("classes",)),
  )(x)


class MLP(nn.Module):
  """Transformer MLP ``Dense(mlp_dim) -> activation -> Dropout -> Dense(in)``.

  ``x [..., dim] -> [..., dim]``; matmuls in ``dtype``, parameters float32.
  Kernels have the logical axes ``("embed", "mlp")`` and ``("mlp", "embed")``.
  ``activation`` is a key of :data:`ACTIVATIONS` (``"gelu"``: tanh
  approximation; ``"relu2"``: ReLU squared, nanochat/gpt.py; ``"gelu_glu"``:
  gated, so the second layer reads ``mlp_dim // 2``).
  """

  mlp_dim: int
  activation: str = "gelu"
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
    x = nn.Dense(
      self.mlp_dim,
      dtype=self.dtype,
      use_bias=self.use_bias,
      kernel_init=sharding.logical_init(self.kernel_init, ("embed", "mlp")),
      bias_init=sharding.logical_init(bias_init, ("mlp",)),
      name="fc1",
    )(x)
    if x.ndim == len(MLP_AXES):
      x = nn.with_logical_constraint(x, MLP_AXES)
    x = ACTIVATIONS[self.activation](x)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(
      dim,
      dtype=self.dtype,
      kernel_init=sharding.logical_init(self.out_init, ("mlp", "embed")),
      use_bias=self.use_bias,
      bias_init=sharding.logical_init(bias_init, ("embed",)),
      name="fc2",
    )(x)
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
    gamma = self.param(
      "scale",
      sharding.logical_init(nn.initializers.constant(self.init_value), ("embed",)),
      (x.shape[-1],),
      jnp.float32,
    )
    return x * gamma.astype(x.dtype)


class DropPath(nn.Module):
  """Stochastic depth: drops the whole residual branch per example.

  Huang et al. 2016. ``x [batch, ...]``; kept examples are scaled by
  ``1 / (1 - rate)``. Uses the ``"dropout"`` RNG stream.
  """

  rate: float = 0.0

  @nn.compact
  def __call__(
    self, x: jax.Array, deterministic: bool = True, rate: jax.Array | None = None
  ) -> jax.Array:
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


def attention_module(
  spec: TransformerSpec, laplacian_mask: tuple | None = None, **overrides
) -> MultiHeadAttention:
  """The :class:`~laplax.attention.MultiHeadAttention` of a block of ``spec``.

  The one place where a model spec becomes attention attributes: every
  field of ``spec.attention`` under its own name (heads, qk-norm, attention
  dropout, kernel, rotary, Laplacian mix, Nystrom options, spectral
  conditioning; the sub-specs ``qk_norm``, ``rope``, ``nystrom`` and
  ``spectral`` as the same objects), plus the model-level key/value heads (a GPT's ``num_kv_heads``; ``None``
  where there is one per head), dropout, biases, compute dtype and
  initialisers. ``overrides`` replace attributes (the analysis rebuilds a
  block with ``implementation="reference"`` and float32 compute);
  ``laplacian_mask`` is the layer's tuple of ``num_heads`` booleans.
  Attentions of other shapes (DaViT's channel attention, XCiT's) compose the
  parts of :mod:`laplax.attention` from the spec themselves.
  """
  attn = spec.attention
  kernel_init, out_init = spec.inits()
  kwargs = {f.name: getattr(attn, f.name) for f in dataclasses.fields(attn)}
  kwargs.update(
    laplacian_mask=laplacian_mask,
    num_kv_heads=None if spec.kv_heads == spec.num_heads else spec.kv_heads,
    dropout=spec.dropout,
    use_bias=spec.use_bias,
    dtype=spec.compute_dtype(),
    kernel_init=kernel_init,
    out_init=out_init,
  )
  kwargs.update(overrides)
  return MultiHeadAttention(**kwargs)


class Block(nn.Module):
  """Pre-LN Transformer block with Laplacian heads and spectral conditioning.

  With a spec whose ``post_norm`` is True (:class:`~laplax.models.bert.BERTSpec`)
  it is BERT's post-LN block (Devlin et al. 2019; Hugging Face ``BertLayer``):
  ``x = norm1(x + attention(x))``, ``x = norm2(x + mlp(x))``; ``"+sa"`` and
  ``"+mlp"`` are then the normalised residuals.

  ``x [batch, length, dim] -> (x, out)`` where ``out`` holds the named
  intermediates ``"input"`` (the block input, the residual stream), ``"sa"``
  (attention branch), ``"+sa"`` (residual after it),
  ``"mlp"`` and ``"+mlp"`` (= the block output), each ``[batch, length, dim]``,
  for analysis without a second forward path (big_vision convention).

  Attributes:
    spec: the model's :class:`~laplax.models.spec.TransformerSpec` (attention
      settings, MLP size, dropout, LayerScale, initialisers, dtype).
    laplacian_mask: this layer's Laplacian heads, a tuple of ``num_heads``
      booleans (``None``: given per call, e.g. scanned).
    drop_path: this block's stochastic-depth rate.
    window: this layer's causal sliding window
      (:attr:`laplax.attention.MultiHeadAttention.window`; ``None``: full).
  """

  spec: TransformerSpec
  laplacian_mask: tuple | None = None
  drop_path: float = 0.0
  window: int | None = None

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
    drop_path: jax.Array | None = None,
    value_embed: jax.Array | None = None,
  ):
    """Applies the block; ``mask`` as in :func:`laplax.attention.attend`,
    ``decode`` as in :class:`laplax.attention.MultiHeadAttention`.

    ``laplacian`` (bool ``[num_heads]``) and ``drop_path`` (float32 scalar)
    override the attributes with per-layer values that may be traced (the
    scanned inputs of :func:`transformer_blocks` with ``scan_layers``).
    ``value_embed`` goes to the attention (the fork's value embedding).
    """
    spec = self.spec
    kernel_init, out_init = spec.inits()
    dtype = spec.compute_dtype()
    layerscale = spec.layerscale_init
    out = {}
    x = nn.with_logical_constraint(x, EMBED_AXES)
    out["input"] = x
    post = getattr(spec, "post_norm", False)  # a field of BERTSpec only
    y = x if post else norm_layer(spec, "norm1")(x).astype(x.dtype)
    extra = {} if self.window is None else {"window": self.window}
    y = attention_module(spec, self.laplacian_mask, name="attention", **extra)(
      y,
      mask=mask,
      is_causal=is_causal,
      deterministic=deterministic,
      decode=decode,
      laplacian=laplacian,
      **({} if value_embed is None else {"value_embed": value_embed}),
    )
    if layerscale is not None:
      y = LayerScale(layerscale, name="ls1")(y)
    out["sa"] = y
    x = x + DropPath(self.drop_path)(y, deterministic, drop_path)
    if post:
      x = norm_layer(spec, "norm1")(x).astype(x.dtype)
    out["+sa"] = x
    y = x if post else norm_layer(spec, "norm2")(x).astype(x.dtype)
    y = MLP(
      spec.mlp_dim,
      activation=spec.mlp_activation,
      dropout=spec.dropout,
      use_bias=spec.use_bias,
      dtype=dtype,
      kernel_init=spec.mlp_init(),
      out_init=out_init,
      name="mlp",
    )(y, deterministic)
    if layerscale is not None:
      y = LayerScale(layerscale, name="ls2")(y)
    out["mlp"] = y
    x = x + DropPath(self.drop_path)(y, deterministic, drop_path)
    if post:
      x = norm_layer(spec, "norm2")(x).astype(x.dtype)
    x = nn.with_logical_constraint(x, EMBED_AXES)
    out["+mlp"] = x
    return x, out


def transformer_blocks(
  x: jax.Array, spec: TransformerSpec, *, call: dict | None = None
) -> tuple[jax.Array, dict]:
  """Applies the ``spec.depth`` :class:`Block` s to ``x``, looped or under ``nn.scan``.

  Call it inside a ``@nn.compact`` method: the blocks become the caller's
  submodules, ``block0`` ... ``block{depth-1}``, or with ``spec.scan_layers``
  one module :data:`SCANNED_BLOCKS` whose variables (parameters, and the KV
  cache when decoding) are stacked along a leading layer axis (logical axis
  name ``"layers"``). ``nn.scan`` traces and compiles one block instead of
  ``depth``. What differs between layers goes in as scanned inputs: the
  Laplacian heads of each layer (bool ``[depth, num_heads]``, unless every
  layer has the same) and the drop-path rates (float32 ``[depth]``, unless
  all equal); the parameters are initialised from per-layer RNGs.

  ``spec.remat`` wraps each block in ``nn.remat`` with the named policy
  (:data:`REMAT_POLICIES`); it changes memory and compute, not the values
  nor the parameter names.

  Args:
    x: ``[batch, length, width]``.
    spec: the model's spec (``laplacian`` ``[depth, num_heads]``,
      ``drop_path_rates()``, ``remat``, ``scan_layers``, the block settings).
    call: the Block call's keyword arguments (``mask``, ``is_causal``,
      ``deterministic``, ``decode``); Python values, closed over.

  Returns:
    ``(x [batch, length, width], {"block{i}": Block intermediates})``; with
    ``scan_layers`` the intermediates are slices of the stacked scan outputs.
  """
  call = dict(call or {})
  depth, scan = spec.depth, spec.scan_layers
  policy = REMAT_POLICIES[spec.remat]  # a name the spec has checked
  heads = spec.laplacian_array
  rates = spec.drop_path_rates()

  def body(module, y, *layer):
    return module(y, **call, **(layer[0] if layer else {}))

  if spec.remat != "none":
    body = nn.remat(body, policy=policy, prevent_cse=not scan)

  if not scan:
    outs = {}
    for i in range(depth):
      blk = Block(
        spec, laplacian_mask=tuple(bool(h) for h in heads[i]), drop_path=rates[i], name=f"block{i}"
      )
      x, outs[f"block{i}"] = body(blk, x)
    return x, outs

  static, layer = {}, {}
  if (heads == heads[0]).all():
    static["laplacian_mask"] = tuple(bool(h) for h in heads[0])
  else:
    layer["laplacian"] = jnp.asarray(heads)
  if all(r == rates[0] for r in rates):
    static["drop_path"] = rates[0]
  else:
    layer["drop_path"] = jnp.asarray(rates, jnp.float32)
  scanned = nn.scan(
    body,
    variable_axes={True: 0},
    split_rngs={"params": True, "dropout": True},
    length=depth,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )
  blk = Block(spec, name=SCANNED_BLOCKS, **static)
  x, outs = scanned(blk, x, layer)
  return x, {f"block{i}": jax.tree_util.tree_map(lambda a, i=i: a[i], outs) for i in range(depth)}
