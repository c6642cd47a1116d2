"""Hugging Face ``transformers`` BERT (``BertForMaskedLM``) <-> laplax BERT.

The original BERT (Devlin et al. 2019) is :class:`~laplax.models.bert.BERT`
with its default spec (post-norm, learned positions, token types, biases,
the MLM head's transform and bias, tied decoder). A ``save_pretrained``
directory of ``BertForMaskedLM`` holds ``config.json`` (a ``BertConfig``)
and ``model.safetensors`` with ``bert.embeddings.{word,position,token_type}_
embeddings.weight``, ``bert.embeddings.LayerNorm.{weight,bias}``,
``bert.encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}``,
``attention.output.dense``, ``attention.output.LayerNorm``,
``intermediate.dense``, ``output.dense``, ``output.LayerNorm`` and
``cls.predictions.{bias, transform.dense, transform.LayerNorm}`` (the decoder
is tied to the word embeddings and to ``cls.predictions.bias``). PyTorch's
``nn.Linear`` stores ``weight [out, in]``, the transpose of laplax's kernels;
nothing else changes, so a round trip is bitwise.

:func:`convert_from_hf` writes a new laplax workdir (an ``mlm`` task) from
such a directory, :func:`convert_to_hf` writes a laplax BERT workdir as one.
Errors are :class:`~laplax.convert.common.ConvertError` with one line.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import ml_collections
import numpy as np

from laplax.convert import common, support
from laplax.convert.support import ANY, Rule

CONFIG_FILE = common.HF_CONFIG_FILE
SAFETENSORS_FILE = common.HF_SAFETENSORS_FILE
TORCH_FILE = common.HF_TORCH_FILE
TOKENIZER_FILE = common.HF_TOKENIZER_FILE
#: What the refusals ask for.
DIRECTORY = "a BertForMaskedLM.save_pretrained directory"
TARGET = "Hugging Face BERT"
#: The model options ``BertForMaskedLM`` expresses (:mod:`laplax.convert.support`;
#: any other option only at its default): BERT's post-norm blocks with biases,
#: learned positions, token types, the embedding norm, the MLM transform and
#: decoder bias, no final norm; GELU (either form), the norm eps.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "use_bias": (True,),
  "mlp_activation": ("gelu", "gelu_exact"),
  "norm_eps": ANY,
  "posemb": ("learn",),
  "type_vocab_size": Rule(lambda v, spec: v >= 1, "type_vocab_size >= 1"),
  "post_norm": (True,),
  "embed_norm": (True,),
  "final_norm": (False,),
  "mlm_transform": (True,),
  "decoder_bias": (True,),
}
# HF ``hidden_act`` -> laplax ``model.mlp_activation`` (HF's "gelu" is the erf form).
ACTIVATIONS_FROM_HF = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}
ACTIVATIONS_TO_HF = {"gelu_exact": "gelu", "gelu": "gelu_new"}
# Tensors of some checkpoints that are not parameters, or tied copies.
_IGNORED = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight")
_TIED_BIAS = "cls.predictions.decoder.bias"
ConvertError = common.ConvertError
# laplax block parameter -> HF layer tensor (``weight`` transposed for kernels).
_LAYER = {
  "attention/query": "attention.self.query",
  "attention/key": "attention.self.key",
  "attention/value": "attention.self.value",
  "attention/out": "attention.output.dense",
  "norm1": "attention.output.LayerNorm",
  "mlp/fc1": "intermediate.dense",
  "mlp/fc2": "output.dense",
  "norm2": "output.LayerNorm",
}
_TOP = {
  "embed_norm": "bert.embeddings.LayerNorm",
  "mlm_dense": "cls.predictions.transform.dense",
  "mlm_norm": "cls.predictions.transform.LayerNorm",
}
_NORMS = ("norm1", "norm2", "embed_norm", "mlm_norm")


def _pairs(depth: int):
  """``(laplax module, HF module, is_norm)`` of every dense and LayerNorm."""
  for i in range(depth):
    for name, hf in _LAYER.items():
      yield f"block{i}/{name}", f"bert.encoder.layer.{i}.{hf}", name in _NORMS
  for name, hf in _TOP.items():
    yield name, hf, name in _NORMS


def hf_shapes(hf: Mapping) -> dict[str, tuple[int, ...]]:
  """``{state-dict name: shape}`` of the ``BertForMaskedLM`` parameters for
  the ``BertConfig`` dict ``hf`` (the tied decoder left out)."""
  d, v, f = hf["hidden_size"], hf["vocab_size"], hf["intermediate_size"]
  out = {
    "bert.embeddings.word_embeddings.weight": (v, d),
    "bert.embeddings.position_embeddings.weight": (hf["max_position_embeddings"], d),
    "bert.embeddings.token_type_embeddings.weight": (hf["type_vocab_size"], d),
    "cls.predictions.bias": (v,),
  }
  sizes = {"mlp/fc1": (f, d), "mlp/fc2": (d, f)}
  for name, module, is_norm in _pairs(hf["num_hidden_layers"]):
    short = name.split("/", 1)[-1] if name.startswith("block") else name
    out[module + ".weight"] = (d,) if is_norm else sizes.get(short, (d, d))
    out[module + ".bias"] = (sizes.get(short, (d, d))[0],) if not is_norm else (d,)
  return out


def hf_to_laplax(tensors: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """The laplax BERT parameters (flat ``{"block0/attention/query/kernel": ...}``)
  of ``BertForMaskedLM`` ``tensors`` (:func:`hf_shapes` names): dense
  weights transposed, LayerNorm ``weight`` -> ``scale``. float32."""
  t = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  out = {
    "token_embedding/embedding": t["bert.embeddings.word_embeddings.weight"],
    "pos_embedding": t["bert.embeddings.position_embeddings.weight"],
    "type_embedding/embedding": t["bert.embeddings.token_type_embeddings.weight"],
    "mlm_bias": t["cls.predictions.bias"],
  }
  for name, module, is_norm in _pairs(depth):
    weight = t[module + ".weight"]
    out[f"{name}/{'scale' if is_norm else 'kernel'}"] = weight if is_norm else weight.T
    out[f"{name}/bias"] = t[module + ".bias"]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def laplax_to_hf(flat_params: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """The inverse of :func:`hf_to_laplax`, named as ``BertForMaskedLM.state_dict()``
  (without the tied ``cls.predictions.decoder``). C-contiguous float32."""
  p = {k: np.asarray(v, np.float32) for k, v in flat_params.items()}
  out = {
    "bert.embeddings.word_embeddings.weight": p["token_embedding/embedding"],
    "bert.embeddings.position_embeddings.weight": p["pos_embedding"],
    "bert.embeddings.token_type_embeddings.weight": p["type_embedding/embedding"],
    "cls.predictions.bias": p["mlm_bias"],
  }
  for name, module, is_norm in _pairs(depth):
    value = p[f"{name}/{'scale' if is_norm else 'kernel'}"]
    out[module + ".weight"] = value if is_norm else value.T
    out[module + ".bias"] = p[f"{name}/bias"]
  return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def read_hf_config(model_dir: str) -> dict:
  """``model_dir/config.json``, checked to be a ``BertForMaskedLM`` laplax expresses.

  Raises:
    ConvertError: no such directory or file, not JSON, ``model_type`` not
      ``"bert"``, a missing size, an activation laplax lacks, relative
      position embeddings or a decoder / cross-attention configuration.
  """
  return read_hf_config_dict(*common.read_hf_config_json(model_dir, DIRECTORY))


def read_hf_config_dict(hf, path: str) -> dict:
  """``hf`` (the parsed ``config.json`` at ``path``), checked as :func:`read_hf_config` does.

  Raises:
    ConvertError: as :func:`read_hf_config`.
  """
  if hf.get("model_type") != "bert":
    raise ConvertError(
      f"{path}: model_type={hf.get('model_type')!r}; only 'bert' (BertForMaskedLM) converts"
    )
  for key in (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
  ):
    value = hf.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConvertError(f"{path}: {key}={value!r} must be a positive integer")
  act = hf.get("hidden_act", "gelu")
  if act not in ACTIVATIONS_FROM_HF:
    raise ConvertError(
      f"{path}: hidden_act={act!r} has no laplax equivalent; one of "
      f"{', '.join(ACTIVATIONS_FROM_HF)} converts"
    )
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConvertError(
      f"{path}: position_embedding_type={hf['position_embedding_type']!r} cannot be "
      f"converted; laplax's BERT has absolute (learned) positions only"
    )
  for key in ("is_decoder", "add_cross_attention"):
    if hf.get(key):
      raise ConvertError(f"{path}: {key}=true cannot be converted; laplax's BERT is an encoder")
  return hf


def check_hf_tensors(tensors: Mapping[str, np.ndarray], hf: Mapping, source: str) -> dict:
  """The parameters of ``BertForMaskedLM`` from a file's ``tensors``; the
  ``position_ids`` buffer and the tied decoder (equal to the word embeddings
  and ``cls.predictions.bias``) are left out.

  Raises:
    ConvertError: a missing or unexpected tensor, a wrong shape, or an
      untied decoder.
  """
  want = hf_shapes(hf)
  got = {k: v for k, v in tensors.items() if k not in _IGNORED and k != _TIED_BIAS}
  decoder = tensors.get("cls.predictions.decoder.weight")
  if decoder is not None and not np.array_equal(
    decoder, tensors.get("bert.embeddings.word_embeddings.weight")
  ):
    raise ConvertError(
      f"{source}: cls.predictions.decoder.weight is not the word embeddings; laplax's "
      f"BERT decodes with the tied embedding only"
    )
  for name, shape in want.items():
    if name not in got:
      raise ConvertError(f"{source} has no tensor {name}, which BertForMaskedLM needs")
    if tuple(got[name].shape) != shape:
      raise ConvertError(
        f"{source}: tensor {name} has shape {tuple(got[name].shape)}; config.json implies {shape}"
      )
  extra = sorted(set(got) - set(want))
  if extra:
    raise ConvertError(f"{source} has tensor {extra[0]}, which BertForMaskedLM has not")
  return got


def laplax_config(hf: Mapping, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` (an ``mlm`` config: data and training settings,
  Laplacian and spectral keys) with the model keys of the ``BertConfig`` dict
  ``hf``: the original BERT's options and sizes, ``data.vocab_size``.

  Raises:
    ConvertError: not an ``mlm`` config, or the result does not validate.
  """

  if config.get("task") != "mlm":
    raise ConvertError(
      f"--config has task={config.get('task')!r}; BERT needs a masked-LM config, "
      f"e.g. configs/bert_cramming.py"
    )
  config = copy.deepcopy(config)
  with config.unlocked():
    m = config.model
    m.update(
      name="bert",
      width=hf["hidden_size"],
      depth=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"],
      mlp_dim=hf["intermediate_size"],
      max_length=hf["max_position_embeddings"],
      type_vocab_size=hf["type_vocab_size"],
      posemb="learn",
      post_norm=True,
      embed_norm=True,
      final_norm=False,
      mlm_transform=True,
      decoder_bias=True,
      use_bias=True,
      norm="layernorm",
      norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
      mlp_activation=ACTIVATIONS_FROM_HF[hf.get("hidden_act", "gelu")],
      qk_norm=False,
      qk_scale=1.0,
      layerscale_init=None,
    )
    config.data.vocab_size = hf["vocab_size"]
  return common.validate_converted(config)


def convert_from_hf(model_dir: str, config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes a new laplax workdir (``mlm`` task, step 0) from a
  ``BertForMaskedLM.save_pretrained`` directory (``model.safetensors`` or
  ``pytorch_model.bin``; ``tokenizer.json`` copied when there). The
  Laplacian and spectral keys of ``config`` are kept; without them the laplax
  model computes HF's MLM logits (float32, to rounding).

  Raises:
    ConvertError: ``workdir`` exists, a missing or unreadable file, a config
      key or tensor laplax cannot express.
  """
  from laplax.models import spec as spec_lib

  common.new_path(workdir, "--workdir")
  hf = read_hf_config(model_dir)
  config = laplax_config(hf, config)
  spec = spec_lib.from_config(config.model)
  common.refuse_unsupported(
    spec, SUPPORT, TARGET, "the converted model would not compute BERT's logits", skip_source=True
  )
  tensors, source = common.read_hf_tensors(model_dir, DIRECTORY)
  flat = hf_to_laplax(check_hf_tensors(tensors, hf, source), spec.depth)
  common.write_hf_workdir(workdir, config, spec, flat, model_dir, hf["vocab_size"], source)


def hf_config(spec, vocab_size: int) -> dict:
  """The ``BertConfig`` dict (``config.json``) of a laplax BERT spec."""
  return {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "vocab_size": int(vocab_size),
    "hidden_size": spec.width,
    "num_hidden_layers": spec.depth,
    "num_attention_heads": spec.num_heads,
    "intermediate_size": spec.mlp_dim,
    "hidden_act": ACTIVATIONS_TO_HF[spec.mlp_activation],
    "max_position_embeddings": spec.max_length,
    "type_vocab_size": spec.type_vocab_size,
    "layer_norm_eps": spec.norm_eps,
    "hidden_dropout_prob": spec.dropout,
    "attention_probs_dropout_prob": spec.attention.attention_dropout,
    "initializer_range": 0.02,
    "position_embedding_type": "absolute",
    "pad_token_id": 0,
    "tie_word_embeddings": True,
    "dtype": "float32",
  }


def convert_to_hf(workdir: str, out_dir: str, force: bool = False) -> str | None:
  """Writes a laplax BERT workdir as a ``BertForMaskedLM.save_pretrained``
  directory (``config.json``, ``model.safetensors``, the workdir's
  ``tokenizer.json``). A model with Laplacian heads or spectral conditioning
  is refused unless ``force`` (then ``W`` without the correction is written).

  Returns:
    ``None``, or with ``force`` what the target code must change.

  Raises:
    ConvertError: not a laplax BERT workdir, an option BERT lacks (the
      cramming architecture's), a Laplacian / spectral model without
      ``force``, or an existing ``out_dir``.
  """
  out_abs = common.new_path(out_dir, "--out")
  config, spec, params, _ = common.read_workdir(workdir)
  if config.model.get("name") != "bert":
    raise ConvertError(
      f"{workdir} is a {config.get('task')} run of model {config.model.get('name')!r}; "
      f"--to hf-bert needs a BERT"
    )
  common.refuse_unsupported(spec, SUPPORT, TARGET, "this workdir cannot be written as BERT")
  note = common.refuse_laplax_only(spec, TARGET, force)
  flat = common.flat(params)
  if any(k.endswith("laplacian_mix") for k in flat):
    raise ConvertError("a learned Laplacian mix has no place in BertForMaskedLM's tensors")
  tensors = laplax_to_hf(flat, spec.depth)
  vocab_size = int(np.shape(flat["token_embedding/embedding"])[0])
  tokenizer = common.workdir_file(workdir, TOKENIZER_FILE)
  files = {TOKENIZER_FILE: tokenizer} if tokenizer else {}
  common.write_hf_directory(out_abs, hf_config(spec, vocab_size), tensors, files)
  return note
