"""The CPU default for DINO: self-supervised ViT on Fashion-MNIST, no labels.

    python train.py --config configs/dino_fashion_mnist.py --workdir runs/dino
    python eval.py --workdir runs/dino      # k-NN, linear probe, raw-pixel k-NN, patch PCA

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 4; default
3, the analogue of the paper's 5 of 6), ``spectral`` (lambda * I_k).

A ViT of width 128, depth 4, patch 7 on 2 global 28 px crops and local 14 px
crops, with a head reduced to fit 2 CPU cores (hidden 512, bottleneck 128,
out_dim 1024). Labels are read only by the evaluation.
"""

from laplax.train.defaults import dino_base_config, parse_arg


def get_config(arg=None):
  """DINO ViT (patch 7, width 128, depth 4, 4 heads) on 28x28 Fashion-MNIST."""
  a = parse_arg(arg, laplacian=3, spectral=False)
  c = dino_base_config()
  c.batch_size = 128
  c.eval_batch_size = 1000
  c.total_steps = 1000
  c.log_every = 50
  c.eval_every = 1000
  c.checkpoint_every = 250

  c.model.patch_size = 7
  c.model.width = 128
  c.model.depth = 4
  c.model.mlp_dim = 256
  c.model.num_heads = 4
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.model.drop_path = 0.1

  c.dino.out_dim = 1024
  c.dino.hidden_dim = 512
  c.dino.bottleneck_dim = 128
  c.dino.warmup_teacher_temp_steps = 200
  c.dino.freeze_last_layer_steps = 100
  c.dino.momentum_teacher = 0.99
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 100
  return c
