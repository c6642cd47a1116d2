"""laplax's XCiT is timm's Xcit, and both methods follow their definitions.

timm models are built with random weights (``pretrained=False``) and every
vector parameter (norms, biases, LayerScale gammas), the XCA temperatures and
the BatchNorms' running statistics perturbed (the variances kept positive),
so that each branch matters. Logits are compared as ``max |laplax - timm| /
max |timm|``. Spectral conditioning is checked against a timm model whose
``qkv`` (XCA) and ``q``, ``k``, ``v`` (class attention) weights have the
correction added (the definition, in PyTorch's layout); Laplacian heads
against PyTorch attentions written from the definitions in float64, put into
the timm model in place of its own, in values and in gradients: per XCA head
(``q``, ``k`` L2-normalised over the tokens, ``P = softmax(tau q k^T)`` over
the ``d`` channels) ``(I - P) v`` on the last ``k`` heads, per class-attention
head ``v_cls - P v``.
"""

import copy
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.convert import common, timm_vit, timm_xcit
from laplax.models import spec as spec_lib
from laplax.models.xcit import XCiT, fourier_features

from helpers.runs import read_metrics, run, run_in_process
from helpers.timm_models import corrected_qkv, relative_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XCIT_CONFIG = os.path.join(ROOT, "configs", "xcit_imagenet.py")
HAVE_TIMM = all(importlib.util.find_spec(m) for m in ("torch", "timm"))
needs_timm = pytest.mark.skipif(not HAVE_TIMM, reason="pip install -r requirements-test.txt")
TOL = 1e-5
# An XCiT small enough for the suite: patch 16 (four convolutions, widths 4,
# 8, 16, 32) on 64 px images (a 4 x 4 grid), 2 XCA blocks and 2 class-attention
# blocks of 4 heads of 8 channels, tokens_norm (timm's xcit_tiny_12).
MODEL = "xcit_tiny_12_p16_224"
ARGS = dict(in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=4, img_size=64)
MODEL_ARGS = "in_chans=1,num_classes=10,embed_dim=32,depth=2,num_heads=4,img_size=64"
# Patch 8 (three convolutions) on 32 px, one class-attention block, no
# tokens_norm (timm's xcit_nano_12).
MODEL_P8 = "xcit_nano_12_p8_224"
ARGS_P8 = dict(ARGS, img_size=32, cls_attn_layers=1)


@pytest.fixture(scope="module")
def torch():
  import torch as torch_module

  torch_module.set_num_threads(1)
  return torch_module


def perturbed(torch, name, args, seed=3):
  """timm ``name(**args)``, random weights; every vector, temperature and
  BatchNorm statistic perturbed (the running variances times ``e^N(0, 1/4)``)."""
  model = timm_vit.timm_model(name, args, seed=seed)
  gen = torch.Generator().manual_seed(seed + 1)
  noise = lambda t: 0.5 * torch.randn(t.shape, generator=gen)
  with torch.no_grad():
    for n, p in model.named_parameters():
      if p.ndim == 1 or n.endswith("temperature"):
        p.add_(noise(p))
    for n, b in model.named_buffers():
      if n.endswith("running_mean"):
        b.add_(noise(b))
      elif n.endswith("running_var"):
        b.mul_(torch.exp(noise(b)))
  return model


@pytest.fixture(scope="module")
def timm_xcit_model(torch):
  """A timm XCiT of :data:`ARGS`, perturbed (:func:`perturbed`)."""
  return perturbed(torch, MODEL, ARGS)


def state_of(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def images(batch=2, seed=0, size=(64, 64)):
  """float32 ``[batch, 1, H, W]`` (timm's layout)."""
  return np.random.default_rng(seed).normal(size=(batch, 1) + size).astype(np.float32)


def laplax_model(arch, **keys):
  spec = spec_lib.from_config(dict(timm_xcit.model_keys(arch), **keys))
  return XCiT(spec, num_classes=arch["num_classes"])


def laplax_logits(params, arch, x, **keys):
  return jax.jit(laplax_model(arch, **keys).apply)({"params": params}, x.transpose(0, 2, 3, 1))[0]


def torch_logits(torch, model, x):
  with torch.no_grad():
    return model(torch.from_numpy(x)).numpy()


def _check_logits_and_round_trip(torch, tm, sizes):
  """timm ``tm``'s logits and every block's output tokens (``out["block{i}"]
  ["+mlp"]``, which the final LayerNorm would hide a scaling of) at each of
  ``sizes``; ``laplax_to_timm`` gives back its state dict bitwise (the
  BatchNorm counters included) and a timm ``Xcit`` loads it strictly."""
  arch = timm_xcit.architecture(tm)
  params = timm_xcit.timm_to_laplax(state_of(tm), arch)
  apply = jax.jit(laplax_model(arch).apply)
  for size in sizes:
    x = images(size=size)
    blocks = []
    keep = lambda module, args, output, into=blocks: into.append(output.detach().numpy())
    hooks = [blk.register_forward_hook(keep) for blk in list(tm.blocks) + list(tm.cls_attn_blocks)]
    want = torch_logits(torch, tm, x)
    for h in hooks:
      h.remove()
    logits, out = apply({"params": params}, x.transpose(0, 2, 3, 1))
    err = relative_diff(logits, want)
    print(f"\nxcit patch {arch['patch_size']} at {size}: max|logit diff|/max|logit| = {err:.2e}")
    assert err <= TOL
    for i, tokens in enumerate(blocks):
      assert relative_diff(out[f"block{i}"]["+mlp"], tokens) <= TOL, i
  spec = spec_lib.from_config(timm_xcit.model_keys(arch))
  state, model_args = timm_xcit.laplax_to_timm(params, spec)
  back = timm.models.xcit.Xcit(**model_args)
  back.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
  original = state_of(tm)
  assert sorted(state) == sorted(original)
  for k in state:
    np.testing.assert_array_equal(state[k], original[k], err_msg=k)
  x = images(size=arch["img_size"])
  np.testing.assert_array_equal(torch_logits(torch, back.eval(), x), torch_logits(torch, tm, x))


@needs_timm
def test_timm_xcit_logits_and_bitwise_round_trip(torch, timm_xcit_model):
  """Patch 16 with tokens_norm on 64 x 64 images (:func:`_check_logits_and_round_trip`)."""
  _check_logits_and_round_trip(torch, timm_xcit_model, [(64, 64)])


@pytest.mark.slow
@needs_timm
def test_timm_xcit_other_image_sizes_and_patch_8(torch, timm_xcit_model):
  """Patch 16 on 57 x 50 images (each convolution rounds up), and patch 8
  (three convolutions) with one class-attention block and no tokens_norm on
  32 x 32 (:func:`_check_logits_and_round_trip`)."""
  _check_logits_and_round_trip(torch, timm_xcit_model, [(57, 50)])
  _check_logits_and_round_trip(torch, perturbed(torch, MODEL_P8, ARGS_P8, seed=5), [(32, 32)])


def test_fourier_features_are_timms():
  """The position encoding's features: timm's module with an identity projection."""
  if not HAVE_TIMM:
    pytest.skip("pip install -r requirements-test.txt")
  import torch as t
  from timm.models.xcit import PositionalEncodingFourier

  enc = PositionalEncodingFourier(dim=64)
  with t.no_grad():
    enc.token_projection.weight.copy_(t.eye(64)[:, :, None, None])
    enc.token_projection.bias.zero_()
    want = enc(1, 3, 5)[0].permute(1, 2, 0).reshape(15, 64).numpy()
  np.testing.assert_allclose(fourier_features(3, 5), want, rtol=0, atol=1e-6)


def _ca_weight(attn):
  """timm class attention's ``q``, ``k``, ``v`` weights stacked as a fused ``[3D, D]``."""
  import torch

  return torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]).detach().numpy()


@needs_timm
@pytest.mark.parametrize(
  "mode",
  [
    "full",
    "fused",
    pytest.param("per_head", marks=pytest.mark.slow),
    "svd",
  ],
)
@pytest.mark.slow
def test_spectral_xcit_equals_timm_with_the_correction_added(torch, timm_xcit_model, mode):
  """laplax's XCiT with spectral conditioning = timm's XCiT whose qkv weights
  carry ``W + C`` (every XCA and class attention), in logits and (``full``)
  in the gradients with respect to an XCA's qkv weight and a class
  attention's q, k, v weights."""
  tm = copy.deepcopy(timm_xcit_model)
  arch = timm_xcit.architecture(tm)
  params = timm_xcit.timm_to_laplax(state_of(tm), arch)
  lam = 10.0 if mode == "fused" else 1.5
  with torch.no_grad():
    for blk in tm.blocks:
      w = blk.attn.qkv.weight
      w.copy_(torch.from_numpy(corrected_qkv(w.numpy(), mode, lam, blk.attn.num_heads)))
    for blk in tm.cls_attn_blocks:
      a = blk.attn
      w = corrected_qkv(_ca_weight(a), mode, lam, a.num_heads)
      for m, part in zip((a.q, a.k, a.v), np.split(w, 3)):
        m.weight.copy_(torch.from_numpy(part))
  x = images()
  keys = dict(spectral={"enabled": True, "lam": lam, "mode": mode})
  err = relative_diff(laplax_logits(params, arch, x, **keys), torch_logits(torch, tm, x))
  plain = relative_diff(laplax_logits(params, arch, x), torch_logits(torch, tm, x))
  print(f"\nxcit spectral {mode}: {err:.2e} (without the correction {plain:.2e})")
  assert err <= TOL and plain > 10 * TOL  # the correction matters: the test can fail
  if mode != "full":
    return
  model = laplax_model(arch, **keys)
  loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x.transpose(0, 2, 3, 1))[0]))
  grads = jax.jit(jax.grad(loss))(params)
  tm.zero_grad()
  torch.sin(tm(torch.from_numpy(x))).sum().backward()
  kernels = lambda a: np.concatenate(
    [np.asarray(a[n]["kernel"]).T for n in ("query", "key", "value")]
  )
  ca = tm.cls_attn_blocks[1].attn
  want_ca = torch.cat([ca.q.weight.grad, ca.k.weight.grad, ca.v.weight.grad]).numpy()
  assert (
    relative_diff(kernels(grads["block0"]["attention"]), tm.blocks[0].attn.qkv.weight.grad.numpy())
    <= 1e-4
  )
  assert relative_diff(kernels(grads["block3"]["attention"]), want_ca) <= 1e-4


def _xca_reference(attn, lap):
  """timm ``XCA`` ``attn``'s forward in float64 PyTorch from the definition,
  the heads where ``lap`` (bool ``[heads]``) Laplacian: ``(I - P) v``."""
  import torch

  def forward(x):
    b, n, c = x.shape
    h = attn.num_heads
    d = c // h
    qkv = x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k, v = qkv.reshape(b, n, 3, h, d).permute(2, 0, 3, 4, 1)  # [b, h, d, n]
    unit = lambda y: y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    p = torch.softmax(unit(q) @ unit(k).transpose(-2, -1) * attn.temperature.double(), -1)
    eye = torch.eye(d, dtype=torch.float64)
    op = torch.where(torch.as_tensor(lap)[None, :, None, None], eye - p, p)
    y = (op @ v).permute(0, 3, 1, 2).reshape(b, n, c)
    return (y @ attn.proj.weight.double().T + attn.proj.bias.double()).float()

  return forward


def _class_attention_reference(attn, lap):
  """timm ``ClassAttn`` ``attn``'s forward in float64 PyTorch from the
  definition, the heads where ``lap`` Laplacian: ``v_cls - P v``."""
  import torch

  def forward(x):
    b, n, c = x.shape
    h = attn.num_heads
    d = c // h
    lin = lambda m, y: y.double() @ m.weight.double().T + m.bias.double()
    heads = lambda y: y.reshape(b, -1, h, d).transpose(1, 2)  # [b, h, tokens, d]
    q, k, v = heads(lin(attn.q, x[:, :1])), heads(lin(attn.k, x)), heads(lin(attn.v, x))
    p = torch.softmax(q @ k.transpose(-2, -1) / d**0.5, -1)  # [b, h, 1, n]
    y = torch.where(torch.as_tensor(lap)[None, :, None, None], v[:, :, :1] - p @ v, p @ v)
    return lin(attn.proj, y.transpose(1, 2).reshape(b, 1, c)).float()

  return forward


def _use_references(tm, mask):
  """Puts the reference attentions into ``tm``, block ``i`` (XCA blocks first,
  then the class-attention blocks) with the Laplacian heads of ``mask[i]``."""
  blocks = list(tm.blocks) + list(tm.cls_attn_blocks)
  for blk, lap in zip(blocks, mask):
    ref = _xca_reference if type(blk).__name__ == "XCABlock" else _class_attention_reference
    blk.attn.forward = ref(blk.attn, np.asarray(lap, bool))


@pytest.mark.slow
@needs_timm
def test_laplacian_heads_equal_the_definition_in_values_and_gradients(torch, timm_xcit_model):
  """The PyTorch references without Laplacian heads are timm's attentions;
  with the last head of every block Laplacian, and with a mask of different
  heads per block (XCA and class attention alone), laplax's logits are the
  references'; and so are the gradients of ``sum(sin(logits))`` with
  respect to an XCA's qkv weight and temperature, a class attention's q and
  v weights and the patch embedding's first convolution."""
  tm = copy.deepcopy(timm_xcit_model)
  arch = timm_xcit.architecture(tm)
  params = timm_xcit.timm_to_laplax(state_of(tm), arch)
  x = images()
  want_plain = torch_logits(torch, tm, x)
  _use_references(tm, [[False] * 4] * 4)
  assert relative_diff(torch_logits(torch, tm, x), want_plain) <= TOL
  masks = [
    [[False, False, False, True]] * 4,
    [[True, False, False, False], [False] * 4, [False] * 4, [False, True, True, False]],
  ]
  plain_logits = laplax_logits(params, arch, x)
  for mask in masks:
    _use_references(tm, mask)
    want = torch_logits(torch, tm, x)
    err = relative_diff(laplax_logits(params, arch, x, laplacian_mask=mask), want)
    plain = relative_diff(plain_logits, want)
    print(f"\nxcit Laplacian heads {mask}: {err:.2e} (plain {plain:.2e})")
    assert err <= TOL and plain > 1e-3
  # Gradients, the last mask (an XCA and a class attention with Laplacian heads).
  model = laplax_model(arch, laplacian_mask=masks[-1])
  loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x.transpose(0, 2, 3, 1))[0]))
  grads = jax.jit(jax.grad(loss))(params)
  tm.zero_grad()
  torch.sin(tm(torch.from_numpy(x))).sum().backward()
  xca, ca = tm.blocks[0].attn, tm.cls_attn_blocks[1].attn
  a0, a3 = grads["block0"]["attention"], grads["block3"]["attention"]
  got_qkv = np.concatenate([np.asarray(a0[n]["kernel"]).T for n in ("query", "key", "value")])
  conv = tm.patch_embed.proj[0][0].weight.grad.numpy().transpose(2, 3, 1, 0)
  pairs = [
    (got_qkv, xca.qkv.weight.grad.numpy()),
    (a0["temperature"], xca.temperature.grad.numpy().reshape(-1)),
    (np.asarray(a3["query"]["kernel"]).T, ca.q.weight.grad.numpy()),
    (np.asarray(a3["value"]["kernel"]).T, ca.v.weight.grad.numpy()),
    (grads["embedding"]["kernel"], conv),
  ]
  for got, want in pairs:
    err = relative_diff(got, want)
    print(f"gradient {want.shape}: {err:.2e}")
    assert err <= 1e-4


def test_xcit_spec_refusals_are_one_line():
  base = dict(width=32, depth=4, cls_attn_layers=2, num_heads=4, patch_size=16)
  cases = [
    (dict(base, depth=2), "model.depth=2 counts the XCA and the class-attention blocks"),
    (dict(base, patch_size=12), "model.patch_size=12 must be a power of two"),
    (
      dict(base, width=36, num_heads=4),
      "model.patch_size=16 must be a power of two .* whose half divides model.width",
    ),
    (dict(base, cls_attn_layers=0), "model.cls_attn_layers=0 must be an integer >= 1"),
    (dict(base, num_laplacian_heads=5), "must be in 0..num_heads=4"),
    (dict(base, scan_layers=True), "XCiT's blocks differ"),
    (dict(base, qk_norm=True), "XCiT's attentions have none"),
    (dict(base, implementation="splash"), "XCiT's attentions run XLA"),
  ]
  for keys, message in cases:
    with pytest.raises(spec_lib.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
      spec_lib.build("xcit", **keys)
  spec = spec_lib.build("xcit", **dict(base, drop_path=0.1))
  assert spec.xca_depth == 2 and spec.patch_widths() == (4, 8, 16, 32)
  assert spec.drop_path_rates() == (0.1, 0.1, 0.0, 0.0)
  assert spec_lib.build("xcit", **dict(base, patch_size=4)).patch_widths() == (16, 32)
  # What timm's Xcit cannot hold: --to timm refuses it by name.
  for keys, key in (
    (dict(patch_size=4), "patch_size=4"),
    (dict(mlp_activation="gelu"), "mlp_activation"),
    (dict(norm_eps=1e-5), "norm_eps"),
  ):
    spec = spec_lib.build("xcit", **dict(base, **keys))
    with pytest.raises(common.ConvertError, match=f"model.{key}.*Xcit has no") as e:
      timm_xcit.laplax_to_timm({}, spec, None)
    assert "\n" not in str(e.value)


@needs_timm
def test_timm_xcit_features_laplax_lacks_are_refused(torch):
  for extra, what in (
    (dict(global_pool="avg"), "global_pool='avg'"),
    (dict(qkv_bias=False), "qkv_bias=False"),
    (dict(cls_attn_layers=0), "no class-attention blocks"),
  ):
    model = timm_vit.timm_model(MODEL, dict(ARGS, **extra), seed=0)
    with pytest.raises(common.ConvertError, match=what) as e:
      timm_xcit.architecture(model)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@needs_timm
def test_converted_xcit_loads_without_data_and_goes_back(tmp_path, torch, timm_xcit_model):
  """``--from timm --weights`` into a workdir (the Fashion-MNIST XCiT config,
  no dataset prepared): ``laplax.load`` gives timm's logits; ``--to timm``
  gives back timm's weights bitwise; with Laplacian heads it needs ``--force``."""
  from safetensors.numpy import save_file

  import laplax
  from laplax.cli import common as cli

  weights = tmp_path / "xcit.safetensors"
  save_file(state_of(timm_xcit_model), str(weights))
  config = cli._load_config_file(XCIT_CONFIG + ":size=tiny")
  config.data.data_dir = str(tmp_path / "no_data")
  os.makedirs(config.data.data_dir)
  common.plain_attention(config, [])
  workdir = tmp_path / "xcit"
  timm_vit.convert_from_timm(MODEL, str(weights), MODEL_ARGS, config, str(workdir))
  run = laplax.load(str(workdir))
  assert run.config.model.name == "xcit" and run.config.model.patch_size == 16
  assert run.config.model.depth == 4 and run.config.data.image_size == 64
  x = images(seed=1)
  got = jax.jit(run.model.apply)({"params": run.params}, x.transpose(0, 2, 3, 1))[0]
  err = relative_diff(got, torch_logits(torch, timm_xcit_model, x))
  print(f"\nlaplax.load of a converted XCiT vs timm: {err:.2e}")
  assert err <= TOL
  assert os.listdir(config.data.data_dir) == []
  out = tmp_path / "back"
  assert timm_vit.convert_to_timm(str(workdir), str(out), force=False) is None
  back = timm_vit.timm_from_dir(str(out))
  assert type(back).__name__ == "Xcit"
  original = state_of(timm_xcit_model)
  for k, v in state_of(back).items():
    np.testing.assert_array_equal(v, original[k], err_msg=k)
  config.model.num_laplacian_heads = 1
  lap = tmp_path / "lap"
  timm_vit.convert_from_timm(MODEL, str(weights), MODEL_ARGS, config, str(lap))
  with pytest.raises(common.ConvertError, match="Laplacian heads"):
    timm_vit.convert_to_timm(str(lap), str(tmp_path / "refused"), force=False)
  assert not (tmp_path / "refused").exists()


@pytest.mark.slow
@pytest.mark.subprocess
@needs_timm
def test_cli_from_timm_xcit_takes_the_xcit_config(tmp_path):
  """``python -m laplax.convert --from timm --model xcit_*`` without
  ``--config`` writes its workdir with ``configs/xcit_imagenet.py``'s
  recipe and the timm model's keys."""
  workdir = tmp_path / "xcit"
  r = run(
    [
      "-m",
      "laplax.convert",
      "--from",
      "timm",
      "--model",
      MODEL_P8,
      "--model_args",
      "in_chans=1,num_classes=10,embed_dim=32,depth=1,num_heads=4,img_size=32",
      "--workdir",
      str(workdir),
    ]
  )
  assert r.returncode == 0, r.stderr[-2000:]
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["name"] == "xcit" and saved["data"]["name"] == "imagenet2012"
  assert saved["model"]["patch_size"] == 8 and saved["model"]["depth"] == 3
  assert saved["model"]["tokens_norm"] is False and saved["optim"]["lr"] == pytest.approx(1e-3)
  assert saved["batch_size"] == 1024 and saved["optim"]["grad_clip"] is None


@pytest.mark.slow
def test_xcit_fashion_mnist_config_trains_and_analysis_reports_the_corrected_kernels(
  tmp_path, fmnist_data_dir, capfd
):
  """``configs/xcit_imagenet.py:size=tiny``, made smaller for speed (width
  16, so that the block Jacobian of the 49 patch tokens is 784 x 784 rather
  than 1568 x 1568; one XCA and one class-attention block), trains 3 steps on
  Fashion-MNIST with a Laplacian head and spectral conditioning and is
  evaluated; ``eval.py --analysis`` then reports, for the XCA and the
  class-attention layer, the condition numbers of the corrected
  ``W + lambda I`` of ``W_Q, W_K, W_V`` (as NumPy computes them from the
  checkpoint), attention statistics over each layer's own queries, and the
  block Jacobian."""
  import laplax

  workdir = tmp_path / "xcit"
  r = run_in_process(
    [
      "train.py",
      "--config",
      XCIT_CONFIG + ":size=tiny,laplacian=1,spectral=True,lam=2.0",
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={fmnist_data_dir}",
      "--config.model.width=16",
      "--config.model.mlp_dim=64",
      "--config.model.depth=2",
      "--config.model.cls_attn_layers=1",
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
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(workdir),
      "--analysis",
      "--analysis_layers=0,1",
      "--analysis_examples=64",
      "--analysis_batch_size=64",
      "--analysis_jacobian_dim=784",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  a = json.loads((workdir / "analysis.json").read_text())
  assert a["spectral"]["enabled"] and a["spectral"]["lam"] == 2.0
  params = laplax.load(str(workdir)).params
  xca, ca = a["layers"]
  for entry in (xca, ca):
    for name in ("query", "key", "value"):
      w = np.asarray(params[f"block{entry['layer']}"]["attention"][name]["kernel"], np.float64)
      got = entry["weights"][name]
      assert got["effective"] == "corrected"
      assert got["corrected"]["condition_number"] == pytest.approx(
        np.linalg.cond(w + 2.0 * np.eye(16)), rel=1e-4
      )
      assert got["raw"]["condition_number"] == pytest.approx(np.linalg.cond(w), rel=1e-4)
    assert len(entry["attention_entropy"]) == 4 and len(entry["gradient_norms"]["query"]) == 4
    assert entry["jacobian"]["heads"] is None and "XCA" in entry["jacobian"]["heads_reason"]
  # XCA attends over each head's 16 / 4 channels, class attention over the 1 + 49 tokens.
  assert xca["attention_entropy_uniform"] == pytest.approx(np.log(4), rel=1e-5)
  assert ca["attention_entropy_uniform"] == pytest.approx(np.log(50), rel=1e-5)
  assert xca["jacobian"]["block_check"] < 1e-5 and xca["jacobian"]["tokens"] == 49


timm = None


@pytest.fixture(autouse=True, scope="module")
def _timm():
  global timm
  if HAVE_TIMM:
    import timm as timm_module

    timm = timm_module
