"""nanochat's d20 (560,988,160 parameters) with Laplacian heads, or the authors' fork's GPT.

    python train.py --config configs/gpt_d20.py:laplacian=5 --workdir runs/d20_5l

Depth 20, width 1280 (64 x depth), 10 heads of 128, context 2048, vocabulary
65,536: ``2 x 65536 x 1280`` in the untied embeddings plus ``20 x 12 x
1280^2`` in the blocks, 560,988,160 in all (no biases, norm gains or
position embeddings). 21,400 steps of 256 x 2048 = 524,288 tokens, nanochat's
``20 N // 524288``. Arguments: ``laplacian`` (the last k heads of every
layer are Laplacian, ``V - P V``; default 5 of 10, the paper's best run; a
per-layer list goes in ``--config.model.num_laplacian_heads``), ``spectral``,
``kv_heads`` (``model.num_kv_heads``: grouped-query attention with that many
key/value heads, a divisor of the heads; default one per head, as nanochat
trains).

This is the model and optimiser of nanochat's first release
(``karpathy/nanochat`` 3a5e0bc; :func:`laplax.config.defaults.nanochat_options`
lists them): the same forward (rotary in nanochat's convention, qk-norm after
it, the logit soft-cap 15, ReLU^2, parameter-free RMSNorm with eps ``2^-23``,
the bfloat16 token embedding), the same initialisation, and its optimiser step
for step (:mod:`laplax.proj.nanochat.optim.first_release`: Muon 0.02 with the momentum
ramp, AdamW 0.2 s / 0.004 s with ``s = (1280/768)^-1/2``, betas (0.8, 0.95),
eps 1e-10, the constant rate with the linear warm-down over the last 20%,
clipping at 1.0). ``python -m laplax.convert --from nanochat`` and ``--to
nanochat`` move its weights both ways (docs/language-models.md, "nanochat's d20").

What still differs from nanochat, and why:

* clipping: nanochat has no DDP wrapper (its optimizers average the
  gradients), so each of the 8 GPUs clips its own gradient, of 32 sequences,
  before the average; laplax clips the gradient of the whole batch once (it
  has one gradient, whatever the devices).
* precision: nanochat runs under bfloat16 autocast with TF32 matmuls; here
  the matmuls run in ``dtype`` bfloat16 with float32 accumulation, the
  rotation in float32 from the bfloat16 table rounded once, the final norm,
  ``lm_head``, the soft-cap and the cross-entropy in float32 (nanochat's
  ``lm_head`` and soft-cap are bfloat16). Both keep float32 weights except
  the bfloat16 token embedding and its AdamW moments.
* data: the input is FineWeb-Edu's parquet shards (``data.source_dir``)
  with nanochat's tokenizer, BOS per document and nanochat's packing; the
  batch is 256 sequences at once (nanochat: 8 GPUs x 32, or 8 micro-batches
  of 32 on one), so the mean gradient is the same but not its per-GPU parts.
* evaluation: validation loss / bits per byte on the config's schedule
  (nanochat: every 250 steps on 20 x 524,288 tokens, CORE every 2000).
* later nanochat releases and the authors' fork differ more: see below.

``recipe=nanochat-fork`` (with ``depth=``, default 20) is instead the GPT of
the Laplacian authors' nanochat fork (``yuchongzhang/nanochat`` 1f70b557,
:func:`laplax.config.defaults.nanochat_fork_model`): width ``ceil(64 depth /
128) * 128`` with heads of 128, context 2048, vocabulary 32,768 (padded to a
multiple of 64), value embeddings with their gates, ``resid_lambdas`` and
``x0_lambdas``, the smear, the backout, ``SSSL`` sliding windows, ``q, k`` x
1.2, rotary base 100,000 and the fork's initialisation; and its
compute-optimal schedule (:func:`~laplax.config.defaults.nanochat_fork_training`:
d20 trains 4,980 updates of 2^20 tokens, 40 warm-up steps, warm-down over
the last 65% to 0.05) with its optimiser, ``MuonAdamW``
(:mod:`laplax.proj.nanochat.optim.fork`: seven AdamW and Muon groups, Polar
Express, NorMuon, cautious weight decay, the momentum and decay schedules). The
fork's tokenizer has 32,768 tokens: give it with ``data.tokenizer_dir``.
``default`` (the default) is nanochat's first release as above.

    python train.py --config configs/gpt_d20.py:recipe=nanochat-fork,depth=12,laplacian=2

``target_flops`` (either recipe; ``--config.target_flops=`` is the same) is
a FLOPs budget, nanochat's ``--target-flops``: the run trains
``round(F / (FLOPs per token x tokens per step))`` updates instead of the
parameter-data ratio's horizon, the FLOPs per token of
:func:`laplax.config.defaults.gpt_flops_per_token` (the fork's
``estimate_flops``: d20 2.886e9), on the batch the recipe chose (the fork
keeps its batch size rule). ``--config.total_steps=`` on the command line
still wins (nanochat's ``--num-iterations``), and the count is taken on the
config after every ``--config`` override
(:func:`~laplax.config.defaults.apply_target_flops`).

    python train.py --config configs/gpt_d20.py:recipe=nanochat-fork,depth=12,target_flops=1e18
"""

from laplax.config.defaults import (
  apply_target_flops,
  gpt_base_config,
  nanochat_fork_model,
  nanochat_fork_size,
  nanochat_fork_training,
  nanochat_num_params,
  nanochat_options,
  nanochat_steps,
  parse_arg,
)
from laplax.data.text import fineweb


def get_config(arg=None):
  """GPT d20 (560,988,160 parameters) with nanochat's architecture and optimiser
  (``recipe=nanochat-fork``: the fork's d``depth``, its horizon and rates);
  ``target_flops``: the updates of that FLOPs budget instead of the horizon.

  Raises:
    ValueError: an unknown ``recipe``, or ``depth`` without the fork's recipe.
  """
  a = parse_arg(
    arg, laplacian=5, spectral=False, recipe="default", depth=20, kv_heads=None, target_flops=None
  )
  if a.recipe not in ("default", "nanochat-fork"):
    raise ValueError(f"recipe={a.recipe!r} is unknown; use default or nanochat-fork")
  if a.recipe == "default" and a.depth != 20:
    raise ValueError("depth= needs recipe=nanochat-fork (the default recipe is d20)")
  c = gpt_base_config()
  c.batch_size = 256
  c.eval_batch_size = 32
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
  depth = 20
  m.max_length, m.width, m.depth, m.num_heads = 2048, 64 * depth, depth, 10
  m.mlp_dim = 4 * m.width
  nanochat_options(c)
  m.dtype = "bfloat16"
  m.embedding_dtype = "bfloat16"
  # lm_head, soft-cap and cross-entropy 256 positions at a time: the float32
  # logits of 16 sequences x 2048 x 65,536 (8 GiB a chip of a v5e:4x4 slice,
  # two such arrays in the step) never formed (docs/scale-out.md).
  m.loss_chunk = 256
  m.num_laplacian_heads = a.laplacian
  m.num_kv_heads = a.kv_heads
  m.spectral.enabled = a.spectral
  if a.recipe == "nanochat-fork":
    m.depth = a.depth
    m.width, m.num_heads = nanochat_fork_size(a.depth)
    m.mlp_dim = 4 * m.width
    c.data.vocab_size = 32768
    nanochat_fork_model(c)
    nanochat_fork_training(c, a.depth)
  else:
    c.total_steps = nanochat_steps(
      nanochat_num_params(m.width, m.depth, c.data.vocab_size), c.batch_size * m.max_length
    )
  c.target_flops = a.target_flops
  apply_target_flops(c)
  return c
