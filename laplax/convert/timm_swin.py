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

from laplax.convert import common
from laplax.convert.common import ConvertError

#: The converter target of the spec fields' ``convert`` metadata.
TARGET = "timm-swin"
#: How refusals name the target.
NAME = "timm's SwinTransformer"
#: The class ``--to timm`` writes (``timm_config.json``'s ``timm_class``).
TIMM_CLASS = "SwinTransformer"


def _t(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x).T)


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
  state = {k: np.asarray(v, np.float32) for k, v in state.items()}
  used = set()

  def take(name, shape):
    if name not in state:
      raise ConvertError(f"the timm weights lack tensor {name}")
    used.add(name)
    value = state[name]
    if tuple(value.shape) != tuple(shape):
      raise ConvertError(
        f"timm tensor {name} has shape {tuple(value.shape)}; this architecture needs {tuple(shape)}"
      )
    return value

  def norm(src, dst, d):
    out[f"{dst}/scale"], out[f"{dst}/bias"] = take(f"{src}.weight", (d,)), take(f"{src}.bias", (d,))

  def linear(src, dst, n_in, n_out):
    out[f"{dst}/kernel"] = _t(take(f"{src}.weight", (n_out, n_in)))
    out[f"{dst}/bias"] = take(f"{src}.bias", (n_out,))

  d0, c, p = arch["embed_dim"], arch["in_chans"], arch["patch_size"]
  grid = (arch["img_size"][0] // p, arch["img_size"][1] // p)
  windows = _stage_windows(arch["stage_depths"], arch["window_size"], grid)
  out = {
    "embedding/kernel": take("patch_embed.proj.weight", (d0, c, p, p)).transpose(2, 3, 1, 0),
    "embedding/bias": take("patch_embed.proj.bias", (d0,)),
  }
  norm("patch_embed.norm", "embedding_norm", d0)
  i = 0
  for s, depth in enumerate(arch["stage_depths"]):
    d, heads, hidden = d0 * 2**s, arch["num_heads"] * 2**s, arch["mlp_dim"] * 2**s
    wh, ww = windows[s]
    if s:
      norm(f"layers.{s}.downsample.norm", f"merge{s}/norm", 2 * d)
      out[f"merge{s}/reduction/kernel"] = _t(
        take(f"layers.{s}.downsample.reduction.weight", (d, 2 * d))
      )
    for j in range(depth):
      b, o = f"layers.{s}.blocks.{j}", f"block{i}"
      norm(f"{b}.norm1", f"{o}/norm1", d)
      norm(f"{b}.norm2", f"{o}/norm2", d)
      out[f"{o}/relative_position_bias"] = take(
        f"{b}.attn.relative_position_bias_table", ((2 * wh - 1) * (2 * ww - 1), heads)
      )
      w = _t(take(f"{b}.attn.qkv.weight", (3 * d, d)))
      bias = take(f"{b}.attn.qkv.bias", (3 * d,))
      for k, name in enumerate(("query", "key", "value")):
        out[f"{o}/attention/{name}/kernel"] = np.ascontiguousarray(w[:, k * d : (k + 1) * d])
        out[f"{o}/attention/{name}/bias"] = bias[k * d : (k + 1) * d]
      linear(f"{b}.attn.proj", f"{o}/attention/out", d, d)
      linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
      linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
      i += 1
  norm("norm", "encoder_norm", d)
  if arch["num_classes"]:
    linear("head.fc", "head", d, arch["num_classes"])
  left = sorted(set(state) - used)
  if left:
    raise ConvertError(
      f"the timm weights have tensor {left[0]}, which this "
      f"architecture has not" + (f" ({len(left)} such)" if len(left) > 1 else "")
    )
  return common.nested(out)


def laplax_to_timm(params: Mapping, spec, config=None) -> tuple[dict, dict]:
  """laplax Swin parameters -> ``(state_dict, model_args)``: a timm
  ``SwinTransformer(**model_args)`` loads ``state_dict`` (NumPy float32,
  PyTorch names and layouts) with ``strict=True``. The image size is
  ``config.data.image_size`` (the relative position tables are sized for it).

  Raises:
    ConvertError: a laplax option timm's Swin lacks (every spec field whose
      ``convert`` metadata does not admit its value for ``"timm-swin"``:
      LayerScale, qk-norm, another GELU or norm eps, ...), or no image size.
  """
  common.refuse_unsupported(spec, TARGET, NAME, "this workdir cannot be written as timm")
  size = config.data.get("image_size") if config is not None else None
  if not size:
    raise ConvertError(
      "a Swin's timm img_size is config.data.image_size, which this run's config lacks; set it"
    )
  f = common.flat(params)
  kernel = np.asarray(f["embedding/kernel"])
  sd = {
    "patch_embed.proj.weight": kernel.transpose(3, 2, 0, 1),
    "patch_embed.proj.bias": f["embedding/bias"],
    "patch_embed.norm.weight": f["embedding_norm/scale"],
    "patch_embed.norm.bias": f["embedding_norm/bias"],
  }
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    if s:
      sd[f"layers.{s}.downsample.norm.weight"] = f[f"merge{s}/norm/scale"]
      sd[f"layers.{s}.downsample.norm.bias"] = f[f"merge{s}/norm/bias"]
      sd[f"layers.{s}.downsample.reduction.weight"] = _t(f[f"merge{s}/reduction/kernel"])
    for j in range(depth):
      b, o = f"layers.{s}.blocks.{j}", f"block{first + j}"
      for n in ("norm1", "norm2"):
        sd[f"{b}.{n}.weight"], sd[f"{b}.{n}.bias"] = f[f"{o}/{n}/scale"], f[f"{o}/{n}/bias"]
      sd[f"{b}.attn.relative_position_bias_table"] = f[f"{o}/relative_position_bias"]
      a = f"{o}/attention"
      names = ("query", "key", "value")
      sd[f"{b}.attn.qkv.weight"] = np.concatenate([_t(f[f"{a}/{n}/kernel"]) for n in names], 0)
      sd[f"{b}.attn.qkv.bias"] = np.concatenate([f[f"{a}/{n}/bias"] for n in names])
      sd[f"{b}.attn.proj.weight"], sd[f"{b}.attn.proj.bias"] = (
        _t(f[f"{a}/out/kernel"]),
        f[f"{a}/out/bias"],
      )
      for n in ("fc1", "fc2"):
        sd[f"{b}.mlp.{n}.weight"] = _t(f[f"{o}/mlp/{n}/kernel"])
        sd[f"{b}.mlp.{n}.bias"] = f[f"{o}/mlp/{n}/bias"]
  sd["norm.weight"], sd["norm.bias"] = f["encoder_norm/scale"], f["encoder_norm/bias"]
  num_classes = 0
  if "head/kernel" in f:
    sd["head.fc.weight"], sd["head.fc.bias"] = _t(f["head/kernel"]), f["head/bias"]
    num_classes = int(np.shape(f["head/kernel"])[1])
  sd = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}
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
