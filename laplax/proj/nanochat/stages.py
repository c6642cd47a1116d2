"""nanochat's mid-training and SFT stages as config settings.

:func:`stage_config` turns a GPT config with nanochat's optimiser
(:func:`laplax.config.defaults.nanochat_options`) into one of the chat stages
of Karpathy's nanochat (first release, 3a5e0bc: ``scripts/mid_train.py``,
``scripts/chat_sft.py``); the data are :mod:`laplax.proj.nanochat.data.mixture`'s.
Each stage starts from the previous stage's workdir, ``--config.init_from=
WORKDIR``: the parameters and the model keys come from there, the optimiser
state starts fresh (:mod:`laplax.train.finetune`).

**Mid-training** (``"mid"``): the base learning rates (Muon 0.02, AdamW
``0.2 s`` / ``0.004 s``), the Muon momentum ramp 0.85 -> 0.95 over 300 steps,
no weight decay, **no clipping** (nanochat clips only in base training).
The rate's multiplier (``schedule``):

* ``"rising"`` (the default, nanochat 3a5e0bc as released and as the d20
  reference numbers were made): its ``lrm`` was the fraction of the epoch
  read, so the rate *rises* from about 0 to the peak over the run
  (``optim.schedule="progress"``: ``min(1, (it + 1) / N)``; nanochat's
  fraction counts conversations rendered one batch ahead, so its value at
  a step differs from this one by about ``1 / N``). Kept because the
  paper's models were mid-trained with it.
* ``"fixed"``: the later fix (nanochat b8076dd), 1 for the first 80% of
  the steps then linear to 0 (``optim.schedule="warmdown"``, ratio 0.2).

**SFT** (``"sft"``): every rate times 0.02 (nanochat's ``init_lr_frac``), the
multiplier ``1 - it / (N + 1)`` (``optim.schedule="warmdown"`` with
``warmdown_ratio`` 1 over ``optim.schedule_steps = N + 1``: nanochat computes
651 iterations for its 20,843 conversations at 32 a step and stops after
650 updates), Muon momentum 0.95 throughout, no weight decay, no clipping;
the loss is the mean over each micro-batch's assistant targets (nanochat's
4 conversations per GPU: ``optim.grad_accum_steps`` = its 8 GPUs).
"""

from __future__ import annotations

import os

import ml_collections

from laplax import utils
from laplax.proj.nanochat.data import mixture as chat_mixture

STAGES = ("mid", "sft")
SCHEDULES = ("rising", "fixed")
SFT_LR_FRAC = 0.02  # nanochat's chat_sft.py init_lr_frac


def stage_config(
  c: ml_collections.ConfigDict, stage: str, *, schedule: str = "rising", total_steps: int
) -> ml_collections.ConfigDict:
  """``c`` (a GPT config with nanochat's optimiser) set up as chat stage
  ``stage`` for ``total_steps`` updates (see the module docstring); changes
  and returns ``c``. The data directory is ``data.source_dir``
  (:data:`laplax.proj.nanochat.data.mixture.DEFAULT_SOURCE_DIR` unless set).

  Raises:
    ValueError: an unknown ``stage`` or ``schedule`` (one line).
  """
  if stage not in STAGES:
    raise ValueError(f"stage={stage!r} is unknown; use one of {', '.join(STAGES)}")
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule={schedule!r} is unknown; use one of {', '.join(SCHEDULES)}")
  data_dir = c.data.data_dir
  c.data = chat_mixture.default_config(chat_mixture.MID if stage == "mid" else chat_mixture.SFT)
  c.data.data_dir = data_dir
  c.total_steps = total_steps
  o = c.optim
  o.weight_decay = 0.0
  o.muon_weight_decay = 0.0
  o.grad_clip = None
  o.warmup_steps = 0
  o.min_lr_ratio = 0.0
  if stage == "mid":
    o.schedule = "progress" if schedule == "rising" else "warmdown"
    o.warmdown_ratio = 0.2
    return c
  for key in ("lr", "muon_lr", "embedding_lr", "unembedding_lr"):
    o[key] = o[key] * SFT_LR_FRAC
  o.muon_momentum_start = o.muon_momentum  # no ramp in nanochat's SFT
  o.schedule = "warmdown"
  o.warmdown_ratio = 1.0
  o.schedule_steps = total_steps + 1
  return c


def sibling_config(config_file: str, name: str, arg: str | None = None):
  """``get_config(arg)`` of the config file ``name`` in the directory of
  ``config_file`` (a stage config builds on its pretraining config, e.g.
  ``configs/gpt_d20_sft.py`` on ``configs/gpt_d20.py``)."""
  return utils.config_from_file(
    os.path.join(os.path.dirname(os.path.abspath(config_file)), name), arg
  )
