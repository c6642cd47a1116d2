"""DINO on Fashion-MNIST mosaics: canvases of 2-4 garments, scored by linear segmentation.

    python train.py --config configs/dino_fashion_mosaic.py --workdir runs/mosaic
    python eval.py --workdir runs/mosaic    # k-NN, linear probe, segmentation mIoU

PLACEHOLDER
"""

from laplax.train.defaults import dino_base_config, parse_arg


def get_config(arg=None):
  """DINO ViT (patch 7, width 128, depth 4, 4 heads) on 56x56 fashion_mosaic canvases."""
  a = parse_arg(arg, laplacian=3, spectral=False)
  c = dino_base_config()
  c.data.name = "fashion_mosaic"
  c.batch_size = 64
  c.eval_batch_size = 500
  c.total_steps = 1000
  c.log_every = 50
  c.eval_every = 1000
  c.checkpoint_every = 250

  c.model.patch_size = 8
  c.model.width = 128
  c.model.depth = 4
  c.model.mlp_dim = 256
  c.model.num_heads = 4
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.model.drop_path = 0.0

  c.dino.out_dim = 1024
  c.dino.hidden_dim = 512
  c.dino.bottleneck_dim = 128
  c.dino.warmup_teacher_temp = 0.04
  c.dino.teacher_temp = 0.04
  c.dino.warmup_teacher_temp_steps = 0
  c.dino.freeze_last_layer_steps = 100
  c.dino.momentum_teacher = 0.99
  mc = c.data.multicrop
  mc.global_size = 56
  mc.local_size = 24
  mc.num_local = 4
  mc.global_scale = (0.5, 1.0)
  mc.local_scale = (0.2, 0.5)
  mc.blur_sigma = (0.1, 0.5)
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 100
  return c
