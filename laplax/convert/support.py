"""What a converter can express of a model spec: each converter's own table.

Every converter module (:mod:`laplax.convert.timm_vit`, ``timm_swin``,
``timm_davit``, ``timm_xcit``, ``hf_gpt2``, ``hf_bert``,
``hf_nystromformer``, ``nanochat``, and the PyTorch peer of
``bench/peer_torch.py``) declares ``SUPPORT``: ``{config key: support}``
over the fields of the model specs (:mod:`laplax.models.spec`), where
``support`` is :data:`ANY` (every value), :data:`FORCE` (a laplax addition
the target lacks, written only with ``--force``), a tuple of the values the
target has, or a :class:`Rule`. A field its table does not list is
supported at its default alone, so the converters fail closed:
:func:`unsupported` lists every option of a spec that a table cannot
express, a new spec field included, and
:func:`laplax.convert.common.refuse_unsupported` and the peer refuse the
first one in one line. The shared parts of the tables are here
(:data:`EVERYWHERE`, :data:`EXPORTED`, :data:`LAPLAX_ONLY`), each converter
adds its own entries in its module.

What :func:`unsupported` reads of a field besides the table is the field's
own metadata, the same for every converter: ``key`` (the config key, the
table's key), ``nested`` (a nested spec or sub-spec whose fields are
checked too, under their own config keys, where it is attached: the
attention settings, its ``qk_norm``, ``rope`` and ``nystrom`` sub-specs),
``switch`` (a sub-spec whose key is a bool: ``qk_norm`` is True where the
sub-spec is attached), ``derived`` (a field computed from another, checked
through it: ``rope`` from ``posemb``), ``active`` (a sibling setting
without which the field does nothing: the Nystrom options without
``implementation``), ``plain`` (a test of the default for fields
normalised after construction: the Laplacian heads), ``show`` (how the value
is shown) and ``source`` (the options ``--from`` resets to the source's
plain model: :func:`source_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Support: the target expresses every value of the field.
ANY = "any"
#: Support: a laplax addition the target lacks (Laplacian heads, spectral
#: conditioning); ``--to`` refuses it unless ``--force``
#: (:func:`laplax.convert.common.refuse_laplax_only`), ``--from`` keeps it.
FORCE = "force"


@dataclasses.dataclass(frozen=True)
class Rule:
  """Support given by a test of the value and the whole spec.

  Attributes:
    test: ``test(value, spec) -> bool``, True where the target expresses it.
    text: what the target supports, for the refusal (e.g. ``"4 * width"``).
  """

  test: Any
  text: str


#: ``num_kv_heads`` where the target has one key/value head per query head,
#: however written (nanochat alone has grouped-query attention).
ONE_KV_PER_HEAD = Rule(lambda v, spec: spec.kv_heads == spec.num_heads, "num_heads (or None)")

#: What every converter takes as it is: the sizes every target has and the
#: options that change no computed value (an initialiser, memory, layout, a
#: kernel choice), of every family.
EVERYWHERE = {
  "width": ANY,
  "depth": ANY,
  "mlp_dim": ANY,
  "num_heads": ANY,
  "num_kv_heads": ONE_KV_PER_HEAD,
  "implementation": ANY,
  "xla_keep_probs": ANY,
  "remat": ANY,
  "scan_layers": ANY,
  "kernel_init": ANY,
  "loss_chunk": ANY,
  "max_length": ANY,
  "patch_size": ANY,
  "pool": ANY,
  "stage_depths": ANY,
  "window_size": ANY,
  "pooler": ANY,
  "pooler_dim": ANY,
}
#: What a converter that exports trained weights for inference takes as it is
#: as well: training-only settings (dropout, zero-initialised outputs) and the
#: compute dtype change nothing the written model computes.
EXPORTED = {
  "attention_dropout": ANY,
  "dropout": ANY,
  "dtype": ANY,
  "zero_init_out": ANY,
}
#: The laplax methods (Laplacian heads, their mix, spectral conditioning) in
#: an export that lacks them: written only with ``--force``.
LAPLAX_ONLY = {
  "laplacian_mix": FORCE,
  "spectral.enabled": FORCE,
  "laplacian_mask": FORCE,
}
#: The activations every GPT/ViT target expresses (no gated one).
PLAIN_ACTIVATIONS = ("gelu", "gelu_exact", "relu2")


def _supported(support, value, spec) -> bool | None:
  """Whether ``support`` (a table's entry) admits ``value``; ``None`` when
  the table has no entry (its default alone is)."""
  if support is None:
    return None
  if support in (ANY, FORCE):
    return True
  if isinstance(support, Rule):
    return bool(support.test(value, spec))
  return value in tuple(support)


def _describe(support, default) -> str:
  """What a table's entry admits, for a refusal."""
  if isinstance(support, Rule):
    return support.text
  values = (default,) if support is None else tuple(support)
  return " or ".join(repr(v) for v in values)


def _default(f: dataclasses.Field):
  """A field's default value (``None`` when it has none)."""
  if f.default is not dataclasses.MISSING:
    return f.default
  return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def unsupported(
  spec: Any, table: Mapping[str, Any], *, skip_source: bool = False
) -> list[tuple[str, str, str]]:
  """The options of ``spec`` that a converter's ``table`` cannot express (fail closed).

  Every field of the spec and of its nested specs (metadata ``nested``: the
  attention settings) is checked: one whose config key ``table`` does not
  list is supported at its default only, so a new field is refused until
  the converter's table lists it; :data:`FORCE` fields are left to
  :func:`laplax.convert.common.refuse_laplax_only`; a field whose ``active``
  switch is off and ``derived`` fields are skipped.

  Args:
    spec: a model spec (:class:`laplax.models.spec.TransformerSpec`).
    table: ``{config key: support}``, a converter's ``SUPPORT``.
    skip_source: leave out the fields marked ``source`` (:func:`source_options`:
      the options ``--from`` takes from the command line).

  Returns:
    ``[(config key, value shown, what the table supports)]``, in field order.
  """
  out = []

  def check(meta, key, value, default):
    support = table.get(key)
    ok = _supported(support, value, spec)
    if ok is None:  # the default alone
      ok = meta["plain"](value) if "plain" in meta else value == default
    if not ok:
      out.append((key, meta.get("show", repr)(value), _describe(support, default)))

  def walk(node):
    for f in dataclasses.fields(node):
      meta, value = f.metadata, getattr(node, f.name)
      if meta.get("active") and not getattr(node, meta["active"]):
        continue
      if meta.get("nested"):
        if meta.get("switch"):  # its key says whether it is attached (``qk_norm``)
          check(meta, meta["key"], value is not None, False)
        if value is not None:
          walk(value)
        continue
      if meta.get("derived") or (meta.get("source") and skip_source):
        continue
      check(meta, meta.get("key") or f.name, value, _default(f))

  walk(spec)
  return out


def source_options(cls: type) -> dict:
  """``{config key: value}`` of the model options a conversion from another
  framework resets to the source's plain model unless the command line sets
  them: the fields of spec class ``cls`` (and its nested specs) marked
  ``source`` (the Laplacian heads, their mix, spectral conditioning, the
  compute dtype: plain attention in float32). A ``source`` that is a dict
  gives the config keys and values itself; ``True`` means the field's key
  at its default."""
  out = {}
  for f in dataclasses.fields(cls):
    nested = f.metadata.get("nested")
    if nested:
      out.update(source_options(nested if isinstance(nested, type) else f.default_factory))
    source = f.metadata.get("source")
    if isinstance(source, dict):
      out.update(source)
    elif source:
      out[f.metadata.get("key") or f.name] = _default(f)
  return out
