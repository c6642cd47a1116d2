"""The CPU default: a small ViT with Laplacian heads on Fashion-MNIST.

    python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit
    python train.py --config configs/vit_fashion_mnist.py:laplacian=0 --workdir runs/vit0
    python train.py --config configs/vit_fashion_mnist.py:spectral=True --workdir runs/vits
    python train.py --config configs/vit_fashion_mnist.py:recipe=deit3 --workdir runs/vitd

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 4; default
all 4), ``spectral`` (lambda * I_k conditioning, default False), ``recipe``
(``plain``, or ``deit3``: qk-norm and LayerScale 1e-6 as the authors' mixed
DeiT-3, :func:`laplax.config.defaults.mixed_deit3_options`).
"""

from laplax.config.defaults import base_config, check_recipe, mixed_deit3_options, parse_arg


def get_config(arg=None):
  """ViT (patch 7, width 128, depth 4, 4 heads, mean-pooled) for 28x28 Fashion-MNIST.

  1200 steps of 256 images (5.1 epochs), about 4 minutes on 2 CPU cores.
  """
  a = parse_arg(arg, laplacian=4, spectral=False, recipe="plain")
  check_recipe("vit", a.recipe)
  c = base_config()
  c.batch_size = 256
  c.eval_batch_size = 1000
  c.total_steps = 1200
  c.log_every = 50
  c.eval_every = 600
  c.checkpoint_every = 300
  c.data.crop_padding = 0  # flips only: 6 epochs are too few to need crops
  c.model.patch_size = 7
  c.model.width = 128
  c.model.depth = 4
  c.model.mlp_dim = 256
  c.model.num_heads = 4
  c.model.pool = "gap"
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 100
  # Speed only: the gradient of the 256 images is computed as 4 unrolled
  # micro-batches of 64, whose activations fit a CPU's cache (1.2x faster on
  # 2 cores, docs/benchmarks.md, "Cache blocking"); batch_size overrides must
  # be multiples of 4, or set optim.grad_accum_steps=1.
  c.optim.grad_accum_steps = 4
  c.optim.grad_accum_unroll = True
  if a.recipe == "deit3":
    mixed_deit3_options(c)
  return c
