"""GLUE fine-tuning of a pre-trained BERT with cramming's recipe (Geiping & Goldstein 2023).

    python train.py --config configs/bert_glue.py:task=cola --workdir runs/glue_cola \\
      --config.init_from=runs/bert --config.data.data_dir=~/tensorflow_datasets
    python eval.py --workdir runs/glue_cola          # eval.json: the task's GLUE metric
    python -m laplax.tasks.glue runs/glue_cola runs/glue_sst2 ...   # the GLUE average

Arguments: ``task`` (``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``,
``mnli``, ``qnli``, ``rte``, ``wnli``; :data:`laplax.tasks.glue.TASKS`),
``epochs`` (cramming's 5). The model keys come from ``init_from`` (the
pre-trained run, its tokenizer copied); ``total_steps`` is ``epochs`` passes
over the task's training split in batches of 16, 10% of them warm-up
(``JonasGeiping/cramming``, ``config/eval/GLUE_sane.yaml``). The data are
TFDS's ``glue/TASK`` builders prepared in array_record format (``tfds build
glue/cola --data_dir=DIR --file_format=array_record`` on a machine with
internet).
"""

import math

from laplax.config.defaults import parse_arg
from laplax.tasks.glue import TASKS, TRAIN_EXAMPLES, base_config


def get_config(arg=None):
  """Fine-tuning on GLUE task ``task`` for ``epochs`` epochs."""
  a = parse_arg(arg, task="cola", epochs=5)
  if a.task not in TASKS:
    raise ValueError(f"task={a.task!r} is unknown; use one of {', '.join(TASKS)}")
  c = base_config()
  c.glue.task = a.task
  c.total_steps = int(a.epochs) * math.ceil(TRAIN_EXAMPLES[a.task] / c.batch_size)
  c.optim.warmup_steps = c.total_steps // 10
  c.eval_every = c.total_steps
  c.checkpoint_every = min(1000, c.total_steps)
  return c
