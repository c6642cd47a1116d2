"""Weight converters between laplax and the PyTorch ecosystem.

``python -m laplax.convert`` (its entry point ``laplax/convert/__main__.py``) maps timm
Vision Transformers (:mod:`laplax.convert.timm_vit`) and Hugging Face
``GPT2LMHeadModel`` (:mod:`laplax.convert.hf_gpt2`) to laplax workdirs and
back. The conversions themselves work on ``{name: np.ndarray}`` state dicts
(read and written with ``safetensors.numpy``); only building a timm model by
name or reading a ``.pth`` file imports PyTorch, lazily, inside these
functions: ``import laplax`` and training never do.
"""

from laplax.convert.common import ConvertError, read_workdir, write_workdir

__all__ = ["ConvertError", "read_workdir", "write_workdir"]
