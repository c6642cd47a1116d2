"""DeiT-3 ViT-B/16 on ImageNet-1k (Touvron et al. 2022), the Laplacian-heads paper's recipe.

    python train.py --config configs/deit3_imagenet.py:laplacian=12 --workdir runs/deit3_b12l
    python train.py --config configs/deit3_imagenet.py:laplacian=0,spectral=True ...

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 12; the
paper's "ViT-B-12L" is 12), ``spectral`` (lambda * I_k conditioning, lambda=10).

Recipe (DeiT-3, Touvron et al. 2022, as the Laplacian-head ViT runs used
it): 400 epochs at 192 px, batch 2048, AdamW lr 2e-3, wd 0.05, cosine, 5 warm-up epochs, grad-clip 1.0, Mixup 0.8, CutMix 1.0, label
smoothing 0.1, binary cross-entropy, bfloat16, drop-path 0.2, LayerScale 1e-6,
qk-norm. Not reproduced here: 3-Augment (the pipeline does random-resized
crop and flip) and DeiT-3's 224 px fine-tuning; evaluation is at 192 px.
ImageNet must be prepared by TFDS in ``data.data_dir`` (manual download).
"""

from laplax.config.defaults import base_config, deit3_recipe, parse_arg

NUM_TRAIN = 1_281_167


def get_config(arg=None):
  """ViT-B/16, DeiT-3 recipe on imagenet2012."""
  a = parse_arg(arg, laplacian=0, spectral=False, variant="B/16")
  c = base_config()
  c.batch_size = 2048
  c.eval_batch_size = 1024
  steps_per_epoch = NUM_TRAIN // c.batch_size
  c.log_every = 100
  c.checkpoint_every = 2000

  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.image_size = 192
  c.data.crop_padding = 0
  c.data.flip = True
  c.data.mean = (0.485, 0.456, 0.406)
  c.data.std = (0.229, 0.224, 0.225)
  c.data.num_threads = 16

  deit3_recipe(
    c,
    variant=a.variant,
    laplacian=a.laplacian,
    spectral=a.spectral,
    steps_per_epoch=steps_per_epoch,
  )
  return c
