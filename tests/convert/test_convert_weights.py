"""``convert --from timm --weights FILE`` with the files users have: a
fine-tuned classifier converts with its own number of classes (read from the
weights' head when ``--model_args`` does not say it; a head that contradicts
``num_classes`` is one line naming the fix), and the authors' release files of
Swin (Microsoft's: each stage's patch merging at its end, ``head.*``) and
XCiT (facebookresearch's: ``pos_embeder``, a fused class-attention ``qkv``),
written here from timm's layout by the renames their checkpoints differ by,
convert to the logits of the timm model they came from."""

import importlib.util
import re

import jax
import numpy as np
import pytest

from laplax.convert import common, timm_vit

from helpers.configs import load

pytestmark = pytest.mark.skipif(
  not all(importlib.util.find_spec(m) for m in ("torch", "timm")),
  reason="the test oracles: pip install -r requirements-test.txt",
)
ARGS = "depth=1,img_size=32,patch_size=8,embed_dim=32,num_heads=2"


@pytest.mark.parametrize("name,head", [("vit_tiny_patch16_224", "head.weight")])
def test_ten_class_weights_convert_without_num_classes(tmp_path, name, head):
  import torch
  from safetensors.numpy import save_file

  import laplax

  torch.manual_seed(0)
  model = timm_vit.timm_model(name, dict(timm_vit.parse_model_args(ARGS), num_classes=10))
  state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  assert timm_vit.head_classes(state) == 10 and state[head].shape[0] == 10
  weights = tmp_path / "ten.safetensors"
  save_file(state, str(weights))
  config = load("vit_fashion_mnist")
  common.plain_attention(config, [])
  timm_vit.convert_from_timm(name, str(weights), ARGS, config, str(tmp_path / "w"))
  run = laplax.load(str(tmp_path / "w"))
  assert run.model.num_classes == 10
  images = np.random.default_rng(1).normal(size=(2, 3, 32, 32)).astype(np.float32)
  got, _ = jax.jit(run.model.apply)({"params": run.params}, images.transpose(0, 2, 3, 1))
  with torch.no_grad():
    want = model(torch.from_numpy(images)).numpy()
  assert np.abs(np.asarray(got) - want).max() / np.abs(want).max() < 1e-5
  # num_classes given and contradicted by the head: one line with the fix.
  with pytest.raises(common.ConvertError) as e:
    timm_vit.convert_from_timm(
      name, str(weights), ARGS + ",num_classes=1000", config, str(tmp_path / "x")
    )
  assert str(e.value) == (
    "timm tensor head.weight has shape (10, 32); this architecture needs (1000, 32) "
    "(a 10-class head: --model_args num_classes=10)"
  )
  assert not (tmp_path / "x").exists()


def microsoft_swin(state: dict) -> dict:
  """timm's Swin tensors in Microsoft's layout: the patch merging of stage
  ``i`` at the end of stage ``i - 1``, the classifier ``head.*``."""
  out = {}
  for k, v in state.items():
    k = re.sub(r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) - 1}.downsample", k)
    out[k.replace("head.fc.", "head.")] = v
  return out


def facebook_xcit(state: dict) -> dict:
  """timm's XCiT tensors in facebookresearch's layout: ``pos_embeder``, and
  each class-attention block's ``q``, ``k``, ``v`` fused into one ``qkv``."""
  out = {k.replace("pos_embed.", "pos_embeder."): v for k, v in state.items()}
  for i in range(2):
    for kind in ("weight", "bias"):
      parts = [out.pop(f"cls_attn_blocks.{i}.attn.{x}.{kind}") for x in "qkv"]
      out[f"cls_attn_blocks.{i}.attn.qkv.{kind}"] = np.concatenate(parts)
  return out


RELEASES = [
  (
    "swin_tiny_patch4_window7_224",
    "img_size=28,in_chans=1,patch_size=2,embed_dim=16,depths=(2,2),num_heads=(2,4),window_size=4",
    microsoft_swin,
    "layers.0.downsample.reduction.weight",
  ),
  (
    "xcit_tiny_12_p16_224",
    "in_chans=1,embed_dim=32,depth=2,num_heads=4,img_size=64",
    facebook_xcit,
    "pos_embeder.token_projection.weight",
  ),
]


@pytest.mark.parametrize("name,args,release,marker", RELEASES, ids=["swin", "xcit"])
def test_the_authors_release_layouts_convert(tmp_path, name, args, release, marker):
  import torch
  from safetensors.numpy import save_file

  import laplax

  torch.manual_seed(0)
  model = timm_vit.timm_model(name, dict(timm_vit.parse_model_args(args), num_classes=10))
  with torch.no_grad():  # every norm and bias away from its initial value
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.3 * torch.randn_like(p))
  state = release({k: v.detach().float().numpy() for k, v in model.state_dict().items()})
  assert marker in state and "head.weight" in state
  save_file(state, str(tmp_path / "release.safetensors"))
  config = load("xcit_imagenet" if "xcit" in name else "swin_imagenet")
  config.data.data_dir = str(tmp_path / "none")
  common.plain_attention(config, [])
  timm_vit.convert_from_timm(
    name, str(tmp_path / "release.safetensors"), args, config, str(tmp_path / "w")
  )
  run = laplax.load(str(tmp_path / "w"))
  size = model.patch_embed.img_size[0]
  images = np.random.default_rng(1).normal(size=(2, 1, size, size)).astype(np.float32)
  got, _ = jax.jit(run.model.apply)({"params": run.params}, images.transpose(0, 2, 3, 1))
  with torch.no_grad():
    want = model(torch.from_numpy(images)).numpy()
  assert np.abs(np.asarray(got) - want).max() / np.abs(want).max() < 1e-5
