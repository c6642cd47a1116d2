"""nanochat checkpoints <-> laplax GPT workdirs.

nanochat (``karpathy/nanochat``; the Laplacian authors' fork
``yuchongzhang/nanochat``) saves a base model as a directory
``base_checkpoints/d20/`` with ``model_<step:06d>.pt`` (``torch.save`` of the
``GPT.state_dict()``) and ``meta_<step:06d>.json`` (``{"step", "model_config":
{sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd[,
laplacian_heads]}, ...}``); its tokenizer is ``tokenizer/tokenizer.pkl`` under
the same base directory (a pickled ``tiktoken.Encoding``). The state dict
(nanochat/gpt.py of the first release, 3a5e0bc) is PyTorch's ``[out, in]``
``nn.Linear`` weights without biases::

    transformer.wte.weight            [V, d]   (bfloat16)
    transformer.h.{i}.attn.c_q.weight [d, d]   (c_proj alike)
    transformer.h.{i}.attn.c_k.weight [n_kv_head * hd, d]   (c_v alike)
    transformer.h.{i}.mlp.c_fc.weight [4d, d]
    transformer.h.{i}.mlp.c_proj.weight [d, 4d]
    lm_head.weight                    [V, d]

Each maps to the transposed laplax kernel (``block{i}/attention/query/kernel
[d, d]``, ``mlp/fc1``, ``mlp/fc2``, ``attention/out``, ``lm_head/kernel [d,
V]``) and ``wte`` to ``token_embedding/embedding`` as it is: no value changes,
so laplax -> nanochat -> laplax is bitwise. ``hd = d / n_head``; fewer
key/value heads than query heads (``n_kv_head`` dividing ``n_head``,
grouped-query attention, nanochat's ``repeat_kv``) become the GPT's
``model.num_kv_heads``. The model keys come from
``model_config`` plus :func:`laplax.config.defaults.nanochat_options` (the
forward nanochat computes); the Laplacian heads are the authors'
``laplacian_heads`` (an int, or one count per layer: the last ``k`` heads of
a layer), written back the same way (an int when every layer has the same
count; omitted when there are none, so nanochat's first release loads it).

The Laplacian authors' fork (``yuchongzhang/nanochat`` 1f70b557) writes the
same two files with more ``model_config`` keys (``use_ve``,
``use_resid_lambdas``, ``use_x0``, ``use_smear``, ``use_backout``,
``window_pattern``, ``laplacian_heads`` as a list; a checkpoint that lacks
some gets the fork's patch for older files, ``window_pattern="L"`` and every
``use_*`` True) and more tensors (its nanochat/gpt.py): the vocabulary padded
to a multiple of 64 in ``wte``, ``lm_head`` and ``value_embeds.{i}.weight
[Vpad, n_kv_head * hd]`` (layers with a value embedding), ``transformer.h.{i}.attn.
ve_gate.weight [n_kv_head, 12]``, ``resid_lambdas [L]``, ``x0_lambdas [L]``,
``smear_gate.weight [1, 24]``, ``smear_lambda [1]``, ``backout_lambda [1]``.
They map to :func:`laplax.config.defaults.nanochat_fork_model` with the
switches of ``model_config`` (``value_embed{i}/embedding``,
``block{i}/attention/ve_gate/kernel [12, n_kv_head]``, ``smear_gate/kernel [24,
1]``, the scalars by their names), values unchanged; ``--to nanochat`` of
such a model writes the fork's files (all 13 ``model_config`` keys).

Files from elsewhere are untrusted: the state dict is read with
``torch.load(weights_only=True)``, and ``tokenizer.pkl`` with
:func:`laplax.data.text.nanochat_tokenizer.read_tokenizer_pkl`, an unpickler that
admits only what a tiktoken ``Encoding`` is made of and builds an inert
record of it, so a pickle that asks for anything else is refused in one line
and runs no code. The tokenizer is the training pipeline's
:class:`~laplax.data.text.nanochat_tokenizer.NanochatTokenizer` (the 256 bytes,
the merges, nanochat's nine special tokens); the workdir keeps it as
:data:`TOKENIZER_FILE` (laplax's JSON, :meth:`NanochatTokenizer.save`), where
``train.py`` and ``eval.py`` read it, and ``--to nanochat`` writes it back
as nanochat's pickle (:meth:`NanochatTokenizer.save_nanochat`).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping

import ml_collections
import numpy as np

from laplax import store
from laplax.convert import common, support
from laplax.convert.support import ANY, Rule
from laplax.data.errors import DataError
from laplax.data.text.nanochat_tokenizer import PICKLE_FILE, TOKENIZER_FILE, NanochatTokenizer

ConvertError = common.ConvertError
TARGET = "nanochat"
#: The model options nanochat's GPT expresses (:mod:`laplax.convert.support`;
#: any other option only at its default): its recipe (a parameter-free
#: RMSNorm qk-norm, nanochat's rotary form, no biases, RMSNorm, ReLU^2, untied
#: embeddings, the embedding norm, the logit softcap 15, an MLP of 4 * width),
#: the later releases' and the Laplacian authors' fork's switches, grouped-query
#: attention and the Laplacian heads (the fork's, no ``--force``).
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  "mlp_dim": Rule(lambda v, spec: v == 4 * spec.width, "4 * width"),
  "num_kv_heads": ANY,
  "laplacian_mask": ANY,
  "qk_norm": (True,),
  "qk_norm_type": ("rmsnorm",),
  "qk_scale": ANY,
  "rope_theta": ANY,
  "rope_style": ("nanochat",),
  "posemb": ("rope",),
  "use_bias": (False,),
  "norm": ("rmsnorm",),
  "mlp_activation": ("relu2",),
  "norm_eps": ANY,
  "tie_embeddings": (False,),
  "embed_norm": (True,),
  "logit_softcap": (15.0,),
  "embedding_dtype": ANY,
  "value_embeds": ANY,
  "resid_lambdas": ANY,
  "x0_lambdas": ANY,
  "smear": ANY,
  "backout": ANY,
  "window_pattern": ANY,
  "vocab_multiple": ANY,
}
PREFIX = "transformer."
# What torch.compile prepends to the names of a compiled model's state dict.
COMPILED_PREFIX = "_orig_mod."
MODEL_CONFIG_KEYS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
# The fork's model_config switches -> laplax model keys, and what the fork
# patches into a checkpoint that lacks them (checkpoint_manager.py).
FORK_SWITCHES = {
  "use_ve": "value_embeds",
  "use_resid_lambdas": "resid_lambdas",
  "use_x0": "x0_lambdas",
  "use_smear": "smear",
  "use_backout": "backout",
}
FORK_KEYS = (*FORK_SWITCHES, "window_pattern")
FORK_DEFAULTS = {**{k: True for k in FORK_SWITCHES}, "window_pattern": "L"}
# The fork pads the vocabulary of wte, lm_head and the value embeddings to this.
FORK_VOCAB_MULTIPLE = 64
# The fork's per-model scalars: laplax name -> state-dict name.
FORK_SCALARS = {
  "resid_lambdas": "resid_lambdas",
  "x0_lambdas": "x0_lambdas",
  "smear_lambda": "smear_lambda",
  "backout_lambda": "backout_lambda",
}
# laplax names of one block's kernels -> nanochat's ``transformer.h.{i}.`` names.
BLOCK_TENSORS = {
  "attention/query": "attn.c_q",
  "attention/key": "attn.c_k",
  "attention/value": "attn.c_v",
  "attention/out": "attn.c_proj",
  "mlp/fc1": "mlp.c_fc",
  "mlp/fc2": "mlp.c_proj",
}
# --------------------------------------------------------------------------- tokenizer


def find_tokenizer(model_dir: str, given: str | None) -> str | None:
  """The tokenizer to convert: ``given`` (a ``tokenizer.pkl``, a directory
  holding one, or a :data:`TOKENIZER_FILE`), else ``tokenizer.pkl`` in
  ``model_dir``, ``model_dir/tokenizer/`` or nanochat's layout
  ``BASE/tokenizer/`` for ``model_dir = BASE/base_checkpoints/d20``; ``None``
  when there is none.

  Raises:
    ConvertError: ``given`` that is none of those.
  """
  if given:
    for path in (given, os.path.join(given, PICKLE_FILE), os.path.join(given, TOKENIZER_FILE)):
      if os.path.isfile(path):
        return path
    raise ConvertError(
      f"--tokenizer {given} is not a {PICKLE_FILE}, a {TOKENIZER_FILE} or a directory holding one"
    )
  base = os.path.dirname(os.path.dirname(os.path.abspath(model_dir)))
  for path in (
    os.path.join(model_dir, PICKLE_FILE),
    os.path.join(model_dir, "tokenizer", PICKLE_FILE),
    os.path.join(base, "tokenizer", PICKLE_FILE),
  ):
    if os.path.isfile(path):
      return path
  return None


def read_tokenizer(path: str, vocab_size: int | None = None) -> NanochatTokenizer:
  """The :class:`NanochatTokenizer` of ``path`` (a ``tokenizer.pkl``, read
  without running it, or a :data:`TOKENIZER_FILE`), of ``vocab_size`` ids
  when given.

  Raises:
    ConvertError: the :class:`~laplax.data.errors.DataError` of
      :meth:`NanochatTokenizer.from_path` (unreadable, a refused pickle naming
      what it asked for, not nanochat's vocabulary layout), or another size.
  """
  try:
    tok = NanochatTokenizer.from_path(path)
  except DataError as e:  # one line; named here when the message does not name it
    raise ConvertError(str(e) if path in str(e) else f"{path}: {e}") from None
  if vocab_size is not None and tok.vocab_size != vocab_size:
    raise ConvertError(
      f"{path} has {tok.vocab_size} tokens but the model's vocab_size is "
      f"{vocab_size}; give the model's own tokenizer (--tokenizer)"
    )
  return tok


# --------------------------------------------------------------------------- weights


def is_fork(mc: Mapping) -> bool:
  """Whether ``model_config`` is the fork's (it has one of :data:`FORK_KEYS`)."""
  return any(k in mc for k in FORK_KEYS)


def has_value_embed(mc: Mapping, i: int) -> bool:
  """The fork's ``has_ve``: alternating layers, the last one included."""
  return bool(mc.get("use_ve")) and i % 2 == (mc["n_layer"] - 1) % 2


def nanochat_shapes(mc: Mapping) -> dict[str, tuple[int, ...]]:
  """``{state_dict name: shape}`` of nanochat's GPT with ``model_config`` ``mc``
  (the fork's, padded vocabulary and extra tensors, when :func:`is_fork`)."""
  d, v, depth = mc["n_embd"], mc["vocab_size"], mc["n_layer"]
  kv = mc["n_kv_head"] * (d // mc["n_head"])  # the key/value heads' columns
  fork = is_fork(mc)
  if fork:
    v = -(-v // FORK_VOCAB_MULTIPLE) * FORK_VOCAB_MULTIPLE
  out = {PREFIX + "wte.weight": (v, d)}
  for i in range(depth):
    h = f"{PREFIX}h.{i}."
    for name, rows in (("c_q", d), ("c_k", kv), ("c_v", kv), ("c_proj", d)):
      out[f"{h}attn.{name}.weight"] = (rows, d)
    if has_value_embed(mc, i):
      out[f"{h}attn.ve_gate.weight"] = (mc["n_kv_head"], 12)
    out[f"{h}mlp.c_fc.weight"], out[f"{h}mlp.c_proj.weight"] = (4 * d, d), (d, 4 * d)
  out["lm_head.weight"] = (v, d)
  if fork:
    for i in range(depth):
      if has_value_embed(mc, i):
        out[f"value_embeds.{i}.weight"] = (v, kv)
    if mc.get("use_resid_lambdas"):
      out["resid_lambdas"] = (depth,)
    if mc.get("use_x0"):
      out["x0_lambdas"] = (depth,)
    if mc.get("use_smear"):
      out["smear_gate.weight"], out["smear_lambda"] = (1, 24), (1,)
    if mc.get("use_backout"):
      out["backout_lambda"] = (1,)
  return out


def nanochat_to_laplax(tensors: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """Flat laplax GPT parameters of nanochat ``tensors`` (:func:`nanochat_shapes`
  names): every ``[out, in]`` weight transposed to an ``[in, out]`` kernel
  (C-contiguous, dtype kept), ``wte`` as it is."""
  t = lambda name: np.ascontiguousarray(tensors[name].T)
  out = {
    "token_embedding/embedding": np.ascontiguousarray(tensors[PREFIX + "wte.weight"]),
    "lm_head/kernel": t("lm_head.weight"),
  }
  for i in range(depth):
    for ours, theirs in BLOCK_TENSORS.items():
      out[f"block{i}/{ours}/kernel"] = t(f"{PREFIX}h.{i}.{theirs}.weight")
    if f"{PREFIX}h.{i}.attn.ve_gate.weight" in tensors:
      out[f"block{i}/attention/ve_gate/kernel"] = t(f"{PREFIX}h.{i}.attn.ve_gate.weight")
    if f"value_embeds.{i}.weight" in tensors:
      out[f"value_embed{i}/embedding"] = np.ascontiguousarray(tensors[f"value_embeds.{i}.weight"])
  for ours, theirs in FORK_SCALARS.items():
    if theirs in tensors:
      out[ours] = np.ascontiguousarray(tensors[theirs])
  if "smear_gate.weight" in tensors:
    out["smear_gate/kernel"] = t("smear_gate.weight")
  return out


def laplax_to_nanochat(flat: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """The inverse of :func:`nanochat_to_laplax` (names of ``GPT.state_dict()``)."""
  t = lambda name: np.ascontiguousarray(np.asarray(flat[name]).T)
  out = {
    PREFIX + "wte.weight": np.ascontiguousarray(flat["token_embedding/embedding"]),
    "lm_head.weight": t("lm_head/kernel"),
  }
  for i in range(depth):
    for ours, theirs in BLOCK_TENSORS.items():
      out[f"{PREFIX}h.{i}.{theirs}.weight"] = t(f"block{i}/{ours}/kernel")
    if f"block{i}/attention/ve_gate/kernel" in flat:
      out[f"{PREFIX}h.{i}.attn.ve_gate.weight"] = t(f"block{i}/attention/ve_gate/kernel")
    if f"value_embed{i}/embedding" in flat:
      out[f"value_embeds.{i}.weight"] = np.ascontiguousarray(flat[f"value_embed{i}/embedding"])
  for ours, theirs in FORK_SCALARS.items():
    if ours in flat:
      out[theirs] = np.ascontiguousarray(flat[ours])
  if "smear_gate/kernel" in flat:
    out["smear_gate.weight"] = t("smear_gate/kernel")
  return out


def _step_files(model_dir: str, step: int | None) -> tuple[str, str, int]:
  """``(model_<step>.pt, meta_<step>.json, step)``: ``step``, or the largest there.

  Raises:
    ConvertError: no such directory, no checkpoint, or no files of ``step``.
  """
  if not os.path.isdir(model_dir):
    raise ConvertError(
      f"--model {model_dir} is not a directory; give nanochat's checkpoint "
      f"directory, e.g. ~/.cache/nanochat/base_checkpoints/d20"
    )
  steps = sorted(
    int(m.group(1))
    for f in glob.glob(os.path.join(model_dir, "model_*.pt"))
    for m in [re.fullmatch(r"model_(\d+)\.pt", os.path.basename(f))]
    if m
  )
  if not steps:
    raise ConvertError(
      f"{model_dir} has no model_<step>.pt; give nanochat's checkpoint "
      f"directory (base_checkpoints/d20)"
    )
  if step is None:
    step = steps[-1]
  if step not in steps:
    raise ConvertError(
      f"{model_dir} has no model_{step:06d}.pt; its steps are {', '.join(map(str, steps))}"
    )
  return (
    os.path.join(model_dir, f"model_{step:06d}.pt"),
    os.path.join(model_dir, f"meta_{step:06d}.json"),
    step,
  )


def _positive_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_meta(path: str) -> dict:
  """``model_config`` of ``meta_<step>.json``, checked to be a model laplax runs.

  Raises:
    ConvertError: missing or not JSON, a size that is not a positive integer,
      ``n_kv_head`` that does not divide ``n_head``, a width that is not
      a multiple of the heads with an even head size, bad ``laplacian_heads``,
      or a key of a later nanochat that laplax has not (value embeddings,
      windows, ...).
  """
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
    mc = dict(meta["model_config"])
  except FileNotFoundError:
    raise ConvertError(
      f"{path} is missing; nanochat writes it beside model_<step>.pt (it holds model_config)"
    ) from None
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConvertError(f"cannot read model_config from {path}: {type(e).__name__}") from None
  for key in MODEL_CONFIG_KEYS:
    if not _positive_int(mc.get(key)):
      raise ConvertError(f"{path}: model_config {key}={mc.get(key)!r} must be a positive integer")
  extra = sorted(set(mc) - set(MODEL_CONFIG_KEYS) - {"laplacian_heads"} - set(FORK_KEYS))
  if extra:
    raise ConvertError(
      f"{path}: model_config has {', '.join(extra)}, options of a later "
      f"nanochat that laplax has not; nanochat's first GPT and the authors' "
      f"fork (yuchongzhang/nanochat 1f70b557) convert"
    )
  if is_fork(mc):
    mc = {**FORK_DEFAULTS, **mc}  # the fork's patch of older checkpoints
    for key in FORK_SWITCHES:
      if not isinstance(mc[key], bool):
        raise ConvertError(f"{path}: model_config {key}={mc[key]!r} must be true or false")
    pattern = mc["window_pattern"]
    if not (isinstance(pattern, str) and pattern and set(pattern.upper()) <= {"S", "L"}):
      raise ConvertError(
        f"{path}: model_config window_pattern={pattern!r} must be letters S and L, e.g. 'SSSL'"
      )
    mc["window_pattern"] = pattern.upper()
  if mc["n_head"] % mc["n_kv_head"]:
    raise ConvertError(
      f"{path}: n_kv_head={mc['n_kv_head']} must divide n_head={mc['n_head']} "
      f"(grouped-query attention shares each key/value head among n_head / n_kv_head heads)"
    )
  if mc["n_embd"] % mc["n_head"] or (mc["n_embd"] // mc["n_head"]) % 2:
    raise ConvertError(
      f"{path}: n_embd={mc['n_embd']} / n_head={mc['n_head']} must be an even head size"
    )
  heads = mc.get("laplacian_heads", 0)
  counts = heads if isinstance(heads, list) else [heads] * mc["n_layer"]
  if len(counts) != mc["n_layer"] or not all(
    isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= mc["n_head"] for k in counts
  ):
    raise ConvertError(
      f"{path}: laplacian_heads={heads!r} must be an int or {mc['n_layer']} "
      f"ints in 0..n_head={mc['n_head']}"
    )
  return mc


def _load_state_dict(path: str) -> dict[str, np.ndarray]:
  """``torch.load(path, weights_only=True)`` as NumPy, bfloat16 tensors as
  ``ml_dtypes.bfloat16`` (bit for bit) and the ``_orig_mod.`` prefix of a
  compiled model dropped.

  Raises:
    ConvertError: torch missing, an unreadable file, or not a state dict of
      float tensors.
  """
  torch, state = common.torch_state_dict(path, "pip install -r requirements-test.txt")
  import ml_dtypes

  out = {}
  for name, value in state.items():
    if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
      raise ConvertError(f"{path}: {name} is not a float tensor")
    value = value.detach().contiguous()
    if value.dtype == torch.bfloat16:
      array = value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
      array = value.float().numpy()
    out[name[len(COMPILED_PREFIX) :] if name.startswith(COMPILED_PREFIX) else name] = array
  return out


def check_tensors(tensors: Mapping[str, np.ndarray], mc: Mapping, source: str) -> None:
  """Raises :class:`ConvertError` unless ``tensors`` are exactly
  :func:`nanochat_shapes` ``(mc)``."""
  want = nanochat_shapes(mc)
  for name, shape in want.items():
    if name not in tensors:
      raise ConvertError(
        f"{source} has no tensor {name}, which nanochat's GPT "
        f"(n_layer={mc['n_layer']}, n_embd={mc['n_embd']}) has"
      )
    if tuple(tensors[name].shape) != shape:
      raise ConvertError(
        f"{source}: {name} has shape {tuple(tensors[name].shape)}; model_config implies {shape}"
      )
  for name in tensors:
    if name not in want:
      raise ConvertError(f"{source} has tensor {name}, which nanochat's first GPT has not")


def laplax_config(
  mc: Mapping, config: ml_collections.ConfigDict, given: list[str], embedding_dtype: str
) -> ml_collections.ConfigDict:
  """A copy of ``config`` (an lm config) with nanochat's model of ``mc``:
  :func:`~laplax.config.defaults.nanochat_options`, the sizes, context
  ``sequence_len``, the key/value heads ``n_kv_head`` (``model.num_kv_heads``,
  ``None`` when it is ``n_head``), ``data.vocab_size``, the Laplacian heads of
  ``laplacian_heads`` and ``embedding_dtype`` (the file's ``wte`` dtype)
  unless the command line sets them (``given``). ``data.tokenizer`` becomes
  ``"nanochat"``: ``train.py`` and ``eval.py`` then read the workdir's
  :data:`TOKENIZER_FILE` (the rest of ``data``, e.g. the FineWeb-Edu
  ``source_dir`` of ``configs/gpt_d20.py``, comes from ``config``).

  Raises:
    ConvertError: not a language-model config, or a result that does not validate.
  """
  from laplax import tasks
  from laplax.config import defaults
  from laplax.config import validation as config_lib

  if not tasks.is_language_model(config):
    raise ConvertError(
      f"--config has task={config.get('task')!r}; nanochat needs a "
      f"language-model config, e.g. configs/gpt_d20.py"
    )
  config = copy.deepcopy(config)
  is_given = lambda key: any(key == g or key.startswith(g + ".") for g in given)
  with config.unlocked():
    m = config.model
    m.name = "gpt"
    m.width, m.depth, m.num_heads = mc["n_embd"], mc["n_layer"], mc["n_head"]
    m.mlp_dim, m.max_length = 4 * mc["n_embd"], mc["sequence_len"]
    m.num_kv_heads = None if mc["n_kv_head"] == mc["n_head"] else mc["n_kv_head"]
    m.layerscale_init = None
    defaults.nanochat_options(config)
    if not (is_given("num_laplacian_heads") or is_given("laplacian_mask")):
      m.num_laplacian_heads = mc.get("laplacian_heads", 0)
      m.laplacian_mask = None
    if not is_given("embedding_dtype"):
      m.embedding_dtype = embedding_dtype
    if is_fork(mc):
      defaults.nanochat_fork_model(
        config,
        **{ours: mc[theirs] for theirs, ours in FORK_SWITCHES.items()},
        window_pattern=mc["window_pattern"],
      )
    config.data.vocab_size = mc["vocab_size"]
    config.data.tokenizer = "nanochat"
  try:
    tasks.validate(config)
  except config_lib.ConfigError as e:
    raise ConvertError(f"the converted config does not validate: {e}") from None
  return config


# --------------------------------------------------------------------------- API


def convert_from_nanochat(
  model_dir: str,
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  step: int | None = None,
  tokenizer: str | None = None,
  given: list[str] | tuple = (),
) -> str | None:
  """Writes a new laplax workdir from nanochat's checkpoint directory.

  Reads ``meta_<step>.json`` (:func:`read_meta`) and ``model_<step>.pt``
  (``torch.load(weights_only=True)``; ``step`` default: the largest), maps
  the tensors with :func:`nanochat_to_laplax` (stacked when
  ``config.model.scan_layers``) into the model of :func:`laplax_config`, and
  writes ``config.json`` and the step-0 checkpoint
  (:func:`~laplax.convert.common.write_workdir`), plus
  :data:`TOKENIZER_FILE` when a tokenizer is found (:func:`find_tokenizer`,
  read by :func:`read_tokenizer`), the file ``train.py`` and ``eval.py``
  read (``config.data.tokenizer="nanochat"``).
  At float32 compute (``model.dtype``, set by the CLI unless given) the
  laplax model computes nanochat's logits (tests/models/test_nanochat_exact.py).

  Args:
    model_dir: nanochat's ``base_checkpoints/<tag>`` directory.
    config: a laplax language-model config (data and training settings).
    workdir: the new laplax workdir (must not exist).
    step: which checkpoint.
    tokenizer: a ``tokenizer.pkl``, a directory with one, or a
      :data:`TOKENIZER_FILE`.
    given: the ``config.model`` keys the command line sets (they win over
      the checkpoint's Laplacian heads and ``wte`` dtype).

  Returns:
    The tokenizer file read, or ``None``.

  Raises:
    ConvertError: ``workdir`` exists; a missing, unreadable or refused file;
      a model laplax cannot express; misshapen or unexpected tensors; a
      tokenizer whose size is not ``vocab_size``.
  """
  workdir_abs = common.new_path(workdir, "--workdir")
  weights, meta, step = _step_files(model_dir, step)
  mc = read_meta(meta)
  tok_path = find_tokenizer(model_dir, tokenizer)
  tok = read_tokenizer(tok_path, mc["vocab_size"]) if tok_path is not None else None
  tensors = _load_state_dict(weights)
  check_tensors(tensors, mc, weights)
  wte = tensors[PREFIX + "wte.weight"]
  config = laplax_config(
    mc, config, list(given), "bfloat16" if wte.dtype.name == "bfloat16" else "float32"
  )
  from laplax.models import spec as spec_lib

  spec = spec_lib.from_config(config.model)
  common.refuse_unsupported(
    spec,
    SUPPORT,
    "nanochat's GPT",
    "the converted model would not compute nanochat's logits; set it there",
    skip_source=True,
  )
  params = common.to_layout(common.nested(nanochat_to_laplax(tensors, spec.depth)), spec)
  files = {}
  if tok is not None:
    if store.is_remote(workdir_abs):  # staged on local disk, uploaded into the workdir
      parent = tempfile.gettempdir()
    else:
      parent = os.path.dirname(workdir_abs)
      os.makedirs(parent, exist_ok=True)
    staged = common.new_directory(parent)
    files[TOKENIZER_FILE] = os.path.join(staged, TOKENIZER_FILE)
    tok.save(files[TOKENIZER_FILE])
  try:
    common.write_workdir(
      workdir, config, params, vocab_size=mc["vocab_size"], files=files, source=weights
    )
  finally:
    if files:
      shutil.rmtree(os.path.dirname(files[TOKENIZER_FILE]), ignore_errors=True)
  return tok_path


def laplacian_counts(spec) -> int | list[int]:
  """The authors' ``laplacian_heads`` of a spec: an int when every layer has
  the same count, else one count per layer.

  Raises:
    ConvertError: a layer whose Laplacian heads are not its last ``k``.
  """
  from laplax import attention

  counts = []
  for i, row in enumerate(spec.laplacian_array):
    k = int(row.sum())
    if not np.array_equal(row, attention.laplacian_heads(spec.num_heads, k)):
      raise ConvertError(
        f"layer {i}'s Laplacian heads {np.flatnonzero(row).tolist()} are "
        f"not its last {k}; nanochat's laplacian_heads counts the last heads"
      )
    counts.append(k)
  return counts[0] if len(set(counts)) == 1 else counts


def _refuse_options(spec) -> None:
  """Raises :class:`ConvertError` for a GPT that nanochat's model does not
  compute: every option whose value :data:`SUPPORT` does not admit (:func:`~laplax.convert.common.refuse_unsupported`)."""
  common.refuse_unsupported(
    spec,
    SUPPORT,
    "nanochat's GPT",
    "this workdir cannot be written as nanochat (train it with the nanochat recipe)",
  )


def _fork_model(spec, vocab_size: int) -> bool:
  """Whether ``spec`` is the fork's model (written in the fork's format) or
  nanochat's first (3a5e0bc); either must be exactly that model.

  Raises:
    ConvertError: a rotary base, q/k scale or vocabulary padding of neither.
  """
  padded = -(-vocab_size // FORK_VOCAB_MULTIPLE) * FORK_VOCAB_MULTIPLE
  fork = spec.fork_trunk or spec.attention.qk_scale != 1.0 or spec.vocab_multiple != 1
  want = (1.2, 100_000.0, padded) if fork else (1.0, 10_000.0, vocab_size)
  rope = spec.attention.rope
  theta = None if rope is None else rope.rope_theta
  have = (spec.attention.qk_scale, theta, spec.padded_vocab(vocab_size))
  if have != want:
    which = "the authors' fork" if fork else "nanochat's first release"
    raise ConvertError(
      f"model.qk_scale, rope_theta and the padded vocabulary are {have}; {which} has "
      f"{want}; this workdir cannot be written as nanochat"
    )
  return fork


def convert_to_nanochat(workdir: str, out_dir: str) -> None:
  """Writes a laplax GPT workdir as nanochat's checkpoint directory.

  ``out_dir`` gets ``model_<step:06d>.pt`` (``torch.save`` of the state dict
  :func:`laplax_to_nanochat`: float32 kernels, ``wte`` in the workdir's
  embedding dtype, bfloat16 for ``configs/gpt_d20.py`` as nanochat keeps it)
  and ``meta_<step:06d>.json`` (``step``, ``model_config`` with the authors'
  ``laplacian_heads`` when there are Laplacian heads, ``max_seq_len``), and,
  when the workdir has :data:`TOKENIZER_FILE`, ``tokenizer.pkl``
  (:meth:`NanochatTokenizer.save_nanochat`, the pickle nanochat writes and
  reads from ``$NANOCHAT_BASE_DIR/tokenizer/``). ``step`` is the workdir's newest.
  Everything goes to a temporary directory renamed at the end.

  Raises:
    ConvertError: not a laplax GPT workdir, a model nanochat does not compute
      (:func:`_refuse_options`, Laplacian heads other than the last of a
      layer), an existing ``out_dir``, or torch missing.
  """
  out_abs = os.path.abspath(os.path.expanduser(out_dir))
  if os.path.exists(out_abs):
    raise ConvertError(f"--out {out_abs} exists; give a new directory (nothing was written)")
  config, spec, params, step = common.read_workdir(workdir)
  from laplax import tasks

  if not tasks.is_language_model(config) or config.model.get("name") != "gpt":
    raise ConvertError(
      f"{workdir} is a {config.get('task')} run of model "
      f"{config.model.get('name')!r}; --to nanochat needs a GPT language model"
    )
  _refuse_options(spec)
  heads = laplacian_counts(spec)
  flat = common.flat(params)
  vocab_size = int(config.data.vocab_size)
  mc = {
    "sequence_len": spec.max_length,
    "vocab_size": vocab_size,
    "n_layer": spec.depth,
    "n_head": spec.num_heads,
    "n_kv_head": spec.kv_heads,
    "n_embd": spec.width,
  }
  if _fork_model(spec, vocab_size):
    mc.update({theirs: bool(getattr(spec, ours)) for theirs, ours in FORK_SWITCHES.items()})
    mc["window_pattern"] = spec.window_pattern or "L"
    mc["laplacian_heads"] = heads if isinstance(heads, list) else [heads] * spec.depth
  elif heads:
    mc["laplacian_heads"] = heads
  tensors = laplax_to_nanochat(flat, spec.depth)
  tokenizer = common.workdir_file(workdir, TOKENIZER_FILE)
  tok = read_tokenizer(tokenizer, vocab_size) if tokenizer else None
  try:
    import torch
  except ImportError:
    raise ConvertError(
      "--to nanochat writes a PyTorch file and torch is not installed; "
      "pip install -r requirements-test.txt"
    ) from None

  def as_torch(a):
    if a.dtype.name == "bfloat16":
      return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a, np.float32))

  state = {name: as_torch(np.asarray(a)) for name, a in tensors.items()}
  parent = os.path.dirname(out_abs)
  os.makedirs(parent, exist_ok=True)
  tmp = common.new_directory(parent)
  try:
    torch.save(state, os.path.join(tmp, f"model_{step:06d}.pt"))
    with open(os.path.join(tmp, f"meta_{step:06d}.json"), "w", encoding="utf-8") as f:
      json.dump(
        {"step": step, "model_config": mc, "max_seq_len": spec.max_length, "source": "laplax"},
        f,
        indent=2,
      )
      f.write("\n")
    if tok is not None:
      tok.save_nanochat(tmp)
    os.rename(tmp, out_abs)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
