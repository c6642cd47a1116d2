"""The training state: what a checkpoint holds besides the data position.

:class:`TrainState` is a Flax struct (a pytree), so ``jax.jit`` and orbax take
it whole; :mod:`laplax.workdir.checkpoint` saves and restores it.
"""

from __future__ import annotations

from typing import Any

import flax
import jax


@flax.struct.dataclass
class TrainState:
  """Everything that decides the rest of a run, besides the data position.

  Attributes:
    step: int32 scalar, number of updates applied.
    params: float32 parameter pytree.
    opt_state: optax state pytree.
    rng: uint32 ``[2]`` raw key; step ``t`` uses ``fold_in(rng, t)``.
    task_state: what a task keeps besides the trained parameters, updated by
      the task after each step (DINO: the teacher parameters and the centre);
      ``None`` for tasks without one.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  task_state: Any = None
