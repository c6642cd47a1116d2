"""DeiT-3 ViT-B/16 on CIFAR-100 (or CIFAR-10), the Laplacian-heads paper's CIFAR run.

    python train.py --config configs/deit3_cifar.py:laplacian=12,spectral=True --workdir runs/c100

Arguments: ``laplacian`` (Laplacian heads per layer, last k of 12),
``spectral`` (lambda * I_k conditioning), ``dataset`` (``cifar100`` or
``cifar10``), ``image_size`` (images are resized from 32 px; 224 gives
ViT-B/16 its usual 196 patches).

The recipe is DeiT-3's (see configs/deit3_imagenet.py) trained from scratch
for 400 epochs at batch 512. CIFAR must be prepared by TFDS in
``data.data_dir`` on a machine with internet (``tfds build cifar100``).
"""

from laplax.config.defaults import base_config, deit3_recipe, parse_arg

NUM_TRAIN = 50_000


def get_config(arg=None):
  """ViT-B/16, DeiT-3 recipe on cifar100 / cifar10."""
  a = parse_arg(
    arg, laplacian=0, spectral=False, dataset="cifar100", image_size=224, variant="B/16"
  )
  c = base_config()
  c.batch_size = 512
  c.eval_batch_size = 500
  steps_per_epoch = NUM_TRAIN // c.batch_size
  c.log_every = 50
  c.checkpoint_every = 1000

  c.data.name = a.dataset
  c.data.eval_split = "test"
  c.data.image_size = a.image_size
  c.data.crop_padding = 4
  c.data.flip = True
  c.data.mean = (0.5071, 0.4865, 0.4409)
  c.data.std = (0.2673, 0.2564, 0.2762)

  deit3_recipe(
    c,
    variant=a.variant,
    laplacian=a.laplacian,
    spectral=a.spectral,
    steps_per_epoch=steps_per_epoch,
  )
  return c
