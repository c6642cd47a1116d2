"""Property-based tests of ``laplax.attention.attend`` (hypothesis).

Random shapes (query/key length, query and key/value heads with
grouped-query sharing), random boolean masks (including rows with
no allowed key), random head mixes and causal or not. For every draw:

* outputs are finite;
* ``"xla"`` and ``"reference"`` agree with the float64 NumPy formula of
  the paper (``np_attention`` of test_attention.py);
* Laplacian heads equal ``V`` minus the standard heads' output on the same
  inputs (Zhang & Papyan 2026, ``(I - P) V``);
* with ``is_causal``, perturbing the tokens after position ``t`` changes no
  output at positions ``<= t``.

Shapes are drawn from small sets so that the number of distinct compilations
stays small (the suite runs on 2 CPU cores).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laplax.attention import attend

from helpers.attention import np_attention

SETTINGS = settings(
  max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def attention_inputs(draw):
  """A dict of q, k, v, laplacian, mask, causal drawn at random."""
  batch = 2
  length = draw(st.sampled_from([1, 4]))
  num_kv_heads = draw(st.sampled_from([1, 2]))
  num_heads = num_kv_heads * draw(st.sampled_from([1, 2]))
  head_dim = 4
  causal = draw(st.booleans())
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  scale = draw(st.sampled_from([0.1, 1.0, 4.0]))  # up to near one-hot P
  q = (scale * rng.normal(size=(batch, length, num_heads, head_dim))).astype(np.float32)
  k = rng.normal(size=(batch, length, num_kv_heads, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, length, num_kv_heads, head_dim)).astype(np.float32)
  laplacian = np.array(draw(st.lists(st.booleans(), min_size=num_heads, max_size=num_heads)))
  mask_kind = draw(st.sampled_from(["none", "random", "empty_row"]))
  mask = None
  if mask_kind != "none":
    mask = rng.random((batch, 1, length, length)) < 0.6
    if mask_kind == "empty_row":
      mask[:, :, rng.integers(length)] = False  # a row with no allowed key
  return dict(q=q, k=k, v=v, laplacian=laplacian, mask=mask, causal=causal)


def _attend(x, impl, laplacian=None, q=None, k=None, v=None):
  return np.asarray(
    attend(
      jnp.asarray(x["q"] if q is None else q),
      jnp.asarray(x["k"] if k is None else k),
      jnp.asarray(x["v"] if v is None else v),
      laplacian=x["laplacian"] if laplacian is None else laplacian,
      mask=None if x["mask"] is None else jnp.asarray(x["mask"]),
      is_causal=x["causal"],
      implementation=impl,
    )
  )


@pytest.mark.slow
@SETTINGS
@given(attention_inputs())
def test_attend_finite_and_equal_to_formula(x):
  expected = np_attention(
    x["q"], x["k"], x["v"], x["laplacian"], mask=x["mask"], causal=x["causal"]
  )
  for impl in ("xla", "reference"):
    out = _attend(x, impl)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


@SETTINGS
@given(attention_inputs())
def test_laplacian_heads_are_v_minus_standard(x):
  num_heads = x["q"].shape[2]
  std = _attend(x, "xla", laplacian=np.zeros(num_heads, bool))
  lap = _attend(x, "xla", laplacian=np.ones(num_heads, bool))
  groups = num_heads // x["v"].shape[2]
  v = np.repeat(x["v"], groups, axis=2)
  np.testing.assert_allclose(lap, v - std, atol=1e-5, rtol=0)
  mixed = _attend(x, "xla")
  sel = x["laplacian"]
  np.testing.assert_allclose(mixed[:, :, sel], lap[:, :, sel], atol=1e-6, rtol=0)
  np.testing.assert_allclose(mixed[:, :, ~sel], std[:, :, ~sel], atol=1e-6, rtol=0)


@SETTINGS
@given(attention_inputs(), st.integers(0, 5), st.integers(0, 2**31 - 1))
def test_causal_outputs_ignore_later_tokens(x, t, seed):
  x = dict(x, causal=True)
  length = x["q"].shape[1]
  t = t % length
  rng = np.random.default_rng(seed)
  later = (np.arange(length) > t)[None, :, None, None]
  q2, k2, v2 = (
    np.where(later, a + rng.normal(size=a.shape).astype(np.float32), a)
    for a in (x["q"], x["k"], x["v"])
  )
  out1 = _attend(x, "xla")
  out2 = _attend(x, "xla", q=q2, k=k2, v=v2)
  # A mask that forbids every earlier key of a row still leaves that row
  # defined (uniform over all keys, the documented convention), so the
  # property holds only for rows with at least one allowed key.
  allowed = np.tril(np.ones((length, length), bool))[None, None]
  if x["mask"] is not None:
    allowed = allowed & x["mask"]
  rows = np.broadcast_to(allowed.any(-1)[:, 0, : t + 1], out1.shape[:1] + (t + 1,))
  np.testing.assert_allclose(out2[:, : t + 1][rows], out1[:, : t + 1][rows], atol=1e-6, rtol=0)
