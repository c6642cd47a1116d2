"""nanochat's optimisers, registered as ``optim.optimizer`` values of
:func:`laplax.optim.make_optimizer` when imported
(:func:`laplax.projects.discover`): ``"nanochat"``, the first release's Muon +
AdamW (:mod:`~laplax.proj.nanochat.optim.first_release`), and
``"nanochat-fork"``, the Laplacian authors' fork's MuonAdamW
(:mod:`~laplax.proj.nanochat.optim.fork`)."""

from __future__ import annotations

from typing import Any

import optax

from laplax import optim
from laplax.proj.nanochat.optim import first_release, fork


def _nanochat(o: Any, total_steps: int) -> optax.GradientTransformation:
  """:func:`~laplax.proj.nanochat.optim.first_release.nanochat_partition` with
  the run's learning-rate schedule at each group's peak (``o``: the run's
  optimiser section, :func:`laplax.optim.optim_of`)."""
  return first_release.nanochat_partition(
    o, optim.param_labels, lambda peak: optim.learning_rate_schedule(o, total_steps, peak)
  )


def _nanochat_fork(o: Any, total_steps: int) -> optax.GradientTransformation:
  """:func:`~laplax.proj.nanochat.optim.fork.nanochat_fork`: the fork's MuonAdamW
  and schedules (no clipping)."""
  return fork.nanochat_fork(o, total_steps)


optim.register_optimizer("nanochat", _nanochat)
optim.register_optimizer("nanochat-fork", _nanochat_fork)
