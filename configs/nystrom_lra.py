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
(ListOps 2,000 in 2,048 positions, Text 1,000 in 1,024, Retrieval 4,000 in
4,096), as the authors' data preparation (``LRA/datasets/*.py``: LRA's
pipelines, then zeros appended) does, so that 64 landmarks divide the length.

Text is 1,000 bytes, though ``lra_config.py`` says ``max_seq_len`` 4,000:
the code that runs decides. ``LRA/datasets/text.py`` asks LRA's pipeline for
``max_length = 1000`` and appends 24 zeros, so every input the authors
trained on has 1,024 tokens; ``max_seq_len`` (4,000, rounded to 4,096 by
``run_tasks.py``) only sizes the learned position table, of which the first
1,024 rows are read (here ``model.max_length = 4096`` too). ``text_length=4000``
gives 4,000 bytes in 4,096 positions instead.

As the authors' code: AdamW (0.9, 0.999), eps 1e-6, no weight decay, torch's
``OneCycleLR`` (``optim.schedule="onecycle"``: linear warm-up from lr / 25,
linear decay to lr / 25 / 1e4, beta1 0.95 -> 0.85 -> 0.95); pixels of value
0 masked (``data.mask_zero_pixels``); ListOps' brackets as tokens
(``data.listops_closers``: the LRA pipeline since its March 2021 fix; the
authors' prepared data predates it: ``--config.data.listops_closers=False``).
Pathfinder's difficulty is the authors' README's ``curv_contour_length_14``
(``difficulty=curv_baseline`` or ``curv_contour_length_9`` for the others).

Arguments: ``task`` (``listops``, ``text``, ``retrieval``, ``image``,
``pathfinder``), ``attention`` (``nystrom``, the default, or ``softmax``: the
XLA kernel), ``landmarks`` (64), ``spectral`` (``lambda`` of ``lambda * I_k``
on ``W_Q, W_K, W_V``; ``None`` = off), ``laplacian`` (the last k of the 2
heads of each layer), ``difficulty`` (Pathfinder), ``text_length`` (1000),
``size`` (``full``: the authors' settings; ``cpu``: 16
landmarks, 300 steps of 32 at lr 1e-3, and 512 tokens for text and
retrieval, 128 for ListOps generated with ``--min_length 20 --max_length
128``; images stay 1,024 pixels). ``task=listops`` has the settings of
``configs/nystrom_listops.py``.
"""

import math

from laplax.config.defaults import parse_arg
from laplax.data.lra import image
from laplax.tasks.sequence_classification import base_config

#: The authors' per-task settings: tokens of their prepared data, the
#: position table (``max_seq_len``), vocabulary, batch, steps, warm-up,
#: evaluation interval (all: 2 layers, width 64, 2 heads of 32, MLP 128,
#: learned positions, mean pooling, dropout 0.1, lr 1e-4, OneCycleLR).
TASKS = {
  "listops": dict(length=2000, table=2000, vocab=32, batch=32, steps=5000, warmup=1000, every=500),
  "text": dict(length=1000, table=4000, vocab=512, batch=32, steps=20000, warmup=8000, every=500),
  "retrieval": dict(
    length=4000, table=4000, vocab=512, batch=32, steps=30000, warmup=800, every=300
  ),
  "image": dict(length=1024, table=1024, vocab=512, batch=256, steps=35000, warmup=175, every=175),
  "pathfinder": dict(
    length=1024, table=1024, vocab=512, batch=256, steps=62400, warmup=312, every=312
  ),
}
#: Pathfinder's difficulty in the authors' README (``run_tasks.py --task
#: pathfinder32-curv_contour_length_14``).
DIFFICULTY = "curv_contour_length_14"
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
    arg,
    task="listops",
    attention="nystrom",
    landmarks=64,
    spectral=None,
    laplacian=0,
    size="full",
    difficulty=DIFFICULTY,
    text_length=1000,
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
  if a.difficulty not in image.DIFFICULTIES or int(a.text_length) < 1:
    raise ValueError(
      f"difficulty must be one of {', '.join(image.DIFFICULTIES)}, text_length positive"
    )
  t = dict(TASKS[a.task])
  if a.task == "text":
    t["length"] = int(a.text_length)
  c = base_config()
  c.data.name = a.task
  c.data.data_dir = DATA_DIRS[a.task]
  if a.task == "pathfinder":
    c.data.task_name = a.difficulty
  c.model.vocab_size = t["vocab"]
  c.batch_size = t["batch"]
  c.eval_batch_size = 64
  c.total_steps = t["steps"]
  c.eval_every = c.checkpoint_every = t["every"]
  c.log_every = 50
  c.optim.lr = 1e-4
  c.optim.warmup_steps = t["warmup"]
  c.optim.schedule = "onecycle"  # run_tasks.py: OneCycleLR, anneal_strategy "linear"
  c.optim.eps = 1e-6
  # The authors' data is padded to the next power of two; run_tasks.py rounds
  # the position table (max_seq_len) the same way.
  c.data.cut_length = t["length"]
  c.data.max_length = 2 ** math.ceil(math.log2(t["length"]))
  c.model.max_length = max(2 ** math.ceil(math.log2(t["table"])), c.data.max_length)
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
