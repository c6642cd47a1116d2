"""The models: each takes one frozen spec (:mod:`~laplax.models.spec`).

A model family is one module holding its spec, its model and its
:class:`~laplax.models.registry.Family` (found by :mod:`~laplax.models.registry`):
:mod:`~laplax.models.vit` (ViT), :mod:`~laplax.models.swin` (Swin, windowed
attention) and :mod:`~laplax.models.davit` (DaViT), both on
:mod:`~laplax.models.staged`, :mod:`~laplax.models.xcit` (XCiT),
:mod:`~laplax.models.gpt` (GPT, with :mod:`~laplax.models.sampling` for
generation and log-likelihoods), :mod:`~laplax.models.bert` (BERT) and
:mod:`~laplax.models.encoder` (the LRA sequence classifier);
:mod:`~laplax.models.dino` holds DINO's student/teacher head. They are built
from the blocks of :mod:`~laplax.models.layers`, whose attention is
:class:`laplax.attention.MultiHeadAttention`.
"""
