"""GPT-2 small (124M parameters; Radford et al. 2019) with Laplacian heads.

    python train.py --config configs/gpt2_124m.py:laplacian=6 --workdir runs/gpt2

Width 768, depth 12, 12 heads, context 1024, learned positions, tied
embeddings, BPE vocabulary 50257 trained on the corpus's training split.
Arguments: ``laplacian`` (last k of 12 heads), ``spectral``.
"""

from laplax.config.defaults import gpt_base_config, parse_arg


def get_config(arg=None):
  """GPT-2 124M."""
  a = parse_arg(arg, laplacian=0, spectral=False)
  c = gpt_base_config()
  c.batch_size = 512
  c.eval_batch_size = 64
  c.total_steps = 20_000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.data.tokenizer = "bpe"
  c.data.vocab_size = 50257
  m = c.model
  m.max_length, m.width, m.depth, m.num_heads, m.mlp_dim = 1024, 768, 12, 12, 3072
  m.posemb = "learn"
  m.tie_embeddings = True
  m.dropout = 0.0
  m.dtype = "bfloat16"
  m.num_laplacian_heads = a.laplacian
  m.spectral.enabled = a.spectral
  c.optim.lr = 6e-4
  c.optim.warmup_steps = 700
  c.optim.min_lr_ratio = 0.1
  c.optim.b2 = 0.95
  return c
