"""The tiny DINO run shared by the DINO, evaluator and ADE20K tests."""

import os

from helpers.runs import ROOT

DINO_CONFIG = os.path.join(ROOT, "configs", "dino_fashion_mnist.py")


# A tiny DINO so every step takes milliseconds on CPU.
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.model.num_laplacian_heads=1",
  "--config.batch_size=16",
  "--config.eval_batch_size=2000",
  "--config.log_every=2",
  "--config.optim.warmup_steps=2",
  "--config.dino.out_dim=64",
  "--config.dino.hidden_dim=32",
  "--config.dino.bottleneck_dim=16",
  "--config.data.multicrop.num_local=2",
  "--config.evals=knn,raw_pixel_knn,segmentation,patch_pca",
  "--config.dino.freeze_last_layer_steps=2",
  "--config.dino.warmup_teacher_temp_steps=4",
  # Evaluation on slices keeps k-NN and feature extraction to seconds.
  "--config.data.train_split=train[:3000]",
  "--config.data.eval_split=test[:1000]",
  # and a small segmentation probe (eval.py only).
  "--config.eval.segmentation_train_images=32",
  "--config.eval.segmentation_test_images=16",
  "--config.eval.segmentation_steps=20",
  "--config.eval.segmentation_figure_images=2",
]


def dino_args(workdir, data_dir, *extra):
  return (
    [
      "train.py",
      "--config",
      DINO_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={data_dir}",
    ]
    + TINY
    + list(extra)
  )
