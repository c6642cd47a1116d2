"""The Long Range Arena with the Nystromformer authors' models (their ``LRA/code/lra_config.py``).

    python train.py --config configs/nystrom_lra.py:task=text --workdir runs/text \\
      --config.data.data_dir=TFDS_DIR        # imdb_reviews prepared as array_record
    python train.py --config configs/nystrom_lra.py:task=image --config.data.data_dir=TFDS_DIR ...
    python train.py --config configs/nystrom_lra.py:task=retrieval \\
      --config.data.data_dir=~/lra_release/lra_release/tsv_data ...
    python train.py --config configs/nystrom_lra.py:task=pathfinder,attention=softmax \\
      --config.data.data_dir=~/lra_release/lra_release/pathfinder32 ...
    python train.py --config configs/nystrom_lra.py:task=listops,size=cpu,spectral=10.0 ...

Inputs are cut at the task's length and padded to the next power of two
(ListOps 2,000 in 2,048 positions, Text and Retrieval 4,000 in 4,096), as the
authors' ``run_tasks.py`` does, so that 64 landmarks divide the length.

Arguments: ``task`` (``listops``, ``text``, ``retrieval``, ``image``,
``pathfinder``), ``attention`` (``nystrom``, the default, or ``softmax``: the
XLA kernel), ``landmarks`` (64), ``spectral`` (``lambda`` of ``lambda * I_k``
on ``W_Q, W_K, W_V``; ``None`` = off), ``laplacian`` (the last k of the 2
heads of each layer), ``size`` (``full``: the authors' settings; ``cpu``: 16
landmarks, 300 steps of 32 at lr 1e-3, and 512 tokens for text and
retrieval, 128 for ListOps generated with ``--min_length 20 --max_length
128``; images stay 1,024 pixels). ``task=listops`` has the settings of
``configs/nystrom_listops.py``.
"""

import math

from laplax.config.defaults import parse_arg
from laplax.tasks.sequence_classification import base_config

#: The authors' per-task settings: tokens, vocabulary, classes, batch, steps,
#: warm-up, evaluation interval (all: 2 layers, width 64, 2 heads of 32,
#: MLP 128, learned positions, mean pooling, dropout 0.1, lr 1e-4, linear decay).
TASKS = {
  "listops": dict(length=2000, vocab=32, batch=32, steps=5000, warmup=1000, every=500),
  "text": dict(length=4000, vocab=512, batch=32, steps=20000, warmup=8000, every=500),
  "retrieval": dict(length=4000, vocab=512, batch=32, steps=30000, warmup=800, every=300),
  "image": dict(length=1024, vocab=512, batch=256, steps=35000, warmup=175, every=175),
  "pathfinder": dict(length=1024, vocab=512, batch=256, steps=62400, warmup=312, every=312),
}
DATA_DIRS = {
  "listops": "~/lra_release/listops-1000",
  "text": "~/tensorflow_datasets",
  "retrieval": "~/lra_release/lra_release/tsv_data",
  "image": "~/tensorflow_datasets",
  "pathfinder": "~/lra_release/lra_release/pathfinder32",
}
CPU_LENGTH = {"listops": 128, "text": 512, "retrieval": 512, "image": 1024, "pathfinder": 1024}


def get_config(arg=None):
  """The authors' model and schedule for ``task`` (module docstring)."""
  a = parse_arg(
    arg, task="listops", attention="nystrom", landmarks=64, spectral=None, laplacian=0, size="full"
  )
  if (
    a.task not in TASKS
    or a.attention not in ("nystrom", "softmax")
    or a.size
    not in (
      "full",
      "cpu",
    )
  ):
    raise ValueError(
      f"task must be one of {', '.join(TASKS)}, attention nystrom or softmax, size full or cpu"
    )
  t = TASKS[a.task]
  c = base_config()
  c.data.name = a.task
  c.data.data_dir = DATA_DIRS[a.task]
  if a.task == "pathfinder":
    c.data.task_name = "curv_baseline"
  c.model.vocab_size = t["vocab"]
  c.batch_size = t["batch"]
  c.eval_batch_size = 64
  c.total_steps = t["steps"]
  c.eval_every = c.checkpoint_every = t["every"]
  c.log_every = 50
  c.optim.lr = 1e-4
  c.optim.warmup_steps = t["warmup"]
  c.optim.schedule = "warmdown"
  c.optim.warmdown_ratio = 1.0  # linear decay after the warm-up ("lr_decay": "linear")
  # The authors pad to the next power of two (run_tasks.py: 2 ** ceil(log2(max_seq_len))).
  c.data.cut_length = t["length"]
  c.data.max_length = c.model.max_length = 2 ** math.ceil(math.log2(t["length"]))
  if a.size == "cpu":
    if a.task == "listops":
      c.data.data_dir = "~/lra_release/listops-cpu"
    c.data.max_length = c.model.max_length = CPU_LENGTH[a.task]
    c.data.cut_length = 0
    c.batch_size = 32
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
