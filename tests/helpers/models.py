"""Models for tests, from the flat keyword arguments of a config's model section.

``make_vit(num_classes=3, width=16, depth=2, num_laplacian_heads=(0, 1),
spectral_lam=10.0)`` builds the spec with :func:`laplax.models.spec.build`
(``spectral_lam`` / ``spectral_mode`` stand for ``spectral.{enabled, lam,
mode}``; a jnp ``dtype`` becomes its name) and the model around it.
"""

import jax.numpy as jnp

from laplax.models import spec as spec_lib
from laplax.models.gpt import GPT
from laplax.models.vit import ViT


def model_spec(name, **kw):
  lam = kw.pop("spectral_lam", None)
  mode = kw.pop("spectral_mode", "full")
  if lam is not None:
    kw["spectral"] = {"enabled": True, "lam": lam, "mode": mode}
  if "dtype" in kw and kw["dtype"] is not None and not isinstance(kw["dtype"], str):
    kw["dtype"] = jnp.dtype(kw["dtype"]).name
  if kw.get("dtype", "") is None:
    kw["dtype"] = "float32"
  return spec_lib.build(name, **kw)


def make_vit(num_classes=0, posemb_grid=None, head_init_zero=True, **kw):
  return ViT(
    model_spec("vit", **kw),
    num_classes=num_classes,
    posemb_grid=posemb_grid,
    head_init_zero=head_init_zero,
  )


def make_gpt(vocab_size, **kw):
  return GPT(model_spec("gpt", **kw), vocab_size=vocab_size)
