"""Kill-and-resume runs: starting a run, waiting for a step, comparing saved states bitwise."""

import contextlib
import os
import re
import subprocess
import sys
import time

import numpy as np

from helpers.runs import ROOT

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")


DINO_CONFIG = os.path.join(ROOT, "configs", "dino_fashion_mnist.py")


GPT_TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=32",
  "--config.model.dropout=0.1",
  "--config.batch_size=8",
  "--config.eval_batch_size=16",
  "--config.optim.warmup_steps=5",
]


DINO_TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.model.num_laplacian_heads=1",
  "--config.model.drop_path=0.1",
  "--config.batch_size=16",
  "--config.eval_batch_size=2000",
  "--config.optim.warmup_steps=2",
  "--config.dino.out_dim=64",
  "--config.dino.hidden_dim=32",
  "--config.dino.bottleneck_dim=16",
  "--config.data.multicrop.num_local=2",
  "--config.evals=knn,raw_pixel_knn,segmentation,patch_pca",
  "--config.dino.freeze_last_layer_steps=4",
  "--config.dino.warmup_teacher_temp_steps=8",
  "--config.data.train_split=train[:1000]",
  "--config.data.eval_split=test[:500]",
]


TEXT = (
  "When in the chronicle of wasted time I see descriptions of the fairest "
  "wights, and beauty making beautiful old rhyme in praise of ladies dead "
  "and lovely knights. "
)


def saved_state(workdir, step=None):
  """``(step, {path: array})`` of the whole saved state at ``step`` (default newest)."""
  import jax
  import orbax.checkpoint as ocp

  ckpt = os.path.join(workdir, "checkpoints")
  if step is None:
    step = max(int(s) for s in os.listdir(ckpt) if s.isdigit())
  tree = ocp.StandardCheckpointer().restore(os.path.join(ckpt, str(step), "state"))
  name = lambda path: "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
  flat = {name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return step, flat


def assert_bitwise_equal(a, b, context=""):
  assert a.keys() == b.keys(), context
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k} {context}")


def last_train_step(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    steps = [int(m.group(1)) for m in re.finditer(r'"step": (\d+), "split": "train"', f.read())]
  return max(steps, default=0)


def start(args, log_path):
  log = open(log_path, "w")
  proc = subprocess.Popen(
    [sys.executable] + args,
    cwd=ROOT,
    stdout=log,
    stderr=subprocess.STDOUT,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
  )
  log.close()
  return proc


def wait_stopped(pid, attempts=2000):
  """Returns once every thread of ``pid`` is stopped (``T`` in
  ``/proc/PID/task/*/stat``): SIGSTOP is delivered asynchronously, and a
  thread inside a write finishes it first."""
  for _ in range(attempts):
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
      with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
          states.append(f.read().rsplit(")", 1)[1].split()[0])
    if states and all(s in "Tt" for s in states):
      return
    time.sleep(0.005)
  raise AssertionError(f"process {pid} did not stop: thread states {states}")


def wait_for_step(proc, workdir, step, timeout=240):
  deadline = time.time() + timeout
  while proc.poll() is None and time.time() < deadline:
    if last_train_step(workdir) >= step:
      return True
    time.sleep(0.005)
  return False
