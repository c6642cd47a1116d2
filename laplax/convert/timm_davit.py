"""timm DaViTs <-> laplax DaViTs (``timm.models.davit``).

The same weights give the same logits: a timm ``DaVit`` (Ding et al. 2022)
and the laplax :class:`~laplax.models.davit.DaViT` built from
:func:`model_keys` compute the same function. What maps to what (``s`` a
stage, ``j`` a dual block of it, ``t`` 0 (spatial) or 1 (channel), ``i`` the
attention block's number over all stages):

=============================================  ==================================
timm ``state_dict``                            laplax parameters
=============================================  ==================================
``stem.conv``, ``stem.norm``                   ``embedding`` (OIHW -> HWIO), ``embedding_norm``
``stages.s.downsample.norm``, ``.conv``        ``downsample{s}_norm``, ``downsample{s}``
``stages.s.blocks.j.t.cpe1.proj``, ``cpe2``    ``block{i}/cpe1/proj``, ``cpe2/proj``
``stages.s.blocks.j.t.norm1``, ``norm2``       ``block{i}/norm1``, ``norm2``
``...attn.qkv``                                ``block{i}/attention/{query,key,value}``
``...attn.proj``                               ``block{i}/attention/out``
``...mlp.fc1``, ``fc2``                        ``block{i}/mlp/fc1``, ``fc2``
``head.norm``, ``head.fc``                     ``encoder_norm``, ``head``
=============================================  ==================================

PyTorch ``Linear`` weights are ``[out, in]``, laplax kernels ``[in, out]``;
convolutions OIHW -> HWIO (the depthwise ones ``[C, 1, 3, 3] -> [3, 3, 1, C]``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from laplax.convert import common, support
from laplax.convert.common import ConvertError
from laplax.convert.support import ANY

#: The model options timm's DaVit expresses (:mod:`laplax.convert.support`;
#: any other option only at its default): the exact GELU, drop-path.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "mlp_activation": ("gelu_exact",),
  "drop_path": ANY,
}
#: How refusals name the target.
NAME = "timm's DaVit"
#: The class ``--to timm`` writes (``timm_config.json``'s ``timm_class``).
TIMM_CLASS = "DaVit"
#: The timm module that defines :data:`TIMM_CLASS` (``--to timm`` rebuilds it).
TIMM_MODULE = "timm.models.davit"
#: ``--weights`` in the authors' release layout convert (timm's
#: ``checkpoint_filter_fn``, :func:`laplax.convert.timm_vit.timm_layout`).
RELEASE_LAYOUTS = True
#: The laplax family (``config.model.name``) it converts.
FAMILY = "davit"
#: timm model names (``--model``) of that class: their prefixes.
MODEL_PREFIXES = ("davit",)
#: The config file (under ``configs/``) of ``--from timm --model davit_*`` without ``--config``.
DEFAULT_CONFIG = "davit_imagenet.py"


def architecture(model) -> dict:
  """The sizes of a timm ``DaVit`` that laplax's DaViT can express.

  Raises:
    ConvertError: not a ``DaVit``, or a feature laplax's DaViT lacks (widths
      or heads that do not double per stage, MLP ratios that differ, the
      ``ChannelAttentionV2`` of Florence-2, an activation in the position
      encodings, attention types other than (spatial, channel), no FFN, a
      downsampling kernel other than 2, the head's norm first, ...), named.
  """
  if type(model).__name__ != TIMM_CLASS:
    raise ConvertError(f"{type(model).__name__} is not a timm DaVit")
  stages = list(model.stages)
  blocks = [b for st in stages for dual in st.blocks for b in dual]
  kinds = [type(b).__name__ for dual in stages[0].blocks for b in dual][:2]
  dims = [st.blocks[0][0].dim for st in stages]
  heads = [st.blocks[0][0].num_heads for st in stages]
  mlp = [st.blocks[0][0].mlp.fc1.out_features for st in stages]
  acts = {type(b.mlp.act).__name__ + getattr(b.mlp.act, "approximate", "") for b in blocks}
  cpe = [m for b in blocks for m in (b.cpe1, b.cpe2)]
  downs = [st.downsample for st in stages[1:]]
  eps = {float(m.eps) for m in model.modules() if "LayerNorm" in type(m).__name__}
  checks = [
    (kinds == ["SpatialBlock", "ChannelBlock"], f"attention types {kinds}"),
    (all(type(b.attn).__name__ != "ChannelAttentionV2" for b in blocks), "ChannelAttentionV2"),
    (all(h == heads[0] * 2**s for s, h in enumerate(heads)), f"heads {heads} not doubling"),
    (all(d == dims[0] * 2**s for s, d in enumerate(dims)), f"widths {dims} not doubling"),
    (all(m == mlp[0] * 2**s for s, m in enumerate(mlp)), f"MLP sizes {mlp} not doubling"),
    (all(b.attn.qkv.bias is not None for b in blocks), "qkv_bias=False"),
    (acts == {"GELUnone"}, f"the activations {sorted(acts)}"),
    (all(type(m.act).__name__ == "Identity" for m in cpe), "cpe_act=True"),
    (all(d.conv.kernel_size == (2, 2) for d in downs), "a down_kernel_size other than 2"),
    (type(model.norm_pre).__name__ == "Identity", "head_norm_first=True"),
    (model.head.global_pool.pool_type == "avg", "a pooling other than the mean"),
    (type(model.head.pre_logits).__name__ == "Identity", "a head MLP (head_hidden_size)"),
    (len(eps) == 1, "LayerNorms of different eps"),
  ]
  for ok, what in checks:
    if not ok:
      raise ConvertError(f"this timm DaVit has {what}, which laplax's DaViT has not")
  window = blocks[0].window_size
  if window[0] != window[1]:
    raise ConvertError(f"window {window} is not square; laplax's DaViT windows are square")
  return dict(
    embed_dim=dims[0],
    stage_depths=tuple(len(st.blocks) for st in stages),
    num_heads=heads[0],
    mlp_dim=mlp[0],
    window_size=int(window[0]),
    in_chans=model.stem.conv.in_channels,
    num_classes=model.num_classes,
    norm_eps=next(iter(eps)),
    img_size=(224, 224),  # any size runs; --from timm keeps the config's
  )


def model_keys(arch: Mapping) -> dict:
  """The laplax ``config.model`` keys of a timm DaViT :func:`architecture`."""
  return dict(
    name="davit",
    width=arch["embed_dim"],
    depth=2 * sum(arch["stage_depths"]),
    stage_depths=tuple(arch["stage_depths"]),
    num_heads=arch["num_heads"],
    mlp_dim=arch["mlp_dim"],
    window_size=arch["window_size"],
    qk_norm=False,
    layerscale_init=None,
    use_bias=True,
    mlp_activation="gelu_exact",
    norm="layernorm",
    norm_eps=arch["norm_eps"],
  )


def _block_names(stage_depths):
  """``(timm prefix, laplax block name)`` of every attention block."""
  out, i = [], 0
  for s, depth in enumerate(stage_depths):
    for j in range(depth):
      for t in range(2):
        out.append((s, f"stages.{s}.blocks.{j}.{t}", f"block{i}"))
        i += 1
  return out


def timm_to_laplax(state: Mapping[str, np.ndarray], arch: Mapping) -> dict:
  """A timm DaViT ``state_dict`` (NumPy) -> laplax parameters.

  Raises:
    ConvertError: a tensor missing or of the wrong shape, or one left over (named).
  """
  r = common.TimmReader(state)
  d0, c = arch["embed_dim"], arch["in_chans"]
  r.conv("stem.conv", "embedding", (d0, c, 7, 7))
  r.norm("stem.norm", "embedding_norm", d0)
  for s in range(1, len(arch["stage_depths"])):
    d = d0 * 2**s
    r.norm(f"stages.{s}.downsample.norm", f"downsample{s}_norm", d // 2)
    r.conv(f"stages.{s}.downsample.conv", f"downsample{s}", (d, d // 2, 2, 2))
  for s, b, o in _block_names(arch["stage_depths"]):
    d, hidden = d0 * 2**s, arch["mlp_dim"] * 2**s
    for n in ("cpe1", "cpe2"):
      r.conv(f"{b}.{n}.proj", f"{o}/{n}/proj", (d, 1, 3, 3))
    r.norm(f"{b}.norm1", f"{o}/norm1", d)
    r.norm(f"{b}.norm2", f"{o}/norm2", d)
    r.qkv(f"{b}.attn.qkv", f"{o}/attention", d)
    r.linear(f"{b}.attn.proj", f"{o}/attention/out", d, d)
    r.linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
    r.linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
  d = d0 * 2 ** (len(arch["stage_depths"]) - 1)
  r.norm("head.norm", "encoder_norm", d)
  if arch["num_classes"]:
    r.linear("head.fc", "head", d, arch["num_classes"])
  return r.params()


def laplax_to_timm(params: Mapping, spec, config=None) -> tuple[dict, dict]:
  """laplax DaViT parameters -> ``(state_dict, model_args)``: a timm
  ``DaVit(**model_args)`` loads ``state_dict`` (NumPy float32, PyTorch names
  and layouts) with ``strict=True``.

  Raises:
    ConvertError: a laplax option timm's DaVit lacks (every option whose value
      :data:`SUPPORT` does not admit:
      LayerScale, qk-norm, another GELU, ...).
  """
  del config  # DaViT runs at any image size
  common.refuse_unsupported(spec, SUPPORT, NAME, "this workdir cannot be written as timm")
  w = common.TimmWriter(params)
  w.conv("embedding", "stem.conv")
  w.norm("embedding_norm", "stem.norm")
  for s, b, o in _block_names(spec.stage_depths):
    if s and f"stages.{s}.downsample.norm.weight" not in w.sd:
      w.norm(f"downsample{s}_norm", f"stages.{s}.downsample.norm")
      w.conv(f"downsample{s}", f"stages.{s}.downsample.conv")
    for n in ("cpe1", "cpe2"):
      w.conv(f"{o}/{n}/proj", f"{b}.{n}.proj")
    w.norm(f"{o}/norm1", f"{b}.norm1")
    w.qkv(f"{o}/attention", f"{b}.attn.qkv")
    w.linear(f"{o}/attention/out", f"{b}.attn.proj")
    w.norm(f"{o}/norm2", f"{b}.norm2")
    w.linear(f"{o}/mlp/fc1", f"{b}.mlp.fc1")
    w.linear(f"{o}/mlp/fc2", f"{b}.mlp.fc2")
  w.norm("encoder_norm", "head.norm")
  num_classes = 0
  if "head/kernel" in w.f:
    w.linear("head", "head.fc")
    num_classes = int(np.shape(w.f["head/kernel"])[1])
  sd, f = w.state_dict(), w.f
  stages = range(len(spec.stage_depths))
  model_args = dict(
    in_chans=int(np.shape(f["embedding/kernel"])[2]),
    num_classes=num_classes,
    depths=list(spec.stage_depths),
    embed_dims=[spec.width * 2**s for s in stages],
    num_heads=[spec.num_heads * 2**s for s in stages],
    window_size=spec.window_size,
    mlp_ratio=spec.mlp_dim / spec.width,
    qkv_bias=True,
    norm_eps=spec.norm_eps,
    drop_path_rate=0.0,
  )
  return sd, model_args
