"""The one training loop: setup, jitted step, logging, evaluation, checkpoints.

``train_and_evaluate(config, workdir)`` is read top to bottom in sections:
multi-process runtime, checks, mesh, workdir, model and optimizer, input,
sharding and checkpoint/resume, step, loop. The state lives sharded on the
mesh of ``config.mesh_shape`` (:mod:`laplax.sharding`); every process feeds
its rows of each global batch.
The workdir holds ``config.json``, ``metrics.jsonl`` (one JSON object per
record, each with ``step``), TensorBoard events (scalars, the config, GPT
samples; :class:`~laplax.workdir.files.MetricWriter`), ``checkpoints/``, and
on request a profiler trace (``profile/``,
:class:`~laplax.train.profiler.Profiler`) and a Weights & Biases run
(``wandb/``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from laplax import optim, sharding, signals, store, tasks
from laplax.config import run as run_lib
from laplax.config import validation as config_lib
from laplax.data.errors import DataError
from laplax.errors import UserError
from laplax.evaluators import registry
from laplax.state import TrainState, abstract_and_shardings, create_state, sharded_abstract_state
from laplax.tasks.base import Task
from laplax.train import budget as budget_lib
from laplax.train import finetune, fit, preemption
from laplax.train.profiler import Profiler
from laplax.train.timing import LogInterval
from laplax.workdir import checkpoint as ckpt_lib
from laplax.workdir import lock as lock_lib
from laplax.workdir.files import (
  CHECKPOINT_DIR,
  MetricWriter,
  check_wandb,
  check_workdir,
  eval_line,
  existing_ancestor,
  write_config,
)
from laplax.workdir.saving import SaveError


class NonFiniteError(UserError, RuntimeError):
  """The loss or gradient norm became NaN or infinite."""


def batch_shardings(task: Task, mesh: jax.sharding.Mesh, rules) -> dict:
  """``NamedSharding`` per field of a training batch: the task's batch axis
  (``task.batch_axis``) has the logical name ``"batch"``."""
  axis = task.batch_axis
  names = {
    k: (None,) * axis + ("batch",) + (None,) * (len(v.shape) - axis - 1)
    for k, v in task.batch_spec(1).items()
  }
  return sharding.logical_shardings(names, mesh, rules)


def jit_train_step(
  task: Task,
  tx: optax.GradientTransformation,
  schedule,
  state_sharding: TrainState,
  batch_sharding: dict,
  run: run_lib.RunSpec | None = None,
):
  """:func:`make_train_step` jitted with explicit shardings; the state is donated.

  ``(state, batch) -> (state, metrics)``: the state keeps ``state_sharding``,
  the batch is a global array with ``batch_sharding``, the metrics are
  replicated scalars; with a wall-time budget or a batch-size ramp
  (:func:`laplax.train.budget.uses_controls`) ``(state, batch, controls)``,
  the controls replicated (:func:`laplax.train.budget.controls_spec`). Trace
  it (first call) inside :func:`laplax.sharding.context`. ``run``: as
  :func:`make_train_step`'s.
  """
  mesh = jax.tree_util.tree_leaves(state_sharding)[0].mesh
  replicated = NamedSharding(mesh, P())
  extra = (replicated,) if budget_lib.uses_controls(_run_of(task, run)) else ()
  return jax.jit(
    make_train_step(task, tx, schedule, run=run),
    in_shardings=(state_sharding, batch_sharding, *extra),
    out_shardings=(state_sharding, replicated),
    donate_argnums=0,
  )


def setup(
  config: ml_collections.ConfigDict,
  workdir: str | None,
  check: bool = True,
  run: run_lib.RunSpec | None = None,
) -> tuple[run_lib.RunSpec, Task]:
  """Checks the config into its run spec (once: :func:`laplax.tasks.validate`)
  and the workdir, then prepares the task's data; returns ``(run, task)``, the
  task built on the run's model spec.

  Before the data is prepared nothing is written; the data preparation writes
  only into ``data.data_dir`` (and a trained tokenizer into ``workdir``).

  ``check``: also check the mesh against this machine's devices
  (``config.mesh_shape``), the workdir, and the batch sizes against the
  prepared splits (training; ``eval.py`` passes False). ``run``: the run
  spec of ``config``, checked already (``eval.py``'s, built once by
  :func:`laplax.loading.load`); then it is not checked again.

  Raises:
    ConfigError, DataError: one-line user errors (also: ``config.wandb.project``
      without the ``wandb`` package, and :class:`~laplax.train.fit.FitError`,
      a batch larger than its split, when ``check``).
  """
  if run is None:
    run = tasks.validate(config, jax.device_count() if check else None, strict_keys=check)
    registry.validate(config)
  if check:
    check_wandb(run)
  if check and workdir is not None:
    check_workdir(config, workdir)
  data_dir = os.path.expanduser(str(config.data.data_dir or ""))
  if data_dir and not os.path.isdir(existing_ancestor(data_dir)):
    raise config_lib.ConfigError(
      f"config.data.data_dir={data_dir} cannot be a directory: "
      f"{existing_ancestor(data_dir)} is a file; give a directory for the "
      f"prepared datasets"
    )
  if check and workdir is not None and run.schedule.init_from:
    finetune.copy_init_tokenizer(config, workdir)
  try:
    task = tasks.make_task(run, workdir)
  except OSError as e:
    raise config_lib.ConfigError(
      f"cannot prepare the data: {e.strerror or type(e).__name__}"
      f"{f' ({e.filename})' if e.filename else ''}; check config.data.data_dir="
      f"{config.data.data_dir}"
    ) from None
  if check:  # sizes against the prepared splits (laplax.train.fit)
    fit.check_data(task)
  return run, task


def micro_batches(batch: Any, n: int, axis: int = 0) -> Any:
  """Cuts every array of ``batch`` into ``n`` strided micro-batches along ``axis``.

  ``[..., B, ...] -> [n, ..., B // n, ...]``: micro-batch ``k`` holds the
  examples ``k, k + n, k + 2n, ...``, so that a batch sharded along ``axis``
  (contiguous blocks per device) stays where it is when ``B // n`` is still a
  multiple of the devices.

  Raises:
    ValueError: a batch axis of a length not divisible by ``n``.
  """

  def split(x):
    size = x.shape[axis]
    if size % n:
      raise ValueError(
        f"a batch of {size} examples cannot be cut into {n} "
        f"micro-batches; choose a batch size divisible by it"
      )
    x = x.reshape(x.shape[:axis] + (size // n, n) + x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis + 1, 0)

  return jax.tree_util.tree_map(split, batch)


def _run_of(task: Task, run: run_lib.RunSpec | None) -> run_lib.RunSpec | ml_collections.ConfigDict:
  """``run``, or the task's config when none is given (a task built without
  the trainer: tests, benchmarks, ``python -m laplax.plan``)."""
  return task.config if run is None else run


def make_train_step(
  task: Task,
  tx: optax.GradientTransformation,
  schedule,
  grad_accum_steps: int | None = None,
  run: run_lib.RunSpec | None = None,
):
  """The pure train step ``(state, batch) -> (state, metrics)`` (to be jitted).

  ``run`` is the run spec (the trainer's): its optimiser section
  (``run.optim``: accumulation, budgets, the non-finite guard) and
  ``run.schedule.batch_size`` are read; ``None``: the sections built from
  ``task.config`` (:func:`laplax.config.run.section`).

  ``task.loss(params, batch, rng, task_state, step) -> (loss, (metrics,
  aux))`` gives the gradient (the :class:`~laplax.tasks.base.Task`
  protocol); ``task.mask_updates(updates, step)`` may zero the updates of
  frozen parameters, and ``task.update_task_state(task_state, params, aux,
  step)`` updates the task's state after the parameters.

  Gradient accumulation: with ``grad_accum_steps = n > 1`` (default
  ``optim.grad_accum_steps`` of the run; ``None`` in a config means 1) the batch,
  still the global batch, is cut by :func:`micro_batches` into ``n``
  micro-batches along ``task.batch_axis`` (DINO's views ``[V, B, ...]``: 1),
  and ``jax.lax.scan`` sums the gradients, metrics and aux of the
  micro-batches (float32); one optimizer update then uses their means.
  Micro-batch ``k`` draws its randomness (dropout, Mixup, ...) from
  ``fold_in(step_rng, k)``; with ``n = 1`` nothing is cut and the step is
  exactly the unaccumulated one (``step_rng = fold_in(state.rng, step)``).
  ``config.optim.grad_accum_unroll`` unrolls the loop (a copy of the forward
  and backward pass per micro-batch): the same sums in the same order,
  compiled for longer, and on a CPU faster when a micro-batch's activations
  fit the cache and the batch's do not (the default ViT's 4 x 64 images: 1.2x
  on 2 cores, 32 MiB L3; docs/benchmarks.md, "Cache blocking").
  Losses that are means over examples, and their gradients, equal the whole
  batch's; a metric that is not such a mean (DINO's
  ``teacher_marginal_entropy``) becomes a mean over micro-batches. The aux is
  averaged too, so the task's ``update_task_state`` must use only its mean
  over examples (DINO's centre: the mean teacher logit).

  Budgets (:mod:`laplax.train.budget`): with ``config.optim.budget_hours``
  or ``config.optim.batch_size_ramp`` the step is ``(state, batch, controls)``,
  ``controls = {"schedule_step", "micro_batches"}`` int32 scalars. With a
  wall-time budget the update of the optimizer (AdamW at rate 1,
  :func:`laplax.optim.make_optimizer`) is multiplied by
  ``schedule(schedule_step)``, the schedule at the elapsed time's step,
  instead of ``schedule(state.step)``: the same product. With a ramp only the
  first ``micro_batches`` of the ``n`` micro-batches count (the others are
  not computed: ``jax.lax.cond``; their examples are dropped) and the means
  are over those; at ``micro_batches = n`` the step is the accumulated one
  above.

  Non-finite guard: with ``config.optim.skip_nonfinite`` a step whose loss or
  gradient norm is not finite changes nothing but ``step`` (parameters,
  optimizer and task state keep their values; the metric ``skipped_updates``
  is 1). Otherwise the update is applied and the caller stops on the metrics
  (:func:`first_nonfinite`).
  """
  o = run_lib.section(_run_of(task, run), "optim")
  n = int(grad_accum_steps or o.grad_accum_steps)
  skip_nonfinite = bool(o.skip_nonfinite)
  unroll = bool(o.grad_accum_unroll)
  axis = task.batch_axis
  by_time = o.budget_hours is not None
  ramp = bool(o.batch_size_ramp)
  batch_size = task.config.batch_size if run is None else run.schedule.batch_size

  def gradients(params, batch, rng, task_state, step):
    """(grads, metrics, aux) of one (micro-)batch."""
    loss_fn = lambda p: task.loss(p, batch, rng, task_state, step)
    (_, (metrics, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return grads, metrics, aux

  def accumulated(params, batch, rng, task_state, step, count=None):
    """(grads, metrics, aux) averaged over ``n`` micro-batches (over the
    first ``count`` of them, a traced int32, when given)."""
    micro = micro_batches(batch, n, axis)
    one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), micro)
    shapes = jax.eval_shape(gradients, params, one, rng, task_state, step)
    zeros = jax.tree_util.tree_map(
      lambda s: jnp.zeros(s.shape, jnp.promote_types(s.dtype, jnp.float32)), shapes
    )

    def add(sums, xs):
      k, mb = xs

      def plus():
        out = gradients(params, mb, jax.random.fold_in(rng, k), task_state, step)
        return jax.tree_util.tree_map(lambda a, b: a + b.astype(a.dtype), sums, out)

      if count is None:
        return plus(), None
      return jax.lax.cond(k < count, plus, lambda: sums), None

    sums, _ = jax.lax.scan(add, zeros, (jnp.arange(n), micro), unroll=unroll)
    denominator = n if count is None else count.astype(jnp.float32)
    return jax.tree_util.tree_map(lambda a: a / denominator, sums)

  def train_step(state, batch, controls=None):
    rng = jax.random.fold_in(state.rng, state.step)
    count = controls["micro_batches"] if ramp else None
    grads, metrics, aux = (
      gradients(state.params, batch, rng, state.task_state, state.step)
      if n == 1
      else accumulated(state.params, batch, rng, state.task_state, state.step, count)
    )
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    lr = schedule(controls["schedule_step"] if by_time else state.step)
    if by_time:  # the optimizer's rate is 1: the schedule at the elapsed time's step
      updates = jax.tree_util.tree_map(lambda u: u * jnp.asarray(lr, u.dtype), updates)
    updates = task.mask_updates(updates, state.step)
    params = optax.apply_updates(state.params, updates)
    task_state = task.update_task_state(state.task_state, params, aux, state.step)
    metrics = dict(metrics, grad_norm=grad_norm, lr=lr)
    if ramp:
      metrics["batch_size"] = (count * (batch_size // n)).astype(jnp.float32)
    new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state, task_state=task_state
    )
    if skip_nonfinite:  # keep the old values where this step went non-finite
      finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
      kept = state.replace(step=state.step + 1)
      new_state = jax.tree_util.tree_map(
        lambda new, old: jnp.where(finite, new, old), new_state, kept
      )
      metrics["skipped_updates"] = 1.0 - finite.astype(jnp.float32)
    return new_state, metrics

  return train_step


def first_nonfinite(rows: list[tuple[int, dict]]) -> tuple[int, dict] | None:
  """The first ``(step, metrics)`` whose loss or grad_norm is not finite.

  ``rows`` are host-side per-step metrics; a step whose update was skipped
  (``skipped_updates`` = 1) does not count. Returns ``None`` if all are finite.
  """
  for step, m in rows:
    if m.get("skipped_updates", 0.0) > 0:
      continue
    if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
      return step, m
  return None


def log_record(rows: list[tuple[int, dict]]) -> dict:
  """One metrics.jsonl record of per-step ``rows``: means over the steps whose
  update was applied, and ``skipped_updates`` as a count."""
  applied = [m for _, m in rows if m.get("skipped_updates", 0.0) == 0] or [m for _, m in rows]
  record = {k: float(np.mean([m[k] for m in applied])) for k in rows[0][1]}
  if "skipped_updates" in record:
    record["skipped_updates"] = int(sum(m["skipped_updates"] for _, m in rows))
  return record


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  force_unlock: bool = False,
  clock: Callable[[], float] = time.monotonic,
) -> dict:
  """Trains ``config`` in ``workdir`` (resuming if it has a checkpoint).

  Starts the multi-process runtime if ``config.distributed`` asks for it,
  then trains on the mesh ``config.mesh_shape`` (a checkpoint saved on
  another mesh is restored onto this one). Only process 0 writes
  ``config.json``, metrics and logs; all processes write the checkpoints.

  At each start the config goes to TensorBoard (text and hparams); at each
  evaluation the numbers and texts of the evaluators of ``config.evals``
  that run in training (:mod:`laplax.evaluators.registry`; a GPT's ``samples``:
  its greedy continuation of the validation text) go to ``metrics.jsonl`` and
  TensorBoard; with ``config.wandb.project`` the same go to W&B; with
  ``config.profile.num_steps`` the chosen steps are traced
  (:class:`~laplax.train.profiler.Profiler`).

  With ``config.optim.budget_hours`` the run stops after the step that
  spends the budget of training time (``clock``, in seconds: the wall time;
  tests inject a fake one), or at ``total_steps``
  (:mod:`laplax.train.budget`).

  One run writes a workdir at a time: process 0 holds its lock
  (:mod:`laplax.workdir.lock`; ``force_unlock`` takes over another host's)
  from the first write to the end.

  Returns the final evaluation summary (``{}`` if stopped early by a signal;
  SIGINT/SIGTERM: :mod:`laplax.signals`).

  Raises:
    LockError: another run holds the workdir (checked before anything else).
    ConfigError, DataError: bad input (before anything is written; also
      ``config.wandb.project`` without ``wandb``; a failing ``wandb.init``
      after the config is written); a FitError (:mod:`laplax.train.fit`: a
      batch larger than its split, or a step that cannot fit this machine's
      memory) leaves the workdir as it was.
    NonFiniteError: the loss or gradient norm became non-finite.
    SaveError: a file could not be written (a full disk); what is on disk
      resumes with the same command.
  """
  # Multi-process runtime (config.distributed), before anything starts JAX's backend.
  sharding.initialize_distributed(config.distributed)

  # The lock (several processes: all agree in lock_lib.hold), checks, data; no write.
  if jax.process_count() == 1:
    lock_lib.check(workdir, force_unlock)
  before = set(store.listdir(workdir)) if store.isdir(workdir) else None
  task = None
  try:
    run, task = setup(config, workdir)
    with lock_lib.hold(workdir, force_unlock):
      return _train_in(run, workdir, task, clock)
  except (finetune.InitFromError, fit.FitError):
    _remove_new(workdir, before)  # what this start wrote: nothing is left
    raise
  except (config_lib.ConfigError, DataError):
    if task is None:  # setup's writes (init_from's tokenizer copy) go too
      _remove_new(workdir, before)
    raise


def _remove_new(workdir: str, before: set | None) -> None:
  """Removes what appeared in ``workdir`` since ``before`` (its entries then;
  ``None``: it did not exist), on process 0."""
  if jax.process_index() != 0 or not store.isdir(workdir):
    return
  if before is None:
    store.rmtree(workdir)
    return
  for name in set(store.listdir(workdir)) - before:
    path = os.path.join(workdir, name)
    if store.isdir(path):
      store.rmtree(path)
    else:
      store.remove(path)


def _train_in(run: run_lib.RunSpec, workdir: str, task: Task, clock=time.monotonic) -> dict:
  """:func:`_train` on the run's mesh, under its logical axis rules."""
  # Mesh and logical axis rules; everything below is traced inside them.
  mesh = sharding.make_mesh(run.mesh.mesh_shape)
  rules = run.mesh.rules
  with sharding.context(mesh, rules):
    return _train(run, workdir, task, mesh, rules, budget_lib.Budget(run, clock))


def _open_workdir(schedule: run_lib.Schedule, workdir: str) -> ckpt_lib.Checkpointer:
  """The checkpointer of ``workdir/checkpoints/`` (the workdir exists: the lock)."""
  return ckpt_lib.Checkpointer(
    os.path.join(workdir, CHECKPOINT_DIR),
    max_to_keep=schedule.keep_checkpoints,
    verify=schedule.checkpoint_verify,
  )


def _restore_or_start(
  run, workdir: str, task: Task, tx, checkpointer, train_iter, state_sharding, abstract, budget
):
  """The restored state (onto this mesh; the data position set) or the initial
  one (created sharded, saved as step 0). ``budget`` takes the elapsed time
  saved with the data state (:class:`laplax.train.budget.Budget`).

  ``config.json`` is written on a fresh start before the first checkpoint
  (checkpoints without it are refused), on resume only once the state is
  restored, so that a failed restore changes nothing.
  """
  config, seed = run.config, run.schedule.seed
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(
      sharded_abstract_state(task, tx, seed, state_sharding, abstract),
      discard_unreadable=True,
    )
    train_iter.set_state(budget.restore(data_state))  # the elapsed time to the budget
    logging.info("resumed from step %d", int(state.step))
    if jax.process_index() == 0:
      write_config(config, workdir, last_step=checkpointer.latest_step())
    return state
  init = None
  if run.schedule.init_from:  # checked before anything is written
    init = finetune.initial_params(
      run.schedule.init_from,
      abstract.params,
      fresh=getattr(task, "init_fresh", ()),
      dropped=getattr(task, "init_dropped", ()),
    )
  if jax.process_index() == 0:
    write_config(config, workdir)
  checkpointer.warn_incomplete(delete=True)
  state = create_state(task, tx, seed, state_sharding)
  if init is not None:
    params = jax.tree_util.tree_map(
      lambda new, old: old if new is None else new,
      init,
      jax.device_get(state.params),
      is_leaf=lambda x: x is None,
    )
    params = jax.device_put(params, state_sharding.params)
    opt_state = jax.jit(tx.init, out_shardings=state_sharding.opt_state)(params)
    state = state.replace(
      params=params,
      opt_state=opt_state,
      task_state=jax.jit(task.init_task_state, out_shardings=state_sharding.task_state)(params),
    )
  checkpointer.save(state, budget.saved(train_iter.get_state()))
  return state


def _fetch_finite(pending: list, checkpointer, bar) -> list:
  """The pending ``(step, metrics)`` fetched to the host.

  Raises:
    NonFiniteError: a step's loss or gradient norm is not finite (the
      checkpoint writes finish and the progress bar closes first).
  """
  pending = jax.device_get(pending)
  bad = first_nonfinite(pending)
  if bad is not None:
    checkpointer.wait()
    bar.close()
    step, m = bad
    raise NonFiniteError(
      f"non-finite training metrics at step {step} (loss={float(m['loss'])}, "
      f"grad_norm={float(m['grad_norm'])}); nothing after step {step - 1} was "
      f"saved; last good checkpoint: step {checkpointer.latest_step()} in "
      f"{checkpointer.directory}; lower optim.lr or set optim.skip_nonfinite=True"
    )
  return pending


def _stop_reached(stop: signals.Guard, step: int) -> bool:
  """Whether to stop after ``step`` (finished) on a signal.

  One process: whether a signal came. Several: JAX's preemption sync point
  (:func:`jax.experimental.multihost_utils.reached_preemption_sync_point`,
  called by every process at every step): a signal to any process is
  forwarded to JAX's preemption notifier (:meth:`laplax.signals.Guard.graceful`),
  the coordination service tells the others, and all of them return True at
  the same step, so that they save the same checkpoint together.
  """
  if jax.process_count() == 1:
    return stop.signum is not None
  from jax.experimental import multihost_utils

  stop.progress()  # a step ended: the deadline of a signal starts again
  return bool(multihost_utils.reached_preemption_sync_point(step))


def _log(
  step: int,
  pending: list,
  interval: LogInterval,
  stop: signals.Guard,
  writer: MetricWriter,
  task: Task,
  say,
  bar,
) -> None:
  """One log step of the loop: the interval's record (the ``pending`` steps'
  metrics, already on the host, and the interval's timing) into the metrics,
  the task's warning line, the loss on the progress bar, and the slowest time
  per step so far for the signal guard (:attr:`laplax.signals.Guard.step_seconds`)."""
  record = dict(log_record(pending), **interval.record(len(pending)))
  stop.step_seconds = max(stop.step_seconds, 1.0 / record["steps_per_sec"])
  skipped = [s for s, m in pending if m.get("skipped_updates", 0.0) > 0]
  writer.write(step, "train", record)
  warning = _warning(task, record, skipped)
  if warning:
    say(f"warning at step {step}: {warning}")
  bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)


def _stopped_line(stop: signals.Guard, step: int, checkpointer) -> str:
  """The line a run stopped by a signal ends with: which signal, the saved step."""
  how = f"signal {stop.signum}" if stop.signum else "a signal to another process"
  return (
    f"stopped by {how} at step {step}; checkpoint saved in "
    f"{checkpointer.directory}; run the same command to resume"
  )


def _warning(task: Task, record: dict, skipped: list[int]) -> str | None:
  """The task's monitor line for a logged record, and the skipped updates."""
  warning = task.monitor(record)
  if skipped:
    warning = f"skipped the non-finite update of step(s) {', '.join(map(str, skipped))}" + (
      f"; {warning}" if warning else ""
    )
  return warning


@contextlib.contextmanager
def _on_error(writer: MetricWriter, profiler: Profiler, checkpointer, bar):
  """On an exception (a non-finite loss, a crash): ends the profiler trace,
  the progress bar and the writer (the W&B run finishes as failed), then
  re-raises. A failed write (a full disk) is reported as the failed
  checkpoint save when one failed too (its cause, usually)."""
  try:
    yield
  except BaseException as e:
    profiler.stop()
    bar.close()
    writer.close(failed=True)
    if isinstance(e, SaveError):
      checkpointer.wait()
    raise


def _open_writer(run, workdir: str, checkpointer, state, task) -> tuple[MetricWriter, int]:
  """The metrics writer, with the records after the restored step dropped (at step 0:
  all) and the config (and, at step 0, the parameter count and attention kernel)
  written; and that step."""
  start, config = int(state.step), run.config
  kernel = config_lib.attention_kernel(
    config, task, say=print if jax.process_index() == 0 else None
  )
  writer = MetricWriter(workdir, run, last_step=checkpointer.last_complete)
  # Records after the restored step go; from step 0 (a run ended before its
  # first checkpoint) all of them, so that the info record below is written once.
  writer.drop_after(start if start > 0 else -1)
  writer.write_config(config, start)
  if start == 0:
    writer.write(
      0,
      "info",
      {
        "num_params": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
        "attention_kernel": kernel,
      },
    )
  return writer, start


def _train(
  run: run_lib.RunSpec,
  workdir: str,
  task: Task,
  mesh: jax.sharding.Mesh,
  rules,
  budget: budget_lib.Budget,
) -> dict:
  """The body of :func:`train_and_evaluate`, inside the mesh and rules;
  ``budget`` gives the steps' controls, the wall-time stop and the elapsed
  time saved with each checkpoint. Reads the run's sections: the schedule
  (steps, cadences, checkpoints), the optimiser, the evaluation and the
  observability."""
  # Workdir, optimizer, checkpoints.
  steps = run.schedule
  checkpointer = _open_workdir(steps, workdir)
  tx = optim.make_optimizer(run)
  schedule = optim.learning_rate_schedule(run.optim, steps.total_steps)

  # Input: each process reads its rows of the global batch; the evaluators of
  # config.evals that run during training.
  train_iter = iter(task.train_dataset(jax.process_index(), jax.process_count()))
  evaluators = registry.build(task, registry.TRAIN, run.evaluation.evals)
  batch_sharding = batch_shardings(task, mesh, rules)
  global_batch = task.batch_spec(steps.batch_size)
  # Sharding, then the initial state (created sharded) or resume (onto this mesh).
  abstract, state_sharding = abstract_and_shardings(task, tx, steps.seed, mesh, rules)
  train_step = jit_train_step(task, tx, schedule, state_sharding, batch_sharding, run)
  if steps.total_steps > (checkpointer.latest_step() or 0):  # a step will run
    fit.check_memory(run, task, train_step, abstract, state_sharding, batch_sharding)
  resumed = checkpointer.latest_step() is not None
  state = _restore_or_start(
    run, workdir, task, tx, checkpointer, train_iter, state_sharding, abstract, budget
  )
  writer, start = _open_writer(run, workdir, checkpointer, state, task)

  place = lambda batch: sharding.whole_batch(batch, mesh, rules)
  pending: list[tuple[int, Any]] = []  # (step, metrics) since the last log

  def check_finite():
    pending[:] = _fetch_finite(pending, checkpointer, bar)

  interval, summary = LogInterval(), {}
  bar = tqdm.tqdm(
    total=steps.total_steps,
    initial=start,
    unit="step",
    dynamic_ncols=True,
    mininterval=1.0,
    disable=jax.process_index() != 0,
  )
  say = bar.write if jax.process_index() == 0 else lambda text: None  # process 0 logs
  if resumed:
    say(f"resumed from step {start} in {checkpointer.directory}")
  profiler = Profiler(run, workdir)
  profiler.check(start, say)

  with (
    signals.graceful(jax.process_count() > 1) as stop,
    preemption.watched(stop),
    _on_error(writer, profiler, checkpointer, bar),
  ):
    previous = state.step  # the output of the step before (here: the restored state)
    saved = start  # the last step saved (or restored)
    end = start if budget.spent_before() else steps.total_steps
    budget.start()
    for step in range(start + 1, end + 1):
      # A stop is decided before the next batch is read, so that the data
      # position saved with the step is the one after it.
      if _stop_reached(stop, step - 1):
        jax.block_until_ready(previous)
        check_finite()  # never save a state past a non-finite step
        stop.reached()
        if step - 1 > saved:
          checkpointer.save(state, budget.saved(train_iter.get_state()))
        checkpointer.wait()
        bar.close()
        say(_stopped_line(stop, step - 1, checkpointer))
        summary = {}
        break
      with profiler.step(step):
        batch = interval.wait_for(
          lambda: sharding.global_batch(next(train_iter), batch_sharding, global_batch)
        )
        # At most one step runs ahead of the host: the step before has finished
        # (while this batch was read) before this one is dispatched, so a signal
        # waits for two steps at most (laplax.signals, the stop bound).
        jax.block_until_ready(previous)
        state, metrics = train_step(state, batch, *budget.controls(step - 1))
      previous = metrics
      profiler.after(step, state, say)
      pending.append((step, metrics))
      bar.update(1)
      spent = budget.spent()  # the wall-time budget (cramming's deadline)
      last = step == steps.total_steps or spent
      logged = step % steps.log_every == 0 or last
      if logged:
        check_finite()
        _log(step, pending, interval, stop, writer, task, say, bar)
        pending = []
      save = step % steps.checkpoint_every == 0 or last
      evaluate = step % steps.eval_every == 0 or last
      if not logged and (save or evaluate):
        check_finite()  # never save or evaluate a state past a non-finite step
      if save:
        checkpointer.save(state, budget.saved(train_iter.get_state()))
        saved = step
      if evaluate:
        # A signal during the evaluation ends it (one process: at once; several:
        # at its end) and the run stops at the next step's check, this step saved.
        with budget.paused():  # evaluations are not training time
          ran = stop.evaluate(
            functools.partial(
              registry.run, evaluators, state, registry.Context(place=place, say=say, step=step)
            )
          )
        if ran is not None:
          summary, texts = ran
          writer.write_eval(step, summary, texts)
          say(eval_line(step, summary))
        else:
          summary = {}
          if last:  # no next step checks: stop here, this step saved
            checkpointer.wait()
            bar.close()
            say(_stopped_line(stop, step, checkpointer))
      if spent:
        say(
          f"the budget of {run.optim.budget_hours} h of training is spent at step "
          f"{step} ({budget.elapsed / 3600:.4g} h); checkpoint saved in {checkpointer.directory}"
        )
        break
    checkpointer.close()
  profiler.stop(state)
  bar.close()
  if (start >= steps.total_steps or budget.spent_before()) and start > 0:
    summary, _ = registry.run(evaluators, state, registry.Context(place=place, say=say))
  writer.close()
  return summary
