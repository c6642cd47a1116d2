"""The Laplacian authors' nanochat fork's optimiser: ``MuonAdamW`` with its seven groups.

Sources: ``yuchongzhang/nanochat`` 1f70b557 (``nanochat/gpt.py``
``setup_optimizer``: the groups; ``scripts/base_train.py``: the schedules) and
upstream ``karpathy/nanochat`` ``nanochat/optim.py`` (read at 0e4b3fad; the
fork imports it), ``optim.optimizer="nanochat-fork"``
(:func:`laplax.optim.make_optimizer`):

* AdamW (``adamw_step_fused``), math in float32, moments in the parameter's
  dtype: ``p <- p (1 - lr wd)``; ``m <- lerp(m, g, 1 - b1)``; ``v <- lerp(v,
  g^2, 1 - b2)``; ``p <- p - lr / (1 - b1^t) m / (sqrt(v / (1 - b2^t)) +
  eps)``, eps 1e-10, on the groups of :data:`ADAMW_GROUPS`.
* Muon (``muon_step_fused``) on every matrix of the blocks (the value-embedding
  gates too), in PyTorch's ``[out, in]`` orientation: Nesterov ``buf <-
  lerp(buf, g, 1 - mu)``, ``g <- lerp(g, buf, mu)``; in ``muon_dtype``
  (bfloat16 as the fork on a GPU) MuonEq row equilibration, ``X / (1.01
  ||X||_F + 1e-6)`` and five Polar Express steps (:data:`POLAR_EXPRESS`);
  Muon+ ``g sqrt(min(m, n)) / ||g||_F``; NorMuon's factored second moment
  (beta2 0.9) with the norm kept; cautious decoupled decay ``p <- p - lr g -
  lr wd p [g p >= 0]``; ``lr`` times ``sqrt(max(1, out / in))``.
* Schedules at update ``it``: every rate times
  :func:`~laplax.optim.warmdown_schedule` (``optim.warmup_steps``,
  ``warmdown_ratio``, ``min_lr_ratio``); Muon's momentum 0.85 -> 0.97 over
  400 updates, 0.97 -> 0.90 over the warm-down (:func:`fork_momentum`); Muon's
  decay ``optim.muon_weight_decay * (1 + cos(pi it / N)) / 2``.

The rates are config values: ``optim.muon_lr`` (matrix), ``embedding_lr``
(``wte``; the value embeddings take half), ``unembedding_lr`` (``lm_head``),
``lr`` (the fork's ``scalar_lr``: ``x0_lambdas`` at it, ``resid_lambdas`` at
0.01 of it); the smear gate, ``smear_lambda`` and ``backout_lambda`` at a
fixed 0.2, as the fork.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from laplax import optim, utils

# optim.py's Polar Express coefficients (a, b, c), one per step (Amsel et al. 2025).
POLAR_EXPRESS = (
  (8.156554524902461, -22.48329292557795, 15.878769915207462),
  (4.042929935166739, -2.808917465908714, 0.5000178451051316),
  (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
  (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
  (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
MUON_BETA2 = 0.9
ADAM_EPS = 1e-10
# group -> (config key of the rate, its factor, beta1, beta2, weight decay); "" = fixed rate
ADAMW_GROUPS = {
  "lm_head": ("unembedding_lr", 1.0, 0.8, 0.96, 0.01),
  "wte": ("embedding_lr", 1.0, 0.8, 0.995, 0.001),
  "value_embeds": ("embedding_lr", 0.5, 0.8, 0.995, 0.01),
  "resid": ("lr", 0.01, 0.8, 0.95, 0.05),
  "x0": ("lr", 1.0, 0.96, 0.95, 0.0),
  "smear": ("", 0.2, 0.8, 0.95, 0.0),
}


def fork_labels(params: Any) -> Any:
  """String tree of each leaf's group: ``"muon"`` (a matrix inside a block),
  ``"wte"``, ``"value_embeds"``, ``"lm_head"``, ``"resid"``, ``"x0"``, ``"smear"``.

  Raises:
    ValueError: a parameter the fork's model has not (one line naming it).
  """

  def rule(path, x):
    keys = list(utils.path_keys(path))
    top = keys[0]
    if any(re.fullmatch(r"block\d+", k) for k in keys) and x.ndim == 2:
      return "muon"
    named = {
      "token_embedding": "wte",
      "lm_head": "lm_head",
      "resid_lambdas": "resid",
      "x0_lambdas": "x0",
      "smear_gate": "smear",
      "smear_lambda": "smear",
      "backout_lambda": "smear",
    }
    if top in named:
      return named[top]
    if top.startswith("value_embed"):
      return "value_embeds"
    raise ValueError(
      f"optim.optimizer='nanochat-fork' has no group for parameter {'/'.join(keys)} "
      f"(the fork's GPT has none); use optim.optimizer='nanochat' or 'adamw'"
    )

  return jax.tree_util.tree_map_with_path(rule, params)


def fork_momentum(it, total_steps: int, warmdown_ratio: float):
  """base_train.py's ``get_muon_momentum(it)``: ``0.85 -> 0.97`` over 400
  updates, 0.97, then ``0.97 -> 0.90`` from ``N - round(ratio N)`` to ``N``."""
  it = jnp.asarray(it, jnp.float32)
  warmdown = round(warmdown_ratio * total_steps)
  start = total_steps - warmdown
  frac = it / 400
  progress = (it - start) / max(warmdown, 1)
  return jnp.where(
    it < 400,
    (1 - frac) * 0.85 + frac * 0.97,
    jnp.where(it >= start, 0.97 * (1 - progress) + 0.90 * progress, 0.97),
  )


def adamw_update(p, g, m, v, t, lr, b1, b2, wd, eps=ADAM_EPS):
  """One ``adamw_step_fused``: returns ``(new p, m, v)`` in their dtypes (math in float32)."""
  f32 = jnp.float32
  p32, g32 = p.astype(f32), g.astype(f32)
  p32 = p32 * (1 - lr * wd)
  m32 = m.astype(f32) + (g32 - m.astype(f32)) * (1 - b1)
  v32 = v.astype(f32) + (g32 * g32 - v.astype(f32)) * (1 - b2)
  bias1 = 1 - jnp.asarray(b1, f32) ** t
  bias2 = 1 - jnp.asarray(b2, f32) ** t
  p32 = p32 - (lr / bias1) * (m32 / (jnp.sqrt(v32 / bias2) + eps))
  return p32.astype(p.dtype), m32.astype(m.dtype), v32.astype(v.dtype)


def muon_update(p, g, buf, buf2, mu, lr, wd, dtype=jnp.bfloat16, steps=5):
  """One ``muon_step_fused`` of a Flax kernel ``p [in, out]`` (PyTorch's ``[out,
  in]`` transposed); ``buf [out, in]`` and ``buf2`` (``[out, 1]`` if out >= in,
  else ``[1, in]``) float32. Returns ``(new p, buf, buf2)``."""
  f32 = jnp.float32
  pt, gt = p.T.astype(f32), g.T.astype(f32)
  rows, cols = gt.shape
  norm = lambda x, axis=None: jnp.sqrt(jnp.sum(jnp.square(x.astype(f32)), axis=axis, keepdims=True))
  buf = buf + (gt - buf) * (1 - mu)
  gg = gt + (buf - gt) * mu
  x = gg.astype(dtype)
  target = norm(x) / rows**0.5
  x = x * (target / jnp.maximum(norm(x, -1), 1e-6)).astype(dtype)
  x = x / (norm(x).astype(dtype) * 1.01 + 1e-6).astype(dtype)
  for a, b, c in POLAR_EXPRESS[:steps]:
    if rows > cols:
      gram = x.T @ x
      x = a * x + x @ (b * gram + c * (gram @ gram))
    else:
      gram = x @ x.T
      x = a * x + (b * gram + c * (gram @ gram)) @ x
    x = x.astype(dtype)
  u = x.astype(f32)
  u = u * (min(rows, cols) ** 0.5 / jnp.maximum(norm(u), 1e-6))
  red = -1 if rows >= cols else -2
  v_mean = jnp.mean(jnp.square(u), axis=red, keepdims=True)
  size = u.shape[red]
  v_norm = jnp.sqrt(jnp.sum(v_mean) * size)
  buf2 = buf2 + (v_mean - buf2) * (1 - MUON_BETA2)
  step = jax.lax.rsqrt(jnp.maximum(buf2, 1e-10))
  v_norm_new = jnp.sqrt(jnp.sum(v_mean * size * jnp.square(step)))
  u = u * (step * (v_norm / jnp.maximum(v_norm_new, 1e-10)))
  lr = lr * max(1.0, rows / cols) ** 0.5
  mask = (u * pt) >= 0
  new = pt - (lr * u + lr * wd * pt * mask)
  return new.T.astype(p.dtype), buf, buf2


class ForkState(NamedTuple):
  """The update count and per-leaf state: ``(m, v)`` for AdamW leaves, ``(buf, buf2)`` for Muon."""

  count: jax.Array
  slots: Any


def nanochat_fork(o, total_steps: int, muon_dtype=jnp.bfloat16) -> optax.GradientTransformation:
  """The fork's ``MuonAdamW`` with base_train.py's schedules (module docstring).

  Keys read: ``optim.{muon_lr, embedding_lr, unembedding_lr, lr,
  muon_weight_decay, warmup_steps, warmdown_ratio, min_lr_ratio}`` and
  ``total_steps``. The updates are ``new p - p`` (``optax.apply_updates``
  adds them back).
  """
  lrm = optim.warmdown_schedule(1.0, total_steps, o.warmdown_ratio, o.min_lr_ratio, o.warmup_steps)
  muon_wd = o.muon_weight_decay or 0.0

  def init_fn(params):
    labels = fork_labels(params)

    def slot(label, p):
      if label == "muon":
        rows, cols = p.shape[1], p.shape[0]
        second = (rows, 1) if rows >= cols else (1, cols)
        return (jnp.zeros((rows, cols), jnp.float32), jnp.zeros(second, jnp.float32))
      return (jnp.zeros(p.shape, p.dtype), jnp.zeros(p.shape, p.dtype))

    slots = jax.tree_util.tree_map(slot, labels, params)
    return ForkState(jnp.zeros((), jnp.int32), slots)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("optim.optimizer='nanochat-fork' needs the parameters (decay, caution)")
    labels = fork_labels(params)
    it = state.count
    mult = lrm(it)
    t = (it + 1).astype(jnp.float32)
    mu = fork_momentum(it, total_steps, o.warmdown_ratio)
    wd = muon_wd * 0.5 * (1 + jnp.cos(math.pi * it.astype(jnp.float32) / total_steps))

    def one(label, p, g, s):
      if label == "muon":
        new, a, b = muon_update(p, g, s[0], s[1], mu, o.muon_lr * mult, wd, muon_dtype)
      else:
        key, factor, b1, b2, decay = ADAMW_GROUPS[label]
        base = factor * (getattr(o, key) if key else 1.0)
        new, a, b = adamw_update(p, g, s[0], s[1], t, base * mult, b1, b2, decay)
      # in float32, so that p + update is new exactly where p is bfloat16
      return new.astype(jnp.float32) - p.astype(jnp.float32), (a, b)

    out = jax.tree_util.tree_map(
      lambda lab, p, g, s: one(lab, p, g, s), labels, params, updates, state.slots
    )
    pick = lambda i: jax.tree_util.tree_map(lambda lab, r: r[i], labels, out)
    return pick(0), ForkState(optax.safe_increment(it), pick(1))

  return optax.GradientTransformation(init_fn, update_fn)
