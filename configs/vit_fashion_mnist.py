"""The CPU default: a small ViT with Laplacian heads on Fashion-MNIST.

    python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit
    python train.py --config configs/vit_fashion_mnist.py:laplacian=0 --workdir runs/vit0
    python train.py --config configs/vit_fashion_mnist.py:spectral=True --workdir runs/vits

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 4; default
all 4), ``spectral`` (lambda * I_k conditioning, default False).
"""

from laplax.train.defaults import base_config, parse_arg


def get_config(arg=None):
  """ViT (patch 4, width 128, depth 4, 4 heads) for 28x28 Fashion-MNIST."""
  a = parse_arg(arg, laplacian=4, spectral=False)
  c = base_config()
  c.batch_size = 128
  c.total_steps = 3000
  c.eval_every = 1000
  c.checkpoint_every = 500
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 200
  return c
