"""CPU-sized mid-training (nanochat's stage, :mod:`laplax.proj.nanochat.stages`)
of a tiny GPT pretrained with nanochat's tokenizer.

    python -m laplax.proj.nanochat.data.fixtures data/chat      # synthetic stand-ins
    python train.py --config configs/gpt_tiny_mid.py --workdir runs/chat_mid \\
        --config.init_from=runs/chat_base --config.data.source_dir=data/chat

``configs/gpt_d20_mid.py`` at the size of ``configs/gpt_shakespeare.py``
(``:recipe=nanochat``: nanochat's optimiser): 16 rows of the context a
step, 150 steps (about 8 epochs of ``laplax.proj.nanochat.data.fixtures``' sets), one
stream; the model (and its context) come from
``init_from`` (docs/language-models.md, "Chat stages end to end").
Arguments: ``schedule`` (``rising`` or ``fixed``, as gpt_d20_mid).
"""

from laplax.config.defaults import parse_arg
from laplax.proj.nanochat.stages import sibling_config, stage_config


def get_config(arg=None):
  """Tiny mid-training: 150 steps of 16 rows, nanochat's optimiser and schedule."""
  a = parse_arg(arg, schedule="rising")
  c = sibling_config(__file__, "gpt_shakespeare.py", "tokenizer=nanochat,recipe=nanochat")
  c.model.max_length = 256
  stage_config(c, "mid", schedule=a.schedule, total_steps=150)
  c.batch_size = 16
  c.eval_batch_size = 16
  c.optim.grad_accum_steps = 1
  c.data.vocab_size = 2048
  c.data.max_eval_tokens = 16 * 256 * 4
  c.eval_every = 150
  c.checkpoint_every = 50
  c.log_every = 10
  c.eval.sample_tokens = 0
  return c
