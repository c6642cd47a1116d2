"""LRA ListOps with the Nystromformer authors' model (their ``LRA/code/lra_config.py``).

    python -m laplax.data.listops --out ~/lra_release/listops-1000   # or the release
    python train.py --config configs/nystrom_listops.py --workdir runs/listops
    python train.py --config configs/nystrom_listops.py:attention=softmax --workdir runs/lo-soft
    python train.py --config configs/nystrom_listops.py:size=cpu,spectral=10.0,laplacian=1 \\
      --config.data.data_dir=DIR --workdir runs/lo-cpu

Arguments: ``attention`` (``nystrom``, the default, or ``softmax``: the XLA
kernel), ``landmarks`` (64), ``spectral`` (``lambda`` of ``lambda * I_k`` on
``W_Q, W_K, W_V``; ``None`` = off), ``laplacian`` (the last k of the 2 heads
of each layer), ``size`` (``full``: the authors' settings, 2,000 tokens,
5,000 steps of 32, cut at 2,000 and padded to 2,048 as their
``run_tasks.py``; ``cpu``: ListOps generated with ``--min_length 20
--max_length 128`` (128 tokens), 16 landmarks, 300 steps of 32).

The tokens are those of LRA's pipeline since its March 2021 fix, ``]`` a
token (``data.listops_closers``, :mod:`laplax.data.lra.listops`); the
authors' prepared data predates the fix and drops the brackets:
``--config.data.listops_closers=False``.
"""

from laplax.config.defaults import parse_arg
from laplax.tasks.sequence_classification import base_config


def get_config(arg=None):
  """The authors' ListOps model: 2 layers, width 64, 2 heads of 32, MLP 128,
  learned positions, mean pooling, dropout 0.1 (attention dropout 0.1 with
  softmax only), AdamW lr 1e-4, eps 1e-6, without weight decay, torch's
  OneCycleLR with 1,000 warm-up steps (``optim.schedule="onecycle"``)."""
  a = parse_arg(arg, attention="nystrom", landmarks=64, spectral=None, laplacian=0, size="full")
  if a.attention not in ("nystrom", "softmax") or a.size not in ("full", "cpu"):
    raise ValueError("attention must be nystrom or softmax, size full or cpu")
  c = base_config()
  c.batch_size = 32
  c.eval_batch_size = 64
  c.total_steps = 5000
  c.eval_every = 500
  c.checkpoint_every = 500
  c.log_every = 50
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 1000
  c.optim.schedule = "onecycle"  # run_tasks.py: torch's OneCycleLR, beta1 cycled
  c.optim.eps = 1e-6
  # 2,000 tokens in 2,048 positions: the authors' run_tasks.py pads to a power of two.
  c.data.cut_length = 2000
  c.data.max_length = c.model.max_length = 2048
  if a.size == "cpu":
    c.data.data_dir = "~/lra_release/listops-cpu"
    c.data.max_length = c.model.max_length = 128
    c.data.cut_length = 0
    c.total_steps = 300
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 30
    c.eval_every = c.checkpoint_every = 150
    a.landmarks = 16 if a.landmarks == 64 else a.landmarks
  if a.attention == "nystrom":
    c.model.implementation = "nystrom"
    c.model.num_landmarks = a.landmarks
    c.model.conv_kernel_size = 35
    c.model.nystrom_padding = "zero"  # the authors' masking
    c.model.attention_dropout = 0.0  # the authors' Nystrom attention has none
  else:
    c.model.implementation = "xla"
    c.model.attention_dropout = 0.1
  c.model.num_laplacian_heads = a.laplacian
  if a.spectral is not None:
    c.model.spectral.enabled = True
    c.model.spectral.lam = float(a.spectral)
  return c
