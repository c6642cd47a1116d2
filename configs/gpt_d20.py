"""The 561M GPT of the Laplacian-heads paper: depth 20, width 1280, 10 heads of 128.

    python train.py --config configs/gpt_d20.py:laplacian=5 --workdir runs/d20_5l

The paper's best run has 5 of 10 heads Laplacian (``:laplacian=5``, the
default). Rotary positions, untied input and output embeddings, no biases,
qk-norm, BPE vocabulary 65536, context 2048: 20 x 12 x 1280^2 = 393.2M in the
blocks plus 2 x 65536 x 1280 = 167.8M in the embeddings, 561M in all.
Arguments: ``laplacian``, ``spectral``.
"""

from laplax.train.defaults import gpt_base_config, parse_arg


def get_config(arg=None):
  """GPT d20 (561M)."""
  a = parse_arg(arg, laplacian=5, spectral=False)
  c = gpt_base_config()
  c.batch_size = 256
  c.eval_batch_size = 32
  c.total_steps = 21_400
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.data.tokenizer = "bpe"
  c.data.vocab_size = 65536
  m = c.model
  m.max_length, m.width, m.depth, m.num_heads, m.mlp_dim = 2048, 1280, 20, 10, 5120
  m.posemb = "rope"
  m.tie_embeddings = False
  m.use_bias = False
  m.qk_norm = True
  m.dtype = "bfloat16"
  m.num_laplacian_heads = a.laplacian
  m.spectral.enabled = a.spectral
  c.optim.lr = 3e-4
  c.optim.warmup_steps = 1000
  c.optim.b2 = 0.95
  c.optim.weight_decay = 0.0
  return c
