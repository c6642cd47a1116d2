"""``--from hf-nystromformer`` (laplax/convert/hf_nystromformer.py) against ``transformers``.

A random ``NystromformerForMaskedLM`` (2 layers, width 64, 4 heads, 16
landmarks, length 128 in a position table of 130 as the public checkpoints
lay it out, every LayerNorm, bias and convolution perturbed)
converted and loaded with ``laplax.load`` gives HF's masked-LM logits to
1e-4 of their largest value. Inputs are unpadded: in transformers 5.24,
``NystromformerModel`` with a padding mask and fewer landmarks than tokens
fails (its ``[batch, 1, length, length]`` mask does not broadcast against
``[batch, heads, landmarks, length]``); the masked kernel is checked against
HF's self-attention in test_nystrom.py.
"""

import importlib.util
import json

import numpy as np
import pytest

from laplax.convert import common, hf_nystromformer

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="pip install -r requirements-test.txt")
V, D, H, F, L, M = 97, 64, 4, 128, 128, 16


def tiny_hf_nystromformer(seed=0, conv=9):
  import torch
  from transformers import NystromformerConfig, NystromformerForMaskedLM

  torch.manual_seed(seed)
  cfg = NystromformerConfig(
    vocab_size=V,
    hidden_size=D,
    num_hidden_layers=2,
    num_attention_heads=H,
    intermediate_size=F,
    max_position_embeddings=L + 2,  # the public checkpoints': 514 for 512
    segment_means_seq_len=L,
    num_landmarks=M,
    conv_kernel_size=conv,
    type_vocab_size=2,
  )
  model = NystromformerForMaskedLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias") or ".conv." in name:
        p.add_(0.3 * torch.randn_like(p))
  return model


@needs_torch
@pytest.mark.slow
def test_convert_from_hf_nystromformer(tmp_path):
  import torch

  import laplax

  from helpers.configs import load

  hf = tiny_hf_nystromformer()
  hf.save_pretrained(tmp_path / "hf")
  hf_nystromformer.convert_from_hf(str(tmp_path / "hf"), load("bert_cramming"), str(tmp_path / "w"))
  loaded = laplax.load(str(tmp_path / "w"))
  spec = loaded.model.spec
  assert spec.attention.implementation == "nystrom" and spec.attention.nystrom.num_landmarks == M
  assert spec.max_length == L
  tokens = np.random.RandomState(0).randint(0, V, (2, L))
  logits, _ = loaded.model.apply({"params": loaded.params}, tokens, train=False)
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  assert np.abs(np.asarray(logits) - ref).max() / np.abs(ref).max() < 1e-4
  # Malformed sources: one line each, nothing written.
  cfg_path = tmp_path / "hf" / "config.json"
  cfg = json.loads(cfg_path.read_text())
  for change, message in [
    ({"conv_kernel_size": 8}, "conv_kernel_size=8 is even"),
    ({"num_landmarks": 24}, "does not divide"),
    ({"model_type": "bert"}, "only 'nystromformer'"),
  ]:
    cfg_path.write_text(json.dumps(dict(cfg, **change)))
    with pytest.raises(common.ConvertError, match=message) as e:
      hf_nystromformer.convert_from_hf(
        str(tmp_path / "hf"), load("bert_cramming"), str(tmp_path / "x")
      )
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()
