"""``attend(implementation="cudnn")`` against the materialising reference.

The cuDNN branch of :func:`laplax.attention.attend` has its own mask handling
before ``jax.nn.dot_product_attention``: a padding mask broadcast to ``[batch,
heads, q, kv]``, and causal attention with fewer queries than keys (a KV
cache: queries are the *last* keys) turned into an explicit mask, because
JAX's ``is_causal`` aligns queries with the *first* keys.

* Everywhere (CPU included): that branch with JAX's XLA kernel in place of
  cuDNN (``dot_product_attention`` patched to ``implementation="xla"``) must
  equal ``implementation="reference"`` in float32 -- the mask handling is
  laplax's, the kernel JAX's.
* On an NVIDIA GPU (skipped elsewhere; ``bench/gpu_check.sh`` runs this file
  when a GPU is there): the fused cuDNN kernel in bfloat16, forward and
  gradients, against the reference in float32 of the same bfloat16 inputs,
  and a tiny GPT's logits with ``cudnn`` against ``xla``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention

from helpers.models import make_gpt

ON_GPU = jax.default_backend() == "gpu"
needs_gpu = pytest.mark.skipif(
  not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU (bench/gpu_check.sh runs this file)"
)
LAPLACIAN = np.array([False, True, False, True])  # 2 of 4 heads


def inputs(q_len, kv_len, dtype, seed=0, batch=2, heads=4, head_dim=64):
  rng = np.random.default_rng(seed)
  q, k, v, r = (
    jnp.asarray(rng.normal(size=(batch, n, heads, head_dim)), dtype)
    for n in (q_len, kv_len, kv_len, q_len)
  )
  # Padding: the last keys of the second sequence are masked out.
  pad = np.ones((batch, 1, 1, kv_len), bool)
  pad[1, ..., kv_len - kv_len // 4 :] = False
  return q, k, v, r, jnp.asarray(pad)


# (q_len, kv_len, causal, padded): plain, causal, padding, KV-cache causal
# (fewer queries than keys) with and without padding.
CASES = [
  (32, 32, False, False),
  (32, 32, True, False),
  (32, 32, False, True),
  (8, 32, True, False),
  (8, 32, True, True),
]


def run_attend(implementation, q, k, v, r, pad, causal, padded):
  return attention.attend(
    q,
    k,
    v,
    laplacian=LAPLACIAN,
    mask=pad if padded else None,
    is_causal=causal,
    implementation=implementation,
    residual_value=r if q.shape[1] != k.shape[1] else None,
  )


@pytest.mark.parametrize("q_len,kv_len,causal,padded", CASES)
def test_cudnn_branch_masks_equal_reference(q_len, kv_len, causal, padded, monkeypatch):
  """The cuDNN branch's masks, with JAX's XLA kernel standing in for cuDNN."""
  calls = []
  original = jax.nn.dot_product_attention

  def xla_kernel(*args, implementation=None, **kwargs):
    calls.append(implementation)
    return original(*args, implementation="xla", **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", xla_kernel)
  q, k, v, r, pad = inputs(q_len, kv_len, jnp.float32)
  got = run_attend("cudnn", q, k, v, r, pad, causal, padded)
  want = run_attend("reference", q, k, v, r, pad, causal, padded)
  assert calls == ["cudnn"]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)


@needs_gpu
@pytest.mark.parametrize("q_len,kv_len,causal,padded", CASES)
def test_cudnn_forward_and_gradients_equal_reference(q_len, kv_len, causal, padded):
  """bfloat16 through cuDNN against the float32 reference of the same inputs:
  the output, and the gradients in q, k, v of a random projection of it."""
  q, k, v, r, pad = inputs(q_len * 4, kv_len * 4, jnp.bfloat16)
  cot = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

  def loss(impl, dtype):
    def f(q_, k_, v_):
      out = run_attend(
        impl,
        q_.astype(dtype),
        k_.astype(dtype),
        v_.astype(dtype),
        r.astype(dtype),
        pad,
        causal,
        padded,
      )
      return jnp.sum(out.astype(jnp.float32) * cot), out

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  (_, got), got_grads = loss("cudnn", jnp.bfloat16)
  (_, want), want_grads = loss("reference", jnp.float32)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=3e-2, rtol=3e-2)
  for name, g, w in zip("qkv", got_grads, want_grads):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.abs(g - w).max() <= 5e-2 * np.abs(w).max(), name


@needs_gpu
def test_gpt_logits_cudnn_equal_xla():
  """A tiny bfloat16 GPT with 2 of 4 Laplacian heads: ``cudnn`` and ``xla``
  attention give the same logits to bfloat16 precision."""
  kw = dict(
    vocab_size=64,
    max_length=64,
    width=128,
    depth=2,
    num_heads=2,
    num_laplacian_heads=1,
    dtype="bfloat16",
  )
  cudnn, xla = make_gpt(implementation="cudnn", **kw), make_gpt(implementation="xla", **kw)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 64)), jnp.int32)
  params = xla.init(jax.random.PRNGKey(0), tokens)["params"]
  got = jax.jit(lambda p: cudnn.apply({"params": p}, tokens)[0])(params)
  want = jax.jit(lambda p: xla.apply({"params": p}, tokens)[0])(params)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-2, rtol=5e-2)
