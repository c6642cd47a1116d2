"""A fine-tuned timm classifier converts with its own number of classes: read
from the weights' head when ``--model_args`` does not say it, and a head that
contradicts ``num_classes`` is one line naming the fix."""

import importlib.util

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
