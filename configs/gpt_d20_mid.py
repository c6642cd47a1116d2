"""nanochat's mid-training of the d20 GPT (``configs/gpt_d20.py``): chat
conversations, multiple-choice questions and calculator use, packed as in
pretraining, no loss mask.

    python train.py --config configs/gpt_d20_mid.py --workdir runs/d20_5l_mid \\
        --config.init_from=runs/d20_5l --config.data.source_dir=~/chat_data

Starts from a pretrained d20 workdir (``init_from``: its parameters, model
keys and tokenizer; the optimiser starts fresh). The data directory holds
SmolTalk (``smol-smoltalk/data/``), MMLU (``mmlu/auxiliary_train/``,
``mmlu/all/``) and GSM8K (``gsm8k/main/``) as their Hugging Face
repositories publish them (:mod:`laplax.proj.nanochat.data.mixture`). 256 x 2048
tokens a step, as nanochat's 8 GPUs x 32 rows (``data.streams=8``).

``total_steps``: nanochat runs one epoch of the mixture, a length it learns
while reading; here it is a setting, 800 by default (not measured on the
published data). ``python -m laplax.proj.nanochat.data.mixture --workdir runs/d20_5l
--source_dir ~/chat_data`` renders the mixture once and prints one epoch's
steps for ``--config.total_steps``. Past the epoch the streams go round
again, as nanochat's cursor does.

Arguments: ``schedule`` (``rising``, the default: nanochat 3a5e0bc's rate,
which rises with the fraction of the epoch done, a bug of that release that
the paper's models were trained with; ``fixed``: 1 for 80% of the steps then
linear to 0, as nanochat later fixed it; :mod:`laplax.proj.nanochat.stages`),
``laplacian`` and ``spectral`` (for the record only: the model keys come
from ``init_from``).
"""

from laplax.config.defaults import parse_arg
from laplax.proj.nanochat.stages import sibling_config, stage_config


def get_config(arg=None):
  """GPT d20 mid-training: nanochat's mixture, base learning rates, no clipping."""
  a = parse_arg(arg, schedule="rising", laplacian=5, spectral=False)
  c = sibling_config(__file__, "gpt_d20.py", f"laplacian={a.laplacian},spectral={a.spectral}")
  stage_config(c, "mid", schedule=a.schedule, total_steps=800)
  c.data.streams = 8  # 8 x 32 rows of 2048: nanochat's 8 GPUs
  c.data.max_eval_tokens = 20 * 524_288  # nanochat's eval_tokens
  c.eval_every = 150
  c.checkpoint_every = 150
  c.log_every = 10
  return c
