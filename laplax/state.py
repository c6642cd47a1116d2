"""The training state and its builders: what a checkpoint holds besides the data position.

:class:`TrainState` is a Flax struct (a pytree), so ``jax.jit`` and orbax take
it whole; :mod:`laplax.workdir.checkpoint` saves and restores it. The builders
make it from a task and an optax transformation: at step 0
(:func:`init_state`), as shapes (:func:`abstract_state`), with its shardings
on a mesh (:func:`abstract_and_shardings`, :func:`sharded_abstract_state`)
and created already sharded (:func:`create_state`).
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from laplax import sharding
from laplax.tasks.base import Task


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


def abstract_state(task: Task, tx: optax.GradientTransformation, seed: int):
  """Shapes and dtypes of the TrainState (``jax.ShapeDtypeStruct`` leaves)."""
  return jax.eval_shape(lambda: init_state(task, tx, seed))


def _init(task: Task, tx: optax.GradientTransformation, seed: int):
  """``(params as task.init returns them, TrainState at step 0)``."""
  rng = jax.random.PRNGKey(seed)
  # Inside sharding.context the parameters come boxed with their logical axes.
  boxed = task.init(jax.random.fold_in(rng, 0))
  params = sharding.unbox(boxed)
  return boxed, TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.fold_in(rng, 1),
    task_state=task.init_task_state(params),
  )


def init_state(task: Task, tx: optax.GradientTransformation, seed: int):
  """The TrainState at step 0: parameters from ``seed``, fresh optimizer state,
  and the task's initial state (``task.init_task_state(params)``, ``None`` for
  most tasks)."""
  return _init(task, tx, seed)[1]


def abstract_and_shardings(
  task: Task, tx: optax.GradientTransformation, seed: int, mesh: jax.sharding.Mesh, rules
):
  """``(abstract TrainState, its NamedShardings on mesh)`` from one trace of
  the initialisation (the parameters' logical axes from the
  boxed leaves of ``task.init``, mapped to mesh axes by
  :func:`laplax.sharding.param_specs`; optimizer moments and DINO's teacher
  follow their parameters, the rest is replicated:
  :func:`laplax.sharding.state_shardings`)."""
  with nn.logical_axis_rules(tuple(rules)):
    boxed, abstract = jax.eval_shape(lambda: _init(task, tx, seed))
  specs = sharding.param_specs(boxed, mesh, rules)
  return abstract, sharding.state_shardings(abstract, specs, mesh)


def sharded_abstract_state(
  task: Task,
  tx: optax.GradientTransformation,
  seed: int,
  shardings: TrainState,
  abstract: TrainState | None = None,
) -> TrainState:
  """The abstract TrainState whose ``jax.ShapeDtypeStruct`` leaves carry
  ``shardings``: the restore target of a checkpoint saved on any mesh
  (``abstract``: :func:`abstract_state`, if already known)."""
  if abstract is None:
    abstract = abstract_state(task, tx, seed)
  return jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )


def create_state(
  task: Task, tx: optax.GradientTransformation, seed: int, shardings: TrainState
) -> TrainState:
  """:func:`init_state`, created already sharded (a jitted init with
  ``out_shardings``); call it inside :func:`laplax.sharding.context`."""
  return jax.jit(lambda: init_state(task, tx, seed), out_shardings=shardings)()
