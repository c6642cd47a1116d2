"""The converters fail closed: what each target supports is the spec fields' metadata.

Each converter target (``--to/--from timm``, ``hf-gpt2``, ``nanochat`` and
the PyTorch peer of ``bench/``) refuses, in one line naming ``model.KEY=VALUE``,
every option whose spec field does not declare the target at its value
(:func:`laplax.models.support.unsupported`). A spec field added here (a
subclass of the spec, as a new field of ``laplax/models/spec.py`` would be)
with a value other than its default is refused by every converter, and
accepted at its default; the declared support reproduces the refusal lists
the converters kept by hand before.
"""

import dataclasses
import importlib.util
import os

import pytest

from laplax.convert import common, hf_gpt2, nanochat, timm_vit
from laplax.models import spec as spec_lib
from laplax.models import support
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
  for target, spec in (("timm", vit), ("hf-gpt2", gpt), ("nanochat", _nanochat_spec(**{NEW: 0.5}))):
    with pytest.raises(common.ConvertError, match="new_option=0.5"):  # --from too
      common.refuse_unsupported(spec, target, target, "fix", skip_source=True)
  # At its default the new field changes nothing a target computes: accepted.
  assert support.unsupported(spec_lib.build("vit", width=32, depth=2, num_heads=2), "timm") == []
  assert support.unsupported(spec_lib.build("gpt", width=32, depth=2, num_heads=2), "hf-gpt2") == []
  assert support.unsupported(_nanochat_spec(), "nanochat") == []


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
  assert [k for k, _, _ in support.unsupported(spec, "timm")] == [NEW]
  assert support.unsupported(spec, "timm", skip_source=True) == []


# (family, model keys, target, refused key or None): the refusal lists the
# converters kept by hand, now read from the fields' metadata.
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
  spec = spec_lib.build(family, width=32, depth=2, num_heads=2, **model)
  got = [k for k, _, _ in support.unsupported(spec, target)]
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
