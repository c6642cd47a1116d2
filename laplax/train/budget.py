"""How long a run trains and on how big a batch: cramming's wall-time budget
and batch-size ramp, on the training loop's host side.

Source: ``JonasGeiping/cramming`` (``pretrain.py``: the elapsed time saved
with a checkpoint and the deadline; ``backend/torch_default.py``:
``schedule_batch_size``; ``backend/optimizers/schedulers.py``:
``_get_fake_step``). With ``optim.budget_hours`` the schedule's progress is
the elapsed training time over the budget (:func:`laplax.optim.budget_step`)
and the run stops after the step that spends it; with
``optim.batch_size_ramp`` each update accumulates :func:`ramp_micro_batches`
micro-batches of ``batch_size / optim.grad_accum_steps`` examples. Both reach
the compiled step as its third argument, ``controls`` (:func:`controls_spec`),
so that neither recompiles it.

The elapsed training time is the wall time of the training loop since its
first step (the first step's compilation included, evaluations excluded),
summed over the runs of a resumed workdir: each checkpoint saves it in its
data state under :data:`LOOP_KEY`, and a resumed run continues from the
value saved with the step it restores. A wall-time budget is not
reproducible across machines (or on a busy one): the number of updates and
the schedule follow the speed of the run. A run bounded by ``total_steps``
is (its ramp follows the steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_collections

from laplax import optim
from laplax.config import run as run_lib

#: The key of a checkpoint's data state that holds the loop's own state
#: (``{"elapsed_seconds": float}``); the input pipeline never sees it.
LOOP_KEY = "laplax_loop"


def saved_elapsed(step_dir: str) -> float | None:
  """The elapsed training time (seconds) a checkpoint step directory saved
  with its data state (orbax's JSON item ``data``, file ``metadata``);
  ``None`` without one (no wall-time budget) or when unreadable."""
  from laplax import store

  try:
    return float(
      json.loads(store.read_text(os.path.join(step_dir, "data", "metadata")))[LOOP_KEY][
        "elapsed_seconds"
      ]
    )
  except (OSError, ValueError, KeyError, TypeError):
    return None


def spent_at(step_dir: str, budget_hours: float | None) -> bool:
  """Whether the checkpoint in ``step_dir`` had spent ``budget_hours`` (the
  run ended there: :meth:`Budget.spent_before`)."""
  elapsed = saved_elapsed(step_dir) if budget_hours is not None else None
  return elapsed is not None and elapsed / 3600 > budget_hours


Run = run_lib.RunSpec | ml_collections.ConfigDict


def uses_controls(run: Run) -> bool:
  """Whether the train step of ``run`` takes ``controls`` (a wall-time
  budget or a batch-size ramp of its optimiser section, ``run.optim``; a
  ``ConfigDict``'s section is built from it: :func:`laplax.config.run.section`)."""
  return _controlled(run_lib.section(run, "optim"))


def _controlled(o: run_lib.Optim) -> bool:
  """Whether the optimiser section ``o`` has a wall-time budget or a ramp."""
  return o.budget_hours is not None or bool(o.batch_size_ramp)


def controls_spec(run: Run) -> tuple:
  """The train step's extra arguments as ``jax.ShapeDtypeStruct``: ``()``, or
  ``({"schedule_step": int32 [], "micro_batches": int32 []},)`` when
  :func:`uses_controls` (for ``lower``; :meth:`Budget.controls` gives the
  values)."""
  if not uses_controls(run):
    return ()
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  return ({"schedule_step": scalar, "micro_batches": scalar},)


def ramp_micro_batches(
  progress_step: int, horizon: int, ramp: float, batch_size: int, micro_batch: int
) -> int:
  """Micro-batches of the update at ``progress_step`` of ``horizon`` under
  cramming's batch-size ramp (``schedule_batch_size`` of
  ``backend/torch_default.py``, ``batch_size_ramp`` a fraction):
  ``min(int(progress_step x batch_size / (horizon x ramp) // micro_batch + 1)
  x micro_batch, batch_size) / micro_batch``, in its Python float
  arithmetic. One micro-batch at the start, one more every ``ramp /
  (batch_size / micro_batch)`` of the horizon, the whole batch from ``ramp
  x (1 - micro_batch / batch_size)`` of it on. ``ramp`` 0: the whole batch.
  ``progress_step`` is the update count (a step budget) or the step of the
  elapsed time (a wall-time budget, :func:`laplax.optim.budget_step`, as
  cramming's ``fake_step``)."""
  if not ramp:
    return batch_size // micro_batch
  batch_size_step = batch_size / (horizon * ramp)
  size = min(int(progress_step * batch_size_step // micro_batch + 1) * micro_batch, batch_size)
  return size // micro_batch


class Budget:
  """The loop's clock and the ``controls`` of each step.

  ``clock`` (seconds, e.g. ``time.monotonic``; tests inject a fake one) is
  read once by :meth:`start`, once by :meth:`controls` and once by
  :meth:`spent` per step with a wall-time budget, twice per
  :meth:`paused` block; never without one.

  ``run``: the run spec (its ``optim`` and ``schedule`` sections) or a
  complete ``ConfigDict`` (the sections built from it).
  """

  def __init__(self, run: Run, clock: Callable[[], float] = time.monotonic):
    o, schedule = run_lib.section(run, "optim"), run_lib.section(run, "schedule")
    self.hours = o.budget_hours
    self.total_steps = int(schedule.total_steps)
    self.ramp = float(o.batch_size_ramp or 0.0)
    self.batch_size = int(schedule.batch_size)
    self.micro_batch = self.batch_size // int(o.grad_accum_steps)
    self.used = _controlled(o)
    self._clock = clock
    self._restored = 0.0
    self._start = 0.0
    self._paused = 0.0
    self.elapsed = 0.0  # seconds, as last read

  def restore(self, data_state: dict) -> dict:
    """The input pipeline's part of a restored data state; the elapsed time
    saved with it (``0`` without one, a run started before the budget) is
    where this run's clock goes on."""
    data_state = dict(data_state)
    loop = data_state.pop(LOOP_KEY, None) or {}
    self._restored = self.elapsed = float(loop.get("elapsed_seconds", 0.0))
    return data_state

  def saved(self, data_state: dict) -> dict:
    """``data_state`` with the elapsed time (as last read) added, for a
    checkpoint; unchanged without a wall-time budget."""
    if self.hours is None:
      return data_state
    return dict(data_state, **{LOOP_KEY: {"elapsed_seconds": self.elapsed}})

  def start(self) -> None:
    """Starts this run's clock (before the first step)."""
    if self.hours is not None:
      self._start = self._clock()

  def _read(self) -> float:
    """The elapsed time now; with several processes, process 0's (so that all
    of them give the step the same controls and stop at the same step, as
    cramming's ``communicate_flags``)."""
    elapsed = self._restored + (self._clock() - self._start) - self._paused
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      elapsed = float(multihost_utils.broadcast_one_to_all(jnp.float32(elapsed)))
    self.elapsed = elapsed
    return elapsed

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """The time in the block (an evaluation) does not count."""
    if self.hours is None:
      yield
      return
    t0 = self._clock()
    try:
      yield
    finally:
      self._paused += self._clock() - t0

  def controls(self, step: int) -> tuple:
    """The extra arguments of the update after ``step`` updates: ``()``, or
    ``({"schedule_step", "micro_batches"},)`` as int32 scalars: the step the
    schedule reads (the elapsed time's, else ``step``) and the ramp's
    micro-batches at that progress (:func:`ramp_micro_batches`)."""
    if not self.used:
      return ()
    if self.hours is None:
      progress = step
    else:
      progress = optim.budget_step(self._read(), self.hours, self.total_steps, step)
    count = ramp_micro_batches(
      progress, self.total_steps, self.ramp, self.batch_size, self.micro_batch
    )
    return ({"schedule_step": jnp.int32(progress), "micro_batches": jnp.int32(count)},)

  def spent(self) -> bool:
    """Whether the wall-time budget is spent (reads the clock; cramming's
    ``check_deadline``: elapsed hours above the budget); False without one."""
    return self.hours is not None and self._read() / 3600 > self.hours

  def spent_before(self) -> bool:
    """Whether the restored run had spent its budget (no clock read; the
    same as :func:`spent_at` of the restored step)."""
    return self.hours is not None and self._restored / 3600 > self.hours
