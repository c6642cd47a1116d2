"""laplax's Swin is timm's SwinTransformer, and both methods follow their definitions.

timm models are built with random weights (``pretrained=False``) and every
norm, bias and relative position table perturbed, so that each branch
matters. Logits are compared as ``max |laplax - timm| / max |timm|``.
Spectral conditioning is checked against a timm model whose ``qkv`` weight
has the correction added (the definition, written here in PyTorch's layout);
Laplacian heads against a NumPy window attention written from the
definition (``V - P V`` on the last ``k`` heads of every window, ``P =
softmax(q k^T / sqrt(d) + B + M)``), put into the timm model in place of
its attention, and their gradients against the same formula in PyTorch.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import attention, kernels
from laplax.convert import common, timm_swin, timm_vit
from laplax.models import spec as spec_lib
from laplax.models.swin import Swin

from helpers.runs import read_metrics, run_in_process
from helpers.timm_models import corrected_qkv, relative_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWIN_CONFIG = os.path.join(ROOT, "configs", "swin_imagenet.py")
HAVE_TIMM = all(importlib.util.find_spec(m) for m in ("torch", "timm"))
needs_timm = pytest.mark.skipif(not HAVE_TIMM, reason="pip install -r requirements-test.txt")
TOL = 1e-5
# A Swin small enough for the suite, with every feature exercised: 28 px,
# patch 2 -> a 14 x 14 grid, windows of 4 (padded to 16 x 16, shifted by 2),
# then 7 x 7 (padded to 8 x 8, shifted), heads 2 then 4.
ARGS = dict(
  img_size=28,
  in_chans=1,
  num_classes=10,
  patch_size=2,
  embed_dim=16,
  depths=(2, 2),
  num_heads=(2, 4),
  window_size=4,
)
MODEL_ARGS = "img_size=28,in_chans=1,num_classes=10,patch_size=2,embed_dim=16,depths=(2,2),num_heads=(2,4),window_size=4"  # noqa: E501


@pytest.fixture(scope="module")
def torch():
  import torch as torch_module

  torch_module.set_num_threads(1)
  return torch_module


@pytest.fixture(scope="module")
def timm_swin_model(torch):
  """A timm Swin of :data:`ARGS`, random weights, norms/biases/tables perturbed."""
  model = timm_vit.timm_model("swin_tiny_patch4_window7_224", ARGS, seed=3)
  gen = torch.Generator().manual_seed(4)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1 or "relative_position" in name:
        p.add_(0.5 * torch.randn(p.shape, generator=gen))
  return model


def state_of(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def images(batch=2, seed=0):
  """float32 ``[batch, 1, 28, 28]`` (timm's layout)."""
  return np.random.default_rng(seed).normal(size=(batch, 1, 28, 28)).astype(np.float32)


def laplax_logits(params, arch, x, **keys):
  spec = spec_lib.from_config(dict(timm_swin.model_keys(arch), **keys))
  model = Swin(spec, num_classes=arch["num_classes"])
  return jax.jit(model.apply)({"params": params}, x.transpose(0, 2, 3, 1))[0]


def torch_logits(torch, model, x):
  with torch.no_grad():
    return model(torch.from_numpy(x)).numpy()


def test_attend_bias_values_gradients_and_kernel_refusals():
  """The XLA kernel's additive bias: values and gradients (q, k, v, bias,
  broadcast over the batch) are autodiff's of the materialising reference;
  the fused kernels refuse a bias in one line."""
  r = np.random.default_rng(0)
  q, k, v = (jnp.asarray(r.normal(size=(3, 5, 2, 4)), jnp.float32) for _ in range(3))
  bias = jnp.asarray(r.normal(size=(1, 2, 5, 5)), jnp.float32)
  ref = lambda q, k, v, b: jnp.sum(
    jnp.sin(attention.reference_attention(q, k, v, scale=0.3, bias=b)[0])
  )
  want = jax.grad(ref, argnums=(0, 1, 2, 3))(q, k, v, bias)
  for keep in (True, False):
    f = lambda q, k, v, b, keep=keep: jnp.sum(
      jnp.sin(kernels.xla_attention(q, k, v, None, False, 0.3, keep, bias=b))
    )
    assert f(q, k, v, bias) == pytest.approx(float(ref(q, k, v, bias)), abs=1e-5)
    for a, b in zip(jax.grad(f, argnums=(0, 1, 2, 3))(q, k, v, bias), want):
      np.testing.assert_allclose(a, b, atol=1e-5)
  # Without the bias the kernel differs (the bias is used).
  assert abs(float(ref(q, k, v, None) - ref(q, k, v, bias))) > 1e-2
  for impl in ("cudnn", "splash"):
    with pytest.raises(ValueError, match=f"implementation='{impl}' takes no additive") as e:
      attention.attend(q, k, v, laplacian=np.zeros(2, bool), bias=bias, implementation=impl)
    assert "\n" not in str(e.value)


@needs_timm
def test_timm_swin_logits_and_bitwise_round_trip(torch, timm_swin_model):
  tm = timm_swin_model
  arch = timm_swin.architecture(tm)
  assert arch["stage_depths"] == (2, 2) and arch["num_heads"] == 2 and arch["norm_eps"] == 1e-5
  params = timm_swin.timm_to_laplax(state_of(tm), arch)
  x = images()
  err = relative_diff(laplax_logits(params, arch, x), torch_logits(torch, tm, x))
  print(f"\nswin {ARGS}: max|logit diff|/max|logit| = {err:.2e}")
  assert err <= TOL
  spec = spec_lib.from_config(timm_swin.model_keys(arch))
  config = type("C", (), {"data": {"image_size": 28}})()
  state, model_args = timm_swin.laplax_to_timm(params, spec, config)
  back = timm.models.swin_transformer.SwinTransformer(**model_args)
  back.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
  original = state_of(tm)
  assert sorted(state) == sorted(original)
  for k in state:
    np.testing.assert_array_equal(state[k], original[k], err_msg=k)
  np.testing.assert_array_equal(torch_logits(torch, back.eval(), x), torch_logits(torch, tm, x))


@pytest.mark.slow
@needs_timm
@pytest.mark.parametrize("mode", ["full", "per_head", "fused", "svd"])
def test_spectral_swin_equals_timm_with_the_correction_added(torch, timm_swin_model, mode):
  """laplax's Swin with spectral conditioning = timm's Swin whose qkv weights
  carry ``W + C`` (every block), in logits and in the gradient with respect
  to a block's qkv weight (``dL/dW`` of laplax is timm's ``dL/d(W + C)``)."""
  import copy

  tm = copy.deepcopy(timm_swin_model)
  arch = timm_swin.architecture(tm)
  params = timm_swin.timm_to_laplax(state_of(tm), arch)
  # Small enough that the softmax is not saturated; "fused" corrects W_Q
  # alone, whose effect on the logits is lam x.k with a small k: the paper's 10.
  lam = 10.0 if mode == "fused" else 1.5
  with torch.no_grad():
    for st in tm.layers:
      for blk in st.blocks:
        w = blk.attn.qkv.weight
        w.copy_(torch.from_numpy(corrected_qkv(w.numpy(), mode, lam, blk.attn.num_heads)))
  x = images()
  keys = dict(spectral={"enabled": True, "lam": lam, "mode": mode})
  err = relative_diff(laplax_logits(params, arch, x, **keys), torch_logits(torch, tm, x))
  plain = relative_diff(laplax_logits(params, arch, x), torch_logits(torch, tm, x))
  print(f"\nswin spectral {mode}: {err:.2e} (without the correction {plain:.2e})")
  assert err <= TOL and plain > 10 * TOL  # the correction matters: the test can fail
  if mode != "full":
    return
  spec = spec_lib.from_config(dict(timm_swin.model_keys(arch), **keys))
  model = Swin(spec, num_classes=10)
  loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x.transpose(0, 2, 3, 1))[0]))
  grads = jax.grad(loss)(params)["block2"]["attention"]
  tm.zero_grad()
  torch.sin(tm(torch.from_numpy(x))).sum().backward()
  want = tm.layers[1].blocks[0].attn.qkv.weight.grad.numpy()
  got = np.concatenate([np.asarray(grads[n]["kernel"]).T for n in ("query", "key", "value")])
  assert relative_diff(got, want) <= 1e-4


def _numpy_window_attention(attn, k):
  """A forward of timm ``WindowAttention`` ``attn`` in NumPy, from the
  definition: per window and head ``P = softmax(q k^T / sqrt(d) + B + M)``,
  output ``P V`` (standard heads) or ``V - P V`` (the last ``k`` heads)."""
  import torch

  def forward(x, mask=None):
    xs = x.detach().numpy().astype(np.float64)
    n_win, n, c = xs.shape
    heads = attn.num_heads
    w = attn.qkv.weight.detach().numpy().astype(np.float64)
    b = attn.qkv.bias.detach().numpy().astype(np.float64)
    qkv = (xs @ w.T + b).reshape(n_win, n, 3, heads, c // heads).transpose(2, 0, 3, 1, 4)
    q, kk, v = qkv
    table = attn.relative_position_bias_table.detach().numpy().astype(np.float64)
    index = attn.relative_position_index.numpy().reshape(-1)
    bias = table[index].reshape(n, n, heads).transpose(2, 0, 1)
    logits = q @ kk.transpose(0, 1, 3, 2) / np.sqrt(c // heads) + bias
    if mask is not None:
      m = mask.numpy().astype(np.float64)
      logits = logits.reshape(-1, m.shape[0], heads, n, n) + m[None, :, None]
      logits = logits.reshape(n_win, heads, n, n)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = p @ v
    if k:
      y[:, heads - k :] = v[:, heads - k :] - y[:, heads - k :]
    y = y.transpose(0, 2, 1, 3).reshape(n_win, n, c)
    pw = attn.proj.weight.detach().numpy().astype(np.float64)
    pb = attn.proj.bias.detach().numpy().astype(np.float64)
    return torch.from_numpy((y @ pw.T + pb).astype(np.float32))

  return forward


def _torch_laplacian_attention(torch, attn, k):
  """The same formula in PyTorch (for gradients): ``v - SDPA`` on the last ``k`` heads."""

  def forward(x, mask=None):
    n_win, n, c = x.shape
    heads = attn.num_heads
    qkv = attn.qkv(x).reshape(n_win, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
    q, kk, v = qkv.unbind(0)
    bias = attn._get_rel_pos_bias()
    if mask is not None:
      bias = (bias.unsqueeze(1) + mask[None, :, None]).expand(
        n_win // mask.shape[0], -1, -1, -1, -1
      )
      bias = bias.reshape(n_win, heads, n, n)
    y = torch.nn.functional.scaled_dot_product_attention(q, kk, v, attn_mask=bias)
    y = torch.cat([y[:, : heads - k], v[:, heads - k :] - y[:, heads - k :]], dim=1)
    return attn.proj(y.transpose(1, 2).reshape(n_win, n, c))

  return forward


@pytest.mark.slow
@needs_timm
def test_laplacian_heads_per_window_equal_the_definition(torch, timm_swin_model):
  """``num_laplacian_heads=1``: the last head of every block's window
  attention outputs ``V - P V`` (values: NumPy; gradients of the qkv weight:
  PyTorch autograd of the same formula)."""
  import copy

  tm = copy.deepcopy(timm_swin_model)
  arch = timm_swin.architecture(tm)
  params = timm_swin.timm_to_laplax(state_of(tm), arch)
  x = images()
  for st in tm.layers:
    for blk in st.blocks:
      blk.attn.forward = _numpy_window_attention(blk.attn, 1)
  want = torch_logits(torch, tm, x)
  err = relative_diff(laplax_logits(params, arch, x, num_laplacian_heads=1), want)
  plain = relative_diff(laplax_logits(params, arch, x), want)
  print(f"\nswin Laplacian heads vs NumPy: {err:.2e} (plain {plain:.2e})")
  assert err <= TOL and plain > 1e-3
  for st in tm.layers:
    for blk in st.blocks:
      blk.attn.forward = _torch_laplacian_attention(torch, blk.attn, 1)
  tm.zero_grad()
  torch.sin(tm(torch.from_numpy(x))).sum().backward()
  spec = spec_lib.from_config(dict(timm_swin.model_keys(arch), num_laplacian_heads=1))
  assert spec.laplacian == ((False, True),) * 2 + ((False, False, False, True),) * 2
  model = Swin(spec, num_classes=10)
  loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x.transpose(0, 2, 3, 1))[0]))
  grads = jax.grad(loss)(params)
  for i, blk in ((1, tm.layers[0].blocks[1]), (3, tm.layers[1].blocks[1])):
    a = grads[f"block{i}"]["attention"]
    got = np.concatenate([np.asarray(a[n]["kernel"]).T for n in ("query", "key", "value")])
    assert relative_diff(got, blk.attn.qkv.weight.grad.numpy()) <= 1e-4
    got_table = np.asarray(grads[f"block{i}"]["relative_position_bias"])
    assert relative_diff(got_table, blk.attn.relative_position_bias_table.grad.numpy()) <= 1e-4


def test_swin_spec_refusals_are_one_line():
  base = dict(width=16, depth=4, stage_depths=(2, 2), num_heads=2, window_size=4, patch_size=2)
  cases = [
    (dict(base, depth=3), "model.depth=3 must be the number of Swin blocks"),
    (dict(base, stage_depths=(2, 0)), "model.stage_depths=(2, 0) must be a non-empty tuple"),
    (dict(base, num_laplacian_heads=3), "must be in 0..2"),
    (dict(base, laplacian_mask=[[True, False]] * 4), "one list per layer of that layer's heads"),
    (dict(base, scan_layers=True), "a Swin's stages differ"),
    (dict(base, implementation="splash"), "only the XLA kernel takes"),
  ]
  for keys, message in cases:
    with pytest.raises(spec_lib.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
      spec_lib.build("swin", **keys)
  # On a TPU the default kernel for 128-token windows would be splash; with
  # the bias it is XLA, and the line says why.
  name, line = kernels.describe(None, (128,), head_dim=64, dtype="float32", platform="tpu")
  assert name == "splash"
  name, line = kernels.describe(
    None, (128,), head_dim=64, dtype="float32", platform="tpu", bias=True
  )
  assert name == "xla" and "no additive attention bias" in line
  ok = spec_lib.build("swin", **dict(base, laplacian_mask=[[True, False]] * 2 + [[True] * 4] * 2))
  assert ok.laplacian_array.tolist() == [[True, False, False, False]] * 2 + [[True] * 4] * 2
  # timm's Swin has no qk-norm nor LayerScale: --to timm refuses them by name.
  for keys, key in ((dict(qk_norm=True), "qk_norm"), (dict(layerscale_init=1e-6), "layerscale")):
    spec = spec_lib.build("swin", **dict(base, **keys))
    with pytest.raises(common.ConvertError, match=f"model.{key}.*SwinTransformer has no") as e:
      timm_swin.laplax_to_timm({}, spec, None)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@needs_timm
def test_converted_swin_loads_without_data_and_goes_back(tmp_path, torch, timm_swin_model):
  """``--from timm --weights`` into a workdir (the Fashion-MNIST Swin config,
  no dataset prepared): ``laplax.load`` gives timm's logits; ``--to timm``
  gives back timm's weights bitwise; with Laplacian heads it needs ``--force``."""
  from safetensors.numpy import save_file

  import laplax
  from laplax.cli import common as cli

  weights = tmp_path / "swin.safetensors"
  save_file(state_of(timm_swin_model), str(weights))
  config = cli._load_config_file(SWIN_CONFIG + ":size=tiny")
  config.data.data_dir = str(tmp_path / "no_data")
  os.makedirs(config.data.data_dir)
  common.plain_attention(config, [])
  workdir = tmp_path / "swin"
  timm_vit.convert_from_timm(
    "swin_tiny_patch4_window7_224", str(weights), MODEL_ARGS, config, str(workdir)
  )
  run = laplax.load(str(workdir))
  assert run.config.model.name == "swin" and run.config.model.window_size == 4
  x = images(seed=1)
  got = jax.jit(run.model.apply)({"params": run.params}, x.transpose(0, 2, 3, 1))[0]
  err = relative_diff(got, torch_logits(torch, timm_swin_model, x))
  print(f"\nlaplax.load of a converted Swin vs timm: {err:.2e}")
  assert err <= TOL
  assert os.listdir(config.data.data_dir) == []
  out = tmp_path / "back"
  assert timm_vit.convert_to_timm(str(workdir), str(out), force=False) is None
  back = timm_vit.timm_from_dir(str(out))
  assert type(back).__name__ == "SwinTransformer"
  original = state_of(timm_swin_model)
  for k, v in state_of(back).items():
    np.testing.assert_array_equal(v, original[k], err_msg=k)
  # The same conversion with a Laplacian head: --to timm refuses without --force.
  config.model.num_laplacian_heads = 1
  lap = tmp_path / "lap"
  timm_vit.convert_from_timm(
    "swin_tiny_patch4_window7_224", str(weights), MODEL_ARGS, config, str(lap)
  )
  with pytest.raises(common.ConvertError, match="Laplacian heads .*layer 3: heads \\[3\\]"):
    timm_vit.convert_to_timm(str(lap), str(tmp_path / "refused"), force=False)
  assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_swin_fashion_mnist_config_trains(tmp_path, fmnist_data_dir, capfd):
  """``configs/swin_imagenet.py:size=tiny`` (a smaller width) trains 3 steps
  on Fashion-MNIST with a Laplacian head and spectral conditioning, and
  ``eval.py`` evaluates it."""
  workdir = tmp_path / "swin"
  r = run_in_process(
    [
      "train.py",
      "--config",
      SWIN_CONFIG + ":size=tiny,laplacian=1,spectral=True",
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={fmnist_data_dir}",
      "--config.model.width=16",
      "--config.model.mlp_dim=32",
      "--config.total_steps=3",
      "--config.log_every=1",
      "--config.batch_size=16",
      "--config.eval_batch_size=500",
      "--config.data.eval_split=test[:500]",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  train = [m for m in read_metrics(workdir) if m["split"] == "train"]
  assert [m["step"] for m in train] == [1, 2, 3]
  assert all(np.isfinite(m["loss"]) for m in train)
  evals = [m for m in read_metrics(workdir) if m["split"] != "train"]
  assert evals and 0.0 <= evals[-1]["accuracy"] <= 1.0


timm = None


@pytest.fixture(autouse=True, scope="module")
def _timm():
  global timm
  if HAVE_TIMM:
    import timm as timm_module

    timm = timm_module


def test_model_args_take_tuples_and_refuse_bad_ones_in_one_line():
  args = timm_vit.parse_model_args(MODEL_ARGS)
  assert args == ARGS
  assert timm_vit.parse_model_args("depths=[2, 2],x=1.5,y=None") == dict(
    depths=(2, 2), x=1.5, y=None
  )
  with pytest.raises(common.ConvertError, match="not a tuple of literals") as e:
    timm_vit.parse_model_args("depths=(2,a)")
  assert "\n" not in str(e.value)
