"""Nystrom attention (laplax/kernels/nystrom.py, ``attend(implementation="nystrom")``).

* Against Hugging Face's ``NystromformerSelfAttention`` (the oracle, random
  weights, every bias perturbed): ``MultiHeadAttention`` with its weights
  gives its context layer (through the output projection) to 1e-5, with and
  without a key-padding mask and the depthwise convolution, both ``Z_0``
  initialisations; the authors' padding (``nystrom_padding="zero"``) against a
  PyTorch transcription of their ``LRA/code/attention_nystrom.py``.
* With as many landmarks as tokens it is softmax attention (the exact path;
  and the approximation itself once the pseudo-inverse has converged:
  ``P P^+ P = P``); ``V - P~ V`` approaches the exact ``V - P V`` as the
  landmarks grow.
* No array with two length-sized axes in the jaxpr of the forward pass or
  of its gradient; the gradient against central finite differences.
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention
from laplax.kernels import nystrom

HAS_HF = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_hf = pytest.mark.skipif(not HAS_HF, reason="the oracle: pip install -r requirements-test.txt")


def _qkv(seed=0, b=2, n=64, h=2, d=8, smooth=False):
  r = np.random.default_rng(seed)
  q, k, v = (r.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3))
  if smooth:  # neighbouring tokens alike, as in real sequences
    scale = np.sqrt(np.arange(1, n + 1))[None, :, None, None]
    q, k = np.cumsum(q, 1) / scale, np.cumsum(k, 1) / scale
  return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


# -- the oracle ---------------------------------------------------------------


def _hf_attention(n, m, conv, heads=2, width=32, seed=0):
  import torch
  from transformers import NystromformerConfig
  from transformers.models.nystromformer import modeling_nystromformer as hf

  torch.manual_seed(seed)
  cfg = NystromformerConfig(
    hidden_size=width,
    num_attention_heads=heads,
    segment_means_seq_len=n,
    num_landmarks=m,
    conv_kernel_size=conv or 3,
    attention_probs_dropout_prob=0.0,
  )
  module = hf.NystromformerSelfAttention(cfg).eval()
  if conv is None:  # the config's type allows no None; the module does
    module.conv_kernel_size = None
  out = torch.nn.Linear(width, width)
  with torch.no_grad():
    for p in list(module.parameters()) + list(out.parameters()):
      p.copy_(torch.randn_like(p) * 0.3)
  return module, out


def _laplax_params(module, out, conv):
  t = lambda p: jnp.asarray(p.detach().numpy())
  params = {
    name: {"kernel": t(getattr(module, name).weight).T, "bias": t(getattr(module, name).bias)}
    for name in ("query", "key", "value")
  }
  params["out"] = {"kernel": t(out.weight).T, "bias": t(out.bias)}
  if conv:
    params["nystrom_conv"] = t(module.conv.weight)[:, 0, :, 0].T  # [h,1,k,1] -> [k, h]
  return params


@needs_hf
@pytest.mark.parametrize(
  "n,m,conv,padded,init",
  [
    (64, 8, None, False, "original"),
    (64, 8, 5, True, "original"),
    (64, 16, 7, True, "exact"),
    (32, 32, 3, True, "original"),  # landmarks = tokens: both take the exact softmax
  ],
)
@pytest.mark.slow
def test_matches_hf_self_attention(n, m, conv, padded, init):
  import torch

  heads, width = 2, 32
  module, out = _hf_attention(n, m, conv, heads, width)
  module.init_option = init  # HF's config switch for it reads a key that is never set
  x = np.random.default_rng(1).normal(size=(3, n, width)).astype(np.float32)
  keep = np.ones((3, n), bool)
  if padded:
    keep[1, n // 2 + 3 :] = False
    keep[2, n - 5 :] = False
  additive = torch.from_numpy(np.where(keep, 0.0, np.finfo(np.float32).min)[:, None, None, :])
  with torch.no_grad():
    context = module(torch.from_numpy(x), additive if padded else None)[0]
    want = out(context).numpy()
  mha = attention.MultiHeadAttention(
    num_heads=heads,
    implementation="nystrom",
    num_landmarks=m,
    conv_kernel_size=conv,
    pinv_init=init,
  )
  mask = jnp.asarray(keep)[:, None, None, :] if padded else None
  # Jitted: one compile instead of one per operation run eagerly.
  got = jax.jit(mha.apply)({"params": _laplax_params(module, out, conv)}, jnp.asarray(x), mask=mask)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5 * np.abs(want).max(), rtol=0)


def _authors_reference(q, k, v, keep, m, conv_weight, iters=6):
  """``LRA/code/attention_nystrom.py`` of mlpen/Nystromformer transcribed in
  PyTorch (heads-major ``[b, h, n, d]``; mask multiplies Q, K and the conv's V)."""
  import torch

  q, k, v = (torch.from_numpy(np.asarray(a)).transpose(1, 2).double() for a in (q, k, v))
  mask = torch.from_numpy(keep).double()
  d, n = q.shape[-1], q.shape[2]
  q = q * mask[:, None, :, None] / d**0.25
  k = k * mask[:, None, :, None] / d**0.25
  ql = q.reshape(*q.shape[:2], m, n // m, d).mean(-2)
  kl = k.reshape(*k.shape[:2], m, n // m, d).mean(-2)
  k1 = torch.softmax(q @ kl.transpose(-1, -2), -1)
  k2 = torch.softmax(ql @ kl.transpose(-1, -2), -1)
  k3 = torch.softmax(ql @ k.transpose(-1, -2) - 1e9 * (1 - mask[:, None, None, :]), -1)
  eye = torch.eye(m, dtype=k2.dtype)
  z = 1 / torch.max(torch.sum(k2, -2)) * k2.transpose(-1, -2)
  for _ in range(iters):
    kz = k2 @ z
    z = (0.25 * z) @ (13 * eye - kz @ (15 * eye - kz @ (7 * eye - kz)))
  x = (k1 @ z) @ (k3 @ v)
  w = torch.from_numpy(np.asarray(conv_weight)).double().T[:, None, :, None]
  x = x + torch.nn.functional.conv2d(
    v * mask[:, None, :, None], w, padding=(w.shape[2] // 2, 0), groups=w.shape[0]
  )
  return x.transpose(1, 2).numpy()


@needs_hf
def test_authors_padding_matches_their_code():
  q, k, v = _qkv(2, b=2, n=32, h=2, d=8)
  keep = np.ones((2, 32), bool)
  keep[0, 20:] = False
  weight = jnp.asarray(np.random.default_rng(3).normal(size=(5, 2)), jnp.float32)
  mask = jnp.asarray(keep)[:, None, None, :]

  @jax.jit
  def laplax_attention(q, k, v, mask, weight):
    got = nystrom.nystrom_attention(q, k, v, num_landmarks=4, mask=mask, nystrom_padding="zero")
    vz = v * mask[:, 0, 0, :, None, None].astype(jnp.float32)
    return got + nystrom.depthwise_conv(vz, weight)

  got = laplax_attention(q, k, v, mask, weight)
  want = _authors_reference(q, k, v, keep, 4, weight)
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5 * np.abs(want).max(), rtol=0)


# -- closed forms -------------------------------------------------------------


def test_landmarks_equal_tokens_is_softmax():
  q, k, v = _qkv(0, n=32)
  keep = np.ones((2, 32), bool)
  keep[1, 25:] = False
  mask = jnp.asarray(keep)[:, None, None, :]
  exact, _ = attention.reference_attention(q, k, v, mask=mask)
  full = nystrom.nystrom_attention(q, k, v, num_landmarks=32, mask=mask)
  np.testing.assert_allclose(np.asarray(full), np.asarray(exact), atol=1e-5)
  # The approximation itself at m = n: kernels 1, 2, 3 are all P, and once the
  # pseudo-inverse has converged P Z P = P (20 iterations; 6 leave ~1e-2).
  approx = nystrom.nystrom_attention(
    q, k, v, num_landmarks=32, mask=mask, exact_when_full=False, pinv_iterations=20
  )
  np.testing.assert_allclose(np.asarray(approx), np.asarray(exact), atol=1e-4)
  # A Laplacian head through attend: V - P V.
  lap = attention.attend(
    q,
    k,
    v,
    laplacian=np.array([True, False]),
    mask=mask,
    implementation="nystrom",
    nystrom=nystrom.NystromSpec(num_landmarks=32),
  )
  np.testing.assert_allclose(np.asarray(lap[:, :, 0]), np.asarray(v - exact)[:, :, 0], atol=1e-5)
  np.testing.assert_allclose(np.asarray(lap[:, :, 1]), np.asarray(exact)[:, :, 1], atol=1e-5)


def test_pinv_converges_to_inverse():
  r = np.random.default_rng(0)
  mat = jax.nn.softmax(jnp.asarray(r.normal(size=(2, 3, 8, 8)), jnp.float32), -1)
  for init in nystrom.PINV_INITS:
    z = nystrom.iterative_pinv(mat, 30, init)
    np.testing.assert_allclose(np.asarray(mat @ z), np.broadcast_to(np.eye(8), z.shape), atol=1e-4)


def laplacian_errors(landmarks, n=128, iterations=6, seed=0):
  """Relative Frobenius error of ``V - P~ V`` against the exact ``V - P V`` per
  landmark count (smooth random queries and keys; bench/nystrom_error.py)."""
  q, k, v = _qkv(seed, n=n, d=16, smooth=True)
  exact, _ = attention.reference_attention(q, k, v)
  lap = v - exact

  @jax.jit
  def errors(q, k, v, lap):
    out = []
    for m in landmarks:
      pv = nystrom.nystrom_attention(
        q, k, v, num_landmarks=m, pinv_iterations=iterations, exact_when_full=False
      )
      out.append(jnp.linalg.norm((v - pv) - lap) / jnp.linalg.norm(lap))
    return jnp.stack(out)

  return [float(e) for e in errors(q, k, v, lap)]


@pytest.mark.slow
def test_laplacian_error_shrinks_with_landmarks():
  landmarks = (1, 2, 4, 8, 16, 32, 64, 128)
  errors = laplacian_errors(landmarks)
  # With the default 6 iterations the error falls at every doubling of the
  # landmarks (measured 5.3e-2 at m=1 to 9.8e-3 at m=n), and by 4x overall.
  assert all(b <= a * 1.001 for a, b in zip(errors, errors[1:])), errors
  assert errors[-1] < errors[0] / 4, errors
  # Converged pseudo-inverse at m = n: the exact V - P V.
  assert laplacian_errors((128,), iterations=20)[0] < 1e-4


# -- linear in length ---------------------------------------------------------


def _avals(jaxpr):
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield eqn.primitive.name, getattr(var.aval, "shape", ())
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", None)
        if isinstance(sub, jax.extend.core.Jaxpr):
          inner = sub
        if inner is not None:
          yield from _avals(getattr(inner, "jaxpr", inner))


@pytest.mark.parametrize("padded", [False, True])
def test_no_length_by_length_array(padded):
  n, m = 512, 16
  q, k, v = _qkv(0, b=1, n=n, h=2, d=8)
  mask = jnp.ones((1, 1, 1, n), bool) if padded else None
  mha = attention.MultiHeadAttention(
    num_heads=2, implementation="nystrom", num_landmarks=m, conv_kernel_size=5
  )
  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, n, 16)), jnp.float32)
  params = jax.jit(mha.init)(jax.random.key(0), x)

  def loss(params, x):
    return jnp.sum(mha.apply(params, x, mask=mask) ** 2)

  for fn in (loss, jax.grad(loss, argnums=(0, 1))):
    shapes = list(_avals(jax.make_jaxpr(fn)(params, x).jaxpr))
    assert shapes
    big = [(p, s) for p, s in shapes if sum(dim >= n for dim in s) >= 2]
    assert not big, big[:5]
  # The softmax path of the same module does form [n, n]: the check can fail.
  soft = attention.MultiHeadAttention(num_heads=2, implementation="xla")
  shapes = list(_avals(jax.make_jaxpr(lambda x: soft.apply(soft.init(jax.random.key(0), x), x))(x)))
  assert any(sum(dim >= n for dim in s) >= 2 for _, s in shapes)


def test_gradient_matches_finite_differences():
  q, k, v = _qkv(4, b=1, n=16, h=1, d=4)
  w = jnp.asarray(np.random.default_rng(5).normal(size=q.shape), jnp.float32)

  @jax.jit
  def f(q, k, v):
    return jnp.sum(w * nystrom.nystrom_attention(q, k, v, num_landmarks=4))

  grads = jax.grad(f, argnums=(0, 1, 2))(q, k, v)
  r = np.random.default_rng(6)
  eps = 1e-2
  for i, arg in enumerate((q, k, v)):
    direction = jnp.asarray(r.normal(size=arg.shape), jnp.float32)
    args = [q, k, v]
    args[i] = arg + eps * direction
    plus = f(*args)
    args[i] = arg - eps * direction
    minus = f(*args)
    numeric = (plus - minus) / (2 * eps)
    analytic = jnp.sum(grads[i] * direction)
    np.testing.assert_allclose(float(analytic), float(numeric), rtol=2e-2, atol=1e-3)


def test_bad_inputs():
  q, k, v = _qkv(0, n=30)
  with pytest.raises(ValueError, match="must divide the length 30"):
    nystrom.nystrom_attention(q, k, v, num_landmarks=8)
  with pytest.raises(ValueError, match="key-padding masks"):
    nystrom.nystrom_attention(q, k, v, num_landmarks=5, mask=jnp.ones((2, 1, 30, 30), bool))
  with pytest.raises(ValueError, match="pinv_init"):
    nystrom.iterative_pinv(jnp.eye(3), init="bad")
  with pytest.raises(ValueError, match="no causal"):
    attention.attend(q, k, v, laplacian=np.zeros(2, bool), implementation="nystrom", is_causal=True)


def test_spectral_conditioning_is_the_same_on_nystrom_heads():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 16)), jnp.float32)
  kw = dict(num_heads=2, implementation="nystrom", num_landmarks=8, num_laplacian_heads=1)
  corrected = attention.MultiHeadAttention(spectral_lam=10.0, spectral_mode="full", **kw)
  plain = attention.MultiHeadAttention(**kw)
  params = plain.init(jax.random.key(0), x)["params"]
  shifted = dict(params)
  for name in ("query", "key", "value"):  # W + lam * I_k ("full": eye(D, H*d))
    shifted[name] = dict(params[name], kernel=params[name]["kernel"] + 10.0 * jnp.eye(16))
  want = plain.apply({"params": shifted}, x)
  got = corrected.apply({"params": params}, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4 * np.abs(want).max())
