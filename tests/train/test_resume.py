"""Runs that survive: SIGKILL, SIGTERM, a killed checkpoint write, non-finite steps.

Each test drives ``train.py`` as a user does with tiny models: the starts
that are killed or signalled in subprocesses, the others in this process
(``test_train.run_in_process``, the same entry point without the ~4 s of a
new process's imports).

A run killed with SIGKILL at random steps and restarted with the same command
must end with a state (parameters, optimizer state, RNG, step, DINO teacher
and centre) bitwise equal to an uninterrupted run of the same config.
``LAPLAX_RESUME_KILLS="vit,gpt,dino"`` sets the kills per task (default
3,2,2: 7 in all, to keep the suite short, with new random steps at every
run; 7,7,6 gives the 20 of the acceptance run) and ``LAPLAX_RESUME_SEED``
the random steps (default: new each run, printed on failure).
"""

import os
import random
import re
import signal
import time

import numpy as np
import pytest

from helpers.resume import (
  DINO_CONFIG,
  DINO_TINY,
  GPT_CONFIG,
  GPT_TINY,
  TEXT,
  assert_bitwise_equal,
  last_train_step,
  saved_state,
  start,
  wait_for_step,
  wait_stopped,
)
from helpers.runs import CONFIG, read_metrics, run_in_process
from helpers.runs import TINY as VIT_TINY

# Every step logged, checkpoints every 3 steps: kills land between, on and
# during checkpoint writes.
COMMON = ["--config.log_every=1", "--config.checkpoint_every=3", "--config.eval_every=1000"]
TOTAL = {"vit": 30, "gpt": 30, "dino": 18}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("sonnets")
  for i, name in enumerate(("a", "b", "c")):
    (d / f"{name}.txt").write_text((TEXT[i:] + TEXT[:i]) * 40)
  return d


def task_args(task, workdir, fmnist_data_dir, corpus, *extra):
  """train.py arguments of the tiny ``task`` run in ``workdir``."""
  if task == "vit":
    base = (
      ["--config", CONFIG, f"--config.data.data_dir={fmnist_data_dir}"]
      + VIT_TINY
      + ["--config.model.dropout=0.1"]
    )
  elif task == "gpt":
    base = [
      "--config",
      GPT_CONFIG,
      f"--config.data.source_dir={corpus}",
      f"--config.data.data_dir={corpus}_tfds",
    ] + GPT_TINY
  else:
    base = ["--config", DINO_CONFIG, f"--config.data.data_dir={fmnist_data_dir}"] + DINO_TINY
  return (
    ["train.py", "--workdir", str(workdir)]
    + base
    + COMMON
    + [f"--config.total_steps={TOTAL[task]}"]
    + list(extra)
  )


_REFERENCES = {}


def reference(task, tmp_path_factory, fmnist_data_dir, corpus):
  """The uninterrupted run of ``task`` (once per module; in this process, as
  nothing in it is killed)."""
  if task not in _REFERENCES:
    workdir = tmp_path_factory.mktemp(f"ref_{task}") / "run"
    r = run_in_process(task_args(task, workdir, fmnist_data_dir, corpus))
    assert r.returncode == 0, r.stderr[-3000:]
    _REFERENCES[task] = saved_state(workdir)
  return _REFERENCES[task]


def kills_per_task():
  counts = os.environ.get("LAPLAX_RESUME_KILLS", "3,2,2").split(",")
  return dict(zip(("vit", "gpt", "dino"), (int(c) for c in counts)))


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("task", ["vit", "gpt", "dino"])
def test_sigkill_at_random_steps_resumes_bitwise(
  task, tmp_path, tmp_path_factory, fmnist_data_dir, corpus, capfd
):
  """SIGKILL at k random steps, each time restarting the same command; the
  final state equals the uninterrupted run's bit for bit, and no restart ever
  meets an unreadable checkpoint."""
  ref_step, ref = reference(task, tmp_path_factory, fmnist_data_dir, corpus)
  seed = int(os.environ.get("LAPLAX_RESUME_SEED", random.randrange(10**6)))
  k = kills_per_task()[task]
  targets = sorted(random.Random(seed).sample(range(2, TOTAL[task]), k))
  context = f"(task {task}, LAPLAX_RESUME_SEED={seed}, kill steps {targets})"
  workdir = tmp_path / "run"
  args = task_args(task, workdir, fmnist_data_dir, corpus)
  logs = []
  for i, target in enumerate(targets):
    logs.append(tmp_path / f"run{i}.log")
    proc = start(args, logs[-1])
    reached = wait_for_step(proc, workdir, target)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert reached, (
      f"run {i} did not reach step {target}: " + logs[-1].read_text()[-2000:] + context
    )
  r = run_in_process(args, capfd)  # the last start is not killed
  assert r.returncode == 0, r.stderr[-3000:] + context
  for text in [p.read_text() for p in logs] + [r.stderr]:
    assert "unreadable" not in text, text[-3000:] + context
  step, state = saved_state(workdir)
  assert step == ref_step == TOTAL[task]
  if task == "dino":  # the teacher and the centre are part of the compared state
    assert any("teacher" in k for k in state) and any("center" in k for k in state), state.keys()
  assert_bitwise_equal(ref, state, context)
  train_steps = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]
  assert train_steps == list(range(1, TOTAL[task] + 1)), context


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_saves_exits_0_and_resumes_bitwise(
  tmp_path, tmp_path_factory, fmnist_data_dir, corpus, capfd
):
  """SIGTERM: the step in flight finishes and the run stops there (the step
  saved is the last one logged when the signal came, or the next), its
  checkpoint is committed and restorable, the process exits 0 with one line
  saying how to resume, and the same command then ends bitwise equal to the
  uninterrupted run. The process is frozen (SIGSTOP) while the step at the
  signal is read and SIGTERM is sent, so that step is exact."""
  _, ref = reference("vit", tmp_path_factory, fmnist_data_dir, corpus)
  workdir = tmp_path / "run"
  args = task_args("vit", workdir, fmnist_data_dir, corpus)
  proc = start(args, tmp_path / "term.log")
  assert wait_for_step(proc, workdir, 10)
  proc.send_signal(signal.SIGSTOP)
  wait_stopped(proc.pid)
  at_signal = last_train_step(workdir)  # every step is logged (log_every=1)
  proc.send_signal(signal.SIGTERM)
  proc.send_signal(signal.SIGCONT)
  assert proc.wait(timeout=120) == 0, (tmp_path / "term.log").read_text()[-3000:]
  out = (tmp_path / "term.log").read_text()
  stopped = re.search(
    r"stopped by signal 15 at step (\d+); checkpoint saved in (\S+); "
    r"run the same command to resume",
    out,
  )
  assert stopped, out[-3000:]
  step = int(stopped.group(1))
  assert 10 <= step < TOTAL["vit"]
  # Within one step of the signal, and nothing trained past the saved step.
  assert at_signal <= step <= at_signal + 1, (at_signal, step)
  assert last_train_step(workdir) == step
  saved_step, state = saved_state(workdir, step)  # restorable
  assert saved_step == step and int(state["step"]) == step
  assert max(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()) == step
  r = run_in_process(args, capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"resumed from step {step}" in r.stderr + r.stdout
  assert_bitwise_equal(ref, saved_state(workdir)[1])


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_during_checkpoint_write_resumes_from_previous(tmp_path, fmnist_data_dir, capfd):
  """A run killed while a large checkpoint is being written: the next start
  warns that the step is incomplete and resumes from the previous one."""
  big = (
    ["--config", CONFIG, f"--config.data.data_dir={fmnist_data_dir}"]
    + VIT_TINY
    + [
      "--config.model.width=256",
      "--config.model.depth=4",
      "--config.model.num_heads=4",
      "--config.model.mlp_dim=1024",
      "--config.total_steps=6",
      "--config.checkpoint_every=2",
      "--config.eval_every=1000",
      "--config.log_every=1",
      "--config.data.eval_split=test[:500]",
      "--config.eval_batch_size=500",
    ]
  )
  workdir = tmp_path / "run"
  ckpt = workdir / "checkpoints"
  args = ["train.py", "--workdir", str(workdir)] + big
  caught = None
  for attempt in range(4):
    proc = start(args, tmp_path / f"big{attempt}.log")
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline and caught is None:
      if ckpt.exists():
        tmp = [
          n for n in os.listdir(ckpt) if ".orbax-checkpoint-tmp" in n and int(n.split(".")[0]) >= 2
        ]
        if tmp:
          caught = int(tmp[0].split(".")[0])
          proc.send_signal(signal.SIGKILL)
      time.sleep(0.005)
    proc.kill()
    proc.wait()
    if caught is not None and any(".orbax-checkpoint-tmp" in n for n in os.listdir(ckpt)):
      break
    caught = None
  assert caught is not None, "never caught a checkpoint being written"
  complete = [int(s) for s in os.listdir(ckpt) if s.isdigit()]
  assert caught not in complete
  previous = max(complete)
  r = run_in_process(args, capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert re.search(rf"checkpoint step {caught} in \S+ is incomplete", r.stderr), r.stderr[-3000:]
  assert f"resumed from step {previous}" in r.stderr + r.stdout
  assert not any(".orbax-checkpoint-tmp" in n for n in os.listdir(ckpt))
  assert saved_state(workdir)[0] == 6


@pytest.mark.slow
def test_injected_nan_stops_before_any_bad_checkpoint(tmp_path, fmnist_data_dir, corpus, capfd):
  """debug.nan_at_step=11: the run stops naming step 11 and the last good
  checkpoint (step 9), exit code 2, and nothing at or after step 11 is on disk."""
  workdir = tmp_path / "run"
  r = run_in_process(
    task_args(
      "vit",
      workdir,
      fmnist_data_dir,
      corpus,
      "--config.log_every=5",
      "--config.debug.nan_at_step=11",
    ),
    capfd,
  )
  assert r.returncode == 2, r.stderr[-3000:]
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith("error: non-finite training metrics at step 11 (loss=nan"), last
  assert "last good checkpoint: step 9" in last and "Traceback" not in r.stderr
  steps = sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())
  assert max(steps) == 9
  _, state = saved_state(workdir, 9)
  assert all(np.isfinite(v).all() for k, v in state.items() if v.dtype.kind == "f")
  assert all(m["step"] <= 10 for m in read_metrics(workdir))


@pytest.mark.slow
def test_skip_nonfinite_leaves_the_update_out_and_counts_it(
  tmp_path, fmnist_data_dir, corpus, capfd
):
  """optim.skip_nonfinite=True: step 11's NaN update is left out (the state
  after step 11 equals the state after step 10 but for the step counter),
  counted in metrics.jsonl and named in a warning; the run finishes."""
  workdir = tmp_path / "run"
  extra = [
    "--config.log_every=5",
    "--config.checkpoint_every=1",
    "--config.keep_checkpoints=100",
    "--config.debug.nan_at_step=11",
    "--config.optim.skip_nonfinite=True",
  ]
  r = run_in_process(task_args("vit", workdir, fmnist_data_dir, corpus, *extra), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "skipped the non-finite update of step(s) 11" in r.stdout + r.stderr
  train = {m["step"]: m for m in read_metrics(workdir) if m["split"] == "train"}
  assert [train[s]["skipped_updates"] for s in (5, 10, 15, 20)] == [0, 0, 1, 0]
  assert np.isfinite(train[15]["loss"])
  _, before = saved_state(workdir, 10)
  _, after = saved_state(workdir, 11)
  assert int(after["step"]) == 11
  assert_bitwise_equal(
    {k: v for k, v in before.items() if k != "step"},
    {k: v for k, v in after.items() if k != "step"},
  )
  _, final = saved_state(workdir)
  assert all(np.isfinite(v).all() for v in final.values() if v.dtype.kind == "f")
