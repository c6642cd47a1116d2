"""Swin Transformer on ImageNet-1k (Liu et al. 2021), the spectral-conditioning paper's Swin-B row.

    python train.py --config configs/swin_imagenet.py --workdir runs/swin_b
    python train.py --config configs/swin_imagenet.py:spectral=True --workdir runs/swin_b_spec
    python train.py --config configs/swin_imagenet.py:laplacian=2 --workdir runs/swin_b_2l
    python train.py --config configs/swin_imagenet.py:size=tiny --workdir runs/swin_fmnist

Arguments: ``size`` (``T``, ``S``, ``B``, ``L``: the Swin paper's sizes at
224 px, window 7; ``tiny``: a CPU-sized Swin on Fashion-MNIST, below),
``spectral`` (``lambda * I_k`` on ``W_Q, W_K, W_V`` of every block),
``lam`` (its ``lambda``, 10 in the paper), ``mode`` (its layout,
``laplax.spectral.MODES``; ``"fused"`` is ``lambda * eye`` on timm's
``[D, 3D]`` qkv kernel), ``laplacian`` (the last ``k`` heads of every block
use ``I - P`` within their window; at most the first stage's heads).

ImageNet recipe (Liu et al. 2021, appendix A2.1, and their released
configs): 300 epochs at 224 px, batch 1024, AdamW lr 1e-3, weight decay 0.05,
cosine with 20 warm-up epochs, gradient clipping at 5.0, drop-path 0.2 / 0.3
/ 0.5 / 0.5 for T / S / B / L, Mixup 0.8, CutMix 1.0, label smoothing 0.1.
Not reproduced here: RandAugment and random erasing (the pipeline does a
random-resized crop and a flip) and the AMP/fp16 of the reference (laplax
trains in bfloat16). ImageNet must be prepared by TFDS in ``data.data_dir``.
The saturated logits of ``lambda = 10`` on both Q and K (docs/methods.md)
apply here as in the ViT: Swin has no qk-norm.
"""

from laplax.config.defaults import base_config, model_config, parse_arg, tiny_fashion_mnist

NUM_TRAIN = 1_281_167
# Liu et al. 2021, Table 1: embed dim, blocks per stage, heads of the first stage.
SIZES = {
  "T": dict(width=96, stage_depths=(2, 2, 6, 2), num_heads=3, drop_path=0.2),
  "S": dict(width=96, stage_depths=(2, 2, 18, 2), num_heads=3, drop_path=0.3),
  "B": dict(width=128, stage_depths=(2, 2, 18, 2), num_heads=4, drop_path=0.5),
  "L": dict(width=192, stage_depths=(2, 2, 18, 2), num_heads=6, drop_path=0.5),
  # CPU scale: 28 px, patch 2 (a 14 x 14 grid), windows of 7 x 7 (the second
  # stage's 7 x 7 grid is one window, unshifted, as timm does).
  "tiny": dict(width=32, stage_depths=(2, 2), num_heads=2, drop_path=0.0),
}


def swin_model(c, size: str, *, laplacian, spectral: bool, lam: float, mode: str) -> None:
  """Sets ``c.model`` to the Swin ``size`` (:data:`SIZES`) with the methods' switches."""
  if size not in SIZES:
    raise ValueError(f"size={size!r} is unknown; use one of {', '.join(SIZES)}")
  s = dict(SIZES[size])
  c.model.name = "swin"
  c.model.width = s["width"]
  c.model.stage_depths = s["stage_depths"]
  c.model.depth = sum(s["stage_depths"])
  c.model.num_heads = s["num_heads"]
  c.model.mlp_dim = 4 * s["width"]
  c.model.patch_size = 2 if size == "tiny" else 4
  c.model.window_size = 7
  c.model.drop_path = s["drop_path"]
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral
  c.model.spectral.lam = lam
  c.model.spectral.mode = mode


def get_config(arg=None):
  """Swin ``size`` with the Swin paper's ImageNet recipe, or ``size=tiny`` on Fashion-MNIST."""
  a = parse_arg(arg, size="B", laplacian=0, spectral=False, lam=10.0, mode="full")
  c = base_config()
  c.model = model_config("swin")  # the swin family's model section, from its spec
  swin_model(c, a.size, laplacian=a.laplacian, spectral=a.spectral, lam=a.lam, mode=a.mode)
  c.optim.weight_decay_exclude = ("relative_position_bias",)
  if a.size == "tiny":
    return tiny_fashion_mnist(c)

  c.batch_size = 1024
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
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.optim.warmup_steps = 20 * steps_per_epoch
  c.optim.grad_clip = 5.0
  c.loss.label_smoothing = 0.1
  c.loss.mixup = 0.8
  c.loss.cutmix = 1.0
  return c
