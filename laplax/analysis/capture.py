"""What the analysis reads from a laplax model, without a second forward path.

* Token representations per layer: the block outputs ``out["block{i}"]["+mlp"]``
  that :class:`~laplax.models.vit.ViT` and :class:`~laplax.models.gpt.GPT`
  already return (the big_vision convention); under ``jit`` the training step
  ignores them, so they cost nothing there.
* Attention matrices ``P``: sown by :class:`laplax.attention.MultiHeadAttention`
  as ``"attention_weights"`` only when the ``"intermediates"`` collection is
  mutable, i.e. only in :func:`analysis_apply`.
* Each attention block's input (the output of the block's ``norm1``) and
  output, by Flax's ``capture_intermediates`` filtered to those modules.

Layers are stored as ``block{i}`` submodules, or stacked along a leading axis
under :data:`~laplax.models.layers.SCANNED_BLOCKS` with ``scan_layers``; the
helpers here read both layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax.attention import MultiHeadAttention
from laplax.models.layers import SCANNED_BLOCKS
from laplax.models.layers import attention_module as block_attention
from laplax.models.spec import GPTSpec

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
  """The raw ``W_Q, W_K, W_V`` of one layer.

  These are the trained parameters; the forward pass multiplies by ``W + C``
  when spectral conditioning is on (Saratchandran & Lucey, Theorem 3.8; see
  :class:`laplax.attention.ProjectionDense`).

  Args:
    params: the model's parameters (looped or scanned layout).
    layer: block index.

  Returns:
    ``{"query", "key", "value"}``: float32 NumPy ``[D, heads * d_head]``.

  Raises:
    KeyError: no such layer.
  """
  attn = attention_params(params, layer)
  return {name: np.asarray(attn[name]["kernel"]) for name in PROJECTIONS}


def is_causal(model: nn.Module) -> bool:
  """Whether ``model``'s attention is causal (a GPT's spec) or bidirectional (a ViT).

  Args:
    model: a laplax ViT or GPT (bound or not), read through ``model.spec``.
  """
  return isinstance(model.spec, GPTSpec)


def attention_module(model: nn.Module, layer: int):
  """Layer ``layer``'s attention block as a standalone module and its call kwargs.

  Built from ``model.spec`` by :func:`laplax.models.layers.attention_module`
  (the constructor the model's blocks use) with the reference kernel and
  float32 compute, so that ``module.apply({"params": attention_params(params,
  layer)}, y, **kwargs)`` maps the block's normalised input ``y [batch, T, D]``
  to its attention branch, as in the model.

  Returns:
    ``(MultiHeadAttention, {"is_causal": bool, "laplacian": bool [heads]})``.
  """
  laplacian = model.spec.laplacian_array[layer]
  module = block_attention(model.spec, implementation="reference", dtype=None)
  return module, {"is_causal": is_causal(model), "laplacian": laplacian}


def _capture_filter(module: nn.Module, method_name: str) -> bool:
  return method_name == "__call__" and (
    isinstance(module, MultiHeadAttention) or module.name == "norm1"
  )


def analysis_apply(
  model: nn.Module, params: Any, inputs: jax.Array, *, capture_blocks: bool = False
):
  """The model's eval forward pass with the attention matrices (and block I/O) recorded.

  Args:
    model: a ViT (also a DINO backbone) or GPT.
    params: its parameters.
    inputs: images ``[B, H, W, C]`` or tokens ``[B, T]``.
    capture_blocks: also record each attention block's input (``norm1``
      output) and output (``capture_intermediates``).

  Returns:
    ``(out, intermediates)``: the model's intermediates dict (``"block{i}"``,
    ``"encoded"``, ...) and the ``"intermediates"`` collection (read it with
    :func:`attention_weights` and :func:`block_io`).
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
  """Layer ``layer``'s attention matrices ``P`` as sown by ``MultiHeadAttention``.

  Args:
    intermediates: the ``"intermediates"`` collection of :func:`analysis_apply`.
    layer: block index.

  Returns:
    float32 ``[B, heads, T, T]``, rows summing to 1 (Zhang & Papyan's ``P_i``).

  Raises:
    KeyError: no such layer.
  """
  return _layer_tree(intermediates, layer)["attention"]["attention_weights"][0]


def block_io(intermediates: dict, layer: int) -> tuple[jax.Array, jax.Array]:
  """The input and output of layer ``layer``'s attention block.

  Args:
    intermediates: from ``analysis_apply(..., capture_blocks=True)``.
    layer: block index.

  Returns:
    ``(norm1 output [B, T, D], attention branch [B, T, D])`` in the model's
    compute dtype (the branch before LayerScale and drop-path).

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
  """``W_O``'s rows per head, times LayerScale's ``gamma`` when the block has one.

  Returns:
    float32 ``[heads, head_dim, D]``: head ``h``'s output ``o_h [head_dim]``
    adds ``o_h @ result[h]`` to the residual stream (besides ``W_O``'s bias).

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
  """Token representations after each chosen block (the residual stream).

  Args:
    out: the intermediates dict a ViT or GPT returns.
    layers: block indices.

  Returns:
    ``{layer: out["block{layer}"]["+mlp"]}``, each ``[B, T, D]`` in the
    model's compute dtype (ViT: class token first when ``pool == "tok"``).

  Raises:
    KeyError: a layer the model does not have.
  """
  return {i: out[f"block{i}"]["+mlp"] for i in layers}
