"""The typed model spec: one frozen description of a model, from config to kernel.

:func:`from_config` builds it once from ``config.model``; every model module
(:class:`~laplax.models.vit.ViT`, :class:`~laplax.models.gpt.GPT`, the DINO
backbone, :class:`~laplax.models.layers.Block`) takes it whole, and the
analysis reads it from the model (``model.spec``). An option is a field here
and the lines that read it (the idea of the Flax lm1b example's
``TransformerConfig`` and nanoGPT's ``GPTConfig``).

* :class:`SpectralSpec` (:class:`laplax.spectral.SpectralSpec`): ``lambda *
  I_k`` / SVD conditioning of ``W_Q, W_K, W_V`` (Saratchandran & Lucey 2025,
  Theorems 3.5 and 3.8).
* :class:`AttentionSpec`: what every layer's
  :class:`~laplax.attention.MultiHeadAttention` shares; its field names are
  attribute names of that module, passed on as they are.
* :class:`TransformerSpec`: what every family shares: sizes, the Laplacian
  heads resolved into one bool array ``[depth, num_heads]`` (Zhang & Papyan
  2026: the last ``k`` heads of a layer by default), and the model-level
  switches.

Each family's spec subclasses :class:`TransformerSpec` in the family's own
module (``laplax.models.vit.ViTSpec``, ``laplax.models.gpt.GPTSpec``, ...),
found by ``config.model.name`` through :mod:`laplax.models.registry`
(:data:`FAMILIES`).

Validation is derived from the fields: each field's metadata gives its config
key, type and range, and ``__post_init__`` checks them and the consistency
(heads vs width, Laplacian heads vs heads, rotary head size) with one-line
messages. The config defaults of the model section
(:func:`config_defaults`) come from the same fields.

What each converter can express of these fields is the converter's own
table (:mod:`laplax.convert.support`); a field a converter does not list
supports its default alone there, so a new field is refused by every
converter until its table lists it. The fields' metadata says only what is
the field's own: its config key, whether it is nested, derived from another
field or active only with a switch, and which options a conversion from
another framework resets (``source``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from laplax import attention, rotary, spectral
from laplax.errors import UserError
from laplax.kernels import nystrom, splash
from laplax.models import registry

DTYPES = ("float32", "bfloat16")
# Rematerialisation of each block (``model.remat``): name -> jax.checkpoint
# policy. "full" saves nothing inside a block (recomputes all of it in the
# backward pass); the others save the matmul outputs (all of them, or only
# those without batch dimensions, i.e. not attention's QK^T and PV).
REMAT_POLICIES = {
  "none": None,
  "full": None,
  "dots_saveable": jax.checkpoint_policies.dots_saveable,
  "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Initialisers (``TransformerSpec.inits``; a GPT's ``model.kernel_init``):
# "nanochat" is nanochat/gpt.py's ``init_weights`` (:func:`nanochat_normal`).
# "normal": normal 0.02 for every matrix (BERT, Devlin et al. 2019; cramming's
# ``init.type: normal``).
# "nanochat-fork" is the Laplacian authors' nanochat fork's (yuchongzhang/nanochat
# 1f70b557, nanochat/gpt.py ``init_weights``: :func:`nanochat_uniform`).
KERNEL_INITS = ("xavier_uniform", "gpt2", "nanochat", "normal", "nanochat-fork")
# ``model.norm``: the blocks' and final norms. "rmsnorm" is parameter-free
# (nanochat/gpt.py's ``norm``); "layernorm" is Flax's learnable LayerNorm.
NORMS = ("layernorm", "rmsnorm")
# ``model.mlp_activation``: "gelu" (Flax's default tanh approximation, GPT-2's
# ``gelu_new``), "gelu_exact" (the erf form, PyTorch's ``nn.GELU()`` that timm's
# ViTs use), "relu2" (ReLU squared, nanochat/gpt.py's MLP) or "gelu_glu" (the
# gated GELU of cramming's ``nonlin: GELUglu``: the first layer's output split
# in halves ``x, gate``, ``gelu_exact(gate) * x``, so the second layer reads
# ``mlp_dim // 2``).
MLP_ACTIVATIONS = ("gelu", "gelu_exact", "relu2", "gelu_glu")
# ``model.qk_norm_type``: the qk-norm's kind when ``model.qk_norm`` is on.
QK_NORM_TYPES = attention.QK_NORM_TYPES


def nanochat_normal(key, shape, dtype=np.float32):
  """nanochat/gpt.py's ``_init_weights`` of a linear layer (arXiv 2310.17813):
  normal with std ``min(1, sqrt(fan_out / fan_in)) / sqrt(fan_in)``.

  ``shape`` is a Flax kernel's ``[..., fan_in, fan_out]`` (PyTorch's
  ``weight`` is ``[fan_out, fan_in]``); for d20's ``W_Q, W_K, W_V`` and MLP
  input layer the std is ``1 / sqrt(1280) = 0.02795``. Returns ``dtype``.
  """
  fan_in, fan_out = shape[-2], shape[-1]
  std = min(1.0, (fan_out / fan_in) ** 0.5) / fan_in**0.5
  return std * jax.random.normal(key, shape, dtype)


def nanochat_uniform(scale: float = 1.0):
  """The fork's block initialiser (yuchongzhang/nanochat 1f70b557, nanochat/gpt.py
  ``init_weights``): uniform on ``+-scale * sqrt(3 / fan_in)`` (the std of
  ``N(0, 1 / fan_in)``; ``scale`` 0.4 for the MLP's first layer).

  Returns an initialiser of a Flax kernel ``[..., fan_in, fan_out]`` (dtype as asked).
  """

  def init(key, shape, dtype=np.float32):
    bound = scale * (3.0 / shape[-2]) ** 0.5
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


class SpecError(UserError, ValueError):
  """A model setting that cannot be built; one line ``model.KEY=...: the fix``."""


def spec_field(default, check: str, key: str | None = None, **rules):
  """A spec field whose metadata says how to validate it and its config key."""
  return dataclasses.field(default=default, metadata=dict(rules, check=check, key=key))


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
    v, (bool, np.bool_)
  )


def check_value(key: str, value: Any, meta: Mapping) -> None:
  """Raises :class:`SpecError` when ``value`` breaks the field's ``meta`` rules."""
  check = meta["check"]
  if check == "int":
    minimum = meta.get("min", 0)
    if not (_is_int(value) and value >= minimum):
      raise SpecError(f"model.{key}={value!r} must be an integer >= {minimum}")
  elif check == "float":
    lo, hi, open_min = meta.get("min", 0.0), meta.get("max", math.inf), meta.get("open_min")
    ok = _is_number(value) and math.isfinite(value)
    ok = ok and (value > lo if open_min else value >= lo) and value <= hi
    if not ok:
      bound = (f"> {lo}" if open_min else f">= {lo}") + (f" and <= {hi}" if hi != math.inf else "")
      raise SpecError(f"model.{key}={value!r} must be a finite number {bound}")
  elif check == "bool":
    if not isinstance(value, (bool, np.bool_)):
      raise SpecError(f"model.{key}={value!r} must be True or False")
  elif check == "targets":
    try:
      spectral.check_targets(value)
    except ValueError:
      raise SpecError(
        f"model.{key}={value!r} must be distinct letters of 'qkv' (e.g. 'qkv', 'q', 'qk', 'v')"
      ) from None
  elif check == "ints":
    ok = isinstance(value, (list, tuple)) and len(value) > 0
    if not (ok and all(_is_int(v) and v >= meta.get("min", 1) for v in value)):
      raise SpecError(
        f"model.{key}={value!r} must be a non-empty tuple of integers >= {meta.get('min', 1)}, "
        f"e.g. (2, 2, 6, 2)"
      )
  elif check == "pattern":
    if not (isinstance(value, str) and value and set(value) <= {"S", "L"}):
      raise SpecError(
        f"model.{key}={value!r} must be a string of the letters S (short window) and "
        f"L (full context), e.g. 'SSSL', or None"
      )
  elif check == "choice":
    choices = meta["choices"]
    if not (value is None or isinstance(value, str)) or value not in choices:
      shown = ", ".join("None" if c is None else repr(c) for c in choices)
      raise SpecError(f"model.{key}={value!r} is unknown; use one of {shown}")


def check_fields(node) -> None:
  """Checks every field of the dataclass ``node`` that carries ``check``
  metadata (a spec or a sub-spec), naming its config key.

  Raises:
    SpecError: the first bad value, one line ``model.KEY=...``.
  """
  for f in dataclasses.fields(node):
    if "check" not in f.metadata:
      continue
    value = getattr(node, f.name)
    if value is None and f.metadata.get("optional"):
      continue
    check_value(f.metadata["key"] or f.name, value, f.metadata)


class _Checked:
  """Validates every field that carries ``check`` metadata in ``__post_init__``."""

  def __post_init__(self):
    check_fields(self)


#: The conditioning of ``W_Q, W_K, W_V``: the ``spectral`` sub-spec,
#: defined beside the code that reads it (:class:`laplax.spectral.SpectralSpec`).
SpectralSpec = spectral.SpectralSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionSpec(_Checked):
  """Settings every layer's :class:`~laplax.attention.MultiHeadAttention` shares.

  The kernel options are nested sub-specs, each defined beside the code that
  reads it and passed whole, under the same name, from here through
  :class:`~laplax.attention.MultiHeadAttention` to the attention parts and
  the kernel: ``qk_norm`` (:class:`laplax.attention.QKNormSpec`), ``rope``
  (:class:`laplax.rotary.RotarySpec`), ``nystrom``
  (:class:`laplax.kernels.nystrom.NystromSpec`) and ``spectral``
  (:class:`SpectralSpec`). Their fields keep their config keys
  (``model.qk_norm_type``, ``model.rope_theta``, ``model.num_landmarks``,
  ...; :func:`from_config`), and their checks name them.

  Attributes:
    num_heads: heads per layer.
    qk_norm: normalise queries and keys over ``head_dim`` (DeiT-3 recipe):
      the :class:`~laplax.attention.QKNormSpec` (``model.qk_norm_type``:
      ``"layernorm"``, learnable, DeiT-3, or ``"rmsnorm"``, parameter-free,
      nanochat/gpt.py); ``None`` = off (``model.qk_norm=False``).
    qk_scale: constant factor on queries and on keys after the qk-norm
      (1.2 in a later nanochat: logits ``1.44 q.k / sqrt(head_dim)``; 1.0 in
      its first release); applied with or without the qk-norm, so a field
      of its own.
    attention_dropout: dropout on ``P`` (forces the reference kernel).
    implementation: the kernel of :func:`laplax.attention.attend` (``None``:
      chosen by platform and shape, :mod:`laplax.kernels`; ``"splash"``
      refuses attention dropout here and lengths that are not multiples of
      128 where the length is known: :func:`check_splash_lengths`).
    xla_keep_probs: whether the XLA kernel keeps the float32 ``P`` for its
      backward pass (``None``: on a CPU only; True or False everywhere, e.g.
      ``bench/compile_report.py --xla-keeps-p``); memory and time, never values.
    rope: rotary position embedding on queries and keys, the
      :class:`~laplax.rotary.RotarySpec` (``model.rope_theta``: the base,
      10,000 as nanochat's first release, a later nanochat uses 100,000;
      ``model.rope_style``: ``"roformer"`` or ``"nanochat"``, ``-angle``,
      bfloat16 table, before the qk-norm); ``None`` = off (derived from
      ``model.posemb == "rope"``).
    laplacian_mix: ``"fixed"`` (the heads of ``laplacian`` use ``I - P``) or
      ``"learned"`` (a learned ``alpha`` per head and layer, initialised at
      that pattern; see :class:`~laplax.attention.MultiHeadAttention`).
    spectral: the conditioning of ``W_Q, W_K, W_V`` (``None`` = off).
    nystrom: ``implementation="nystrom"``'s options, the
      :class:`~laplax.kernels.nystrom.NystromSpec` (``model.num_landmarks``,
      ``pinv_iterations``, ``pinv_init``, ``nystrom_padding``,
      ``conv_kernel_size``: the convolution skip of the values, ``None`` =
      none); no attention dropout there (neither Hugging Face's
      Nystromformer nor the authors' code has one).
  """

  num_heads: int = spec_field(4, "int", min=1)
  qk_norm: attention.QKNormSpec | None = dataclasses.field(
    default=None,
    metadata={"key": "qk_norm", "nested": attention.QKNormSpec, "switch": True},
  )
  qk_scale: float = spec_field(1.0, "float", open_min=True)
  attention_dropout: float = spec_field(0.0, "float", max=0.99)
  implementation: str | None = spec_field(None, "choice", choices=attention.IMPLEMENTATIONS)
  xla_keep_probs: bool | None = spec_field(None, "bool", optional=True)
  rope: rotary.RotarySpec | None = dataclasses.field(
    default=None,
    metadata={"derived": "posemb", "when": "rope", "nested": rotary.RotarySpec},
  )
  laplacian_mix: str = spec_field(
    "fixed",
    "choice",
    choices=attention.LAPLACIAN_MIXES,
    source=True,
  )
  spectral: SpectralSpec | None = dataclasses.field(
    default=None,
    metadata={
      "key": "spectral.enabled",
      "source": {"spectral.enabled": False},
      "show": lambda v: repr(v is not None),
    },
  )
  nystrom: nystrom.NystromSpec = dataclasses.field(
    default_factory=nystrom.NystromSpec,
    metadata={"nested": nystrom.NystromSpec, "active": "implementation"},
  )

  def __post_init__(self):
    super().__post_init__()
    if self.spectral is not None:
      check_fields(self.spectral)
    for f in dataclasses.fields(self):
      sub, value = f.metadata.get("nested"), getattr(self, f.name)
      if sub is None or value is None:
        continue
      if not isinstance(value, sub):
        raise SpecError(
          f"AttentionSpec.{f.name}={value!r} must be a {sub.__name__} or None "
          f"(build the spec with laplax.models.spec.from_config)"
        )
      check_fields(value)
    if self.implementation == "nystrom" and self.attention_dropout > 0:
      raise SpecError(
        f"model.implementation='nystrom' has no attention dropout "
        f"(model.attention_dropout={self.attention_dropout}); set model.attention_dropout=0"
      )
    conv = self.nystrom.conv_kernel_size
    if conv is not None and conv % 2 == 0:
      raise SpecError(f"model.conv_kernel_size={conv} must be odd (a 'same' convolution)")
    if self.implementation == "splash" and self.attention_dropout > 0:
      raise SpecError(
        f"model.implementation='splash' has no attention dropout "
        f"(model.attention_dropout={self.attention_dropout}); set "
        f"model.attention_dropout=0 or model.implementation='xla'"
      )

  @property
  def spectral_lam(self) -> float | None:
    """``spectral.lam``, ``None`` when the conditioning is off (the name the
    attention parts, :mod:`laplax.attention`, read)."""
    return None if self.spectral is None else self.spectral.lam

  @property
  def spectral_mode(self) -> str:
    """``spectral.mode`` (``laplax.spectral.DEFAULT_MODE`` when off)."""
    return spectral.DEFAULT_MODE if self.spectral is None else self.spectral.mode

  @property
  def spectral_targets(self) -> str:
    """``spectral.targets`` (``laplax.spectral.TARGETS``, all three, when off)."""
    return spectral.TARGETS if self.spectral is None else self.spectral.targets


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerSpec(_Checked):
  """What ViT and GPT share: sizes, Laplacian heads, attention and memory settings.

  Attributes:
    width, depth, mlp_dim: residual width, blocks, MLP hidden size.
    attention: the :class:`AttentionSpec` of every layer.
    laplacian: bool ``[depth, num_heads]`` as nested tuples (hashable, so a
      model with a spec can be a ``jit`` static argument): True = that head
      of that layer uses ``I - P``. Use :attr:`laplacian_array`.
    dropout: dropout on the residual branches and embeddings.
    layerscale_init: LayerScale's initial value on both residual branches
      (``None``: no LayerScale; CaiT, Touvron et al. 2021; 1e-6 in DeiT-3).
    use_bias: biases in the attention and MLP projections.
    dtype: compute dtype name (parameters stay float32).
    remat: ``jax.checkpoint`` policy name of each block (memory only).
    scan_layers: blocks under ``nn.scan`` (parameters stacked under
      ``blocks``; another checkpoint layout).
    zero_init_out: zero-initialised output projections of every block
      (``W_O`` and the MLP's second layer), as in the Laplacian authors'
      nanochat: each block starts as the identity, so Laplacian heads are a
      no-op at initialisation; the gradient still reaches ``W_O``.
    kernel_init: ``"xavier_uniform"`` (ViT), ``"gpt2"`` (normal 0.02, output
      projections ``0.02 / sqrt(2 depth)``, Radford et al. 2019) or
      ``"normal"`` (normal 0.02 everywhere: BERT, cramming).
    norm: the blocks' and the final norm, :data:`NORMS` (``"rmsnorm"`` has
      no parameters: nanochat/gpt.py).
    mlp_activation: the MLP's nonlinearity, :data:`MLP_ACTIVATIONS`.
    norm_eps: the ``epsilon`` of the blocks' and the final LayerNorm (1e-6,
      Flax's default and timm's ViTs'; GPT-2 uses 1e-5).
  """

  width: int = spec_field(128, "int", min=1)
  depth: int = spec_field(4, "int", min=1)
  mlp_dim: int = spec_field(
    256,
    "int",
    min=1,
  )
  attention: AttentionSpec = dataclasses.field(
    default_factory=AttentionSpec, metadata={"nested": True}
  )
  laplacian: tuple = dataclasses.field(
    default=(),
    metadata={
      "key": "laplacian_mask",
      "plain": lambda v: not np.any(v),
      "source": {"num_laplacian_heads": 0, "laplacian_mask": None},
      "show": lambda v: repr([list(row) for row in v]),
    },
  )
  dropout: float = spec_field(0.0, "float", max=0.99)
  layerscale_init: float | None = spec_field(None, "float", optional=True)
  use_bias: bool = spec_field(
    True,
    "bool",
  )
  dtype: str = spec_field("float32", "choice", choices=DTYPES, source=True)
  remat: str = spec_field("none", "choice", choices=tuple(REMAT_POLICIES))
  scan_layers: bool = spec_field(False, "bool")
  zero_init_out: bool = spec_field(False, "bool")
  kernel_init: str = "xavier_uniform"
  norm: str = spec_field("layernorm", "choice", choices=NORMS)
  mlp_activation: str = spec_field(
    "gelu",
    "choice",
    choices=MLP_ACTIVATIONS,
  )
  norm_eps: float = spec_field(
    1e-6,
    "float",
    open_min=True,
    max=1.0,
  )

  def __post_init__(self):
    super().__post_init__()
    heads = self.attention.num_heads
    if self.width % heads:
      raise SpecError(
        f"model.width={self.width} is not divisible by model.num_heads={heads}; "
        f"choose num_heads dividing the width"
      )
    layer_heads = self.layer_heads()
    if not self.laplacian:
      object.__setattr__(self, "laplacian", tuple((False,) * h for h in layer_heads))
    try:
      rows = [len(row) for row in self.laplacian]
    except TypeError:  # not a sequence of rows
      rows = []
    if rows != list(layer_heads):
      want = (
        f"(depth, num_heads)=({self.depth}, {heads})"
        if len(set(layer_heads)) == 1
        else f"one row per layer of its heads {list(layer_heads)}"
      )
      raise SpecError(f"model laplacian heads have rows of {rows} heads; expected {want}")
    object.__setattr__(
      self, "laplacian", tuple(tuple(bool(h) for h in row) for row in self.laplacian)
    )
    if self.kernel_init not in KERNEL_INITS:
      raise SpecError(
        f"kernel_init={self.kernel_init!r} is unknown; use one of {', '.join(KERNEL_INITS)}"
      )
    if self.mlp_activation == "gelu_glu" and self.mlp_dim % 2:
      raise SpecError(
        f"model.mlp_dim={self.mlp_dim} must be even with model.mlp_activation='gelu_glu' "
        f"(its halves are the value and the gate); choose an even mlp_dim"
      )
    if self.attention.rope is not None and self.head_dim % 2:
      raise SpecError(
        f"rotary position encoding needs an even head_dim, got "
        f"{self.head_dim}; change model.width or model.num_heads"
      )

  @property
  def num_heads(self) -> int:
    """Heads per layer (``attention.num_heads``)."""
    return self.attention.num_heads

  @property
  def head_dim(self) -> int:
    """``width // num_heads``."""
    return self.width // self.attention.num_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads per layer: a GPT's ``num_kv_heads`` unless ``None``, else ``num_heads``."""
    return getattr(self, "num_kv_heads", None) or self.attention.num_heads

  def layer_heads(self) -> tuple[int, ...]:
    """Heads of each layer (``num_heads`` in every one here; Swin's stages differ)."""
    return (self.attention.num_heads,) * self.depth

  @property
  def laplacian_array(self) -> np.ndarray:
    """The Laplacian heads, bool ``[depth, max heads]`` (a layer with fewer
    heads, a later Swin stage's first, is padded with False)."""
    width = max(self.layer_heads())
    out = np.zeros((self.depth, width), bool)
    for i, row in enumerate(self.laplacian):
      out[i, : len(row)] = row
    return out

  def compute_dtype(self):
    """The jnp dtype of the matmuls (``None`` for float32: the input's dtype)."""
    import jax.numpy as jnp

    return None if self.dtype == "float32" else jnp.dtype(self.dtype)

  def drop_path_rates(self) -> tuple[float, ...]:
    """Per-layer stochastic-depth rates (0 unless the family has drop-path)."""
    return (0.0,) * self.depth

  def inits(self):
    """``(kernel_init, out_init)``: initialisers of the input projections
    (``W_Q, W_K, W_V``, the MLP's first layer) and of the output projections
    (``W_O``, the MLP's second layer; zeros with ``zero_init_out``)."""
    import flax.linen as nn

    if self.kernel_init == "gpt2":
      kernel_init = nn.initializers.normal(0.02)
      out_init = nn.initializers.normal(0.02 / (2 * self.depth) ** 0.5)
    elif self.kernel_init == "nanochat":
      kernel_init = out_init = nanochat_normal
    elif self.kernel_init == "normal":
      kernel_init = out_init = nn.initializers.normal(0.02)
    elif self.kernel_init == "nanochat-fork":  # its c_proj are zeros whatever zero_init_out
      return nanochat_uniform(1.0), nn.initializers.zeros
    else:
      kernel_init = out_init = nn.initializers.xavier_uniform()
    return kernel_init, nn.initializers.zeros if self.zero_init_out else out_init

  def mlp_init(self):
    """The initialiser of the MLP's first layer: :meth:`inits`' first, but
    ``nanochat_uniform(0.4)`` with ``kernel_init="nanochat-fork"`` (the fork's c_fc)."""
    if self.kernel_init == "nanochat-fork":
      return nanochat_uniform(0.4)
    return self.inits()[0]


def patch_grid(height: int, width: int, patch_size: int) -> tuple[int, int]:
  """The ViT's grid of patches of a ``height x width`` image,
  ``(height // patch_size, width // patch_size)``: the one statement of the
  rule that the patch size divides the image. The model applies it to its
  input (:class:`laplax.models.vit.ViT`); the config checks
  (:func:`laplax.config.validation.check_patches`, the multi-crop views) to
  their sizes, naming the key to change.

  Raises:
    SpecError: ``height`` or ``width`` is not divisible by ``patch_size``.
  """
  if height % patch_size or width % patch_size:
    raise SpecError(f"image size {height}x{width} is not divisible by patch_size={patch_size}")
  return height // patch_size, width // patch_size


def check_splash_lengths(spec: TransformerSpec, lengths) -> None:
  """Refuses ``model.implementation='splash'`` for token counts ``lengths``
  its blocks do not divide (:func:`laplax.kernels.splash.unsupported`).

  Raises:
    SpecError: one line naming the count and the fix.
  """
  if spec.attention.implementation != "splash":
    return
  for n in lengths:
    if n % splash.BLOCK:
      raise SpecError(
        f"model.implementation='splash' needs token counts that are "
        f"multiples of {splash.BLOCK}, but the attention sees {n} "
        f"tokens; use model.implementation='xla' (or None: XLA "
        f"where splash does not fit) or change the length"
      )


def laplacian_mask(
  num_heads: int,
  depth: int,
  num_laplacian_heads: Any = 0,
  mask: Sequence[Sequence[bool]] | None = None,
) -> np.ndarray:
  """Resolves the config's Laplacian-head conveniences into bool ``[depth, num_heads]``.

  Args:
    num_heads, depth: heads per layer and layers.
    num_laplacian_heads: an int ``k`` (the last ``k`` heads of every layer, as
      in the reference runs: "ViT-S-5L" = 5 of 6) or one count per layer.
    mask: explicit per-layer lists of per-head booleans (overrides the counts).

  Raises:
    SpecError: counts outside ``0..num_heads``, lists of the wrong length, or
      a mask that is not ``depth`` lists of ``num_heads`` booleans.
  """
  counts = (
    list(num_laplacian_heads)
    if isinstance(num_laplacian_heads, (list, tuple))
    else [num_laplacian_heads] * depth
  )
  if len(counts) != depth:
    raise SpecError(
      f"model.num_laplacian_heads has {len(counts)} entries but model.depth={depth}; "
      f"give one count per layer or a single int"
    )
  for k in counts:
    if not (_is_int(k) and 0 <= k <= num_heads):
      raise SpecError(
        f"model.num_laplacian_heads={num_laplacian_heads!r} must be in "
        f"0..num_heads={num_heads} (the last k heads of a layer are Laplacian)"
      )
  if mask is not None:
    if not (
      isinstance(mask, (list, tuple))
      and len(mask) == depth
      and all(
        isinstance(row, (list, tuple))
        and len(row) == num_heads
        and all(isinstance(v, (bool, np.bool_)) for v in row)
        for row in mask
      )
    ):
      raise SpecError(
        f"model.laplacian_mask must be depth={depth} lists of "
        f"num_heads={num_heads} booleans True/False (one per layer and head)"
      )
    return np.asarray(mask, dtype=bool)
  return np.stack([attention.laplacian_heads(num_heads, int(k)) for k in counts])


def layer_laplacian(
  layer_heads: Sequence[int], num_laplacian_heads: Any = 0, mask: Sequence | None = None
) -> tuple[tuple[bool, ...], ...]:
  """:func:`laplacian_mask` for layers with different head counts (Swin's
  stages): the last ``k`` heads of every layer (``k`` at most the fewest
  heads of a layer), one count per layer, or a mask of one row per layer of
  that layer's heads.

  Raises:
    SpecError: as :func:`laplacian_mask`, naming the layer's heads.
  """
  depth = len(layer_heads)
  counts = (
    list(num_laplacian_heads)
    if isinstance(num_laplacian_heads, (list, tuple))
    else [num_laplacian_heads] * depth
  )
  if len(counts) != depth:
    raise SpecError(
      f"model.num_laplacian_heads has {len(counts)} entries but the model has {depth} "
      f"layers; give one count per layer or a single int"
    )
  for k, h in zip(counts, layer_heads):
    if not (_is_int(k) and 0 <= k <= h):
      raise SpecError(
        f"model.num_laplacian_heads={num_laplacian_heads!r} must be in 0..{min(layer_heads)} "
        f"(the heads of the layer with fewest; the last k heads of a layer are Laplacian)"
      )
  if mask is not None:
    ok = isinstance(mask, (list, tuple)) and len(mask) == depth
    ok = ok and all(
      isinstance(row, (list, tuple))
      and len(row) == h
      and all(isinstance(v, (bool, np.bool_)) for v in row)
      for row, h in zip(mask, layer_heads)
    )
    if not ok:
      raise SpecError(
        f"model.laplacian_mask must be one list per layer of that layer's heads "
        f"{list(layer_heads)}, booleans True/False"
      )
    return tuple(tuple(bool(v) for v in row) for row in mask)
  return tuple(
    tuple(bool(v) for v in attention.laplacian_heads(h, int(k)))
    for h, k in zip(layer_heads, counts)
  )


class _SpecClasses(Mapping):
  """``{config.model.name: spec class}`` of every family, read from
  :mod:`laplax.models.registry` when asked (so a family registered later is in it)."""

  def __getitem__(self, name: str) -> type:
    return registry.get(name).spec

  def __iter__(self):
    return iter(registry.families())

  def __len__(self) -> int:
    return len(registry.families())


#: Model family (``config.model.name``) -> its spec class (:mod:`laplax.models.registry`).
FAMILIES: Mapping[str, type] = _SpecClasses()


def __getattr__(name: str) -> type:
  """A family's spec class by its class name (``spec.ViTSpec``: the name it
  had here before the specs moved to their families' modules).

  Raises:
    AttributeError: no family's spec class has that name.
  """
  if name.startswith("_") or not name.endswith("Spec"):  # ``__path__``: asked while importing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  for family in registry.families().values():
    if family.spec.__name__ == name:
      return family.spec
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: A sub-spec's switch (metadata ``switch``: ``model.qk_norm``): a bool config
#: key whose value is whether the sub-spec is attached.
_SWITCH = {"check": "bool"}


def _spec_fields(cls) -> dict:
  """``{config key: (default, metadata)}`` of a spec class and its nested
  specs, in field order: the family's fields, the :class:`AttentionSpec`'s
  with its sub-specs' fields in place (a sub-spec's ``switch`` key first),
  then the ``spectral`` section's."""
  out = {}

  def add(owner):
    for f in dataclasses.fields(owner):
      sub = f.metadata.get("nested")
      if isinstance(sub, type):  # a sub-spec: its fields under their own keys
        if f.metadata.get("switch"):
          out[f.metadata["key"]] = (False, _SWITCH)
        add(sub)
      elif "check" in f.metadata:
        out[f.metadata["key"] or f.name] = (f.default, f.metadata)

  for owner in (cls, AttentionSpec, SpectralSpec):
    add(owner)
  return out


def _sub_spec(f: dataclasses.Field, values: dict):
  """The sub-spec of :class:`AttentionSpec` field ``f`` (metadata ``nested``)
  from the config ``values`` (its keys popped), checked whether attached or
  not, or ``None`` where its switch (``qk_norm``) or the field it derives
  from (``posemb``) turns it off."""
  sub = f.metadata["nested"]
  built = sub(
    **{
      g.name: values.pop(g.metadata["key"] or g.name)
      for g in dataclasses.fields(sub)
      if "check" in g.metadata
    }
  )
  check_fields(built)
  if f.metadata.get("switch"):
    on = values.pop(f.metadata["key"])
    check_value(f.metadata["key"], on, _SWITCH)
  elif f.metadata.get("derived"):
    on = values.get(f.metadata["derived"]) == f.metadata["when"]
  else:
    on = True
  return built if on else None


def from_config(model: Mapping) -> TransformerSpec:
  """The spec of a ``config.model`` section (a ConfigDict or a plain dict):
  an instance of the spec class of family ``model.name`` (:data:`FAMILIES`).

  Keys the section lacks take the fields' defaults (configs of runs saved
  before a field existed). ``spectral.enabled`` decides whether the
  :class:`SpectralSpec` is attached, ``qk_norm`` the qk-norm's sub-spec,
  ``posemb == "rope"`` the rotary's; their fields are checked either way.
  ``mlp_dim`` ``None`` means ``4 * width``.

  Raises:
    SpecError: an unknown ``name`` (family) or the first bad value, as one line
      ``model.KEY=...`` with the fix.
  """
  get = lambda key, default=None: model.get(key, default) if hasattr(model, "get") else default
  cls = FAMILIES.get(get("name", "vit"))
  if cls is None:
    raise SpecError(f"model.name={get('name')!r} is unknown; use one of {', '.join(FAMILIES)}")
  values = {}
  for key, (default, _) in _spec_fields(cls).items():
    node, leaf = model, key
    if "." in key:
      section, leaf = key.split(".", 1)
      node = get(section) or {}
    values[key] = node.get(leaf, default) if hasattr(node, "get") else default
  if values.get("mlp_dim") is None:
    values["mlp_dim"] = 4 * values["width"] if _is_int(values["width"]) else None
  sp = get("spectral") or {}
  enabled = sp.get("enabled", False) if hasattr(sp, "get") else False
  check_value("spectral.enabled", enabled, {"check": "bool"})
  spectral_spec = SpectralSpec(
    lam=values.pop("spectral.lam"),
    mode=values.pop("spectral.mode"),
    targets=values.pop("spectral.targets"),
  )
  check_fields(spectral_spec)
  check_value("num_heads", values["num_heads"], {"check": "int", "min": 1})
  for key in ("width", "depth"):
    check_value(key, values[key], {"check": "int", "min": 1})
  attn = {}
  for f in dataclasses.fields(AttentionSpec):
    if isinstance(f.metadata.get("nested"), type):
      attn[f.name] = _sub_spec(f, values)
    elif "check" in f.metadata:
      attn[f.name] = values.pop(f.metadata["key"] or f.name)
  attention_spec = AttentionSpec(**attn, spectral=spectral_spec if enabled else None)
  plain = cls(attention=attention_spec, **values)
  layer_heads = plain.layer_heads()
  counts, mask = get("num_laplacian_heads", 0), get("laplacian_mask", None)
  if len(set(layer_heads)) == 1:
    heads = laplacian_mask(attn["num_heads"], values["depth"], counts, mask)
  else:
    heads = layer_laplacian(layer_heads, counts, mask)
  return dataclasses.replace(plain, laplacian=tuple(map(tuple, heads)))


def build(name: str = "vit", **model_keys) -> TransformerSpec:
  """:func:`from_config` of ``{"name": name, **model_keys}``, for notebooks and tests.

  Example: ``build("vit", width=64, depth=2, num_heads=2, num_laplacian_heads=1)``.
  ``spectral`` may be a dict ``{"enabled", "lam", "mode", "targets"}``.

  Raises:
    SpecError: as :func:`from_config`.
  """
  return from_config({"name": name, **model_keys})


def config_defaults(name: str) -> dict:
  """The model section's config defaults of family ``name``, from the spec fields.

  Returns ``{config key: default}`` with the nested ``spectral`` section
  (``enabled`` False) and the Laplacian-head conveniences
  (``num_laplacian_heads`` 0, ``laplacian_mask`` None), in field order.
  A sub-spec's fields are keys of the section itself (``qk_norm`` its
  switch, False; ``qk_norm_type``, ``rope_theta``, ``num_landmarks``, ...).
  Derived fields (``rope``: ``posemb == "rope"``) and fields without a
  config key (``kernel_init``: the family's) are not in it.
  """
  cls = FAMILIES[name]
  out: dict = {"name": name}
  for key, (value, _) in _spec_fields(cls).items():
    if "." in key:
      section, leaf = key.split(".", 1)
      out.setdefault(section, {"enabled": False})[leaf] = value
    else:
      out[key] = value
  out["num_laplacian_heads"] = 0
  out["laplacian_mask"] = None
  return out


def field_type(name: str, key: str):
  """The Python type a config key of family ``name`` holds (for None defaults)."""
  for k, (_, meta) in _spec_fields(FAMILIES[name]).items():
    if k == key:
      return {"int": int, "float": float, "bool": bool}.get(meta["check"], str)
  raise KeyError(key)
