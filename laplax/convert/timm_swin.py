"""timm Swin Transformers <-> laplax Swins (``timm.models.swin_transformer``).

The same weights give the same logits: a timm ``SwinTransformer`` (Liu et al.
2021) and the laplax :class:`~laplax.models.swin.Swin` built from
:func:`model_keys` compute the same function on images of the timm model's
``img_size`` (the relative position tables are sized for its stages' windows).
What maps to what (``s`` a stage, ``j`` a block of it, ``i`` the block's
number over all stages):

=========================================  =====================================
timm ``state_dict``                        laplax parameters
=========================================  =====================================
``patch_embed.proj``                       ``embedding`` (OIHW -> HWIO)
``patch_embed.norm``                       ``embedding_norm``
``layers.s.downsample.norm``               ``merge{s}/norm``
``layers.s.downsample.reduction.weight``   ``merge{s}/reduction/kernel``
``layers.s.blocks.j.norm1``, ``norm2``     ``block{i}/norm1``, ``norm2``
``...attn.relative_position_bias_table``   ``block{i}/relative_position_bias``
``...attn.qkv``                            ``block{i}/attention/{query,key,value}``
``...attn.proj``                           ``block{i}/attention/out``
``...mlp.fc1``, ``fc2``                    ``block{i}/mlp/fc1``, ``fc2``
``norm``                                   ``encoder_norm``
``head.fc``                                ``head``
=========================================  =====================================

PyTorch ``Linear`` weights are ``[out, in]``, laplax kernels ``[in, out]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from laplax.convert import common, support
from laplax.convert.common import ConvertError
from laplax.convert.support import ANY

#: The model options timm's SwinTransformer expresses (:mod:`laplax.convert.support`;
#: any other option only at its default): the exact GELU, drop-path.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "mlp_activation": ("gelu_exact",),
  "drop_path": ANY,
}
#: How refusals name the target.
NAME = "timm's SwinTransformer"
#: The class ``--to timm`` writes (``timm_config.json``'s ``timm_class``).
TIMM_CLASS = "SwinTransformer"
#: The timm module that defines :data:`TIMM_CLASS` (``--to timm`` rebuilds it).
TIMM_MODULE = "timm.models.swin_transformer"
#: ``--weights`` in the authors' release layout convert (timm's
#: ``checkpoint_filter_fn``, :func:`laplax.convert.timm_vit.timm_layout`).
RELEASE_LAYOUTS = True
#: The laplax family (``config.model.name``) it converts.
FAMILY = "swin"
#: timm model names (``--model``) of that class: their prefixes.
MODEL_PREFIXES = ("swin",)
#: The config file (under ``configs/``) of ``--from timm --model swin_*`` without ``--config``.
DEFAULT_CONFIG = "swin_imagenet.py"


def architecture(model) -> dict:
  """The sizes of a timm ``SwinTransformer`` that laplax's Swin can express.

  Raises:
    ConvertError: not a ``SwinTransformer``, or a feature laplax's Swin lacks
      (widths or heads that do not double per stage, per-stage window sizes or
      MLP ratios, non-square windows or patches, a pooling other than the
      mean, no qkv bias, an activation other than the exact GELU, ...), named.
  """
  if type(model).__name__ != "SwinTransformer":
    raise ConvertError(f"{type(model).__name__} is not a timm SwinTransformer")
  stages = list(model.layers)
  blocks = [b for st in stages for b in st.blocks]
  first = blocks[0]
  heads = [st.blocks[0].attn.num_heads for st in stages]
  dims = [st.blocks[0].dim for st in stages]
  mlp = [st.blocks[0].mlp.fc1.out_features for st in stages]
  ref_windows = set(map(tuple, model._ref_window_sizes))
  act = first.mlp.act
  checks = [
    (model.global_pool == "avg", f"global_pool={model.global_pool!r}"),
    (all(h == heads[0] * 2**s for s, h in enumerate(heads)), f"heads {heads} not doubling"),
    (all(d == dims[0] * 2**s for s, d in enumerate(dims)), f"widths {dims} not doubling"),
    (all(m == mlp[0] * 2**s for s, m in enumerate(mlp)), f"MLP sizes {mlp} not doubling"),
    (
      all(b.attn.qkv.weight.shape[0] == 3 * b.dim for b in blocks),
      "a head_dim other than width / heads",
    ),
    (len(ref_windows) == 1, f"per-stage window sizes {sorted(ref_windows)}"),
    (all(w[0] == w[1] for w in ref_windows), "non-square windows"),
    (all(not b.always_partition for b in blocks), "always_partition=True"),
    (all(b.attn.qkv.bias is not None for b in blocks), "qkv_bias=False"),
    (type(act).__name__ == "GELU" and act.approximate == "none", f"the activation {act}"),
    (not common_identity(model.patch_embed.norm), "no norm after the patch embedding"),
    (type(model.norm).__name__ == "LayerNorm", f"the final norm {type(model.norm).__name__}"),
    (
      len({float(m.eps) for m in model.modules() if type(m).__name__ == "LayerNorm"}) == 1,
      "LayerNorms of different eps",
    ),
  ]
  for ok, what in checks:
    if not ok:
      raise ConvertError(f"this timm Swin has {what}, which laplax's Swin has not")
  patch = tuple(model.patch_embed.patch_size)
  if patch[0] != patch[1]:
    raise ConvertError(f"patch size {patch} is not square; laplax patches are square")
  return dict(
    embed_dim=dims[0],
    stage_depths=tuple(len(st.blocks) for st in stages),
    num_heads=heads[0],
    mlp_dim=mlp[0],
    window_size=next(iter(ref_windows))[0],
    patch_size=patch[0],
    img_size=tuple(model.patch_embed.img_size),
    in_chans=model.patch_embed.proj.in_channels,
    num_classes=model.num_classes,
    norm_eps=float(model.norm.eps),
  )


def common_identity(module) -> bool:
  """Whether a timm submodule is absent (``None``) or ``nn.Identity``."""
  return module is None or type(module).__name__ == "Identity"


def model_keys(arch: Mapping) -> dict:
  """The laplax ``config.model`` keys of a timm Swin :func:`architecture`."""
  return dict(
    name="swin",
    width=arch["embed_dim"],
    depth=sum(arch["stage_depths"]),
    stage_depths=tuple(arch["stage_depths"]),
    num_heads=arch["num_heads"],
    mlp_dim=arch["mlp_dim"],
    patch_size=arch["patch_size"],
    window_size=arch["window_size"],
    qk_norm=False,
    layerscale_init=None,
    use_bias=True,
    mlp_activation="gelu_exact",
    norm="layernorm",
    norm_eps=arch["norm_eps"],
  )


def _stage_windows(stage_depths, window_size: int, grid: tuple[int, int]) -> list[tuple]:
  """The ``(rows, cols)`` window of every stage for a patch grid ``grid`` (as the model)."""
  from laplax.models.swin import stage_window

  out, (h, w) = [], grid
  for s in range(len(stage_depths)):
    if s:
      h, w = (h + 1) // 2, (w + 1) // 2
    out.append(stage_window((h, w), window_size)[0])
  return out


def timm_to_laplax(state: Mapping[str, np.ndarray], arch: Mapping) -> dict:
  """A timm Swin ``state_dict`` (NumPy) -> laplax parameters.

  Raises:
    ConvertError: a tensor missing or of the wrong shape, or one left over (named).
  """
  r = common.TimmReader(state)
  d0, c, p = arch["embed_dim"], arch["in_chans"], arch["patch_size"]
  grid = (arch["img_size"][0] // p, arch["img_size"][1] // p)
  windows = _stage_windows(arch["stage_depths"], arch["window_size"], grid)
  r.conv("patch_embed.proj", "embedding", (d0, c, p, p))
  r.norm("patch_embed.norm", "embedding_norm", d0)
  i = 0
  for s, depth in enumerate(arch["stage_depths"]):
    d, heads, hidden = d0 * 2**s, arch["num_heads"] * 2**s, arch["mlp_dim"] * 2**s
    wh, ww = windows[s]
    if s:
      r.norm(f"layers.{s}.downsample.norm", f"merge{s}/norm", 2 * d)
      r.out[f"merge{s}/reduction/kernel"] = common.transpose(
        r.take(f"layers.{s}.downsample.reduction.weight", (d, 2 * d))
      )
    for j in range(depth):
      b, o = f"layers.{s}.blocks.{j}", f"block{i}"
      r.norm(f"{b}.norm1", f"{o}/norm1", d)
      r.norm(f"{b}.norm2", f"{o}/norm2", d)
      r.out[f"{o}/relative_position_bias"] = r.take(
        f"{b}.attn.relative_position_bias_table", ((2 * wh - 1) * (2 * ww - 1), heads)
      )
      r.qkv(f"{b}.attn.qkv", f"{o}/attention", d)
      r.linear(f"{b}.attn.proj", f"{o}/attention/out", d, d)
      r.linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
      r.linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
      i += 1
  r.norm("norm", "encoder_norm", d)
  if arch["num_classes"]:
    r.linear("head.fc", "head", d, arch["num_classes"])
  return r.params()


def laplax_to_timm(params: Mapping, spec, config=None) -> tuple[dict, dict]:
  """laplax Swin parameters -> ``(state_dict, model_args)``: a timm
  ``SwinTransformer(**model_args)`` loads ``state_dict`` (NumPy float32,
  PyTorch names and layouts) with ``strict=True``. The image size is
  ``config.data.image_size`` (the relative position tables are sized for it).

  Raises:
    ConvertError: a laplax option timm's Swin lacks (every option whose value
      :data:`SUPPORT` does not admit:
      LayerScale, qk-norm, another GELU or norm eps, ...), or no image size.
  """
  common.refuse_unsupported(spec, SUPPORT, NAME, "this workdir cannot be written as timm")
  size = config.data.get("image_size") if config is not None else None
  if not size:
    raise ConvertError(
      "a Swin's timm img_size is config.data.image_size, which this run's config lacks; set it"
    )
  w = common.TimmWriter(params)
  kernel = np.asarray(w.f["embedding/kernel"])
  w.conv("embedding", "patch_embed.proj")
  w.norm("embedding_norm", "patch_embed.norm")
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    if s:
      w.norm(f"merge{s}/norm", f"layers.{s}.downsample.norm")
      w.sd[f"layers.{s}.downsample.reduction.weight"] = common.transpose(
        w.f[f"merge{s}/reduction/kernel"]
      )
    for j in range(depth):
      b, o = f"layers.{s}.blocks.{j}", f"block{first + j}"
      w.norm(f"{o}/norm1", f"{b}.norm1")
      w.norm(f"{o}/norm2", f"{b}.norm2")
      w.sd[f"{b}.attn.relative_position_bias_table"] = w.f[f"{o}/relative_position_bias"]
      w.qkv(f"{o}/attention", f"{b}.attn.qkv")
      w.linear(f"{o}/attention/out", f"{b}.attn.proj")
      w.linear(f"{o}/mlp/fc1", f"{b}.mlp.fc1")
      w.linear(f"{o}/mlp/fc2", f"{b}.mlp.fc2")
  w.norm("encoder_norm", "norm")
  num_classes = 0
  if "head/kernel" in w.f:
    w.linear("head", "head.fc")
    num_classes = int(np.shape(w.f["head/kernel"])[1])
  sd = w.state_dict()
  model_args = dict(
    img_size=int(size),
    patch_size=spec.patch_size,
    in_chans=int(kernel.shape[2]),
    num_classes=num_classes,
    global_pool="avg",
    embed_dim=spec.width,
    depths=list(spec.stage_depths),
    num_heads=[spec.num_heads * 2**s for s in range(len(spec.stage_depths))],
    window_size=spec.window_size,
    mlp_ratio=spec.mlp_dim / spec.width,
    qkv_bias=True,
    drop_path_rate=0.0,
  )
  return sd, model_args
