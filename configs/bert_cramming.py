"""Crammed BERT (Geiping & Goldstein 2023): masked-LM pre-training with cramming's recipe.

    python train.py --config configs/bert_cramming.py --workdir runs/bert      # CPU size
    python train.py --config configs/bert_cramming.py:size=paper --workdir runs/bert

Arguments: ``size`` (``cpu``: width 128, depth 4, 4 heads, 4000 steps of 32 x
128 tokens on the Shakespeare corpus; ``paper``: cramming's ``crammed-bert``,
width 768, depth 16, 12 heads, GELU-GLU 3072, batch 8192 sequences of 128,
``train/bert-o4.yaml``'s recipe with its batch-size ramp (accumulated
micro-batches of 512, from 512 to 8192 sequences over the first 60% of the
30,000 steps), in bfloat16; give ``data.source_dir`` a corpus such as The
Pile's text), ``laplacian`` (Laplacian heads per layer, the last k),
``spectral`` (lambda * I_k conditioning of W_Q, W_K, W_V), ``rule``
(``cramming`` or ``bert`` masking). ``--config.optim.budget_hours=24`` bounds
the run by cramming's one GPU-day of wall time instead of the steps (not
reproducible across machines; docs/bert.md, "Budgets").
"""

from laplax.config.defaults import bert_base_config, parse_arg


def get_config(arg=None):
  """The crammed BERT of ``size`` with the methods' switches."""
  a = parse_arg(arg, size="cpu", laplacian=0, spectral=False, rule="cramming")
  if a.size not in ("cpu", "paper"):
    raise ValueError(f"size={a.size!r} is unknown; use cpu or paper")
  c = bert_base_config()
  c.mlm.rule = a.rule
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  if a.size == "paper":
    c.model.update(width=768, depth=16, num_heads=12, mlp_dim=3072, pooler_dim=1024)
    c.model.dropout = 0.0  # cramming pre-trains without dropout (pretrain_in_train_mode False)
    c.model.dtype = "bfloat16"
    c.data.vocab_size = 32768
    c.batch_size = 8192
    c.eval_batch_size = 256
    # cramming bounds the run by one GPU-day of wall time (budget-triangle2);
    # here the one-cycle schedule runs by steps, reproducibly: 30,000 updates of
    # up to 8192 x 128 tokens (--config.optim.budget_hours=24 is cramming's
    # wall-time budget, total_steps then an upper limit).
    c.total_steps = 30_000
    # bert-o4's batch-size ramp: the batch grows by accumulated micro-batches of
    # 512 (32 a chip of a v5e:4x4; cramming's is an implementation setting, 128
    # on its one GPU) from 512 to 8192 over the first 60% of the budget.
    c.optim.grad_accum_steps = 16
    c.optim.batch_size_ramp = 0.6
    c.eval_every = 5_000
    c.checkpoint_every = 1_000
  else:
    c.total_steps = 4000
    c.eval_every = 1000
    c.checkpoint_every = 1000
    c.log_every = 50
  return c
