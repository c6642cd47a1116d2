"""What the analysis reads from a laplax model, without a second forward path.

Block outputs ``out["block{i}"]["+mlp"]`` (returned by ViT and GPT anyway), the
attention matrices sown by :class:`laplax.attention.MultiHeadAttention` when
``"intermediates"`` is mutable (only in :func:`analysis_apply`), and each attention
block's input and output (``capture_intermediates``). Looped ``block{i}`` and
scanned (:data:`~laplax.models.layers.SCANNED_BLOCKS`) layouts are both read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax.attention import MultiHeadAttention
from laplax.models import registry
from laplax.models.gpt import GPTSpec
from laplax.models.layers import SCANNED_BLOCKS
from laplax.models.layers import attention_module as block_attention

PROJECTIONS = ("query", "key", "value")


def _layer_tree(tree: dict, layer: int) -> Any:
  """Layer ``layer``'s subtree of a params/intermediates tree (looped or scanned)."""
  if f"block{layer}" in tree:
    return tree[f"block{layer}"]
  if SCANNED_BLOCKS in tree:  # concrete arrays are sliced on the host (nothing to compile)
    return jax.tree_util.tree_map(
      lambda a: a[layer] if isinstance(a, jax.core.Tracer) else np.asarray(a)[layer],
      tree[SCANNED_BLOCKS],
    )
  raise KeyError(
    f"no block{layer} (nor scanned {SCANNED_BLOCKS!r}) in the tree; keys: {', '.join(sorted(tree))}"
  )


def attention_params(params: dict, layer: int) -> dict:
  """The parameters of layer ``layer``'s :class:`MultiHeadAttention` (float32 pytree).

  Raises:
    KeyError: no such layer in ``params``.
  """
  return _layer_tree(nn.meta.unbox(params), layer)["attention"]


def projection_kernels(params: dict, layer: int) -> dict:
  """The raw ``W_Q, W_K, W_V`` of one layer (the forward pass uses ``W + C``).

  Returns ``{"query", "key", "value"}``: float32 NumPy ``[D, heads * d_head]``.

  Raises:
    KeyError: no such layer.
  """
  attn = attention_params(params, layer)
  return {name: np.asarray(attn[name]["kernel"]) for name in PROJECTIONS}


def is_causal(model: nn.Module) -> bool:
  """Whether ``model``'s attention is causal (a GPT's spec) or bidirectional (a ViT)."""
  return isinstance(model.spec, GPTSpec)


def attention_module(model: nn.Module, layer: int):
  """Layer ``layer``'s attention block as a standalone module and its call kwargs.

  Built by :func:`laplax.models.layers.attention_module` with the reference kernel in
  float32: ``module.apply({"params": attention_params(params, layer)}, y, **kwargs)``
  maps the normalised input ``y [batch, T, D]`` to the attention branch. A
  family with its own attention modules builds it (its
  :attr:`~laplax.models.registry.Family.capture`: an XCiT's cross-covariance
  attention, or the class attention whose branch is the class token's
  ``[batch, 1, D]``).

  Returns:
    ``(module, kwargs)``, a :class:`MultiHeadAttention` and the dict of
    ``"is_causal"`` (bool), ``"laplacian"`` (bool ``[heads]``) and
    ``"heads_reason"`` (``None``, or why the per-head Theorem 3.4 section
    does not apply).
  """
  laplacian = model.spec.laplacian_array[layer]
  family = registry.of_spec(model.spec)
  if family is not None and family.capture is not None:
    module, reason = family.capture(model.spec, layer)
    return module, {"is_causal": is_causal(model), "laplacian": laplacian, "heads_reason": reason}
  module = block_attention(model.spec, implementation="reference", dtype=None)
  return module, {"is_causal": is_causal(model), "laplacian": laplacian, "heads_reason": None}


def _capture_filter(module: nn.Module, method_name: str) -> bool:
  # A block's attention is its submodule "attention" (a MultiHeadAttention,
  # or an attention composed of the same parts: DaViT's, XCiT's).
  return method_name == "__call__" and (
    isinstance(module, MultiHeadAttention) or module.name in ("norm1", "attention")
  )


def analysis_apply(
  model: nn.Module, params: Any, inputs: jax.Array, *, capture_blocks: bool = False
):
  """The model's eval forward pass with the attention matrices (and block I/O) recorded.

  Args:
    model: a ViT (also a DINO backbone) or GPT; params: its parameters.
    inputs: images ``[B, H, W, C]`` or tokens ``[B, T]``.
    capture_blocks: also record each attention block's input and output.

  Returns:
    ``(out, intermediates)``: the model's intermediates dict and the
    ``"intermediates"`` collection (:func:`attention_weights`, :func:`block_io`).
  """
  (_, out), state = model.apply(
    {"params": params},
    inputs,
    train=False,
    mutable=["intermediates"],
    capture_intermediates=_capture_filter if capture_blocks else False,
  )
  return out, state["intermediates"]


def attention_weights(intermediates: dict, layer: int) -> jax.Array:
  """Layer ``layer``'s attention matrices ``P``, float32 ``[B, heads, T, T]`` (rows sum to 1).

  Raises:
    KeyError: no such layer.
  """
  return _layer_tree(intermediates, layer)["attention"]["attention_weights"][0]


def block_io(intermediates: dict, layer: int) -> tuple[jax.Array, jax.Array]:
  """``(norm1 output, attention branch)`` of layer ``layer``, each ``[B, T, D]``.

  In the compute dtype; the branch before LayerScale and drop-path.

  Raises:
    KeyError: no such layer, or the blocks were not captured.
  """
  tree = _layer_tree(intermediates, layer)
  return tree["norm1"]["__call__"][0], tree["attention"]["__call__"][0]


def head_outputs(intermediates: dict, layer: int) -> jax.Array:
  """Layer ``layer``'s per-head attention outputs before ``W_O``, as sown by
  ``MultiHeadAttention``: ``[B, T, heads, head_dim]`` in the compute dtype.

  Raises:
    KeyError: no such layer.
  """
  return _layer_tree(intermediates, layer)["attention"]["head_outputs"][0]


def head_out_kernels(params: dict, layer: int, num_heads: int) -> jax.Array:
  """``W_O``'s rows per head times LayerScale's ``gamma``, float32 ``[heads, head_dim, D]``.

  Head ``h`` adds ``o_h @ result[h]`` to the residual stream (besides the bias).

  Raises:
    KeyError: no such layer.
  """
  block = _layer_tree(nn.meta.unbox(params), layer)
  kernel = jnp.asarray(block["attention"]["out"]["kernel"], jnp.float32)
  kernel = kernel.reshape(num_heads, kernel.shape[0] // num_heads, kernel.shape[1])
  if "ls1" in block:
    kernel = kernel * jnp.asarray(block["ls1"]["scale"], jnp.float32)
  return kernel


def block_outputs(out: dict, layers: Sequence[int]) -> dict:
  """``{layer: out["block{layer}"]["+mlp"]}``, each ``[B, T, D]`` in the compute dtype.

  ViT: class token first when ``pool == "tok"``.

  Raises:
    KeyError: a layer the model does not have.
  """
  return {i: out[f"block{i}"]["+mlp"] for i in layers}
