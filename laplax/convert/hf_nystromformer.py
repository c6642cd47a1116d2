"""Hugging Face ``transformers`` ``NystromformerForMaskedLM`` -> laplax BERT with Nystrom attention.

The Nystromformer (Xiong et al., AAAI 2021; ``transformers``'
``modeling_nystromformer.py``) is the original BERT
(:mod:`laplax.convert.hf_bert`: post-norm blocks, learned positions, token
types, the MLM head's transform, the tied decoder and its bias) whose
self-attention is Nystrom attention (``model.implementation = "nystrom"``:
``num_landmarks`` segment-mean landmarks, six steps of the iterative
pseudo-inverse from the ``original`` initialisation, HF's key-padding
masking, and the depthwise convolution of the values when
``conv_kernel_size`` is set). A ``save_pretrained`` directory holds
``config.json`` (``model_type: nystromformer``) and the tensors of
:mod:`~laplax.convert.hf_bert` under the prefix ``nystromformer.`` instead
of ``bert.``, plus ``encoder.layer.{i}.attention.self.conv.weight``
``[heads, 1, k, 1]`` (laplax's ``nystrom_conv [k, heads]``). Its position
table has ``max_position_embeddings + 2`` rows of which positions ``2 ..``
are used (``position_ids = arange + 2``): laplax keeps rows ``2:``.

HF's attention reshapes the sequence by ``config.segment_means_seq_len``, not
by the input's length: with fewer landmarks than that it computes Nystrom
attention only for inputs of exactly that length (the converted model takes
any length the landmarks divide), and with as many landmarks as that, the
exact softmax (laplax: whenever the landmarks equal the tokens).
The converted model keeps the first ``min(max_position_embeddings,
segment_means_seq_len)`` positions (:func:`positions_kept`): the public
checkpoints' tables are two rows longer than ``segment_means_seq_len`` (514
and 512), and only that length is one both models compute.

:func:`convert_from_hf` writes a new laplax workdir (an ``mlm`` task).
Errors are :class:`~laplax.convert.common.ConvertError` with one line.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from laplax.convert import common, hf_bert
from laplax.convert.support import ANY

TARGET = "Hugging Face Nystromformer"
#: The model options ``NystromformerForMaskedLM`` expresses
#: (:mod:`laplax.convert.support`; any other option only at its default):
#: BERT's (:data:`laplax.convert.hf_bert.SUPPORT`) and the Nystrom attention's
#: landmarks and convolution skip, with its six iterations of the original
#: pseudo-inverse and padded keys.
SUPPORT = {
  **hf_bert.SUPPORT,
  "num_landmarks": ANY,
  "pinv_iterations": (6,),
  "pinv_init": ("original",),
  "nystrom_padding": ("keys",),
  "conv_kernel_size": ANY,
}
PREFIX = "nystromformer."
#: Buffers of some checkpoints (not parameters).
_BUFFERS = ("nystromformer.embeddings.position_ids", "nystromformer.embeddings.token_type_ids")
_POSITIONS = "bert.embeddings.position_embeddings.weight"
POSITION_OFFSET = 2
ConvertError = common.ConvertError
#: What the refusals ask for.
DIRECTORY = "a NystromformerForMaskedLM.save_pretrained directory"


def read_hf_config(model_dir: str) -> dict:
  """``model_dir/config.json``, checked to be a ``NystromformerForMaskedLM`` laplax expresses.

  Raises:
    ConvertError: no such file, not JSON, ``model_type`` not
      ``"nystromformer"``, a missing size, landmarks not dividing
      ``segment_means_seq_len``, an even or non-positive ``conv_kernel_size``,
      ``inv_coeff_init_option`` set, or what :func:`hf_bert.read_hf_config` refuses.
  """
  hf, path = common.read_hf_config_json(model_dir, DIRECTORY)
  got = hf.get("model_type")
  if got != "nystromformer":
    raise ConvertError(
      f"{path}: model_type={got!r}; only 'nystromformer' (NystromformerForMaskedLM) converts here"
    )
  for key in ("num_landmarks", "segment_means_seq_len"):
    value = hf.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConvertError(f"{path}: {key}={value!r} must be a positive integer")
  if hf["segment_means_seq_len"] % hf["num_landmarks"]:
    raise ConvertError(
      f"{path}: num_landmarks={hf['num_landmarks']} does not divide "
      f"segment_means_seq_len={hf['segment_means_seq_len']}"
    )
  conv = hf.get("conv_kernel_size")
  if conv is not None and (isinstance(conv, bool) or not isinstance(conv, int) or conv < 1):
    raise ConvertError(f"{path}: conv_kernel_size={conv!r} must be a positive integer or null")
  if conv is not None and conv % 2 == 0:
    raise ConvertError(
      f"{path}: conv_kernel_size={conv} is even; HF's padding k // 2 then adds a token, "
      f"laplax's 'same' convolution needs an odd size"
    )
  if hf.get("inv_coeff_init_option"):
    raise ConvertError(
      f"{path}: inv_coeff_init_option={hf['inv_coeff_init_option']!r}; only the 'original' "
      f"initialisation of the pseudo-inverse converts"
    )
  bert = dict(hf, model_type="bert", type_vocab_size=hf.get("type_vocab_size", 2))
  return hf_bert.read_hf_config_dict(bert, path)


def positions_kept(hf: dict) -> int:
  """The number of positions the converted model keeps.

  Its ``model.max_length``: the smaller of ``max_position_embeddings`` and
  ``segment_means_seq_len``, the length at which HF's attention computes what
  laplax's does (module docstring).
  """
  return min(hf["max_position_embeddings"], hf["segment_means_seq_len"])


def to_bert_tensors(tensors: dict, hf: dict, source: str) -> tuple[dict, dict]:
  """``(BERT-named tensors, {layer: conv [heads, 1, k, 1]})`` of a
  ``NystromformerForMaskedLM`` state dict: the prefix renamed, the buffers
  dropped, of the position table ``positions_kept(hf)`` rows from row 2 on.

  Raises:
    ConvertError: a convolution weight missing, unexpected or of the wrong shape.
  """
  out, conv = {}, {}
  for name, value in tensors.items():
    if name in _BUFFERS:
      continue
    if name.endswith(".attention.self.conv.weight"):
      conv[int(name.split(".")[3])] = value
      continue
    out["bert." + name[len(PREFIX) :] if name.startswith(PREFIX) else name] = value
  if _POSITIONS in out:
    table = out[_POSITIONS]
    if table.shape[0] != hf["max_position_embeddings"] + POSITION_OFFSET:
      raise ConvertError(
        f"{source}: the position table has {table.shape[0]} rows; config.json's "
        f"max_position_embeddings={hf['max_position_embeddings']} needs "
        f"{hf['max_position_embeddings'] + POSITION_OFFSET}"
      )
    out[_POSITIONS] = table[POSITION_OFFSET : POSITION_OFFSET + positions_kept(hf)]
  k, heads = hf.get("conv_kernel_size"), hf["num_attention_heads"]
  for i in range(hf["num_hidden_layers"]):
    if k is None:
      if conv:
        raise ConvertError(f"{source} has a conv weight but config.json has conv_kernel_size=null")
      break
    if i not in conv:
      raise ConvertError(f"{source} has no nystromformer.encoder.layer.{i}.attention.self.conv")
    if tuple(conv[i].shape) != (heads, 1, k, 1):
      raise ConvertError(
        f"{source}: layer {i}'s conv weight has shape {tuple(conv[i].shape)}, not "
        f"{(heads, 1, k, 1)}"
      )
  return out, conv


def laplax_config(hf: dict, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """:func:`hf_bert.laplax_config` with Nystrom attention as the HF config
  sets it, on :func:`positions_kept` positions."""
  config = hf_bert.laplax_config(dict(hf, max_position_embeddings=positions_kept(hf)), config)
  with config.unlocked():
    config.model.update(
      implementation="nystrom",
      num_landmarks=hf["num_landmarks"],
      pinv_iterations=6,
      pinv_init="original",
      nystrom_padding="keys",
      conv_kernel_size=hf.get("conv_kernel_size"),
      attention_dropout=0.0,
    )
  return common.validate_converted(config)


def convert_from_hf(model_dir: str, config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes a new laplax workdir (``mlm`` task, step 0) from a
  ``NystromformerForMaskedLM.save_pretrained`` directory; the Laplacian and
  spectral keys of ``config`` are kept (without them the laplax model
  computes HF's MLM logits, module docstring).

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
    spec,
    SUPPORT,
    TARGET,
    "the converted model would not compute the Nystromformer's logits",
    skip_source=True,
  )
  tensors, source = common.read_hf_tensors(model_dir, DIRECTORY)
  bert_tensors, conv = to_bert_tensors(dict(tensors), hf, source)
  kept = dict(hf, max_position_embeddings=positions_kept(hf))
  flat = hf_bert.hf_to_laplax(hf_bert.check_hf_tensors(bert_tensors, kept, source), spec.depth)
  for i, weight in conv.items():
    flat[f"block{i}/attention/nystrom_conv"] = np.ascontiguousarray(
      np.asarray(weight, np.float32)[:, 0, :, 0].T
    )
  common.write_hf_workdir(workdir, config, spec, flat, model_dir, hf["vocab_size"], source)
