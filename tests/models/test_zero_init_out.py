"""model.zero_init_out: zero-initialised attention and MLP output projections."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers.models import make_gpt, make_vit

KEY = jax.random.PRNGKey
IMAGES = jax.random.normal(KEY(1), (2, 8, 8, 1))
VIT = dict(patch_size=4, width=16, depth=2, mlp_dim=16, num_heads=2)


def test_blocks_start_as_identity_so_laplacian_heads_are_a_no_op():
  lap = make_vit(
    num_classes=3, zero_init_out=True, num_laplacian_heads=2, head_init_zero=False, **VIT
  )
  std = make_vit(
    num_classes=3, zero_init_out=True, num_laplacian_heads=0, head_init_zero=False, **VIT
  )
  params = lap.init(KEY(0), IMAGES)["params"]
  for layer in ("block0", "block1"):
    assert not np.any(params[layer]["attention"]["out"]["kernel"])
    assert not np.any(params[layer]["mlp"]["fc2"]["kernel"])
    assert np.any(params[layer]["attention"]["query"]["kernel"])
  (y_lap, out), (y_std, _) = (
    lap.apply({"params": params}, IMAGES),
    std.apply({"params": params}, IMAGES),
  )
  np.testing.assert_array_equal(out["block0"]["sa"], 0.0)
  chex.assert_trees_all_close(y_lap, y_std, atol=1e-6)
  # Without it the two differ from the first step.
  lap1 = make_vit(num_classes=3, num_laplacian_heads=2, head_init_zero=False, **VIT)
  std1 = make_vit(num_classes=3, num_laplacian_heads=0, head_init_zero=False, **VIT)
  p1 = lap1.init(KEY(0), IMAGES)["params"]
  assert (
    np.abs(
      np.asarray(lap1.apply({"params": p1}, IMAGES)[0] - std1.apply({"params": p1}, IMAGES)[0])
    ).max()
    > 1e-5
  )


@pytest.mark.slow
def test_gradient_reaches_the_zero_output_projection_gpt():
  model = make_gpt(
    20, max_length=8, width=16, depth=2, num_heads=2, num_laplacian_heads=1, zero_init_out=True
  )
  tokens = jax.random.randint(KEY(2), (2, 8), 0, 20)
  params = model.init(KEY(0), tokens)["params"]
  assert not np.any(params["block1"]["attention"]["out"]["kernel"])
  loss = lambda p: -jax.nn.log_softmax(model.apply({"params": p}, tokens)[0])[..., 0].mean()
  grads = jax.grad(loss)(params)
  assert np.abs(np.asarray(grads["block1"]["attention"]["out"]["kernel"])).max() > 0
  assert np.abs(np.asarray(grads["block1"]["mlp"]["fc2"]["kernel"])).max() > 0
  # The attention branch's own weights get no gradient while W_O is zero.
  np.testing.assert_array_equal(grads["block1"]["attention"]["query"]["kernel"], 0.0)
  assert jnp.isfinite(loss(params))
