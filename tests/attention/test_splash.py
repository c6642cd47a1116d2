"""Splash attention (``implementation="splash"``) on the CPU, in Pallas interpret mode,
and the choice of kernel by platform (``implementation=None``).

References: :func:`laplax.attention.reference_attention` (the softmax definition,
float32, materialising ``P``) and its autodiff; the XLA kernel for the model
steps. Interpret mode is slow (seconds per compile), so the shapes are the
smallest the kernel takes: 128 or 256 tokens, 1-2 heads, head dimension 32.

The mesh test runs this file as a script in a subprocess with 8 fake CPU
devices (JAX cannot add devices after it started in the pytest process):
``XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/attention/test_splash.py OUT.npz``.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax
import jax.numpy as jnp

from laplax import attention, kernels, sharding
from laplax.models import spec as spec_lib

B, L, H, D = 1, 128, 2, 32
LAP = np.array([False, True])  # head 1 Laplacian: V - P V


def qkv(batch=B, length=L, heads=H, kv_heads=H, dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  shapes = [(batch, length, heads, D)] + [(batch, length, kv_heads, D)] * 2
  return [jax.random.normal(k, s).astype(dtype) for k, s in zip(keys, shapes)]


def value_and_grads(impl, q, k, v, **kw):
  """attend's output and the q/k/v gradients of sum(sin(output)) (a
  non-uniform cotangent), jitted."""
  f = lambda q, k, v: attention.attend(q, k, v, implementation=impl, **kw)
  loss = lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v).astype(jnp.float32)))
  return jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)))(q, k, v)


def assert_close(got, want, tol):
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol
    )


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_values_and_gradients_match_the_softmax_definition(causal):
  q, k, v = qkv()
  got = value_and_grads("splash", q, k, v, laplacian=LAP, is_causal=causal)
  want = value_and_grads("reference", q, k, v, laplacian=LAP, is_causal=causal)
  assert_close(got, want, 1e-5)
  # The Laplacian head really is V - P V: token 0 of a causal head attends to itself only.
  if causal:
    np.testing.assert_allclose(got[0][:, 0, 1], 0.0, atol=1e-6)


def test_grouped_heads_learned_mix_and_scale():
  q, k, v = qkv(kv_heads=1, seed=1)
  mix = jnp.array([0.3, 0.9])
  kw = dict(laplacian=LAP, is_causal=True, mix=mix, scale=0.3)
  assert_close(
    value_and_grads("splash", q, k, v, **kw), value_and_grads("reference", q, k, v, **kw), 1e-5
  )


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 100, 200])
def test_sliding_window_is_splash_s_local_mask(window):
  """The fork's causal sliding window: splash (its LocalMask, blocks outside
  skipped) equals the reference kernel with the window as a mask, values and
  gradients, with a Laplacian head and grouped heads; and the window is
  real: the last token's output does not change when the keys outside its
  window do."""
  q, k, v = qkv(length=256, kv_heads=1, seed=3)
  kw = dict(laplacian=LAP, is_causal=True, window=window)
  got = value_and_grads("splash", q, k, v, **kw)
  assert_close(got, value_and_grads("reference", q, k, v, **kw), 1e-5)
  assert_close(got, value_and_grads("xla", q, k, v, **kw), 1e-5)
  outside = 255 - window  # keys 0 .. outside-1 are out of the last query's window
  k2, v2 = k.at[:, :outside].set(7.0), v.at[:, :outside].set(-3.0)
  moved = attention.attend(q, k2, v2, implementation="splash", **kw)
  np.testing.assert_allclose(moved[:, -1], got[0][:, -1], atol=1e-5, rtol=1e-5)
  if window < 255:  # and a window that is not a causal mask changes the answer
    full = attention.attend(q, k, v, implementation="splash", laplacian=LAP, is_causal=True)
    assert not np.allclose(full[:, -1], got[0][:, -1], atol=1e-4)


def test_key_padding_mask_and_bfloat16():
  q, k, v = qkv(batch=2, seed=2)
  mask = (jnp.arange(L) < jnp.array([[70], [128]]))[:, None, None, :]  # [2, 1, 1, L]
  got = attention.attend(q, k, v, laplacian=LAP, mask=mask, implementation="splash")
  want = attention.attend(q, k, v, laplacian=LAP, mask=mask, implementation="reference")
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
  got = attention.attend(qb, kb, vb, laplacian=LAP, is_causal=True, implementation="splash")
  want = attention.attend(q, k, v, laplacian=LAP, is_causal=True, implementation="reference")
  assert got.dtype == jnp.bfloat16
  assert_close(got, want, 3e-2)  # bfloat16 rounding of q, k, v, P and the output


def test_bfloat16_gradients_match_the_float32_definition():
  """bfloat16 q, k, v through splash: output and q/k/v gradients (bfloat16) against
  the float32 softmax definition and its autodiff on the unrounded inputs. Tolerance:
  2e-2 of each array's largest magnitude, about 5 bfloat16 epsilons (2^-8); measured
  0.3-0.9% here (rounding of the inputs, P, the cotangent and the outputs)."""
  q, k, v = qkv(seed=4)
  bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  got = value_and_grads("splash", *bf16, laplacian=LAP, is_causal=True)
  want = value_and_grads("reference", q, k, v, laplacian=LAP, is_causal=True)
  for name, a, b in zip(
    ("out", "dq", "dk", "dv"), jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
  ):
    assert a.dtype == jnp.bfloat16, name
    a, b = np.asarray(a, np.float32), np.asarray(b)
    for head in range(H):  # head 0 softmax, head 1 Laplacian (its gradients flip sign)
      err = np.max(np.abs(a[:, :, head] - b[:, :, head]))
      assert err <= 2e-2 * np.max(np.abs(b[:, :, head])), (name, head, err)


def test_refusals_name_the_fix():
  q, k, v = qkv(length=96)
  with pytest.raises(ValueError, match="multiples of 128, got 96 queries.*implementation='xla'"):
    attention.attend(q, k, v, laplacian=LAP, implementation="splash")
  q, k, v = qkv()
  with pytest.raises(ValueError, match="no attention dropout"):
    attention.attend(
      q,
      k,
      v,
      laplacian=LAP,
      implementation="splash",
      dropout_rate=0.1,
      dropout_rng=jax.random.key(0),
    )
  with pytest.raises(ValueError, match="return_weights needs implementation='reference'"):
    attention.attend(q, k, v, laplacian=LAP, implementation="splash", return_weights=True)
  with pytest.raises(ValueError, match=r"key-padding mask of shape \[batch, 1, 1, kv_length\]"):
    attention.attend(
      q, k, v, laplacian=LAP, implementation="splash", mask=jnp.tril(jnp.ones((L, L), bool))
    )
  with pytest.raises(
    spec_lib.SpecError, match="attention sees 100 tokens; use model.implementation='xla'"
  ):
    spec_lib.build("gpt", width=32, num_heads=2, max_length=100, implementation="splash")
  with pytest.raises(spec_lib.SpecError, match="no attention dropout"):
    spec_lib.build("vit", width=32, num_heads=2, attention_dropout=0.1, implementation="splash")


def test_config_check_counts_the_vit_tokens():
  from laplax import tasks
  from laplax.config import validation as config_lib

  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import vit_fashion_mnist

  config = vit_fashion_mnist.get_config()
  assert config_lib.attention_lengths(config, 28) == (16,)  # (28/7)^2 patches, mean pooling
  config.model.pool, config.model.patch_size = "tok", 4
  assert config_lib.attention_lengths(config, 28) == (50,)  # (28/4)^2 + class token
  config.model.implementation = "splash"
  config.data.image_size = 32
  with pytest.raises(config_lib.ConfigError, match="attention sees 65 tokens"):
    tasks.validate(config)
  config.model.pool, config.model.patch_size = "gap", 2  # 16 x 16 patches, no class token
  tasks.validate(config)


def test_default_follows_the_platform_and_falls_back_to_xla():
  choose = lambda n, dtype="bfloat16", platform="tpu", **kw: kernels.choose(
    None, q_length=n, kv_length=n, head_dim=64, dtype=dtype, platform=platform, **kw
  )
  assert choose(256) == ("splash", None)
  kernel, why = choose(17)
  assert kernel == "xla" and "multiples of 128, got 17" in why
  assert choose(256, mask_shape=(2, 1, 256, 256))[0] == "xla"
  assert choose(256, mask_shape=(2, 1, 1, 256))[0] == "splash"
  assert choose(17, platform="gpu") == ("cudnn", None)
  assert choose(17, "float32", "gpu")[0] == "xla"
  assert choose(256, platform="cpu") == ("xla", None)
  assert kernels.choose(
    "splash", q_length=17, kv_length=17, head_dim=64, dtype="float32", platform="cpu"
  ) == ("splash", None)
  name, line = kernels.describe(None, (197, 256), head_dim=64, dtype="bfloat16", platform="tpu")
  assert name == "xla+splash"
  assert "xla for 197 tokens, splash for 256 tokens" in line and "falls back" in line
  assert kernels.describe(None, (50,), head_dim=16, dtype="float32", platform="cpu") == (
    "xla",
    "attention kernel: xla on cpu (the default)",
  )
  assert kernels.target_platform() == "cpu"


def test_xla_kernel_recomputing_p_gives_the_same_gradients():
  q, k, v = qkv(length=16, seed=3)

  def grads(keep):
    f = lambda q, k, v: jnp.sum(jnp.sin(kernels.xla_attention(q, k, v, None, True, 0.2, keep)))
    return jax.jit(jax.grad(f, (0, 1, 2)))(q, k, v)

  assert_close(grads(False), grads(True), 1e-6)
  # The default keeps P on a CPU only; keep_probs forces it (model.xla_keep_probs,
  # compile_report --xla-keeps-p).
  residuals = lambda keep=None: jax.vjp(
    lambda q: kernels.attention(
      q, k, v, mask=None, is_causal=True, scale=0.2, implementation="xla", xla_keep_probs=keep
    )[0],
    q,
  )[1]
  size = lambda f: sum(x.size for x in jax.tree_util.tree_leaves(f))
  assert size(residuals()) == size(residuals(True))
  assert size(residuals()) - size(residuals(False)) == 1 * 2 * 16 * 16  # P [batch, heads, q, kv]
  # The model passes its xla_keep_probs (config model.xla_keep_probs) down to the kernel.
  x = jnp.ones((1, 16, 32))

  def module_residuals(keep):
    mha = attention.MultiHeadAttention(num_heads=2, xla_keep_probs=keep, implementation="xla")
    params = mha.init(jax.random.key(0), x)
    return size(jax.vjp(lambda p: mha.apply(p, x, is_causal=True), params)[1])

  assert module_residuals(None) - module_residuals(False) == 1 * 2 * 16 * 16


def _train_step(model, x, y_fn):
  """Loss and parameters after one SGD step of ``model`` on ``x``."""
  params = model.init(jax.random.key(0), x)["params"]

  def loss(p):
    return y_fn(model.apply({"params": p}, x, train=True))

  value, grads = jax.value_and_grad(loss)(params)
  return value, jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("family", ["vit", "gpt"])
def test_model_train_step_equals_the_xla_kernel(family):
  from helpers.models import make_gpt, make_vit

  common = dict(width=32, depth=1, num_heads=2, mlp_dim=32, num_laplacian_heads=1)

  def run(impl):
    if family == "vit":  # 32x32 images in 2x2 patches: 256 tokens, mean pooling
      model = make_vit(
        num_classes=3, pool="gap", patch_size=2, head_init_zero=False, implementation=impl, **common
      )
      x = jax.random.normal(jax.random.key(1), (1, 32, 32, 3))
      return jax.jit(
        lambda x: _train_step(
          model, x, lambda out: jnp.mean(jnp.square(out[0] if isinstance(out, tuple) else out))
        )
      )(x)
    model = make_gpt(16, max_length=128, laplacian_mix="learned", implementation=impl, **common)
    x = jax.random.randint(jax.random.key(1), (1, 128), 0, 16)
    return jax.jit(
      lambda x: _train_step(
        model,
        x,
        lambda out: jnp.mean(jax.nn.log_softmax(out[0] if isinstance(out, tuple) else out)[..., 0]),
      )
    )(x)

  assert_close(run("splash"), run("xla"), 1e-5)


@pytest.mark.slow
@pytest.mark.subprocess
def test_shard_mapped_kernel_on_a_2x2x2_mesh_equals_one_device(tmp_path):
  out = tmp_path / "mesh.npz"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = np.load(out)
  assert int(result["devices"]) == 8 and int(result["shard_maps"]) >= 1
  for name in ("out", "dq", "dk", "dv"):
    np.testing.assert_allclose(
      result[f"mesh_{name}"], result[f"one_{name}"], atol=1e-5, rtol=1e-5, err_msg=name
    )


def _mesh_main(path):
  """Attention of batch 4 x 2 heads (1 key/value head: grouped) by splash on
  the (data, fsdp, tensor) = (2, 2, 2) mesh (the batch over data x fsdp, the
  query heads over tensor) and by the XLA kernel on one device (itself checked
  against the definition in tests/attention/test_attention.py); saved to ``path``."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  q, k, v = qkv(batch=4, kv_heads=1, seed=4)

  def both(impl):
    f = lambda q, k, v: attention.attend(
      q, k, v, laplacian=LAP, is_causal=True, implementation=impl
    )
    return lambda q, k, v: (
      f(q, k, v),
      jax.grad(lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v))), (0, 1, 2))(q, k, v),
    )

  one = jax.jit(both("xla"))(q, k, v)  # one device, the XLA kernel (faster to compile)
  mesh = sharding.make_mesh((2, 2, 2))
  with sharding.context(mesh, sharding.DEFAULT_RULES):
    put = lambda x, heads: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None, heads)))
    args = (put(q, "tensor"), put(k, None), put(v, None))
    step = jax.jit(both("splash"))
    text = step.lower(*args).as_text()
    sharded = step(*args)
  names = ("out", "dq", "dk", "dv")
  flat = lambda r: [r[0], *r[1]]
  np.savez(
    path,
    devices=len(jax.devices()),
    shard_maps=text.count("shard_map") or text.count("sdy.manual_computation"),
    **{f"one_{n}": np.asarray(x) for n, x in zip(names, flat(one))},
    **{f"mesh_{n}": np.asarray(x) for n, x in zip(names, flat(sharded))},
  )


if __name__ == "__main__":
  _mesh_main(sys.argv[1])
