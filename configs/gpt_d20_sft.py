"""nanochat's SFT (supervised fine-tuning) of the d20 GPT after mid-training.

    python train.py --config configs/gpt_d20_sft.py --workdir runs/d20_5l_sft \\
        --config.init_from=runs/d20_5l_mid --config.data.source_dir=~/chat_data
    python eval.py --workdir runs/d20_5l_sft --chat_tasks all --chat_data ~/chat_data

Starts from the mid-training workdir (``init_from``; fresh optimiser). The
mixture: ARC-Easy and ARC-Challenge train (``ai2_arc/ARC-*/``), GSM8K train
(``gsm8k/main/``) and the first 10,000 of SmolTalk train
(``smol-smoltalk/data/``), 20,843 conversations in the published sets
(:mod:`laplax.proj.nanochat.data.mixture`). 32 conversations a step, each padded to
the context with ``<|assistant_end|>`` and targets -1 where the assistant
is not trained; the loss is the mean over each micro-batch of 4 (nanochat's
8 GPUs x 4: ``optim.grad_accum_steps=8``). 650 updates (nanochat: ``20843
// 32 = 651`` iterations, the last not taken), the rates of gpt_d20 times
0.02 times ``1 - it / 651``, Muon momentum 0.95, no clipping
(:mod:`laplax.proj.nanochat.stages`). Validation: the loss on the assistant
tokens of the first 3,200 SmolTalk test conversations (nanochat: 100 steps of
8 x 4), every 100 steps.

Arguments: ``laplacian`` and ``spectral`` (for the record only: the model
keys come from ``init_from``).
"""

from laplax.config.defaults import parse_arg
from laplax.proj.nanochat.stages import sibling_config, stage_config


def get_config(arg=None):
  """GPT d20 SFT: nanochat's mixture, 0.02 x the base rates decaying linearly, 650 steps."""
  a = parse_arg(arg, laplacian=5, spectral=False)
  c = sibling_config(__file__, "gpt_d20.py", f"laplacian={a.laplacian},spectral={a.spectral}")
  stage_config(c, "sft", total_steps=650)
  c.batch_size = 32
  c.eval_batch_size = 32
  c.optim.grad_accum_steps = 8  # nanochat's 8 GPUs x 4 conversations
  c.data.max_eval_conversations = 3200
  c.eval_every = 100
  c.checkpoint_every = 100
  c.log_every = 10
  return c
