"""The CPU default language model: a byte-level GPT on the Shakespeare corpus (42 works: 37 plays, 5 poems).

    python train.py --config configs/gpt_shakespeare.py --workdir runs/gpt
    python eval.py --workdir runs/gpt --sample "ROMEO." --temperature 0.8 --top_k 40

Arguments: ``laplacian`` (Laplacian heads per layer, the last k of 4; default
2 = half), ``spectral`` (lambda * I_k conditioning), ``tokenizer`` (``byte``
or ``bpe``), ``recipe`` (``plain``, or ``nanochat``: the model and
optimiser of nanochat's first release at this size, in float32,
:func:`laplax.config.defaults.nanochat_options`), ``target_flops`` (a FLOPs
budget: ``round(F / (FLOPs per token x tokens per step))`` updates instead of
4200, :func:`laplax.config.defaults.apply_target_flops`). Validation is 4 held-out works, every 10th by name: henry_v, macbeth,
rape_of_lucrece (a poem), twelfth_night.
"""

from laplax.config.defaults import (
  apply_target_flops,
  check_recipe,
  gpt_base_config,
  nanochat_options,
  parse_arg,
)


def get_config(arg=None):
  """GPT (width 128, depth 4, 4 heads, rotary, context 64), byte-level.

  4200 steps of 32 x 64 bytes reach 2.27 validation bits per byte (2.41
  after 2000 steps); see docs/results.md for the time on 2 CPU cores. Rotary
  positions learned much faster than learned ones here (2.82 against 3.26
  bits per byte after 300 steps).
  """
  a = parse_arg(
    arg, laplacian=2, spectral=False, tokenizer="byte", recipe="plain", target_flops=None
  )
  check_recipe("gpt", a.recipe)
  c = gpt_base_config()
  c.batch_size = 32
  c.total_steps = 4200
  c.log_every = 50
  c.eval_every = 4200
  c.checkpoint_every = 1000
  c.model.max_length = 64
  c.model.posemb = "rope"
  c.optim.lr = 6e-3
  # Speed only: the gradient of the 32 sequences is computed as 4 micro-batches
  # of 8 (a scan), whose activations fit a CPU's cache (1.1-1.2x on 2 cores,
  # docs/benchmarks.md, "Cache blocking"); batch_size overrides must be multiples of 4, or
  # set optim.grad_accum_steps=1.
  c.optim.grad_accum_steps = 4
  c.data.tokenizer = a.tokenizer
  c.model.num_laplacian_heads = a.laplacian
  c.model.spectral.enabled = a.spectral
  if a.recipe == "nanochat":
    nanochat_options(c)
  c.target_flops = a.target_flops
  apply_target_flops(c)
  return c
