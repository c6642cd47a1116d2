"""The one training loop: setup, jitted step, logging, evaluation, checkpoints.

``train_and_evaluate(config, workdir)`` is read top to bottom in sections:
checks, workdir, input, model and optimizer, checkpoint/resume, step, loop.
The workdir holds ``config.json``, ``metrics.jsonl`` (one JSON object per
record, each with ``step``), TensorBoard events, and ``checkpoints/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from laplax.train import checkpoint as ckpt_lib
from laplax.train import config as config_lib
from laplax.train import optim, tasks

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"


class NonFiniteError(RuntimeError):
  """The loss or gradient norm became NaN or infinite."""


class MetricWriter:
  """Appends records to ``metrics.jsonl`` and TensorBoard event files.

  Only process 0 writes. Each record is ``{"step": int, "split": str, ...}``.
  """

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, METRICS_FILE)
    self.tb = None
    if self.active:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def drop_after(self, step: int) -> None:
    """Removes records newer than ``step`` (left by a run killed after it)."""
    if not self.active or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [l for l in f if l.strip()]
    keep = [l for l in lines if json.loads(l).get("step", 0) <= step]
    if len(keep) != len(lines):
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(keep)
      os.replace(tmp, self.path)

  def write(self, step: int, split: str, metrics: dict) -> None:
    """Writes one record; values must be Python scalars."""
    if not self.active:
      return
    record = {"step": int(step), "split": split, **metrics}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in metrics.items():
      if isinstance(v, (int, float)):
        self.tb.add_scalar(f"{split}/{k}", v, step)
    self.tb.flush()

  def close(self) -> None:
    """Closes the TensorBoard writer."""
    if self.tb is not None:
      self.tb.close()


def load_saved_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The config saved in ``workdir/config.json``, or ``None`` if there is none."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f"{path} is unreadable ({type(e).__name__}); it is not a laplax run's "
        f"config, use another --workdir") from None


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir that belongs to a run of another architecture.

  Raises:
    ConfigError: the saved config differs in a key that decides the parameters.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise config_lib.ConfigError(f"--workdir {workdir} is a file; give a directory")
  parent = workdir
  while not os.path.exists(parent):
    parent = os.path.dirname(os.path.abspath(parent))
  if not os.access(parent, os.W_OK):
    raise config_lib.ConfigError(f"--workdir {workdir} is not writable ({parent}); "
                                 f"choose a directory you can write to")
  saved = load_saved_config(workdir)
  if saved is None:
    return
  diff = config_lib.architecture_diff(saved.to_dict(), config)
  if diff:
    raise config_lib.ConfigError(
        f"workdir {workdir} holds a run with a different architecture "
        f"({', '.join(diff[:6])}{' ...' if len(diff) > 6 else ''} differ); use "
        f"another --workdir or the same config")


def evaluate(task: Any, state: ckpt_lib.TrainState, eval_step=None) -> dict:
  """Evaluates ``state`` on the task's eval split.

  A task with its own ``evaluate(state)`` (DINO: k-NN on frozen features)
  decides; otherwise the task's ``eval_sums`` are summed over every eval
  batch and summarised (e.g. ``accuracy``, ``loss``, ``num_examples``).
  """
  if hasattr(task, "evaluate"):
    return task.evaluate(state)
  eval_step = eval_step or jax.jit(task.eval_sums)
  sums = None
  for batch in task.eval_batches():
    out = jax.device_get(eval_step(state.params, batch))
    sums = out if sums is None else {k: sums[k] + np.float64(out[k]) for k in sums}
  return task.summarize(sums)


def abstract_state(task: Any, tx: optax.GradientTransformation, seed: int):
  """Shapes and dtypes of the TrainState (``jax.ShapeDtypeStruct`` leaves)."""
  return jax.eval_shape(lambda: init_state(task, tx, seed))


def _stateful(task: Any) -> bool:
  return hasattr(task, "init_task_state")


def init_state(task: Any, tx: optax.GradientTransformation, seed: int):
  """The TrainState at step 0: parameters from ``seed``, fresh optimizer state,
  and the task's initial state (``task.init_task_state(params)``) if it has one."""
  rng = jax.random.PRNGKey(seed)
  params = task.init(jax.random.fold_in(rng, 0))
  return ckpt_lib.TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
      rng=jax.random.fold_in(rng, 1),
      task_state=task.init_task_state(params) if _stateful(task) else None)


def setup(config: ml_collections.ConfigDict, workdir: str | None,
          check: bool = True):
  """Validates the config and the workdir, then prepares the task's data.

  Before the data is prepared nothing is written; the data preparation writes
  only into ``data.data_dir`` (and a trained tokenizer into ``workdir``).

  Raises:
    ConfigError, DataError: one-line user errors.
  """
  config_lib.validate(config)
  if check and workdir is not None:
    check_workdir(config, workdir)
  return tasks.make_task(config, workdir)


def make_train_step(task: Any, tx: optax.GradientTransformation, schedule):
  """The pure train step ``(state, batch) -> (state, metrics)`` (to be jitted).

  ``task.loss(params, batch, rng) -> (loss, metrics)`` gives the gradient. A
  task with a state (``init_task_state``) instead has ``task.loss(params,
  batch, rng, task_state, step) -> (loss, (metrics, aux))``, may mask the
  optimizer updates with ``task.mask_updates(updates, step)``, and updates its
  state after the parameters with ``task.update_task_state(task_state, params,
  aux, step)``.
  """
  stateful = _stateful(task)

  def train_step(state, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    if stateful:
      loss_fn = lambda p: task.loss(p, batch, rng, state.task_state, state.step)
    else:
      loss_fn = lambda p: task.loss(p, batch, rng)
    (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    metrics, aux = aux if stateful else (aux, None)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    if stateful:
      updates = task.mask_updates(updates, state.step)
    params = optax.apply_updates(state.params, updates)
    task_state = (task.update_task_state(state.task_state, params, aux, state.step)
                  if stateful else state.task_state)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads),
                   lr=schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         task_state=task_state), metrics

  return train_step


class _StopRequest:
  """Records SIGTERM/SIGINT so the loop can checkpoint and exit cleanly."""

  def __init__(self):
    self.signum = None
    self._old = {}

  def __enter__(self):
    for s in (signal.SIGTERM, signal.SIGINT):
      self._old[s] = signal.signal(s, self._handle)
    return self

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    self.signum = signum

  def __exit__(self, *exc):
    for s, h in self._old.items():
      signal.signal(s, h)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains ``config`` in ``workdir`` (resuming if it has a checkpoint).

  Returns the final evaluation summary (``{}`` if stopped early by a signal).

  Raises:
    ConfigError, DataError: bad input (before anything is written).
    NonFiniteError: the loss or gradient norm became non-finite.
  """
  # Checks and data, before any write.
  task = setup(config, workdir)

  # Workdir.
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
      f.write(config.to_json(indent=2))
  writer = MetricWriter(workdir)

  # Model and optimizer.
  tx = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(config.optim, config.total_steps)
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, CHECKPOINT_DIR),
                                       max_to_keep=config.get("keep_checkpoints", 3))

  # Input.
  train_iter = iter(task.train_dataset(jax.process_index(), jax.process_count()))

  # Initial state or resume.
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(
        abstract_state(task, tx, config.seed), discard_unreadable=True)
    train_iter.set_state(data_state)
    logging.info("resumed from step %d", int(state.step))
  else:
    state = jax.jit(lambda: init_state(task, tx, config.seed))()
    checkpointer.save(state, train_iter.get_state())
  start = int(state.step)
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  writer.drop_after(start)
  if start == 0:
    writer.write(0, "info", {"num_params": int(num_params)})

  train_step = jax.jit(make_train_step(task, tx, schedule), donate_argnums=0)
  eval_step = jax.jit(task.eval_sums) if hasattr(task, "eval_sums") else None
  pending: list[dict] = []
  last_log = time.time()
  summary: dict = {}
  bar = tqdm.tqdm(total=config.total_steps, initial=start, unit="step",
                  dynamic_ncols=True, mininterval=1.0,
                  disable=jax.process_index() != 0)
  with _StopRequest() as stop:
    for step in range(start + 1, config.total_steps + 1):
      batch = next(train_iter)
      state, metrics = train_step(state, batch)
      pending.append(metrics)
      bar.update(1)
      if step % config.log_every == 0 or step == config.total_steps:
        rows = jax.device_get(pending)
        record = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
        now = time.time()
        record["steps_per_sec"] = len(rows) / max(now - last_log, 1e-9)
        last_log, pending = now, []
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
          checkpointer.wait()
          raise NonFiniteError(
              f"non-finite training metrics at step {step} (loss={record['loss']}, "
              f"grad_norm={record['grad_norm']}); last good checkpoint: step "
              f"{checkpointer.latest_step()} in {checkpointer.directory}")
        writer.write(step, "train", record)
        warning = task.monitor(record) if hasattr(task, "monitor") else None
        if warning:
          bar.write(f"warning at step {step}: {warning}")
        bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)
      if step % config.checkpoint_every == 0 or step == config.total_steps:
        checkpointer.save(state, train_iter.get_state())
      if step % config.eval_every == 0 or step == config.total_steps:
        summary = evaluate(task, state, eval_step)
        writer.write(step, "eval", summary)
        bar.write(f"step {step}: " + ", ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in summary.items()))
      if stop.signum is not None:
        checkpointer.save(state, train_iter.get_state())
        checkpointer.wait()
        bar.close()
        print(f"stopped by signal {stop.signum} at step {step}; checkpoint saved in "
              f"{checkpointer.directory}; run the same command to resume")
        summary = {}
        break
  bar.close()
  if start >= config.total_steps and start > 0:
    summary = evaluate(task, state, eval_step)
  checkpointer.close()
  writer.close()
  return summary
