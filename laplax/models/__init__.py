"""The models: each takes one frozen spec (:mod:`~laplax.models.spec`).

:mod:`~laplax.models.vit` (ViT), :mod:`~laplax.models.swin` (Swin, windowed
attention), :mod:`~laplax.models.gpt` (GPT, with
:mod:`~laplax.models.sampling` for generation and log-likelihoods) and
:mod:`~laplax.models.dino` (DINO's student/teacher head) are built from the
blocks of :mod:`~laplax.models.layers`, whose attention is
:class:`laplax.attention.MultiHeadAttention`.
"""
