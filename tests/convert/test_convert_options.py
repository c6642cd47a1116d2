"""The converters fail closed: what each target supports is the converter's own table.

Each converter (``--to/--from timm``, ``hf-gpt2``, ``nanochat`` and the
PyTorch peer of ``bench/``) refuses, in one line naming ``model.KEY=VALUE``,
every option whose value its module's ``SUPPORT`` table does not admit
(:func:`laplax.convert.support.unsupported`). A spec field added here (a
subclass of the spec, as a new field of ``laplax/models/spec.py`` would be)
with a value other than its default is refused by every converter until
that converter's table lists it, and accepted at its default; the tables
reproduce the refusal lists the converters kept by hand before, and the
model specs name no converter.
"""

import dataclasses
import importlib.util
import os

import pytest

from laplax.convert import (
  common,
  hf_bert,
  hf_gpt2,
  hf_nystromformer,
  nanochat,
  support,
  timm_davit,
  timm_swin,
  timm_vit,
  timm_xcit,
)
from laplax.models import spec as spec_lib
from laplax.models.gpt import GPTSpec
from laplax.models.vit import ViTSpec

from helpers.configs import load

NEW = "new_option"


def _with_new_field(cls, source=False):
  """``cls`` with one more field ``new_option`` (float, default 0.0, a config
  key) that declares no converter target (``source``: reset by ``--from``)."""
  meta = {"check": "float", "key": None, **({"source": True} if source else {})}
  return dataclasses.make_dataclass(
    f"New{cls.__name__}",
    [(NEW, float, dataclasses.field(default=0.0, metadata=meta))],
    bases=(cls,),
    frozen=True,
    kw_only=True,
  )


@pytest.fixture
def new_field(monkeypatch):
  """``config.model.new_option`` is a field of both families' specs."""
  monkeypatch.setattr(
    spec_lib,
    "FAMILIES",
    {"vit": _with_new_field(ViTSpec), "gpt": _with_new_field(GPTSpec)},
  )


def _nanochat_spec(**model):
  c = load("gpt_d20")
  c.model.update(width=64, depth=2, num_heads=2, mlp_dim=256, max_length=32, num_laplacian_heads=1)
  c.model.update(model)
  return spec_lib.from_config(c.model)


def _one_line(exc_info, *words):
  message = str(exc_info.value)
  assert "\n" not in message and all(w in message for w in words), message


def test_a_new_spec_field_is_refused_by_every_converter_unless_default(new_field):
  vit = spec_lib.build("vit", width=32, depth=2, num_heads=2, **{NEW: 0.5})
  gpt = spec_lib.build("gpt", width=32, depth=2, num_heads=2, **{NEW: 0.5})
  assert getattr(vit, NEW) == 0.5 and getattr(gpt, NEW) == 0.5
  with pytest.raises(common.ConvertError) as e:
    timm_vit.laplax_to_timm({}, vit)  # refused before any weight is read
  _one_line(e, "model.new_option=0.5", "timm", "0.0")
  with pytest.raises(common.ConvertError) as e:
    hf_gpt2._refuse_options(gpt)
  _one_line(e, "model.new_option=0.5", "GPT-2")
  with pytest.raises(common.ConvertError) as e:
    nanochat._refuse_options(_nanochat_spec(**{NEW: 0.5}))
  _one_line(e, "model.new_option=0.5", "nanochat")
  for module, spec in ((timm_vit, vit), (hf_gpt2, gpt), (nanochat, _nanochat_spec(**{NEW: 0.5}))):
    with pytest.raises(common.ConvertError, match="new_option=0.5"):  # --from too
      common.refuse_unsupported(spec, module.SUPPORT, "target", "fix", skip_source=True)
  # At its default the new field changes nothing a target computes: accepted.
  vit0 = spec_lib.build("vit", width=32, depth=2, num_heads=2)
  assert support.unsupported(vit0, timm_vit.SUPPORT) == []
  gpt0 = spec_lib.build("gpt", width=32, depth=2, num_heads=2)
  assert support.unsupported(gpt0, hf_gpt2.SUPPORT) == []
  assert support.unsupported(_nanochat_spec(), nanochat.SUPPORT) == []


def test_a_converters_own_table_decides_its_new_fields(new_field, monkeypatch):
  """Listing the new field in one converter's table lets that converter take
  it, at the values listed; every other converter still refuses it."""
  vit = spec_lib.build("vit", width=32, depth=2, num_heads=2, **{NEW: 0.5})
  gpt = spec_lib.build("gpt", width=32, depth=2, num_heads=2, **{NEW: 0.5})
  monkeypatch.setitem(timm_vit.SUPPORT, NEW, (0.0, 0.5))
  assert support.unsupported(vit, timm_vit.SUPPORT) == []
  common.refuse_unsupported(vit, timm_vit.SUPPORT, timm_vit.NAME, "fix")  # no refusal
  other = spec_lib.build("vit", width=32, depth=2, num_heads=2, **{NEW: 0.25})
  assert support.unsupported(other, timm_vit.SUPPORT) == [(NEW, "0.25", "0.0 or 0.5")]
  for module in (timm_swin, timm_davit, timm_xcit, hf_gpt2, hf_bert, hf_nystromformer, nanochat):
    assert NEW not in module.SUPPORT, module.__name__
    refused = support.unsupported(gpt, module.SUPPORT)
    assert (NEW, "0.5", "0.0") in refused, module.__name__


def _config_keys() -> set:
  """Every config key of every family's spec (the keys a table may list)."""
  keys = set()

  def walk(cls):
    for f in dataclasses.fields(cls):
      nested = f.metadata.get("nested")
      if nested:  # a sub-spec names its class (it may default to None)
        walk(nested if isinstance(nested, type) else f.default_factory)
      keys.add(f.metadata.get("key") or f.name)

  for cls in spec_lib.FAMILIES.values():
    walk(cls)
  return keys


def test_tables_list_only_spec_options_and_the_specs_name_no_converter():
  """A key in a converter's table that no spec has (a typo) would leave the
  option it meant refused: every key is a spec field's config key. The specs
  carry no converter support of their own (the tables alone decide)."""
  keys = _config_keys()
  modules = (timm_vit, timm_swin, timm_davit, timm_xcit, hf_gpt2, hf_bert, hf_nystromformer)
  tables = {m.__name__: m.SUPPORT for m in (*modules, nanochat)}
  if importlib.util.find_spec("torch") is not None:
    from bench import peer_torch

    tables.update({f"peer {family}": t for family, t in peer_torch.SUPPORT.items()})
  for name, table in tables.items():
    assert set(table) <= keys, (name, set(table) - keys)
  assert {"laplacian_mask", "spectral.enabled", "num_heads"} <= keys

  def walk(cls):
    for f in dataclasses.fields(cls):
      assert "convert" not in f.metadata, (cls.__name__, f.name)
      nested = f.metadata.get("nested")
      if nested:  # a sub-spec names its class (it may default to None)
        walk(nested if isinstance(nested, type) else f.default_factory)

  for cls in spec_lib.FAMILIES.values():
    walk(cls)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the peer is PyTorch")
def test_a_new_spec_field_is_refused_by_the_pytorch_peer(new_field):
  from bench import peer_torch

  for name in ("vit_fashion_mnist", "gpt_shakespeare"):
    config = load(name)
    config.model.num_laplacian_heads = 1
    peer_torch.check_supported(config)  # the default: accepted
    config.model[NEW] = 0.5
    with pytest.raises(ValueError) as e:
      peer_torch.check_supported(config)
    _one_line(e, "the PyTorch peer has no model.new_option=0.5")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the peer is PyTorch")
def test_the_pytorch_peer_refuses_a_family_it_has_no_table_for():
  from bench import peer_torch

  assert set(peer_torch.SUPPORT) == {"gpt", "vit"}
  with pytest.raises(ValueError) as e:
    peer_torch.check_supported(load("bert_cramming"))
  _one_line(e, "the PyTorch peer has no model.name='bert'", "'gpt' or 'vit'", "drop --peer")


def test_source_options_are_the_fields_marked_source(monkeypatch):
  """``--from`` resets the fields marked ``source`` (the Laplacian heads, their
  mix, spectral conditioning, the compute dtype) and a new one so marked."""
  assert common.SOURCE_OPTIONS == {
    "num_laplacian_heads": 0,
    "laplacian_mask": None,
    "laplacian_mix": "fixed",
    "spectral.enabled": False,
    "dtype": "float32",
  }
  monkeypatch.setattr(spec_lib, "FAMILIES", {"vit": _with_new_field(ViTSpec, True), "gpt": GPTSpec})
  assert support.source_options(spec_lib.FAMILIES["vit"])[NEW] == 0.0
  spec = spec_lib.build("vit", width=32, depth=2, num_heads=2, **{NEW: 0.5})
  assert [k for k, _, _ in support.unsupported(spec, timm_vit.SUPPORT)] == [NEW]
  assert support.unsupported(spec, timm_vit.SUPPORT, skip_source=True) == []


# (family, model keys, target, refused key or None): the refusal lists the
# converters kept by hand, now read from their tables.
CASES = [
  ("vit", dict(norm="rmsnorm"), "timm", "norm"),
  ("vit", dict(mlp_activation="relu2"), "timm", "mlp_activation"),
  ("vit", dict(use_bias=False), "timm", "use_bias"),
  ("vit", dict(qk_norm=True, qk_norm_type="rmsnorm"), "timm", "qk_norm_type"),
  ("vit", dict(qk_scale=1.2), "timm", "qk_scale"),
  ("vit", dict(norm_eps=1e-5), "timm", "norm_eps"),
  (
    "vit",
    dict(
      qk_norm=True,
      layerscale_init=1e-6,
      drop_path=0.1,
      dropout=0.1,
      pool="gap",
      fc_norm=True,
      posemb="sincos2d",
      dtype="bfloat16",
      mlp_activation="gelu_exact",
      remat="full",
      scan_layers=True,
      num_laplacian_heads=1,
      laplacian_mix="learned",
      spectral={"enabled": True},
    ),
    "timm",
    None,
  ),
  ("gpt", dict(posemb="rope"), "hf-gpt2", "posemb"),
  ("gpt", dict(qk_norm=True), "hf-gpt2", "qk_norm"),
  ("gpt", dict(embed_norm=True), "hf-gpt2", "embed_norm"),
  ("gpt", dict(layerscale_init=0.1), "hf-gpt2", "layerscale_init"),
  ("gpt", dict(logit_softcap=15.0), "hf-gpt2", "logit_softcap"),
  ("gpt", dict(num_kv_heads=1), "hf-gpt2", "num_kv_heads"),
  (
    "gpt",
    dict(
      tie_embeddings=False,
      mlp_activation="relu2",
      norm_eps=1e-5,
      dropout=0.1,
      attention_dropout=0.1,
      num_laplacian_heads=2,
      num_kv_heads=2,
    ),
    "hf-gpt2",
    None,
  ),
  ("vit", dict(qk_norm=True), "peer", "qk_norm"),
  ("vit", dict(drop_path=0.1), "peer", "drop_path"),
  ("vit", dict(posemb="sincos2d"), "peer", "posemb"),
  ("vit", dict(dtype="bfloat16"), "peer", "dtype"),
  ("vit", dict(zero_init_out=True), "peer", "zero_init_out"),
  ("vit", dict(laplacian_mask=[[True, False], [False, True]]), "peer", "laplacian_mask"),
  ("gpt", dict(logit_softcap=15.0), "peer", "logit_softcap"),
  ("gpt", dict(rope_style="nanochat", posemb="rope"), "peer", "rope_style"),
  ("gpt", dict(num_kv_heads=1), "peer", "num_kv_heads"),
  (
    "gpt",
    dict(
      posemb="rope",
      tie_embeddings=False,
      use_bias=False,
      num_laplacian_heads=1,
      mlp_activation="relu2",
    ),
    "peer",
    None,
  ),
]


@pytest.mark.parametrize("family,model,target,refused", CASES)
def test_declared_support_reproduces_the_old_refusal_lists(family, model, target, refused):
  if target == "peer":
    pytest.importorskip("torch", reason="the peer is PyTorch")
    from bench import peer_torch

    table = peer_torch.SUPPORT[family]
  else:
    table = {"timm": timm_vit, "hf-gpt2": hf_gpt2}[target].SUPPORT
  spec = spec_lib.build(family, width=32, depth=2, num_heads=2, **model)
  got = [k for k, _, _ in support.unsupported(spec, table)]
  assert got == ([] if refused is None else [refused])


@pytest.mark.parametrize(
  "key,value",
  [
    ("norm", "layernorm"),
    ("mlp_activation", "gelu"),
    ("posemb", "learn"),
    ("tie_embeddings", True),
    ("use_bias", True),
    ("embed_norm", False),
    ("logit_softcap", None),
    ("qk_norm", False),
    ("rope_style", "roformer"),
    ("mlp_dim", 128),
    ("laplacian_mix", "learned"),
  ],
)
def test_nanochat_refuses_each_departure_from_its_recipe(key, value):
  with pytest.raises(common.ConvertError) as e:
    nanochat._refuse_options(_nanochat_spec(**{key: value}))
  _one_line(e, f"model.{key}=", "nanochat's GPT has no equivalent")


def test_each_timm_converter_declares_its_family_and_default_config():
  """The timm converters are found among the ``timm_*`` modules, each naming
  its laplax family (one that the classification task trains), its timm
  class and the default config ``--from timm`` takes for its model names."""
  from laplax.models import registry

  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "configs")
  converters = timm_vit.converters()
  assert timm_vit in converters and len({c.TIMM_CLASS for c in converters}) == len(converters)
  assert {c.FAMILY for c in converters} >= {"vit"} and len(converters) >= 4
  for c in converters:
    assert registry.get(c.FAMILY).task == "classification", c.__name__
    assert timm_vit.converter_of(c.FAMILY) is c
    assert os.path.isfile(os.path.join(configs, c.DEFAULT_CONFIG)), c.DEFAULT_CONFIG
    assert all(c.DEFAULT_CONFIG.startswith(prefix) for prefix in c.MODEL_PREFIXES)
  assert timm_vit.converter_of("gpt") is None
