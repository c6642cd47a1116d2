"""laplax BERT (laplax/models/bert.py) against its references.

* The original BERT: ``transformers.BertForMaskedLM`` with random weights,
  every LayerNorm and bias perturbed, mapped by ``laplax.convert.hf_bert``:
  MLM logits to 1e-4 relative (with key padding and token types).
* The cramming architecture: a PyTorch model written here from cramming's
  ``crammed_bert.py`` / ``components.py`` / ``embeddings.py`` definitions
  (pre-norm, no dense biases, GELU-GLU, scaled sinusoidal positions, final
  norm, tied decoder without bias) on the same random weights.
* Invariants: padded keys change no real token's logits (with Laplacian
  heads and spectral conditioning on), sparse prediction equals gathering
  the dense logits, and the gated GELU is its definition.
"""

import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.convert import common, hf_bert
from laplax.models import spec as spec_lib
from laplax.models.bert import BERT, sinusoidal_table
from laplax.models.layers import gelu_glu

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="pip install -r requirements-test.txt")
V, D, H, F, L = 97, 64, 4, 128, 128


def tiny_hf_bert(seed=0):
  """A random ``BertForMaskedLM`` (2 layers, width 64, 4 heads, length 128)
  with every LayerNorm and bias perturbed, and its config dict."""
  import torch
  from transformers import BertConfig, BertForMaskedLM

  torch.manual_seed(seed)
  cfg = BertConfig(
    vocab_size=V,
    hidden_size=D,
    num_hidden_layers=2,
    num_attention_heads=H,
    intermediate_size=F,
    max_position_embeddings=L,
    type_vocab_size=2,
  )
  model = BertForMaskedLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  return model, cfg.to_dict()


def _inputs(seed=0, pad_from=100):
  rs = np.random.RandomState(seed)
  tokens = rs.randint(0, V, (2, L))
  types = rs.randint(0, 2, (2, L))
  mask = np.ones((2, L), np.int32)
  mask[1, pad_from:] = 0
  return tokens, types, mask


@pytest.mark.slow
@needs_torch
def test_original_bert_matches_transformers():
  import torch

  hf, hf_cfg = tiny_hf_bert()
  state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  flat = hf_bert.hf_to_laplax(hf_bert.check_hf_tensors(state, hf_cfg, "hf"), 2)
  spec = spec_lib.build("bert", width=D, depth=2, num_heads=H, mlp_dim=F, max_length=L)
  model = BERT(spec, vocab_size=V)
  tokens, types, mask = _inputs()
  with torch.no_grad():
    ref = hf(
      input_ids=torch.tensor(tokens),
      token_type_ids=torch.tensor(types),
      attention_mask=torch.tensor(mask),
    ).logits.numpy()
  got, _ = model.apply({"params": common.nested(flat)}, tokens, types, mask, train=False)
  real = mask.astype(bool)
  rel = np.abs(np.asarray(got) - ref)[real].max() / np.abs(ref).max()
  assert rel < 1e-4, rel
  back = hf_bert.laplax_to_hf(flat, 2)
  assert all(np.array_equal(back[k], state[k]) for k in back)


def _torch_crammed(params, tokens, spec):
  """cramming's crammed-bert forward in PyTorch, from its definitions:
  ``EmbeddingComponent`` (word + ScaledSinosoidal, LayerNorm), pre-norm
  ``TransformerLayer`` (``x + attn(norm1(x))``, ``x + ffn(norm2(x))``; no
  biases; GLU ``x, gate = chunk(2)``, ``GELU(gate) * x``), ``final_norm``,
  decoder tied to the word embedding, no bias."""
  import torch

  t = lambda a: torch.tensor(np.asarray(a))
  eps = spec.norm_eps

  def ln(x, p):
    return torch.nn.functional.layer_norm(x, (D,), t(p["scale"]), t(p["bias"]), eps)

  emb = t(params["token_embedding"]["embedding"])
  x = emb[torch.tensor(tokens)]
  pe = torch.zeros(L, D)
  position = torch.arange(0, L, dtype=torch.float).unsqueeze(1)
  div = torch.exp(torch.arange(0, D, 2).float() * (-math.log(10000.0) / D))
  pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
  x = ln(x + t(params["pos_scale"]) * pe[None], params["embed_norm"])
  for i in range(spec.depth):
    b = params[f"block{i}"]
    y = ln(x, b["norm1"])
    q, k, v = (
      (y @ t(b["attention"][n]["kernel"])).view(2, L, H, D // H).transpose(1, 2)
      for n in ("query", "key", "value")
    )
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H), -1) @ v
    x = x + a.transpose(1, 2).reshape(2, L, D) @ t(b["attention"]["out"]["kernel"])
    h = ln(x, b["norm2"]) @ t(b["mlp"]["fc1"]["kernel"])
    value, gate = h.chunk(2, dim=-1)
    x = x + (torch.nn.functional.gelu(gate) * value) @ t(b["mlp"]["fc2"]["kernel"])
  x = ln(x, params["final_norm"])
  return (x @ emb.T).numpy()


CRAMMED = dict(
  post_norm=False,
  use_bias=False,
  mlp_activation="gelu_glu",
  posemb="scaled_sinusoidal",
  type_vocab_size=0,
  final_norm=True,
  mlm_transform=False,
  decoder_bias=False,
  pooler="mean",
)


def _perturbed(params, seed=1):
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  out = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(tree, out)


@needs_torch
def test_crammed_bert_matches_a_torch_reference_of_cramming():
  spec = spec_lib.build("bert", width=D, depth=2, num_heads=H, mlp_dim=F, max_length=L, **CRAMMED)
  model = BERT(spec, vocab_size=V)
  tokens, _, _ = _inputs()
  params = _perturbed(model.init(jax.random.PRNGKey(0), tokens)["params"])
  assert "bias" not in params["block0"]["attention"]["query"]
  assert params["block0"]["mlp"]["fc2"]["kernel"].shape == (F // 2, D)
  got, _ = model.apply({"params": params}, tokens, train=False)
  ref = _torch_crammed(jax.device_get(params), tokens, spec)
  rel = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
  assert rel < 1e-4, rel


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, CRAMMED])
def test_padding_and_sparse_prediction_with_both_methods(options):
  spec = spec_lib.build(
    "bert",
    width=32,
    depth=2,
    num_heads=4,
    mlp_dim=64,
    max_length=16,
    num_laplacian_heads=2,
    spectral={"enabled": True},
    **options,
  )
  model = BERT(spec, vocab_size=V)
  rs = np.random.RandomState(0)
  tokens = rs.randint(0, V, (2, 16))
  mask = np.ones((2, 16), np.int32)
  mask[:, 11:] = 0
  params = _perturbed(model.init(jax.random.PRNGKey(0), tokens)["params"])
  logits, _ = model.apply({"params": params}, tokens, attention_mask=mask)
  other = tokens.copy()
  other[:, 11:] = rs.randint(0, V, (2, 5))
  logits2, _ = model.apply({"params": params}, other, attention_mask=mask)
  np.testing.assert_array_equal(np.asarray(logits)[:, :11], np.asarray(logits2)[:, :11])
  # Without the mask the padding is attended to: the real tokens' logits change.
  free, _ = model.apply({"params": params}, other)
  assert np.abs(np.asarray(free)[:, :11] - np.asarray(logits)[:, :11]).max() > 1e-3
  positions = np.array([[0, 3, 7], [10, 1, 2]])
  sparse, _ = model.apply({"params": params}, tokens, attention_mask=mask, positions=positions)
  dense = np.take_along_axis(np.asarray(logits), positions[..., None], axis=1)
  np.testing.assert_allclose(np.asarray(sparse), dense, rtol=1e-5, atol=1e-5)


def test_classifier_pools_real_tokens():
  spec = spec_lib.build(
    "bert", width=32, depth=1, num_heads=2, mlp_dim=64, max_length=16, **CRAMMED
  )
  model = BERT(spec, vocab_size=V, num_labels=3)
  tokens = np.random.RandomState(0).randint(0, V, (2, 16))
  mask = np.ones((2, 16), np.int32)
  mask[:, 9:] = 0
  params = model.init(jax.random.PRNGKey(0), tokens, attention_mask=mask)["params"]
  logits, out = model.apply({"params": params}, tokens, attention_mask=mask)
  assert logits.shape == (2, 3)
  pooled = np.asarray(out["encoded"])[:, :9].mean(1)
  p = params["pooler"]
  want = np.tanh(pooled @ np.asarray(p["kernel"]) + np.asarray(p["bias"]))
  c = params["classifier"]
  want = want @ np.asarray(c["kernel"]) + np.asarray(c["bias"])
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)


def test_gelu_glu_and_sinusoidal_table_definitions():
  x = np.random.RandomState(0).randn(3, 8).astype(np.float32)
  value, gate = x[:, :4], x[:, 4:]
  phi = 0.5 * (1 + np.vectorize(math.erf)(gate / math.sqrt(2)))
  np.testing.assert_allclose(np.asarray(gelu_glu(jnp.asarray(x))), gate * phi * value, rtol=1e-5)
  pe = sinusoidal_table(5, 6)
  p, i = 3, 1
  w = 10000.0 ** (-2 * i / 6)
  np.testing.assert_allclose(pe[p, 2 * i], math.sin(p * w), rtol=1e-5)
  np.testing.assert_allclose(pe[p, 2 * i + 1], math.cos(p * w), rtol=1e-5)


def test_bad_specs_are_one_line():
  with pytest.raises(spec_lib.SpecError, match="mlp_dim=63 must be even"):
    spec_lib.build("bert", width=32, num_heads=2, mlp_dim=63, mlp_activation="gelu_glu")
  with pytest.raises(spec_lib.SpecError, match="even model.width"):
    spec_lib.build("bert", width=33, num_heads=3, posemb="scaled_sinusoidal")


@pytest.mark.slow
@needs_torch
def test_convert_from_and_to_hf_bert(tmp_path):
  """``--from hf-bert`` writes a workdir whose ``laplax.load`` model gives
  HF's logits; ``--to hf-bert`` writes the same tensors bit for bit, loadable
  by ``BertForMaskedLM.from_pretrained``."""
  import torch
  from safetensors.numpy import load_file
  from transformers import BertForMaskedLM

  import laplax

  from helpers.configs import load

  hf, _ = tiny_hf_bert()
  hf.save_pretrained(tmp_path / "hf")
  hf_bert.convert_from_hf(str(tmp_path / "hf"), load("bert_cramming"), str(tmp_path / "w"))
  loaded = laplax.load(str(tmp_path / "w"))
  tokens, _, _ = _inputs()
  logits, _ = loaded.model.apply({"params": loaded.params}, tokens, train=False)
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  assert np.abs(np.asarray(logits) - ref).max() / np.abs(ref).max() < 1e-4
  hf_bert.convert_to_hf(str(tmp_path / "w"), str(tmp_path / "out"))
  a = load_file(tmp_path / "hf" / "model.safetensors")
  b = load_file(tmp_path / "out" / "model.safetensors")
  assert set(b) <= set(a) and all(np.array_equal(a[k], b[k]) for k in b)
  again = BertForMaskedLM.from_pretrained(tmp_path / "out").eval()
  with torch.no_grad():
    np.testing.assert_array_equal(again(input_ids=torch.tensor(tokens)).logits.numpy(), ref)
  # The cramming architecture has no BertForMaskedLM equivalent: refused in one line.
  with pytest.raises(
    common.ConvertError, match="model.use_bias=False: Hugging Face BERT has no equivalent"
  ):
    cfg = load("bert_cramming")
    cfg.model.update(width=D, depth=2, num_heads=H, mlp_dim=F, max_length=L)
    spec = spec_lib.from_config(cfg.model)
    common.refuse_unsupported(spec, hf_bert.SUPPORT, hf_bert.TARGET, "fix")
