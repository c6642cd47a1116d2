"""nanochat's optimiser, step for step: Muon on the block matrices, AdamW on the
embeddings, its learning-rate and momentum schedules, its gradient clipping.

The facts are those of nanochat's first release (``karpathy/nanochat``
3a5e0bc: ``nanochat/muon.py``, ``nanochat/adamw.py``, ``nanochat/gpt.py``'s
``setup_optimizers``, ``scripts/base_train.py``), ``optim.optimizer=
"nanochat"`` (:func:`laplax.optim.make_optimizer`):

* :func:`clip_by_global_norm`: ``torch.nn.utils.clip_grad_norm_``, every
  gradient times ``min(1, max_norm / (norm + 1e-6))``.
* :func:`scale_by_muon`: ``buf <- mu buf + (1 - mu) g``, Nesterov ``u = (1 -
  mu) g + mu buf`` (the float32 buffer), then :func:`newton_schulz` in
  bfloat16, times ``sqrt(max(1, fan_out / fan_in))``; the momentum ``mu``
  follows :func:`muon_momentum` (0.85 -> 0.95 over 300 steps).
* :func:`scale_by_adam`: the ZeRO-2 ``DistAdamW`` step of the 8-GPU run,
  ``sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`` (``eps`` outside the
  bias correction, unlike ``optax.adam``); the moments in the parameter's
  dtype (bfloat16 for nanochat's ``wte``).
* :func:`laplax.optim.warmdown_schedule`: ``get_lr_multiplier``, 1 then linear to
  ``final`` over the last ``round(warmdown_ratio * N)`` steps.

``optax.contrib.muon`` is close but not this: its Newton-Schulz runs in the
update's dtype with ``eps = 1e-8`` and its momentum is a constant. The
learning rates (Muon 0.02, not width-scaled; AdamW ``0.2 s`` on ``wte`` and
``0.004 s`` on ``lm_head``, ``s = (width / 768)^-1/2``) are config values
(:func:`laplax.config.defaults.nanochat_options`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# nanochat/muon.py's quintic Newton-Schulz coefficients (a, b, c).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def muon_momentum(start: float = 0.85, end: float = 0.95, ramp_steps: int = 300) -> optax.Schedule:
  """nanochat's ``get_muon_momentum(it)``: ``(1 - f) start + f end`` with
  ``f = min(it / ramp_steps, 1)``, at update ``it`` (0-based)."""

  def schedule(count):
    frac = jnp.minimum(jnp.asarray(count, jnp.float32) / max(ramp_steps, 1), 1.0)
    return (1.0 - frac) * start + frac * end

  return schedule


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: the gradients times
  ``min(1, max_norm / (||g|| + 1e-6))``, ``||g||`` the global 2-norm over all
  leaves (each leaf's sum of squares in float32). Stateless."""

  def update_fn(updates, state, params=None):
    del params
    norm = jnp.sqrt(
      sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree_util.tree_leaves(updates))
    )
    coef = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
    return jax.tree_util.tree_map(lambda g: (g * coef).astype(g.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def newton_schulz(g: jax.Array, steps: int = NS_STEPS) -> jax.Array:
  """nanochat/muon.py's ``zeropower_via_newtonschulz5`` of a Flax kernel.

  ``g [..., fan_in, fan_out]`` is PyTorch's ``G = g^T [fan_out, fan_in]``;
  as there: ``X = G`` in bfloat16, transposed when it has more rows than
  columns, ``X / (||X||_F + 1e-7)``, then ``steps`` times ``A = X X^T``,
  ``X = a X + (b A + (c A) A) X`` with :data:`NS_COEFFS` (the products in
  that order, each rounded to bfloat16 as PyTorch rounds them), transposed back.
  Leading axes (scanned layers) are a batch. Returns bfloat16, ``g``'s shape.
  Run op by op this is PyTorch's result bit for bit (CPU,
  tests/models/test_nanochat_exact.py); compiled, XLA may keep some products in
  float32 (its default ``xla_allow_excess_precision``), a more precise result.
  """
  a, b, c = NS_COEFFS
  bf16, f32 = jnp.bfloat16, jnp.float32
  # PyTorch multiplies a bfloat16 tensor by a Python float in float32 and
  # rounds the product (JAX would round the coefficient to bfloat16 first).
  scale = lambda s, t: (s * t.astype(f32)).astype(bf16)
  add = lambda t, u: (t.astype(f32) + u.astype(f32)).astype(bf16)
  x = jnp.swapaxes(g, -1, -2).astype(bf16)  # PyTorch's [fan_out, fan_in]
  tall = x.shape[-2] > x.shape[-1]
  if tall:
    x = jnp.swapaxes(x, -1, -2)
  norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(f32)), axis=(-2, -1), keepdims=True))
  x = (x.astype(f32) / add(norm.astype(bf16), jnp.asarray(1e-7, f32)).astype(f32)).astype(bf16)
  for _ in range(steps):
    gram = x @ jnp.swapaxes(x, -1, -2)
    x = add(scale(a, x), add(scale(b, gram), scale(c, gram) @ gram) @ x)
  if tall:
    x = jnp.swapaxes(x, -1, -2)
  return jnp.swapaxes(x, -1, -2)


class MuonState(NamedTuple):
  """The update count and the float32 momentum buffers of :func:`scale_by_muon`."""

  count: jax.Array
  buf: Any


def scale_by_muon(
  momentum: optax.Schedule, ns_steps: int = NS_STEPS
) -> optax.GradientTransformation:
  """nanochat's Muon direction (before ``-lr``) of every leaf, a Flax kernel
  ``[..., fan_in, fan_out]``: ``buf <- mu buf + (1 - mu) g``, ``u = (1 - mu)
  g + mu buf`` (Nesterov), ``newton_schulz(u) * sqrt(max(1, fan_out /
  fan_in))`` in float32, with ``mu = momentum(count)``."""

  def init_fn(params):
    return MuonState(
      jnp.zeros((), jnp.int32),
      jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
    )

  def update_fn(updates, state, params=None):
    del params
    mu = momentum(state.count)
    buf = jax.tree_util.tree_map(
      lambda m, g: mu * m + (1.0 - mu) * g.astype(jnp.float32), state.buf, updates
    )

    def direction(g, m):
      u = (1.0 - mu) * g.astype(jnp.float32) + mu * m
      fan_in, fan_out = g.shape[-2], g.shape[-1]
      return newton_schulz(u, ns_steps).astype(jnp.float32) * max(1.0, fan_out / fan_in) ** 0.5

    out = jax.tree_util.tree_map(direction, updates, buf)
    return out, MuonState(optax.safe_increment(state.count), buf)

  return optax.GradientTransformation(init_fn, update_fn)


class AdamState(NamedTuple):
  """The update count and the moments (parameter dtype) of :func:`scale_by_adam`."""

  count: jax.Array
  mu: Any
  nu: Any


def scale_by_adam(
  b1: float = 0.8, b2: float = 0.95, eps: float = 1e-10
) -> optax.GradientTransformation:
  """nanochat/adamw.py's ``DistAdamW`` direction (before ``-lr``), no weight
  decay: ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``, ``sqrt(1 -
  b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`` at update ``t = count + 1``;
  ``m``, ``v`` in the parameter's dtype."""

  def init_fn(params):
    zeros = lambda p: jnp.zeros(p.shape, p.dtype)
    return AdamState(
      jnp.zeros((), jnp.int32),
      jax.tree_util.tree_map(zeros, params),
      jax.tree_util.tree_map(zeros, params),
    )

  def update_fn(updates, state, params=None):
    del params
    t = (state.count + 1).astype(jnp.float32)
    step = jnp.sqrt(1.0 - b2**t) / (1.0 - b1**t)
    mu = jax.tree_util.tree_map(
      lambda m, g: (b1 * m + (1 - b1) * g).astype(m.dtype), state.mu, updates
    )
    nu = jax.tree_util.tree_map(
      lambda v, g: (b2 * v + (1 - b2) * g * g).astype(v.dtype), state.nu, updates
    )
    out = jax.tree_util.tree_map(
      lambda m, v: (step * (m / (jnp.sqrt(v) + eps))).astype(m.dtype), mu, nu
    )
    return out, AdamState(optax.safe_increment(state.count), mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def nanochat_partition(o, labels, schedule) -> optax.GradientTransformation:
  """The ``optim.optimizer="nanochat"`` optimizer: ``optax.partition`` over
  ``labels`` (:func:`laplax.optim.param_labels`): Muon at
  ``optim.muon_lr`` on ``"muon"``, :func:`scale_by_adam` at
  ``optim.embedding_lr`` / ``optim.unembedding_lr`` / ``optim.lr`` on
  ``"embedding"`` / ``"unembedding"`` / ``"adamw"``, each rate shaped by
  ``schedule(peak)`` (:func:`laplax.optim.learning_rate_schedule`:
  :func:`laplax.optim.warmdown_schedule` with ``optim.schedule="warmdown"``);
  :func:`clip_by_global_norm` first when ``optim.grad_clip``.

  Keys read: ``optim.{lr, b1, b2, adam_eps, muon_lr, muon_momentum,
  muon_momentum_start, muon_momentum_ramp_steps, embedding_lr, unembedding_lr,
  grad_clip}`` (a complete config: :func:`laplax.tasks.schema.complete`).
  """

  def lr(key):
    peak = getattr(o, key)
    return schedule(o.lr if peak is None else peak)

  def adam(key):
    return optax.chain(scale_by_adam(o.b1, o.b2, o.adam_eps), optax.scale_by_learning_rate(lr(key)))

  momentum = muon_momentum(o.muon_momentum_start, o.muon_momentum, o.muon_momentum_ramp_steps)
  muon = optax.chain(scale_by_muon(momentum), optax.scale_by_learning_rate(lr("muon_lr")))
  tx = optax.partition(
    {
      "muon": muon,
      "embedding": adam("embedding_lr"),
      "unembedding": adam("unembedding_lr"),
      "adamw": adam("lr"),
    },
    labels,
  )
  if o.grad_clip:
    return optax.chain(clip_by_global_norm(o.grad_clip), tx)
  return tx
