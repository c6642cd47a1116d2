"""Hugging Face GPT-2 <-> laplax (laplax/convert/hf_gpt2.py), against ``transformers``.

``GPT2LMHeadModel`` with random weights (every tensor random, so that a
swapped bias or norm shows) is saved with ``save_pretrained``, converted with
``convert_from_hf`` and run by laplax's GPT built from the written config:
logits of the full forward pass and of KV-cache decoding (HF's cache passed
back step by step, against laplax ``decode=True``) equal HF's to ``1e-5 *
max|logits|``, for a tiny model and a 124M-shaped one (the
measured differences are printed and recorded as test properties). A laplax
workdir written as GPT-2 loads strictly into ``GPT2LMHeadModel``, computes
the same logits and converts back bit for bit. Bad inputs fail with one line
naming the problem and write nothing.
"""

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from laplax.convert import common, hf_gpt2
from laplax.data.text.tokenizers import BPETokenizer
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT

from helpers.configs import load
from helpers.runs import ROOT

pytestmark = pytest.mark.skipif(
  not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
  reason="the test oracles: pip install -r requirements-test.txt",
)
# Imported by the module fixture below, not at collection (every xdist worker
# collects every file, and torch + transformers take seconds to import).
torch = transformers = no_init_weights = None


@pytest.fixture(autouse=True, scope="module")
def _torch_and_transformers():
  global torch, transformers, no_init_weights
  import torch as torch_module
  import transformers as transformers_module
  from transformers.initialization import no_init_weights as no_init

  torch_module.set_num_threads(1)
  torch, transformers, no_init_weights = torch_module, transformers_module, no_init


SMALL = dict(vocab_size=300, n_positions=32, n_embd=64, n_layer=2, n_head=4)
TEXT = (
  "the quick brown fox jumps over the lazy dog. pack my box with five dozen "
  "liquor jugs! how vexingly quick daft zebras jump; sphinx of black quartz, "
  "judge my vow. 0123456789 "
) * 20


def _config(**model):
  """configs/gpt_shakespeare.py in float32 without Laplacian heads, plus ``model``."""
  c = load("gpt_shakespeare")
  c.model.num_laplacian_heads = 0
  c.model.update(model)
  return c


def _hf_model(seed=0, std=0.1, **kw):
  """A ``GPT2LMHeadModel`` in eval mode with random weights: matrices and
  biases normal(0, ``std``), LayerNorm scales 1 + normal(0, 0.05) and biases
  normal(0, 0.05), so that a swapped bias or norm shows (HF's own
  initialisation, 7 s for 124M parameters on one thread, is skipped). The
  tiny models' 0.1 makes the attention far from uniform (with GPT-2's 0.02
  swapping queries and keys would hardly change the logits)."""
  kw.setdefault("bos_token_id", None)
  kw.setdefault("eos_token_id", None)
  with no_init_weights():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw))
  model.tie_weights()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      if ".ln_" in name:
        p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.05 * noise)
      else:
        p.copy_(std * noise)
  return model.eval()


def _save(model, path, tokenizer=None):
  model.save_pretrained(path)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)
  return path


def _laplax(workdir):
  """``(GPT, params, spec, config)`` of a converted workdir (no data needed)."""
  config, spec, params, step = common.read_workdir(str(workdir))
  assert step == 0
  vocab = config.data.vocab_size
  assert spec == spec_lib.from_config(config.model)
  return GPT(spec, vocab), common.to_layout(params, spec), spec, config


def _forward(model, params, tokens):
  logits, _ = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, jnp.asarray(tokens))
  return np.asarray(logits)


def _decode(model, params, tokens):
  """Laplax logits ``[length, vocab]`` of ``tokens [1, length]`` fed one at a time."""
  shapes = jax.eval_shape(
    lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, model.spec.max_length), jnp.int32), decode=True
    )
  )["cache"]
  cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  @jax.jit
  def step(params, cache, token):  # params an argument: not constants in the program
    (logits, _), updated = model.apply(
      {"params": params, "cache": cache}, token, decode=True, mutable=["cache"]
    )
    return updated["cache"], logits[0, -1]

  out = []
  for t in range(tokens.shape[1]):
    cache, logits = step(params, cache, jnp.asarray(tokens[:, t : t + 1]))
    out.append(np.asarray(logits))
  return np.stack(out)


def _hf_forward(model, tokens):
  with torch.no_grad():
    return model(torch.as_tensor(tokens, dtype=torch.long)).logits[0].numpy()


def _hf_decode(model, tokens):
  """HF logits ``[length, vocab]`` fed one token at a time with ``use_cache=True``,
  the returned cache passed back. transformers 5.24 renamed
  ``past_key_values`` to ``cache`` (argument and output; the old name warns
  that it goes in 5.40); the cache is a ``DynamicCache``."""
  name = "cache" if "cache" in inspect.signature(model.forward).parameters else ("past_key_values")
  past, out = None, []
  with torch.no_grad():
    for t in range(tokens.shape[1]):
      result = model(
        torch.as_tensor(tokens[:, t : t + 1], dtype=torch.long), use_cache=True, **{name: past}
      )
      past = getattr(result, name)
      assert past is not None
      out.append(result.logits[0, -1].numpy())
  return np.stack(out), type(past).__name__


def _check_close(name, got, want, record_property):
  """``max|got - want| <= 1e-5 max|want|``; records and prints the difference."""
  diff, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
  record_property(name, diff)
  record_property(name + "_max_abs_logit", scale)
  print(f"{name}: max|diff| = {diff:.3g} (max|logits| = {scale:.3g})")
  assert got.shape == want.shape
  assert scale > 0.1  # not a degenerate model
  assert diff <= 1e-5 * scale, (name, diff, scale)


@pytest.fixture(scope="module")
def bpe():
  """A byte-level BPE of 300 tokens (as laplax trains them) wrapped as an HF tokenizer."""
  tok = BPETokenizer.train([TEXT], SMALL["vocab_size"])
  inner = tok._tokenizer
  return transformers.PreTrainedTokenizerFast(tokenizer_object=inner)


@pytest.fixture(scope="module")
def small(tmp_path_factory, bpe):
  """``(HF model, its save_pretrained dir, converted workdir)`` of the tiny GPT-2."""
  root = tmp_path_factory.mktemp("small")
  model = _hf_model(**SMALL)
  hf_dir = _save(model, str(root / "hf"), bpe)
  hf_gpt2.convert_from_hf(hf_dir, _config(), str(root / "run"))
  return model, hf_dir, root / "run"


def _tokens(vocab, length, seed=1):
  return np.random.default_rng(seed).integers(0, vocab, (1, length)).astype(np.int32)


@pytest.mark.slow
def test_small_gpt2_logits_and_kv_cache_match_hf(small, bpe, record_property):
  model, hf_dir, workdir = small
  gpt, params, spec, config = _laplax(workdir)
  assert (spec.width, spec.depth, spec.num_heads, spec.mlp_dim, spec.max_length) == (
    64,
    2,
    4,
    256,
    32,
  )
  assert spec.norm_eps == 1e-5 and spec.mlp_activation == "gelu" and spec.tie_embeddings
  assert not spec.laplacian_array.any() and config.data.tokenizer == "bpe"
  assert "lm_head" not in params
  tokens = _tokens(300, 32)  # the whole context: every position embedding is used
  _check_close(
    "small_forward", _forward(gpt, params, tokens)[0], _hf_forward(model, tokens), record_property
  )
  hf_steps, cache_type = _hf_decode(model, tokens[:, :12])
  record_property("hf_cache_type", cache_type)
  _check_close("small_kv_cache", _decode(gpt, params, tokens[:, :12]), hf_steps, record_property)
  # The tokenizer came along and encodes as HF's does.
  tok = BPETokenizer.load(str(workdir / "tokenizer.json"))
  assert tok.vocab_size == 300
  for text in ("the quick brown fox", "judge my vow, zebras! 42", "unseen wörds ✓"):
    assert tok.encode(text).tolist() == bpe.encode(text)
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_gpt2_124m_logits_and_kv_cache_match_hf(record_property):
  """GPT2Config() defaults (124M parameters), random weights, one short
  sequence. The state dict is mapped in memory (the files, 0.5 GB here and
  1.5 GB of checkpoint with the optimizer state, are the small model's test)."""
  model = _hf_model(std=0.02)
  hf = model.config.to_dict()
  tensors = hf_gpt2.check_hf_tensors(
    {k: v.numpy() for k, v in model.state_dict().items()}, hf, "state_dict"
  )
  config = hf_gpt2.laplax_config(hf, _config())
  spec = spec_lib.from_config(config.model)
  params = common.nested(hf_gpt2.hf_to_laplax(tensors, spec.depth, spec.tie_embeddings))
  gpt = GPT(spec, config.data.vocab_size)
  assert (spec.width, spec.depth, spec.num_heads, spec.mlp_dim, spec.max_length) == (
    768,
    12,
    12,
    3072,
    1024,
  )
  assert (
    sum(x.size for x in jax.tree_util.tree_leaves(params))
    == sum(p.numel() for p in model.parameters())
    == 124_439_808
  )
  tokens = _tokens(50257, 6)
  _check_close(
    "gpt2_124m_forward",
    _forward(gpt, params, tokens)[0],
    _hf_forward(model, tokens),
    record_property,
  )
  hf_steps, _ = _hf_decode(model, tokens)
  _check_close("gpt2_124m_kv_cache", _decode(gpt, params, tokens), hf_steps, record_property)


def _perturbed(params, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
    lambda x: np.asarray(x + 0.05 * rng.standard_normal(x.shape), np.float32), params
  )


@pytest.mark.slow
def test_laplax_workdir_to_hf_loads_strictly_and_round_trips_bitwise(
  small, tmp_path, record_property
):
  """A laplax-initialised GPT (scanned layout, ReLU^2 MLP) written as GPT-2: HF
  loads it with no missing, unexpected or mismatched key and computes laplax's
  logits; converted back, every parameter is bitwise the original."""
  _, _, converted = small
  config = _config(
    width=64,
    depth=2,
    num_heads=4,
    mlp_dim=128,
    max_length=16,
    posemb="learn",
    norm_eps=1e-5,
    mlp_activation="relu2",
    scan_layers=True,
  )
  config.data.tokenizer, config.data.vocab_size = "bpe", 300
  spec = spec_lib.from_config(config.model)
  gpt = GPT(spec, 300)
  params = _perturbed(
    jax.jit(gpt.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
  )
  assert "blocks" in params  # scan_layers: stacked
  source = tmp_path / "laplax"
  common.write_workdir(
    str(source),
    config,
    params,
    vocab_size=300,
    files={"tokenizer.json": str(converted / "tokenizer.json")},
  )
  out = tmp_path / "hf"
  assert hf_gpt2.convert_to_hf(str(source), str(out), False) is None
  assert sorted(os.listdir(out)) == [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
  ]
  written = json.loads((out / "config.json").read_text())
  assert written["activation_function"] == "relu2" and written["n_inner"] == 128
  assert written["tie_word_embeddings"] is True and written["n_positions"] == 16
  tensors = load_file(str(out / "model.safetensors"))
  assert "lm_head.weight" not in tensors and len(tensors) == 4 + 12 * 2
  assert all(t.dtype == np.float32 and t.flags.c_contiguous for t in tensors.values())
  model, info = transformers.GPT2LMHeadModel.from_pretrained(str(out), output_loading_info=True)
  assert {"missing_keys", "unexpected_keys", "mismatched_keys"} <= set(info), info
  assert not any(info.values()), info
  model.eval()
  assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
  tokens = _tokens(300, 16, seed=2)
  _check_close(
    "laplax_to_hf_forward",
    _hf_forward(model, tokens),
    _forward(gpt, params, tokens)[0],
    record_property,
  )
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert (
    hf_tok.encode("the lazy dog")
    == BPETokenizer.load(str(source / "tokenizer.json")).encode("the lazy dog").tolist()
  )
  back = tmp_path / "back"
  hf_gpt2.convert_from_hf(str(out), config, str(back))
  restored = common.read_workdir(str(back))[2]
  original = common.flat(common.from_layout(params, spec))
  restored = common.flat(restored)
  assert sorted(restored) == sorted(original)
  for name, value in original.items():
    assert np.array_equal(restored[name], value), name
  assert (
    json.loads((back / "config.json").read_text())["model"]
    == json.loads((source / "config.json").read_text())["model"]
  )


@pytest.mark.slow
def test_untied_exact_gelu_logits_and_round_trip(tmp_path, record_property):
  """``tie_word_embeddings=False`` and ``activation_function="gelu"`` (erf):
  laplax's ``lm_head`` and ``gelu_exact``; the HF file comes back bit for bit."""
  model = _hf_model(seed=3, tie_word_embeddings=False, activation_function="gelu", **SMALL)
  hf_dir = _save(model, str(tmp_path / "hf"))
  originals = load_file(os.path.join(hf_dir, "model.safetensors"))
  assert "lm_head.weight" in originals
  hf_gpt2.convert_from_hf(hf_dir, _config(), str(tmp_path / "run"))
  gpt, params, spec, _ = _laplax(tmp_path / "run")
  assert not spec.tie_embeddings and spec.mlp_activation == "gelu_exact"
  assert params["lm_head"]["kernel"].shape == (64, 300)
  tokens = _tokens(300, 20, seed=4)
  _check_close(
    "untied_forward", _forward(gpt, params, tokens)[0], _hf_forward(model, tokens), record_property
  )
  assert hf_gpt2.convert_to_hf(str(tmp_path / "run"), str(tmp_path / "out"), False) is None
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert written["activation_function"] == "gelu" and written["tie_word_embeddings"] is False
  again = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert sorted(again) == sorted(originals)
  for name, value in originals.items():
    assert np.array_equal(again[name], value), name


def test_laplacian_model_is_refused_without_force(small, tmp_path):
  _, hf_dir, _ = small
  workdir = tmp_path / "lap"
  hf_gpt2.convert_from_hf(hf_dir, _config(num_laplacian_heads=1), str(workdir))
  _, spec, _, _ = common.read_workdir(str(workdir))
  assert spec.laplacian_array.tolist() == [[False, False, False, True]] * 2
  with pytest.raises(common.ConvertError) as e:
    hf_gpt2.convert_to_hf(str(workdir), str(tmp_path / "out"), False)
  message = str(e.value)
  assert "\n" not in message and "--force" in message and "Laplacian" in message
  assert not (tmp_path / "out").exists()
  note = hf_gpt2.convert_to_hf(str(workdir), str(tmp_path / "out"), True)
  # (common.refuse_laplax_only shows NumPy 2 integers as np.int64(3).)
  for layer in (0, 1):
    assert re.search(rf"layer {layer}: heads \[(np\.int64\()?3\)?\]", note), note
  # The weights are the HF model's: the Laplacian heads change the computation only.
  original = load_file(os.path.join(hf_dir, "model.safetensors"))
  written = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert sorted(written) == sorted(original)
  assert all(np.array_equal(written[k], v) for k, v in original.items())


def test_learned_laplacian_mix_starts_at_the_pattern_and_is_kept_with_force(small, tmp_path):
  _, hf_dir, _ = small
  workdir = tmp_path / "mix"
  hf_gpt2.convert_from_hf(
    hf_dir, _config(num_laplacian_heads=2, laplacian_mix="learned"), str(workdir)
  )
  params = common.read_workdir(str(workdir))[2]
  for i in range(2):
    assert params[f"block{i}"]["attention"]["laplacian_mix"].tolist() == [-4, -4, 4, 4]
  note = hf_gpt2.convert_to_hf(str(workdir), str(tmp_path / "out"), True)
  assert "laplacian_mix" in note and "\n" not in note
  written = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert written["transformer.h.1.attn.laplacian_mix"].tolist() == [-4, -4, 4, 4]


def test_to_hf_refuses_options_gpt2_lacks(small, tmp_path):
  """Workdirs of GPTs with an option GPT-2 has not (the converted workdir with
  one model key of its config.json changed: the refusal reads the config
  only) are refused, with ``force`` too, in one line naming the key."""
  _, _, workdir = small
  saved = json.loads((workdir / "config.json").read_text())
  for key, value, message in (
    ("posemb", "rope", "model.posemb='rope'"),
    ("norm", "rmsnorm", "model.norm='rmsnorm'"),
    ("qk_norm", True, "model.qk_norm=True"),
    ("qk_scale", 1.2, "model.qk_scale=1.2"),
    ("use_bias", False, "model.use_bias=False"),
    ("embed_norm", True, "model.embed_norm=True"),
    ("layerscale_init", 0.1, "model.layerscale_init=0.1"),
  ):
    run = tmp_path / key
    shutil.copytree(workdir, run)
    config = json.loads(json.dumps(saved))
    config["model"][key] = value
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(common.ConvertError) as e:
      hf_gpt2.convert_to_hf(str(run), str(tmp_path / "out"), True)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()
  # An existing output directory is refused and left alone.
  (tmp_path / "out").mkdir()
  with pytest.raises(common.ConvertError, match="exists"):
    hf_gpt2.convert_to_hf(str(workdir), str(tmp_path / "out"), False)
  assert os.listdir(tmp_path / "out") == []


def test_pytorch_bin_without_prefix_and_with_mask_buffers(small, tmp_path):
  """A ``pytorch_model.bin`` as the original ``gpt2`` repository has it (names
  without ``transformer.``, the causal-mask buffers ``attn.bias`` /
  ``attn.masked_bias``, a tied ``lm_head.weight``) converts to the same
  parameters as the safetensors file, bit for bit."""
  model, hf_dir, workdir = small
  state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items()}
  assert "lm_head.weight" in state  # tied: the same storage as wte.weight
  for i in range(SMALL["n_layer"]):
    state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32, dtype=torch.bool))
    state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  torch.save(state, bin_dir / "pytorch_model.bin")
  shutil.copy(os.path.join(hf_dir, "config.json"), bin_dir)
  hf_gpt2.convert_from_hf(str(bin_dir), _config(), str(tmp_path / "run"))
  want = common.flat(common.read_workdir(str(workdir))[2])
  got = common.flat(common.read_workdir(str(tmp_path / "run"))[2])
  assert sorted(got) == sorted(want)
  assert all(np.array_equal(got[k], want[k]) for k in want)
  # An lm_head.weight that is not wte.weight contradicts tie_word_embeddings.
  state["lm_head.weight"] = state["lm_head.weight"] + 1.0
  torch.save(state, bin_dir / "pytorch_model.bin")
  _refused(str(bin_dir), tmp_path / "run2", "lm_head.weight", "tie_word_embeddings")


def _broken_copy(hf_dir, dest, *, drop=None, reshape=None, config=None, add=None):
  """A copy of the HF directory with a tensor dropped, reshaped or added, or
  ``config.json`` keys changed."""
  os.makedirs(dest)
  tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
  if drop:
    del tensors[drop]
  if reshape:
    tensors[reshape] = tensors[reshape][:-1]
  if add:
    tensors[add] = np.zeros(3, np.float32)
  save_file(tensors, os.path.join(dest, "model.safetensors"))
  hf = json.load(open(os.path.join(hf_dir, "config.json")))
  hf.update(config or {})
  json.dump(hf, open(os.path.join(dest, "config.json"), "w"))
  return str(dest)


def _refused(model_dir, workdir, *words):
  with pytest.raises(common.ConvertError) as e:
    hf_gpt2.convert_from_hf(model_dir, _config(), str(workdir))
  message = str(e.value)
  assert "\n" not in message and all(w in message for w in words), message
  assert not os.path.exists(workdir)
  assert not [n for n in os.listdir(os.path.dirname(workdir)) if n.startswith(".convert-")]
  return message


def test_bad_hf_directories_are_refused_in_process(small, tmp_path):
  _, hf_dir, workdir = small
  run = tmp_path / "run"
  names = load_file(os.path.join(hf_dir, "model.safetensors"))
  prefix = "transformer." if "transformer.wte.weight" in names else ""
  wrong = _broken_copy(hf_dir, tmp_path / "shape", reshape=prefix + "h.1.mlp.c_fc.bias")
  _refused(wrong, run, prefix + "h.1.mlp.c_fc.bias", "(255,)", "(256,)")
  extra = _broken_copy(hf_dir, tmp_path / "extra", add=prefix + "h.2.attn.c_attn.bias")
  _refused(extra, run, prefix + "h.2.attn.c_attn.bias", "has not")
  for key, value in (
    ("scale_attn_by_inverse_layer_idx", True),
    ("reorder_and_upcast_attn", True),
    ("scale_attn_weights", False),
    ("add_cross_attention", True),
    ("model_type", "gpt_neo"),
  ):
    bad = _broken_copy(hf_dir, tmp_path / key, config={key: value})
    _refused(bad, run, key)
  untied = _broken_copy(hf_dir, tmp_path / "untied", config={"tie_word_embeddings": False})
  _refused(untied, run, "lm_head.weight")
  # An existing workdir is refused before anything is read, and left as it was.
  before = sorted(os.listdir(workdir))
  with pytest.raises(common.ConvertError, match="exists"):
    hf_gpt2.convert_from_hf(hf_dir, _config(), str(workdir))
  assert sorted(os.listdir(workdir)) == before


def _cli(*args):
  return subprocess.Popen(
    [sys.executable, "-m", "laplax.convert", *map(str, args)],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
  )


@pytest.mark.slow
def test_cli_converts_and_refuses_bad_input_in_one_line(small, tmp_path):
  _, hf_dir, _ = small
  config = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
  names = load_file(os.path.join(hf_dir, "model.safetensors"))
  removed = next(n for n in names if n.endswith("h.0.ln_2.weight"))
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
  bad = {
    "no_weights": (str(empty), ["model.safetensors"]),
    "removed": (_broken_copy(hf_dir, tmp_path / "removed", drop=removed), [removed]),
    "activation": (
      _broken_copy(hf_dir, tmp_path / "act", config={"activation_function": "silu"}),
      ["activation_function", "silu"],
    ),
  }
  good = _cli(
    "--from",
    "hf-gpt2",
    "--model",
    hf_dir,
    "--workdir",
    tmp_path / "good",
    "--config",
    config,
    "--config.model.num_laplacian_heads=1",
  )
  procs = {
    name: _cli(
      "--from", "hf-gpt2", "--model", d, "--workdir", tmp_path / f"w_{name}", "--config", config
    )
    for name, (d, _) in bad.items()
  }
  out, err = good.communicate(timeout=300)
  assert good.returncode == 0, err[-3000:]
  assert "wrote" in out
  assert os.path.isfile(tmp_path / "good" / "config.json")
  assert os.path.isdir(tmp_path / "good" / "checkpoints" / "0")
  # The command line's Laplacian heads are kept (the config file's 2 per layer
  # are not: the CLI resets what the command line does not set).
  _, spec, _, _ = common.read_workdir(str(tmp_path / "good"))
  assert spec.laplacian_array.tolist() == [[False, False, False, True]] * 2
  assert spec.posemb == "learn" and spec.width == 64 and spec.max_length == 32
  for name, proc in procs.items():
    _, err = proc.communicate(timeout=300)
    lines = [l for l in err.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, (name, err)
    assert all(w in lines[0] for w in bad[name][1]), (name, lines[0])
    assert not (tmp_path / f"w_{name}").exists()
