"""laplax: Laplacian heads and spectrally conditioned attention in JAX/Flax.

Modules: :mod:`laplax.attention` (``attend``, ``MultiHeadAttention``),
:mod:`laplax.spectral` (the fixed corrections and condition numbers),
:mod:`laplax.models`, :mod:`laplax.data`, :mod:`laplax.train`.

``laplax.load(workdir, step=None)`` restores a run that ``train.py`` wrote
(model, parameters, DINO teacher, config) onto one device, ready for
``model.apply`` (:func:`laplax.train.restore.load`; it raises
``laplax.LoadError``). It is imported on first use, so ``import laplax``
imports neither JAX nor the trainer.
"""

__version__ = "0.1.0"

_LAZY = ("load", "Loaded", "LoadError")


def __getattr__(name: str):
  """``laplax.load``, ``laplax.Loaded``, ``laplax.LoadError`` from
  :mod:`laplax.train.restore`, imported on first access.

  Raises:
    AttributeError: any other name.
  """
  if name in _LAZY:
    from laplax.train import restore  # pylint: disable=import-outside-toplevel
    return getattr(restore, name)
  raise AttributeError(f"module 'laplax' has no attribute {name!r}")


def __dir__():
  """The module's names, with the lazily imported ones."""
  return sorted(list(globals()) + list(_LAZY))
