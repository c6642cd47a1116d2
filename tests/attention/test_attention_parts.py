"""The public attention parts of laplax.attention, composed outside it.

* An attention written in this file from the parts (``check_settings``,
  ``project_qkv``, ``norm_and_rotate``, ``laplacian_mix``,
  ``attention_dropout_rng``, ``attend``, ``out_projection``) on a model
  spec's ``AttentionSpec`` has MultiHeadAttention's parameter tree (names,
  shapes, initial values) and its output on the same weights.
* ``attend``'s Laplacian heads against a NumPy reference of ``(I - P) V``
  (``P`` the softmax written from its definition) and the learned mix
  ``alpha V + (1 - 2 alpha) P V``; the mix's parameter starts at
  ``sigmoid(+-4)``.
* The Nystrom sub-spec reaches the kernel whole, under its config names.
* The sub-specs (qk-norm, rotary, Nystrom) travel from the config keys to
  MultiHeadAttention as the same objects, and its flat keyword arguments
  build equal ones.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention, rotary
from laplax.kernels import nystrom
from laplax.models import layers
from laplax.models import spec as spec_lib


class Composed(nn.Module):
  """Self-attention built from the public parts on ``spec`` (an AttentionSpec)."""

  spec: spec_lib.AttentionSpec
  laplacian_mask: tuple

  @nn.compact
  def __call__(self, x, deterministic=True):
    spec = self.spec
    attention.check_settings(spec, x.shape[-1])
    head_dim = x.shape[-1] // spec.num_heads
    laplacian = np.asarray(self.laplacian_mask)
    q, k, v = attention.project_qkv(spec, x, head_dim=head_dim, dtype=x.dtype)
    q, k = attention.norm_and_rotate(spec, q, k, np.arange(x.shape[1]))
    y = attention.attend(
      q.astype(x.dtype),
      k.astype(x.dtype),
      v.astype(x.dtype),
      laplacian=laplacian,
      implementation=spec.implementation,
      dropout_rate=spec.attention_dropout,
      dropout_rng=attention.attention_dropout_rng(self, spec, deterministic),
      mix=attention.laplacian_mix(self, spec, laplacian),
      xla_keep_probs=spec.xla_keep_probs,
    )
    return attention.out_projection(y.reshape(x.shape), x.shape[-1])


def _spec():
  return spec_lib.build(
    "gpt",
    width=32,
    depth=1,
    num_heads=4,
    num_laplacian_heads=1,
    qk_norm=True,
    posemb="rope",
    laplacian_mix="learned",
    implementation="xla",
    spectral={"enabled": True, "lam": 2.0, "mode": "per_head"},
  )


@pytest.mark.slow  # two modules initialised and applied (~10 s on a busy machine)
def test_composed_attention_equals_multi_head_attention():
  model = _spec()
  mask = model.laplacian[0]
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 32)), jnp.float32)
  composed = Composed(model.attention, mask)
  a = model.attention
  mha = attention.MultiHeadAttention(
    num_heads=a.num_heads,
    qk_norm=a.qk_norm,
    rope=a.rope,
    laplacian_mix=a.laplacian_mix,
    implementation=a.implementation,
    spectral_lam=a.spectral_lam,
    spectral_mode=a.spectral_mode,
    laplacian_mask=mask,
  )
  params = composed.init(jax.random.key(1), x)["params"]
  want = mha.init(jax.random.key(1), x)["params"]
  # The same tree, created from the same names: the same initial values.
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(want)
  assert set(params) == {"query", "key", "value", "query_norm", "key_norm", "laplacian_mix", "out"}
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Other weights: both compute the same function of them.
  rng = np.random.default_rng(2)
  params = jax.tree_util.tree_map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32), params
  )
  got = composed.apply({"params": params}, x)
  ref = mha.apply({"params": params}, x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def test_laplacian_heads_and_mix_against_numpy_i_minus_p():
  rng = np.random.default_rng(3)
  b, n, h, d = 2, 6, 3, 4
  q, k, v = (rng.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3))
  # P per head from the definition, [b, h, n, n]; (I - P) V and P V per head.
  p = _softmax(np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d))
  pv = np.einsum("bhqk,bkhd->bqhd", p, v)
  eye = np.eye(n)
  lap = np.einsum("bhqk,bkhd->bqhd", eye - p, v)
  laplacian = np.array([False, True, True])
  got = np.asarray(attention.attend(q, k, v, laplacian=laplacian, implementation="xla"))
  np.testing.assert_allclose(got[:, :, 0], pv[:, :, 0], atol=1e-5)
  np.testing.assert_allclose(got[:, :, 1:], lap[:, :, 1:], atol=1e-5)
  # The learned mix: alpha V + (1 - 2 alpha) P V (alpha 0: P V, alpha 1: (I - P) V).
  alpha = np.array([0.0, 1.0, 0.25], np.float32)
  mixed = np.asarray(attention.attend(q, k, v, laplacian=laplacian, mix=alpha))
  want = alpha[:, None] * v + (1 - 2 * alpha[:, None]) * pv
  np.testing.assert_allclose(mixed, want, atol=1e-5)
  np.testing.assert_allclose(mixed[:, :, 1], lap[:, :, 1], atol=1e-5)


class _Mix(nn.Module):
  spec: spec_lib.AttentionSpec

  @nn.compact
  def __call__(self, laplacian):
    return attention.laplacian_mix(self, self.spec, laplacian)


def test_laplacian_mix_part_starts_at_the_fixed_pattern():
  spec = spec_lib.AttentionSpec(num_heads=3, laplacian_mix="learned")
  laplacian = np.array([False, True, True])
  alpha, variables = _Mix(spec).init_with_output(jax.random.key(0), laplacian)
  np.testing.assert_allclose(np.asarray(variables["params"]["laplacian_mix"]), [-4.0, 4.0, 4.0])
  np.testing.assert_allclose(np.asarray(alpha), 1 / (1 + np.exp([4.0, -4.0, -4.0])), rtol=1e-6)
  fixed = spec_lib.AttentionSpec(num_heads=3)
  out, variables = _Mix(fixed).init_with_output(jax.random.key(0), laplacian)
  assert out is None and not variables


def test_nystrom_sub_spec_reaches_the_kernel_under_its_names():
  spec = spec_lib.build(
    "bert", width=16, num_heads=2, implementation="nystrom", num_landmarks=4, nystrom_padding="zero"
  ).attention
  assert spec.nystrom == nystrom.NystromSpec(num_landmarks=4, nystrom_padding="zero")
  rng = np.random.default_rng(4)
  q, k, v = (rng.normal(size=(2, 8, 2, 4)).astype(np.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(8) < np.array([[8], [5]]))[:, None, None, :]
  got = attention.attend(
    q, k, v, laplacian=np.zeros(2, bool), mask=mask, implementation="nystrom", nystrom=spec.nystrom
  )
  want = nystrom.nystrom_attention(q, k, v, mask=mask, num_landmarks=4, nystrom_padding="zero")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  keys = nystrom.nystrom_attention(q, k, v, mask=mask, num_landmarks=4)
  assert not np.allclose(np.asarray(got), np.asarray(keys))  # the padding option took effect


def test_sub_specs_from_config_keys_reach_multi_head_attention_whole():
  spec = spec_lib.build(
    "gpt",
    width=16,
    num_heads=2,
    posemb="rope",
    rope_theta=500.0,
    rope_style="nanochat",
    qk_norm=True,
    qk_norm_type="rmsnorm",
    num_landmarks=8,
    conv_kernel_size=3,
  )
  a = spec.attention
  assert a.rope == rotary.RotarySpec(rope_theta=500.0, rope_style="nanochat")
  assert a.qk_norm == attention.QKNormSpec(qk_norm_type="rmsnorm")
  assert a.nystrom == nystrom.NystromSpec(num_landmarks=8, conv_kernel_size=3)
  off = spec_lib.build("gpt", width=16, num_heads=2, qk_norm_type="rmsnorm", rope_theta=500.0)
  assert off.attention.qk_norm is None and off.attention.rope is None  # switches off
  mha = layers.attention_module(spec)
  assert mha.rope is a.rope and mha.qk_norm is a.qk_norm and mha.nystrom is a.nystrom
  assert mha.clone().rope is a.rope  # kept as passed
  # The user's flat keyword arguments build the same sub-specs.
  flat = attention.MultiHeadAttention(
    num_heads=2,
    rope=True,
    rope_theta=500.0,
    rope_style="nanochat",
    qk_norm=True,
    qk_norm_type="rmsnorm",
    num_landmarks=8,
    conv_kernel_size=3,
  )
  assert (flat.rope, flat.qk_norm, flat.nystrom) == (a.rope, a.qk_norm, a.nystrom)
  off = attention.MultiHeadAttention(num_heads=2)
  assert off.rope is None and off.qk_norm is None and off.nystrom == nystrom.NystromSpec()
