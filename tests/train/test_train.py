"""End-to-end tests of train.py / eval.py as a user runs them (subprocesses, and
in-process through the same entry points where no process of its own is needed)."""

import json
import os

import numpy as np
import pytest

from helpers.runs import read_metrics, run, run_in_process, train_args


def final_params(workdir):
  """Parameters of the newest checkpoint, as a flat dict of numpy arrays."""
  import orbax.checkpoint as ocp

  ckpt = os.path.join(workdir, "checkpoints")
  step = max(int(s) for s in os.listdir(ckpt) if s.isdigit())
  tree = ocp.StandardCheckpointer().restore(os.path.join(ckpt, str(step), "state"))
  flat = {}

  def walk(node, prefix):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(v, f"{prefix}/{k}")
    else:
      flat[prefix] = np.asarray(node)

  walk(tree["params"], "")
  return step, flat


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_then_eval_reports_same_accuracy(tmp_path, fmnist_data_dir):
  """With XLA's default optimisations, as users run it (the rest of the suite
  compiles with most optimisations off; see conftest.py)."""
  workdir = tmp_path / "run"
  r = run(
    train_args(
      workdir,
      fmnist_data_dir,
      "--config.total_steps=20",
      "--config.eval_every=20",
      "--config.checkpoint_every=10",
    ),
    xla_defaults=True,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  for name in ("config.json", "metrics.jsonl", "checkpoints"):
    assert (workdir / name).exists(), name
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(workdir / "tensorboard"))
  records = read_metrics(workdir)
  assert all("step" in r for r in records)
  train = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in train] == [5, 10, 15, 20]
  assert all(np.isfinite(r["loss"]) for r in train)
  final = [r for r in records if r["split"] == "eval"][-1]
  assert final["step"] == 20 and final["num_examples"] == 10000
  # It learns: above the accuracy that a model at chance (10 %) exceeds on
  # 10000 examples with probability 1e-9 (binomial tail, 0.1185; measured 0.255).
  from helpers.classification import chance_threshold

  assert final["accuracy"] > chance_threshold(10000) > 0.118
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["width"] == 32 and saved["total_steps"] == 20

  r = run(["eval.py", "--workdir", str(workdir)], xla_defaults=True)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["step"] == 20
  assert result["accuracy"] == pytest.approx(final["accuracy"], abs=1e-9)
  assert result["loss"] == pytest.approx(final["loss"], rel=1e-5)


@pytest.mark.subprocess
def test_workdir_that_is_a_file(tmp_path, fmnist_data_dir):
  path = tmp_path / "file"
  path.write_text("mine")
  r = run(train_args(path, fmnist_data_dir, "--config.total_steps=5"))
  assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr
  assert path.read_text() == "mine"


@pytest.mark.slow
def test_corrupt_newest_checkpoint_is_skipped_and_replaced(tmp_path, fmnist_data_dir, capfd):
  """Truncate every file of the newest checkpoint: the same command resumes
  from the previous one, saves the newest step again, and keeps one record
  per step in metrics.jsonl."""
  workdir = tmp_path / "run"
  steps = ["--config.total_steps=10", "--config.eval_every=10", "--config.checkpoint_every=5"]
  r = run_in_process(train_args(workdir, fmnist_data_dir, *steps), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  _, good = final_params(workdir)
  for root, _, files in os.walk(workdir / "checkpoints" / "10"):
    for f in files:
      p = os.path.join(root, f)
      with open(p, "r+b") as fh:
        fh.truncate(os.path.getsize(p) // 2)
  r = run_in_process(train_args(workdir, fmnist_data_dir, *steps), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "unreadable" in r.stderr
  step, params = final_params(workdir)
  assert step == 10
  for k in good:
    np.testing.assert_array_equal(good[k], params[k], err_msg=k)
  train_steps = [x["step"] for x in read_metrics(workdir) if x["split"] == "train"]
  assert train_steps == [5, 10]
  r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
  assert r.returncode == 0 and json.loads((workdir / "eval.json").read_text())["step"] == 10


@pytest.mark.subprocess
def test_eval_without_checkpoint_is_one_line_exit_2(tmp_path):
  r = run(["eval.py", "--workdir", str(tmp_path / "empty")])
  assert r.returncode == 2
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "no " in lines[0] and "Traceback" not in r.stderr
  assert not (tmp_path / "empty").exists()


@pytest.mark.subprocess
@pytest.mark.parametrize("script,flag", [("train.py", "--help"), ("eval.py", "-h")])
def test_help_lists_the_flags_and_exits_0(script, flag):
  r = run([script, flag])
  assert r.returncode == 0, r.stderr
  assert "--workdir" in r.stdout and "Traceback" not in r.stderr
