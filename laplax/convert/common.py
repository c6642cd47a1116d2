"""What the converters share: the error, the tensor mappings, the layer layout, and laplax workdirs.

A converter maps a foreign ``state_dict`` (``{name: np.ndarray}``) to the
parameter tree of a laplax model and back: :func:`split_qkv` and
:func:`fuse_qkv` map a fused ``qkv`` projection, :class:`TimmReader` and
:class:`TimmWriter` the norms, linears and convolutions of a timm model
(PyTorch ``Linear`` weights ``[out, in]``, convolutions OIHW; laplax
kernels ``[in, out]``, HWIO), and :func:`hf_output_dir` writes a Hugging
Face ``save_pretrained`` directory. :func:`write_workdir` turns a
config and such a tree into a laplax workdir (``config.json`` and a step-0
orbax checkpoint, as ``train.py --config.total_steps=0`` writes), and
:func:`read_workdir` reads one back without preparing its data.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from laplax import state as state_lib
from laplax import utils
from laplax.convert import support
from laplax.errors import UserError
from laplax.models import spec as spec_lib
from laplax.models.layers import SCANNED_BLOCKS


class ConvertError(UserError, ValueError):
  """A conversion that cannot be done; the message is one line naming the
  tensor, key or file and the fix."""


def flat(tree: Mapping) -> dict[str, np.ndarray]:
  """``{"a/b/c": leaf}`` of a nested parameter dict."""
  return {utils.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(dict(tree))[0]}


def nested(flat_params: Mapping[str, Any]) -> dict:
  """The nested dict of ``{"a/b/c": leaf}`` (inverse of :func:`flat`)."""
  out: dict = {}
  for name, value in flat_params.items():
    node = out
    *parents, leaf = name.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return out


#: The laplax attention's projections, in the order a fused ``qkv`` stacks them
#: (timm's ``attn.qkv``, GPT-2's ``c_attn``).
QKV = ("query", "key", "value")


def transpose(x: np.ndarray) -> np.ndarray:
  """``x.T``, C-contiguous: a PyTorch ``Linear`` weight ``[out, in]`` <-> a
  laplax kernel ``[in, out]``."""
  return np.ascontiguousarray(np.asarray(x).T)


def split_qkv(kernel: np.ndarray, bias: np.ndarray, prefix: str) -> dict[str, np.ndarray]:
  """The flat laplax parameters ``{prefix}/{query,key,value}/{kernel,bias}``
  (kernels ``[D_in, D]``, C-contiguous; biases ``[D]``) of a fused
  projection ``kernel [D_in, 3D]`` (laplax layout: a timm ``qkv.weight``
  transposed, GPT-2's ``c_attn.weight`` as it is) and ``bias [3D]``, whose
  thirds are the query, key and value in that order."""
  out = {}
  for name, k, b in zip(QKV, np.split(np.asarray(kernel), 3, axis=1), np.split(bias, 3)):
    out[f"{prefix}/{name}/kernel"] = np.ascontiguousarray(k)
    out[f"{prefix}/{name}/bias"] = b
  return out


def fuse_qkv(flat_params: Mapping[str, Any], prefix: str) -> tuple[np.ndarray, np.ndarray]:
  """``(kernel [D_in, 3D], bias [3D])``: the query, key and value of
  ``flat_params`` under ``prefix`` concatenated, the inverse of :func:`split_qkv`."""
  kernel = np.concatenate([np.asarray(flat_params[f"{prefix}/{n}/kernel"]) for n in QKV], axis=1)
  bias = np.concatenate([np.asarray(flat_params[f"{prefix}/{n}/bias"]) for n in QKV])
  return kernel, bias


class TimmReader:
  """Takes the tensors of a timm ``state_dict`` into flat laplax parameters
  (:attr:`out`), each checked for its shape; :meth:`params` refuses a tensor
  that was never taken.

  Args:
    state: ``{name: array}``; every tensor becomes float32.
    ignored: names that are not parameters (XCiT's ``num_batches_tracked``).
  """

  def __init__(self, state: Mapping[str, Any], ignored=()):
    self.state = {k: np.asarray(v, np.float32) for k, v in state.items()}
    self.used = set(ignored)
    self.out: dict[str, np.ndarray] = {}

  def take(self, name: str, shape: tuple | None = None) -> np.ndarray:
    """The tensor ``name``, marked as used.

    Raises:
      ConvertError: no such tensor, or a shape other than ``shape``.
    """
    if name not in self.state:
      raise ConvertError(f"the timm weights lack tensor {name}")
    self.used.add(name)
    value = self.state[name]
    if shape is not None and tuple(value.shape) != tuple(shape):
      hint = ""
      if name.startswith("head.") and value.shape[:1] != tuple(shape)[:1]:  # a classifier
        hint = f" (a {value.shape[0]}-class head: --model_args num_classes={value.shape[0]})"
      raise ConvertError(
        f"timm tensor {name} has shape {tuple(value.shape)}; this architecture needs "
        f"{tuple(shape)}{hint}"
      )
    return value

  def norm(self, src: str, dst: str, d: int) -> None:
    """LayerNorm ``src.{weight,bias} [d]`` -> ``dst/{scale,bias}``."""
    self.out[f"{dst}/scale"] = self.take(f"{src}.weight", (d,))
    self.out[f"{dst}/bias"] = self.take(f"{src}.bias", (d,))

  def linear(self, src: str, dst: str, n_in: int, n_out: int) -> None:
    """``Linear`` ``src.weight [n_out, n_in]``, ``src.bias [n_out]`` ->
    ``dst/kernel [n_in, n_out]``, ``dst/bias``."""
    self.out[f"{dst}/kernel"] = transpose(self.take(f"{src}.weight", (n_out, n_in)))
    self.out[f"{dst}/bias"] = self.take(f"{src}.bias", (n_out,))

  def conv(self, src: str, dst: str, shape: tuple, bias: bool = True) -> None:
    """``Conv2d`` ``src.weight`` of OIHW ``shape`` -> ``dst/kernel`` (HWIO),
    and ``src.bias [O]`` -> ``dst/bias`` when ``bias``."""
    weight = self.take(f"{src}.weight", shape)
    self.out[f"{dst}/kernel"] = np.ascontiguousarray(weight.transpose(2, 3, 1, 0))
    if bias:
      self.out[f"{dst}/bias"] = self.take(f"{src}.bias", (shape[0],))

  def qkv(self, src: str, dst: str, d: int) -> None:
    """The fused ``src.weight [3d, d]``, ``src.bias [3d]`` -> the
    ``dst/{query,key,value}`` projections (:func:`split_qkv`)."""
    kernel = transpose(self.take(f"{src}.weight", (3 * d, d)))
    self.out.update(split_qkv(kernel, self.take(f"{src}.bias", (3 * d,)), dst))

  def params(self) -> dict:
    """The nested laplax parameters of everything taken.

    Raises:
      ConvertError: a tensor of the state dict was never taken (named, with
        how many such).
    """
    left = sorted(set(self.state) - self.used)
    if left:
      raise ConvertError(
        f"the timm weights have tensor {left[0]}, which this "
        f"architecture has not" + (f" ({len(left)} such)" if len(left) > 1 else "")
      )
    return nested(self.out)


class TimmWriter:
  """Writes flat laplax parameters as a timm ``state_dict`` (:attr:`sd`), the
  inverse of :class:`TimmReader`'s mappings; :meth:`state_dict` gives the
  tensors as C-contiguous float32.

  Args:
    params: the laplax parameter tree (``block{i}`` layout).
  """

  def __init__(self, params: Mapping):
    self.f = flat(params)
    self.sd: dict[str, np.ndarray] = {}

  def norm(self, src: str, dst: str) -> None:
    """``src/{scale,bias}`` -> LayerNorm ``dst.{weight,bias}``."""
    self.sd[f"{dst}.weight"], self.sd[f"{dst}.bias"] = self.f[f"{src}/scale"], self.f[f"{src}/bias"]

  def linear(self, src: str, dst: str) -> None:
    """``src/{kernel,bias}`` -> ``Linear`` ``dst.weight [out, in]``, ``dst.bias``."""
    self.sd[f"{dst}.weight"] = transpose(self.f[f"{src}/kernel"])
    self.sd[f"{dst}.bias"] = self.f[f"{src}/bias"]

  def conv(self, src: str, dst: str, bias: bool = True) -> None:
    """``src/kernel`` (HWIO) -> ``Conv2d`` ``dst.weight`` (OIHW), and the bias when ``bias``."""
    self.sd[f"{dst}.weight"] = np.asarray(self.f[f"{src}/kernel"]).transpose(3, 2, 0, 1)
    if bias:
      self.sd[f"{dst}.bias"] = self.f[f"{src}/bias"]

  def qkv(self, src: str, dst: str) -> None:
    """The ``src/{query,key,value}`` projections -> the fused ``dst.weight
    [3D, D]``, ``dst.bias [3D]`` (:func:`fuse_qkv`)."""
    kernel, bias = fuse_qkv(self.f, src)
    self.sd[f"{dst}.weight"], self.sd[f"{dst}.bias"] = transpose(kernel), bias

  def state_dict(self) -> dict[str, np.ndarray]:
    """Every tensor written, C-contiguous float32."""
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in self.sd.items()}


def to_layout(params: dict, spec: spec_lib.TransformerSpec) -> dict:
  """Per-layer ``block{i}`` subtrees stacked into ``blocks`` when
  ``spec.scan_layers`` (the layout of :func:`laplax.models.layers.transformer_blocks`)."""
  if not spec.scan_layers:
    return params
  params = dict(params)
  layers = [params.pop(f"block{i}") for i in range(spec.depth)]
  params[SCANNED_BLOCKS] = jax.tree_util.tree_map(lambda *x: np.stack(x), *layers)
  return params


def from_layout(params: dict, spec: spec_lib.TransformerSpec) -> dict:
  """The inverse of :func:`to_layout`: ``block{i}`` subtrees, whatever the layout."""
  if SCANNED_BLOCKS not in params:
    return params
  params = dict(params)
  stacked = params.pop(SCANNED_BLOCKS)
  for i in range(spec.depth):
    params[f"block{i}"] = jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], stacked)
  return params


def cannot_read(path: str, error: Exception) -> ConvertError:
  """``cannot read PATH: ErrorType: the error's first line``, to raise ``from None``."""
  text = str(error)
  return ConvertError(
    f"cannot read {path}: {type(error).__name__}: {text.splitlines()[0] if text else ''}"
  )


def torch_state_dict(path: str, missing_torch_hint: str) -> tuple[Any, Mapping]:
  """``(torch, state)``: the module and ``torch.load(path, map_location="cpu",
  weights_only=True)`` of an untrusted PyTorch file (no code in it runs).
  PyTorch is imported here only.

  Raises:
    ConvertError: torch missing (the line ends with ``missing_torch_hint``),
      an unreadable file, or an object that is not a mapping.
  """
  try:
    import torch
  except ImportError:
    raise ConvertError(
      f"{path} is a PyTorch file and torch is not installed; {missing_torch_hint}"
    ) from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:
    raise cannot_read(path, e) from None
  if not isinstance(state, Mapping):
    raise ConvertError(f"{path} holds a {type(state).__name__}, not a state dict")
  return torch, state


def new_directory(parent: str) -> str:
  """A new temporary directory in ``parent`` (renamed into place by
  :func:`commit_directory`) with the permissions ``os.makedirs`` would give
  (``mkdtemp``'s are 0700). A SIGINT/SIGTERM that ends the process at once
  (:mod:`laplax.signals`) removes it first."""
  from laplax import signals

  tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)
  _PENDING[tmp] = signals.at_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
  return tmp


_PENDING: dict = {}  # temporary directory -> the function unregistering its removal


def commit_directory(tmp: str, path: str) -> None:
  """Renames the finished :func:`new_directory` ``tmp`` to ``path``, as one
  step that a signal's immediate exit waits for (it never sees half of it)."""
  from laplax import signals

  with signals.critical():
    os.rename(tmp, path)
    _PENDING.pop(tmp, lambda: None)()


def new_path(path: str, flag: str) -> str:
  """The absolute ``path`` (``~`` expanded; a ``gs://`` URL as given) of a
  directory a converter is about to write.

  Raises:
    ConvertError: it exists (``{flag} PATH exists; give a new directory``;
      for ``gs://``: any object under it).
    StoreError: its bucket does not exist or does not answer.
  """
  from laplax import store

  path = store.absolute(path)
  store.check_bucket(path)
  if store.exists(path):
    raise ConvertError(f"{flag} {path} exists; give a new directory (nothing was written)")
  return path


def workdir_file(workdir: str, name: str) -> str | None:
  """A local file name of ``workdir/name`` (for readers of local files only:
  a ``gs://`` object is downloaded to a temporary folder), or ``None`` if the
  workdir has no such file."""
  from laplax import store

  if not store.is_remote(workdir):
    path = os.path.join(os.path.expanduser(workdir), name)
    return path if os.path.isfile(path) else None
  path = store.join(workdir, name)
  return store.local_copy(path) if store.isfile(path) else None


# ------------------------------------------------------- Hugging Face directories

#: The files of a Hugging Face ``save_pretrained`` directory that converters read and write.
HF_CONFIG_FILE = "config.json"
HF_SAFETENSORS_FILE = "model.safetensors"
HF_SAFETENSORS_INDEX = "model.safetensors.index.json"
HF_TORCH_FILE = "pytorch_model.bin"
HF_TOKENIZER_FILE = "tokenizer.json"


def read_hf_config_json(model_dir: str, directory: str) -> tuple[dict, str]:
  """``(config, path)``: ``model_dir/config.json`` parsed, unchecked beyond
  being a JSON object. ``directory`` ends the refusals (what to give, e.g.
  ``"a GPT2LMHeadModel.save_pretrained directory"``).

  Raises:
    ConvertError: ``model_dir`` is not a directory or has no ``config.json``,
      it cannot be read or parsed, or it is not a JSON object.
  """
  if not os.path.isdir(model_dir):
    raise ConvertError(f"--model {model_dir} is not a directory; give {directory}")
  path = os.path.join(model_dir, HF_CONFIG_FILE)
  if not os.path.isfile(path):
    raise ConvertError(f"--model {model_dir} has no {HF_CONFIG_FILE}; give {directory}")
  try:
    with open(path, encoding="utf-8") as f:
      hf = json.load(f)
  except (OSError, ValueError) as e:
    raise cannot_read(path, e) from None
  if not isinstance(hf, dict):
    raise ConvertError(f"{path} is not a JSON object; give {directory}")
  return hf, path


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  """The tensors of one ``.safetensors`` file (``safetensors.numpy.load_file``;
  bfloat16 tensors come as ``ml_dtypes.bfloat16``, which importing it
  registers with NumPy)."""
  import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
  from safetensors.numpy import load_file

  try:
    return load_file(path)
  except Exception as e:  # safetensors' own errors
    raise cannot_read(path, e) from None


def read_hf_tensors(model_dir: str, directory: str) -> tuple[dict[str, np.ndarray], str]:
  """``({name: array}, file)`` of the weights in ``model_dir``:
  ``model.safetensors``, else the shards of ``model.safetensors.index.json``,
  else ``pytorch_model.bin`` (PyTorch imported then only, ``weights_only=True``;
  floating tensors as float32). ``directory`` ends the refusal of a
  directory without weights.

  Raises:
    ConvertError: none of those files, or one that cannot be read.
  """
  path = os.path.join(model_dir, HF_SAFETENSORS_FILE)
  if os.path.isfile(path):
    return _load_safetensors(path), path
  index = os.path.join(model_dir, HF_SAFETENSORS_INDEX)
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise ConvertError(f"cannot read {index}: {type(e).__name__}") from None
    tensors = {}
    for shard in shards:
      tensors.update(_load_safetensors(os.path.join(model_dir, shard)))
    return tensors, index
  path = os.path.join(model_dir, HF_TORCH_FILE)
  if os.path.isfile(path):
    _, state = torch_state_dict(path, f"install torch or give a {HF_SAFETENSORS_FILE}")
    tensors = {
      k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
      for k, v in state.items()
    }
    return tensors, path
  raise ConvertError(
    f"{model_dir} has no {HF_SAFETENSORS_FILE} (nor {HF_SAFETENSORS_INDEX} "
    f"or {HF_TORCH_FILE}); give {directory}"
  )


def check_tokenizer(path: str, vocab_size: int) -> None:
  """Raises :class:`ConvertError` unless ``path`` is a ``tokenizers`` file of
  ``vocab_size`` tokens (what laplax's BPE tokenizer then requires)."""
  import tokenizers

  try:
    size = tokenizers.Tokenizer.from_file(path).get_vocab_size()
  except Exception as e:  # tokenizers raises Exception
    raise ConvertError(
      f"cannot read {path} as a tokenizers file: "
      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
    ) from None
  if size != vocab_size:
    raise ConvertError(
      f"{path} has {size} tokens but the model's vocab_size is "
      f"{vocab_size}; laplax needs them equal (remove {HF_TOKENIZER_FILE} "
      f"to convert the weights alone)"
    )


def write_hf_workdir(
  workdir: str,
  config: ml_collections.ConfigDict,
  spec: spec_lib.TransformerSpec,
  flat_params: Mapping[str, np.ndarray],
  model_dir: str,
  vocab_size: int,
  source: str,
) -> None:
  """:func:`write_workdir` of a language model converted from the Hugging
  Face directory ``model_dir``: the flat parameters in ``spec``'s layout
  (:func:`to_layout`), and ``model_dir``'s ``tokenizer.json`` copied when
  there (:func:`check_tokenizer` first).

  Raises:
    ConvertError: as :func:`check_tokenizer` and :func:`write_workdir`.
  """
  files = {}
  tokenizer = os.path.join(model_dir, HF_TOKENIZER_FILE)
  if os.path.isfile(tokenizer):
    check_tokenizer(tokenizer, vocab_size)
    files[HF_TOKENIZER_FILE] = tokenizer
  params = to_layout(nested(flat_params), spec)
  write_workdir(workdir, config, params, vocab_size=vocab_size, files=files, source=source)


def write_hf_directory(
  out_dir: str,
  hf_config: Mapping,
  tensors: Mapping[str, np.ndarray],
  files: Mapping[str, str] | None = None,
  json_files: Mapping[str, Mapping] | None = None,
) -> None:
  """Writes a new ``save_pretrained`` directory ``out_dir`` (absolute, not
  existing: :func:`new_path`): ``config.json`` (``hf_config``, indented),
  ``model.safetensors`` (``tensors``: C-contiguous, ``{"format": "pt"}``
  metadata), ``files`` copied in (``{name: path}``) and ``json_files``
  written (``{name: object}``). Everything is written in a temporary
  directory beside it and renamed at the end, so a failure leaves nothing.
  """
  from safetensors.numpy import save_file

  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = new_directory(parent)
  try:
    documents = {HF_CONFIG_FILE: hf_config, **(json_files or {})}
    for name, document in documents.items():
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2)
        f.write("\n")
    save_file(dict(tensors), os.path.join(tmp, HF_SAFETENSORS_FILE), metadata={"format": "pt"})
    for name, path in (files or {}).items():
      shutil.copyfile(path, os.path.join(tmp, name))
    commit_directory(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def validate_converted(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` (a converter's result), once :func:`laplax.tasks.validate` accepts it.

  Raises:
    ConvertError: ``the converted config does not validate: REASON``.
  """
  from laplax import tasks
  from laplax.config import validation as config_lib

  try:
    tasks.validate(config)
  except config_lib.ConfigError as e:
    raise ConvertError(f"the converted config does not validate: {e}") from None
  return config


def check_params(params: Mapping, abstract: Mapping, source: str) -> None:
  """Raises :class:`ConvertError` unless ``params`` has exactly the names,
  shapes and dtypes of ``abstract`` (the laplax model's parameter tree)."""
  got, want = flat(params), flat(abstract)
  for name in want:
    if name not in got:
      raise ConvertError(f"{source} gives no value for laplax parameter {name}")
  for name, value in got.items():
    if name not in want:
      raise ConvertError(f"{source} gives laplax parameter {name}, which this model has not")
    if tuple(np.shape(value)) != tuple(want[name].shape):
      raise ConvertError(
        f"{source}: laplax parameter {name} would be "
        f"{tuple(np.shape(value))}, the model's is {tuple(want[name].shape)}"
      )


def write_workdir(
  workdir: str,
  config: ml_collections.ConfigDict,
  params: Mapping,
  *,
  num_classes: int | None = None,
  image_shape: tuple | None = None,
  vocab_size: int | None = None,
  files: Mapping[str, str] | None = None,
  source: str = "the source",
) -> None:
  """Writes a new laplax workdir: ``config.json`` and the step-0 checkpoint
  of ``params`` (a fresh optimizer state, RNG from ``config.seed``), plus
  ``files`` (``{name in workdir: path to copy}``, e.g. ``tokenizer.json``).

  Everything is written in a temporary directory beside ``workdir`` and
  renamed at the end, so a failure leaves nothing; a ``gs://`` workdir is
  written in place under its lock (:mod:`laplax.convert.remote`).

  Args:
    workdir: the new run directory (must not exist).
    config: a validated laplax config (classification or lm).
    params: the model's parameter tree (float32 NumPy leaves).
    num_classes, image_shape: the classifier's sizes (classification).
    vocab_size: the language model's vocabulary (lm).
    files: extra files to copy in.
    source: how errors name where the parameters came from.

  Raises:
    ConvertError: ``workdir`` exists, or ``params`` does not fit the model.
    StoreError: a ``gs://`` bucket that does not exist or does not answer.
  """
  from laplax import (
    optim,
    tasks,
  )
  from laplax.state import TrainState
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir.files import CHECKPOINT_DIR, write_config

  workdir = new_path(workdir, "--workdir")
  task = tasks.task_class(config).from_shapes(
    config, num_classes=num_classes, image_shape=image_shape, vocab_size=vocab_size
  )
  tx = optim.make_optimizer(config)
  abstract = state_lib.abstract_state(task, tx, config.seed)
  check_params(params, abstract.params, source)
  params = jax.tree_util.tree_map(
    lambda x, a: np.asarray(x, a.dtype), dict(params), abstract.params
  )
  rng = jax.random.PRNGKey(config.seed)
  state = TrainState(
    step=np.zeros((), np.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.fold_in(rng, 1),
    task_state=task.init_task_state(params),
  )
  from laplax import store

  if store.is_remote(workdir):
    from laplax.convert import remote

    remote.write_workdir(workdir, config, state, files or {}, ConvertError)
    return
  parent = os.path.dirname(workdir)
  os.makedirs(parent, exist_ok=True)
  tmp = new_directory(parent)
  try:
    write_config(config, tmp)
    checkpointer = ckpt_lib.Checkpointer(os.path.join(tmp, CHECKPOINT_DIR))
    checkpointer.save(state, None)
    checkpointer.close()
    for name, path in (files or {}).items():
      shutil.copyfile(path, os.path.join(tmp, name))
    commit_directory(tmp, workdir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def read_workdir(workdir: str):
  """``(config, spec, params, step)`` of the newest checkpoint of a laplax
  workdir; the data is not needed (parameters only, NumPy leaves, per-layer
  ``block{i}`` layout whatever ``scan_layers``).

  Raises:
    ConvertError: not a laplax workdir, or no readable checkpoint.
  """
  from laplax import loading as restore
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir.files import CHECKPOINT_DIR

  try:
    config = restore.saved_config(workdir)
  except restore.LoadError as e:
    raise ConvertError(str(e)) from None
  if not restore.saved_steps(workdir):
    raise ConvertError(
      f"{workdir} has no checkpoint; train first with train.py --workdir {workdir}"
    )
  try:
    step, params = ckpt_lib.Checkpointer(
      os.path.join(workdir, CHECKPOINT_DIR), read_only=True
    ).restore_params()
  except ckpt_lib.CheckpointError as e:
    raise ConvertError(str(e)) from None
  spec = spec_lib.from_config(config.model)
  return config, spec, from_layout(params, spec), step


#: The ``config.model`` options a conversion from another framework resets to
#: the source's model (plain attention, float32 compute, so the logits are the
#: source's) unless the command line sets them: the spec fields whose metadata
#: marks them ``source`` (:func:`laplax.convert.support.source_options`).
SOURCE_OPTIONS = {
  k: v for cls in spec_lib.FAMILIES.values() for k, v in support.source_options(cls).items()
}


def refuse_unsupported(
  spec: spec_lib.TransformerSpec,
  table: Mapping[str, Any],
  name: str,
  fix: str,
  *,
  skip_source: bool = False,
) -> None:
  """Refuses the first option of ``spec`` that a converter cannot express, as
  its ``table`` (the converter module's ``SUPPORT``) declares it
  (:func:`laplax.convert.support.unsupported`: an option the table does not
  list is refused unless at its default, so a new spec field fails closed).
  ``name`` is the target as the message names it, ``fix`` ends the line;
  ``skip_source`` (``--from``) leaves the options the command line may add
  (:data:`SOURCE_OPTIONS`) to the caller.

  Raises:
    ConvertError: ``model.KEY=VALUE: NAME has no equivalent (it has ...); FIX``.
  """
  refused = support.unsupported(spec, table, skip_source=skip_source)
  if refused:
    key, shown, supported = refused[0]
    raise ConvertError(f"model.{key}={shown}: {name} has no equivalent (it has {supported}); {fix}")


def plain_attention(config: ml_collections.ConfigDict, given: list[str]) -> None:
  """Sets :data:`SOURCE_OPTIONS` in ``config.model``, except the keys in
  ``given`` (:func:`laplax.cli.common.explicit_model_keys`:
  ``--config.model.num_laplacian_heads=2`` converts into a model with
  Laplacian heads)."""
  for key, value in SOURCE_OPTIONS.items():
    if any(key == g or key.startswith(g + ".") for g in given):
      continue
    node, leaf = config.model, key
    if "." in key:
      section, leaf = key.split(".")
      node = config.model.get(section)
    if node is not None and leaf in node:
      node[leaf] = value


def refuse_laplax_only(spec: spec_lib.TransformerSpec, target: str, force: bool) -> str | None:
  """What ``target`` (timm, Hugging Face) must change to run a model with
  Laplacian heads or spectral conditioning, or ``None`` for a plain model.

  Raises:
    ConvertError: such a model without ``force``.
  """
  changes = []
  heads = spec.laplacian_array
  if heads.any() or spec.attention.laplacian_mix != "fixed":
    layers = "; ".join(
      f"layer {i}: heads {[int(h) for h in np.flatnonzero(row)]}"
      for i, row in enumerate(heads)
      if row.any()
    )
    changes.append(
      f"Laplacian heads output V - softmax(QK^T/sqrt(d))V ({layers or 'a learned mix per head'})"
    )
  if spec.attention.spectral is not None:
    sp = spec.attention.spectral
    changes.append(
      f"spectral conditioning adds the fixed correction (lambda={sp.lam}, "
      f"mode={sp.mode}) of laplax.spectral.correction to W_{'/W_'.join(sp.targets.upper())}"
      f" at every forward (the written weights are W without it)"
    )
  if not changes:
    return None
  message = f"{target} has no equivalent of: " + "; ".join(changes)
  if not force:
    raise ConvertError(
      f"{message}; pass --force to write the weights anyway (the "
      f"target code must then make these changes)"
    )
  return message
