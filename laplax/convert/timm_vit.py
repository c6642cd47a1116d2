"""timm Vision Transformers <-> laplax ViTs (``timm.models.vision_transformer``).

The same weights give the same logits: a timm ``VisionTransformer``
(Dosovitskiy et al. 2021; DeiT-3, Touvron et al. 2022: LayerScale, no
position embedding on the class token) and the laplax :class:`~laplax.models.vit.ViT`
built from :func:`model_keys` compute the same function. What maps to what:

================================  ==========================================
timm ``state_dict``               laplax parameters
================================  ==========================================
``patch_embed.proj.weight``       ``embedding/kernel`` (OIHW -> HWIO)
``cls_token``                     ``cls`` (plus ``pos_embed[:, 0]`` when the
                                  class token has a position embedding)
``pos_embed``                     ``pos_embedding`` (the patches' rows)
``blocks.i.norm1``, ``norm2``     ``block{i}/norm1``, ``norm2`` (scale, bias)
``blocks.i.attn.qkv``             ``block{i}/attention/{query,key,value}``
``blocks.i.attn.q_norm/k_norm``   ``block{i}/attention/{query,key}_norm``
``blocks.i.attn.proj``            ``block{i}/attention/out``
``blocks.i.ls1/ls2.gamma``        ``block{i}/ls1``, ``ls2`` ``scale``
``blocks.i.mlp.fc1``, ``fc2``     ``block{i}/mlp/fc1``, ``fc2``
``norm`` or ``fc_norm``           ``encoder_norm`` (``model.fc_norm``)
``head``                          ``head``
================================  ==========================================

PyTorch ``Linear`` weights are ``[out, in]``, laplax kernels ``[in, out]``.
The conversions work on ``{name: np.ndarray}``; only building a timm model
by name (:func:`timm_model`) and reading ``.pth`` files import PyTorch.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

from laplax import store
from laplax.convert import common, support
from laplax.convert.common import ConvertError
from laplax.convert.support import ANY

TIMM_CONFIG = "timm_config.json"  # --to timm: the VisionTransformer arguments
WEIGHTS = "model.safetensors"


def _split_items(text: str) -> list[str]:
  """``text`` split at the commas outside parentheses and brackets."""
  items, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    depth += 1 if ch in "([" else -1 if ch in ")]" else 0
    if ch == "," and depth == 0:
      items.append(text[start:i])
      start = i + 1
  return items + [text[start:]]


def parse_model_args(text: str) -> dict:
  """``"img_size=28,in_chans=1,qk_norm=True,depths=(2,2)"`` -> keyword
  arguments (ints, floats, ``True``/``False``/``None``, tuples of those in
  parentheses, else strings).

  Raises:
    ConvertError: an item without ``=``, or a tuple that is not a literal.
  """
  import ast

  out = {}
  for item in filter(None, (t.strip() for t in _split_items(text or ""))):
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ConvertError(
        f"--model_args item {item!r} is not key=value; e.g. --model_args img_size=28,in_chans=1"
      )
    value = value.strip()
    if value[:1] in "([" and value:
      try:
        out[key.strip()] = tuple(ast.literal_eval(value))
      except (ValueError, SyntaxError, TypeError):
        raise ConvertError(
          f"--model_args item {item!r} is not a tuple of literals; e.g. depths=(2,2,6,2)"
        ) from None
      continue
    literal = {"True": True, "False": False, "None": None}
    if value in literal:
      out[key.strip()] = literal[value]
      continue
    for cast in (int, float):
      try:
        out[key.strip()] = cast(value)
        break
      except ValueError:
        pass
    else:
      out[key.strip()] = value
  return out


def timm_model(name: str, model_args: Mapping | None = None, seed: int = 0):
  """``timm.create_model(name, pretrained=False, **model_args)`` in eval mode
  (its own random initialisation: works offline). The initialisation is drawn
  with ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the
  caller's generator is left as it was), so two conversions of the same model
  give the same weights.

  Raises:
    ConvertError: timm is not installed, or ``name`` / an argument is unknown.
  """
  try:
    import timm
  except ImportError:
    raise ConvertError(
      "--from timm needs timm and torch: pip install -r requirements-test.txt"
    ) from None
  if not timm.is_model(name.split(".")[0]):  # a tag (".augreg_in21k") names weights
    close = timm.list_models(f"{name.split('_')[0]}_*")[:5]
    raise ConvertError(
      f"--model {name} is not a timm model" + (f"; e.g. {', '.join(close)}" if close else "")
    )
  import torch  # timm imported it already

  try:
    with torch.random.fork_rng():
      torch.manual_seed(seed)
      return timm.create_model(name, pretrained=False, **dict(model_args or {})).eval()
  except Exception as e:  # timm asserts, KeyErrors, ...
    raise ConvertError(
      f"timm.create_model({name!r}) failed with --model_args "
      f"{dict(model_args or {})}: {type(e).__name__}: "
      f"{str(e).splitlines()[0] if str(e) else ''}"
    ) from None


def _identity(module) -> bool:
  """Whether a timm submodule is absent (``None``) or ``nn.Identity``."""
  return module is None or type(module).__name__ == "Identity"


def architecture(model) -> dict:
  """The sizes and switches of a timm ``VisionTransformer`` that laplax can express.

  Raises:
    ConvertError: not a ``VisionTransformer``, or a feature laplax lacks
      (register tokens, a pre-norm, attention pooling, class token with mean
      pooling, an activation other than GELU, no qkv bias, ...), named.
  """
  if type(model).__name__ != "VisionTransformer":
    raise ConvertError(
      f"{type(model).__name__} is not a timm VisionTransformer; "
      f"laplax converts these timm classes: {', '.join(c.TIMM_CLASS for c in converters())}"
    )
  block = model.blocks[0]
  if type(block).__name__ != "Block":
    raise ConvertError(
      f"this timm model's blocks are {type(block).__name__}; laplax "
      f"converts timm's plain pre-norm Block"
    )
  attn, mlp = block.attn, block.mlp
  act = type(mlp.act).__name__
  tanh = act == "GELUTanh" or getattr(mlp.act, "approximate", "none") == "tanh"
  checks = [
    (getattr(model, "num_reg_tokens", 0) == 0, "register tokens"),
    (_identity(model.norm_pre), "a norm before the blocks (norm_pre)"),
    (getattr(model, "attn_pool", None) is None, "attention pooling"),
    (model.global_pool in ("token", "avg"), f"global_pool={model.global_pool!r}"),
    (
      not (model.cls_token is not None and model.global_pool == "avg"),
      "a class token with mean pooling (use class_token=False)",
    ),
    (
      model.cls_token is not None or model.global_pool == "avg",
      "no class token with token pooling",
    ),
    (attn.qkv.bias is not None, "qkv_bias=False (laplax biases all projections)"),
    (
      attn.proj.bias is not None and mlp.fc1.bias is not None,
      "bias-free projections (laplax biases all projections)",
    ),
    (act in ("GELU", "GELUTanh"), f"the MLP activation {act}"),
    (_identity(getattr(attn, "norm", None)), "a norm inside attention"),
    (_identity(getattr(mlp, "norm", None)), "a norm inside the MLP"),
    (model.pos_embed is not None, "no position embedding"),
    (_identity(model.patch_embed.norm), "a norm after the patch embedding"),
  ]
  for ok, what in checks:
    if not ok:
      raise ConvertError(f"this timm model has {what}, which laplax's ViT has not")
  norm = model.fc_norm if not _identity(model.fc_norm) else model.norm
  qk_norm = not _identity(attn.q_norm)
  if qk_norm and abs(attn.q_norm.eps - 1e-6) > 1e-12:
    raise ConvertError(
      f"this timm model's qk-norm has eps={attn.q_norm.eps}; laplax's qk-norm uses 1e-6"
    )
  patch = tuple(model.patch_embed.patch_size)
  if patch[0] != patch[1]:
    raise ConvertError(f"patch size {patch} is not square; laplax patches are square")
  return dict(
    embed_dim=model.embed_dim,
    depth=len(model.blocks),
    num_heads=attn.num_heads,
    mlp_dim=mlp.fc1.out_features,
    patch_size=patch[0],
    img_size=tuple(model.patch_embed.img_size),
    in_chans=model.patch_embed.proj.in_channels,
    num_classes=model.num_classes,
    class_token=model.cls_token is not None,
    no_embed_class=bool(model.no_embed_class),
    fc_norm=not _identity(model.fc_norm),
    qk_norm=qk_norm,
    layerscale=not _identity(block.ls1),
    gelu="gelu" if tanh else "gelu_exact",
    norm_eps=float(norm.eps),
  )


def model_keys(arch: Mapping) -> dict:
  """The laplax ``config.model`` keys of a timm :func:`architecture`."""
  return dict(
    name="vit",
    width=arch["embed_dim"],
    depth=arch["depth"],
    num_heads=arch["num_heads"],
    mlp_dim=arch["mlp_dim"],
    patch_size=arch["patch_size"],
    pool="tok" if arch["class_token"] else "gap",
    posemb="learn",
    fc_norm=arch["fc_norm"],
    qk_norm=arch["qk_norm"],
    qk_norm_type="layernorm",
    qk_scale=1.0,
    layerscale_init=1e-6 if arch["layerscale"] else None,
    use_bias=True,
    mlp_activation=arch["gelu"],
    norm="layernorm",
    norm_eps=arch["norm_eps"],
  )


def timm_to_laplax(state: Mapping[str, np.ndarray], arch: Mapping) -> dict:
  """A timm ViT ``state_dict`` (NumPy) -> laplax parameters (``block{i}`` layout).

  Raises:
    ConvertError: a tensor missing or of the wrong shape, or one left over (named).
  """
  r = common.TimmReader(state)
  d, hidden, c = arch["embed_dim"], arch["mlp_dim"], arch["in_chans"]
  p = arch["patch_size"]
  grid = (arch["img_size"][0] // p) * (arch["img_size"][1] // p)
  prefix = 1 if arch["class_token"] and not arch["no_embed_class"] else 0
  r.conv("patch_embed.proj", "embedding", (d, c, p, p))
  pos = r.take("pos_embed", (1, prefix + grid, d))
  r.out["pos_embedding"] = np.ascontiguousarray(pos[:, prefix:])
  if arch["class_token"]:
    r.out["cls"] = r.take("cls_token", (1, 1, d)) + (pos[:, :1] if prefix else 0.0)
  for i in range(arch["depth"]):
    b, o = f"blocks.{i}", f"block{i}"
    r.norm(f"{b}.norm1", f"{o}/norm1", d)
    r.norm(f"{b}.norm2", f"{o}/norm2", d)
    r.qkv(f"{b}.attn.qkv", f"{o}/attention", d)
    if arch["qk_norm"]:
      hd = d // arch["num_heads"]
      for t, l in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
        r.norm(f"{b}.attn.{t}", f"{o}/attention/{l}", hd)
    r.linear(f"{b}.attn.proj", f"{o}/attention/out", d, d)
    if arch["layerscale"]:
      r.out[f"{o}/ls1/scale"] = r.take(f"{b}.ls1.gamma", (d,))
      r.out[f"{o}/ls2/scale"] = r.take(f"{b}.ls2.gamma", (d,))
    r.linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
    r.linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
  r.norm("fc_norm" if arch["fc_norm"] else "norm", "encoder_norm", d)
  if arch["num_classes"]:
    r.linear("head", "head", d, arch["num_classes"])
  return r.params()


def laplax_to_timm(params: Mapping, spec, config=None) -> tuple[dict, dict]:
  """laplax ViT parameters (``block{i}`` layout) -> ``(state_dict, model_args)``:
  a timm ``VisionTransformer(**model_args)`` loads ``state_dict`` (NumPy
  float32, PyTorch names and layouts) with ``strict=True``.

  Raises:
    ConvertError: a laplax option timm's ViT lacks (every option whose value
      :data:`SUPPORT` does not admit: RMSNorm, ReLU^2, no biases, an RMSNorm
      qk-norm, a qk scale, a norm eps other than 1e-6, any option it does not
      list at a value other than its default;
      :func:`~laplax.convert.common.refuse_unsupported`),
      or a fixed sin-cos position embedding without a known image size.
  """
  common.refuse_unsupported(spec, SUPPORT, NAME, "this workdir cannot be written as timm")
  f = common.flat(params)
  d, p = spec.width, spec.patch_size
  kernel = np.asarray(f["embedding/kernel"])
  c = kernel.shape[2]
  if "pos_embedding" in f:
    pos = np.asarray(f["pos_embedding"], np.float32)
    side = math.isqrt(pos.shape[1])
    if side * side != pos.shape[1]:
      raise ConvertError(
        f"pos_embedding has {pos.shape[1]} patches, not a square grid; "
        f"timm's img_size cannot be inferred"
      )
  else:
    size = config.data.image_size if config is not None else None
    if not size:
      raise ConvertError(
        "model.posemb='sincos2d' needs config.data.image_size to "
        "write timm's pos_embed; set it in the run's config"
      )
    from laplax.models.vit import posemb_sincos_2d

    side = int(size) // p
    pos = posemb_sincos_2d(side, side, d)
  w = common.TimmWriter(params)
  w.conv("embedding", "patch_embed.proj")
  w.sd["pos_embed"] = pos
  if spec.pool == "tok":
    w.sd["cls_token"] = f["cls"]
  for i in range(spec.depth):
    b, o, a = f"blocks.{i}", f"block{i}", f"block{i}/attention"
    w.norm(f"{o}/norm1", f"{b}.norm1")
    w.norm(f"{o}/norm2", f"{b}.norm2")
    w.qkv(a, f"{b}.attn.qkv")
    if spec.attention.qk_norm is not None:
      for t, l in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
        w.norm(f"{a}/{l}", f"{b}.attn.{t}")
    w.linear(f"{a}/out", f"{b}.attn.proj")
    if spec.layerscale_init is not None:
      w.sd[f"{b}.ls1.gamma"], w.sd[f"{b}.ls2.gamma"] = f[f"{o}/ls1/scale"], f[f"{o}/ls2/scale"]
    w.linear(f"{o}/mlp/fc1", f"{b}.mlp.fc1")
    w.linear(f"{o}/mlp/fc2", f"{b}.mlp.fc2")
  w.norm("encoder_norm", "fc_norm" if spec.fc_norm else "norm")
  num_classes = 0
  if "head/kernel" in f:
    w.linear("head", "head")
    num_classes = int(np.shape(f["head/kernel"])[1])
  sd = w.state_dict()
  model_args = dict(
    img_size=side * p,
    patch_size=p,
    in_chans=int(c),
    num_classes=num_classes,
    global_pool="token" if spec.pool == "tok" else "avg",
    embed_dim=d,
    depth=spec.depth,
    num_heads=spec.num_heads,
    mlp_ratio=spec.mlp_dim / d,
    qkv_bias=True,
    qk_norm=spec.attention.qk_norm is not None,
    init_values=spec.layerscale_init,
    class_token=spec.pool == "tok",
    no_embed_class=True,
    fc_norm=spec.fc_norm,
    act_layer="gelu" if spec.mlp_activation == "gelu_exact" else "gelu_tanh",
  )
  return sd, model_args


def timm_layout(state: dict[str, np.ndarray], model, family) -> dict[str, np.ndarray]:
  """``state`` in the layout of timm's ``model``: unchanged when it has
  exactly the model's tensor names, else renamed by timm's own
  ``checkpoint_filter_fn`` of the family's module (what ``timm.create_model(...,
  pretrained=True)`` applies to the authors' release files: Microsoft's Swin
  and DaViT, facebookresearch's XCiT with ``pos_embeder`` and a fused
  class-attention ``qkv``). What does not then match is refused by the
  converter's shape and name checks."""
  if set(state) == set(model.state_dict()):
    return state
  import torch

  module = importlib.import_module(family.TIMM_MODULE)
  renamed = module.checkpoint_filter_fn({k: torch.from_numpy(v) for k, v in state.items()}, model)
  return {k: v.detach().float().numpy() for k, v in renamed.items()}


#: Where timm's classifiers keep their weight ``[num_classes, features]``
#: (ViT, DeiT, XCiT: ``head``; Swin, DaViT: ``head.fc``).
HEAD_WEIGHTS = ("head.weight", "head.fc.weight")


def head_classes(state: Mapping[str, Any]) -> int | None:
  """The number of classes of a timm state dict's classifier (the rows of its
  :data:`HEAD_WEIGHTS` tensor), ``None`` without one (a backbone)."""
  for key in HEAD_WEIGHTS:
    if key in state and np.ndim(state[key]) == 2:
      return int(np.shape(state[key])[0])
  return None


def load_weights(path: str) -> dict[str, np.ndarray]:
  """A ``.safetensors`` or ``.pth`` file -> ``{name: float32 array}`` (a
  ``.pth`` holding ``{"model": state_dict}`` as DeiT's do is unwrapped).

  Raises:
    ConvertError: the file is missing or not a state dict.
  """
  if not os.path.isfile(path):
    raise ConvertError(f"--weights {path} does not exist")
  try:
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file

      return dict(load_file(path))
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:
    raise ConvertError(
      f"--weights {path} is not a safetensors or PyTorch state dict ({type(e).__name__})"
    ) from None
  if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
    state = state["model"]
  if not isinstance(state, dict):
    raise ConvertError(f"--weights {path} holds a {type(state).__name__}, not a state dict")
  return {k: v.detach().float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


#: The model options timm's VisionTransformer expresses
#: (:mod:`laplax.convert.support`; any other option only at its default): a
#: qk-norm (LayerNorm), LayerScale, GELU (either form), the position
#: embedding, drop-path and the norm before the head.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "qk_norm": ANY,
  "layerscale_init": ANY,
  "mlp_activation": ("gelu", "gelu_exact"),
  "posemb": ANY,
  "drop_path": ANY,
  "fc_norm": ANY,
}
#: The name refusals give the target and the class ``--to timm`` writes (as
#: :mod:`laplax.convert.timm_swin`).
NAME = "timm's VisionTransformer"
TIMM_CLASS = "VisionTransformer"


#: The timm module that defines :data:`TIMM_CLASS`.
TIMM_MODULE = "timm.models.vision_transformer"
#: The laplax family it converts (``config.model.name``).
FAMILY = "vit"
#: timm model names with a default config of their own: none (``configs/deit3_imagenet.py``,
#: ``--from timm``'s default).
MODEL_PREFIXES = ()
DEFAULT_CONFIG = "deit3_imagenet.py"


def converters() -> tuple:
  """The timm converter modules: every ``laplax.convert.timm_*`` module that
  declares a ``TIMM_CLASS`` (this one included), in module name order. Each
  declares ``TIMM_CLASS``, ``TIMM_MODULE``, ``FAMILY`` (the laplax family),
  ``SUPPORT``, ``NAME``, ``MODEL_PREFIXES`` and ``DEFAULT_CONFIG``, and
  defines ``architecture``, ``timm_to_laplax``, ``model_keys`` and
  ``laplax_to_timm`` (``docs/architecture.md``, "Adding a model family")."""
  import pkgutil

  package = importlib.import_module("laplax.convert")
  out = []
  for info in pkgutil.iter_modules(package.__path__):
    if info.name.startswith("timm_"):
      module = importlib.import_module(f"{package.__name__}.{info.name}")
      if hasattr(module, "TIMM_CLASS"):
        out.append(module)
  return tuple(out)


def family_of(model):
  """The converter module of a timm model: the one of :func:`converters`
  whose ``TIMM_CLASS`` is the model's class, else this module (whose
  :func:`architecture` refuses what is not a ``VisionTransformer``)."""
  for converter in converters():
    if type(model).__name__ == converter.TIMM_CLASS:
      return converter
  return _this()


def _this():
  import sys

  return sys.modules[__name__]


def converter_of(family: str):
  """The converter module of laplax family ``family`` (``config.model.name``),
  or ``None``."""
  return next((c for c in converters() if c.FAMILY == family), None)


def _is_classification(config) -> bool:
  """Whether ``config``'s task is :class:`~laplax.tasks.classification.ClassificationTask`
  (or a subclass): timm's ViTs are classifiers."""
  from laplax import tasks

  cls = tasks.task_class(config)
  return cls is not None and issubclass(cls, tasks.ClassificationTask)


def convert_from_timm(
  name: str, weights: str | None, model_args: str, config, workdir: str
) -> None:
  """``--from timm``: the timm model ``name`` (its random initialisation, or
  ``weights``) -> a new laplax workdir with ``config``'s data and training
  settings and the model keys of the timm architecture (the config's
  Laplacian-head and spectral keys are kept).

  Raises:
    ConvertError: see :func:`timm_model`, :func:`architecture`,
      :func:`timm_to_laplax`, :func:`common.write_workdir`.
  """
  if store.is_remote(workdir):
    common.new_path(workdir, "--workdir")
  elif os.path.exists(workdir):
    raise ConvertError(f"--workdir {workdir} exists; give a new directory (nothing was written)")
  if not _is_classification(config):
    raise ConvertError(
      f"--config is a {config.get('task')} config; --from timm needs "
      f"a classification config (e.g. configs/deit3_imagenet.py)"
    )
  args = parse_model_args(model_args)
  state = load_weights(weights) if weights else None
  if state is not None and "num_classes" not in args and head_classes(state) is not None:
    args["num_classes"] = head_classes(state)  # a fine-tuned model's own classes
  model = timm_model(name, args)
  family = family_of(model)
  arch = family.architecture(model)
  if state is None:
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  elif getattr(family, "RELEASE_LAYOUTS", False):
    state = timm_layout(state, model, family)
  params = family.timm_to_laplax(state, arch)
  keys = family.model_keys(arch)
  if keys["name"] != config.model.get("name"):  # another family: its model section,
    from laplax.config import defaults  # with the config's values of the keys both have

    old = config.model
    config.model = defaults.model_config(keys["name"])
    for key in old:
      if key in config.model and key != "name":
        config.model[key] = old[key]
  for key, value in keys.items():
    config.model[key] = value
  if "image_size" in config.data and arch["img_size"][0] == arch["img_size"][1]:
    config.data.image_size = int(arch["img_size"][0])
  from laplax import tasks
  from laplax.models import spec as spec_lib

  try:
    tasks.validate(config, None, strict_keys=True)
    spec = spec_lib.from_config(config.model)
  except ValueError as e:
    raise ConvertError(str(e)) from None
  common.refuse_unsupported(
    spec,
    family.SUPPORT,
    family.NAME,
    "the converted model would not compute timm's logits; set it there",
    skip_source=True,
  )
  common.write_workdir(
    workdir,
    config,
    common.to_layout(params, spec),
    num_classes=arch["num_classes"],
    image_shape=tuple(arch["img_size"]) + (arch["in_chans"],),
    source=weights or f"timm {name}",
  )


def convert_to_timm(workdir: str, out_dir: str, force: bool) -> str | None:
  """``--to timm``: a laplax ViT workdir -> ``out_dir`` with ``model.safetensors``
  (the state dict) and ``timm_config.json`` (``{"model_args": ...}`` for
  ``timm.models.vision_transformer.VisionTransformer``). Returns the
  ``--force`` note (what timm must change), or ``None``.

  Raises:
    ConvertError: ``out_dir`` exists, not a ViT workdir, an option timm lacks,
      or Laplacian heads / spectral conditioning without ``force``.
  """
  if os.path.exists(out_dir):
    raise ConvertError(f"--out {out_dir} exists; give a new directory (nothing was written)")
  config, spec, params, step = common.read_workdir(workdir)
  family = converter_of(config.model.name)
  if not _is_classification(config) or family is None:
    names = ", ".join(c.FAMILY for c in converters())
    raise ConvertError(
      f"{workdir} is a {config.task} run of a {config.model.name}; --to timm converts "
      f"classifiers of the families {names} (a DINO backbone is not a timm classifier)"
    )
  note = common.refuse_laplax_only(spec, "timm", force)
  params = {k: v for k, v in common.flat(params).items() if not k.endswith("laplacian_mix")}
  state, model_args = family.laplax_to_timm(common.nested(params), spec, config)
  from safetensors.numpy import save_file

  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = common.new_directory(parent)
  try:
    save_file(state, os.path.join(tmp, WEIGHTS))
    with open(os.path.join(tmp, TIMM_CONFIG), "w") as f:
      json.dump(
        {
          "timm_class": family.TIMM_CLASS,
          "model_args": model_args,
          "laplax_step": step,
          "laplax_changes": note,
        },
        f,
        indent=2,
      )
    common.commit_directory(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return note


def timm_from_dir(out_dir: str) -> Any:
  """The timm model a ``--to timm`` directory describes (its ``timm_class``,
  ``VisionTransformer`` when absent), its weights loaded with ``strict=True``
  (needs timm and torch)."""
  import importlib

  import torch
  from safetensors.torch import load_file

  with open(os.path.join(out_dir, TIMM_CONFIG)) as f:
    saved = json.load(f)
  name = saved.get("timm_class", "VisionTransformer")
  converter = next(c for c in converters() if c.TIMM_CLASS == name)
  model = getattr(importlib.import_module(converter.TIMM_MODULE), name)(**saved["model_args"])
  model.load_state_dict(load_file(os.path.join(out_dir, WEIGHTS)), strict=True)
  del torch
  return model.eval()
