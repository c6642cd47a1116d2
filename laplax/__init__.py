"""laplax: Laplacian heads and spectrally conditioned attention in JAX/Flax.

The public API (each name is imported on first use, so ``import laplax``
imports neither JAX nor the trainer; ``help(laplax.NAME)`` documents it):

* Attention (:mod:`laplax.attention`): ``attend`` (one ``P V`` call; Laplacian
  heads output ``V - P V``), ``MultiHeadAttention`` (a Flax Linen module:
  projections, Laplacian heads, spectral conditioning, qk-norm, KV cache),
  ``laplacian_heads`` (which heads are Laplacian).
* Spectral conditioning (:mod:`laplax.spectral`): ``correction`` (the fixed
  ``lambda * I_k`` or SVD correction ``C`` added to ``W_Q, W_K, W_V``),
  ``condition_number``.
* Models (:mod:`laplax.models`): ``ViT``, ``Swin``, ``GPT``, ``DINO``, ``DINOHead``;
  ``build_spec("vit", width=..., depth=..., ...)`` and ``spec_from_config(
  config.model)`` build the model spec every model takes.
* Trained runs: ``load(workdir, step=None)`` restores the model and
  parameters of a run that ``laplax-train`` (``train.py``) or
  ``python -m laplax.convert`` wrote, onto one device, without its data
  (``Loaded``; it raises ``LoadError``).
* Errors: ``UserError``, the base of every one-line error laplax raises for
  bad input (``LoadError``, ``ConfigError`` for a bad config, ...).
* Analysis (:mod:`laplax.analysis`): ``run_analysis`` with an
  ``AnalysisTarget`` (what ``laplax-eval --analysis`` computes),
  ``read_analysis`` and ``analysis_summary`` (its per-layer table),
  ``GeometryAccumulator`` (token geometry: ANOVA, spectrum, neural collapse,
  CDNV), ``kernel_conditioning`` and ``head_conditioning`` (condition numbers
  of the projections and of a head's Jacobian, Theorem 3.4).

The package, one job a folder (docs/architecture.md draws the data flow):
``attention``, ``spectral``, ``rotary`` (the methods), ``kernels`` (the
attention kernels), ``models`` (ViT, GPT, DINO from one spec), ``config``
(defaults, the schema that completes a config, validation), ``data`` (input
pipelines), ``tasks`` (the task registry: model, loss, eval-split sums),
``train`` (state, step, loop, optimisers), ``workdir`` (checkpoints,
metrics, lock, ``load``), ``evaluators`` (the evaluators ``config.evals``
names), ``analysis`` (token geometry), ``cli`` (``train.py``, ``eval.py``,
the harness adapter), ``sweep`` and ``convert`` (their ``python -m``
commands), ``sandbox`` (generated programs under bubblewrap), ``proj`` (the
projects on the library: ``proj/nanochat``, found by ``projects``).
"""

import importlib

__version__ = "0.1.0"

# Public name -> (module, attribute there).
_PUBLIC = {
  "attend": ("laplax.attention", "attend"),
  "MultiHeadAttention": ("laplax.attention", "MultiHeadAttention"),
  "laplacian_heads": ("laplax.attention", "laplacian_heads"),
  "correction": ("laplax.spectral", "correction"),
  "condition_number": ("laplax.spectral", "condition_number"),
  "ViT": ("laplax.models.vit", "ViT"),
  "Swin": ("laplax.models.swin", "Swin"),
  "DaViT": ("laplax.models.davit", "DaViT"),
  "XCiT": ("laplax.models.xcit", "XCiT"),
  "GPT": ("laplax.models.gpt", "GPT"),
  "DINO": ("laplax.models.dino", "DINO"),
  "DINOHead": ("laplax.models.dino", "DINOHead"),
  "build_spec": ("laplax.models.spec", "build"),
  "spec_from_config": ("laplax.models.spec", "from_config"),
  "load": ("laplax.loading", "load"),
  "Loaded": ("laplax.loading", "Loaded"),
  "LoadError": ("laplax.loading", "LoadError"),
  "UserError": ("laplax.errors", "UserError"),
  "ConfigError": ("laplax.config.validation", "ConfigError"),
  "run_analysis": ("laplax.analysis.report", "run_analysis"),
  "AnalysisTarget": ("laplax.analysis.report", "Target"),
  "read_analysis": ("laplax.analysis.report", "read"),
  "analysis_summary": ("laplax.analysis.summary", "summary"),
  "GeometryAccumulator": ("laplax.analysis.geometry", "GeometryAccumulator"),
  "kernel_conditioning": ("laplax.analysis.conditioning", "kernel_conditioning"),
  "head_conditioning": ("laplax.analysis.conditioning", "head_conditioning"),
}

__all__ = [*sorted(_PUBLIC), "__version__"]  # noqa: PLE0604  (the lazy names, strings)


def __getattr__(name: str):
  """A public name of :data:`__all__`, imported from its module on first access.

  Raises:
    AttributeError: a name that is not public.
  """
  if name not in _PUBLIC:
    raise AttributeError(f"module 'laplax' has no attribute {name!r}")
  module, attribute = _PUBLIC[name]
  value = getattr(importlib.import_module(module), attribute)
  globals()[name] = value  # later accesses skip this function
  return value


def __dir__():
  """The module's names, with the public ones not imported yet."""
  return sorted(set(globals()) | set(__all__))
