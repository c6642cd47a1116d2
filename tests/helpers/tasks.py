"""Tiny ViT and GPT tasks for the memory and fit tests."""

import numpy as np

from laplax import tasks

from helpers.configs import load


class Tok:
  vocab_size, token_bytes = 40, np.ones(40, np.int32)


def vit_task():
  c = load("vit_fashion_mnist")
  c.model.update(
    width=32, depth=2, num_heads=4, mlp_dim=32, patch_size=7, num_laplacian_heads=(1, 4)
  )
  c.model.spectral.enabled = True
  c.loss.update(mixup=0.0, cutmix=0.0)
  c.batch_size = 8
  return (
    c,
    lambda: tasks.ClassificationTask(c, 10, (28, 28, 1)),
    {
      "image": np.random.default_rng(0).standard_normal((8, 28, 28, 1)).astype(np.float32),
      "label": np.arange(8, dtype=np.int32) % 10,
    },
  )


def gpt_task():
  c = load("gpt_shakespeare")
  c.model.update(
    width=32,
    depth=3,
    num_heads=4,
    mlp_dim=64,
    max_length=12,
    num_laplacian_heads=(0, 2, 4),
    scan_layers=True,
    remat="full",
  )
  c.batch_size = 8
  return (
    c,
    lambda: tasks.LanguageModelTask(c, Tok()),
    {"tokens": np.random.default_rng(1).integers(0, 40, (8, 13)).astype(np.int32)},
  )
