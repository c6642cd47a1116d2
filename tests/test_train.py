"""End-to-end tests of train.py / eval.py as a user runs them (subprocesses, and
in-process through the same entry points where no process of its own is needed)."""

import json
import logging
import os
import signal
import subprocess
import sys
import types

import numpy as np
import pytest
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "vit_fashion_mnist.py")
# A tiny model so every step takes milliseconds on CPU.
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.model.patch_size=7",
  "--config.model.num_laplacian_heads=1",
  "--config.batch_size=32",
  "--config.eval_batch_size=2000",
  "--config.log_every=5",
  "--config.optim.warmup_steps=5",
]


def run(args, timeout=300, xla_defaults=False, **kwargs):
  """``python ARGS`` in the repository; ``xla_defaults``: without the suite's
  ``JAX_DISABLE_MOST_OPTIMIZATIONS`` and ``XLA_FLAGS`` (see conftest.py)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if xla_defaults:
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    env.pop("XLA_FLAGS", None)
  return subprocess.run(
    [sys.executable] + args,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
    **kwargs,
  )


def xla_env(num_devices=None, **extra):
  """``os.environ`` with ``extra``, and ``num_devices`` fake CPU devices added
  to the session's ``XLA_FLAGS`` (not replacing them)."""
  env = dict(os.environ, **extra)
  if num_devices is not None:
    env["XLA_FLAGS"] = (
      env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={num_devices}"
    ).strip()
  return env


def run_in_process(argv, capfd=None):
  """``python train.py ARGV[1:]`` or ``python eval.py ARGV[1:]`` in this
  process: its exit code and output (``capfd``: pytest's fixture; without it,
  as in a module-scoped fixture, the output is not returned). It saves
  the ~4 s a subprocess spends importing JAX, Flax, TFDS and orbax; the tests
  that need a process of its own (signals, exit paths, device counts, XLA's
  default flags) use :func:`run`, and test_bad_inputs.py runs some cases both
  ways. The two scripts' flags live in different ``FlagValues`` (train.py's in
  absl's global FLAGS, eval.py's in ``eval.FLAGS``)."""
  import importlib

  script = os.path.basename(argv[0])
  if script not in ("train.py", "eval.py"):
    raise ValueError(f"run_in_process runs train.py or eval.py, not {argv[0]}")
  module = importlib.import_module(script[:-3])
  fv = flags.FLAGS if script == "train.py" else module.FLAGS
  if capfd is not None:
    capfd.readouterr()
  saved_argv, saved_term = sys.argv, signal.getsignal(signal.SIGTERM)
  fv.unparse_flags()
  sys.argv = list(argv)
  # What a script's logging warnings print on stderr when no handler is set
  # (logging.lastResort), which pytest's log capture would otherwise take.
  handler = logging.StreamHandler(sys.stderr)
  handler.setLevel(logging.WARNING)
  logging.getLogger().addHandler(handler)
  code = 0
  try:
    module.run_cli()
  except SystemExit as e:
    code = e.code
  finally:
    logging.getLogger().removeHandler(handler)
    sys.argv = saved_argv
    signal.signal(signal.SIGTERM, saved_term)
    fv.unparse_flags()
    # config_flags defines a flag per config field at each parse.
    for flag in [f for f in flags.FLAGS if f.startswith("config.")]:
      delattr(flags.FLAGS, flag)
  out, err = capfd.readouterr() if capfd is not None else ("", "")
  return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)


def train_args(workdir, data_dir, *extra, config=CONFIG):
  return (
    [
      "train.py",
      "--config",
      config,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={data_dir}",
    ]
    + TINY
    + list(extra)
  )


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


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
  from test_classification import chance_threshold

  assert final["accuracy"] > chance_threshold(10000) > 0.118
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["width"] == 32 and saved["total_steps"] == 20

  r = run(["eval.py", "--workdir", str(workdir)], xla_defaults=True)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["step"] == 20
  assert result["accuracy"] == pytest.approx(final["accuracy"], abs=1e-9)
  assert result["loss"] == pytest.approx(final["loss"], rel=1e-5)


def test_workdir_that_is_a_file(tmp_path, fmnist_data_dir):
  path = tmp_path / "file"
  path.write_text("mine")
  r = run(train_args(path, fmnist_data_dir, "--config.total_steps=5"))
  assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr
  assert path.read_text() == "mine"


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


def test_eval_without_checkpoint_is_one_line_exit_2(tmp_path):
  r = run(["eval.py", "--workdir", str(tmp_path / "empty")])
  assert r.returncode == 2
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "no " in lines[0] and "Traceback" not in r.stderr
  assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize("script,flag", [("train.py", "--help"), ("eval.py", "-h")])
def test_help_lists_the_flags_and_exits_0(script, flag):
  r = run([script, flag])
  assert r.returncode == 0, r.stderr
  assert "--workdir" in r.stdout and "Traceback" not in r.stderr
