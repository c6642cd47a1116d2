"""Defaults shared by the config files in ``configs/``.

Each config file's ``get_config(arg)`` starts from :func:`base_config`, parses
its ``FILE.py:key=value,...`` argument with :func:`parse_arg`, and sets what
its experiment changes.
"""

from __future__ import annotations

import ast
import math

import ml_collections
from ml_collections import config_dict

from laplax import sharding
from laplax.models import spec as spec_lib


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses ``"laplacian=5,spectral=True"`` into a ConfigDict over ``defaults``.

  Values are Python literals (``True``, ``12``, ``0.1``) or bare strings.

  Raises:
    ValueError: a key that is not in ``defaults`` or an item without ``=``.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ValueError(
        f"config argument {item!r} is not key=value with key in {', '.join(defaults)}"
      )
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    out[key] = value
  return out


def model_config(name: str) -> ml_collections.ConfigDict:
  """The ``config.model`` section of family ``name`` (``"vit"``, ``"gpt"``) from the model spec.

  Keys and defaults are :func:`laplax.models.spec.config_defaults`'; ``None`` defaults
  become typed placeholders so ``--config.model.KEY=`` type-checks
  (``num_laplacian_heads``: an int, the last k heads of every layer, or a per-layer
  list; ``laplacian_mask``: per-layer tuples of booleans).
  """

  def section(values: dict) -> ml_collections.ConfigDict:
    out = ml_collections.ConfigDict()
    for key, value in values.items():
      if isinstance(value, dict):
        out[key] = section(value)
      elif key == "num_laplacian_heads":
        out[key] = config_dict.FieldReference(value, field_type=object)
      elif key == "laplacian_mask":
        out[key] = config_dict.placeholder(tuple)
      elif value is None:
        out[key] = config_dict.placeholder(spec_lib.field_type(name, key))
      else:
        out[key] = value
    return out

  return section(spec_lib.config_defaults(name))


def _optim_config() -> ml_collections.ConfigDict:
  """The ``optim`` keys of :func:`base_config` (AdamW by default)."""
  o = ml_collections.ConfigDict()
  o.lr = 1e-3
  o.b1 = 0.9
  o.b2 = 0.999
  o.weight_decay = 0.05
  o.warmup_steps = 100
  o.min_lr_ratio = 0.0
  # "cosine": linear warm-up, cosine to min_lr_ratio * lr; "warmdown":
  # nanochat's constant rate, then linear to min_lr_ratio * lr over the last
  # warmdown_ratio of the steps; "progress": nanochat 3a5e0bc's mid-training
  # rate, rising as the fraction of the steps done (laplax.optim.
  # learning_rate_schedule). schedule_steps: the schedule's horizon (None:
  # total_steps; nanochat's SFT decays over 651 steps and stops after 650).
  o.schedule = "cosine"
  o.warmdown_ratio = 0.2
  o.schedule_steps = config_dict.placeholder(int)
  o.grad_clip = 1.0
  o.weight_decay_exclude = ("pos_embedding", "cls")
  # "adamw", or "muon": optax.contrib.muon on the block matrices, AdamW on
  # the rest, the embeddings and the output layer at their own peak learning
  # rates (None: optim.lr), as nanochat's setup_optimizer (laplax.optim);
  # or "nanochat": those groups with nanochat's own Muon, AdamW and clipping
  # (laplax.proj.nanochat.optim.first_release; its keys: nanochat_options).
  o.optimizer = "adamw"
  o.muon_lr = 0.02
  o.muon_momentum = 0.95
  o.muon_weight_decay = 0.0
  # "nanochat" only: the Muon momentum ramps from muon_momentum_start to
  # muon_momentum over muon_momentum_ramp_steps; AdamW's eps.
  o.muon_momentum_start = 0.85
  o.muon_momentum_ramp_steps = 300
  o.adam_eps = 1e-10
  o.embedding_lr = config_dict.placeholder(float)
  o.unembedding_lr = config_dict.placeholder(float)
  # Micro-batches per optimizer step (batch_size stays the global batch and
  # must be divisible by it); the gradient is their mean.
  o.grad_accum_steps = 1
  # Unroll the micro-batch loop in the compiled step (same values; faster on a
  # CPU when a micro-batch's activations fit the cache, longer compile).
  o.grad_accum_unroll = False
  # cramming's wall-time budget (its budget-*, e.g. budget-triangle2), in
  # hours: the schedule's progress is the elapsed training time over the
  # budget (total_steps then only an upper limit) and the run stops once the
  # budget is spent; the elapsed time is saved with each checkpoint
  # (laplax.train.budget). Not reproducible across machines, unlike a run
  # bounded by total_steps. None: the schedule runs by steps. AdamW only.
  o.budget_hours = config_dict.placeholder(float)
  # cramming's batch-size ramp: the batch grows from one micro-batch
  # (batch_size / grad_accum_steps) to batch_size, one micro-batch more each
  # (ramp x budget) / grad_accum_steps, over the first batch_size_ramp of the
  # budget (budget_hours, else total_steps); the micro-batches are
  # accumulated. 0: off, every update the whole batch.
  o.batch_size_ramp = 0.0
  # A non-finite loss or gradient norm stops the run (False) or, with True,
  # leaves that step's update out (parameters, optimizer and task state keep
  # their values) and counts it in the metrics as skipped_updates.
  o.skip_nonfinite = False
  return o


def _environment_config(c: ml_collections.ConfigDict) -> None:
  """Adds the scale-out and observability keys of :func:`base_config` to ``c``."""
  # Scale-out (laplax.sharding). Device mesh (data, fsdp, tensor); one -1
  # takes the remaining devices: (-1, 1, 1) is data parallel over all of them.
  c.mesh_shape = (-1, 1, 1)
  # (logical axis, mesh axis | tuple of mesh axes | None) pairs, first match wins.
  c.sharding_rules = sharding.DEFAULT_RULES
  # Multi-process runs: jax.distributed.initialize(coordinator_address,
  # num_processes, process_id) when coordinator_address is set, or with
  # enabled=True from the environment (SLURM, Open MPI, TPU, JAX_* variables).
  c.distributed = ml_collections.ConfigDict()
  c.distributed.enabled = False
  c.distributed.coordinator_address = config_dict.placeholder(str)
  c.distributed.num_processes = config_dict.placeholder(int)
  c.distributed.process_id = config_dict.placeholder(int)

  # Observability (docs/observability.md). profile: a jax.profiler trace of
  # num_steps training steps from start_step on (each step annotated
  # "train"), written under WORKDIR/profile/; num_steps 0 = no trace.
  c.profile = ml_collections.ConfigDict()
  c.profile.start_step = 10
  c.profile.num_steps = 0
  # Weights & Biases (optional; needs `pip install wandb`): with a project,
  # the scalars, the config, GPT samples and eval.py's figures are logged to
  # it too. mode "online", "offline" or "disabled" (None: wandb's own
  # default, e.g. WANDB_MODE); name None: the workdir's name.
  c.wandb = ml_collections.ConfigDict()
  c.wandb.project = config_dict.placeholder(str)
  c.wandb.entity = config_dict.placeholder(str)
  c.wandb.name = config_dict.placeholder(str)
  c.wandb.mode = config_dict.placeholder(str)


def base_config() -> ml_collections.ConfigDict:
  """Every key the trainer reads, with CPU-friendly defaults."""
  c = ml_collections.ConfigDict()
  c.task = "classification"
  c.seed = 0
  c.batch_size = 128
  c.eval_batch_size = 500
  c.total_steps = 1000
  c.log_every = 50
  c.eval_every = 1000
  # The evaluators, by name (laplax.evaluators.registry): the training loop
  # runs those of its stage at every eval_every and at the end, eval.py
  # those of its stage. Their settings are the eval section, whose keys and
  # defaults each evaluator declares (the registry adds them).
  c.evals = "classification"
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  # A CRC-32 manifest of each checkpoint's files, written with it and checked
  # before it is restored (train.py resume, eval.py, laplax.load); False
  # writes and checks none (very large checkpoints; the cost is in docs/survive.md).
  c.checkpoint_verify = True
  # Before step 1, refuse a train step that cannot fit this machine's memory
  # (laplax.train.fit: an estimate, then the compiled step's memory_analysis()).
  c.check_memory = True
  # Fine-tuning: a laplax workdir (a train.py run, or one `python -m
  # laplax.convert` wrote) whose newest parameters start this run instead of
  # the random initialisation (at step 0 only; the optimizer starts fresh).
  c.init_from = ""

  from laplax.data.vision import images

  c.data = images.default_config()  # The data keys are defined with the pipeline.

  c.model = model_config("vit")
  c.model.patch_size = 4

  c.optim = _optim_config()

  c.loss = ml_collections.ConfigDict()
  c.loss.type = "softmax"
  c.loss.label_smoothing = 0.1
  c.loss.mixup = 0.0
  c.loss.cutmix = 0.0

  # Testing aids. nan_at_step: the loss (and so the gradient) of that step is
  # made NaN, to exercise the non-finite guard.
  c.debug = ml_collections.ConfigDict()
  c.debug.nan_at_step = config_dict.placeholder(int)
  # stall_at_step: that step's computation waits (inside the compiled step)
  # until the process ends, to try out stopping a run whose step never ends.
  c.debug.stall_at_step = config_dict.placeholder(int)

  _environment_config(c)
  return c


def deit3_recipe(
  c: ml_collections.ConfigDict, *, variant: str, laplacian, spectral: bool, steps_per_epoch: int
) -> ml_collections.ConfigDict:
  """Applies the DeiT-3 recipe of the Laplacian-heads paper (Zhang & Papyan 2026) to ``c``.

  400 epochs, AdamW lr 2e-3, wd 0.05, cosine with 5 warm-up epochs, grad-clip 1.0,
  Mixup 0.8, CutMix 1.0, label smoothing 0.1, BCE, bfloat16, drop-path 0.2,
  LayerScale 1e-6, qk-norm, on ViT ``variant`` (e.g. ``"B/16"``).
  """
  from laplax.models.vit import decode_variant

  c.total_steps = 400 * steps_per_epoch
  c.eval_every = 10 * steps_per_epoch
  c.model.update(decode_variant(variant))
  c.model.num_laplacian_heads = laplacian
  c.model.spectral.enabled = spectral
  c.model.qk_norm = True
  c.model.drop_path = 0.2
  c.model.layerscale_init = 1e-6
  c.model.dtype = "bfloat16"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.optim.warmup_steps = 5 * steps_per_epoch
  c.optim.grad_clip = 1.0
  c.optim.b2 = 0.999
  c.loss.type = "sigmoid"
  c.loss.label_smoothing = 0.1
  c.loss.mixup = 0.8
  c.loss.cutmix = 1.0
  return c


def tiny_fashion_mnist(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Sets the CPU-sized Fashion-MNIST run of the hierarchical vision configs'
  ``size=tiny`` (``configs/swin_imagenet.py``, ``davit_imagenet.py``,
  ``xcit_imagenet.py``) on ``c``, whose data is :func:`base_config`'s
  Fashion-MNIST: batch 128 (evaluation 1000), 1200 steps, a log every 50, an
  evaluation every 600 and a checkpoint every 300 steps, the stored 28 px
  images (no resize, no crop padding; ``--to timm``'s ``img_size``), AdamW lr
  2e-3 with 100 warm-up steps. Returns ``c``."""
  c.batch_size = 128
  c.eval_batch_size = 1000
  c.total_steps = 1200
  c.log_every = 50
  c.eval_every = 600
  c.checkpoint_every = 300
  c.data.image_size = 28
  c.data.crop_padding = 0
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 100
  return c


def gpt_base_config() -> ml_collections.ConfigDict:
  """:func:`base_config` turned into a causal LM on the Shakespeare plays."""
  c = base_config()
  c.task = "lm"
  c.batch_size = 32
  c.eval_batch_size = 32
  from laplax.data.text import corpus as text

  c.data = text.default_config()

  c.model = model_config("gpt")
  c.model.update(
    max_length=128,
    width=128,
    depth=4,
    num_heads=4,
    mlp_dim=512,
    posemb="learn",
    use_bias=True,
    tie_embeddings=True,
  )

  c.optim.lr = 3e-3
  c.optim.warmup_steps = 100
  c.optim.weight_decay = 0.1
  c.optim.b2 = 0.99
  c.optim.weight_decay_exclude = ("pos_embedding", "token_embedding")
  del c.loss
  # A FLOPs budget (nanochat's --target-flops): when set, total_steps is
  # round(target_flops / (FLOPs per token x batch_size x max_length))
  # (apply_target_flops, on the final config: train.py and the sweep apply it
  # after the --config overrides), unless --config.total_steps is given.
  c.target_flops = config_dict.placeholder(float)

  # The evaluators' settings (eval.sample_tokens, ...: laplax.evaluators.
  # lm_samples, chat) are added with their defaults by the registry.
  c.eval = ml_collections.ConfigDict()
  c.evals = "bits_per_byte,samples"
  return c


def bert_base_config() -> ml_collections.ConfigDict:
  """:func:`base_config` turned into masked-LM pre-training (``task="mlm"``,
  :mod:`laplax.tasks.mlm`) of a small crammed BERT on the Shakespeare plays,
  with cramming's recipe (``JonasGeiping/cramming``, ``train/bert-o4.yaml``,
  ``train/optim/adam.yaml``): AdamW betas (0.9, 0.98), eps 1e-12, weight
  decay 0.01 (not on biases, norms and embeddings), gradient clipping 0.5,
  the one-cycle ``triangle`` schedule, 25% masking with cramming's
  fixed-count 80/10/10 rule and sparse prediction, 128-token windows."""
  c = base_config()
  c.task = "mlm"
  c.batch_size = 32
  c.eval_batch_size = 32
  from laplax.data.text import corpus as text

  c.data = text.default_config()
  c.data.tokenizer = "wordpiece"
  c.data.vocab_size = 2048

  c.model = model_config("bert")
  c.model.update(
    max_length=128,
    width=128,
    depth=4,
    num_heads=4,
    mlp_dim=512,
    post_norm=False,
    use_bias=False,
    mlp_activation="gelu_glu",
    posemb="scaled_sinusoidal",
    type_vocab_size=0,
    final_norm=True,
    mlm_transform=False,
    decoder_bias=False,
    pooler="mean",
  )
  c.optim.lr = 1e-3
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98
  c.optim.eps = 1e-12
  c.optim.weight_decay = 0.01
  c.optim.grad_clip = 0.5
  c.optim.schedule = "triangle"
  c.optim.warmup_steps = 0
  c.optim.weight_decay_exclude = ("pos_embedding", "token_embedding", "type_embedding", "pos_scale")
  del c.loss
  # Masking (laplax.tasks.mlm.mask_tokens): "cramming" masks round(probability
  # * length) tokens of every sequence (first 80% of them [MASK], next 10% a
  # random token, the rest kept) and predicts only those (sparse prediction);
  # "bert" masks each token with the probability (Devlin et al. 2019).
  c.mlm = ml_collections.ConfigDict()
  c.mlm.rule = "cramming"
  c.mlm.probability = 0.25
  # cramming's corpus has no [CLS] (include_cls_token_in_corpus: False): a
  # window is the packed tokens as they are, each document ending in [SEP]
  # (data.wordpiece_normalizer="cramming"). True puts [CLS] on every window's
  # first token (BERT's input; laplax's packing before the key).
  c.mlm.cls_first = False
  c.eval = ml_collections.ConfigDict()
  c.evals = "mlm_loss"
  return c


# ``recipe=`` of the CPU configs: the plain laplax model, or the options the
# Laplacian authors' code runs with.
RECIPES = {"vit": ("plain", "deit3"), "gpt": ("plain", "nanochat")}


def check_recipe(family: str, recipe: str) -> None:
  """Raises ValueError (one line) for a ``recipe`` the family has not."""
  if recipe not in RECIPES[family]:
    raise ValueError(
      f"recipe={recipe!r} is unknown for a {family} config; use one of {', '.join(RECIPES[family])}"
    )


def mixed_deit3_options(c: ml_collections.ConfigDict) -> None:
  """The mixed DeiT-3 of the Laplacian authors' timm fork (attention_mixed.py):
  qk-norm and LayerScale 1e-6 on both branches, so each block starts near the
  identity (Touvron et al. 2022 for LayerScale in DeiT-3)."""
  c.model.qk_norm = True
  c.model.qk_norm_type = "layernorm"
  c.model.layerscale_init = 1e-6


def nanochat_num_params(width: int, depth: int, vocab_size: int) -> int:
  """Parameters of nanochat's GPT: ``2 V d`` (``wte`` and the untied
  ``lm_head``) plus ``12 d^2`` per block (``W_Q, W_K, W_V, W_O`` ``d x d``, the
  MLP ``d x 4d`` and ``4d x d``); no biases, norm gains or position
  embeddings. d20 (``d = 1280``, 20 blocks, ``V = 65536``): 560,988,160."""
  return 2 * vocab_size * width + 12 * depth * width * width


def nanochat_steps(num_params: int, tokens_per_step: int, ratio: int = 20) -> int:
  """nanochat's training horizon ``ratio * N // tokens_per_step``
  (scripts/base_train.py, ``target_param_data_ratio = 20``): 21,400 for d20
  at 524,288 tokens a step."""
  return ratio * num_params // tokens_per_step


def nanochat_options(c: ml_collections.ConfigDict) -> None:
  """The architecture and optimiser of nanochat's first release on the sizes in ``c``.

  Source: ``karpathy/nanochat`` 3a5e0bc, ``nanochat/gpt.py`` and
  ``scripts/base_train.py``; the table of docs/language-models.md lists them
  (the initialisation too). Model: nanochat's rotary (:mod:`laplax.rotary`),
  parameter-free RMSNorm (eps ``2^-23``), qk-norm without scale, ReLU^2, no biases,
  untied embeddings, soft-cap ``15 tanh(logits / 15)``, ``kernel_init="nanochat"``.
  Optimiser (:mod:`laplax.proj.nanochat.optim.first_release`): Muon 0.02 (momentum 0.85 -> 0.95 over
  300 steps); AdamW (0.8, 0.95), eps 1e-10, no decay, ``0.2 s`` on the embedding and
  ``0.004 s`` on ``lm_head``, ``s = (width / 768)^-1/2``; constant rate, linear
  warm-down over the last 20%; clip 1.0. ``dtype`` and ``embedding_dtype`` stay ``c``'s.
  """
  m, o = c.model, c.optim
  m.posemb = "rope"
  m.rope_style = "nanochat"
  m.rope_theta = 10_000.0
  m.tie_embeddings = False
  m.use_bias = False
  m.norm = "rmsnorm"
  m.embed_norm = True
  m.mlp_activation = "relu2"
  m.qk_norm = True
  m.qk_norm_type = "rmsnorm"
  m.qk_scale = 1.0
  m.zero_init_out = True
  m.kernel_init = "nanochat"
  m.logit_softcap = 15.0
  scale = (m.width / 768) ** -0.5
  o.optimizer = "nanochat"
  o.lr = 0.004 * scale  # AdamW leaves outside the groups below (none in this model)
  o.muon_lr = 0.02
  o.muon_momentum = 0.95
  o.muon_momentum_start = 0.85
  o.muon_momentum_ramp_steps = 300
  o.muon_weight_decay = 0.0
  o.embedding_lr = 0.2 * scale
  o.unembedding_lr = 0.004 * scale
  o.b1 = 0.8
  o.b2 = 0.95
  o.adam_eps = 1e-10
  o.weight_decay = 0.0
  o.schedule = "warmdown"
  o.warmdown_ratio = 0.2
  o.min_lr_ratio = 0.0
  o.warmup_steps = 0
  o.grad_clip = 1.0


def nanochat_fork_model(
  c: ml_collections.ConfigDict,
  *,
  value_embeds: bool = True,
  resid_lambdas: bool = True,
  x0_lambdas: bool = True,
  smear: bool = True,
  backout: bool = True,
  window_pattern: str | None = "SSSL",
) -> None:
  """The model of the Laplacian authors' nanochat fork on the sizes in ``c``.

  Source: ``yuchongzhang/nanochat`` 1f70b557, ``nanochat/gpt.py`` (its
  ``GPTConfig`` defaults: every component on, ``window_pattern="SSSL"``; the
  keyword arguments are its ablation switches ``use_ve``,
  ``use_resid_lambdas``, ``use_x0``, ``use_smear``, ``use_backout``).
  :func:`nanochat_options`' forward with ``q, k`` x 1.2 after the qk-norm,
  rotary base 100,000, the fork's initialisation (``kernel_init=
  "nanochat-fork"``), the vocabulary padded to a multiple of 64, and the
  options of :class:`~laplax.models.gpt.GPTSpec` the switches name.
  The optimiser is :func:`nanochat_options`' unless the caller sets another.
  """
  nanochat_options(c)
  m = c.model
  m.rope_theta = 100_000.0
  m.qk_scale = 1.2
  m.kernel_init = "nanochat-fork"
  m.vocab_multiple = 64
  m.value_embeds = value_embeds
  m.resid_lambdas = resid_lambdas
  m.x0_lambdas = x0_lambdas
  m.smear = smear
  m.backout = backout
  m.window_pattern = window_pattern


def nanochat_fork_size(depth: int) -> tuple[int, int]:
  """``(width, num_heads)`` of the fork's depth-``depth`` GPT: ``ceil(64 depth /
  128) * 128`` and heads of 128 (yuchongzhang/nanochat 1f70b557,
  scripts/base_train.py, aspect ratio 64, head_dim 128). d20: (1280, 10)."""
  width = -(-depth * 64 // 128) * 128
  return width, width // 128


def nanochat_fork_scaling_params(
  depth: int, vocab_size: int = 32768, kv_heads: int | None = None
) -> int:
  """The fork's horizon parameters of its d``depth`` with ``kv_heads`` key and
  value heads (``None``: one per head, the fork's default): every block
  parameter (``10 d^2 + 2 d kv_heads head_dim`` per layer, ``12 d^2``
  without grouping, plus ``ve_gate`` ``12 x kv_heads`` on the value-embedding
  layers) and ``lm_head`` (``Vpad x d``), its ``transformer_matrices +
  lm_head`` (nanochat/gpt.py ``num_scaling_params``). d12: 110,100,912; d20:
  435,160,240."""
  width, heads = nanochat_fork_size(depth)
  kv = heads if kv_heads is None else kv_heads
  kv_width = kv * (width // heads)
  ve_layers = sum(1 for i in range(depth) if i % 2 == (depth - 1) % 2)
  vpad = -(-vocab_size // 64) * 64
  block = 10 * width * width + 2 * width * kv_width
  return depth * block + ve_layers * 12 * kv + vpad * width


def nanochat_fork_horizon(
  depth: int, vocab_size: int = 32768, ratio: float = 12, kv_heads: int | None = None
) -> dict:
  """The fork's compute-optimal run of d``depth`` (scripts/base_train.py at
  yuchongzhang/nanochat 1f70b557): ``tokens = int(ratio * N)`` for the
  :func:`nanochat_fork_scaling_params` ``N`` of the model (its ``kv_heads``;
  ``D_ref`` is always the default d12's); the batch ``B = 2^round(log2(2^19
  (tokens / D_ref)^0.383))`` tokens with ``D_ref`` = 12 x d12's ``N``; updates
  ``tokens // B``; the learning rates times ``sqrt(B / 2^19)``; Muon's weight
  decay ``0.28 sqrt(B / 2^19) D_ref / tokens``. d20: B = 2^20, 4,980 updates,
  decay 0.1002.

  Returns ``{"batch_tokens", "steps", "lr_scale", "weight_decay"}``.
  """
  tokens = int(ratio * nanochat_fork_scaling_params(depth, vocab_size, kv_heads))
  d_ref = 12 * nanochat_fork_scaling_params(12, vocab_size)
  b_ref = 2**19
  batch = 2 ** round(math.log2(b_ref * (tokens / d_ref) ** 0.383))
  scale = (batch / b_ref) ** 0.5
  return {
    "batch_tokens": batch,
    "steps": tokens // batch,
    "lr_scale": scale,
    "weight_decay": 0.28 * scale * d_ref / tokens,
  }


def gpt_vocab_size(c: ml_collections.ConfigDict) -> int:
  """The GPT's vocabulary of config ``c``: 256 for the byte tokenizer, else
  ``data.vocab_size`` (as the language-model task's ``from_shapes``), rounded
  up to a multiple of ``model.vocab_multiple``."""
  vocab = 256 if c.data.tokenizer == "byte" else int(c.data.vocab_size)
  return spec_lib.from_config(c.model).padded_vocab(vocab)


def gpt_flops_per_token(c: ml_collections.ConfigDict) -> int:
  """Training FLOPs per token of the GPT of config ``c``, nanochat's estimate.

  ``6 x`` the weights that multiply the token stream (``W_Q, W_O`` ``d x d``,
  ``W_K, W_V`` ``d x kv_heads head_dim`` and the MLP of every block, the
  value-embedding gates ``12 x kv_heads`` and
  the smear gate ``24``, ``lm_head`` ``[V, d]`` with ``V`` of
  :func:`gpt_vocab_size`; not the token or value embeddings, which are
  lookups, nor biases, norms and scalars) plus ``12 x heads x head_dim x
  min(window, T)`` per layer for ``Q K^T`` and ``P V`` (``T`` =
  ``model.max_length``, the window of :func:`laplax.models.gpt.window_sizes`).
  Source: ``estimate_flops`` of nanochat/gpt.py, yuchongzhang/nanochat
  1f70b557 (L387-417, with sliding windows); at 3a5e0bc (no windows, no gates)
  its ``6 (N - N_wte) + 12 l h q t`` (L225) is the same count. The fork's d20
  at 2048 tokens (``SSSL``, vocabulary 32,768): 2,886,212,784.
  """
  s = spec_lib.from_config(c.model)
  d, kv, mlp = s.width, s.kv_heads, s.mlp_dim
  # A gated MLP's first layer has mlp_dim outputs, halved by the gate.
  mlp_weights = d * mlp + (mlp // 2 if s.mlp_activation == "gelu_glu" else mlp) * d
  ve_layers = sum(1 for i in range(s.depth) if i % 2 == (s.depth - 1) % 2) if s.value_embeds else 0
  matmul = (
    s.depth * (2 * d * d + 2 * d * kv * s.head_dim + mlp_weights)
    + ve_layers * 12 * kv
    + (24 if s.smear else 0)
    + gpt_vocab_size(c) * d
  )
  t = s.max_length
  attention = sum(12 * s.num_heads * s.head_dim * min(w or t, t) for w in s.windows())
  return 6 * matmul + attention


def target_flops_steps(c: ml_collections.ConfigDict) -> int:
  """The updates of config ``c``'s FLOPs budget ``c.target_flops``: nanochat's
  ``round(F / (flops_per_token x B))`` (scripts/base_train.py at
  yuchongzhang/nanochat 1f70b557, L370-384) with :func:`gpt_flops_per_token`
  and ``B = batch_size x model.max_length`` tokens a step; Python's
  ``round`` (half to even), as there."""
  tokens = c.batch_size * c.model.max_length
  return round(float(c.target_flops) / (gpt_flops_per_token(c) * tokens))


def apply_target_flops(c: ml_collections.ConfigDict, explicit_steps: bool = False) -> None:
  """Sets ``c.total_steps`` from ``c.target_flops`` (:func:`target_flops_steps`)
  when the budget is set, in nanochat's precedence: an explicit number of
  steps (``explicit_steps``: ``--config.total_steps`` on the command line, its
  ``--num-iterations``) first, then the FLOPs budget, then the horizon the
  config file computed (the parameter-data ratio). A config without the key
  (not a language model) or with ``None`` is left as it is; a budget that
  cannot be counted (a bad model section) is left for the validation to
  report."""
  if "target_flops" not in c or c.target_flops is None or explicit_steps:
    return
  try:
    c.total_steps = target_flops_steps(c)
  except (ValueError, TypeError, ZeroDivisionError):
    pass  # validation names the bad key


def nanochat_fork_training(c: ml_collections.ConfigDict, depth: int) -> None:
  """The fork's schedule and learning rates for d``depth`` in ``c`` (after
  :func:`nanochat_fork_model`): :func:`nanochat_fork_horizon`'s batch
  (``c.batch_size`` sequences of ``c.model.max_length``) and updates; the
  rate multiplier with a 40-step warm-up and the warm-down over the last 65%
  to 0.05 (:func:`laplax.optim.warmdown_schedule`); base_train's
  rates times ``sqrt(B / 2^19)``: Muon 0.02, embedding 0.3 s, ``lm_head``
  0.008 s with ``s = (width / 768)^-1/2``; Muon momentum 0.85 -> 0.97 over
  400 steps; no clipping; ``optim.optimizer="nanochat-fork"`` (the fork's
  ``MuonAdamW``, :mod:`laplax.proj.nanochat.optim.fork`) with the scalars' rate
  ``optim.lr = 0.5 sqrt(B / 2^19)`` and Muon's decay
  ``0.28 sqrt(B / 2^19) D_ref / tokens``.
  """
  h = nanochat_fork_horizon(depth, c.data.vocab_size, kv_heads=c.model.get("num_kv_heads"))
  m, o = c.model, c.optim
  c.batch_size = h["batch_tokens"] // m.max_length
  c.total_steps = h["steps"]
  s, dscale = h["lr_scale"], (m.width / 768) ** -0.5
  o.muon_lr = 0.02 * s
  o.embedding_lr = 0.3 * s * dscale
  o.unembedding_lr = 0.008 * s * dscale
  o.optimizer = "nanochat-fork"
  o.lr = 0.5 * s  # the fork's scalar_lr
  o.muon_weight_decay = h["weight_decay"]
  o.weight_decay = 0.0
  o.muon_momentum_start = 0.85
  o.muon_momentum = 0.97
  o.muon_momentum_ramp_steps = 400
  o.warmup_steps = 40
  o.warmdown_ratio = 0.65
  o.min_lr_ratio = 0.05
  o.grad_clip = None


def dino_base_config() -> ml_collections.ConfigDict:
  """:func:`base_config` turned into DINO self-supervised training (no labels).

  Keys follow the DINO reference code (Caron et al. 2021): ``dino.out_dim``,
  ``momentum_teacher``, ``warmup_teacher_temp`` -> ``teacher_temp`` over
  ``warmup_teacher_temp_steps``, ``student_temp``, ``center_momentum``,
  ``freeze_last_layer_steps``; weight decay cosine from ``optim.weight_decay`` to
  ``optim.weight_decay_end``; ``data.multicrop`` the views.
  """
  from laplax.data.vision import images

  c = base_config()
  c.task = "dino"
  del c.loss
  c.data.multicrop = images.default_multicrop_config(c.data.name)
  c.model.pool = "tok"
  c.model.drop_path = 0.1

  c.dino = ml_collections.ConfigDict()
  c.dino.out_dim = 65536
  c.dino.hidden_dim = 2048
  c.dino.bottleneck_dim = 256
  c.dino.head_layers = 3
  c.dino.student_temp = 0.1
  c.dino.warmup_teacher_temp = 0.04
  c.dino.teacher_temp = 0.07
  c.dino.warmup_teacher_temp_steps = 0
  c.dino.momentum_teacher = 0.996
  c.dino.center_momentum = 0.9
  c.dino.freeze_last_layer_steps = 0

  c.optim.lr = 5e-4
  c.optim.min_lr_ratio = 0.002
  c.optim.weight_decay = 0.04
  c.optim.weight_decay_end = 0.4
  c.optim.grad_clip = 3.0
  c.optim.weight_decay_exclude = ("pos_embedding", "cls")

  # The evaluators' settings (eval.knn_k, eval.segmentation_*, ...:
  # laplax.evaluators.probes, dino_segmentation) are added with their
  # defaults by the registry.
  c.eval = ml_collections.ConfigDict()
  # The training loop runs knn and linear_probe at every eval_every; eval.py
  # runs all five (laplax.evaluators.registry).
  c.evals = "knn,linear_probe,raw_pixel_knn,segmentation,patch_pca"
  return c
