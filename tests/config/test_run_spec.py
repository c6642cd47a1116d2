"""The run spec (:mod:`laplax.config.run`): every shipped config builds into
the values its ConfigDict holds, and a bad value in each section is that
section's one line (exit code 2 through the CLI's error handling)."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from laplax import sharding, tasks, utils
from laplax.cli import common as cli
from laplax.config import run as run_lib
from laplax.config import validation as config_lib
from laplax.models import spec as spec_lib

WANDB_KEYS = ("project", "entity", "name", "mode")
CONFIGS = sorted((pathlib.Path(__file__).parents[2] / "configs").glob("*.py"))


def _config(name: str = "vit_fashion_mnist"):
  return utils.config_from_file(str(CONFIGS[0].parent / f"{name}.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_builds_into_its_own_values(path):
  """The sections hold the ConfigDict's values, key by key (the field names
  are the keys; ``optim.grad_accum_steps=None`` is 1), and the model spec is
  :func:`laplax.models.spec.from_config`'s: what the loop and the tasks read
  from the ConfigDict before the run spec."""
  c = utils.config_from_file(str(path))
  run = tasks.validate(c)
  assert run.config is c and run.task is tasks.task_class(c) and run.data is c.data
  assert run.model == spec_lib.from_config(c.model)
  assert dataclasses.asdict(run.schedule) == {
    "init_from": c.init_from or "",
    **{f: c[f] for f in dataclasses.asdict(run.schedule) if f != "init_from"},
  }
  optim = dataclasses.asdict(run.optim)
  expected = {f: c.optim[f] if f in c.optim else None for f in optim}
  expected["grad_accum_steps"] = c.optim.grad_accum_steps or 1
  expected["weight_decay_exclude"] = tuple(c.optim.weight_decay_exclude)
  assert optim == expected
  assert run.mesh == run_lib.Mesh(
    c.mesh_shape,
    sharding.rules_from_config(c),
    c.distributed.enabled,
    c.distributed.coordinator_address,
    c.distributed.num_processes,
    c.distributed.process_id,
  )
  assert run.evaluation.evals == config_lib.split_evals(c.evals)
  assert run.observability == run_lib.Observability(
    c.profile.start_step, c.profile.num_steps, *(c.wandb[k] for k in WANDB_KEYS)
  )


def test_a_task_takes_the_run_s_model_spec_as_it_is():
  """``spec=`` is the run's spec object (not rebuilt); without it the task
  builds an equal one from ``config.model`` (a task built from a config alone)."""
  c = _config()
  run = tasks.validate(c)
  task = tasks.ClassificationTask(c, 10, (28, 28, 1), spec=run.model)
  assert task.spec is run.model and task.model.spec is run.model
  assert tasks.ClassificationTask(c, 10, (28, 28, 1)).spec == run.model


BAD = [
  # (section type, key, value, the one line)
  (run_lib.Schedule, "seed", -1, "config.seed=-1 must be an integer >= 0"),
  (
    run_lib.Schedule,
    "checkpoint_verify",
    "yes",
    "config.checkpoint_verify='yes' must be True or False",
  ),
  (run_lib.Optim, "optim.lr", 0.0, "config.optim.lr=0.0 must be a finite number > 0.0"),
  (
    run_lib.Optim,
    "optim.schedule",
    "linear",
    "config.optim.schedule='linear' is unknown; use 'cosine', 'warmdown', 'progress', 'triangle' or 'onecycle'",
  ),
  (
    run_lib.Optim,
    "optim.grad_accum_steps",
    3,
    "config.batch_size=256 is not divisible by config.optim.grad_accum_steps=3 (the global "
    "batch is cut into that many micro-batches); use a multiple of 3 or set "
    "--config.optim.grad_accum_steps=1",
  ),
  (
    run_lib.Mesh,
    "distributed.coordinator_address",
    "nohost",
    "config.distributed.coordinator_address='nohost' must be 'host:port'",
  ),
  (
    run_lib.Mesh,
    "distributed.enabled",
    1,
    "config.distributed.enabled=1 must be True or False",
  ),
  (
    run_lib.Evaluation,
    "evals",
    "knn,knn",
    "config.evals='knn,knn' names an evaluator twice",
  ),
  (
    run_lib.Observability,
    "wandb.mode",
    "loud",
    "config.wandb.mode='loud' is unknown; use one of 'online', 'offline', 'disabled' "
    "(or leave it unset)",
  ),
  (
    run_lib.Observability,
    "profile.num_steps",
    -1,
    "config.profile.num_steps=-1 must be an integer >= 0: the number of traced steps, 0 for "
    "no trace",
  ),
]


@pytest.mark.parametrize("section,key,value,line", BAD, ids=[b[1] for b in BAD])
def test_a_bad_value_is_its_section_s_one_line(section, key, value, line, capsys):
  """The section type refuses the value with the line ``train.py`` has always
  printed; the whole build raises the same line, and the CLI prints it as
  ``error: LINE`` and exits 2."""
  saved = json.loads(_config().to_json())  # a value of any type, as a saved run's
  *parents, leaf = key.split(".")
  node = saved
  for p in parents:
    node = node[p]
  node[leaf] = value
  c = ml_collections.ConfigDict(saved)
  with pytest.raises(config_lib.ConfigError) as e:
    section.from_config(c)
  assert str(e.value) == line
  with pytest.raises(SystemExit) as exit_info:
    cli.run(lambda guard: tasks.validate(c, num_devices=1))
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"]


def test_a_bad_model_is_the_model_spec_s_one_line(capsys):
  c = _config()
  c.model.num_heads = 5
  line = (
    "config.model.width=128 is not divisible by model.num_heads=5; choose num_heads dividing "
    "the width"
  )
  with pytest.raises(config_lib.ConfigError, match=f"^{line}$"):
    tasks.validate(c)
  with pytest.raises(SystemExit) as exit_info:
    cli.run(lambda guard: tasks.validate(c, num_devices=1))
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"]


def _diverged_run():
  """The default ViT's run spec with sections that differ from its ConfigDict
  (which keeps ``lr=2e-3``, 100 warm-up and 1,200 steps of batch 256 in 4
  micro-batches, no budget, no trace): a reader of ``config.*`` sees the
  ConfigDict's values, a reader of the sections these."""
  c = _config()
  run = tasks.validate(c)
  optim = dataclasses.replace(
    run.optim,
    lr=0.5,
    warmup_steps=0,
    min_lr_ratio=0.0,
    grad_accum_steps=2,
    batch_size_ramp=0.5,
    skip_nonfinite=True,
  )
  schedule = dataclasses.replace(run.schedule, total_steps=2, batch_size=8)
  seen = dataclasses.replace(run.observability, profile_start_step=2, profile_num_steps=3)
  return dataclasses.replace(run, optim=optim, schedule=schedule, observability=seen)


def test_the_optimiser_follows_the_run_spec_s_sections():
  """``make_optimizer(run)`` reads ``run.optim`` and ``run.schedule``: two
  AdamW updates of a vector with one gradient (no decay on a vector) move
  each entry by ``-lr_t sign(g)`` (Adam's bias-corrected ``m/sqrt(v)`` is
  ``g/|g|`` for a constant ``g``, to ``eps`` and ``1 - b2`` in float32:
  ``1e-5``), at the cosine rates of
  ``lr=0.5`` over ``total_steps=2`` without warm-up: 0.5, then ``0.5 (1 +
  cos(pi/2)) / 2 = 0.25``. The ConfigDict's values (2e-3 after 100 warm-up
  steps of 1,200) would give 0 and 2e-5."""
  from laplax import optim

  run = _diverged_run()
  tx = optim.make_optimizer(run)
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([2.0, -3.0])}
  state = tx.init(params)
  moves = []
  for _ in range(2):
    updates, state = tx.update(grads, state, params)
    moves.append(np.asarray(updates["w"]))
  np.testing.assert_allclose(moves, [[-0.5, 0.5], [-0.25, 0.25]], rtol=1e-4)
  schedule = optim.learning_rate_schedule(run.optim, run.schedule.total_steps)
  np.testing.assert_allclose([float(schedule(0)), float(schedule(1))], [0.5, 0.25], rtol=1e-6)


def test_the_loop_s_parts_follow_the_run_spec_s_sections(tmp_path):
  """The budget, the profiler and the train step read the sections: 2 steps
  of batch 8 in micro-batches of 4 with a ramp (the step takes controls and
  reports its batch size), the non-finite guard on, steps 2-3 traced (cut
  to the run's 2 steps)."""
  from laplax import optim
  from laplax import state as state_lib
  from laplax.train import budget as budget_lib
  from laplax.train import loop
  from laplax.train.profiler import Profiler

  run = _diverged_run()
  budget = budget_lib.Budget(run)
  assert (budget.total_steps, budget.batch_size, budget.micro_batch, budget.ramp) == (2, 8, 4, 0.5)
  assert budget_lib.uses_controls(run) and not budget_lib.uses_controls(run.config)
  profiler = Profiler(run, str(tmp_path))
  assert (profiler.first, profiler.num, profiler.last) == (2, 3, 2)
  task = tasks.ClassificationTask(run.config, 10, (28, 28, 1), spec=run.model)
  tx = optim.make_optimizer(run)
  step = loop.make_train_step(task, tx, optim.learning_rate_schedule(run.optim, 2), run=run)
  state = state_lib.abstract_state(task, tx, 0)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in task.batch_spec(8).items()}
  _, metrics = jax.eval_shape(step, state, batch, *budget_lib.controls_spec(run))
  assert {"batch_size", "skipped_updates"} <= set(metrics)
