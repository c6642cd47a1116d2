"""What each converter target can express of a model spec, read from its fields.

Every field of the spec dataclasses (:mod:`laplax.models.spec`) may carry
``convert`` metadata: ``{target: support}`` for the targets of
:data:`CONVERT_TARGETS`, where ``support`` is :data:`ANY` (every value),
:data:`FORCE` (a laplax addition the target lacks, written only with
``--force``), a tuple of the values the target has, or a :class:`Rule`. A
field that does not name a target is supported there at its default alone,
so the converters fail closed: :func:`unsupported` lists every option of a
spec that a target cannot express, a new field included, and
``laplax.convert`` (:func:`laplax.convert.common.refuse_unsupported`) and the
PyTorch peer of ``bench/peer_torch.py`` refuse the first one in one line.

Other metadata read here: ``key`` (the config key shown), ``nested`` (a
nested spec whose fields are checked too), ``derived`` (a field computed
from another, checked through it: ``rope`` from ``posemb``), ``active`` (a
sibling switch without which the field does nothing: the rotary settings),
``plain`` (a test of the default for fields normalised after construction:
the Laplacian heads), ``show`` (how the value is shown) and ``source`` (the
options ``--from`` resets to the source's plain model: :func:`source_options`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The converter targets whose support every field's ``convert`` metadata
#: declares: ``python -m laplax.convert --from/--to`` ``"timm"`` (timm's
#: ``VisionTransformer``), ``"timm-swin"`` (timm's ``SwinTransformer``: the
#: same command, another model family), ``"timm-davit"`` (timm's ``DaVit``),
#: ``"timm-xcit"`` (timm's ``Xcit``), ``"hf-gpt2"``, ``"hf-bert"``,
#: ``"hf-nystromformer"`` and ``"nanochat"``, and ``"peer"``, the PyTorch
#: models of ``bench/peer_torch.py``.
CONVERT_TARGETS = (
  "timm",
  "timm-swin",
  "timm-davit",
  "timm-xcit",
  "hf-gpt2",
  "hf-bert",
  "hf-nystromformer",
  "nanochat",
  "peer",
)
#: ``convert`` support: the target expresses every value of the field.
ANY = "any"
#: ``convert`` support: a laplax addition the target lacks (Laplacian heads,
#: spectral conditioning); ``--to`` refuses it unless ``--force``
#: (:func:`laplax.convert.common.refuse_laplax_only`), ``--from`` keeps it.
FORCE = "force"
#: The targets that export trained weights for inference: training-only
#: settings (dropout, drop-path) and initialisers change nothing they compute.
EXPORTS = (
  "timm",
  "timm-swin",
  "timm-davit",
  "timm-xcit",
  "hf-gpt2",
  "hf-bert",
  "hf-nystromformer",
  "nanochat",
)


@dataclasses.dataclass(frozen=True)
class Rule:
  """``convert`` support given by a test of the value and the whole spec.

  Attributes:
    test: ``test(value, spec) -> bool``, True where the target expresses it.
    text: what the target supports, for the refusal (e.g. ``"4 * width"``).
  """

  test: Any
  text: str


def everywhere(*targets: str) -> dict:
  """``{target: ANY}`` for ``targets`` (default: all of :data:`CONVERT_TARGETS`):
  a field that changes no computed value (an initialiser, memory, layout, a
  kernel choice) or one every target has."""
  return {t: ANY for t in targets or CONVERT_TARGETS}


def _supported(support, value, spec) -> bool | None:
  """Whether ``support`` (a field's ``convert`` entry) admits ``value``;
  ``None`` when the field has no entry (its default alone is)."""
  if support is None:
    return None
  if support in (ANY, FORCE):
    return True
  if isinstance(support, Rule):
    return bool(support.test(value, spec))
  return value in tuple(support)


def _describe(support, default) -> str:
  """What a field's ``convert`` entry admits, for a refusal."""
  if isinstance(support, Rule):
    return support.text
  values = (default,) if support is None else tuple(support)
  return " or ".join(repr(v) for v in values)


def _default(f: dataclasses.Field):
  """A field's default value (``None`` when it has none)."""
  if f.default is not dataclasses.MISSING:
    return f.default
  return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def unsupported(spec: Any, target: str, *, skip_source: bool = False) -> list[tuple[str, str, str]]:
  """The options of ``spec`` that converter ``target`` cannot express (fail closed).

  Every field of the spec and of its nested specs (metadata ``nested``: the
  attention settings) is checked: one whose ``convert`` metadata does not
  name ``target`` is supported at its default only, so a new field is
  refused until its metadata names the target; :data:`FORCE` fields are left
  to :func:`laplax.convert.common.refuse_laplax_only`; a field whose
  ``active`` switch is off and ``derived`` fields are skipped.

  Args:
    spec: a model spec (:class:`laplax.models.spec.TransformerSpec`).
    target: one of :data:`CONVERT_TARGETS`.
    skip_source: leave out the fields marked ``source`` (:func:`source_options`:
      the options ``--from`` takes from the command line).

  Returns:
    ``[(config key, value shown, what the target supports)]``, in field order.

  Raises:
    KeyError: an unknown ``target``.
  """
  if target not in CONVERT_TARGETS:
    raise KeyError(f"unknown converter target {target!r}; one of {CONVERT_TARGETS}")
  out = []

  def walk(node):
    for f in dataclasses.fields(node):
      meta, value = f.metadata, getattr(node, f.name)
      if meta.get("nested"):
        walk(value)
        continue
      if meta.get("derived") or (meta.get("source") and skip_source):
        continue
      if meta.get("active") and not getattr(node, meta["active"]):
        continue
      support = meta.get("convert", {}).get(target)
      ok = _supported(support, value, spec)
      if ok is None:  # the default alone
        ok = meta["plain"](value) if "plain" in meta else value == _default(f)
      if not ok:
        out.append(
          (
            meta.get("key") or f.name,
            meta.get("show", repr)(value),
            _describe(support, _default(f)),
          )
        )

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
    if f.metadata.get("nested"):
      out.update(source_options(f.default_factory))
    source = f.metadata.get("source")
    if isinstance(source, dict):
      out.update(source)
    elif source:
      out[f.metadata.get("key") or f.name] = _default(f)
  return out
