"""The optax optimiser of a config: AdamW, warm-up + cosine, clipping, decay mask."""

from __future__ import annotations

import re
from typing import Any

import jax
import ml_collections
import optax

from laplax import utils
from laplax.models import layers


def learning_rate_schedule(optim: ml_collections.ConfigDict,
                           total_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to ``optim.lr`` over ``optim.warmup_steps``, then
  cosine decay to ``optim.lr * optim.min_lr_ratio`` at ``total_steps``."""
  warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=optim.lr, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=optim.lr * optim.min_lr_ratio)


def cosine_ramp(start: float, end: float, steps: int) -> optax.Schedule:
  """Half-cosine from ``start`` at step 0 to ``end`` at ``steps`` (then ``end``).

  ``end - (end - start) * (1 + cos(pi * t / steps)) / 2``: DINO's
  ``cosine_scheduler`` for the weight decay (0.04 -> 0.4) and the teacher
  momentum (0.996 -> 1), here through ``optax.cosine_decay_schedule``.
  """
  decay = optax.cosine_decay_schedule(end - start, max(int(steps), 1))
  return lambda t: end - decay(t)


def weight_decay_schedule(optim: ml_collections.ConfigDict, total_steps: int):
  """``optim.weight_decay``, or a cosine ramp to ``optim.weight_decay_end`` if set."""
  end = optim.get("weight_decay_end", None)
  if end is None:
    return optim.weight_decay
  return cosine_ramp(optim.weight_decay, end, total_steps)


def decay_mask(params: Any, exclude: tuple[str, ...] = ()) -> Any:
  """Bool tree: True where weight decay applies.

  Decay applies to tensors with two or more dimensions (kernels), never to
  biases, norm scales, LayerScale, and not to parameters whose ``/``-joined
  path matches one of the regexes in ``exclude`` (class token, position
  embedding by default in the configs). Under scanned blocks
  (``model.scan_layers``) the leading layer axis does not count.
  """
  def rule(path, x):
    keys = list(utils.path_keys(path))
    ndim = x.ndim - (layers.SCANNED_BLOCKS in keys)
    return ndim >= 2 and not any(re.search(p, "/".join(keys)) for p in exclude)
  return jax.tree_util.tree_map_with_path(rule, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``clip_by_global_norm(optim.grad_clip)`` then AdamW with the schedule above.

  Keys read: ``optim.{lr, b1, b2, weight_decay, weight_decay_end (optional),
  warmup_steps, min_lr_ratio, grad_clip, weight_decay_exclude}`` and
  ``total_steps``.
  """
  o = config.optim
  exclude = tuple(o.get("weight_decay_exclude", ()) or ())
  adamw = optax.adamw(
      learning_rate_schedule(o, config.total_steps), b1=o.b1, b2=o.b2,
      weight_decay=weight_decay_schedule(o, config.total_steps),
      mask=lambda p: decay_mask(p, exclude))
  if o.grad_clip:
    return optax.chain(optax.clip_by_global_norm(o.grad_clip), adamw)
  return adamw
