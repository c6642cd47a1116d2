"""timm XCiTs <-> laplax XCiTs (``timm.models.xcit``).

The same weights give the same logits: a timm ``Xcit`` (El-Nouby et al.
2021) in ``eval()`` mode and the laplax :class:`~laplax.models.xcit.XCiT`
built from :func:`model_keys` compute the same function. What maps to what
(``i`` an XCA block, ``j`` a class-attention block, ``L`` the XCA blocks,
``e`` a convolution of the patch embedding at ``patch_embed.proj.{2e}``):

==============================================  ================================================
timm ``state_dict``                             laplax parameters
==============================================  ================================================
``patch_embed.proj.{2e}.0``                     ``embedding{e}`` (``embedding`` for e = 0)
``patch_embed.proj.{2e}.1``                     ``embedding{e}_bn`` (``scale, bias, mean, var``)
``pos_embed.token_projection``                  ``pos_embedding`` (a 1 x 1 conv: a Dense)
``blocks.i.norm1``, ``norm3``, ``norm2``        ``block{i}/norm1``, ``norm3``, ``norm2``
``blocks.i.attn.qkv``                           ``block{i}/attention/{query,key,value}``
``blocks.i.attn.temperature [h, 1, 1]``         ``block{i}/attention/temperature [h]``
``blocks.i.attn.proj``                          ``block{i}/attention/out``
``blocks.i.local_mp.conv1``, ``bn``, ``conv2``  ``block{i}/lpi/conv1``, ``bn``, ``conv2``
``blocks.i.gamma1``, ``gamma3``, ``gamma2``     ``block{i}/ls1``, ``ls3``, ``ls2`` ``scale``
``blocks.i.mlp.fc1``, ``fc2``                   ``block{i}/mlp/fc1``, ``fc2``
``cls_token``                                   ``cls``
``cls_attn_blocks.j.attn.q``, ``k``, ``v``      ``block{L+j}/attention/{query,key,value}``
``cls_attn_blocks.j.*`` (the rest)              ``block{L+j}/*`` as an XCA block's
``norm``, ``head``                              ``encoder_norm``, ``head``
==============================================  ================================================

PyTorch ``Linear`` weights are ``[out, in]``, laplax kernels ``[in, out]``;
convolutions OIHW -> HWIO (the depthwise ones ``[C, 1, 3, 3] -> [3, 3, 1,
C]``). A BatchNorm's ``running_mean`` and ``running_var`` are the laplax
BatchNorm's ``mean`` and ``var`` parameters; its ``num_batches_tracked``
(a training counter ``eval()`` never reads) is not kept, and ``--to timm``
writes it as 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from laplax.convert import common, support
from laplax.convert.common import ConvertError
from laplax.convert.support import ANY

#: The model options timm's Xcit expresses (:mod:`laplax.convert.support`;
#: any other option only at its default): its patch sizes 8 and 16, the exact
#: GELU, LayerScale, the class-attention layers, the token norm, the position
#: encoding switch, drop-path.
SUPPORT = {
  **support.EVERYWHERE,
  **support.EXPORTED,
  **support.LAPLAX_ONLY,
  "patch_size": (8, 16),
  "mlp_activation": ("gelu_exact",),
  "layerscale_init": ANY,
  "cls_attn_layers": ANY,
  "tokens_norm": ANY,
  "use_pos_embed": ANY,
  "drop_path": ANY,
}
#: How refusals name the target.
NAME = "timm's Xcit"
#: The class ``--to timm`` writes (``timm_config.json``'s ``timm_class``).
TIMM_CLASS = "Xcit"
#: The timm module that defines :data:`TIMM_CLASS` (``--to timm`` rebuilds it).
TIMM_MODULE = "timm.models.xcit"
#: ``--weights`` in the authors' release layout convert (timm's
#: ``checkpoint_filter_fn``, :func:`laplax.convert.timm_vit.timm_layout`).
RELEASE_LAYOUTS = True
#: The laplax family (``config.model.name``) it converts.
FAMILY = "xcit"
#: timm model names (``--model``) of that class: their prefixes.
MODEL_PREFIXES = ("xcit",)
#: The config file (under ``configs/``) of ``--from timm --model xcit_*`` without ``--config``.
DEFAULT_CONFIG = "xcit_imagenet.py"
#: The BatchNorm tensors and the laplax parameters they become.
BN_NAMES = (("weight", "scale"), ("bias", "bias"), ("running_mean", "mean"), ("running_var", "var"))


def architecture(model) -> dict:
  """The sizes of a timm ``Xcit`` that laplax's XCiT can express.

  Raises:
    ConvertError: not an ``Xcit``, or a feature laplax's XCiT lacks (mean
      pooling, no class-attention blocks, a patch size other than 8 or 16,
      bias-free qkv, an activation other than the exact GELU, LayerNorms or
      BatchNorms of other eps, another Fourier encoding, ...), named.
  """
  if type(model).__name__ != TIMM_CLASS:
    raise ConvertError(f"{type(model).__name__} is not a timm Xcit")
  blocks = list(model.blocks)
  ca = list(model.cls_attn_blocks or [])
  embed = list(model.patch_embed.proj)  # (conv, BatchNorm) pairs with activations between
  convs = [m for m in embed if type(m).__name__ == "Sequential"]
  acts = [m for m in embed if m not in convs] + [b.mlp.act for b in blocks + ca]
  acts = {type(m).__name__ + getattr(m, "approximate", "") for m in acts}
  acts |= {
    type(b.local_mp.act).__name__ + getattr(b.local_mp.act, "approximate", "") for b in blocks
  }
  ln_eps = {float(m.eps) for m in model.modules() if type(m).__name__ == "LayerNorm"}
  bns = [m for m in model.modules() if "BatchNorm" in type(m).__name__]
  pos = model.pos_embed
  checks = [
    (model.global_pool == "token", f"global_pool={model.global_pool!r}"),
    (len(ca) >= 1, "no class-attention blocks"),
    (model.patch_embed.patch_size in (8, 16), f"patch size {model.patch_embed.patch_size}"),
    (all(b.attn.qkv.bias is not None for b in blocks), "qkv_bias=False"),
    (all(b.attn.q.bias is not None for b in ca), "qkv_bias=False"),
    (acts == {"GELUnone"}, f"the activations {sorted(acts)}"),
    (len(ln_eps) == 1, "LayerNorms of different eps"),
    (all(abs(m.eps - 1e-5) < 1e-12 and m.affine for m in bns), "BatchNorms of another eps"),
    (all(b.local_mp.conv1.kernel_size == (3, 3) for b in blocks), "an LPI kernel other than 3"),
    (all(hasattr(b.gamma1, "shape") for b in ca), "eta=None"),
    (
      pos is None or (pos.hidden_dim == 32 and pos.temperature == 10000),
      "a Fourier encoding other than hidden_dim=32, temperature=10000",
    ),
    (len({b.tokens_norm for b in ca}) == 1, "class-attention blocks of different tokens_norm"),
  ]
  for ok, what in checks:
    if not ok:
      raise ConvertError(f"this timm Xcit has {what}, which laplax's XCiT has not")
  img = model.patch_embed.img_size
  return dict(
    embed_dim=model.embed_dim,
    depth=len(blocks),
    cls_attn_layers=len(ca),
    num_heads=blocks[0].attn.num_heads,
    mlp_dim=blocks[0].mlp.fc1.out_features,
    patch_size=int(model.patch_embed.patch_size),
    patch_widths=tuple(s[0].out_channels for s in convs),
    img_size=(int(img[0]), int(img[1])),
    in_chans=convs[0][0].in_channels,
    num_classes=model.num_classes,
    tokens_norm=bool(ca[0].tokens_norm),
    use_pos_embed=pos is not None,
    norm_eps=next(iter(ln_eps)),
  )


def model_keys(arch: Mapping) -> dict:
  """The laplax ``config.model`` keys of a timm XCiT :func:`architecture`."""
  return dict(
    name="xcit",
    width=arch["embed_dim"],
    depth=arch["depth"] + arch["cls_attn_layers"],
    cls_attn_layers=arch["cls_attn_layers"],
    num_heads=arch["num_heads"],
    mlp_dim=arch["mlp_dim"],
    patch_size=arch["patch_size"],
    tokens_norm=arch["tokens_norm"],
    use_pos_embed=arch["use_pos_embed"],
    qk_norm=False,
    use_bias=True,
    mlp_activation="gelu_exact",
    norm="layernorm",
    norm_eps=arch["norm_eps"],
  )


def _patch_names(n: int) -> list[tuple[str, str]]:
  """``(timm prefix, laplax name)`` of the patch embedding's ``n`` convolutions."""
  return [(f"patch_embed.proj.{2 * e}", f"embedding{e or ''}") for e in range(n)]


def timm_to_laplax(state: Mapping[str, np.ndarray], arch: Mapping) -> dict:
  """A timm XCiT ``state_dict`` (NumPy) -> laplax parameters.

  Raises:
    ConvertError: a tensor missing or of the wrong shape, or one left over (named).
  """
  r = common.TimmReader(state, ignored={k for k in state if k.endswith(".num_batches_tracked")})

  def batch_norm(src, dst, d):
    for t, l in BN_NAMES:
      r.out[f"{dst}/{l}"] = r.take(f"{src}.{t}", (d,))

  d, hidden, heads = arch["embed_dim"], arch["mlp_dim"], arch["num_heads"]
  c_in = arch["in_chans"]
  for (src, dst), width in zip(_patch_names(len(arch["patch_widths"])), arch["patch_widths"]):
    r.conv(f"{src}.0", dst, (width, c_in, 3, 3), bias=False)
    batch_norm(f"{src}.1", f"{dst}_bn", width)
    c_in = width
  if arch["use_pos_embed"]:
    w = r.take("pos_embed.token_projection.weight", (d, 64, 1, 1))
    r.out["pos_embedding/kernel"] = common.transpose(w[:, :, 0, 0])
    r.out["pos_embedding/bias"] = r.take("pos_embed.token_projection.bias", (d,))
  r.out["cls"] = r.take("cls_token", (1, 1, d))
  for i in range(arch["depth"]):
    b, o = f"blocks.{i}", f"block{i}"
    for n in ("norm1", "norm3", "norm2"):
      r.norm(f"{b}.{n}", f"{o}/{n}", d)
    r.qkv(f"{b}.attn.qkv", f"{o}/attention", d)
    temperature = r.take(f"{b}.attn.temperature", (heads, 1, 1))
    r.out[f"{o}/attention/temperature"] = temperature.reshape(heads)
    r.linear(f"{b}.attn.proj", f"{o}/attention/out", d, d)
    r.conv(f"{b}.local_mp.conv1", f"{o}/lpi/conv1", (d, 1, 3, 3))
    batch_norm(f"{b}.local_mp.bn", f"{o}/lpi/bn", d)
    r.conv(f"{b}.local_mp.conv2", f"{o}/lpi/conv2", (d, 1, 3, 3))
    for g, ls in (("gamma1", "ls1"), ("gamma3", "ls3"), ("gamma2", "ls2")):
      r.out[f"{o}/{ls}/scale"] = r.take(f"{b}.{g}", (d,))
    r.linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
    r.linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
  for j in range(arch["cls_attn_layers"]):
    b, o = f"cls_attn_blocks.{j}", f"block{arch['depth'] + j}"
    for n in ("norm1", "norm2"):
      r.norm(f"{b}.{n}", f"{o}/{n}", d)
    for t, name in (("q", "query"), ("k", "key"), ("v", "value"), ("proj", "out")):
      r.linear(f"{b}.attn.{t}", f"{o}/attention/{name}", d, d)
    for g, ls in (("gamma1", "ls1"), ("gamma2", "ls2")):
      r.out[f"{o}/{ls}/scale"] = r.take(f"{b}.{g}", (d,))
    r.linear(f"{b}.mlp.fc1", f"{o}/mlp/fc1", d, hidden)
    r.linear(f"{b}.mlp.fc2", f"{o}/mlp/fc2", hidden, d)
  r.norm("norm", "encoder_norm", d)
  if arch["num_classes"]:
    r.linear("head", "head", d, arch["num_classes"])
  return r.params()


def laplax_to_timm(params: Mapping, spec, config=None) -> tuple[dict, dict]:
  """laplax XCiT parameters -> ``(state_dict, model_args)``: a timm
  ``Xcit(**model_args)`` loads ``state_dict`` (NumPy float32, PyTorch names
  and layouts; the BatchNorms' ``num_batches_tracked`` int64 0) with
  ``strict=True``.

  Raises:
    ConvertError: a laplax option timm's Xcit lacks (every option whose value
      :data:`SUPPORT` does not admit: a
      patch size other than 8 or 16, another GELU, another LayerNorm eps, ...).
  """
  common.refuse_unsupported(spec, SUPPORT, NAME, "this workdir cannot be written as timm")
  w = common.TimmWriter(params)
  f, sd = w.f, w.sd
  counters = []

  def batch_norm(src, dst):
    for t, l in BN_NAMES:
      sd[f"{dst}.{t}"] = f[f"{src}/{l}"]
    counters.append(f"{dst}.num_batches_tracked")

  for src, dst in _patch_names(len(spec.patch_widths())):
    w.conv(dst, f"{src}.0", bias=False)
    batch_norm(f"{dst}_bn", f"{src}.1")
  if spec.use_pos_embed:
    sd["pos_embed.token_projection.weight"] = common.transpose(f["pos_embedding/kernel"])[
      :, :, None, None
    ]
    sd["pos_embed.token_projection.bias"] = f["pos_embedding/bias"]
  sd["cls_token"] = f["cls"]
  for i in range(spec.xca_depth):
    b, o, a = f"blocks.{i}", f"block{i}", f"block{i}/attention"
    for n in ("norm1", "norm3", "norm2"):
      w.norm(f"{o}/{n}", f"{b}.{n}")
    w.qkv(a, f"{b}.attn.qkv")
    sd[f"{b}.attn.temperature"] = np.asarray(f[f"{a}/temperature"]).reshape(-1, 1, 1)
    w.linear(f"{a}/out", f"{b}.attn.proj")
    w.conv(f"{o}/lpi/conv1", f"{b}.local_mp.conv1")
    batch_norm(f"{o}/lpi/bn", f"{b}.local_mp.bn")
    w.conv(f"{o}/lpi/conv2", f"{b}.local_mp.conv2")
    for g, ls in (("gamma1", "ls1"), ("gamma3", "ls3"), ("gamma2", "ls2")):
      sd[f"{b}.{g}"] = f[f"{o}/{ls}/scale"]
    w.linear(f"{o}/mlp/fc1", f"{b}.mlp.fc1")
    w.linear(f"{o}/mlp/fc2", f"{b}.mlp.fc2")
  for j in range(spec.cls_attn_layers):
    b, o = f"cls_attn_blocks.{j}", f"block{spec.xca_depth + j}"
    for n in ("norm1", "norm2"):
      w.norm(f"{o}/{n}", f"{b}.{n}")
    for t, name in (("q", "query"), ("k", "key"), ("v", "value"), ("proj", "out")):
      w.linear(f"{o}/attention/{name}", f"{b}.attn.{t}")
    for g, ls in (("gamma1", "ls1"), ("gamma2", "ls2")):
      sd[f"{b}.{g}"] = f[f"{o}/{ls}/scale"]
    w.linear(f"{o}/mlp/fc1", f"{b}.mlp.fc1")
    w.linear(f"{o}/mlp/fc2", f"{b}.mlp.fc2")
  w.norm("encoder_norm", "norm")
  num_classes = 0
  if "head/kernel" in f:
    w.linear("head", "head")
    num_classes = int(np.shape(f["head/kernel"])[1])
  sd = w.state_dict()
  sd.update({k: np.zeros((), np.int64) for k in counters})
  size = config.data.image_size if config is not None and "image_size" in config.data else None
  p = spec.patch_size
  model_args = dict(
    # timm only asserts that the patch divides img_size; any image size runs.
    img_size=-(-int(size) // p) * p if size else 224,
    patch_size=spec.patch_size,
    in_chans=int(np.shape(f["embedding/kernel"])[2]),
    num_classes=num_classes,
    embed_dim=spec.width,
    depth=spec.xca_depth,
    num_heads=spec.num_heads,
    mlp_ratio=spec.mlp_dim / spec.width,
    qkv_bias=True,
    cls_attn_layers=spec.cls_attn_layers,
    use_pos_embed=spec.use_pos_embed,
    eta=spec.layerscale_init,
    tokens_norm=spec.tokens_norm,
  )
  return sd, model_args
