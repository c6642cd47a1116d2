"""DINO ViT-S/16 on ImageNet-1k (Caron et al. 2021), the Laplacian-heads paper's reference run.

    python train.py --config configs/dino_vits16_imagenet.py:laplacian=5 --workdir runs/dino_s5l
    python eval.py --workdir runs/dino_s5l         # k-NN, linear probe, patch PCA

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 6; the
paper's "ViT-S-5L" is 5, the default here), ``spectral`` (lambda * I_k).

Recipe (DINO's 100-epoch ViT-S/16 run): batch 1024, AdamW lr 5e-4 * 1024/256
with 10 warm-up epochs and cosine decay to 1e-5, weight decay cosine 0.04 ->
0.4, gradient clipping 3.0, drop-path 0.1, head 2048-2048-256 -> 65536 with the
last layer frozen for 1 epoch, teacher temperature 0.04 -> 0.07 over 30
epochs, student temperature 0.1, teacher momentum 0.996 -> 1, centre momentum
0.9, 2 global crops of 224 px (scale 0.4-1) and 10 local crops of 96 px
(scale 0.05-0.4), bfloat16 compute. ImageNet must be prepared by TFDS in
``data.data_dir`` (a manual download; see docs/configs.md).
"""

from laplax.config.defaults import dino_base_config, parse_arg
from laplax.data.vision import images

NUM_TRAIN = 1_281_167


def get_config(arg=None):
  """DINO ViT-S/16, 100 epochs on imagenet2012."""
  a = parse_arg(arg, laplacian=5, spectral=False)
  c = dino_base_config()
  c.batch_size = 1024
  c.eval_batch_size = 1024
  steps_per_epoch = NUM_TRAIN // c.batch_size
  c.total_steps = 100 * steps_per_epoch
  c.log_every = 100
  c.eval_every = 10 * steps_per_epoch
  c.checkpoint_every = 2000

  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.image_size = 224  # evaluation: central 224 crop
  c.data.mean = (0.485, 0.456, 0.406)
  c.data.std = (0.229, 0.224, 0.225)
  c.data.num_threads = 16
  c.data.multicrop = images.default_multicrop_config("imagenet2012")

  c.model.update(patch_size=16, width=384, depth=12, mlp_dim=1536, num_heads=6)
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.model.drop_path = 0.1
  c.model.dtype = "bfloat16"

  c.dino.out_dim = 65536
  c.dino.warmup_teacher_temp_steps = 30 * steps_per_epoch
  c.dino.freeze_last_layer_steps = steps_per_epoch
  c.optim.lr = 5e-4 * c.batch_size / 256
  c.optim.min_lr_ratio = 1e-5 / c.optim.lr
  c.optim.warmup_steps = 10 * steps_per_epoch
  return c
