"""laplax: Laplacian heads and spectrally conditioned attention in JAX/Flax.

Modules: :mod:`laplax.attention` (``attend``, ``MultiHeadAttention``),
:mod:`laplax.spectral` (the fixed corrections and condition numbers),
:mod:`laplax.models`, :mod:`laplax.data`, :mod:`laplax.train`.
"""

__version__ = "0.1.0"
