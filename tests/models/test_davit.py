"""laplax's DaViT is timm's DaVit, and both methods follow their definitions.

timm models are built with random weights (``pretrained=False``) and every
norm and bias perturbed (the depthwise position encodings included), so that
each branch matters. Logits are compared as ``max |laplax - timm| / max
|timm|``. Spectral conditioning is checked against a timm model whose ``qkv``
weights have the correction added (the definition, in PyTorch's layout);
Laplacian heads against NumPy attentions written from the definitions, put
into the timm model in place of its attentions: per window ``V - P V`` on the
last ``k`` heads, and per channel group (``P = softmax(d^-1/2 k^T v)`` over
the group's ``d`` channels, timm's output ``q P^T``) ``q (I - P)^T`` on the
last ``k`` groups.
"""

import copy
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.convert import common, timm_davit, timm_vit
from laplax.models import spec as spec_lib
from laplax.models.davit import DaViT

from helpers.runs import read_metrics, run_in_process
from helpers.timm_models import corrected_qkv, relative_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAVIT_CONFIG = os.path.join(ROOT, "configs", "davit_imagenet.py")
HAVE_TIMM = all(importlib.util.find_spec(m) for m in ("torch", "timm"))
needs_timm = pytest.mark.skipif(not HAVE_TIMM, reason="pip install -r requirements-test.txt")
TOL = 1e-5
# A DaViT small enough for the suite: images of 27 x 26 px (the stem pads to
# 28 x 28 -> a 7 x 7 grid), windows of 4 (padded to 8 x 8), then a 4 x 4 grid
# (one window) after the downsampling; two stages, heads 2 then 4.
ARGS = dict(
  in_chans=1,
  num_classes=10,
  depths=(1, 2),
  embed_dims=(16, 32),
  num_heads=(2, 4),
  window_size=4,
)
MODEL_ARGS = (
  "in_chans=1,num_classes=10,depths=(1,2),embed_dims=(16,32),num_heads=(2,4),window_size=4"  # noqa: E501
)


@pytest.fixture(scope="module")
def torch():
  import torch as torch_module

  torch_module.set_num_threads(1)
  return torch_module


@pytest.fixture(scope="module")
def timm_davit_model(torch):
  """A timm DaViT of :data:`ARGS`, random weights, norms and biases perturbed."""
  model = timm_vit.timm_model("davit_tiny", ARGS, seed=3)
  gen = torch.Generator().manual_seed(4)
  with torch.no_grad():
    for _, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.5 * torch.randn(p.shape, generator=gen))
  return model


def state_of(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def images(batch=2, seed=0, size=(27, 26)):
  """float32 ``[batch, 1, H, W]`` (timm's layout)."""
  return np.random.default_rng(seed).normal(size=(batch, 1) + size).astype(np.float32)


def laplax_logits(params, arch, x, **keys):
  spec = spec_lib.from_config(dict(timm_davit.model_keys(arch), **keys))
  model = DaViT(spec, num_classes=arch["num_classes"])
  return jax.jit(model.apply)({"params": params}, x.transpose(0, 2, 3, 1))[0]


def torch_logits(torch, model, x):
  with torch.no_grad():
    return model(torch.from_numpy(x)).numpy()


def all_blocks(model):
  return [b for st in model.stages for dual in st.blocks for b in dual]


@pytest.mark.slow
@needs_timm
def test_timm_davit_logits_and_bitwise_round_trip(torch, timm_davit_model):
  tm = timm_davit_model
  arch = timm_davit.architecture(tm)
  assert arch["stage_depths"] == (1, 2) and arch["num_heads"] == 2 and arch["window_size"] == 4
  params = timm_davit.timm_to_laplax(state_of(tm), arch)
  for size in ((27, 26), (28, 28)):
    x = images(size=size)
    err = relative_diff(laplax_logits(params, arch, x), torch_logits(torch, tm, x))
    print(f"\ndavit {ARGS} at {size}: max|logit diff|/max|logit| = {err:.2e}")
    assert err <= TOL
  spec = spec_lib.from_config(timm_davit.model_keys(arch))
  state, model_args = timm_davit.laplax_to_timm(params, spec)
  back = timm.models.davit.DaVit(**model_args)
  back.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
  original = state_of(tm)
  assert sorted(state) == sorted(original)
  for k in state:
    np.testing.assert_array_equal(state[k], original[k], err_msg=k)
  np.testing.assert_array_equal(torch_logits(torch, back.eval(), x), torch_logits(torch, tm, x))


@needs_timm
@pytest.mark.parametrize(
  "mode",
  [
    "full",
    "fused",
    pytest.param("per_head", marks=pytest.mark.slow),
    pytest.param("svd", marks=pytest.mark.slow),
  ],
)
@pytest.mark.slow
def test_spectral_davit_equals_timm_with_the_correction_added(torch, timm_davit_model, mode):
  """laplax's DaViT with spectral conditioning = timm's DaViT whose qkv
  weights carry ``W + C`` (every spatial and channel block), in logits and
  (``full``) in the gradient with respect to a channel block's qkv weight."""
  tm = copy.deepcopy(timm_davit_model)
  arch = timm_davit.architecture(tm)
  params = timm_davit.timm_to_laplax(state_of(tm), arch)
  lam = 10.0 if mode == "fused" else 1.5
  with torch.no_grad():
    for blk in all_blocks(tm):
      w = blk.attn.qkv.weight
      w.copy_(torch.from_numpy(corrected_qkv(w.numpy(), mode, lam, blk.attn.num_heads)))
  x = images()
  keys = dict(spectral={"enabled": True, "lam": lam, "mode": mode})
  err = relative_diff(laplax_logits(params, arch, x, **keys), torch_logits(torch, tm, x))
  plain = relative_diff(laplax_logits(params, arch, x), torch_logits(torch, tm, x))
  print(f"\ndavit spectral {mode}: {err:.2e} (without the correction {plain:.2e})")
  assert err <= TOL and plain > 10 * TOL  # the correction matters: the test can fail
  if mode != "full":
    return
  spec = spec_lib.from_config(dict(timm_davit.model_keys(arch), **keys))
  model = DaViT(spec, num_classes=10)
  loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x.transpose(0, 2, 3, 1))[0]))
  grads = jax.grad(loss)(params)
  tm.zero_grad()
  torch.sin(tm(torch.from_numpy(x))).sum().backward()
  for i, blk in ((1, tm.stages[0].blocks[0][1]), (2, tm.stages[1].blocks[0][0])):
    a = grads[f"block{i}"]["attention"]
    got = np.concatenate([np.asarray(a[n]["kernel"]).T for n in ("query", "key", "value")])
    assert relative_diff(got, blk.attn.qkv.weight.grad.numpy()) <= 1e-4


def _numpy_attention(attn, k, channel):
  """A forward of timm ``WindowAttention`` / ``ChannelAttention`` ``attn`` in
  NumPy, from the definitions, the last ``k`` heads (groups) Laplacian."""
  import torch

  def softmax(z):
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)

  def forward(x):
    xs = x.detach().numpy().astype(np.float64)
    b, n, c = xs.shape
    heads = attn.num_heads
    d = c // heads
    w = attn.qkv.weight.detach().numpy().astype(np.float64)
    bias = attn.qkv.bias.detach().numpy().astype(np.float64)
    q, kk, v = (xs @ w.T + bias).reshape(b, n, 3, heads, d).transpose(2, 0, 3, 1, 4)
    eye = np.eye(d)
    if channel:  # P [b, heads, d, d] over channels; output q P^T, Laplacian q (I - P)^T
      p = softmax(kk.transpose(0, 1, 3, 2) @ v / np.sqrt(d))
      lap = np.arange(heads) >= heads - k
      op = np.where(lap[None, :, None, None], eye - p, p)
      y = q @ op.transpose(0, 1, 3, 2)
    else:  # per window: P V, Laplacian V - P V
      p = softmax(q @ kk.transpose(0, 1, 3, 2) / np.sqrt(d))
      y = p @ v
      if k:
        y[:, heads - k :] = v[:, heads - k :] - y[:, heads - k :]
    y = y.transpose(0, 2, 1, 3).reshape(b, n, c)
    pw = attn.proj.weight.detach().numpy().astype(np.float64)
    pb = attn.proj.bias.detach().numpy().astype(np.float64)
    return torch.from_numpy((y @ pw.T + pb).astype(np.float32))

  return forward


@pytest.mark.slow
@needs_timm
def test_laplacian_heads_and_groups_equal_the_definition(torch, timm_davit_model):
  """``num_laplacian_heads=1``: the last head of every window attention
  outputs ``V - P V`` and the last group of every channel attention ``I - P``
  over its channels (NumPy, both together and channel alone); the plain
  model equals the NumPy definitions with ``k = 0`` (so the NumPy channel
  attention is timm's)."""
  tm = copy.deepcopy(timm_davit_model)
  arch = timm_davit.architecture(tm)
  params = timm_davit.timm_to_laplax(state_of(tm), arch)
  x = images()
  want_plain = torch_logits(torch, tm, x)
  blocks = all_blocks(tm)
  forwards = [blk.attn.forward for blk in blocks]
  for blk in blocks:
    blk.attn.forward = _numpy_attention(blk.attn, 0, type(blk).__name__ == "ChannelBlock")
  assert relative_diff(torch_logits(torch, tm, x), want_plain) <= TOL
  for blk in blocks:
    blk.attn.forward = _numpy_attention(blk.attn, 1, type(blk).__name__ == "ChannelBlock")
  want = torch_logits(torch, tm, x)
  err = relative_diff(laplax_logits(params, arch, x, num_laplacian_heads=1), want)
  plain = relative_diff(laplax_logits(params, arch, x), want)
  print(f"\ndavit Laplacian heads vs NumPy: {err:.2e} (plain {plain:.2e})")
  assert err <= TOL and plain > 1e-3
  # Channel blocks only (odd blocks): the window attentions are timm's own.
  for blk, fwd in zip(blocks, forwards):
    if type(blk).__name__ == "SpatialBlock":
      blk.attn.forward = fwd
  mask = [[False, i == 1] if i < 2 else [False, False, False, i % 2 == 1] for i in range(6)]
  want = torch_logits(torch, tm, x)
  err = relative_diff(laplax_logits(params, arch, x, laplacian_mask=mask), want)
  assert err <= TOL


def test_davit_spec_refusals_are_one_line():
  base = dict(width=16, depth=4, stage_depths=(1, 1), num_heads=2, window_size=4)
  cases = [
    (dict(base, depth=2), "model.depth=2 must be the number of DaViT attention blocks"),
    (dict(base, stage_depths=(1, 0)), "model.stage_depths=(1, 0) must be a non-empty tuple"),
    (dict(base, num_laplacian_heads=3), "must be in 0..2"),
    (dict(base, scan_layers=True), "a DaViT's stages differ"),
    (dict(base, patch_size=2), "model.patch_size"),
  ]
  for keys, message in cases:
    with pytest.raises(spec_lib.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
      spec_lib.build("davit", **keys)
  spec = spec_lib.build("davit", **base)
  assert spec.layer_heads() == (2, 2, 4, 4)
  assert spec.drop_path_rates() == (0.0,) * 4
  # timm's DaVit has no qk-norm nor LayerScale: --to timm refuses them by name.
  for keys, key in ((dict(qk_norm=True), "qk_norm"), (dict(layerscale_init=1e-6), "layerscale")):
    spec = spec_lib.build("davit", **dict(base, **keys))
    with pytest.raises(common.ConvertError, match=f"model.{key}.*DaVit has no") as e:
      timm_davit.laplax_to_timm({}, spec, None)
    assert "\n" not in str(e.value)


@needs_timm
def test_timm_davit_features_laplax_lacks_are_refused(torch):
  for extra, what in ((dict(cpe_act=True), "cpe_act"), (dict(channel_attn_v2=True), "V2")):
    model = timm_vit.timm_model("davit_tiny", dict(ARGS, **extra), seed=0)
    with pytest.raises(common.ConvertError, match=what) as e:
      timm_davit.architecture(model)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@needs_timm
def test_converted_davit_loads_without_data_and_goes_back(tmp_path, torch, timm_davit_model):
  """``--from timm --weights`` into a workdir (the Fashion-MNIST DaViT config,
  no dataset prepared): ``laplax.load`` gives timm's logits; ``--to timm``
  gives back timm's weights bitwise; with Laplacian heads it needs ``--force``."""
  from safetensors.numpy import save_file

  import laplax
  from laplax.cli import common as cli

  weights = tmp_path / "davit.safetensors"
  save_file(state_of(timm_davit_model), str(weights))
  config = cli._load_config_file(DAVIT_CONFIG + ":size=tiny")
  config.data.data_dir = str(tmp_path / "no_data")
  os.makedirs(config.data.data_dir)
  common.plain_attention(config, [])
  workdir = tmp_path / "davit"
  timm_vit.convert_from_timm("davit_tiny", str(weights), MODEL_ARGS, config, str(workdir))
  run = laplax.load(str(workdir))
  assert run.config.model.name == "davit" and run.config.model.window_size == 4
  x = images(seed=1, size=(28, 28))
  got = jax.jit(run.model.apply)({"params": run.params}, x.transpose(0, 2, 3, 1))[0]
  err = relative_diff(got, torch_logits(torch, timm_davit_model, x))
  print(f"\nlaplax.load of a converted DaViT vs timm: {err:.2e}")
  assert err <= TOL
  assert os.listdir(config.data.data_dir) == []
  out = tmp_path / "back"
  assert timm_vit.convert_to_timm(str(workdir), str(out), force=False) is None
  back = timm_vit.timm_from_dir(str(out))
  assert type(back).__name__ == "DaVit"
  original = state_of(timm_davit_model)
  for k, v in state_of(back).items():
    np.testing.assert_array_equal(v, original[k], err_msg=k)
  config.model.num_laplacian_heads = 1
  lap = tmp_path / "lap"
  timm_vit.convert_from_timm("davit_tiny", str(weights), MODEL_ARGS, config, str(lap))
  with pytest.raises(common.ConvertError, match="Laplacian heads"):
    timm_vit.convert_to_timm(str(lap), str(tmp_path / "refused"), force=False)
  assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_davit_fashion_mnist_config_trains(tmp_path, fmnist_data_dir, capfd):
  """``configs/davit_imagenet.py:size=tiny`` (a smaller width) trains 3 steps
  on Fashion-MNIST with a Laplacian head and spectral conditioning, and
  ``eval.py`` evaluates it."""
  workdir = tmp_path / "davit"
  r = run_in_process(
    [
      "train.py",
      "--config",
      DAVIT_CONFIG + ":size=tiny,laplacian=1,spectral=True",
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
