"""laplax ViTs are timm ViTs: the same weights give the same logits, both ways.

Every timm model here is built with its own random initialisation
(``pretrained=False``, offline). Logits are compared on the same random
images as ``max |laplax - timm| / max |timm|`` (float32); the measured values
are printed (``pytest -s``) for the table of docs/converters.md. With Laplacian heads the
timm model's attention is replaced, test-side, by a PyTorch attention that
returns ``v - SDPA(q, k, v)`` on the last ``K`` heads (the authors' formula).
"""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from laplax.convert import common, timm_vit
from laplax.models import spec as spec_lib
from laplax.models.vit import ViT

from helpers.runs import CONFIG, ROOT, read_metrics, run, run_in_process

pytestmark = pytest.mark.skipif(
  not all(importlib.util.find_spec(m) for m in ("torch", "timm")),
  reason="the test oracles: pip install -r requirements-test.txt",
)
# Imported by the module fixture below, not at collection (every xdist worker
# collects every file, and torch + timm take seconds to import).
timm = torch = None


@pytest.fixture(autouse=True, scope="module")
def _torch_and_timm():
  global timm, torch
  import timm as timm_module
  import torch as torch_module

  torch_module.set_num_threads(1)
  timm, torch = timm_module, torch_module


TOL = 1e-5
# Each named model as timm builds it; the base widths (768, 12 heads) at depth
# 2: their blocks are the small models' blocks, and twelve of them only cost time.
MODELS = {
  "vit_tiny_patch16_224": {},
  "vit_small_patch16_224": {},
  "vit_base_patch16_224": {"depth": 2},
  "deit3_small_patch16_224": {},
  "deit3_base_patch16_224": {"depth": 2},
}


def laplax_model(arch, **model_keys):
  """The laplax ViT of a timm architecture (float32), plus extra model keys."""
  spec = spec_lib.from_config(dict(timm_vit.model_keys(arch), **model_keys))
  return ViT(spec, num_classes=arch["num_classes"])


def images_for(arch, seed=0, batch=1):
  """Random float32 images ``[batch, channels, height, width]`` (timm's layout)."""
  h, w = arch["img_size"]
  rng = np.random.default_rng(seed)
  return rng.normal(size=(batch, arch["in_chans"], h, w)).astype(np.float32)


def timm_logits(timm_model, images):
  with torch.no_grad():
    return timm_model(torch.from_numpy(images)).numpy()


def relative_diff(got, want):
  """``max |got - want| / max |want|``."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  scale = np.abs(want).max()
  assert scale > 0
  return float(np.abs(got - want).max() / scale)


def compare(timm_model, params, model, arch):
  """``max |laplax - timm| / max |timm|`` of the logits on random images."""
  images = images_for(arch)
  got, _ = jax.jit(model.apply)({"params": params}, images.transpose(0, 2, 3, 1))
  return relative_diff(got, timm_logits(timm_model, images))


def strict_timm(state, model_args):
  """``VisionTransformer(**model_args)`` with ``state`` loaded strictly (built on
  the meta device: no random initialisation to wait for)."""
  with torch.device("meta"):
    model = timm.models.vision_transformer.VisionTransformer(**model_args)
  model.load_state_dict(
    {k: torch.from_numpy(v) for k, v in state.items()}, strict=True, assign=True
  )
  return model.eval()


def timm_state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def timm_eval(model, data_config):
  """timm ``model`` on every example of eval.py's eval split (its pipeline,
  images to NCHW): per example ``(correct, cross-entropy in nats, prediction)``."""
  from laplax.data.vision import images as images_lib

  correct, nll, predicted = [], [], []
  for batch in images_lib.eval_batches(data_config, batch_size=500):
    real = batch["mask"] > 0
    images = np.ascontiguousarray(batch["image"][real].transpose(0, 3, 1, 2))
    logits, labels = timm_logits(model, images).astype(np.float64), batch["label"][real]
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    correct.append(logits.argmax(-1) == labels)
    nll.append(-log_p[np.arange(len(labels)), labels])
    predicted.append(logits.argmax(-1))
  return tuple(np.concatenate(a) for a in (correct, nll, predicted))


def assert_trees_equal_bitwise(a, b):
  fa, fb = common.flat(a), common.flat(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_timm_logits_and_bitwise_round_trip(name):
  torch.manual_seed(0)
  tm = timm_vit.timm_model(name, MODELS[name])
  arch = timm_vit.architecture(tm)
  assert arch["depth"] == MODELS[name].get("depth", 12)
  params = timm_vit.timm_to_laplax(timm_state(tm), arch)
  model = laplax_model(arch)
  err = compare(tm, params, model, arch)
  print(f"\n{name}: max|logit diff|/max|logit| = {err:.2e}")
  assert err <= TOL
  # laplax -> timm (strict load) -> laplax is bitwise, and the timm model
  # built from the written arguments is the original one.
  state, model_args = timm_vit.laplax_to_timm(params, model.spec)
  back = strict_timm(state, model_args)
  assert_trees_equal_bitwise(
    timm_vit.timm_to_laplax(timm_state(back), timm_vit.architecture(back)), params
  )
  images = images_for(arch, seed=1)
  np.testing.assert_array_equal(timm_logits(back, images), timm_logits(tm, images))


def laplacian_attention(attn, k):
  """timm's attention module ``attn`` with the last ``k`` heads returning
  ``v - SDPA(q, k, v)`` (the authors' formula), the others ``SDPA(q, k, v)``."""

  class LaplacianAttention(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.attn = attn

    def forward(self, x, attn_mask=None, **kwargs):
      a = self.attn
      b, n, c = x.shape
      qkv = a.qkv(x).reshape(b, n, 3, a.num_heads, c // a.num_heads).permute(2, 0, 3, 1, 4)
      q, keys, v = qkv.unbind(0)
      q, keys = a.q_norm(q), a.k_norm(keys)
      y = torch.nn.functional.scaled_dot_product_attention(q, keys, v)
      if k:
        y = torch.cat([y[:, :-k], v[:, -k:] - y[:, -k:]], dim=1)
      return a.proj(y.transpose(1, 2).reshape(b, n, c))

  return LaplacianAttention()


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,k,model_args",
  [
    ("vit_tiny_patch16_224", 1, {}),
    ("deit3_small_patch16_224", 3, {}),
    ("deit3_small_patch16_224", 2, {"qk_norm": True, "depth": 2}),
  ],
)
def test_laplacian_heads_equal_authors_formula_in_timm(name, k, model_args):
  torch.manual_seed(1)
  tm = timm_vit.timm_model(name, model_args)
  arch = timm_vit.architecture(tm)
  assert arch["qk_norm"] == bool(model_args.get("qk_norm"))
  params = timm_vit.timm_to_laplax(timm_state(tm), arch)
  for block in tm.blocks:
    block.attn = laplacian_attention(block.attn, k)
  err = compare(tm, params, laplax_model(arch, num_laplacian_heads=k), arch)
  print(f"\n{name} K={k} {model_args}: max|logit diff|/max|logit| = {err:.2e}")
  assert err <= TOL
  # Without the Laplacian heads the two differ: the test can fail.
  assert compare(tm, params, laplax_model(arch), arch) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
  "model_args",
  [
    {"class_token": False, "global_pool": "avg"},  # fc_norm (timm's default)
    {"class_token": False, "global_pool": "avg", "fc_norm": False},
    {"no_embed_class": False, "init_values": 1e-6},  # class token with a position
    {"act_layer": "gelu_tanh"},  # laplax's default GELU
  ],
)
def test_mean_pooling_and_class_token_layouts(model_args):
  torch.manual_seed(2)
  tm = timm_vit.timm_model("vit_tiny_patch16_224", dict(model_args, depth=2))
  arch = timm_vit.architecture(tm)
  params = timm_vit.timm_to_laplax(timm_state(tm), arch)
  model = laplax_model(arch)
  assert model.spec.pool == ("gap" if model_args.get("global_pool") == "avg" else "tok")
  assert compare(tm, params, model, arch) <= TOL


def test_random_initialisation_is_seeded_and_leaves_the_callers_generator():
  """Two conversions of one model get the same weights; a different seed does
  not; torch's global generator continues as if timm_model were not called."""
  args = {"depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 28, "patch_size": 7}
  torch.manual_seed(5)
  expected_next = torch.rand(3)
  torch.manual_seed(5)
  a = timm_state(timm_vit.timm_model("vit_tiny_patch16_224", args))
  assert torch.equal(torch.rand(3), expected_next)
  b = timm_state(timm_vit.timm_model("vit_tiny_patch16_224", args))
  c = timm_state(timm_vit.timm_model("vit_tiny_patch16_224", args, seed=1))
  assert a.keys() == b.keys() == c.keys()
  assert all(np.array_equal(a[k], b[k]) for k in a)
  assert not np.array_equal(a["blocks.0.attn.qkv.weight"], c["blocks.0.attn.qkv.weight"])


def test_unsupported_and_mismatched_weights_are_named():
  tm = timm_vit.timm_model("vit_tiny_patch16_224", {"depth": 1})
  arch = timm_vit.architecture(tm)
  state = timm_state(tm)
  missing = dict(state)
  del missing["blocks.0.attn.qkv.bias"]
  with pytest.raises(common.ConvertError, match=r"lack tensor blocks\.0\.attn\.qkv\.bias"):
    timm_vit.timm_to_laplax(missing, arch)
  wrong = dict(state, **{"head.weight": np.zeros((10, 192), np.float32)})
  with pytest.raises(common.ConvertError, match=r"head\.weight has shape \(10, 192\)"):
    timm_vit.timm_to_laplax(wrong, arch)
  extra = dict(state, **{"blocks.1.norm1.weight": np.ones(192, np.float32)})
  with pytest.raises(common.ConvertError, match=r"blocks\.1\.norm1\.weight"):
    timm_vit.timm_to_laplax(extra, arch)
  with pytest.raises(common.ConvertError, match="class token with mean pooling"):
    timm_vit.architecture(
      timm_vit.timm_model("vit_tiny_patch16_224", {"depth": 1, "global_pool": "avg"})
    )
  with pytest.raises(common.ConvertError, match="not a timm model"):
    timm_vit.timm_model("vit_nonexistent_patch16_224")


FMNIST_ARGS = "img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_timm_workdir_evaluates_fine_tunes_and_goes_back(tmp_path, fmnist_data_dir, capfd):
  """--from timm -> eval.py; train.py --config.init_from with Laplacian heads;
  --to timm refuses them without --force (and writes them with it); a plain
  model goes back strictly. The weights come from a ``--weights`` file (the
  converter's own initialisation with the head doubled: read, not drawn)."""
  from safetensors.numpy import save_file

  conv = tmp_path / "conv"
  data = f"--config.data.data_dir={fmnist_data_dir}"
  weights = tmp_path / "tiny.safetensors"
  source = timm_vit.timm_model("vit_tiny_patch16_224", timm_vit.parse_model_args(FMNIST_ARGS))
  with torch.no_grad():
    source.head.weight.mul_(2.0)
  save_file(timm_state(source), str(weights))
  r = run(
    [
      "-m",
      "laplax.convert",
      "--from",
      "timm",
      "--model",
      "vit_tiny_patch16_224",
      "--model_args",
      FMNIST_ARGS,
      "--weights",
      str(weights),
      "--workdir",
      str(conv),
      "--config",
      CONFIG,
      data,
      "--config.eval_batch_size=1000",
      "--config.data.eval_split=test[:1000]",
    ]
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert (conv / "checkpoints" / "0").is_dir()
  saved = json.loads((conv / "config.json").read_text())
  assert saved["model"]["mlp_activation"] == "gelu_exact" and saved["model"]["width"] == 32
  r = run_in_process(["eval.py", "--workdir", str(conv)], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  result = json.loads((conv / "eval.json").read_text())
  assert result["step"] == 0 and result["num_examples"] == 1000
  # The converted parameters are the timm model's, and eval.py's accuracy is theirs.
  _, spec, params, _ = common.read_workdir(str(conv))
  assert spec.mlp_activation == "gelu_exact" and not spec.laplacian_array.any()
  assert_trees_equal_bitwise(
    params, timm_vit.timm_to_laplax(timm_state(source), timm_vit.architecture(source))
  )
  # --to timm of the plain conversion: strict load, the same weights.
  out = tmp_path / "back"
  assert timm_vit.convert_to_timm(str(conv), str(out), force=False) is None
  back = timm_vit.timm_from_dir(str(out))
  assert_trees_equal_bitwise(
    timm_vit.timm_to_laplax(timm_state(back), timm_vit.architecture(back)), params
  )
  # eval.py's accuracy is timm's: timm's own forward pass of those weights on
  # the same 1000 examples (eval.py's pipeline, images to NCHW) scores the same.
  correct, nll, predicted = timm_eval(back, common.read_workdir(str(conv))[0].data)
  assert len(correct) == result["num_examples"] == 1000
  # At most one near-tie may flip between the two frameworks' float32 logits.
  assert abs(correct.sum() - round(result["accuracy"] * 1000)) <= 1, (correct.sum(), result)
  assert result["loss"] == pytest.approx(nll.mean(), rel=1e-5), (nll.mean(), result)
  assert len(set(predicted)) > 1  # not a constant classifier, which any input would fool
  # Fine-tune with one Laplacian head per layer, from the converted weights
  # (the model keys come from the converted workdir's config.json).
  ft = tmp_path / "ft"
  r = run_in_process(
    [
      "train.py",
      "--config",
      CONFIG,
      "--workdir",
      str(ft),
      data,
      f"--config.init_from={conv}",
      "--config.total_steps=2",
      "--config.log_every=1",
      "--config.eval_every=1000",
      "--config.batch_size=8",
      "--config.eval_batch_size=1000",
      "--config.data.eval_split=test[:1000]",
      "--config.model.num_laplacian_heads=1",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert [m["step"] for m in read_metrics(ft) if m["split"] == "train"] == [1, 2]
  _, ft_spec, ft_params, step = common.read_workdir(str(ft))
  assert ft_spec.laplacian_array[:, -1].all() and step == 2
  # --to timm refuses the Laplacian run in one line, then writes it with --force.
  refused = tmp_path / "refused"
  with pytest.raises(common.ConvertError, match="Laplacian heads .*pass --force"):
    timm_vit.convert_to_timm(str(ft), str(refused), force=False)
  assert not refused.exists()
  r = run(
    ["-m", "laplax.convert", "--to", "timm", "--workdir", str(ft), "--out", str(refused), "--force"]
  )
  assert r.returncode == 0 and "layer 0: heads [1]" in r.stdout, r.stderr[-2000:]
  assert set(timm_vit.timm_from_dir(str(refused)).state_dict()) == set(back.state_dict())


@pytest.mark.slow
def test_load_converted_deit3_without_its_dataset(tmp_path):
  """A DeiT-3 converted from timm (random weights) into a workdir whose config
  names imagenet2012 in an empty ``data_dir`` loads with ``laplax.load`` (the
  model from the saved spec, the parameters alone: no data, no optimizer),
  and its logits are timm's; only the task's data (``run.task``) needs ImageNet."""
  import laplax
  from laplax.cli import common as cli
  from laplax.data.errors import DataError

  config = cli._load_config_file(os.path.join(ROOT, "configs", "deit3_imagenet.py"))
  config.data.data_dir = str(tmp_path / "no_imagenet")
  os.makedirs(config.data.data_dir)
  common.plain_attention(config, [])
  workdir = tmp_path / "deit3"
  torch.manual_seed(0)
  # Two blocks of the twelve: loading does not depend on the depth.
  timm_vit.convert_from_timm("deit3_small_patch16_224", None, "depth=2", config, str(workdir))
  torch.manual_seed(0)  # the same random weights
  tm = timm_vit.timm_model("deit3_small_patch16_224", {"depth": 2})
  run = laplax.load(str(workdir))
  assert (run.step, run.teacher, run.config.data.name) == (0, None, "imagenet2012")
  assert run.config.model.depth == 2 and run.config.model.width == 384
  assert run.config.data.image_size == 224 and run.model.num_classes == 1000
  images = images_for(timm_vit.architecture(tm), seed=1, batch=2)
  got, _ = jax.jit(run.model.apply)({"params": run.params}, images.transpose(0, 2, 3, 1))
  diff = relative_diff(got, timm_logits(tm, images))
  print(f"laplax.load of a converted deit3_small_patch16_224 vs timm: {diff:.2e}")
  assert diff < TOL
  assert os.listdir(config.data.data_dir) == []  # nothing prepared
  with pytest.raises(DataError, match="imagenet2012"):
    _ = run.task


def test_bad_inputs_are_one_line_and_nothing_written(tmp_path):
  """The weights of another architecture and an existing workdir: one
  :class:`ConvertError` line each, nothing written. (The CLI prints such an
  error as its one ``error:`` line with exit code 2:
  ``test_convert_gpt2.test_cli_converts_and_refuses_bad_input_in_one_line``;
  ``--weights`` through the CLI: :func:`test_cli_timm_workdir_evaluates_fine_tunes_and_goes_back`.)"""
  exists = tmp_path / "exists"
  exists.mkdir()
  # The weights of another architecture (a ViT-S block) for a ViT-Ti.
  weights = tmp_path / "other.safetensors"
  from safetensors.numpy import save_file

  save_file(timm_state(timm_vit.timm_model("vit_small_patch16_224", {"depth": 1})), str(weights))
  from laplax.cli import common as cli

  config = cli._load_config_file(CONFIG)
  with pytest.raises(common.ConvertError) as e:
    timm_vit.convert_from_timm(
      "vit_tiny_patch16_224", str(weights), "depth=1", config, str(tmp_path / "b")
    )
  assert "\n" not in str(e.value)
  assert (
    "timm tensor patch_embed.proj.weight has shape (384, 3, 16, 16); this "
    "architecture needs (192, 3, 16, 16)"
  ) in str(e.value)
  with pytest.raises(common.ConvertError, match="exists; give a new directory"):
    timm_vit.convert_from_timm("vit_tiny_patch16_224", None, "depth=1", None, str(exists))
  assert sorted(os.listdir(tmp_path)) == ["exists", "other.safetensors"]
  assert os.listdir(exists) == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_library_imports_no_pytorch(tmp_path):
  """With PyTorch installed, training, evaluation, analysis and the converter
  modules import no torch (tensorboardX would: laplax blocks it there)."""
  code = (
    "import sys; import laplax, laplax.train.loop, laplax.loading, "
    "laplax.convert, laplax.convert.timm_vit, laplax.convert.hf_gpt2, "
    "laplax.analysis.report, eval; "
    "from laplax.workdir.files import MetricWriter; "
    f"MetricWriter({str(tmp_path)!r}).close(); "
    "print(sorted(m for m in sys.modules if m.split('.')[0] in "
    "('torch', 'timm', 'transformers')))"
  )
  r = run(["-c", code])
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]"
  assert (tmp_path / "tensorboard").is_dir()
