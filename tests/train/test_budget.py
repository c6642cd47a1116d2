"""cramming's budgets (laplax/train/budget.py): the wall-time schedule and the
batch-size ramp against transcriptions of cramming's functions, an
accumulated ramp step against one step on the big batch, and runs with a
fake clock (the stop once the budget is spent, the elapsed time resumed) and
with the ramp (resumed bitwise)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import optim, sweep, tasks
from laplax import state as state_lib
from laplax.train import budget as budget_lib
from laplax.train import loop

from helpers.configs import load
from helpers.resume import assert_bitwise_equal, saved_state

# --- transcriptions of cramming (JonasGeiping/cramming, written from its code) ---


def cramming_fake_step(current_step, elapsed_seconds, hour_budget, num_training_steps):
  """backend/optimizers/schedulers.py, _get_fake_step (time.time() - initial_time
  is the elapsed time)."""
  elapsed_hours = elapsed_seconds / 60 / 60
  if current_step == 0:
    return 0
  return int(elapsed_hours / hour_budget * num_training_steps)


def cramming_budget_triangle2(current_step, elapsed_seconds, hour_budget, num_training_steps):
  """get_budget_triangle's lr_lambda with budget-triangle2's base_percentage
  0.25 and falloff 0.25."""
  base_percentage, falloff = 0.25, 0.25
  fake_step = cramming_fake_step(current_step, elapsed_seconds, hour_budget, num_training_steps)
  return min(
    base_percentage + fake_step * (1 - base_percentage) / (1 - falloff) / num_training_steps,
    float(1 / falloff - fake_step / (num_training_steps * falloff)),
  )


def cramming_batch_sizes(elapsed_after, hour_budget, steps, batch_size, ramp, mbs):
  """TorchEngineMinimal's batch size of each update (backend/torch_default.py):
  current_batch_size starts at the micro-batch, and after each update
  schedule_batch_size sets the next one from the elapsed time then
  (``elapsed_after[i]``: seconds after update i)."""
  current = mbs
  sizes = []
  for elapsed in elapsed_after:
    sizes.append(current)
    elapsed_hours = elapsed / 60 / 60
    fake_step = int(elapsed_hours / hour_budget * steps)
    batch_size_step = batch_size / (steps * ramp)
    current = min(int(fake_step * batch_size_step // mbs + 1) * mbs, batch_size)
  return sizes


class FakeClock:
  """``delta`` seconds more at every call."""

  def __init__(self, delta):
    self.t, self.delta = 1000.0, delta

  def __call__(self):
    self.t += self.delta
    return self.t


# --- the functions ---


def test_wall_time_schedule_is_crammings_budget_triangle2():
  """The step form of the triangle at budget_step(elapsed) is cramming's
  budget-triangle2, over the whole budget and at the first update."""
  o = load("bert_cramming").optim
  hours, steps = 1.5, 900_000
  schedule = optim.learning_rate_schedule(o, steps)
  for current_step in (0, 1, 7000):
    for elapsed in np.linspace(0.0, hours * 3600, 41):
      fake = optim.budget_step(float(elapsed), hours, steps, current_step)
      want = o.lr * cramming_budget_triangle2(current_step, float(elapsed), hours, steps)
      np.testing.assert_allclose(float(schedule(fake)), want, rtol=2e-6, atol=1e-12)
  # The peak at 75% of the budget, 0.25 lr at its start and 0 at its end.
  assert optim.budget_step(0.75 * hours * 3600, hours, steps, 1) == 675_000
  np.testing.assert_allclose(float(schedule(675_000)), o.lr, rtol=1e-6)


def test_ramp_sizes_are_crammings_by_time_and_by_steps():
  """Budget.controls with a fake clock gives cramming's batch size of every
  update (bert-o4: ramp 0.6); by steps, the update count is its fake step."""
  c = load("bert_cramming")
  c.update(batch_size=64, total_steps=200)
  c.optim.update(budget_hours=0.01, batch_size_ramp=0.6, grad_accum_steps=8)
  clock = FakeClock(0.2)
  b = budget_lib.Budget(c, clock)
  b.start()
  got, elapsed_after = [], []
  for step in range(100):
    (controls,) = b.controls(step)
    got.append(int(controls["micro_batches"]) * 8)
    b.spent()
    elapsed_after.append(b.elapsed + 0.2)  # the next read: cramming's time after this update
  want = cramming_batch_sizes(elapsed_after, 0.01, 200, 64, 0.6, 8)
  assert got == want
  assert got[0] == 8 and got[-1] == 64 and len(set(got)) == 8  # one micro-batch more each step
  # By steps: 64 / (200 x 0.6) = 0.533 examples per step, so a micro-batch of
  # 8 more every 15 updates; the whole batch from update 105 on.
  sizes = [budget_lib.ramp_micro_batches(s, 200, 0.6, 64, 8) * 8 for s in range(200)]
  assert sizes == [min((int(s * (64 / 120) // 8) + 1) * 8, 64) for s in range(200)]
  assert sizes[:16] == [8] * 15 + [16] and sizes.index(64) == 105
  assert budget_lib.ramp_micro_batches(5, 200, 0.0, 64, 8) == 8
  # configs/bert_cramming.py:size=paper: bert-o4's ramp, micro-batches of 512.
  paper = load("bert_cramming", "size=paper")
  assert (paper.optim.batch_size_ramp, paper.optim.grad_accum_steps) == (0.6, 16)
  b = budget_lib.Budget(paper)
  assert [int(b.controls(s)[0]["micro_batches"]) * 512 for s in (0, 1125, 17_999, 18_000)] == [
    512,
    1024,
    8192,
    8192,
  ]
  assert load("bert_cramming").optim.batch_size_ramp == 0.0


def _lm_config(corpus, tmp_path, **optim_keys):
  c = load("gpt_shakespeare", "laplacian=1")
  c.model.update(width=32, depth=1, num_heads=2, mlp_dim=64, max_length=16)
  c.data.update(source_dir=str(corpus), data_dir=str(tmp_path / "tfds"))
  c.update(batch_size=8, eval_batch_size=8, total_steps=8, log_every=1, eval_every=1000)
  c.update(checkpoint_every=2, check_memory=False, evals="bits_per_byte")
  # The triangle: 0.25 lr at the first update (a warm-up would leave it out).
  c.optim.update(schedule="triangle", warmup_steps=0, grad_accum_steps=4)
  c.optim.update(optim_keys)
  return c


def _stepper(config):
  """The jitted train step of ``config`` and a function of its one step from
  the initial state."""
  task = tasks.TASKS["lm"].from_shapes(config)
  tx = optim.make_optimizer(config)
  state = state_lib.init_state(task, tx, 0)
  schedule = optim.learning_rate_schedule(config.optim, config.total_steps)
  step = jax.jit(loop.make_train_step(task, tx, schedule))

  def one(batch, *controls):
    return step(state, batch, *controls)

  one.initial = _leaves(state)
  return one


def _leaves(state):
  return {str(i): np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(state.params))}


@pytest.mark.slow
def test_an_accumulated_ramp_step_is_one_step_on_its_examples(corpus, tmp_path):
  """With 2 of 4 micro-batches the update is the unaccumulated update on the
  rows of those two (strided: rows 0, 4, 1, 5), to float tolerance; the rows
  left out change nothing; all 4 are another update."""
  # Adam's eps at 1: the first update g / (|g| + 1) ~ g, not sign(g), which
  # would magnify the rounding of the gradient's elements near 0.
  ramped = _stepper(_lm_config(corpus, tmp_path, batch_size_ramp=0.5, eps=1.0))
  rs = np.random.RandomState(0)
  batch = {"tokens": jnp.asarray(rs.randint(0, 256, (8, 17)), jnp.int32)}
  controls = {"schedule_step": jnp.int32(0), "micro_batches": jnp.int32(2)}
  got, metrics = ramped(batch, controls)
  big = _lm_config(corpus, tmp_path, grad_accum_steps=1, eps=1.0)
  big.batch_size = 4
  rows = np.array([0, 4, 1, 5])
  want, big_metrics = _stepper(big)(jax.tree_util.tree_map(lambda x: x[rows], batch))
  moved = [k for k, a in _leaves(got).items() if not np.array_equal(a, ramped.initial[k])]
  assert len(moved) == len(ramped.initial)  # every parameter took the update
  for key in ("loss", "grad_norm"):
    np.testing.assert_allclose(float(metrics[key]), float(big_metrics[key]), rtol=2e-6)
  for k, a in _leaves(got).items():
    np.testing.assert_allclose(a, _leaves(want)[k], rtol=1e-6, atol=1e-10, err_msg=k)
  assert float(metrics["batch_size"]) == 4.0
  other = jax.tree_util.tree_map(lambda x: x.at[np.array([2, 3, 6, 7])].set(0), batch)
  assert_bitwise_equal(_leaves(ramped(other, controls)[0]), _leaves(got))
  whole, _ = ramped(batch, dict(controls, micro_batches=jnp.int32(4)))
  assert not np.array_equal(_leaves(whole)["0"], _leaves(got)["0"])


@pytest.mark.slow
def test_the_wall_time_update_is_the_schedule_s(corpus, tmp_path):
  """AdamW at rate 1 times the schedule at the elapsed time's step is the
  update AdamW with the schedule makes at that step: bitwise."""
  rs = np.random.RandomState(1)
  batch = {"tokens": jnp.asarray(rs.randint(0, 256, (8, 17)), jnp.int32)}
  by_steps = _lm_config(corpus, tmp_path, grad_accum_steps=1)
  by_time = _lm_config(corpus, tmp_path, grad_accum_steps=1, budget_hours=1.0)
  want, m1 = _stepper(by_steps)(batch)
  timed = _stepper(by_time)
  got, m2 = timed(batch, {"schedule_step": jnp.int32(0), "micro_batches": jnp.int32(1)})
  assert float(m1["lr"]) == float(m2["lr"]) == float(np.float32(0.25 * by_time.optim.lr))
  assert_bitwise_equal(_leaves(got), _leaves(want))
  later, m3 = timed(batch, {"schedule_step": jnp.int32(5), "micro_batches": jnp.int32(1)})
  schedule = optim.learning_rate_schedule(by_time.optim, 8)
  assert float(m3["lr"]) == float(schedule(5)) > float(m2["lr"])


# --- runs ---


def _elapsed_saved(workdir, step):
  return budget_lib.saved_elapsed(os.path.join(workdir, "checkpoints", str(step)))


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("split") == "train"]


def _cut_back(workdir, keep):
  """Deletes the checkpoints after step ``keep``: a run killed after that save."""
  ckpt = os.path.join(workdir, "checkpoints")
  for name in os.listdir(ckpt):
    if name.isdigit() and int(name) > keep:
      shutil.rmtree(os.path.join(ckpt, name))


@pytest.mark.slow
def test_a_wall_time_budget_stops_the_run_and_resumes_its_clock(corpus, tmp_path):
  """A fake clock 36 s a read (2 reads a step): the budget of 0.1 h (360 s)
  is spent after step 6 (elapsed 432 s > 360 s; step 5: 360 s); the learning
  rate of each step is cramming's budget-triangle2 at the elapsed time; a run
  resumed from step 2 goes on from the saved 144 s and ends as the
  uninterrupted one, bitwise."""
  c = _lm_config(corpus, tmp_path, grad_accum_steps=1, budget_hours=0.1)
  c.total_steps = 100
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(c, workdir, clock=FakeClock(36.0))
  step, full = saved_state(workdir)
  assert step == 6 and _elapsed_saved(workdir, 6) == 12 * 36.0
  records = _records(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  for r in records:  # step s reads the clock for its controls at (2 s - 1) x 36 s
    elapsed = (2 * r["step"] - 1) * 36.0
    want = c.optim.lr * cramming_budget_triangle2(r["step"] - 1, elapsed, 0.1, 100)
    # Step 6 starts past the budget (396 s): cramming's triangle is negative
    # there (-0.36 lr), laplax's stops at 0.
    np.testing.assert_allclose(r["lr"], max(want, 0.0), rtol=1e-6)
  assert records[-1]["lr"] == 0.0 and records[-2]["lr"] > 0
  assert _elapsed_saved(workdir, 2) == 4 * 36.0
  _cut_back(workdir, 2)
  loop.train_and_evaluate(c, workdir, clock=FakeClock(36.0))
  step, resumed = saved_state(workdir)
  assert step == 6 and _elapsed_saved(workdir, 6) == 12 * 36.0
  assert_bitwise_equal(full, resumed)
  # Spent before: the same command trains nothing more and evaluates; a
  # sweep counts the run as trained at step 6.
  summary = loop.train_and_evaluate(c, workdir, clock=FakeClock(36.0))
  assert saved_state(workdir)[0] == 6 and "bits_per_byte" in summary
  assert budget_lib.spent_at(os.path.join(workdir, "checkpoints", "6"), 0.1)
  assert not budget_lib.spent_at(os.path.join(workdir, "checkpoints", "4"), 0.1)
  run = sweep.Run("r", (), 0, workdir, "", ())
  assert sweep._steps_left(run, c, analysis=False) == ["eval"]


@pytest.mark.slow
def test_a_ramped_run_resumes_bitwise(corpus, tmp_path):
  """By steps (8 updates, ramp 0.5, 4 micro-batches of 2): batches of 2, 4,
  6, 8, 8, ... examples; killed after step 4's save and resumed, the run
  ends bitwise as the uninterrupted one."""
  c = _lm_config(corpus, tmp_path, batch_size_ramp=0.5)
  workdir = str(tmp_path / "ramp")
  loop.train_and_evaluate(c, workdir)
  _, full = saved_state(workdir)
  assert [r["batch_size"] for r in _records(workdir)] == [2, 4, 6, 8, 8, 8, 8, 8]
  _cut_back(workdir, 4)
  loop.train_and_evaluate(c, workdir)
  step, resumed = saved_state(workdir)
  assert step == 8
  assert_bitwise_equal(full, resumed)
  assert [r["batch_size"] for r in _records(workdir)] == [2, 4, 6, 8, 8, 8, 8, 8]


@pytest.mark.parametrize(
  "keys,message",
  [
    ({"budget_hours": 0.0}, "config.optim.budget_hours=0.0 must be a finite number > 0.0"),
    ({"budget_hours": 1.0, "optimizer": "muon"}, "schedules by wall time only"),
    ({"batch_size_ramp": 1.0}, "config.optim.batch_size_ramp=1.0 must be below 1"),
    ({"batch_size_ramp": 0.6, "grad_accum_steps": 1}, "set config.optim.grad_accum_steps above 1"),
  ],
)
def test_bad_budget_keys_are_one_line(keys, message):
  from laplax.config import run, validation

  c = load("bert_cramming")
  c.optim.update(keys)
  with pytest.raises(validation.ConfigError) as e:
    run.Optim.from_config(c)
  assert message in str(e.value) and "\n" not in str(e.value)
