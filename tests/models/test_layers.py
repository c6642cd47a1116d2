"""The hand-differentiated layers of laplax.models.layers against autodiff and
closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from laplax.models import layers


def test_gelu_forward_is_jax_and_its_vjp_is_the_closed_form_derivative():
  """layers.gelu's forward pass is jax.nn.gelu(approximate=True) bit for bit
  (float32 and bfloat16), and its backward pass is the derivative of
  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in float64 NumPy, and
  autodiff's of jax.nn.gelu."""
  x = np.concatenate([np.linspace(-8, 8, 801), [-30.0, -1e-3, 0.0, 1e-3, 30.0]])
  for dtype in (jnp.float32, jnp.bfloat16):
    xj = jnp.asarray(x, dtype)
    np.testing.assert_array_equal(
      np.asarray(layers.gelu(xj).astype(jnp.float32)),
      np.asarray(jax.nn.gelu(xj, approximate=True).astype(jnp.float32)),
    )
  c = np.sqrt(2 / np.pi)
  t = np.tanh(c * (x + 0.044715 * x**3))
  want = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)
  g = jax.vmap(jax.grad(layers.gelu))(jnp.asarray(x, jnp.float32))
  # atol: for |x| > 4, float32's tanh is +-1 to its last bit, which leaves
  # errors up to 1e-5 in both this VJP and autodiff's.
  np.testing.assert_allclose(np.asarray(g), want, atol=1e-5, rtol=1e-5)
  auto = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=True)))(jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(np.asarray(g), np.asarray(auto), atol=1e-5, rtol=1e-5)
  # The cotangent scales the result (a VJP, not just a derivative).
  _, vjp = jax.vjp(layers.gelu, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(
    np.asarray(vjp(jnp.full(x.shape, 3.0))[0]), 3 * want, atol=3e-5, rtol=1e-5
  )
