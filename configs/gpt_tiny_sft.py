"""CPU-sized SFT (nanochat's stage, :mod:`laplax.proj.nanochat.stages`) after
``configs/gpt_tiny_mid.py``.

    python train.py --config configs/gpt_tiny_sft.py --workdir runs/chat_sft \\
        --config.init_from=runs/chat_mid --config.data.source_dir=data/chat
    python eval.py --workdir runs/chat_sft --chat_tasks all --chat_data data/chat

``configs/gpt_d20_sft.py`` at CPU size: 8 conversations a step as 2
micro-batches of 4 (the loss is each micro-batch's mean over its assistant
targets, as nanochat's per-GPU batches of 4), 100 steps of 0.02 x the base
rates decaying linearly, no clipping; the model from ``init_from``.
"""

from laplax.proj.nanochat.stages import sibling_config, stage_config


def get_config(arg=None):
  """Tiny SFT: 100 steps of 8 conversations (2 x 4), nanochat's SFT schedule."""
  del arg
  c = sibling_config(__file__, "gpt_shakespeare.py", "tokenizer=nanochat,recipe=nanochat")
  c.model.max_length = 256
  stage_config(c, "sft", total_steps=100)
  c.batch_size = 8
  c.eval_batch_size = 8
  c.optim.grad_accum_steps = 2
  c.data.vocab_size = 2048
  c.data.max_eval_conversations = 32
  c.eval_every = 100
  c.checkpoint_every = 50
  c.log_every = 10
  c.eval.sample_tokens = 0
  return c
