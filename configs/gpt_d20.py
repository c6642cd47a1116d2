"""The 561M GPT of the Laplacian-heads paper: depth 20, width 1280, 10 heads of 128.

    python train.py --config configs/gpt_d20.py:laplacian=5 --workdir runs/d20_5l

The paper's best run has 5 of 10 heads Laplacian (``:laplacian=5``, the
default). BPE vocabulary 65536, context 2048: 20 x 12 x 1280^2 = 393.2M in
the blocks plus 2 x 65536 x 1280 = 167.8M in the untied embeddings, 561M in
all (the norms have no parameters). Arguments: ``laplacian``, ``spectral``.

What "d20" means here: the architecture and optimiser options of the
authors' nanochat (``yuchongzhang/nanochat``, ``nanochat/gpt.py`` and
``scripts/base_train.py``) that laplax has:

* rotary positions (``posemb="rope"``), no biases, untied embeddings;
* parameter-free RMSNorm (``norm="rmsnorm"``) before attention and the MLP,
  after the token embedding (``embed_norm``) and before the output layer;
* ReLU^2 MLP of width 4 x 1280 (``mlp_activation="relu2"``);
* qk-norm as parameter-free RMSNorm, then q and k each times 1.2
  (``qk_norm_type="rmsnorm"``, ``qk_scale=1.2``; logits 1.44 q.k/sqrt(128));
* zero-initialised ``W_O`` and MLP output (``zero_init_out``);
* Muon (``optax.contrib.muon``: Nesterov momentum 0.95, 5 Newton-Schulz
  steps) on the block matrices at 0.02; AdamW on the token embedding at
  0.3 and on the output layer at 0.008, both times nanochat's
  ``(1280 / 768) ** -0.5`` (0.2324 and 0.0062); ``b1=0.8``; no clipping.
  The batch, 256 x 2048 = 2^19 tokens, is nanochat's reference batch, so
  its batch learning-rate scaling is 1.

Differences from nanochat, not implemented:

* value embeddings (ResFormer value residual with a sigmoid gate on
  alternating layers), per-layer residual scalars (``resid_lambdas``) and
  re-injection of the first embedding (``x0_lambdas``), the previous-token
  "smear" and the mid-layer "backout" subtraction;
* sliding-window layers (pattern "SSSL": three quarter-context layers, then
  a full one; the last layer always full);
* the logit soft-cap ``15 tanh(logits / 15)``; the vocabulary padded to a
  multiple of 64; grouped-query attention (nanochat's d20 has none);
* initialisation: nanochat draws the embedding from N(0, 0.8), the output
  layer from N(0, 0.001), ``W_Q, W_K, W_V`` uniform with std 1/sqrt(1280)
  and the MLP's first layer at 0.4 of that; here GPT-2's normal 0.02;
* rotary base 100000 in nanochat, 10000 here (and nanochat rotates by
  -theta and normalises after rotary: both equivalent);
* optimiser details: nanochat's MuonAdamW (``nanochat/optim.py``, not read
  here) with its second-moment ``beta2=0.9`` and its own update scaling
  (laplax uses optax's ``sqrt(max(1, fan_out / fan_in))``), a Muon
  momentum ramp 0.85 -> 0.97 -> 0.90, cautious weight decay 0.28 (rescaled
  with batch and horizon, cosine to 0; 0 here), per-group Adam betas
  (0.8, 0.96) / (0.8, 0.995), eps 1e-10 and decays 0.01 / 0.001; its
  schedule is warm-up 40, constant, linear warm-down over the last 65% to
  0.05 (here laplax's warm-up + cosine); its horizon and batch come from
  scaling laws (here 21400 steps);
* bfloat16 weights of the embeddings and fp8 matmuls (options there).
"""

from laplax.data import fineweb
from laplax.train.defaults import gpt_base_config, nanochat_options, parse_arg


def get_config(arg=None):
  """GPT d20 (561M) with nanochat's architecture and optimiser options."""
  a = parse_arg(arg, laplacian=5, spectral=False)
  c = gpt_base_config()
  c.batch_size = 256
  c.eval_batch_size = 32
  c.total_steps = 21_400
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  # FineWeb-Edu parquet shards (--config.data.source_dir=DIR) with nanochat's
  # 65,536-token tokenizer, packed as nanochat's 8 GPUs read them: 8 streams of
  # 32 x 2048 tokens per step; validation bpb on 20 x 524,288 tokens.
  c.data = fineweb.default_config()
  c.data.streams = 8
  c.data.max_eval_tokens = 20 * 524_288
  m = c.model
  m.max_length, m.width, m.depth, m.num_heads, m.mlp_dim = 2048, 1280, 20, 10, 5120
  nanochat_options(c)  # the architecture and Muon/AdamW options, as in gpt_shakespeare
  m.dtype = "bfloat16"
  m.num_laplacian_heads = a.laplacian
  m.spectral.enabled = a.spectral
  c.optim.lr = 3e-4  # the other AdamW leaves (none in this config)
  c.optim.warmup_steps = 40
  return c
