"""An analytic estimate of a train step's memory per device (before any compile).

    state + gradients + activations at the config's ``model.remat`` + logits

* state: the train state's bytes (parameters, optimiser moments, DINO's
  teacher; their dtypes as initialised), split over ``fsdp x tensor``;
  gradients: the parameters' bytes once more (twice with gradient
  accumulation: the running sum).
* activations, per block and token of the per-device micro-batch
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", section 4.1: ``34 s b h`` bytes a layer at 16 bits,
  i.e. 17 values of the width, with a fused attention kernel that keeps no
  ``[length, length]`` array): 17 x width values, split by ``tensor``;
  ``model.remat='full'`` keeps only each block's input (1 x width) plus one
  block's 17 in the backward pass; the ``reference`` kernel adds its float32
  ``P`` (heads x length a token). Hierarchical models (Swin, DaViT) sum their
  stages' tokens and widths.
* a language model's float32 logits and their gradient, ``2 x 4 x vocab``
  bytes a token, or a ``model.loss_chunk`` of positions at a time.

This is an estimate, not a bound: XLA may keep more (fusion temporaries,
collectives' buffers) or less. The compiled figure is
``python -m laplax.plan --compile`` on a TPU target (libtpu) or
``bench/compile_report.py``.
"""

from __future__ import annotations

import dataclasses

import jax

from laplax import tasks
from laplax.models.staged import StagedSpec

#: Values of the width a transformer block keeps per token for its backward
#: pass at 16 bits (Korthikanti et al. 2022: 34 bytes / 2).
BLOCK_VALUES = 17


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device: ``state`` (parameters and optimiser state),
  ``gradients``, ``activations``, ``logits``; ``total`` their sum."""

  state: float
  gradients: float
  activations: float
  logits: float

  @property
  def total(self) -> float:
    """The estimated peak bytes per device."""
    return self.state + self.gradients + self.activations + self.logits


def tree_bytes(tree) -> int:
  """Bytes of the leaves of ``tree`` (arrays or ``jax.ShapeDtypeStruct``)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _stage_tokens(config, spec, tokens: int) -> list[tuple[int, int, int]]:
  """``(blocks, tokens per example, width)`` of each stage (one for a plain
  transformer): a staged model's spec (:class:`~laplax.models.staged.StagedSpec`,
  Swin and DaViT) halves the grid side and doubles the width a stage."""
  if not isinstance(spec, StagedSpec):
    return [(spec.depth, tokens, spec.width)]
  side = int(config.data.image_size) // spec.patch_size
  out = []
  for s, (_, depth, width, _) in enumerate(spec.stages()):
    side = side if s == 0 else -(-side // 2)
    out.append((depth, side * side, width))
  return out


def estimate(config, task, state, *, rows: int, fsdp: int, tensor: int) -> Estimate:
  """The :class:`Estimate` of ``config``'s step on one device: ``task`` (built
  from shapes), ``state`` its abstract train state, ``rows`` the examples of a
  micro-batch on the device, ``fsdp`` and ``tensor`` the mesh axes."""
  spec = task.spec  # the spec its model is built from
  params = tree_bytes(state.params)
  accum = config.optim.grad_accum_steps or 1
  shard = fsdp * tensor
  value = 2 if str(config.model.dtype) == "bfloat16" else 4
  tokens = task.tokens_per_example()
  activations = 0.0
  for depth, per_example, width in _stage_tokens(config, spec, tokens):
    t = rows * per_example
    if spec.remat == "full":
      activations += depth * t * width * value + (BLOCK_VALUES * t * width * value if depth else 0)
    else:
      activations += depth * BLOCK_VALUES * t * width * value
    if spec.attention.implementation == "reference":
      activations += depth * spec.attention.num_heads * per_example * t * 4
  logits = 0.0
  if tasks.is_language_model(config):
    vocab = int(config.data.vocab_size)
    chunk = getattr(spec, "loss_chunk", None)
    positions = rows * (min(int(chunk), tokens) if chunk else tokens)
    logits = 2 * 4 * vocab * positions / tensor
  return Estimate(
    state=tree_bytes(state) / shard,
    gradients=params * (2 if accum > 1 else 1) / shard,
    activations=activations / tensor,
    logits=logits,
  )
