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

from laplax.models.vit import decode_variant
from laplax.train.defaults import base_config, parse_arg

NUM_TRAIN = 50_000


def get_config(arg=None):
  """ViT-B/16, DeiT-3 recipe on cifar100 / cifar10."""
  a = parse_arg(arg, laplacian=0, spectral=False, dataset="cifar100",
                image_size=224, variant="B/16")
  c = base_config()
  c.batch_size = 512
  c.eval_batch_size = 500
  steps_per_epoch = NUM_TRAIN // c.batch_size
  c.total_steps = 400 * steps_per_epoch
  c.log_every = 50
  c.eval_every = 10 * steps_per_epoch
  c.checkpoint_every = 1000

  c.data.name = a.dataset
  c.data.eval_split = "test"
  c.data.image_size = a.image_size
  c.data.crop_padding = 4
  c.data.flip = True
  c.data.mean = (0.5071, 0.4865, 0.4409)
  c.data.std = (0.2673, 0.2564, 0.2762)

  c.model.update(decode_variant(a.variant))
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  c.model.qk_norm = True
  c.model.drop_path = 0.2
  c.model.layerscale_init = 1e-6
  c.model.dtype = "bfloat16"

  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.optim.warmup_steps = 5 * steps_per_epoch
  c.optim.grad_clip = 1.0

  c.loss.type = "sigmoid"
  c.loss.label_smoothing = 0.1
  c.loss.mixup = 0.8
  c.loss.cutmix = 1.0
  return c
