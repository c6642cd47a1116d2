"""Hugging Face ``transformers`` GPT-2 <-> laplax GPT.

GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners") is the pre-LN decoder laplax's :class:`~laplax.models.gpt.GPT`
implements: learned positions, LayerNorm (``layer_norm_epsilon``), the tanh
GELU (HF ``gelu_new``), biases everywhere, tied embeddings. The
``save_pretrained`` directory of ``GPT2LMHeadModel`` holds ``config.json``
(a ``GPT2Config``) and ``model.safetensors``, whose tensors are named
``[transformer.]wte.weight [V, D]``, ``wpe.weight [P, D]``,
``h.{i}.ln_1.{weight,bias} [D]``, ``h.{i}.attn.c_attn.{weight [D, 3D], bias [3D]}``
(queries, keys, values side by side), ``h.{i}.attn.c_proj.{weight [D, D], bias}``,
``h.{i}.ln_2``, ``h.{i}.mlp.c_fc.{weight [D, F], bias [F]}``,
``h.{i}.mlp.c_proj.{weight [F, D], bias [D]}``, ``ln_f`` and, untied only,
``lm_head.weight [V, D]``. HF's ``Conv1D`` stores ``weight [in, out]`` (``y =
x W + b``), which is the layout of laplax's kernels, so only ``c_attn`` is
split and ``lm_head`` transposed; no value is changed, and a round trip is
bitwise.

:func:`convert_from_hf` reads such a directory (plain JSON and
``safetensors.numpy``; ``torch`` only for a ``pytorch_model.bin``) into a new
laplax workdir, and :func:`convert_to_hf` writes a laplax GPT workdir as such a
directory, loadable with ``GPT2LMHeadModel.from_pretrained``. The
activations map as ``gelu_new`` / ``gelu_pytorch_tanh`` <-> ``"gelu"`` (the
tanh approximation), ``gelu`` <-> ``"gelu_exact"`` (erf) and ``relu2`` <->
``"relu2"``. A ``tokenizer.json`` (HF ``tokenizers`` format, what laplax's BPE
tokenizer reads from ``WORKDIR/tokenizer.json``) is copied either way.
Errors are :class:`~laplax.convert.common.ConvertError` with one line naming
the key, tensor or file; nothing is written then.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import ml_collections
import numpy as np

from laplax.convert import common, support
from laplax.convert.support import ANY

CONFIG_FILE = common.HF_CONFIG_FILE
SAFETENSORS_FILE = common.HF_SAFETENSORS_FILE
SAFETENSORS_INDEX = common.HF_SAFETENSORS_INDEX
TORCH_FILE = common.HF_TORCH_FILE
TOKENIZER_FILE = common.HF_TOKENIZER_FILE
#: What the refusals ask for.
DIRECTORY = "a GPT2LMHeadModel.save_pretrained directory"
TARGET = "Hugging Face GPT-2"
#: The model options GPT-2 expresses (:mod:`laplax.convert.support`; any other
#: option only at its default): its activations, the norm eps, untied embeddings.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "mlp_activation": support.PLAIN_ACTIVATIONS,
  "norm_eps": ANY,
  "tie_embeddings": ANY,
}
PREFIX = "transformer."
# HF ``activation_function`` -> laplax ``model.mlp_activation``; the inverse
# writes the first HF name of each.
ACTIVATIONS_FROM_HF = {
  "gelu_new": "gelu",
  "gelu_pytorch_tanh": "gelu",
  "gelu": "gelu_exact",
  "relu2": "relu2",
}
ACTIVATIONS_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu2": "relu2"}
# GPT2Config keys whose non-default value laplax's attention cannot express:
# key -> (the value laplax needs, why).
_REFUSED = {
  "scale_attn_weights": (True, "laplax always divides QK^T by sqrt(head_dim)"),
  "scale_attn_by_inverse_layer_idx": (
    False,
    "laplax does not scale the attention of layer i by 1/(i+1)",
  ),
  "reorder_and_upcast_attn": (False, "laplax has no reordered, upcast attention"),
  "add_cross_attention": (False, "laplax's GPT is decoder-only, without cross-attention"),
}
# Buffers some GPT-2 checkpoints carry (the causal mask): not parameters.
_BUFFERS = ("attn.bias", "attn.masked_bias")
ConvertError = common.ConvertError


# --------------------------------------------------------------------------- names


def hf_shapes(hf: Mapping) -> dict[str, tuple[int, ...]]:
  """``{tensor name without "transformer.": shape}`` of ``GPT2LMHeadModel`` with
  the sizes of the ``GPT2Config`` dict ``hf`` (``lm_head.weight`` only when
  untied): the tensors :func:`convert_from_hf` needs, exactly."""
  d, v, p = hf["n_embd"], hf["vocab_size"], hf["n_positions"]
  f = hf.get("n_inner") or 4 * d
  out = {"wte.weight": (v, d), "wpe.weight": (p, d)}
  for i in range(hf["n_layer"]):
    h = f"h.{i}."
    out.update(
      {
        h + "ln_1.weight": (d,),
        h + "ln_1.bias": (d,),
        h + "attn.c_attn.weight": (d, 3 * d),
        h + "attn.c_attn.bias": (3 * d,),
        h + "attn.c_proj.weight": (d, d),
        h + "attn.c_proj.bias": (d,),
        h + "ln_2.weight": (d,),
        h + "ln_2.bias": (d,),
        h + "mlp.c_fc.weight": (d, f),
        h + "mlp.c_fc.bias": (f,),
        h + "mlp.c_proj.weight": (f, d),
        h + "mlp.c_proj.bias": (d,),
      }
    )
  out["ln_f.weight"], out["ln_f.bias"] = (d,), (d,)
  if not hf.get("tie_word_embeddings", True):
    out["lm_head.weight"] = (v, d)
  return out


def _state_dict_name(name: str) -> str:
  """The ``GPT2LMHeadModel.state_dict()`` name of a :func:`hf_shapes` name."""
  return name if name.startswith("lm_head.") else PREFIX + name


def hf_to_laplax(
  tensors: Mapping[str, np.ndarray], depth: int, tied: bool
) -> dict[str, np.ndarray]:
  """The laplax GPT parameters (flat ``{"block0/attention/query/kernel": ...}``,
  per-layer layout) of GPT-2 ``tensors`` named as :func:`hf_shapes` names them.

  ``c_attn`` ``[D, 3D]`` is split into the ``query``/``key``/``value`` kernels
  ``[D, D]`` (and its bias ``[3D]`` into three ``[D]``); ``lm_head.weight [V,
  D]`` becomes ``lm_head/kernel [D, V]`` (untied); everything else keeps its
  layout. Leaves are float32 (C-contiguous copies).
  """
  t = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
  out = {
    "token_embedding/embedding": t["wte.weight"],
    "pos_embedding": t["wpe.weight"],
    "final_norm/scale": t["ln_f.weight"],
    "final_norm/bias": t["ln_f.bias"],
  }
  for i in range(depth):
    h, b = f"h.{i}.", f"block{i}/"
    out[b + "norm1/scale"], out[b + "norm1/bias"] = t[h + "ln_1.weight"], t[h + "ln_1.bias"]
    out[b + "norm2/scale"], out[b + "norm2/bias"] = t[h + "ln_2.weight"], t[h + "ln_2.bias"]
    out.update(
      common.split_qkv(t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"], b + "attention")
    )
    for laplax_name, hf_name in (
      ("attention/out", "attn.c_proj"),
      ("mlp/fc1", "mlp.c_fc"),
      ("mlp/fc2", "mlp.c_proj"),
    ):
      out[f"{b}{laplax_name}/kernel"] = t[f"{h}{hf_name}.weight"]
      out[f"{b}{laplax_name}/bias"] = t[f"{h}{hf_name}.bias"]
  if not tied:
    out["lm_head/kernel"] = np.ascontiguousarray(t["lm_head.weight"].T)
  return out


def laplax_to_hf(
  flat_params: Mapping[str, np.ndarray], depth: int, tied: bool
) -> dict[str, np.ndarray]:
  """The inverse of :func:`hf_to_laplax`, named as ``GPT2LMHeadModel.state_dict()``
  (``transformer.`` prefix; no ``lm_head.weight`` when tied: HF ties it to
  ``wte``). Leaves are C-contiguous float32."""
  p = {k: np.asarray(v, np.float32) for k, v in flat_params.items()}
  out = {
    "wte.weight": p["token_embedding/embedding"],
    "wpe.weight": p["pos_embedding"],
    "ln_f.weight": p["final_norm/scale"],
    "ln_f.bias": p["final_norm/bias"],
  }
  for i in range(depth):
    h, b = f"h.{i}.", f"block{i}/"
    out[h + "ln_1.weight"], out[h + "ln_1.bias"] = p[b + "norm1/scale"], p[b + "norm1/bias"]
    out[h + "ln_2.weight"], out[h + "ln_2.bias"] = p[b + "norm2/scale"], p[b + "norm2/bias"]
    out[h + "attn.c_attn.weight"], out[h + "attn.c_attn.bias"] = common.fuse_qkv(p, b + "attention")
    for laplax_name, hf_name in (
      ("attention/out", "attn.c_proj"),
      ("mlp/fc1", "mlp.c_fc"),
      ("mlp/fc2", "mlp.c_proj"),
    ):
      out[f"{h}{hf_name}.weight"] = p[f"{b}{laplax_name}/kernel"]
      out[f"{h}{hf_name}.bias"] = p[f"{b}{laplax_name}/bias"]
  if not tied:
    out["lm_head.weight"] = p["lm_head/kernel"].T
  return {_state_dict_name(k): np.ascontiguousarray(v, np.float32) for k, v in out.items()}


# --------------------------------------------------------------------------- reading


def read_hf_config(model_dir: str) -> dict:
  """``model_dir/config.json`` as a dict, checked to be a GPT-2 laplax can express.

  Raises:
    ConvertError: no such directory or file, not JSON, ``model_type`` not
      ``"gpt2"``, a missing or non-integer size, an ``activation_function``
      laplax lacks, or a key of :data:`_REFUSED` at a value laplax cannot run.
  """
  hf, path = common.read_hf_config_json(model_dir, DIRECTORY)
  if hf.get("model_type") != "gpt2":
    raise ConvertError(
      f"{path}: model_type={hf.get('model_type')!r}; only 'gpt2' (GPT2LMHeadModel) converts"
    )
  for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
    value = hf.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConvertError(f"{path}: {key}={value!r} must be a positive integer")
  inner = hf.get("n_inner")
  if inner is not None and (isinstance(inner, bool) or not isinstance(inner, int) or inner < 1):
    raise ConvertError(f"{path}: n_inner={inner!r} must be a positive integer or null")
  activation = hf.get("activation_function", "gelu_new")
  if activation not in ACTIVATIONS_FROM_HF:
    raise ConvertError(
      f"{path}: activation_function={activation!r} has no laplax "
      f"equivalent; the ones that convert are "
      f"{', '.join(ACTIVATIONS_FROM_HF)}"
    )
  for key, (value, why) in _REFUSED.items():
    if key in hf and bool(hf[key]) != value:
      raise ConvertError(
        f"{path}: {key}={hf[key]!r} cannot be converted ({why}); only {key}={value} can"
      )
  return hf


def check_hf_tensors(
  tensors: Mapping[str, np.ndarray], hf: Mapping, source: str
) -> dict[str, np.ndarray]:
  """The tensors of ``GPT2LMHeadModel`` (:func:`hf_shapes` names) from a file's
  ``tensors``, with or without the ``transformer.`` prefix.

  The causal-mask buffers ``h.{i}.attn.bias`` / ``attn.masked_bias`` are
  ignored; so is a tied ``lm_head.weight`` equal to ``wte.weight`` (old
  checkpoints store both).

  Raises:
    ConvertError: a missing tensor, one GPT-2 of these sizes has not, a
      shape that differs from what ``config.json`` implies, a non-float
      tensor, or a tied ``lm_head.weight`` that is not ``wte.weight``.
  """
  want = hf_shapes(hf)
  prefixed = any(k.startswith(PREFIX) for k in tensors)
  shown = lambda name: PREFIX + name if prefixed and not name.startswith("lm_head.") else name
  sizes = (
    f"n_layer={hf['n_layer']}, n_embd={hf['n_embd']}, vocab_size="
    f"{hf['vocab_size']}, n_positions={hf['n_positions']}"
  )
  got, original = {}, {}
  for name, value in tensors.items():
    short = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    if short.startswith("h.") and short.split(".", 2)[-1] in _BUFFERS:
      continue
    if short in got:
      raise ConvertError(
        f"{source} has tensor {short} twice (with and without the {PREFIX!r} prefix)"
      )
    got[short], original[short] = value, name
  tied = hf.get("tie_word_embeddings", True)
  if tied and "lm_head.weight" in got:
    head = got.pop("lm_head.weight")
    if "wte.weight" in got and not np.array_equal(head, got["wte.weight"]):
      raise ConvertError(
        f"{source}: lm_head.weight differs from {shown('wte.weight')} "
        f"but config.json has tie_word_embeddings=true; set it to "
        f"false to convert an untied head"
      )
  for name in want:
    if name not in got:
      raise ConvertError(
        f"{source} has no tensor {shown(name)}, which GPT-2 ({sizes}"
        f", tie_word_embeddings={tied}) needs"
      )
  for name, value in got.items():
    if name not in want:
      raise ConvertError(
        f"{source} has tensor {original[name]}, which GPT-2 "
        f"({sizes}, tie_word_embeddings={tied}) has not"
      )
    if tuple(value.shape) != want[name]:
      raise ConvertError(
        f"{source}: tensor {original[name]} has shape "
        f"{tuple(value.shape)}; config.json ({sizes}) implies {want[name]}"
      )
    if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
      raise ConvertError(f"{source}: tensor {original[name]} is {value.dtype}, not a float tensor")
  return got


# --------------------------------------------------------------------------- config


def laplax_config(hf: Mapping, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` (an lm config: data and training settings, Laplacian
  and spectral keys) with the model keys of the GPT2Config dict ``hf``:
  GPT family, sizes, learned positions, LayerNorm with ``layer_norm_epsilon``,
  biases, the activation, tying; no qk-norm, embedding norm or LayerScale;
  ``data.tokenizer="bpe"`` and ``data.vocab_size``. Dropout, dtype, remat and
  ``scan_layers`` stay the config's (training settings).

  Raises:
    ConvertError: ``config`` is not a language-model config, or the result
      does not validate (e.g. more Laplacian heads than ``n_head``).
  """
  from laplax import tasks

  if not tasks.is_language_model(config):
    raise ConvertError(
      f"--config has task={config.get('task')!r}; GPT-2 needs a "
      f"language-model config, e.g. configs/gpt2_124m.py"
    )
  config = copy.deepcopy(config)
  with config.unlocked():
    m = config.model
    m.name = "gpt"
    m.width, m.depth, m.num_heads = hf["n_embd"], hf["n_layer"], hf["n_head"]
    m.mlp_dim = hf.get("n_inner") or 4 * hf["n_embd"]
    m.max_length = hf["n_positions"]
    m.posemb = "learn"
    m.tie_embeddings = bool(hf.get("tie_word_embeddings", True))
    m.use_bias = True
    m.norm = "layernorm"
    m.norm_eps = float(hf.get("layer_norm_epsilon", 1e-5))
    m.mlp_activation = ACTIVATIONS_FROM_HF[hf.get("activation_function", "gelu_new")]
    m.qk_norm = False
    m.qk_scale = 1.0
    m.embed_norm = False
    m.layerscale_init = None
    config.data.tokenizer = "bpe"
    config.data.vocab_size = hf["vocab_size"]
  return common.validate_converted(config)


# --------------------------------------------------------------------------- API


def convert_from_hf(model_dir: str, config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes a new laplax workdir from a ``GPT2LMHeadModel.save_pretrained`` directory.

  Reads ``model_dir/config.json`` (plain JSON) and ``model.safetensors``
  (``safetensors.numpy``; or the shards of ``model.safetensors.index.json``,
  or ``pytorch_model.bin`` through ``torch.load(weights_only=True)``), maps
  the tensors to the laplax GPT's parameters (float32, layout of
  :func:`hf_to_laplax`; stacked when ``config.model.scan_layers``) and writes
  ``config.json`` and the step-0 checkpoint with
  :func:`~laplax.convert.common.write_workdir`, plus ``tokenizer.json`` when
  ``model_dir`` has one. The model keys come from ``config.json``
  (:func:`laplax_config`); the Laplacian and spectral keys of ``config`` are
  kept, so ``config.model.num_laplacian_heads=2`` gives a GPT-2 whose last
  two heads of every layer are Laplacian (a learned mix starts at that
  pattern). With ``num_laplacian_heads=0`` and no spectral conditioning the
  laplax model computes the HF model's logits (float32; to rounding).

  Args:
    model_dir: the HF directory.
    config: a laplax language-model config (data and training settings).
    workdir: the new laplax workdir (must not exist).

  Raises:
    ConvertError: ``workdir`` exists, the directory or a file is missing or
      unreadable, a config key laplax cannot express, a missing, unexpected
      or misshapen tensor, or a tokenizer whose size is not the model's.
  """
  from laplax import attention
  from laplax.models import spec as spec_lib

  common.new_path(workdir, "--workdir")
  hf = read_hf_config(model_dir)
  config = laplax_config(hf, config)
  spec = spec_lib.from_config(config.model)
  common.refuse_unsupported(
    spec,
    SUPPORT,
    TARGET,
    "the converted model would not compute GPT-2's logits; set it there",
    skip_source=True,
  )
  tensors, source = common.read_hf_tensors(model_dir, DIRECTORY)
  tensors = check_hf_tensors(tensors, hf, source)
  flat = hf_to_laplax(tensors, spec.depth, spec.tie_embeddings)
  if spec.attention.laplacian_mix == "learned":
    for i, row in enumerate(spec.laplacian_array):
      flat[f"block{i}/attention/laplacian_mix"] = attention.LAPLACIAN_MIX_INIT * (
        2.0 * row.astype(np.float32) - 1.0
      )
  common.write_hf_workdir(workdir, config, spec, flat, model_dir, hf["vocab_size"], source)


def hf_config(spec, vocab_size: int, eos_token_id: int | None = None) -> dict:
  """The ``GPT2Config`` dict (``config.json``) of a laplax GPT spec.

  Sizes, ``n_positions = max_length``, ``layer_norm_epsilon = norm_eps``,
  the activation's HF name, tying, and the dropout rates (``resid_pdrop`` and
  ``embd_pdrop`` = ``model.dropout``, ``attn_pdrop`` =
  ``model.attention_dropout``); ``bos_token_id`` / ``eos_token_id`` are
  ``eos_token_id`` (``None`` when the vocabulary has no end-of-text token).
  """
  return {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": int(vocab_size),
    "n_positions": spec.max_length,
    "n_embd": spec.width,
    "n_layer": spec.depth,
    "n_head": spec.num_heads,
    "n_inner": spec.mlp_dim,
    "activation_function": ACTIVATIONS_TO_HF[spec.mlp_activation],
    "layer_norm_epsilon": spec.norm_eps,
    "tie_word_embeddings": spec.tie_embeddings,
    "resid_pdrop": spec.dropout,
    "embd_pdrop": spec.dropout,
    "attn_pdrop": spec.attention.attention_dropout,
    "initializer_range": 0.02,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    "use_cache": True,
    "bos_token_id": eos_token_id,
    "eos_token_id": eos_token_id,
    "dtype": "float32",
  }


def _refuse_options(spec) -> None:
  """Raises :class:`ConvertError` for a GPT option HF GPT-2 has not: every
  option whose value :data:`SUPPORT` does not admit (:func:`~laplax.convert.common.refuse_unsupported`)."""
  common.refuse_unsupported(spec, SUPPORT, TARGET, "this workdir cannot be written as GPT-2")


def _eos_token_id(tokenizer_path: str | None) -> int | None:
  """The id of ``<|endoftext|>`` in a tokenizer file, else ``None``."""
  if tokenizer_path is None:
    return None
  import tokenizers

  try:
    return tokenizers.Tokenizer.from_file(tokenizer_path).token_to_id("<|endoftext|>")
  except Exception:
    return None


def convert_to_hf(workdir: str, out_dir: str, force: bool = False) -> str | None:
  """Writes a laplax GPT workdir as a ``GPT2LMHeadModel.save_pretrained`` directory.

  ``out_dir`` gets ``config.json`` (:func:`hf_config`), ``model.safetensors``
  (``safetensors.numpy.save_file``: C-contiguous float32 tensors named as
  ``GPT2LMHeadModel.state_dict()``, :func:`laplax_to_hf`, without a tied
  ``lm_head.weight``) and, when the workdir has one, ``tokenizer.json`` with
  a ``tokenizer_config.json`` that makes ``AutoTokenizer`` read it as it is.
  The newest checkpoint is written; everything goes to a temporary directory
  renamed at the end. A model with Laplacian heads or spectral conditioning
  is refused unless ``force`` (then the plain weights are written, ``W``
  without the spectral correction; a learned Laplacian mix is stored as
  ``transformer.h.{i}.attn.laplacian_mix [num_heads]``, a tensor that
  ``GPT2LMHeadModel.from_pretrained`` reports as unexpected and leaves out).

  Args:
    workdir: a laplax GPT workdir (``train.py`` or :func:`convert_from_hf`).
    out_dir: the new directory (must not exist).
    force: write a Laplacian / spectral model anyway.

  Returns:
    ``None``, or with ``force`` on such a model what the target code must
    change (:func:`~laplax.convert.common.refuse_laplax_only`).

  Raises:
    ConvertError: not a laplax GPT workdir, an option GPT-2 lacks (RMSNorm,
      an activation it has not, qk-norm or its scale, rotary, no biases,
      embedding norm, LayerScale), a Laplacian / spectral model without
      ``force``, or an existing ``out_dir``.
  """
  out_abs = common.new_path(out_dir, "--out")
  config, spec, params, _ = common.read_workdir(workdir)
  from laplax import tasks

  if not tasks.is_language_model(config) or config.model.get("name") != "gpt":
    raise ConvertError(
      f"{workdir} is a {config.get('task')} run of model "
      f"{config.model.get('name')!r}; --to hf-gpt2 needs a GPT "
      f"language model"
    )
  _refuse_options(spec)
  note = common.refuse_laplax_only(spec, TARGET, force)
  flat = common.flat(params)
  vocab_size = int(np.shape(flat["token_embedding/embedding"])[0])
  tensors = laplax_to_hf(flat, spec.depth, spec.tie_embeddings)
  mix = {
    f"{PREFIX}h.{i}.attn.laplacian_mix": np.ascontiguousarray(
      flat[f"block{i}/attention/laplacian_mix"], np.float32
    )
    for i in range(spec.depth)
    if f"block{i}/attention/laplacian_mix" in flat
  }
  if mix:
    tensors.update(mix)
    note += (
      "; the learned mix logits a (alpha = sigmoid(a)) are transformer.h.{i}.attn.laplacian_mix"
    )
  tokenizer = common.workdir_file(workdir, TOKENIZER_FILE)
  hf = hf_config(spec, vocab_size, _eos_token_id(tokenizer))
  files, json_files = {}, {}
  if tokenizer is not None:
    files[TOKENIZER_FILE] = tokenizer
    json_files["tokenizer_config.json"] = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "model_max_length": spec.max_length,
    }
  common.write_hf_directory(out_abs, hf, tensors, files, json_files)
  return note
