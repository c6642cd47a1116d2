"""DaViT on ImageNet-1k (Ding et al. 2022), the spectral-conditioning paper's DaViT-B row.

    python train.py --config configs/davit_imagenet.py --workdir runs/davit_b
    python train.py --config configs/davit_imagenet.py:spectral=True --workdir runs/davit_b_spec
    python train.py --config configs/davit_imagenet.py:laplacian=2 --workdir runs/davit_b_2l
    python train.py --config configs/davit_imagenet.py:size=tiny --workdir runs/davit_fmnist

Arguments: ``size`` (``T``, ``S``, ``B``: timm's ``davit_tiny``, ``_small``,
``_base`` at 224 px, window 7; ``tiny``: a CPU-sized DaViT on Fashion-MNIST,
below), ``spectral`` (``lambda * I_k`` on ``W_Q, W_K, W_V`` of every spatial
and channel attention), ``lam`` (its ``lambda``, 10 in the paper), ``mode``
(its layout, ``laplax.spectral.MODES``; ``"fused"`` is ``lambda * eye`` on
timm's ``[D, 3D]`` qkv kernel), ``laplacian`` (the last ``k`` heads of every
spatial block use ``I - P`` within their window, the last ``k`` channel
groups of every channel block ``I - P`` over their channels; at most the
first stage's heads).

ImageNet recipe (Ding et al. 2022, section 4.1, following Swin/DeiT): 300
epochs at 224 px, batch 2048, AdamW lr 2e-3, weight decay 0.05, cosine with
20 warm-up epochs, drop-path 0.1 / 0.2 / 0.4 for T / S / B, Mixup 0.8,
CutMix 1.0, label smoothing 0.1. Not reproduced here: RandAugment and random
erasing (the pipeline does a random-resized crop and a flip). ImageNet must
be prepared by TFDS in ``data.data_dir``.
"""

from laplax.config.defaults import base_config, model_config, parse_arg, tiny_fashion_mnist

NUM_TRAIN = 1_281_167
# timm's davit_tiny / _small / _base: embed dim, dual blocks per stage, heads of the first stage.
SIZES = {
  "T": dict(width=96, stage_depths=(1, 1, 3, 1), num_heads=3, drop_path=0.1),
  "S": dict(width=96, stage_depths=(1, 1, 9, 1), num_heads=3, drop_path=0.2),
  "B": dict(width=128, stage_depths=(1, 1, 9, 1), num_heads=4, drop_path=0.4),
  # CPU scale: 28 px, the stem's stride 4 (a 7 x 7 grid: one window of 7),
  # then 4 x 4 (padded to one 7 x 7 window with zeros, as timm does).
  "tiny": dict(width=32, stage_depths=(1, 1), num_heads=2, drop_path=0.0),
}


def davit_model(c, size: str, *, laplacian, spectral: bool, lam: float, mode: str) -> None:
  """Sets ``c.model`` to the DaViT ``size`` (:data:`SIZES`) with the methods' switches."""
  if size not in SIZES:
    raise ValueError(f"size={size!r} is unknown; use one of {', '.join(SIZES)}")
  s = dict(SIZES[size])
  c.model.name = "davit"
  c.model.width = s["width"]
  c.model.stage_depths = s["stage_depths"]
  c.model.depth = 2 * sum(s["stage_depths"])
  c.model.num_heads = s["num_heads"]
  c.model.mlp_dim = 4 * s["width"]
  c.model.window_size = 7
  c.model.drop_path = s["drop_path"]
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral
  c.model.spectral.lam = lam
  c.model.spectral.mode = mode


def get_config(arg=None):
  """DaViT ``size`` with the DaViT paper's ImageNet recipe, or ``size=tiny`` on Fashion-MNIST."""
  a = parse_arg(arg, size="B", laplacian=0, spectral=False, lam=10.0, mode="full")
  c = base_config()
  c.model = model_config("davit")  # the davit family's model section, from its spec
  davit_model(c, a.size, laplacian=a.laplacian, spectral=a.spectral, lam=a.lam, mode=a.mode)
  if a.size == "tiny":
    return tiny_fashion_mnist(c)

  c.batch_size = 2048
  c.eval_batch_size = 1024
  steps_per_epoch = NUM_TRAIN // c.batch_size
  c.total_steps = 300 * steps_per_epoch
  c.eval_every = 10 * steps_per_epoch
  c.log_every = 100
  c.checkpoint_every = 2000
  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.image_size = 224
  c.data.crop_padding = 0
  c.data.flip = True
  c.data.mean = (0.485, 0.456, 0.406)
  c.data.std = (0.229, 0.224, 0.225)
  c.data.num_threads = 16
  c.model.dtype = "bfloat16"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.optim.warmup_steps = 20 * steps_per_epoch
  c.loss.label_smoothing = 0.1
  c.loss.mixup = 0.8
  c.loss.cutmix = 1.0
  return c
